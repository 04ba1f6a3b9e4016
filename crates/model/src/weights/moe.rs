//! The weights of a MoE FFN: router, routed experts (in memory or streamed) and shared expert.

use crate::weights::experts::StreamedExperts;

use super::{Linear, MlpWeights};

/// A MoE FFN (MODEL_MATH §1.6).
pub struct MoeWeights {
    /// `[E, H]` router.
    pub router: Linear,
    /// Every expert, addressable (resident or mapped); empty when `streamed` holds them.
    pub experts: Vec<MlpWeights>,
    /// The experts behind a slot cache, read from an install as routing asks for them.
    pub streamed: Option<Box<StreamedExperts>>,
    pub shared: MlpWeights,
    /// `[1, H]` sigmoid gate of the shared expert.
    pub shared_gate: Linear,
}
