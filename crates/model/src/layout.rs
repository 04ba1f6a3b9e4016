//! The tensors a checkpoint of a given config holds: names (text-only `model.` prefix, per-key
//! or fused experts), shapes and the class each belongs to. One list serves the synthetic
//! checkpoint writer, parameter counts and the memory plan.

use crate::config::{FfnKind, MixerKind, ModelConfig};

/// What a tensor is for: the unit of parameter counts and memory plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    Embedding,
    LmHead,
    /// Layer norms and the final norm.
    Norm,
    /// Full-attention projections, q/k norms and the QSA indexer.
    Attention,
    /// Gated DeltaNet projections, conv, decay parameters and output norm.
    Gdn,
    DenseMlp,
    Router,
    SharedExpert,
    /// The routed experts: the bytes that can be streamed from disk.
    RoutedExperts,
    /// qwen4_exp hyper-connection blocks.
    HyperConnection,
    /// qwen4_exp PLE projections, norms and conv.
    Ple,
    /// qwen4_exp hashed n-gram table (read a few rows per token).
    NgramTable,
}

impl TensorClass {
    pub fn name(self) -> &'static str {
        match self {
            TensorClass::Embedding => "embedding",
            TensorClass::LmHead => "lm_head",
            TensorClass::Norm => "norms",
            TensorClass::Attention => "attention",
            TensorClass::Gdn => "gdn",
            TensorClass::DenseMlp => "dense_mlp",
            TensorClass::Router => "router",
            TensorClass::SharedExpert => "shared_expert",
            TensorClass::RoutedExperts => "routed_experts",
            TensorClass::HyperConnection => "hyper_connections",
            TensorClass::Ple => "ple",
            TensorClass::NgramTable => "ngram_table",
        }
    }
}

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

/// Every tensor a text-only checkpoint of `config` holds (prefix `model.`), in a stable order.
pub fn checkpoint_tensors(config: &ModelConfig, experts: ExpertKeys) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let h = config.hidden_size;
    let v = config.vocab_size;
    let streams = config.hyper.as_ref().map_or(1, |hc| hc.streams);
    let mut push = |name: String, shape: Vec<usize>, class: TensorClass, layer: Option<usize>| {
        out.push(TensorSpec {
            name,
            shape,
            class,
            dtype: SpecDtype::Bf16,
            layer,
        })
    };
    push(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        TensorClass::Embedding,
        None,
    );

    for (i, spec) in config.layers.iter().enumerate() {
        let l = |s: &str| format!("model.layers.{i}.{s}");
        let at = Some(i);
        match &config.hyper {
            Some(hc) => {
                for block in ["attn_hyper_connection", "mlp_hyper_connection"] {
                    hyper_tensors(&mut push, &l(block), hc.streams, hc.lowrank, h, true, at);
                }
            }
            None => {
                push(l("input_layernorm.weight"), vec![h], TensorClass::Norm, at);
                push(
                    l("post_attention_layernorm.weight"),
                    vec![h],
                    TensorClass::Norm,
                    at,
                );
            }
        }
        match spec.mixer {
            MixerKind::FullAttention => {
                let a = &config.attention;
                let c = TensorClass::Attention;
                push(
                    l("self_attn.q_proj.weight"),
                    vec![2 * a.num_heads * a.head_dim, h],
                    c,
                    at,
                );
                push(
                    l("self_attn.k_proj.weight"),
                    vec![a.num_kv_heads * a.head_dim, h],
                    c,
                    at,
                );
                push(
                    l("self_attn.v_proj.weight"),
                    vec![a.num_kv_heads * a.head_dim, h],
                    c,
                    at,
                );
                push(
                    l("self_attn.o_proj.weight"),
                    vec![h, a.num_heads * a.head_dim],
                    c,
                    at,
                );
                push(l("self_attn.q_norm.weight"), vec![a.head_dim], c, at);
                push(l("self_attn.k_norm.weight"), vec![a.head_dim], c, at);
                if let Some(q) = &config.qsa {
                    push(
                        l("self_attn.indexer.index_qk_proj.weight"),
                        vec![(q.n_heads + 1) * q.head_dim, h],
                        c,
                        at,
                    );
                    push(
                        l("self_attn.indexer.q_layernorm.weight"),
                        vec![q.head_dim],
                        c,
                        at,
                    );
                    push(
                        l("self_attn.indexer.k_layernorm.weight"),
                        vec![q.head_dim],
                        c,
                        at,
                    );
                }
            }
            MixerKind::LinearAttention => {
                let g = &config.gdn;
                let c = TensorClass::Gdn;
                let (nk, nv, dk, dv) = g.dims();
                if config.family == crate::Family::Qwen3Next {
                    push(
                        l("linear_attn.in_proj_qkvz.weight"),
                        vec![2 * nk * dk + 2 * nv * dv, h],
                        c,
                        at,
                    );
                    push(l("linear_attn.in_proj_ba.weight"), vec![2 * nv, h], c, at);
                } else {
                    push(
                        l("linear_attn.in_proj_qkv.weight"),
                        vec![g.conv_channels(), h],
                        c,
                        at,
                    );
                    push(l("linear_attn.in_proj_z.weight"), vec![nv * dv, h], c, at);
                    push(l("linear_attn.in_proj_b.weight"), vec![nv, h], c, at);
                    push(l("linear_attn.in_proj_a.weight"), vec![nv, h], c, at);
                }
                push(
                    l("linear_attn.conv1d.weight"),
                    vec![g.conv_channels(), 1, g.conv_kernel],
                    c,
                    at,
                );
                push(l("linear_attn.A_log"), vec![nv], c, at);
                push(l("linear_attn.dt_bias"), vec![nv], c, at);
                push(l("linear_attn.norm.weight"), vec![dv], c, at);
                push(l("linear_attn.out_proj.weight"), vec![h, nv * dv], c, at);
            }
        }
        if let Some(ple) = config.ple.as_ref().filter(|p| p.layers.contains(&i)) {
            let width = streams * h;
            let c = TensorClass::Ple;
            push(l("ple.key_proj.weight"), vec![width, ple.embed_dim], c, at);
            push(l("ple.value_proj.weight"), vec![h, ple.embed_dim], c, at);
            for n in ["norm_key", "norm_query", "norm_conv"] {
                push(l(&format!("ple.{n}.weight")), vec![width], c, at);
            }
            push(
                l("ple.conv1d.weight"),
                vec![width, 1, ple.conv_kernel],
                c,
                at,
            );
        }
        match spec.ffn {
            FfnKind::Dense => {
                let inter = config.intermediate_size.unwrap_or(0);
                let c = TensorClass::DenseMlp;
                push(l("mlp.gate_proj.weight"), vec![inter, h], c, at);
                push(l("mlp.up_proj.weight"), vec![inter, h], c, at);
                push(l("mlp.down_proj.weight"), vec![h, inter], c, at);
            }
            FfnKind::Moe => {
                let moe = config
                    .moe
                    .as_ref()
                    .expect("validated: MoE layers have a MoE config");
                let (e, inter, shared) = (
                    moe.num_experts,
                    moe.expert_intermediate,
                    moe.shared_intermediate,
                );
                push(l("mlp.gate.weight"), vec![e, h], TensorClass::Router, at);
                let c = TensorClass::RoutedExperts;
                match experts {
                    ExpertKeys::Fused => {
                        push(l("mlp.experts.gate_up_proj"), vec![e, 2 * inter, h], c, at);
                        push(l("mlp.experts.down_proj"), vec![e, h, inter], c, at);
                    }
                    ExpertKeys::PerExpert => {
                        for x in 0..e {
                            push(
                                l(&format!("mlp.experts.{x}.gate_proj.weight")),
                                vec![inter, h],
                                c,
                                at,
                            );
                            push(
                                l(&format!("mlp.experts.{x}.up_proj.weight")),
                                vec![inter, h],
                                c,
                                at,
                            );
                            push(
                                l(&format!("mlp.experts.{x}.down_proj.weight")),
                                vec![h, inter],
                                c,
                                at,
                            );
                        }
                    }
                }
                let c = TensorClass::SharedExpert;
                push(
                    l("mlp.shared_expert.gate_proj.weight"),
                    vec![shared, h],
                    c,
                    at,
                );
                push(
                    l("mlp.shared_expert.up_proj.weight"),
                    vec![shared, h],
                    c,
                    at,
                );
                push(
                    l("mlp.shared_expert.down_proj.weight"),
                    vec![h, shared],
                    c,
                    at,
                );
                push(l("mlp.shared_expert_gate.weight"), vec![1, h], c, at);
            }
        }
    }

    match &config.hyper {
        Some(hc) => hyper_tensors(
            &mut push,
            "model.hyper_connection_mixer",
            hc.streams,
            hc.lowrank,
            h,
            false,
            None,
        ),
        None => push("model.norm.weight".into(), vec![h], TensorClass::Norm, None),
    }
    if !config.tie_word_embeddings {
        push(
            "lm_head.weight".into(),
            vec![v, h],
            TensorClass::LmHead,
            None,
        );
    }
    out.extend(ngram_tensors(config));
    out
}

fn hyper_tensors(
    push: &mut impl FnMut(String, Vec<usize>, TensorClass, Option<usize>),
    prefix: &str,
    streams: usize,
    lowrank: usize,
    h: usize,
    inject: bool,
    layer: Option<usize>,
) {
    let c = TensorClass::HyperConnection;
    let width = streams * h;
    push(format!("{prefix}.hc_norm.weight"), vec![width], c, layer);
    push(
        format!("{prefix}.input_mix_weight_down.weight"),
        vec![lowrank, width],
        c,
        layer,
    );
    push(
        format!("{prefix}.input_mix_weight_up.weight"),
        vec![width, lowrank],
        c,
        layer,
    );
    if inject {
        push(
            format!("{prefix}.block_inject_weight.weight"),
            vec![streams, width],
            c,
            layer,
        );
    }
}

/// The PLE n-gram table shards and their int64 hash buffers.
fn ngram_tensors(config: &ModelConfig) -> Vec<TensorSpec> {
    let Some(ple) = &config.ple else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (ordinal, &layer) in ple.layers.iter().enumerate() {
        let rows = ngram_table_rows(ple, ordinal) as usize;
        let prefix = format!("model.layers.{layer}.ple.ple_embedding");
        let shard_rows = rows / ple.split_parts;
        for k in 0..ple.split_parts {
            out.push(TensorSpec {
                name: format!("{prefix}.ngram_embedding.shard_{k}.weight"),
                shape: vec![shard_rows, ple.head_dim()],
                class: TensorClass::NgramTable,
                dtype: SpecDtype::Bf16,
                layer: Some(layer),
            });
        }
        for (name, len) in [
            ("layer_multipliers", ple.ngram_size),
            ("ngram_heads_vocab_sizes", ple.heads()),
            ("ngram_heads_offsets", ple.heads()),
        ] {
            out.push(TensorSpec {
                name: format!("{prefix}.{name}"),
                shape: vec![len],
                class: TensorClass::NgramTable,
                dtype: SpecDtype::I64,
                layer: Some(layer),
            });
        }
    }
    out
}

/// Rows of the n-gram table of PLE ordinal `p`: the sum of its heads' prime sizes, padded.
pub fn ngram_table_rows(ple: &crate::PleConfig, ordinal: usize) -> u64 {
    let sizes = crate::ngram::head_vocab_sizes(ple.vocab_size_base, ordinal, ple.heads());
    let total: u64 = sizes.iter().sum();
    total.div_ceil(ple.vocab_divisible_by) * ple.vocab_divisible_by
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
