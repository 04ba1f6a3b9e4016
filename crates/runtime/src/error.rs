//! The runtime's error type.

use std::path::PathBuf;

use spindle_cpu::EngineError;
use spindle_text::TextError;

use crate::input::InputError;
use crate::sampling::InvalidSamplingParams;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Engine(#[from] EngineError),

    /// Token ids a forward pass refuses (checked once, before any backend runs).
    #[error(transparent)]
    Input(#[from] InputError),

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

    /// Image input the request got wrong or the model cannot take: pads without images (or
    /// the reverse), no vision tower, a backend without one. The request's fault: a 400.
    #[error("{0}")]
    Image(String),

    /// A structured-output grammar (JSON Schema, regex, choice, Lark) that cannot be compiled
    /// or run, in llguidance's words.
    #[error("invalid grammar: {0}")]
    Grammar(String),

    /// A backend returned logits holding NaN or infinity; `diagnosis` says where the hidden
    /// state first went non-finite when the backend could find it, and what to do.
    #[error(
        "the logits on {device} are not finite (NaN or infinity), first at input token {token} \
         (position {position}); {diagnosis}"
    )]
    NonFiniteLogits {
        device: String,
        token: usize,
        position: usize,
        diagnosis: String,
    },

    /// A prompt that tokenizes to nothing: there is no token to continue from.
    #[error("the prompt is empty: there is no token to continue from")]
    EmptyPrompt,

    #[error("the prompt has {prompt} tokens but the context holds {limit}")]
    PromptTooLong { prompt: usize, limit: usize },
}

impl RuntimeError {
    /// Whether this is the CUDA backend's "CUDA is not available": this machine has no CUDA
    /// driver, or no NVRTC to compile the kernels (always false without the `cuda` feature).
    pub fn is_cuda_unavailable(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let RuntimeError::Cuda(
            spindle_cuda::CudaError::NoDriver | spindle_cuda::CudaError::NoNvrtc,
        ) = self
        {
            return true;
        }
        false
    }
}

pub type Result<T> = std::result::Result<T, RuntimeError>;
