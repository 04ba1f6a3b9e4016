//! The CPU backend's error type.

pub use spindle_model::forward::{first_non_finite_row, NonFiniteSite};
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

    /// The KV block pool has no blocks for a sequence's next tokens: it waits (or is preempted)
    /// until others free theirs; its state is unchanged.
    #[error(transparent)]
    KvPoolFull(#[from] spindle_model::paged::PoolFull),

    /// A session made by another loaded model (its KV blocks are in that model's pool).
    #[error(
        "this session belongs to another loaded model (its KV blocks live in that model's pool)"
    )]
    ForeignSession,

    /// Image input the model cannot take: no tower loaded, or an image that does not fit it.
    #[error("{0}")]
    Image(String),

    /// Input the engine cannot take: no tokens, or a token id outside the vocabulary.
    #[error("{0}")]
    Input(String),

    /// A step's tokens do not fit the sequence's pending images (text inside an image's pads).
    #[error(transparent)]
    Placement(#[from] spindle_model::mrope::PlacementError),
}

pub type Result<T> = std::result::Result<T, EngineError>;
