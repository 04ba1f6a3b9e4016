//! The weights of a Gated DeltaNet layer (MODEL_MATH §1.5).

use super::Linear;

/// GDN input projections in either checkpoint layout (MODEL_MATH §1.5).
pub enum GdnProjection {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Fused { qkvz: Linear, ba: Linear },
    /// Qwen3.5 and later: outputs already in channel order.
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
}

/// A Gated DeltaNet layer: input projections, conv taps, decay parameters, output norm and
/// projection.
pub struct GdnWeights {
    pub projection: GdnProjection,
    /// `[C, K]` depthwise conv taps.
    pub conv: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Gated-norm weight `[d_v]`, shared by all heads.
    pub norm: Vec<f32>,
    pub out_proj: Linear,
}
