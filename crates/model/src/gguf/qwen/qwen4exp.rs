//! What `qwen4exp` (Qwen3.8-Flash-Next) adds to `qwen35moe` in llama.cpp's layout
//! (`conversion/qwen4exp.py`, `Qwen4ExpTextModel`), mapped back to the Hugging Face config and
//! names (MODEL_MATH §4):
//! - hyper-connections: `blk.N.hc_{attn,ffn}_{norm,down,up,inject}`, `output_hc_{norm,down,up}`
//!   (the norms stored as w + 1 by the inherited `norm.weight` rule);
//! - the QSA indexer: `index_qk_proj` split into `blk.N.indexer.q_proj` + `indexer.k_proj`,
//!   its layer norms stored as w + 1; the compress ratio per layer in
//!   `attention.compress_ratios`, the other indexer fields in `attention.indexer.*`;
//! - PLE: the n-gram table's shards concatenated into `per_layer_token_embd.weight`, the
//!   `ple.*` tensors as `blk.N.ple_*` (norms w + 1, conv squeezed), and the int64 hash buffers
//!   as UINT64 array keys (`ple.layer_multipliers`, `ple.head_offsets`, `ple.head_vocab_sizes`).
//!   The file carries no seed or n-gram vocabulary base: the seed is recovered from the
//!   multipliers (splitmix64 is invertible) and the base is the first head's prime, so the
//!   config spindle validates implies exactly the stored constants (checked here, by key).
//! - The GDN output gate is a sigmoid: llama.cpp's graph (`src/models/qwen4exp.cpp`) always
//!   uses one, so the file has no key for it.

use serde_json::{Map, Value as Json};

use super::{err, find};
use crate::error::Result;
use crate::gguf::file::GgufFile;
use crate::ngram;

/// The `qwen4exp.*` keys spindle reads beyond the other families'.
pub(super) const KEYS: &[&str] = &[
    "hyper_connection.count",
    "hyper_connection.low_rank",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "attention.compress_ratios",
    "ple.layers",
    "ple.ngram_size",
    "ple.heads_per_ngram",
    "ple.conv_kernel",
    "ple.layer_multipliers",
    "ple.head_offsets",
    "ple.head_vocab_sizes",
    "ple.eos_token_id",
    // The token llama.cpp hashes in place of image positions; spindle hashes the ids it has.
    "ple.image_token_id",
    "embedding_length_per_layer_input",
];

/// The PLE table's GGUF name.
pub(super) const PLE_TABLE: &str = "per_layer_token_embd.weight";

fn uints(f: &GgufFile, key: &str) -> Result<Vec<u64>> {
    let v = f
        .get(key)
        .ok_or_else(|| err(f, format!("metadata key `{key}` is missing")))?;
    let items = v.as_array().ok_or_else(|| {
        err(
            f,
            format!("metadata key `{key}` = {v:?}: expected an array"),
        )
    })?;
    items
        .iter()
        .map(|x| {
            x.as_u64().ok_or_else(|| {
                err(
                    f,
                    format!("metadata key `{key}` holds {x:?}: expected unsigned integers"),
                )
            })
        })
        .collect()
}

fn uint(f: &GgufFile, key: &str) -> Result<u64> {
    match f.get(key) {
        None => Err(err(f, format!("metadata key `{key}` is missing"))),
        Some(v) => v.as_u64().ok_or_else(|| {
            err(
                f,
                format!("metadata key `{key}` = {v:?}: expected an unsigned integer"),
            )
        }),
    }
}

/// Adds the qwen4_exp fields to the config `c` built from the shared keys.
pub(super) fn config_fields(
    files: &[GgufFile],
    prefix: &str,
    c: &mut Map<String, Json>,
) -> Result<()> {
    let f = &files[0];
    let key = |k: &str| format!("{prefix}{k}");
    c.insert("output_gate_type".into(), "sigmoid".into());
    c.insert(
        "hc_count".into(),
        uint(f, &key("hyper_connection.count"))?.into(),
    );
    c.insert(
        "hc_lowrank".into(),
        uint(f, &key("hyper_connection.low_rank"))?.into(),
    );
    c.insert(
        "indexer_n_heads".into(),
        uint(f, &key("attention.indexer.head_count"))?.into(),
    );
    c.insert(
        "indexer_head_dim".into(),
        uint(f, &key("attention.indexer.key_length"))?.into(),
    );
    c.insert(
        "indexer_budget".into(),
        uint(f, &key("attention.indexer.top_k"))?.into(),
    );
    // One key head: llama.cpp has no key for it and its graph assumes it (as §4.1 requires).
    c.insert("indexer_kv_heads".into(), 1.into());

    // The compress ratio: one value, on every attention layer, 0 on the linear ones.
    let ratios_key = key("attention.compress_ratios");
    let ratios = uints(f, &ratios_key)?;
    let layer_types: Vec<String> = c["layer_types"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if ratios.len() < layer_types.len() {
        return Err(err(
            f,
            format!(
                "metadata key `{ratios_key}` has {} entries for {} layers",
                ratios.len(),
                layer_types.len()
            ),
        ));
    }
    let mut ratio = None;
    for (i, t) in layer_types.iter().enumerate() {
        let r = ratios[i];
        if t == "linear_attention" {
            continue;
        }
        if r == 0 {
            return Err(err(f, format!(
                "metadata key `{ratios_key}` = {ratios:?}: attention layer {i} has compress ratio 0, \
                 but every qwen4exp attention layer runs the QSA indexer (llama.cpp's converter writes 0 \
                 when the config's layer type is not spelled \"full_attention\")"
            )));
        }
        if ratio.is_some_and(|x| x != r) {
            return Err(err(f, format!(
                "metadata key `{ratios_key}` = {ratios:?}: the attention layers' ratios differ; spindle runs one"
            )));
        }
        ratio = Some(r);
    }
    if let Some(r) = ratio {
        c.insert("indexer_compress_ratio".into(), r.into());
    }

    let layers_key = key("ple.layers");
    if f.get(&layers_key).is_none() {
        return Ok(()); // no n-gram table
    }
    let ple_layers = uints(f, &layers_key)?;
    let [layer] = ple_layers[..] else {
        return Err(err(f, format!(
            "metadata key `{layers_key}` = {ple_layers:?}: the file holds one layer's hash constants, so exactly one PLE layer is supported (as in llama.cpp)"
        )));
    };
    let n_layers = layer_types.len() as u64;
    if layer >= n_layers || layer_types[layer as usize] != "linear_attention" {
        return Err(err(f, format!(
            "metadata key `{layers_key}` = {ple_layers:?}: PLE needs one of the {n_layers} layers, a linear-attention one"
        )));
    }
    c.insert("ple_layer_ids".into(), vec![layer + 1].into());
    let ngram = uint(f, &key("ple.ngram_size"))?;
    let per_ngram = uint(f, &key("ple.heads_per_ngram"))?;
    if ngram < 2 || per_ngram == 0 {
        return Err(err(f, format!(
            "metadata keys `{}` = {ngram} and `{}` = {per_ngram}: need n-grams of at least 2 tokens and one head",
            key("ple.ngram_size"),
            key("ple.heads_per_ngram")
        )));
    }
    let heads = ngram.saturating_sub(1) * per_ngram;
    c.insert("ngram_size".into(), ngram.into());
    c.insert("heads_per_ngram".into(), per_ngram.into());
    c.insert(
        "ple_conv_kernel_size".into(),
        uint(f, &key("ple.conv_kernel"))?.into(),
    );
    let row_dim = uint(f, &key("embedding_length_per_layer_input"))?;
    c.insert("ple_embed_dim".into(), (row_dim * heads).into());
    // The PLE hash resets at this token; spindle takes the first end-of-sequence id.
    let ple_eos = uint(f, &key("ple.eos_token_id"))?;
    let mut eos: Vec<u64> = vec![ple_eos];
    if let Some(list) = c["eos_token_id"].as_array() {
        eos.extend(
            list.iter()
                .filter_map(Json::as_u64)
                .filter(|&e| e != ple_eos),
        );
    }
    c.insert("eos_token_id".into(), eos.into());

    let sizes_key = key("ple.head_vocab_sizes");
    let offsets_key = key("ple.head_offsets");
    let mult_key = key("ple.layer_multipliers");
    let sizes = uints(f, &sizes_key)?;
    let offsets = uints(f, &offsets_key)?;
    let multipliers = uints(f, &mult_key)?;
    // llama.cpp requires at least as many entries as heads / n-gram orders; more are unused.
    if sizes.len() < heads as usize
        || offsets.len() < heads as usize
        || multipliers.len() < ngram as usize
    {
        return Err(err(f, format!(
            "metadata keys `{sizes_key}` ({}), `{offsets_key}` ({}) and `{mult_key}` ({}) need {heads}, {heads} and {ngram} entries",
            sizes.len(), offsets.len(), multipliers.len()
        )));
    }
    let (sizes, offsets, multipliers) = (
        &sizes[..heads as usize],
        &offsets[..heads as usize],
        &multipliers[..ngram as usize],
    );
    // The base: the first head's prime (each head takes the next prime), checked below.
    let base = sizes[0];
    let derived = ngram::head_vocab_sizes(base, 0, heads as usize);
    if derived != sizes {
        return Err(err(f, format!(
            "metadata key `{sizes_key}` = {sizes:?}: not consecutive primes from {base} ({derived:?}), as the n-gram hash makes them"
        )));
    }
    if ngram::head_offsets(sizes) != offsets {
        return Err(err(
            f,
            format!(
                "metadata key `{offsets_key}` = {offsets:?}: not the running sums of `{sizes_key}`"
            ),
        ));
    }
    let vocab = c["vocab_size"].as_u64().unwrap_or(0).max(1);
    let seed = recover_seed(multipliers, vocab).ok_or_else(|| {
        err(f, format!(
            "metadata key `{mult_key}` = {multipliers:?}: no seed gives these multipliers for a vocabulary of {vocab} (splitmix64, MODEL_MATH §4.6)"
        ))
    })?;
    c.insert("ngram_vocab_size_base".into(), base.into());
    c.insert("seed".into(), seed.into());
    // The table is one tensor, padded to its own row count.
    let (_, table) = find(files, PLE_TABLE).ok_or_else(|| {
        err(
            f,
            format!("tensor `{PLE_TABLE}` is missing (PLE layer {layer})"),
        )
    })?;
    let rows = table.ne.get(1).copied().unwrap_or(0) as u64;
    let total: u64 = sizes.iter().sum();
    if rows < total || table.ne.first().copied() != Some(row_dim as usize) {
        return Err(err(
            f,
            format!(
            "tensor `{PLE_TABLE}` has ne {:?}; the hash heads need [{row_dim}, at least {total}]",
            table.ne
        ),
        ));
    }
    c.insert("make_ngram_vocab_size_divisible_by".into(), rows.into());
    c.insert("split_ngram_parts".into(), 1.into());
    Ok(())
}

/// The hash constants of PLE ordinal 0 as the checkpoint's int64 buffers: (name suffix under
/// `ple.ple_embedding.`, values).
pub(super) fn hash_buffers(f: &GgufFile, prefix: &str) -> Result<Vec<(&'static str, Vec<i64>)>> {
    let ngram = uint(f, &format!("{prefix}ple.ngram_size"))? as usize;
    let heads = (ngram - 1) * uint(f, &format!("{prefix}ple.heads_per_ngram"))? as usize;
    let take = |k: &str, n: usize| -> Result<Vec<i64>> {
        Ok(uints(f, &format!("{prefix}{k}"))?
            .into_iter()
            .take(n)
            .map(|v| v as i64)
            .collect())
    };
    Ok(vec![
        ("layer_multipliers", take("ple.layer_multipliers", ngram)?),
        (
            "ngram_heads_vocab_sizes",
            take("ple.head_vocab_sizes", heads)?,
        ),
        ("ngram_heads_offsets", take("ple.head_offsets", heads)?),
    ])
}

/// Undoes `x ^= x >> shift`.
fn unxorshift(y: u64, shift: u32) -> u64 {
    let mut x = y;
    for _ in 0..64 / shift + 1 {
        x = y ^ (x >> shift);
    }
    x
}

/// The inverse of an odd `a` mod 2⁶⁴ (Newton's iteration).
fn inverse(a: u64) -> u64 {
    let mut x = a;
    for _ in 0..6 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
    }
    x
}

/// The state `v` with `splitmix64(v) == z`.
fn unsplitmix64(z: u64) -> u64 {
    let mut x = unxorshift(z, 31);
    x = unxorshift(x.wrapping_mul(inverse(0x94D0_49BB_1331_11EB)), 27);
    x = unxorshift(x.wrapping_mul(inverse(0xBF58_476D_1CE4_E5B9)), 30);
    x.wrapping_sub(0x9E37_79B9_7F4A_7C15)
}

/// A seed whose ordinal-0 multipliers are `m` for `vocab` tokens: m_0 = 2·(splitmix64(seed + Γ)
/// mod hb) + 1 leaves 2⁶⁴/hb candidates for splitmix64's output (about 4·vocab), each inverted
/// and checked against every multiplier.
fn recover_seed(m: &[u64], vocab: u64) -> Option<u64> {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let hb = ((i64::MAX as u64 / vocab) / 2).max(1);
    let first = *m.first()?;
    if first % 2 == 0 || (first - 1) / 2 >= hb {
        return None;
    }
    let r = (first - 1) / 2;
    let mut z = r;
    loop {
        let seed = unsplitmix64(z).wrapping_sub(GAMMA);
        if ngram::multipliers(seed, 0, m.len(), vocab) == m {
            return Some(seed);
        }
        z = z.checked_add(hb)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_inverts() {
        for v in [0u64, 1, 1234, u64::MAX, 0x0123_4567_89AB_CDEF] {
            assert_eq!(unsplitmix64(ngram::splitmix64(v)), v);
        }
    }

    #[test]
    fn seed_is_recovered_from_the_multipliers() {
        // The fixture's (seed 1234, vocab 512) and the release's (MODEL_MATH §4.6).
        let m = ngram::multipliers(1234, 0, 3, 512);
        assert_eq!(
            ngram::multipliers(recover_seed(&m, 512).unwrap(), 0, 3, 512),
            m
        );
        let released = [23703573157769, 20109073645365, 8052911324071];
        let seed = recover_seed(&released, 248320).unwrap();
        assert_eq!(seed, 1234);
        assert_eq!(recover_seed(&[23703573157769, 3, 5], 248320), None);
    }
}
