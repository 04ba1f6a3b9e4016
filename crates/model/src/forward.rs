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

/// Where in the flow a value first went non-finite (checked on the residual stream only: a
/// kernel may hold a partial NaN legitimately, e.g. a masked attention score).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFiniteSite {
    /// The embedding rows of the input tokens.
    Embedding,
    /// The per-layer embedding (qwen4_exp PLE) added before layer `layer`.
    Ple { layer: usize },
    /// After layer `layer`'s mixer (attention or GDN) added its output.
    Mixer { layer: usize },
    /// After layer `layer`'s FFN (MLP or MoE) added its output.
    Ffn { layer: usize },
    /// The LM head's input (the final norm or hyper-connection read).
    HeadInput,
    /// The logits, from a finite head input: the LM head itself.
    Logits,
}

impl std::fmt::Display for NonFiniteSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NonFiniteSite::Embedding => write!(f, "in the token embedding"),
            NonFiniteSite::Ple { layer } => {
                write!(f, "in the per-layer embedding added before layer {layer}")
            }
            NonFiniteSite::Mixer { layer } => write!(f, "in layer {layer} (its mixer)"),
            NonFiniteSite::Ffn { layer } => write!(f, "in layer {layer} (its FFN)"),
            NonFiniteSite::HeadInput => write!(f, "in the final norm (the LM head's input)"),
            NonFiniteSite::Logits => write!(f, "in the LM head (its input was finite)"),
        }
    }
}

/// The first row of `x` (rows of `width` values) holding a NaN or an infinity, if any.
///
/// The scan has no early exit so it vectorizes: one pass over the residual stream per
/// sublayer, far below the cost of the sublayer itself.
pub fn first_non_finite_row(x: &[f32], width: usize) -> Option<usize> {
    let all_finite = x.iter().fold(true, |ok, v| ok & v.is_finite());
    if all_finite {
        return None;
    }
    x.iter()
        .position(|v| !v.is_finite())
        .map(|i| i / width.max(1))
}
