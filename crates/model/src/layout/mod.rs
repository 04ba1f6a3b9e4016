//! The tensors a checkpoint of a given config holds: names (text-only `model.` prefix, per-key
//! or fused experts), shapes and the class each belongs to. One list serves the synthetic
//! checkpoint writer, parameter counts and the memory plan; it is drawn from the weight schema
//! ([`TensorDef`] and the `*Schema` types) the loader reads by, so a tensor's key and shape are stated once.

mod schema;
mod schema_qwen4;
mod tensor_def;

pub use schema::{
    AttentionSchema, GdnSchema, IndexerSchema, MlpSchema, MoeSchema, NormsSchema, TrunkSchema,
};
pub use schema_qwen4::{ngram_table_rows, HyperSchema, PleSchema};
pub use tensor_def::{TensorClass, TensorDef};

use crate::config::{FfnKind, MixerKind, ModelConfig, VisionConfig};

/// Element type of a tensor in a written checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecDtype {
    Bf16,
    F32,
    I64,
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub class: TensorClass,
    pub dtype: SpecDtype,
    /// The layer this tensor belongs to, if any.
    pub layer: Option<usize>,
    /// Re-encoded when q8/q4 is asked for (see [`TensorDef::quantizable`]).
    pub quantizable: bool,
}

impl TensorSpec {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Options for how the experts are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertKeys {
    PerExpert,
    Fused,
}

/// The key prefix of the vision tower's tensors.
pub const VISION_PREFIX: &str = "model.visual.";

/// Every tensor of the vision tower `v` describes (`model.visual.*`, shared docs `VISION.md`
/// §1.4), bf16 as released; none is quantizable.
pub fn vision_tensors(v: &VisionConfig) -> Vec<TensorSpec> {
    let (d, i) = (v.hidden, v.intermediate);
    let wide = d * v.merge * v.merge;
    let mut out = Vec::new();
    let mut push = |key: String, shape: Vec<usize>| {
        out.push(TensorSpec {
            name: format!("{}{key}", VISION_PREFIX),
            shape,
            class: TensorClass::Vision,
            dtype: SpecDtype::Bf16,
            layer: None,
            quantizable: false,
        })
    };
    fn linear(push: &mut dyn FnMut(String, Vec<usize>), key: &str, rows: usize, cols: usize) {
        push(format!("{key}.weight"), vec![rows, cols]);
        push(format!("{key}.bias"), vec![rows]);
    }
    let conv = vec![d, v.in_channels, v.temporal, v.patch, v.patch];
    push("patch_embed.proj.weight".into(), conv);
    push("patch_embed.proj.bias".into(), vec![d]);
    push("pos_embed.weight".into(), vec![v.pos_side * v.pos_side, d]);
    for b in 0..v.depth {
        let at = |s: &str| format!("blocks.{b}.{s}");
        for norm in ["norm1", "norm2"] {
            push(at(&format!("{norm}.weight")), vec![d]);
            push(at(&format!("{norm}.bias")), vec![d]);
        }
        linear(&mut push, &at("attn.qkv"), 3 * d, d);
        linear(&mut push, &at("attn.proj"), d, d);
        linear(&mut push, &at("mlp.linear_fc1"), i, d);
        linear(&mut push, &at("mlp.linear_fc2"), d, i);
    }
    push("merger.norm.weight".into(), vec![d]);
    push("merger.norm.bias".into(), vec![d]);
    linear(&mut push, "merger.linear_fc1", wide, wide);
    linear(&mut push, "merger.linear_fc2", v.out_hidden, wide);
    out
}

/// Every tensor a text-only checkpoint of `config` holds (prefix `model.`), in a stable order.
pub fn checkpoint_tensors(config: &ModelConfig, experts: ExpertKeys) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let h = config.hidden_size;
    let mut push = |prefix: &str, d: &TensorDef, dtype: SpecDtype, layer: Option<usize>| {
        out.push(TensorSpec {
            name: format!("{prefix}{}", d.key),
            shape: d.shape.clone(),
            class: d.class,
            dtype,
            layer,
            quantizable: d.quantizable,
        })
    };
    let bf16 = SpecDtype::Bf16;
    let trunk = TrunkSchema::new(config);
    push("model.", &trunk.embed, bf16, None);

    for (i, spec) in config.layers.iter().enumerate() {
        let prefix = format!("model.layers.{i}.");
        let mut layer = |d: &TensorDef| push(&prefix, d, bf16, Some(i));
        match &config.hyper {
            Some(hc) => {
                for block in ["attn_hyper_connection", "mlp_hyper_connection"] {
                    HyperSchema::new(block, hc, h, true)
                        .tensors()
                        .into_iter()
                        .for_each(&mut layer);
                }
            }
            None => {
                let norms = NormsSchema::new(h);
                layer(&norms.input);
                layer(&norms.post);
            }
        }
        match spec.mixer {
            MixerKind::FullAttention => AttentionSchema::new(config)
                .tensors()
                .into_iter()
                .for_each(&mut layer),
            MixerKind::LinearAttention => GdnSchema::new(config)
                .tensors(config.family == crate::Family::Qwen3Next)
                .into_iter()
                .for_each(&mut layer),
        }
        if let Some(ple) = &config.ple {
            if let Some(ordinal) = ple.ordinal(i) {
                PleSchema::new(config, ple, ordinal)
                    .tensors()
                    .into_iter()
                    .for_each(&mut layer);
            }
        }
        match spec.ffn {
            FfnKind::Dense => {
                let inter = config.intermediate_size.unwrap_or(0);
                MlpSchema::dense(config, inter)
                    .tensors()
                    .into_iter()
                    .for_each(&mut layer);
            }
            FfnKind::Moe => {
                let moe = config
                    .moe
                    .as_ref()
                    .expect("validated: MoE layers have a MoE config");
                let s = MoeSchema::new(config, moe);
                layer(&s.router);
                match experts {
                    ExpertKeys::Fused => {
                        layer(&s.gate_up);
                        layer(&s.down);
                    }
                    ExpertKeys::PerExpert => {
                        for e in 0..moe.num_experts {
                            s.expert(e).tensors().into_iter().for_each(&mut layer);
                        }
                    }
                }
                s.shared.tensors().into_iter().for_each(&mut layer);
                layer(&s.shared_gate);
            }
        }
    }

    match &trunk.hyper_mixer {
        Some(mixer) => mixer
            .tensors()
            .into_iter()
            .for_each(|d| push("model.", d, bf16, None)),
        None => push("model.", &trunk.norm, bf16, None),
    }
    if !config.tie_word_embeddings {
        push("", &trunk.lm_head, bf16, None);
    }
    if let Some(ple) = &config.ple {
        for (ordinal, &layer) in ple.layers.iter().enumerate() {
            let prefix = format!("model.layers.{layer}.");
            let s = PleSchema::new(config, ple, ordinal);
            for k in 0..ple.split_parts {
                push(&prefix, &s.shard(k, ple.split_parts), bf16, Some(layer));
            }
            for d in s.buffers() {
                push(&prefix, d, SpecDtype::I64, Some(layer));
            }
        }
    }
    out
}

/// Parameter totals per class.
pub fn parameters_by_class(config: &ModelConfig) -> Vec<(TensorClass, u64)> {
    let mut totals: std::collections::BTreeMap<TensorClass, u64> = Default::default();
    for t in checkpoint_tensors(config, ExpertKeys::Fused) {
        *totals.entry(t.class).or_default() += t.elements() as u64;
    }
    totals.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> ModelConfig {
        let dir = spindle_testkit::fixtures();
        ModelConfig::from_file(&dir.join(name)).unwrap()
    }

    #[test]
    fn released_35b_a3b_has_35b_parameters() {
        let c = config("configs/qwen3_6_35b_a3b.config.json");
        let total: u64 = parameters_by_class(&c).iter().map(|(_, n)| n).sum();
        assert!((34.0e9..36.5e9).contains(&(total as f64)), "total {total}");
    }

    #[test]
    fn flash_next_table_matches_the_released_shard_shape() {
        let c = config("configs/qwen3_8_flash_next.config.json");
        let tensors = checkpoint_tensors(&c, ExpertKeys::Fused);
        let shard = tensors
            .iter()
            .find(|t| t.name.ends_with("shard_0.weight"))
            .unwrap();
        assert_eq!(shard.shape, vec![2_500_012, 160]);
        let table: u64 = parameters_by_class(&c)
            .iter()
            .filter(|(k, _)| *k == TensorClass::NgramTable)
            .map(|(_, n)| n)
            .sum();
        assert!((51.0e9..51.3e9).contains(&(table as f64)), "table {table}");
    }

    #[test]
    fn fixture_tensor_list_matches_the_fixture_checkpoint() {
        // Every tensor the layout names exists in the fixture with the same shape.
        let dir = spindle_testkit::fixtures();
        for (name, keys) in [
            ("qwen3_next_moe", ExpertKeys::PerExpert),
            ("qwen3_5_dense", ExpertKeys::PerExpert),
            ("qwen3_5_moe_fused", ExpertKeys::Fused),
            ("qwen4_exp", ExpertKeys::PerExpert),
        ] {
            let cfg = ModelConfig::from_dir(&dir.join(name)).unwrap();
            let ck = crate::Checkpoint::open(&dir.join(name)).unwrap();
            let prefix = if cfg.multimodal_wrapper {
                "model.language_model."
            } else {
                "model."
            };
            for t in checkpoint_tensors(&cfg, keys) {
                let stored = t.name.replacen("model.", prefix, 1);
                let stored = if t.name == "lm_head.weight" {
                    t.name.clone()
                } else {
                    stored
                };
                assert_eq!(
                    ck.shape(&stored),
                    Some(t.shape.as_slice()),
                    "{name}: {stored}"
                );
            }
        }
    }
}
