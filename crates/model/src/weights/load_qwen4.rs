//! Loading the weights qwen4_exp adds: hyper-connection blocks, the QSA indexer and PLE with
//! its n-gram table (whose stored hash buffers must equal what the config implies).

use crate::ngram::NgramHash;
use crate::{
    Checkpoint, HyperConfig, ModelConfig, ModelError, PleConfig, QsaConfig, Result, TensorNames,
};

use super::{HyperWeights, IndexerWeights, Linear, NgramTable, PleWeights};

/// Loads a hyper-connection block under `prefix` (with `block_inject_weight` unless it is the
/// final mixer).
pub fn load_hyper(
    ck: &Checkpoint,
    prefix: &str,
    hc: &HyperConfig,
    hidden: usize,
    inject: bool,
) -> Result<HyperWeights> {
    let width = hc.streams * hidden;
    Ok(HyperWeights {
        norm: ck.f32_values(&format!("{prefix}.hc_norm.weight"), &[width])?,
        mix_down: Linear::Mapped(ck.matrix(
            &format!("{prefix}.input_mix_weight_down.weight"),
            &[hc.lowrank, width],
        )?),
        mix_up: Linear::Mapped(ck.matrix(
            &format!("{prefix}.input_mix_weight_up.weight"),
            &[width, hc.lowrank],
        )?),
        inject: if inject {
            Some(Linear::Mapped(ck.matrix(
                &format!("{prefix}.block_inject_weight.weight"),
                &[hc.streams, width],
            )?))
        } else {
            None
        },
    })
}

/// Loads the QSA indexer under `prefix`.
pub fn load_indexer(
    ck: &Checkpoint,
    prefix: &str,
    qsa: &QsaConfig,
    hidden: usize,
) -> Result<IndexerWeights> {
    Ok(IndexerWeights {
        qk_proj: Linear::Mapped(ck.matrix(
            &format!("{prefix}.index_qk_proj.weight"),
            &[(qsa.n_heads + 1) * qsa.head_dim, hidden],
        )?),
        q_norm: ck.f32_values(&format!("{prefix}.q_layernorm.weight"), &[qsa.head_dim])?,
        k_norm: ck.f32_values(&format!("{prefix}.k_layernorm.weight"), &[qsa.head_dim])?,
    })
}

/// Checks that an int64 buffer stored in the checkpoint equals what the config implies.
fn check_buffer(ck: &Checkpoint, name: &str, expected: &[u64]) -> Result<()> {
    let stored = ck.i64_values(name, &[expected.len()])?;
    if stored.iter().zip(expected).any(|(&s, &e)| s as u64 != e) {
        return Err(ModelError::ValueMismatch {
            path: ck.file_of(name),
            tensor: name.to_owned(),
            message: format!(
                "holds {stored:?} but the config (seed, ngram_vocab_size_base, vocab_size) gives {expected:?}; \
                 refusing to run with a different n-gram hash"
            ),
        });
    }
    Ok(())
}

/// Loads PLE layer `layer`, refusing hash buffers that disagree with the config.
pub fn load_ple(
    ck: &Checkpoint,
    names: &TensorNames,
    config: &ModelConfig,
    ple: &PleConfig,
    layer: usize,
) -> Result<PleWeights> {
    let ordinal = ple.ordinal(layer).expect("layer is a PLE layer");
    let streams = config.hyper.as_ref().map_or(1, |h| h.streams);
    let hidden = config.hidden_size;
    let width = streams * hidden;
    let t = |s: &str| names.layer(layer, &format!("ple.{s}"));

    let hash = NgramHash::from_config(ple, ordinal, config.vocab_size);
    check_buffer(ck, &t("ple_embedding.layer_multipliers"), &hash.multipliers)?;
    check_buffer(
        ck,
        &t("ple_embedding.ngram_heads_vocab_sizes"),
        &hash.vocab_sizes,
    )?;
    check_buffer(ck, &t("ple_embedding.ngram_heads_offsets"), &hash.offsets)?;

    let rows = hash.padded_rows(ple.vocab_divisible_by) as usize;
    let head_dim = ple.head_dim();
    let table = if ck.contains(&t("ple_embedding.ngram_embedding.weight")) {
        NgramTable {
            shards: vec![Linear::Mapped(ck.matrix(
                &t("ple_embedding.ngram_embedding.weight"),
                &[rows, head_dim],
            )?)],
            shard_rows: rows,
        }
    } else {
        if rows % ple.split_parts != 0 {
            return Err(ModelError::Config {
                path: ck.dir().join("config.json"),
                message: format!(
                    "the n-gram table has {rows} rows, not divisible by split_ngram_parts {}",
                    ple.split_parts
                ),
            });
        }
        let shard_rows = rows / ple.split_parts;
        let shards = (0..ple.split_parts)
            .map(|k| {
                let name = t(&format!("ple_embedding.ngram_embedding.shard_{k}.weight"));
                ck.matrix(&name, &[shard_rows, head_dim])
                    .map(Linear::Mapped)
            })
            .collect::<Result<Vec<_>>>()?;
        NgramTable { shards, shard_rows }
    };
    Ok(PleWeights {
        hash,
        table,
        key_proj: Linear::Mapped(ck.matrix(&t("key_proj.weight"), &[width, ple.embed_dim])?),
        value_proj: Linear::Mapped(ck.matrix(&t("value_proj.weight"), &[hidden, ple.embed_dim])?),
        norm_key: ck.f32_values(&t("norm_key.weight"), &[width])?,
        norm_query: ck.f32_values(&t("norm_query.weight"), &[width])?,
        norm_conv: ck.f32_values(&t("norm_conv.weight"), &[width])?,
        conv: ck.f32_values(&t("conv1d.weight"), &[width, 1, ple.conv_kernel])?,
        conv_kernel: ple.conv_kernel,
    })
}
