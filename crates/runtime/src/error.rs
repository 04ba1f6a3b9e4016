//! The runtime's error type.

use std::path::PathBuf;

use spindle_engine::sampling::InvalidSamplingParams;
use spindle_engine::EngineError;
use spindle_text::TextError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Engine(#[from] EngineError),

    #[error(transparent)]
    Text(#[from] TextError),

    #[error("invalid sampling parameter: {0}")]
    Sampling(#[from] InvalidSamplingParams),

    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },

    #[error("{0}")]
    Request(String),

    #[error("the prompt has {prompt} tokens but the context holds {limit}")]
    PromptTooLong { prompt: usize, limit: usize },
}

pub type Result<T> = std::result::Result<T, RuntimeError>;
