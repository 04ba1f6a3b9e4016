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
}

pub type Result<T> = std::result::Result<T, EngineError>;
