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
}

pub type Result<T> = std::result::Result<T, EngineError>;
