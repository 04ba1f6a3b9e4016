//! `config.json` → one validated [`ModelConfig`] (MODEL_MATH §2-§4).
//!
//! Raw JSON is read once here, every invariant the math relies on is checked, and the rest of
//! spindle trusts the typed value. A violation is refused with the field names and values.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

mod qwen4;
mod vision;

pub use qwen4::{GdnGate, HyperConfig, PleConfig, QsaConfig};
pub use vision::{VisionConfig, VisionTokens};

/// The model families spindle knows (`model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_next`: fused `in_proj_qkvz` / `in_proj_ba`, MoE with per-expert keys.
    Qwen3Next,
    /// `qwen3_5`: split GDN projections, dense FFN.
    Qwen35Dense,
    /// `qwen3_5_moe`: split GDN projections, every FFN a MoE, fused or per-expert experts.
    Qwen35Moe,
    /// `qwen4_exp` (Qwen3.8-Flash-Next): hyper-connections, PLE n-gram embeddings, QSA.
    Qwen4Exp,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen3Next => "qwen3_next",
            Family::Qwen35Dense => "qwen3_5",
            Family::Qwen35Moe => "qwen3_5_moe",
            Family::Qwen4Exp => "qwen4_exp",
        }
    }
}

/// The token mixer of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Gated DeltaNet linear attention (MODEL_MATH §1.5).
    LinearAttention,
    /// Gated full attention with a KV cache (MODEL_MATH §1.4).
    FullAttention,
}

/// The feed-forward block of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    Dense,
    Moe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    pub mixer: MixerKind,
    pub ffn: FfnKind,
}

/// Gated full attention shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// Gated DeltaNet shapes (n_k, n_v, d_k, d_v, K of MODEL_MATH).
#[derive(Clone, Debug, PartialEq)]
pub struct GdnConfig {
    pub num_key_heads: usize,
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub conv_kernel: usize,
}

impl GdnConfig {
    /// (n_k, n_v, d_k, d_v): key heads, value heads, key and value head sizes.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        (
            self.num_key_heads,
            self.num_value_heads,
            self.key_head_dim,
            self.value_head_dim,
        )
    }

    /// Conv channels C = 2·n_k·d_k + n_v·d_v, ordered `[q | k | v]`.
    pub fn conv_channels(&self) -> usize {
        2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
    }
    /// v-heads per k-head (ρ).
    pub fn heads_per_key(&self) -> usize {
        self.num_value_heads / self.num_key_heads
    }
}

/// Mixture-of-experts shapes and routing rule (MODEL_MATH §1.6).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    /// I: intermediate size of one routed expert.
    pub expert_intermediate: usize,
    /// I_s: intermediate size of the shared expert.
    pub shared_intermediate: usize,
    /// Divide the top-k weights by their sum (always true for Qwen3.5-MoE).
    pub renormalize: bool,
}

/// Rotary embedding parameters (MODEL_MATH §1.3).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub partial_rotary_factor: f64,
    /// r = head_dim · partial_rotary_factor: the rotated leading dims of each head.
    pub rotary_dim: usize,
    /// Interleaved MRoPE sections; for text-only input MRoPE equals 1-D RoPE.
    pub mrope_section: Option<Vec<usize>>,
    pub mrope_interleaved: bool,
}

/// Everything the engine needs to know about a checkpoint's architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub rms_norm_eps: f64,
    pub layers: Vec<LayerSpec>,
    pub attention: AttentionConfig,
    pub gdn: GdnConfig,
    pub rope: RopeConfig,
    /// Dense MLP intermediate size, when any layer has a dense FFN.
    pub intermediate_size: Option<usize>,
    pub moe: Option<MoeConfig>,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub max_position_embeddings: usize,
    /// True for the `*ForConditionalGeneration` layout (`text_config`, `model.language_model.`).
    pub multimodal_wrapper: bool,
    /// Activation of the GDN output-norm gate (`output_gate_type`; SiLU before qwen4_exp).
    pub gdn_gate: GdnGate,
    /// qwen4_exp: the multi-stream residual. `None` means the plain residual with layer norms.
    pub hyper: Option<HyperConfig>,
    /// qwen4_exp: hashed n-gram embeddings added before some linear layers.
    pub ple: Option<PleConfig>,
    /// qwen4_exp: every attention layer selects its keys with a QSA indexer.
    pub qsa: Option<QsaConfig>,
    /// Block-FP8 weights (`quantization_config`, MODEL_MATH §9); the checkpoint dequantizes
    /// them when read.
    pub fp8: Option<crate::fp8::BlockFp8>,
    /// The vision tower (`vision_config`) and image token ids, when the checkpoint has them.
    pub vision: Option<VisionConfig>,
}

impl ModelConfig {
    /// Reads and validates `DIR/config.json`.
    /// A GGUF file (`x.gguf`) is read from its metadata instead (`crate::gguf`).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if crate::gguf::is_gguf(dir) {
            return crate::gguf::open_config(dir);
        }
        Self::from_file(&dir.join("config.json"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            crate::fs::read_bounded_to_string(path, crate::fs::CONFIG_LIMIT).map_err(|error| {
                ModelError::Io {
                    path: path.to_owned(),
                    error,
                }
            })?;
        Self::from_json_str(&text, path)
    }

    /// Parses config text; `path` is only used in messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|error| ModelError::Json {
            path: path.to_owned(),
            error,
        })?;
        parse(&value, path)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// Field reader that turns type errors into messages naming the field.
pub(super) struct Fields<'a> {
    pub(super) obj: &'a Map<String, Value>,
    /// Prefix for messages, e.g. `text_config.`.
    pub(super) prefix: &'static str,
    pub(super) path: &'a Path,
}

impl<'a> Fields<'a> {
    pub(super) fn err(&self, message: String) -> ModelError {
        ModelError::Config {
            path: self.path.to_owned(),
            message,
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = v.as_u64().ok_or_else(|| {
            self.err(format!(
                "{}{key} = {v}: expected a non-negative integer",
                self.prefix
            ))
        })?;
        let limit = size_limit(key);
        if n > limit {
            return Err(self.err(format!(
                "{}{key} = {n}: larger than spindle accepts for this field ({limit})",
                self.prefix
            )));
        }
        Ok(Some(n as usize))
    }

    pub(super) fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(format!("{}{key} is missing", self.prefix)))
    }

    pub(super) fn positive(&self, key: &str) -> Result<usize> {
        let n = self.usize(key)?;
        if n == 0 {
            return Err(self.err(format!("{}{key} = 0: must be positive", self.prefix)));
        }
        Ok(n)
    }

    pub(super) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(format!("{}{key} = {v}: expected a number", self.prefix))),
        }
    }

    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                self.err(format!(
                    "{}{key} = {v}: expected true or false",
                    self.prefix
                ))
            }),
        }
    }

    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("{}{key} = {v}: expected a string", self.prefix))),
        }
    }

    pub(super) fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || {
            self.err(format!(
                "{}{key} = {v}: expected a list of non-negative integers",
                self.prefix
            ))
        };
        let list = v.as_array().ok_or_else(bad)?;
        list.iter()
            .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(bad))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// The largest value a size field may hold. Bounding every dimension keeps all shape products
/// (at most three dimensions times an element size) far from overflowing `usize`.
fn size_limit(key: &str) -> u64 {
    match key {
        "seed" => u64::MAX,
        "ngram_vocab_size_base" => 1 << 40,
        "vocab_size" | "max_position_embeddings" => 1 << 24,
        _ => 1 << 20,
    }
}

fn family_from_model_type(model_type: &str, path: &Path) -> Result<Family> {
    match model_type {
        "qwen3_next" => Ok(Family::Qwen3Next),
        "qwen3_5" | "qwen3_5_text" => Ok(Family::Qwen35Dense),
        "qwen3_5_moe" | "qwen3_5_moe_text" => Ok(Family::Qwen35Moe),
        "qwen4_exp" | "qwen4_exp_text" => Ok(Family::Qwen4Exp),
        other => Err(ModelError::Unsupported {
            path: path.to_owned(),
            message: format!(
                "model_type {other:?} is not a family spindle runs \
                 (qwen3_next, qwen3_5, qwen3_5_moe, qwen4_exp)"
            ),
        }),
    }
}

fn parse(value: &Value, path: &Path) -> Result<ModelConfig> {
    let config_err = |message: String| ModelError::Config {
        path: path.to_owned(),
        message,
    };
    let top = value
        .as_object()
        .ok_or_else(|| config_err("the top level must be a JSON object".into()))?;
    let top_fields = Fields {
        obj: top,
        prefix: "",
        path,
    };

    let (text, prefix, multimodal_wrapper) = match top.get("text_config").filter(|v| !v.is_null()) {
        Some(v) => (
            v.as_object()
                .ok_or_else(|| config_err("text_config must be a JSON object".into()))?,
            "text_config.",
            true,
        ),
        None => (top, "", false),
    };
    let f = Fields {
        obj: text,
        prefix,
        path,
    };

    let model_type = top_fields
        .opt_str("model_type")?
        .or(f.opt_str("model_type")?)
        .ok_or_else(|| config_err("model_type is missing".into()))?;
    let family = family_from_model_type(model_type, path)?;
    let fp8 = crate::fp8::parse_quantization(top, text, path)?;

    let hidden_size = f.positive("hidden_size")?;
    let vocab_size = f.positive("vocab_size")?;
    let num_layers = f.positive("num_hidden_layers")?;
    let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
    if !(rms_norm_eps > 0.0 && rms_norm_eps < 1.0) {
        return Err(config_err(format!(
            "{prefix}rms_norm_eps = {rms_norm_eps}: must be in (0, 1)"
        )));
    }
    if let Some(act) = f.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(config_err(format!(
                "{prefix}hidden_act = {act:?}: only \"silu\" is supported"
            )));
        }
    }
    if f.opt_bool("attn_output_gate")? == Some(false) {
        return Err(config_err(format!(
            "{prefix}attn_output_gate = false: these families always gate attention output"
        )));
    }
    if f.opt_bool("attention_bias")? == Some(true) {
        return Err(config_err(format!(
            "{prefix}attention_bias = true: attention biases are not supported"
        )));
    }

    let attention = parse_attention(&f)?;
    let gdn = parse_gdn(&f)?;
    let rope = parse_rope(&f, attention.head_dim)?;
    let mixers = parse_layer_types(&f, family, num_layers)?;
    let (layers, intermediate_size, moe) = parse_ffn(&f, family, &mixers)?;

    let tie_word_embeddings = top_fields
        .opt_bool("tie_word_embeddings")?
        .or(f.opt_bool("tie_word_embeddings")?)
        .unwrap_or(false);
    let eos_token_ids = parse_eos(&f)?;
    if let Some(&bad) = eos_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(config_err(format!(
            "{prefix}eos_token_id {bad} is outside the vocabulary (vocab_size {vocab_size})"
        )));
    }
    let max_position_embeddings = match f.opt_usize("max_position_embeddings")? {
        Some(0) => {
            return Err(config_err(format!(
                "{prefix}max_position_embeddings = 0: must be positive"
            )))
        }
        Some(n) => n,
        None => 262_144,
    };
    let extras = qwen4::parse(&f, family, &layers, &attention, &rope, &eos_token_ids)?;
    let vision = match family {
        Family::Qwen35Dense | Family::Qwen35Moe => vision::parse(&top_fields, hidden_size)?,
        _ => None,
    };

    Ok(ModelConfig {
        family,
        vocab_size,
        hidden_size,
        rms_norm_eps,
        layers,
        attention,
        gdn,
        rope,
        intermediate_size,
        moe,
        tie_word_embeddings,
        eos_token_ids,
        max_position_embeddings,
        multimodal_wrapper,
        gdn_gate: extras.gdn_gate,
        hyper: extras.hyper,
        ple: extras.ple,
        qsa: extras.qsa,
        fp8,
        vision,
    })
}

fn parse_attention(f: &Fields) -> Result<AttentionConfig> {
    let p = f.prefix;
    let hidden = f.positive("hidden_size")?;
    let num_heads = f.positive("num_attention_heads")?;
    let num_kv_heads = f.positive("num_key_value_heads")?;
    let head_dim = match f.opt_usize("head_dim")? {
        Some(d) => d,
        None => hidden / num_heads,
    };
    if head_dim == 0 {
        return Err(f.err(format!("{p}head_dim = 0: must be positive")));
    }
    if num_heads % num_kv_heads != 0 {
        return Err(f.err(format!(
            "{p}num_attention_heads {num_heads} is not a multiple of {p}num_key_value_heads {num_kv_heads}: \
             grouped-query attention needs whole groups"
        )));
    }
    Ok(AttentionConfig {
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

fn parse_gdn(f: &Fields) -> Result<GdnConfig> {
    let p = f.prefix;
    let gdn = GdnConfig {
        num_key_heads: f.positive("linear_num_key_heads")?,
        num_value_heads: f.positive("linear_num_value_heads")?,
        key_head_dim: f.positive("linear_key_head_dim")?,
        value_head_dim: f.positive("linear_value_head_dim")?,
        conv_kernel: f.opt_usize("linear_conv_kernel_dim")?.unwrap_or(4),
    };
    if gdn.num_value_heads % gdn.num_key_heads != 0 {
        return Err(f.err(format!(
            "{p}linear_num_value_heads {} is not a multiple of {p}linear_num_key_heads {}",
            gdn.num_value_heads, gdn.num_key_heads
        )));
    }
    if gdn.conv_kernel == 0 {
        return Err(f.err(format!("{p}linear_conv_kernel_dim = 0: must be positive")));
    }
    Ok(gdn)
}

fn parse_rope(f: &Fields, head_dim: usize) -> Result<RopeConfig> {
    let p = f.prefix;
    let empty = Map::new();
    let params = match f.get("rope_parameters").or_else(|| f.get("rope_scaling")) {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(f.err(format!("{p}rope_parameters = {other}: expected an object")))
        }
        None => &empty,
    };
    let rp = Fields {
        obj: params,
        prefix: "rope_parameters.",
        path: f.path,
    };
    let rope_type = rp
        .opt_str("rope_type")?
        .or(rp.opt_str("type")?)
        .unwrap_or("default");
    if rope_type != "default" {
        return Err(f.err(format!(
            "{p}rope_parameters.rope_type = {rope_type:?}: only \"default\" rope is supported"
        )));
    }
    // A value given both inside rope_parameters and beside it must agree.
    let inner_or_outer = |key: &str| -> Result<Option<f64>> {
        match (rp.opt_f64(key)?, f.opt_f64(key)?) {
            (Some(inner), Some(outer)) if inner != outer => Err(f.err(format!(
                "{p}rope_parameters.{key} = {inner} but {p}{key} = {outer}: they must agree"
            ))),
            (inner, outer) => Ok(inner.or(outer)),
        }
    };
    let theta = inner_or_outer("rope_theta")?
        .ok_or_else(|| f.err(format!("{p}rope_parameters.rope_theta is missing")))?;
    if !(theta > 1.0) {
        return Err(f.err(format!(
            "{p}rope_parameters.rope_theta = {theta}: must be > 1"
        )));
    }
    let factor = inner_or_outer("partial_rotary_factor")?.unwrap_or(0.25);
    let rotary = head_dim as f64 * factor;
    let rotary_dim = rotary.round() as usize;
    if !(factor > 0.0 && factor <= 1.0)
        || (rotary - rotary_dim as f64).abs() > 1e-9
        || rotary_dim % 2 != 0
        || rotary_dim == 0
    {
        return Err(f.err(format!(
            "{p}head_dim {head_dim} with partial_rotary_factor {factor} gives {rotary} rotary dims: \
             must be a positive even integer no larger than head_dim"
        )));
    }
    let mrope_section = rp.opt_usize_list("mrope_section")?;
    if let Some(section) = &mrope_section {
        // Checked: huge entries must not wrap around to the right sum.
        let sum = section.iter().try_fold(0usize, |a, &b| a.checked_add(b));
        if section.len() != 3 || sum != Some(rotary_dim / 2) {
            return Err(f.err(format!(
                "{p}rope_parameters.mrope_section {section:?} must have 3 entries summing to \
                 rotary_dim/2 = {} (head_dim {head_dim} × partial_rotary_factor {factor} / 2)",
                rotary_dim / 2
            )));
        }
    }
    Ok(RopeConfig {
        theta,
        partial_rotary_factor: factor,
        rotary_dim,
        mrope_section,
        mrope_interleaved: rp.opt_bool("mrope_interleaved")?.unwrap_or(false),
    })
}

fn parse_layer_types(f: &Fields, family: Family, num_layers: usize) -> Result<Vec<MixerKind>> {
    let p = f.prefix;
    if let Some(v) = f.get("layer_types") {
        let list = v
            .as_array()
            .ok_or_else(|| f.err(format!("{p}layer_types = {v}: expected a list of strings")))?;
        if list.len() != num_layers {
            return Err(f.err(format!(
                "{p}layer_types has {} entries but {p}num_hidden_layers is {num_layers}",
                list.len()
            )));
        }
        return list
            .iter()
            .enumerate()
            .map(|(i, t)| match (t.as_str(), family) {
                (Some("linear_attention"), _) => Ok(MixerKind::LinearAttention),
                (Some("full_attention"), _) => Ok(MixerKind::FullAttention),
                // Names the sparse-attention layer has had across qwen4_exp versions (§4.1).
                (Some("qwen_sparse_attention" | "deepseek_sparse_attention" | "hybrid_indexed"), Family::Qwen4Exp) => {
                    Ok(MixerKind::FullAttention)
                }
                _ => Err(f.err(format!(
                    "{p}layer_types[{i}] = {t}: unknown layer type for {} (expected \"linear_attention\" or \"full_attention\")",
                    family.model_type()
                ))),
            })
            .collect();
    }
    let interval = f.opt_usize("full_attention_interval")?.unwrap_or(4);
    if interval == 0 {
        return Err(f.err(format!("{p}full_attention_interval = 0: must be positive")));
    }
    Ok((0..num_layers)
        .map(|i| {
            if (i + 1) % interval == 0 {
                MixerKind::FullAttention
            } else {
                MixerKind::LinearAttention
            }
        })
        .collect())
}

type FfnParse = (Vec<LayerSpec>, Option<usize>, Option<MoeConfig>);

fn parse_ffn(f: &Fields, family: Family, mixers: &[MixerKind]) -> Result<FfnParse> {
    let p = f.prefix;
    let num_experts = f.opt_usize("num_experts")?.unwrap_or(0);
    let moe = match family {
        Family::Qwen35Dense => None,
        Family::Qwen3Next | Family::Qwen35Moe | Family::Qwen4Exp if num_experts == 0 => {
            return Err(f.err(format!(
                "{p}num_experts is missing or 0: the {} family needs experts",
                family.model_type()
            )))
        }
        Family::Qwen3Next | Family::Qwen35Moe | Family::Qwen4Exp => {
            let top_k = f.opt_usize("num_experts_per_tok")?.unwrap_or(0);
            if top_k == 0 || top_k > num_experts {
                return Err(f.err(format!(
                    "{p}num_experts {num_experts} but {p}num_experts_per_tok {top_k}: \
                     a MoE layer needs 1 <= num_experts_per_tok <= num_experts"
                )));
            }
            let renormalize = match family {
                // Qwen3_5MoeTopKRouter always renormalises (MODEL_MATH §3).
                Family::Qwen35Moe => true,
                _ => f.opt_bool("norm_topk_prob")?.unwrap_or(true),
            };
            Some(MoeConfig {
                num_experts,
                top_k,
                expert_intermediate: f.positive("moe_intermediate_size")?,
                shared_intermediate: f.positive("shared_expert_intermediate_size")?,
                renormalize,
            })
        }
    };

    let mlp_only = f.opt_usize_list("mlp_only_layers")?.unwrap_or_default();
    let sparse_step = f.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if family == Family::Qwen3Next && sparse_step == 0 {
        return Err(f.err(format!("{p}decoder_sparse_step = 0: must be positive")));
    }
    let layers: Vec<LayerSpec> = mixers
        .iter()
        .enumerate()
        .map(|(i, &mixer)| {
            let ffn = match family {
                Family::Qwen35Dense => FfnKind::Dense,
                Family::Qwen35Moe | Family::Qwen4Exp => FfnKind::Moe,
                Family::Qwen3Next if !mlp_only.contains(&i) && (i + 1) % sparse_step == 0 => {
                    FfnKind::Moe
                }
                Family::Qwen3Next => FfnKind::Dense,
            };
            LayerSpec { mixer, ffn }
        })
        .collect();

    let intermediate_size = if layers.iter().any(|l| l.ffn == FfnKind::Dense) {
        Some(f.positive("intermediate_size")?)
    } else {
        f.opt_usize("intermediate_size")?
    };
    Ok((layers, intermediate_size, moe))
}

fn parse_eos(f: &Fields) -> Result<Vec<u32>> {
    let p = f.prefix;
    match f.get("eos_token_id") {
        None => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| f.err(format!("{p}eos_token_id entry {v}: expected a token id")))
            })
            .collect(),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(|n| vec![n])
            .ok_or_else(|| {
                f.err(format!(
                    "{p}eos_token_id = {v}: expected a token id or a list of them"
                ))
            }),
    }
}

/// A path for messages when a config comes from memory.
pub fn in_memory_path() -> PathBuf {
    PathBuf::from("<config.json>")
}
