//! A SwiGLU MLP's weights: a dense FFN, a shared expert or one routed expert.

use super::Linear;

/// SwiGLU MLP: `down(silu(gate(x)) ⊙ up(x))`.
pub struct MlpWeights {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl MlpWeights {
    /// Bytes of the three projections.
    pub fn size_bytes(&self) -> usize {
        self.gate.size_bytes() + self.up.size_bytes() + self.down.size_bytes()
    }
}
