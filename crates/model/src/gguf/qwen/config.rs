//! The GGUF metadata of the Qwen architectures as the Hugging Face `config.json` spindle
//! validates (`TextModel`, `Qwen2MoeModel` and `Qwen3NextModel.set_gguf_parameters` wrote it).

use serde_json::{json, Map, Value as Json};

use super::{arch_of, err, find, Arch};
use crate::error::Result;
use crate::gguf::file::{GgufFile, Value};

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
            let known = KNOWN_KEYS.contains(&rest)
                || (arch == Arch::Qwen4Exp && super::qwen4exp::KEYS.contains(&rest));
            if !known {
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
    // A non-finite float would become JSON null, which reads as "absent": refused here.
    let float = |k: &str| -> Result<Option<f64>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    err(
                        f,
                        format!("metadata key `{prefix}{k}` = {v:?}: expected a finite number"),
                    )
                }),
        }
    };
    let eps = float("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
        err(
            f,
            format!("metadata key `{prefix}attention.layer_norm_rms_epsilon` is missing"),
        )
    })?;
    let theta = float("rope.freq_base")?.unwrap_or(10_000.0);
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
            let interval = uint("full_attention_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(err(
                    f,
                    format!("metadata key `{prefix}full_attention_interval` is 0: expected a positive layer interval"),
                ));
            }
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
            Arch::Qwen4Exp => "qwen4_exp_text",
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
    // End of generation: the end-of-sequence and end-of-turn tokens llama.cpp stops at.
    let mut eos: Vec<u64> = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = f.get(key).and_then(Value::as_u64) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    c.insert("eos_token_id".into(), eos.into());
    if arch == Arch::Qwen4Exp {
        super::qwen4exp::config_fields(files, &prefix, &mut c)?;
    }
    Ok(Json::Object(c))
}
