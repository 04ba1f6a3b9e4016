//! The qwen4_exp (Qwen3.8-Flash-Next) fields: hyper-connections, PLE n-gram embeddings, QSA
//! indexer and the GDN output gate (MODEL_MATH §4.1), validated as transformers validates them.

use super::{AttentionConfig, Family, Fields, LayerSpec, MixerKind, RopeConfig};
use crate::error::Result;

/// Activation of the gate in the GDN output norm (MODEL_MATH §1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnGate {
    Silu,
    Sigmoid,
}

/// The hyper-connection residual (MODEL_MATH §4.3).
#[derive(Clone, Debug, PartialEq)]
pub struct HyperConfig {
    /// n: number of residual streams.
    pub streams: usize,
    /// Width of the low-rank input mix.
    pub lowrank: usize,
}

/// Hashed n-gram PLE embeddings (MODEL_MATH §4.5, §4.6).
#[derive(Clone, Debug, PartialEq)]
pub struct PleConfig {
    /// 0-based indices of the layers with a PLE block (config lists them 1-based).
    pub layers: Vec<usize>,
    pub embed_dim: usize,
    pub conv_kernel: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub vocab_size_base: u64,
    pub vocab_divisible_by: u64,
    pub seed: u64,
    pub split_parts: usize,
    /// The token that resets the n-gram history.
    pub eos: u32,
}

impl PleConfig {
    /// (ngram_size − 1) · heads_per_ngram hash heads per PLE layer.
    pub fn heads(&self) -> usize {
        (self.ngram_size - 1) * self.heads_per_ngram
    }

    /// Embedding width of one hash head.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.heads()
    }

    /// Ordinal of `layer` among the PLE layers (p of §4.6), if it has one.
    pub fn ordinal(&self, layer: usize) -> Option<usize> {
        self.layers.iter().position(|&l| l == layer)
    }
}

/// The QSA indexer (MODEL_MATH §4.4).
#[derive(Clone, Debug, PartialEq)]
pub struct QsaConfig {
    pub n_heads: usize,
    pub head_dim: usize,
    /// Tokens attended at most (B).
    pub budget: usize,
    /// Tokens per pooled block (cr).
    pub compress_ratio: usize,
}

impl QsaConfig {
    /// Blocks selected at most: B / cr.
    pub fn max_blocks(&self) -> usize {
        self.budget / self.compress_ratio
    }
}

pub(super) struct Qwen4Extras {
    pub gdn_gate: GdnGate,
    pub hyper: Option<HyperConfig>,
    pub ple: Option<PleConfig>,
    pub qsa: Option<QsaConfig>,
}

pub(super) fn parse(
    f: &Fields,
    family: Family,
    layers: &[LayerSpec],
    attention: &AttentionConfig,
    rope: &RopeConfig,
    eos: &[u32],
) -> Result<Qwen4Extras> {
    let p = f.prefix;
    if family != Family::Qwen4Exp {
        return Ok(Qwen4Extras {
            gdn_gate: GdnGate::Silu,
            hyper: None,
            ple: None,
            qsa: None,
        });
    }
    let gdn_gate = match f.opt_str("output_gate_type")?.unwrap_or("silu") {
        "silu" => GdnGate::Silu,
        "sigmoid" => GdnGate::Sigmoid,
        other => {
            return Err(f.err(format!(
                "{p}output_gate_type = {other:?}: must be \"sigmoid\" or \"silu\""
            )))
        }
    };
    let hyper = HyperConfig {
        streams: f.opt_usize("hc_count")?.unwrap_or(4),
        lowrank: f.opt_usize("hc_lowrank")?.unwrap_or(320),
    };
    if hyper.streams == 0 || hyper.lowrank == 0 {
        return Err(f.err(format!(
            "{p}hc_count {} and {p}hc_lowrank {} must both be positive",
            hyper.streams, hyper.lowrank
        )));
    }
    let qsa = parse_qsa(f, attention, rope)?;
    let ple = parse_ple(f, layers, eos)?;
    Ok(Qwen4Extras {
        gdn_gate,
        hyper: Some(hyper),
        ple,
        qsa: Some(qsa),
    })
}

fn parse_qsa(f: &Fields, attention: &AttentionConfig, rope: &RopeConfig) -> Result<QsaConfig> {
    let p = f.prefix;
    // The attention class always builds the indexer, so its fields are required (§4.1).
    let kv_heads = f.usize("indexer_kv_heads")?;
    if kv_heads != 1 {
        return Err(f.err(format!(
            "{p}indexer_kv_heads = {kv_heads}: the QSA indexer needs exactly 1"
        )));
    }
    let qsa = QsaConfig {
        n_heads: f.positive("indexer_n_heads")?,
        head_dim: f.positive("indexer_head_dim")?,
        budget: f.positive("indexer_budget")?,
        compress_ratio: f.positive("indexer_compress_ratio")?,
    };
    if qsa.budget % qsa.compress_ratio != 0 {
        return Err(f.err(format!(
            "{p}indexer_budget {} is not divisible by {p}indexer_compress_ratio {}",
            qsa.budget, qsa.compress_ratio
        )));
    }
    if qsa.head_dim < rope.rotary_dim {
        return Err(f.err(format!(
            "{p}indexer_head_dim {} is smaller than the {} rotary dims of the attention \
             (head_dim {} × partial_rotary_factor {})",
            qsa.head_dim, rope.rotary_dim, attention.head_dim, rope.partial_rotary_factor
        )));
    }
    Ok(qsa)
}

fn parse_ple(f: &Fields, layers: &[LayerSpec], eos: &[u32]) -> Result<Option<PleConfig>> {
    let p = f.prefix;
    let ids = f.opt_usize_list("ple_layer_ids")?.unwrap_or_default();
    if ids.is_empty() {
        return Ok(None);
    }
    let mut zero_based = Vec::with_capacity(ids.len());
    for &id in &ids {
        if id == 0 || id > layers.len() {
            return Err(f.err(format!(
                "{p}ple_layer_ids {ids:?}: entries are 1-indexed layer numbers in 1..={}",
                layers.len()
            )));
        }
        if layers[id - 1].mixer != MixerKind::LinearAttention {
            return Err(f.err(format!(
                "{p}ple_layer_ids {ids:?}: layer {id} (1-indexed) is an attention layer; PLE is only allowed on linear_attention layers"
            )));
        }
        if zero_based.contains(&(id - 1)) {
            return Err(f.err(format!(
                "{p}ple_layer_ids {ids:?}: layer {id} is listed twice"
            )));
        }
        zero_based.push(id - 1);
    }
    let eos = *eos.first().ok_or_else(|| {
        f.err(format!(
            "{p}eos_token_id is missing: the PLE n-gram history resets at EOS, so it is required with ple_layer_ids"
        ))
    })?;
    let hidden = f.positive("hidden_size")?;
    let ple = PleConfig {
        layers: zero_based,
        embed_dim: f.opt_usize("ple_embed_dim")?.unwrap_or(hidden),
        conv_kernel: f.opt_usize("ple_conv_kernel_size")?.unwrap_or(4),
        ngram_size: f.opt_usize("ngram_size")?.unwrap_or(3),
        heads_per_ngram: f.opt_usize("heads_per_ngram")?.unwrap_or(8),
        vocab_size_base: f.opt_usize("ngram_vocab_size_base")?.unwrap_or(20_000_000) as u64,
        vocab_divisible_by: f
            .opt_usize("make_ngram_vocab_size_divisible_by")?
            .unwrap_or(128) as u64,
        seed: f.opt_usize("seed")?.unwrap_or(1234) as u64,
        split_parts: f.opt_usize("split_ngram_parts")?.unwrap_or(512),
        eos,
    };
    if ple.ngram_size < 2 || ple.heads_per_ngram == 0 {
        return Err(f.err(format!(
            "{p}ngram_size {} and {p}heads_per_ngram {}: need ngram_size >= 2 and at least one head",
            ple.ngram_size, ple.heads_per_ngram
        )));
    }
    if ple.embed_dim == 0 || ple.embed_dim % ple.heads() != 0 {
        return Err(f.err(format!(
            "{p}ple_embed_dim {} is not divisible by the {} n-gram heads ((ngram_size − 1) × heads_per_ngram)",
            ple.embed_dim,
            ple.heads()
        )));
    }
    if ple.conv_kernel == 0
        || ple.split_parts == 0
        || ple.vocab_divisible_by == 0
        || ple.vocab_size_base < 2
    {
        return Err(f.err(format!(
            "{p}ple_conv_kernel_size {}, split_ngram_parts {}, make_ngram_vocab_size_divisible_by {} \
             and ngram_vocab_size_base {} must be positive (base at least 2)",
            ple.conv_kernel, ple.split_parts, ple.vocab_divisible_by, ple.vocab_size_base
        )));
    }
    Ok(Some(ple))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::Value;

    use crate::config::{Family, MixerKind, ModelConfig};

    use spindle_testkit::fixtures;

    fn fixture_config() -> Value {
        let path = fixtures().join("qwen4_exp/config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Parses the fixture config after `edit` changes its text_config; returns the error text.
    fn refused(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
        let mut v = fixture_config();
        edit(v["text_config"].as_object_mut().unwrap());
        match ModelConfig::from_json_str(&v.to_string(), Path::new("config.json")) {
            Ok(_) => panic!("config was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn released_flash_next_config_parses() {
        let c = ModelConfig::from_file(&fixtures().join("configs/qwen3_8_flash_next.config.json"))
            .unwrap();
        assert_eq!(c.family, Family::Qwen4Exp);
        assert_eq!(c.num_layers(), 48);
        assert!(c
            .layers
            .iter()
            .enumerate()
            .all(|(i, l)| (l.mixer == MixerKind::FullAttention) == ((i + 1) % 4 == 0)));
        assert_eq!(
            c.hyper.as_ref().map(|h| (h.streams, h.lowrank)),
            Some((4, 320))
        );
        let ple = c.ple.as_ref().unwrap();
        assert_eq!(
            (ple.layers.clone(), ple.heads(), ple.head_dim(), ple.seed),
            (vec![1], 16, 160, 1234)
        );
        assert_eq!((ple.split_parts, ple.eos), (128, 248044));
        let qsa = c.qsa.as_ref().unwrap();
        assert_eq!(
            (qsa.n_heads, qsa.head_dim, qsa.budget, qsa.compress_ratio),
            (4, 128, 2048, 4)
        );
        assert_eq!(c.gdn_gate, super::GdnGate::Sigmoid);
        assert_eq!(
            c.moe
                .as_ref()
                .map(|m| (m.num_experts, m.top_k, m.renormalize)),
            Some((512, 10, true))
        );
    }

    #[test]
    fn fixture_config_parses_with_sparse_attention_layer_name() {
        let v = fixture_config();
        let c = ModelConfig::from_json_str(&v.to_string(), Path::new("config.json")).unwrap();
        assert_eq!(c.layers[3].mixer, MixerKind::FullAttention);
        assert_eq!(c.ple.as_ref().unwrap().layers, vec![1]);
    }

    #[test]
    fn indexer_kv_heads_must_be_one() {
        let msg = refused(|t| {
            t.insert("indexer_kv_heads".into(), 2.into());
        });
        assert!(msg.contains("indexer_kv_heads = 2"), "{msg}");
    }

    #[test]
    fn budget_must_divide_by_compress_ratio() {
        let msg = refused(|t| {
            t.insert("indexer_budget".into(), 10.into());
        });
        assert!(
            msg.contains("indexer_budget 10") && msg.contains("indexer_compress_ratio 4"),
            "{msg}"
        );
    }

    #[test]
    fn missing_indexer_field_is_named() {
        let msg = refused(|t| {
            t.remove("indexer_head_dim");
        });
        assert!(msg.contains("indexer_head_dim is missing"), "{msg}");
    }

    #[test]
    fn ple_only_on_linear_layers() {
        let msg = refused(|t| {
            t.insert("ple_layer_ids".into(), serde_json::json!([4]));
        });
        assert!(
            msg.contains("PLE is only allowed on linear_attention layers"),
            "{msg}"
        );
        let msg = refused(|t| {
            t.insert("ple_layer_ids".into(), serde_json::json!([0]));
        });
        assert!(msg.contains("1-indexed"), "{msg}");
    }

    #[test]
    fn eos_required_with_ple() {
        let msg = refused(|t| {
            t.remove("eos_token_id");
        });
        assert!(msg.contains("eos_token_id is missing"), "{msg}");
    }

    #[test]
    fn gate_type_and_ple_width_are_checked() {
        let msg = refused(|t| {
            t.insert("output_gate_type".into(), "tanh".into());
        });
        assert!(msg.contains("output_gate_type = \"tanh\""), "{msg}");
        let msg = refused(|t| {
            t.insert("ple_embed_dim".into(), 66.into());
        });
        assert!(msg.contains("ple_embed_dim 66"), "{msg}");
        let msg = refused(|t| {
            t.insert("hc_count".into(), 0.into());
        });
        assert!(msg.contains("hc_count 0"), "{msg}");
    }

    #[test]
    fn unknown_layer_name_is_refused() {
        let msg = refused(|t| {
            t.insert(
                "layer_types".into(),
                serde_json::json!([
                    "linear_attention",
                    "linear_attention",
                    "linear_attention",
                    "sliding_attention"
                ]),
            );
        });
        assert!(
            msg.contains("layer_types[3]") && msg.contains("sliding_attention"),
            "{msg}"
        );
    }
}
