//! The weight schema of the parts qwen4_exp adds (MODEL_MATH §4): hyper-connection blocks
//! and PLE with its n-gram table. The QSA indexer is part of [`super::AttentionSchema`].

use crate::config::{HyperConfig, ModelConfig, PleConfig};

use super::tensor_def::{def, TensorClass, TensorDef};

/// A hyper-connection block under `prefix` (MODEL_MATH §4.3), `width` = streams · H.
pub struct HyperSchema {
    /// `[width]`.
    pub norm: TensorDef,
    /// `[lowrank, width]`.
    pub mix_down: TensorDef,
    /// `[width, lowrank]`.
    pub mix_up: TensorDef,
    /// `[streams, width]`; the final mixer has none.
    pub inject: Option<TensorDef>,
}

impl HyperSchema {
    /// The block under `prefix`, with `block_inject_weight` when `inject`.
    pub fn new(prefix: &str, hc: &HyperConfig, hidden: usize, inject: bool) -> Self {
        let c = TensorClass::HyperConnection;
        let width = hc.streams * hidden;
        HyperSchema {
            norm: def(format!("{prefix}.hc_norm.weight"), vec![width], c),
            mix_down: def(
                format!("{prefix}.input_mix_weight_down.weight"),
                vec![hc.lowrank, width],
                c,
            ),
            mix_up: def(
                format!("{prefix}.input_mix_weight_up.weight"),
                vec![width, hc.lowrank],
                c,
            ),
            inject: inject.then(|| {
                def(
                    format!("{prefix}.block_inject_weight.weight"),
                    vec![hc.streams, width],
                    c,
                )
            }),
        }
    }

    /// The block's tensors in checkpoint order.
    pub fn tensors(&self) -> Vec<&TensorDef> {
        let mut out = vec![&self.norm, &self.mix_down, &self.mix_up];
        out.extend(&self.inject);
        out
    }
}

/// A PLE layer (MODEL_MATH §4.5) and its n-gram table and hash buffers (§4.6).
pub struct PleSchema {
    /// `[n·H, ple_dim]`.
    pub key_proj: TensorDef,
    /// `[H, ple_dim]`.
    pub value_proj: TensorDef,
    pub norm_key: TensorDef,
    pub norm_query: TensorDef,
    pub norm_conv: TensorDef,
    /// `[n·H, 1, K]` depthwise taps.
    pub conv: TensorDef,
    /// The whole table in one key `[rows, head_dim]` (checkpoints that do not shard it).
    pub table: TensorDef,
    /// int64 buffers the stored hash must match: multipliers `[ngram_size]`, head vocab
    /// sizes and offsets `[heads]`.
    pub multipliers: TensorDef,
    pub head_vocab_sizes: TensorDef,
    pub head_offsets: TensorDef,
    /// Rows of the table (padded).
    pub table_rows: usize,
    head_dim: usize,
}

impl PleSchema {
    /// PLE ordinal `ordinal` (its index in `ple.layers`).
    pub fn new(config: &ModelConfig, ple: &PleConfig, ordinal: usize) -> Self {
        let streams = config.hyper.as_ref().map_or(1, |h| h.streams);
        let h = config.hidden_size;
        let width = streams * h;
        let c = TensorClass::Ple;
        let n = TensorClass::NgramTable;
        let t = |s: &str| format!("ple.{s}");
        let e = |s: &str| format!("ple.ple_embedding.{s}");
        let table_rows = ngram_table_rows(ple, ordinal) as usize;
        PleSchema {
            key_proj: def(t("key_proj.weight"), vec![width, ple.embed_dim], c),
            value_proj: def(t("value_proj.weight"), vec![h, ple.embed_dim], c),
            norm_key: def(t("norm_key.weight"), vec![width], c),
            norm_query: def(t("norm_query.weight"), vec![width], c),
            norm_conv: def(t("norm_conv.weight"), vec![width], c),
            conv: def(t("conv1d.weight"), vec![width, 1, ple.conv_kernel], c),
            table: def(
                e("ngram_embedding.weight"),
                vec![table_rows, ple.head_dim()],
                n,
            ),
            multipliers: def(e("layer_multipliers"), vec![ple.ngram_size], n),
            head_vocab_sizes: def(e("ngram_heads_vocab_sizes"), vec![ple.heads()], n),
            head_offsets: def(e("ngram_heads_offsets"), vec![ple.heads()], n),
            table_rows,
            head_dim: ple.head_dim(),
        }
    }

    /// Shard `k` of the table split in `parts` along rows.
    pub fn shard(&self, k: usize, parts: usize) -> TensorDef {
        def(
            format!("ple.ple_embedding.ngram_embedding.shard_{k}.weight"),
            vec![self.table_rows / parts, self.head_dim],
            TensorClass::NgramTable,
        )
    }

    /// The projections, norms and conv in checkpoint order (the table and buffers are listed
    /// apart, after the trunk).
    pub fn tensors(&self) -> [&TensorDef; 6] {
        [
            &self.key_proj,
            &self.value_proj,
            &self.norm_key,
            &self.norm_query,
            &self.norm_conv,
            &self.conv,
        ]
    }

    /// The hash buffers, in checkpoint order.
    pub fn buffers(&self) -> [&TensorDef; 3] {
        [
            &self.multipliers,
            &self.head_vocab_sizes,
            &self.head_offsets,
        ]
    }
}

/// Rows of the n-gram table of PLE ordinal `p`: the sum of its heads' prime sizes, padded.
pub fn ngram_table_rows(ple: &PleConfig, ordinal: usize) -> u64 {
    let sizes = crate::ngram::head_vocab_sizes(ple.vocab_size_base, ordinal, ple.heads());
    let total: u64 = sizes.iter().sum();
    total.div_ceil(ple.vocab_divisible_by) * ple.vocab_divisible_by
}
