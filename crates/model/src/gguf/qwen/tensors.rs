//! The tensors of the Qwen architectures under the safetensors names and layout spindle
//! loads, with the converter's reorderings undone (see the parent module).

use super::qwen4exp::{self, PLE_TABLE};
use super::{arch_of, err, Arch};
use crate::error::Result;
use crate::gguf::file::GgufFile;
use crate::quant::ggml::{dequantize, GgmlType};
use crate::tensor::DType;
use crate::tensor::Part;
use crate::ModelConfig;

/// The GDN head counts needed to undo the V-head reordering.
#[derive(Clone, Copy)]
struct Heads {
    nk: usize,
    /// Value heads per key head.
    per_k: usize,
    hk: usize,
    hv: usize,
    /// Whether the file stores the value heads tiled (qwen35 / qwen35moe with nk < nv).
    tiled: bool,
}

impl Heads {
    /// Rows (or columns) in grouped order from `values` in tiled order: HF head k·r + j is
    /// GGUF head j·nk + k, each `block` wide; `stride` elements per row/column unit.
    fn untile<T: Copy + Default>(&self, values: &[T], block: usize, stride: usize) -> Vec<T> {
        if !self.tiled {
            return values.to_vec();
        }
        let unit = block * stride;
        let mut out = vec![T::default(); values.len()];
        for k in 0..self.nk {
            for j in 0..self.per_k {
                let (h, g) = (k * self.per_k + j, j * self.nk + k);
                out[h * unit..(h + 1) * unit].copy_from_slice(&values[g * unit..(g + 1) * unit]);
            }
        }
        out
    }

    /// Tiled order from `values` in grouped order (the inverse of [`Heads::untile`]): GGUF
    /// head j·nk + k is HF head k·r + j.
    fn tile<T: Copy + Default>(&self, values: &[T], block: usize, stride: usize) -> Vec<T> {
        if !self.tiled {
            return values.to_vec();
        }
        let unit = block * stride;
        let mut out = vec![T::default(); values.len()];
        for k in 0..self.nk {
            for j in 0..self.per_k {
                let (h, g) = (k * self.per_k + j, j * self.nk + k);
                out[g * unit..(g + 1) * unit].copy_from_slice(&values[h * unit..(h + 1) * unit]);
            }
        }
        out
    }

    /// Columns in grouped order for a [rows, nv·block] matrix.
    fn untile_cols(&self, values: &[f32], rows: usize, block: usize) -> Vec<f32> {
        let cols = values.len() / rows;
        values
            .chunks(cols)
            .flat_map(|row| self.untile(row, block, 1))
            .collect()
    }
}

/// The safetensors names and layout of every tensor the model needs.
pub(crate) fn tensors(files: &[GgufFile], config: &ModelConfig) -> Result<Vec<(String, Part)>> {
    let arch = arch_of(&files[0])?;
    let g = &config.gdn;
    let heads = Heads {
        nk: g.num_key_heads,
        per_k: g.num_value_heads / g.num_key_heads,
        hk: g.key_head_dim,
        hv: g.value_head_dim,
        tiled: arch != Arch::Qwen3Next && g.num_key_heads != g.num_value_heads,
    };
    let layers = config.num_layers();
    let mut out = Vec::new();
    let mut pending_qkv: Vec<Option<Vec<f32>>> = vec![None; layers];
    let mut pending_gate: Vec<Option<Vec<f32>>> = vec![None; layers];
    // qwen4exp: the QSA indexer's q and k rows, stored as two tensors.
    let mut pending_index: Vec<[Option<Vec<f32>>; 2]> = vec![[None, None]; layers];
    let q4 = arch == Arch::Qwen4Exp;
    let ple_layer = config.ple.as_ref().and_then(|p| p.layers.first().copied());
    for f in files {
        for t in &f.tensors {
            let bad = |message: String| err(f, format!("tensor `{}`: {message}", t.name));
            let (bid, rest) = match t.name.strip_prefix("blk.") {
                Some(r) => {
                    let (n, rest) = r
                        .split_once('.')
                        .ok_or_else(|| bad("no block suffix".into()))?;
                    let n: usize = n
                        .parse()
                        .map_err(|_| bad("block number is not a number".into()))?;
                    (Some(n), rest)
                }
                None => (None, t.name.as_str()),
            };
            if bid.is_some_and(|b| b >= layers) {
                continue; // MTP (nextn) layers: not run
            }
            let values = || -> Vec<f32> { dequantize(t.ty, f.bytes(t)) };
            let shape = t.shape();
            let as_stored = |name: String, shape: Vec<usize>| -> (String, Part) {
                match float_dtype(t.ty) {
                    Some(dtype) => (
                        name,
                        Part::Mapped {
                            path: f.path.clone(),
                            map: f.map.clone(),
                            dtype,
                            shape,
                            start: t.start,
                            end: t.end,
                        },
                    ),
                    None => (
                        name,
                        Part::Blocks {
                            path: f.path.clone(),
                            map: f.map.clone(),
                            ty: t.ty,
                            shape,
                            start: t.start,
                            end: t.end,
                            input_order: None,
                        },
                    ),
                }
            };
            let owned = |name: String, shape: Vec<usize>, values: Vec<f32>| {
                (name, Part::Owned { shape, values })
            };
            let Some(i) = bid else {
                match rest {
                    "token_embd.weight" => {
                        out.push(as_stored("model.embed_tokens.weight".into(), shape))
                    }
                    "output.weight" => out.push(as_stored("lm_head.weight".into(), shape)),
                    "output_norm.weight" => out.push(owned(
                        "model.norm.weight".into(),
                        shape,
                        minus_one(values()),
                    )),
                    "output_hc_norm.weight" if q4 => out.push(owned(
                        "model.hyper_connection_mixer.hc_norm.weight".into(),
                        vec![t.ne.iter().product()],
                        minus_one(values()),
                    )),
                    "output_hc_down.weight" if q4 => out.push(as_stored(
                        "model.hyper_connection_mixer.input_mix_weight_down.weight".into(),
                        shape,
                    )),
                    "output_hc_up.weight" if q4 => out.push(as_stored(
                        "model.hyper_connection_mixer.input_mix_weight_up.weight".into(),
                        shape,
                    )),
                    PLE_TABLE if q4 => {
                        let Some(p) = ple_layer else {
                            return Err(bad(
                                "the metadata lists no PLE layer (`qwen4exp.ple.layers`)".into(),
                            ));
                        };
                        out.push(as_stored(
                            format!("model.layers.{p}.ple.ple_embedding.ngram_embedding.weight"),
                            shape,
                        ))
                    }
                    _ => {
                        return Err(bad(format!(
                            "not a tensor of the {} layout spindle maps",
                            arch.name()
                        )))
                    }
                }
                continue;
            };
            let l = |suffix: &str| format!("model.layers.{i}.{suffix}");
            let rows = shape.first().copied().unwrap_or(1);
            match rest {
                "attn_norm.weight" => out.push(owned(
                    l("input_layernorm.weight"),
                    shape,
                    minus_one(values()),
                )),
                "post_attention_norm.weight" => out.push(owned(
                    l("post_attention_layernorm.weight"),
                    shape,
                    minus_one(values()),
                )),
                "attn_q.weight" => out.push(as_stored(l("self_attn.q_proj.weight"), shape)),
                "attn_k.weight" => out.push(as_stored(l("self_attn.k_proj.weight"), shape)),
                "attn_v.weight" => out.push(as_stored(l("self_attn.v_proj.weight"), shape)),
                "attn_output.weight" => out.push(as_stored(l("self_attn.o_proj.weight"), shape)),
                "attn_q_norm.weight" => out.push(owned(
                    l("self_attn.q_norm.weight"),
                    shape,
                    minus_one(values()),
                )),
                "attn_k_norm.weight" => out.push(owned(
                    l("self_attn.k_norm.weight"),
                    shape,
                    minus_one(values()),
                )),
                "attn_qkv.weight" | "attn_gate.weight"
                    if arch != Arch::Qwen3Next && float_dtype(t.ty).is_none() =>
                {
                    let name = match rest {
                        "attn_qkv.weight" => "in_proj_qkv",
                        _ => "in_proj_z",
                    };
                    if !heads.tiled {
                        out.push(as_stored(l(&format!("linear_attn.{name}.weight")), shape));
                        continue;
                    }
                    // Whole rows move: the blocks are reordered as they are, exactly.
                    let rb = t.ne[0] / t.ty.block_elements() * t.ty.block_bytes();
                    let mut bytes = f.bytes(t).to_vec();
                    let head = match rest {
                        "attn_qkv.weight" => 2 * heads.nk * heads.hk,
                        _ => 0,
                    };
                    if head * rb > bytes.len() {
                        return Err(bad(format!(
                            "shape {shape:?} is smaller than its q and k rows ({head})"
                        )));
                    }
                    let tail = heads.untile(&bytes[head * rb..], heads.hv, rb);
                    bytes[head * rb..].copy_from_slice(&tail);
                    out.push((
                        l(&format!("linear_attn.{name}.weight")),
                        Part::OwnedBlocks {
                            ty: t.ty,
                            shape,
                            bytes,
                        },
                    ));
                }
                "attn_qkv.weight" => {
                    let cols = t.ne[0];
                    let qk_rows = 2 * heads.nk * heads.hk;
                    let mut v = values();
                    if qk_rows * cols > v.len() {
                        return Err(bad(format!(
                            "shape {shape:?} is smaller than its q and k rows ({qk_rows})"
                        )));
                    }
                    let tail = heads.untile(&v[qk_rows * cols..], heads.hv, cols);
                    v[qk_rows * cols..].copy_from_slice(&tail);
                    if arch == Arch::Qwen3Next {
                        pending_qkv[i] = Some(v);
                    } else {
                        out.push(owned(l("linear_attn.in_proj_qkv.weight"), shape, v));
                    }
                }
                "attn_gate.weight" => {
                    let v = heads.untile(&values(), heads.hv, t.ne[0]);
                    if arch == Arch::Qwen3Next {
                        pending_gate[i] = Some(v);
                    } else {
                        out.push(owned(l("linear_attn.in_proj_z.weight"), shape, v));
                    }
                }
                "ssm_alpha.weight" => out.push(owned(
                    l("linear_attn.in_proj_a.weight"),
                    shape,
                    heads.untile(&values(), 1, t.ne[0]),
                )),
                "ssm_beta.weight" => out.push(owned(
                    l("linear_attn.in_proj_b.weight"),
                    shape,
                    heads.untile(&values(), 1, t.ne[0]),
                )),
                "ssm_ba.weight" => out.push(as_stored(l("linear_attn.in_proj_ba.weight"), shape)),
                "ssm_conv1d.weight" => {
                    // [C, K] → [C, 1, K]; the V channels follow q and k.
                    let k = t.ne[0];
                    let mut v = values();
                    let qk = 2 * heads.nk * heads.hk * k;
                    if qk > v.len() {
                        return Err(bad(format!(
                            "shape {shape:?} is smaller than its q and k channels"
                        )));
                    }
                    let tail = heads.untile(&v[qk..], heads.hv, k);
                    v[qk..].copy_from_slice(&tail);
                    out.push(owned(l("linear_attn.conv1d.weight"), vec![rows, 1, k], v));
                }
                "ssm_a" => {
                    let a = heads.untile(&values(), 1, 1);
                    if let Some(bad_a) = a.iter().find(|&&x| x.is_nan() || x >= 0.0) {
                        return Err(bad(format!(
                            "holds {bad_a}: llama.cpp stores -exp(A_log), always negative"
                        )));
                    }
                    let a_log = a.iter().map(|&x| (-x).ln()).collect();
                    out.push(owned(l("linear_attn.A_log"), shape, a_log));
                }
                "ssm_dt.bias" => out.push(owned(
                    l("linear_attn.dt_bias"),
                    shape,
                    heads.untile(&values(), 1, 1),
                )),
                "ssm_norm.weight" => out.push(as_stored(l("linear_attn.norm.weight"), shape)),
                "ssm_out.weight" if heads.tiled && float_dtype(t.ty).is_none() => {
                    // The columns were tiled by value heads narrower than a block: the blocks
                    // stay as stored and the input is gathered into their order instead.
                    let positions: Vec<u32> = (0..t.ne[0] as u32).collect();
                    let order = heads.tile(&positions, heads.hv, 1);
                    out.push((
                        l("linear_attn.out_proj.weight"),
                        Part::Blocks {
                            path: f.path.clone(),
                            map: f.map.clone(),
                            ty: t.ty,
                            shape,
                            start: t.start,
                            end: t.end,
                            input_order: Some(order.into()),
                        },
                    ))
                }
                "ssm_out.weight" => out.push(owned(
                    l("linear_attn.out_proj.weight"),
                    shape,
                    heads.untile_cols(&values(), rows, heads.hv),
                )),
                "ffn_gate.weight" => out.push(as_stored(l("mlp.gate_proj.weight"), shape)),
                "ffn_up.weight" => out.push(as_stored(l("mlp.up_proj.weight"), shape)),
                "ffn_down.weight" => out.push(as_stored(l("mlp.down_proj.weight"), shape)),
                "ffn_gate_inp.weight" => out.push(as_stored(l("mlp.gate.weight"), shape)),
                "ffn_gate_shexp.weight" => {
                    out.push(as_stored(l("mlp.shared_expert.gate_proj.weight"), shape))
                }
                "ffn_up_shexp.weight" => {
                    out.push(as_stored(l("mlp.shared_expert.up_proj.weight"), shape))
                }
                "ffn_down_shexp.weight" => {
                    out.push(as_stored(l("mlp.shared_expert.down_proj.weight"), shape))
                }
                "ffn_gate_inp_shexp.weight" => out.push(as_stored(
                    l("mlp.shared_expert_gate.weight"),
                    vec![1, t.ne[0]],
                )),
                "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight" => {
                    let proj = &rest[4..rest.len() - 12]; // gate / up / down
                    if t.ne.len() != 3 {
                        return Err(bad(format!("shape {shape:?}: expected [experts, out, in]")));
                    }
                    let (e_count, e_rows, e_cols) = (shape[0], shape[1], shape[2]);
                    let bytes = e_rows * e_cols / t.ty.block_elements() * t.ty.block_bytes();
                    for e in 0..e_count {
                        let name = l(&format!("mlp.experts.{e}.{proj}_proj.weight"));
                        let (start, end) = (t.start + e * bytes, t.start + (e + 1) * bytes);
                        let part = match float_dtype(t.ty) {
                            Some(dtype) => Part::Mapped {
                                path: f.path.clone(),
                                map: f.map.clone(),
                                dtype,
                                shape: vec![e_rows, e_cols],
                                start,
                                end,
                            },
                            None => Part::Blocks {
                                path: f.path.clone(),
                                map: f.map.clone(),
                                ty: t.ty,
                                shape: vec![e_rows, e_cols],
                                start,
                                end,
                                input_order: None,
                            },
                        };
                        out.push((name, part));
                    }
                }
                _ if q4 => {
                    if let Some(hc) = rest.strip_prefix("hc_") {
                        let (block, part) = hc.split_once('_').unwrap_or(("", ""));
                        let block = match block {
                            "attn" => "attn_hyper_connection",
                            "ffn" => "mlp_hyper_connection",
                            _ => return Err(bad("not a hyper-connection block".into())),
                        };
                        let name = |s: &str| l(&format!("{block}.{s}"));
                        match part {
                            "norm.weight" => out.push(owned(
                                name("hc_norm.weight"),
                                vec![t.ne.iter().product()],
                                minus_one(values()),
                            )),
                            "down.weight" => {
                                out.push(as_stored(name("input_mix_weight_down.weight"), shape))
                            }
                            "up.weight" => {
                                out.push(as_stored(name("input_mix_weight_up.weight"), shape))
                            }
                            "inject.weight" => {
                                out.push(as_stored(name("block_inject_weight.weight"), shape))
                            }
                            _ => return Err(bad("not a hyper-connection tensor".into())),
                        }
                        continue;
                    }
                    match rest {
                        "indexer.q_proj.weight" => pending_index[i][0] = Some(values()),
                        "indexer.k_proj.weight" => pending_index[i][1] = Some(values()),
                        "indexer.q_norm.weight" => out.push(owned(
                            l("self_attn.indexer.q_layernorm.weight"),
                            shape,
                            minus_one(values()),
                        )),
                        "indexer.k_norm.weight" => out.push(owned(
                            l("self_attn.indexer.k_layernorm.weight"),
                            shape,
                            minus_one(values()),
                        )),
                        "ple_key.weight" => out.push(as_stored(l("ple.key_proj.weight"), shape)),
                        "ple_value.weight" => {
                            out.push(as_stored(l("ple.value_proj.weight"), shape))
                        }
                        "ple_norm_key.weight"
                        | "ple_norm_query.weight"
                        | "ple_norm_conv.weight" => {
                            let which = &rest["ple_".len()..rest.len() - ".weight".len()];
                            out.push(owned(
                                l(&format!("ple.{which}.weight")),
                                shape,
                                minus_one(values()),
                            ))
                        }
                        "ple_conv1d.weight" => {
                            // [C, K] → [C, 1, K]
                            let k = t.ne[0];
                            out.push(owned(l("ple.conv1d.weight"), vec![rows, 1, k], values()))
                        }
                        _ => {
                            return Err(bad(format!(
                                "not a tensor of the {} layout spindle maps",
                                arch.name()
                            )))
                        }
                    }
                }
                _ => {
                    return Err(bad(format!(
                        "not a tensor of the {} layout spindle maps",
                        arch.name()
                    )))
                }
            }
        }
    }
    if q4 {
        qwen4exp_finish(files, config, pending_index, &mut out)?;
    }
    // qwen3next: in_proj_qkvz interleaves [q, k, v, z] per key head.
    for i in 0..layers {
        match (pending_qkv[i].take(), pending_gate[i].take()) {
            (None, None) => {}
            (Some(qkv), Some(z)) => {
                let cols = config.hidden_size;
                let (hk, vz) = (heads.hk * cols, heads.per_k * heads.hv * cols);
                let (q, rest) = qkv.split_at(heads.nk * hk);
                let (k, v) = rest.split_at(heads.nk * hk);
                let mut fused = Vec::with_capacity(qkv.len() + z.len());
                for g in 0..heads.nk {
                    fused.extend_from_slice(&q[g * hk..(g + 1) * hk]);
                    fused.extend_from_slice(&k[g * hk..(g + 1) * hk]);
                    fused.extend_from_slice(&v[g * vz..(g + 1) * vz]);
                    fused.extend_from_slice(&z[g * vz..(g + 1) * vz]);
                }
                let rows = fused.len() / cols;
                out.push((
                    format!("model.layers.{i}.linear_attn.in_proj_qkvz.weight"),
                    Part::Owned {
                        shape: vec![rows, cols],
                        values: fused,
                    },
                ));
            }
            _ => {
                return Err(err(
                    &files[0],
                    format!("layer {i} has only one of `blk.{i}.attn_qkv.weight` and `blk.{i}.attn_gate.weight`: qwen3next needs both"),
                ))
            }
        }
    }
    Ok(out)
}

/// qwen4exp: the indexer's `index_qk_proj` rebuilt from its q and k rows, the PLE hash
/// buffers from the metadata, and a check that every tensor the model needs is present, named
/// as the file would name it.
fn qwen4exp_finish(
    files: &[GgufFile],
    config: &ModelConfig,
    pending_index: Vec<[Option<Vec<f32>>; 2]>,
    out: &mut Vec<(String, Part)>,
) -> Result<()> {
    let f = &files[0];
    let missing = |name: String| err(f, format!("tensor `{name}` is missing"));
    let mut required: Vec<String> = ["output_hc_norm", "output_hc_down", "output_hc_up"]
        .iter()
        .map(|n| format!("{n}.weight"))
        .collect();
    for (i, [q, k]) in pending_index.into_iter().enumerate() {
        for block in ["attn", "ffn"] {
            for part in ["norm", "down", "up", "inject"] {
                required.push(format!("blk.{i}.hc_{block}_{part}.weight"));
            }
        }
        if config.layers[i].mixer == crate::MixerKind::LinearAttention {
            continue;
        }
        for n in ["q_norm", "k_norm"] {
            required.push(format!("blk.{i}.indexer.{n}.weight"));
        }
        let q = q.ok_or_else(|| missing(format!("blk.{i}.indexer.q_proj.weight")))?;
        let k = k.ok_or_else(|| missing(format!("blk.{i}.indexer.k_proj.weight")))?;
        let cols = config.hidden_size;
        let mut qk = q;
        qk.extend(k);
        out.push((
            format!("model.layers.{i}.self_attn.indexer.index_qk_proj.weight"),
            Part::Owned {
                shape: vec![qk.len() / cols, cols],
                values: qk,
            },
        ));
    }
    if let Some(p) = config.ple.as_ref().and_then(|p| p.layers.first().copied()) {
        for n in [
            "key",
            "value",
            "norm_key",
            "norm_query",
            "norm_conv",
            "conv1d",
        ] {
            required.push(format!("blk.{p}.ple_{n}.weight"));
        }
        required.push(PLE_TABLE.into());
        let prefix = format!("{}.", Arch::Qwen4Exp.name());
        for (suffix, values) in qwen4exp::hash_buffers(f, &prefix)? {
            out.push((
                format!("model.layers.{p}.ple.ple_embedding.{suffix}"),
                Part::Ints {
                    shape: vec![values.len()],
                    values,
                },
            ));
        }
    }
    match required
        .into_iter()
        .find(|n| super::find(files, n).is_none())
    {
        Some(name) => Err(missing(name)),
        None => Ok(()),
    }
}

fn float_dtype(ty: GgmlType) -> Option<DType> {
    match ty {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::Bf16 => Some(DType::Bf16),
        _ => None,
    }
}

/// Undoes the converter's `w + 1` on RMSNorm weights.
fn minus_one(mut values: Vec<f32>) -> Vec<f32> {
    values.iter_mut().for_each(|v| *v -= 1.0);
    values
}
