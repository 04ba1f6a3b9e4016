//! The engine's error type.

use spindle_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),

    #[error("token id {id} at prompt position {position} is outside the vocabulary (vocab_size {vocab_size})")]
    InvalidToken {
        id: u32,
        position: usize,
        vocab_size: usize,
    },

    #[error("the sequence would reach {requested} tokens, beyond the model's context of {limit} (max_position_embeddings)")]
    ContextOverflow { requested: usize, limit: usize },

    #[error("forward called with no tokens")]
    EmptyInput,

    #[error("{message}; this sequence's state is incomplete, start a new one")]
    ExpertRead { message: String },

    #[error("this sequence's state is incomplete after an earlier failed step ({cause}); start a new one")]
    BrokenSession { cause: String },
}

pub type Result<T> = std::result::Result<T, EngineError>;
