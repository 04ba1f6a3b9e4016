//! Tensor-name mapping: the trunk prefix of the text-only and VLM layouts, and how experts
//! are stored (MODEL_MATH §2, §3, §4.7).

use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};

/// How a layer's routed experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertLayout {
    /// `mlp.experts.{e}.{gate,up,down}_proj.weight`, one key per expert and projection.
    PerExpert,
    /// `mlp.experts.gate_up_proj` [E, 2I, H] (gate rows, then up rows) and
    /// `mlp.experts.down_proj` [E, H, I].
    Fused,
}

/// Maps logical tensor names to the checkpoint's keys.
#[derive(Clone, Debug)]
pub struct TensorNames {
    /// `model.` (text-only) or `model.language_model.` (the VLM wrapper).
    prefix: &'static str,
}

impl TensorNames {
    /// Finds which trunk prefix the checkpoint uses. The vision tower (`model.visual.*`) and
    /// the MTP head (`mtp.*`) are never asked for, so they are skipped.
    pub fn detect(checkpoint: &Checkpoint) -> Result<Self> {
        for prefix in ["model.language_model.", "model."] {
            if checkpoint.contains(&format!("{prefix}embed_tokens.weight")) {
                return Ok(TensorNames { prefix });
            }
        }
        Err(ModelError::MissingTensor {
            dir: checkpoint.dir().to_owned(),
            tensor: "model.embed_tokens.weight (or model.language_model.embed_tokens.weight)"
                .into(),
        })
    }

    /// A trunk tensor, e.g. `trunk("norm.weight")`.
    pub fn trunk(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    /// A tensor of layer `layer`, e.g. `layer(3, "self_attn.q_proj.weight")`.
    pub fn layer(&self, layer: usize, suffix: &str) -> String {
        format!("{}layers.{layer}.{suffix}", self.prefix)
    }

    /// The expert layout of MoE layer `layer`; a mixture of both layouts is refused.
    pub fn expert_layout(&self, checkpoint: &Checkpoint, layer: usize) -> Result<ExpertLayout> {
        let fused = checkpoint.contains(&self.layer(layer, "mlp.experts.gate_up_proj"));
        let per_expert = checkpoint.contains(&self.layer(layer, "mlp.experts.0.gate_proj.weight"));
        match (fused, per_expert) {
            (true, false) => Ok(ExpertLayout::Fused),
            (false, true) => Ok(ExpertLayout::PerExpert),
            (true, true) => Err(ModelError::Index {
                path: checkpoint.dir().to_owned(),
                message: format!(
                    "layer {layer} stores experts both fused (mlp.experts.gate_up_proj) and per expert \
                     (mlp.experts.0.gate_proj.weight): a checkpoint must use one layout"
                ),
            }),
            (false, false) => Err(ModelError::MissingTensor {
                dir: checkpoint.dir().to_owned(),
                tensor: self.layer(layer, "mlp.experts.gate_up_proj (or mlp.experts.0.gate_proj.weight)"),
            }),
        }
    }
}
