//! The CPU backend's y = x·Wᵀ for a model's [`Linear`] weights.

use spindle_model::weights::Linear;

/// Runs a [`Linear`] on the CPU kernels.
pub trait LinearExt {
    /// `y [tokens, out] = x [tokens, in] · Wᵀ`.
    fn forward(&self, x: &[f32], tokens: usize) -> Vec<f32>;

    /// `y = x · Wᵀ` for rows of `x` in groups (`groups[i]` rows per sequence of a batched
    /// step): each group's rows come out bit for bit as [`LinearExt::forward`] gives them for
    /// that group alone, with the weights read once for the groups of one kernel path.
    fn forward_groups(&self, x: &[f32], groups: &[usize]) -> Vec<f32>;
}

impl LinearExt for Linear {
    fn forward(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let gathered = in_column_order(self, x);
        let x = gathered.as_deref().unwrap_or(x);
        let mut y = vec![0.0; tokens * self.rows()];
        spindle_kernels::linear::matmul(&self.mat(), x, tokens, &mut y);
        y
    }

    fn forward_groups(&self, x: &[f32], groups: &[usize]) -> Vec<f32> {
        let gathered = in_column_order(self, x);
        let x = gathered.as_deref().unwrap_or(x);
        let tokens: usize = groups.iter().sum();
        let mut y = vec![0.0; tokens * self.rows()];
        spindle_kernels::linear::matmul_groups(&self.mat(), x, groups, &mut y);
        y
    }
}

/// `x [tokens, cols]` gathered into the order of the matrix's columns, when a GGUF matrix
/// kept in blocks has them reordered (`BlockMatrix::input_order`); None otherwise.
fn in_column_order(w: &Linear, x: &[f32]) -> Option<Vec<f32>> {
    let Linear::Blocks(b) = w else { return None };
    let order = b.input_order()?;
    let mut out = vec![0.0f32; x.len()];
    for (o, row) in out.chunks_exact_mut(b.cols).zip(x.chunks_exact(b.cols)) {
        for (o, &from) in o.iter_mut().zip(order) {
            *o = row[from as usize];
        }
    }
    Some(out)
}
