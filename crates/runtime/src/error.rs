//! The runtime's error type.

use std::path::PathBuf;

use spindle_engine::EngineError;
use spindle_text::TextError;

use crate::sampling::InvalidSamplingParams;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Engine(#[from] EngineError),

    /// The CUDA engine's errors (no driver, no such device, out of memory, ...).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] spindle_cuda::CudaError),

    /// A combination the chosen backend cannot run, naming the option at fault.
    #[error("{0}")]
    Unsupported(String),

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
