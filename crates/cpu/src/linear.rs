//! The CPU backend's y = x·Wᵀ for a model's [`Linear`] weights.

use spindle_model::weights::Linear;

/// Runs a [`Linear`] on the CPU kernels.
pub trait LinearExt {
    /// `y [tokens, out] = x [tokens, in] · Wᵀ`.
    fn forward(&self, x: &[f32], tokens: usize) -> Vec<f32>;
}

impl LinearExt for Linear {
    fn forward(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let mut y = vec![0.0; tokens * self.rows()];
        spindle_kernels::linear::matmul(&self.mat(), x, tokens, &mut y);
        y
    }
}
