//! Backend-neutral types of a forward pass: which positions' logits it returns, and a greedy
//! run's logits in the layout of the fixtures' `reference.safetensors`.

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every input position: `[tokens, V]`.
    All,
    /// Only the last input position: `[1, V]`.
    Last,
}

/// A prefill and greedy decode, in the layout of the fixtures' `reference.safetensors`.
pub struct GreedyRun {
    /// `[T, V]`.
    pub prefill_logits: Vec<f32>,
    /// `[G]`.
    pub gen_ids: Vec<u32>,
    /// `[G, V]`: row g holds the logits `gen_ids[g]` was picked from.
    pub decode_logits: Vec<f32>,
}

impl GreedyRun {
    /// Prefill of `prompt`, then `steps` greedy tokens fed back one at a time through
    /// `forward(ids, want)` (a session's forward pass on any backend). `argmax` picks each
    /// token from a `[V]` row of logits (the backend's own, so ties resolve as its kernels do).
    pub fn collect<E>(
        vocab: usize,
        prompt: &[u32],
        steps: usize,
        argmax: impl Fn(&[f32]) -> usize,
        mut forward: impl FnMut(&[u32], LogitsFor) -> Result<Vec<f32>, E>,
    ) -> Result<GreedyRun, E> {
        let prefill_logits = forward(prompt, LogitsFor::All)?;
        let mut decode_logits = Vec::with_capacity(steps * vocab);
        let mut gen_ids = Vec::with_capacity(steps);
        let mut last = prefill_logits[prefill_logits.len() - vocab..].to_vec();
        for step in 0..steps {
            let next = argmax(&last) as u32;
            gen_ids.push(next);
            decode_logits.extend_from_slice(&last);
            if step + 1 < steps {
                last = forward(&[next], LogitsFor::Last)?;
            }
        }
        Ok(GreedyRun {
            prefill_logits,
            gen_ids,
            decode_logits,
        })
    }
}
