//! The CPU backend's error type.

use spindle_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),

    #[error("{message}; this sequence's state is incomplete, start a new one")]
    ExpertRead { message: String },

    #[error("this sequence's state is incomplete after an earlier failed step ({cause}); start a new one")]
    BrokenSession { cause: String },

    /// The forward pass produced NaN or infinity: `site` is where the hidden state (the
    /// residual stream) or the logits first held one.
    #[error(
        "the forward pass went non-finite (NaN or infinity) {site}, first at input token {token} \
         (position {position}); the weights may be damaged: load with --check-weights to scan them"
    )]
    NonFinite {
        site: NonFiniteSite,
        token: usize,
        position: usize,
    },
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

pub type Result<T> = std::result::Result<T, EngineError>;
