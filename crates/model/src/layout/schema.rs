//! The weight schema, written once: for the trunk and each part of a layer, the key, shape and
//! class of every tensor a checkpoint of a config holds. [`super::checkpoint_tensors`] lists
//! them (synth, parameter counts, the memory plan); the weight loader reads the tensors
//! by these keys and checks them against these shapes.

use crate::config::{ModelConfig, MoeConfig};
use crate::tensor::Matrix;

use super::schema_qwen4::HyperSchema;
use super::tensor_def::{def, proj, TensorClass, TensorDef};

/// The tensors outside the layers.
pub struct TrunkSchema {
    /// `embed_tokens.weight` `[V, H]`.
    pub embed: TensorDef,
    /// `norm.weight` `[H]`, the final norm (families without hyper-connections).
    pub norm: TensorDef,
    /// `lm_head.weight` `[V, H]`, at the top level (absent when tied to the embedding).
    pub lm_head: TensorDef,
    /// qwen4_exp: the final `hyper_connection_mixer` (no separate final norm).
    pub hyper_mixer: Option<HyperSchema>,
}

impl TrunkSchema {
    /// The schema for `config` (keys, shapes and classes derived from its dimensions).
    pub fn new(config: &ModelConfig) -> Self {
        let (v, h) = (config.vocab_size, config.hidden_size);
        TrunkSchema {
            embed: def("embed_tokens.weight", vec![v, h], TensorClass::Embedding),
            norm: def("norm.weight", vec![h], TensorClass::Norm),
            lm_head: proj("lm_head.weight", vec![v, h], TensorClass::LmHead),
            hyper_mixer: config
                .hyper
                .as_ref()
                .map(|hc| HyperSchema::new("hyper_connection_mixer", hc, h, false)),
        }
    }
}

/// A layer's input and post-attention norms (families without hyper-connections).
pub struct NormsSchema {
    pub input: TensorDef,
    pub post: TensorDef,
}

impl NormsSchema {
    /// The norms of a residual `hidden` wide.
    pub fn new(hidden: usize) -> Self {
        NormsSchema {
            input: def("input_layernorm.weight", vec![hidden], TensorClass::Norm),
            post: def(
                "post_attention_layernorm.weight",
                vec![hidden],
                TensorClass::Norm,
            ),
        }
    }
}

/// Gated full attention (MODEL_MATH §1.4), with qwen4_exp's QSA indexer (§4.4).
pub struct AttentionSchema {
    /// `[n_h·2d, H]`: per head, d query rows then d gate rows.
    pub q_proj: TensorDef,
    pub k_proj: TensorDef,
    pub v_proj: TensorDef,
    pub o_proj: TensorDef,
    pub q_norm: TensorDef,
    pub k_norm: TensorDef,
    pub indexer: Option<IndexerSchema>,
}

/// The QSA indexer of a full-attention layer.
pub struct IndexerSchema {
    /// `[(n_i + 1)·d_i, H]`.
    pub qk_proj: TensorDef,
    pub q_norm: TensorDef,
    pub k_norm: TensorDef,
}

impl AttentionSchema {
    /// The schema for `config` (keys, shapes and classes derived from its dimensions).
    pub fn new(config: &ModelConfig) -> Self {
        let a = &config.attention;
        let h = config.hidden_size;
        let c = TensorClass::Attention;
        let t = |s: &str| format!("self_attn.{s}");
        AttentionSchema {
            q_proj: proj(t("q_proj.weight"), vec![2 * a.num_heads * a.head_dim, h], c),
            k_proj: proj(t("k_proj.weight"), vec![a.num_kv_heads * a.head_dim, h], c),
            v_proj: proj(t("v_proj.weight"), vec![a.num_kv_heads * a.head_dim, h], c),
            o_proj: proj(t("o_proj.weight"), vec![h, a.num_heads * a.head_dim], c),
            q_norm: def(t("q_norm.weight"), vec![a.head_dim], c),
            k_norm: def(t("k_norm.weight"), vec![a.head_dim], c),
            indexer: config.qsa.as_ref().map(|q| IndexerSchema {
                qk_proj: def(
                    t("indexer.index_qk_proj.weight"),
                    vec![(q.n_heads + 1) * q.head_dim, h],
                    c,
                ),
                q_norm: def(t("indexer.q_layernorm.weight"), vec![q.head_dim], c),
                k_norm: def(t("indexer.k_layernorm.weight"), vec![q.head_dim], c),
            }),
        }
    }

    /// The layer's attention tensors in checkpoint order.
    pub fn tensors(&self) -> Vec<&TensorDef> {
        let mut out = vec![
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.q_norm,
            &self.k_norm,
        ];
        if let Some(i) = &self.indexer {
            out.extend([&i.qk_proj, &i.q_norm, &i.k_norm]);
        }
        out
    }
}

/// Gated DeltaNet (MODEL_MATH §1.5): both input-projection layouts, and the rest.
pub struct GdnSchema {
    /// Qwen3-Next: `in_proj_qkvz` `[2·n_k·d_k + 2·n_v·d_v, H]`, grouped per key head.
    pub qkvz: TensorDef,
    /// Qwen3-Next: `in_proj_ba` `[2·n_v, H]`.
    pub ba: TensorDef,
    /// Qwen3.5 and later: `in_proj_qkv` `[C, H]`, in channel order.
    pub qkv: TensorDef,
    pub z: TensorDef,
    pub b: TensorDef,
    pub a: TensorDef,
    /// `[C, 1, K]` depthwise conv taps.
    pub conv: TensorDef,
    pub a_log: TensorDef,
    pub dt_bias: TensorDef,
    /// Gated-norm weight `[d_v]`, shared by all heads.
    pub norm: TensorDef,
    pub out_proj: TensorDef,
}

impl GdnSchema {
    /// The schema for `config` (keys, shapes and classes derived from its dimensions).
    pub fn new(config: &ModelConfig) -> Self {
        let g = &config.gdn;
        let h = config.hidden_size;
        let c = TensorClass::Gdn;
        let t = |s: &str| format!("linear_attn.{s}");
        let (nk, nv, dk, dv) = g.dims();
        let channels = g.conv_channels();
        GdnSchema {
            qkvz: proj(
                t("in_proj_qkvz.weight"),
                vec![2 * nk * dk + 2 * nv * dv, h],
                c,
            ),
            ba: proj(t("in_proj_ba.weight"), vec![2 * nv, h], c),
            qkv: proj(t("in_proj_qkv.weight"), vec![channels, h], c),
            z: proj(t("in_proj_z.weight"), vec![nv * dv, h], c),
            b: proj(t("in_proj_b.weight"), vec![nv, h], c),
            a: proj(t("in_proj_a.weight"), vec![nv, h], c),
            conv: def(t("conv1d.weight"), vec![channels, 1, g.conv_kernel], c),
            a_log: def(t("A_log"), vec![nv], c),
            dt_bias: def(t("dt_bias"), vec![nv], c),
            norm: def(t("norm.weight"), vec![dv], c),
            out_proj: proj(t("out_proj.weight"), vec![h, nv * dv], c),
        }
    }

    /// The layer's GDN tensors in checkpoint order, with the fused (Qwen3-Next) or split
    /// input projections.
    pub fn tensors(&self, fused: bool) -> Vec<&TensorDef> {
        let mut out = if fused {
            vec![&self.qkvz, &self.ba]
        } else {
            vec![&self.qkv, &self.z, &self.b, &self.a]
        };
        out.extend([
            &self.conv,
            &self.a_log,
            &self.dt_bias,
            &self.norm,
            &self.out_proj,
        ]);
        out
    }
}

/// A SwiGLU MLP under `prefix`: gate and up `[I, H]`, down `[H, I]`.
pub struct MlpSchema {
    pub gate: TensorDef,
    pub up: TensorDef,
    pub down: TensorDef,
}

impl MlpSchema {
    /// The MLP under `prefix`, `hidden` → `inter` → `hidden`, counted as `class`.
    pub fn new(prefix: &str, hidden: usize, inter: usize, class: TensorClass) -> Self {
        MlpSchema {
            gate: proj(
                format!("{prefix}.gate_proj.weight"),
                vec![inter, hidden],
                class,
            ),
            up: proj(
                format!("{prefix}.up_proj.weight"),
                vec![inter, hidden],
                class,
            ),
            down: proj(
                format!("{prefix}.down_proj.weight"),
                vec![hidden, inter],
                class,
            ),
        }
    }

    /// A dense layer's FFN (`mlp.*`).
    pub fn dense(config: &ModelConfig, inter: usize) -> Self {
        MlpSchema::new("mlp", config.hidden_size, inter, TensorClass::DenseMlp)
    }

    /// Gate, up, down.
    pub fn tensors(&self) -> [&TensorDef; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// A MoE FFN (MODEL_MATH §1.6): router, routed experts (fused or one key per expert), shared
/// expert and its gate.
pub struct MoeSchema {
    /// `[E, H]`.
    pub router: TensorDef,
    /// Fused experts: `[E, 2I, H]`, gate rows then up rows per expert.
    pub gate_up: TensorDef,
    /// Fused experts: `[E, H, I]`.
    pub down: TensorDef,
    pub shared: MlpSchema,
    /// `[1, H]` sigmoid gate of the shared expert.
    pub shared_gate: TensorDef,
    hidden: usize,
    expert_inter: usize,
}

impl MoeSchema {
    /// The schema for `config` (keys, shapes and classes derived from its dimensions).
    pub fn new(config: &ModelConfig, moe: &MoeConfig) -> Self {
        let h = config.hidden_size;
        let (e, inter) = (moe.num_experts, moe.expert_intermediate);
        let c = TensorClass::RoutedExperts;
        MoeSchema {
            router: def("mlp.gate.weight", vec![e, h], TensorClass::Router),
            gate_up: proj("mlp.experts.gate_up_proj", vec![e, 2 * inter, h], c),
            down: proj("mlp.experts.down_proj", vec![e, h, inter], c),
            shared: MlpSchema::new(
                "mlp.shared_expert",
                h,
                moe.shared_intermediate,
                TensorClass::SharedExpert,
            ),
            shared_gate: def(
                "mlp.shared_expert_gate.weight",
                vec![1, h],
                TensorClass::SharedExpert,
            ),
            hidden: h,
            expert_inter: inter,
        }
    }

    /// Expert `e`'s gate, up and down matrices inside the fused tensors `gate_up` `[E, 2I, H]`
    /// and `down` `[E, H, I]` (as mapped with [`Self::gate_up`] and [`Self::down`]'s shapes).
    pub fn fused_expert(&self, gate_up: &Matrix, down: &Matrix, e: usize) -> [Matrix; 3] {
        let (h, inter) = (self.hidden, self.expert_inter);
        [
            gate_up.rows_slice(e * 2 * inter, inter),
            gate_up.rows_slice(e * 2 * inter + inter, inter),
            down.rows_slice(e * h, h),
        ]
    }

    /// Routed expert `e` stored per expert (`mlp.experts.{e}.*`).
    pub fn expert(&self, e: usize) -> MlpSchema {
        MlpSchema::new(
            &format!("mlp.experts.{e}"),
            self.hidden,
            self.expert_inter,
            TensorClass::RoutedExperts,
        )
    }
}
