//! The vision tower's tensors (`model.visual.*`, shared docs `VISION.md` §1.4), each
//! shape-checked against `vision_config`. Matrices stay as stored (bf16, memory-mapped); the
//! patch embedding and the position table, small and read whole, are copied as f32.

use crate::config::VisionConfig;
use crate::{Checkpoint, Result};

use super::Linear;

/// A linear layer with its bias: y = x·Wᵀ + b.
pub struct BiasedLinear {
    pub weight: Linear,
    pub bias: Vec<f32>,
}

/// LayerNorm weights (with mean and bias, eps 1e-6: not the text model's RMSNorm).
pub struct LayerNormWeights {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// One pre-norm ViT block (`VISION.md` §3.4).
pub struct VisionBlock {
    pub norm1: LayerNormWeights,
    /// [3D, D]: rows q (head-major), then k, then v.
    pub qkv: BiasedLinear,
    pub proj: BiasedLinear,
    pub norm2: LayerNormWeights,
    pub fc1: BiasedLinear,
    pub fc2: BiasedLinear,
}

/// Every tensor of the tower.
pub struct VisionWeights {
    /// The Conv3d kernel as one matrix `[D, C·T_p·P·P]` (its row-major flatten matches the
    /// column order of a patch row), with its bias.
    pub patch_embed: BiasedLinear,
    /// The learned position table `[S², D]`, f32.
    pub pos_embed: Vec<f32>,
    pub blocks: Vec<VisionBlock>,
    /// The merger's LayerNorm over D, before 2x2 rows are grouped.
    pub merger_norm: LayerNormWeights,
    /// [4D, 4D] then erf-GELU.
    pub merger_fc1: BiasedLinear,
    /// [out_hidden, 4D].
    pub merger_fc2: BiasedLinear,
}

impl VisionWeights {
    /// Bytes of the tower's weights as loaded.
    pub fn size_bytes(&self) -> usize {
        let lin = |l: &BiasedLinear| l.weight.size_bytes() + l.bias.len() * 4;
        let norm = |n: &LayerNormWeights| (n.weight.len() + n.bias.len()) * 4;
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                norm(&b.norm1)
                    + lin(&b.qkv)
                    + lin(&b.proj)
                    + norm(&b.norm2)
                    + lin(&b.fc1)
                    + lin(&b.fc2)
            })
            .sum();
        lin(&self.patch_embed)
            + self.pos_embed.len() * 4
            + blocks
            + norm(&self.merger_norm)
            + lin(&self.merger_fc1)
            + lin(&self.merger_fc2)
    }
}

pub use crate::layout::VISION_PREFIX;

/// Whether the checkpoint stores a vision tower (its patch embedding).
pub fn has_vision_tower(checkpoint: &Checkpoint) -> bool {
    checkpoint.contains(&format!("{VISION_PREFIX}patch_embed.proj.weight"))
}

/// Reads the tower `config` describes. Every tensor must be present with its shape; a
/// checkpoint holding DeepStack mergers is refused (transformers ignores them for Qwen3.5).
pub fn load_vision(checkpoint: &Checkpoint, config: &VisionConfig) -> Result<VisionWeights> {
    let source = super::Source {
        ck: checkpoint,
        install: None,
    };
    load_vision_from(&source, config)
}

/// [`load_vision`] from a checkpoint or an install, whose tower matrices may be stored q8
/// (`spindle convert --vision-quant q8`).
pub fn load_vision_from(source: &super::Source, config: &VisionConfig) -> Result<VisionWeights> {
    let checkpoint = source.ck;
    let key = |s: &str| format!("{VISION_PREFIX}{s}");
    if let Some(name) = checkpoint
        .names()
        .find(|n| n.starts_with(&key("deepstack_merger_list.")))
    {
        return Err(crate::ModelError::Unsupported {
            path: checkpoint.dir().to_owned(),
            message: format!(
                "tensor `{name}`: DeepStack mergers are not part of the Qwen3.5/3.6 vision tower"
            ),
        });
    }
    let (d, i) = (config.hidden, config.intermediate);
    let wide = d * config.merge * config.merge;
    let values = |s: &str, shape: &[usize]| checkpoint.f32_values(&key(s), shape);
    let linear = |s: &str, rows: usize, cols: usize| -> Result<BiasedLinear> {
        Ok(BiasedLinear {
            weight: source.linear(&key(&format!("{s}.weight")), &[rows, cols])?,
            bias: values(&format!("{s}.bias"), &[rows])?,
        })
    };
    let norm = |s: &str| -> Result<LayerNormWeights> {
        Ok(LayerNormWeights {
            weight: values(&format!("{s}.weight"), &[d])?,
            bias: values(&format!("{s}.bias"), &[d])?,
        })
    };
    let conv_shape = [
        d,
        config.in_channels,
        config.temporal,
        config.patch,
        config.patch,
    ];
    let patch = checkpoint.matrix(&key("patch_embed.proj.weight"), &conv_shape)?;
    // The [D, C, T, P, P] kernel viewed as [D, C·T·P·P].
    let patch_embed = BiasedLinear {
        weight: Linear::Mapped(patch.reshaped(d, config.patch_row())),
        bias: values("patch_embed.proj.bias", &[d])?,
    };
    let blocks = (0..config.depth)
        .map(|b| {
            let at = |s: &str| format!("blocks.{b}.{s}");
            Ok(VisionBlock {
                norm1: norm(&at("norm1"))?,
                qkv: linear(&at("attn.qkv"), 3 * d, d)?,
                proj: linear(&at("attn.proj"), d, d)?,
                norm2: norm(&at("norm2"))?,
                fc1: linear(&at("mlp.linear_fc1"), i, d)?,
                fc2: linear(&at("mlp.linear_fc2"), d, i)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(VisionWeights {
        patch_embed,
        pos_embed: values("pos_embed.weight", &[config.pos_side * config.pos_side, d])?,
        blocks,
        merger_norm: norm("merger.norm")?,
        merger_fc1: linear("merger.linear_fc1", wide, wide)?,
        merger_fc2: linear("merger.linear_fc2", config.out_hidden, wide)?,
    })
}
