//! llama.cpp's Qwen hybrid architectures (`qwen35moe`, `qwen35`, `qwen3next`) mapped back to
//! the Hugging Face config and tensor layout, undoing what `convert_hf_to_gguf.py` does
//! (`conversion/qwen.py`: `Qwen3NextModel.modify_tensors`,
//! `_LinearAttentionVReorderBase.modify_tensors`, `Qwen2MoeModel.modify_tensors`):
//! - RMSNorm weights other than the GDN output norm are stored as `w + 1`;
//! - `A_log` is stored as `ssm_a = -exp(A_log)`, `dt_bias` as `ssm_dt.bias`, the conv kernel
//!   squeezed to [C, K];
//! - `qwen35`/`qwen35moe` with fewer key than value heads store the GDN value heads tiled
//!   ([v0 of every key head, v1 of every key head, ...]) instead of grouped by key head, in
//!   `attn_qkv`'s V rows, `attn_gate`, `ssm_alpha`/`ssm_beta`, `ssm_a`, `ssm_dt`, the conv's V
//!   channels and `ssm_out`'s columns;
//! - `qwen3next` splits `in_proj_qkvz` (interleaved per key head) into `attn_qkv` + `attn_gate`;
//! - routed experts are stacked per projection (`ffn_{gate,up,down}_exps` [E, out, in]).

use serde_json::{json, Map, Value as Json};

use super::file::{GgufFile, TensorInfo, Value};
use super::quants::{dequantize, GgmlType};
use crate::checkpoint::Part;
use crate::error::{ModelError, Result};
use crate::tensor::DType;
use crate::ModelConfig;

/// A llama.cpp architecture spindle maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arch {
    Qwen35Moe,
    Qwen35,
    Qwen3Next,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen3Next => "qwen3next",
        }
    }
}

fn err(f: &GgufFile, message: String) -> ModelError {
    ModelError::Gguf {
        path: f.path.clone(),
        message,
    }
}

fn arch_of(f: &GgufFile) -> Result<Arch> {
    let arch = f
        .get("general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| err(f, "metadata key `general.architecture` is missing".into()))?;
    match arch {
        "qwen35moe" => Ok(Arch::Qwen35Moe),
        "qwen35" => Ok(Arch::Qwen35),
        "qwen3next" => Ok(Arch::Qwen3Next),
        "qwen4exp" => Err(err(
            f,
            "metadata key `general.architecture` = \"qwen4exp\": GGUF files of this architecture are not mapped yet (use the safetensors checkpoint)".into(),
        )),
        other => Err(err(
            f,
            format!(
                "metadata key `general.architecture` = {other:?}: not an architecture spindle runs (qwen35moe, qwen35, qwen3next)"
            ),
        )),
    }
}

/// The `{arch}.*` keys spindle reads; any other key of the architecture is refused by name.
const KNOWN_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.recurrent_layers",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.dimension_sections",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "expert_weights_norm",
    "expert_gating_func",
    "ssm.conv_kernel",
    "ssm.state_size",
    "ssm.group_count",
    "ssm.time_step_rank",
    "ssm.inner_size",
    "full_attention_interval",
    "nextn_predict_layers",
];

/// The Hugging Face `config.json` (text-only, flat) equivalent to the GGUF metadata.
pub fn config_json(files: &[GgufFile]) -> Result<Json> {
    let f = &files[0];
    let arch = arch_of(f)?;
    let prefix = format!("{}.", arch.name());
    for (key, _) in &f.metadata {
        if let Some(rest) = key.strip_prefix(&prefix) {
            if !KNOWN_KEYS.contains(&rest) {
                return Err(err(
                    f,
                    format!("metadata key `{key}` is not one spindle understands for {}: refused rather than ignored", arch.name()),
                ));
            }
        }
    }
    let get = |k: &str| f.get(&format!("{prefix}{k}"));
    let uint = |k: &str| -> Result<Option<u64>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                err(
                    f,
                    format!("metadata key `{prefix}{k}` = {v:?}: expected an unsigned integer"),
                )
            }),
        }
    };
    let need = |k: &str| -> Result<u64> {
        uint(k)?.ok_or_else(|| err(f, format!("metadata key `{prefix}{k}` is missing")))
    };
    let nextn = uint("nextn_predict_layers")?.unwrap_or(0);
    let blocks = need("block_count")?;
    let layers = blocks
        .checked_sub(nextn)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            err(
                f,
                format!("`{prefix}block_count` {blocks} leaves no layers after {nextn} MTP layers"),
            )
        })?;
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let head_dim = match uint("attention.key_length")? {
        Some(k) => k,
        None => hidden / heads.max(1),
    };
    if let Some(v) = uint("attention.value_length")? {
        if v != head_dim {
            return Err(err(f, format!(
                "metadata keys `{prefix}attention.key_length` {head_dim} and `{prefix}attention.value_length` {v} differ: these families use one head size"
            )));
        }
    }
    let rope_dim = need("rope.dimension_count")?;
    let eps = get("attention.layer_norm_rms_epsilon")
        .and_then(Value::as_f64)
        .ok_or_else(|| err(f, format!("metadata key `{prefix}attention.layer_norm_rms_epsilon` is missing or not a number")))?;
    let theta = get("rope.freq_base")
        .and_then(Value::as_f64)
        .unwrap_or(10_000.0);
    let v_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    if v_heads == 0 || inner % v_heads != 0 {
        return Err(err(f, format!(
            "`{prefix}ssm.inner_size` {inner} is not a whole number of `{prefix}ssm.time_step_rank` {v_heads} value heads"
        )));
    }
    let layer_types: Vec<&str> = match get("attention.recurrent_layers") {
        Some(v) => {
            let flags = v.as_array().ok_or_else(|| {
                err(
                    f,
                    format!("`{prefix}attention.recurrent_layers` is not an array"),
                )
            })?;
            flags
                .iter()
                .take(layers as usize)
                .map(|b| match b {
                    Value::Bool(true) => Ok("linear_attention"),
                    Value::Bool(false) => Ok("full_attention"),
                    other => Err(err(f, format!("`{prefix}attention.recurrent_layers` holds {other:?}: expected booleans"))),
                })
                .collect::<Result<_>>()?
        }
        None => {
            let interval = uint("full_attention_interval")?.unwrap_or(4).max(1);
            (0..layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        "full_attention"
                    } else {
                        "linear_attention"
                    }
                })
                .collect()
        }
    };
    let token_embd = find(files, "token_embd.weight")
        .ok_or_else(|| err(f, "tensor `token_embd.weight` is missing".into()))?;
    let vocab = token_embd.1.ne.get(1).copied().unwrap_or(0);
    let tied = find(files, "output.weight").is_none();
    let mut c = Map::new();
    c.insert(
        "model_type".into(),
        match arch {
            Arch::Qwen35Moe => "qwen3_5_moe_text",
            Arch::Qwen35 => "qwen3_5_text",
            Arch::Qwen3Next => "qwen3_next",
        }
        .into(),
    );
    c.insert("hidden_size".into(), hidden.into());
    c.insert("vocab_size".into(), vocab.into());
    c.insert("num_hidden_layers".into(), layers.into());
    c.insert("rms_norm_eps".into(), eps.into());
    c.insert("num_attention_heads".into(), heads.into());
    c.insert(
        "num_key_value_heads".into(),
        need("attention.head_count_kv")?.into(),
    );
    c.insert("head_dim".into(), head_dim.into());
    let partial = rope_dim as f64 / head_dim.max(1) as f64;
    c.insert("partial_rotary_factor".into(), partial.into());
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}),
    );
    c.insert(
        "linear_conv_kernel_dim".into(),
        need("ssm.conv_kernel")?.into(),
    );
    c.insert("linear_key_head_dim".into(), need("ssm.state_size")?.into());
    c.insert(
        "linear_num_key_heads".into(),
        need("ssm.group_count")?.into(),
    );
    c.insert("linear_num_value_heads".into(), v_heads.into());
    c.insert("linear_value_head_dim".into(), (inner / v_heads).into());
    c.insert("layer_types".into(), layer_types.into());
    c.insert("tie_word_embeddings".into(), tied.into());
    if let Some(n) = uint("context_length")? {
        c.insert("max_position_embeddings".into(), n.into());
    }
    if let Some(n) = uint("feed_forward_length")? {
        c.insert("intermediate_size".into(), n.into());
    }
    if arch != Arch::Qwen35 {
        c.insert("num_experts".into(), need("expert_count")?.into());
        c.insert(
            "num_experts_per_tok".into(),
            need("expert_used_count")?.into(),
        );
        c.insert(
            "moe_intermediate_size".into(),
            need("expert_feed_forward_length")?.into(),
        );
        c.insert(
            "shared_expert_intermediate_size".into(),
            need("expert_shared_feed_forward_length")?.into(),
        );
        if let Some(Value::Bool(norm)) = get("expert_weights_norm") {
            c.insert("norm_topk_prob".into(), (*norm).into());
        }
        if let Some(g) = uint("expert_gating_func")? {
            // llama_expert_gating_func_type: 1 = softmax, what these families route with.
            if g != 1 {
                return Err(err(f, format!("metadata key `{prefix}expert_gating_func` = {g}: these families route with softmax (1)")));
            }
        }
    }
    match f.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64) {
        Some(eos) => c.insert("eos_token_id".into(), eos.into()),
        None => c.insert("eos_token_id".into(), Json::Array(Vec::new())),
    };
    Ok(Json::Object(c))
}

/// Tensor `name` and the index of the file holding it.
fn find<'a>(files: &'a [GgufFile], name: &str) -> Option<(usize, &'a TensorInfo)> {
    files
        .iter()
        .enumerate()
        .find_map(|(i, f)| f.tensors.iter().find(|t| t.name == name).map(|t| (i, t)))
}

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
    fn untile(&self, values: &[f32], block: usize, stride: usize) -> Vec<f32> {
        if !self.tiled {
            return values.to_vec();
        }
        let unit = block * stride;
        let mut out = vec![0.0; values.len()];
        for k in 0..self.nk {
            for j in 0..self.per_k {
                let (h, g) = (k * self.per_k + j, j * self.nk + k);
                out[h * unit..(h + 1) * unit].copy_from_slice(&values[g * unit..(g + 1) * unit]);
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
                        Part::Owned {
                            shape,
                            values: values(),
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
                            None => Part::Owned {
                                shape: vec![e_rows, e_cols],
                                values: dequantize(t.ty, &f.map[start..end]),
                            },
                        };
                        out.push((name, part));
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
