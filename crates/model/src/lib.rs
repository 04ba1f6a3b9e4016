//! spindle's model description, shared by every backend: validated configs, memory-mapped
//! safetensors checkpoints and installs, the mapping from logical tensors to checkpoint keys,
//! the weight schema ([`layout`]), the weight formats and their reference quantizers
//! ([`quant`], [`view`]), the host-side weight tree and its loader ([`weights`]), expert
//! residency and streaming storage ([`experts`]) and the forward-pass types ([`forward`]).
//! Depends on no backend.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod finite;
pub mod forward;
pub mod fp8;
pub mod fs;
pub mod gguf;
pub mod install;
pub mod layout;
pub mod mrope;
pub mod names;
pub mod ngram;
pub mod paged;
pub mod quant;
pub mod synth;
pub mod tensor;
pub mod weights;
pub mod writer;

pub use checkpoint::Checkpoint;
pub use config::{
    AttentionConfig, Family, FfnKind, GdnConfig, GdnGate, HyperConfig, LayerSpec, MixerKind,
    ModelConfig, MoeConfig, PleConfig, QsaConfig, RopeConfig, VisionConfig, VisionTokens,
};
pub use error::{ModelError, Result};
pub use names::{ExpertLayout, TensorNames};
pub use tensor::{DType, Matrix, StoredFp8};
/// The expert store (residency, slot cache, read pool) is part of the weight tree; the short
/// path is kept for the front ends that configure it.
pub use weights::experts;
pub use weights::VisionWeights;
