//! The model crate's error type: every variant names the file, tensor or field at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("{path} is not valid JSON: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },

    /// A config field is missing, has the wrong type, or breaks an invariant.
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },

    /// The checkpoint uses something spindle does not run yet (FP8 weights, an unknown family).
    #[error("{path}: {message}")]
    Unsupported { path: PathBuf, message: String },

    /// A safetensors file whose header or size is malformed (truncated, corrupt).
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },

    #[error("tensor `{tensor}` not found in the checkpoint at {dir}")]
    MissingTensor { dir: PathBuf, tensor: String },

    #[error("tensor `{tensor}` in {path}: shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },

    #[error("tensor `{tensor}` in {path}: dtype {dtype} is not supported (bf16, f16, f32 and block-FP8 F8_E4M3 are)")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },

    /// A tensor holds values that disagree with what the config implies.
    #[error("tensor `{tensor}` in {path}: {message}")]
    ValueMismatch {
        path: PathBuf,
        tensor: String,
        message: String,
    },

    /// `--check-weights` found a NaN or an infinity in a stored weight.
    #[error("tensor `{tensor}` in {path}: element {index} is {what}; refused by --check-weights (a non-finite weight makes the logits NaN)")]
    NonFinite {
        path: PathBuf,
        tensor: String,
        index: usize,
        what: &'static str,
    },

    /// A GGUF file that is malformed, truncated, or holds what spindle cannot map.
    #[error("{path}: {message}")]
    Gguf { path: PathBuf, message: String },

    /// A block-FP8 weight whose scale tensor is missing or malformed.
    #[error("tensor `{tensor}` in {path}: {message}")]
    BadScale {
        path: PathBuf,
        tensor: String,
        message: String,
    },

    /// The index names a shard that does not hold the tensor, or two shards hold the same name.
    #[error("{path}: {message}")]
    Index { path: PathBuf, message: String },
}

pub type Result<T> = std::result::Result<T, ModelError>;
