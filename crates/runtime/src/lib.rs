//! The backend interface and text in, text out over it. [`Backend`] runs a model on the CPU
//! engine or (with the `cuda` feature) a CUDA GPU, chosen by [`Device`]: load, sessions, the
//! forward pass with its input checked once ([`input`]), and what [`bench`] measures. Above it:
//! a model directory (weights, tokenizer, chat template, generation defaults), the decode loop
//! with [`sampling`] and streaming detokenization, multi-turn conversations, and the
//! continuous-batching scheduler ([`batch`]) that runs many sequences per forward step with
//! the same per-token code ([`SequenceDecoder`]). The CLI and the server both drive
//! generation, logits and benchmarks through here.

pub mod backend;
pub mod batch;
pub mod bench;
pub mod constraint;
pub mod conversation;
pub mod demo;
pub mod device;
pub mod error;
pub mod generate;
pub mod images;
pub mod input;
pub mod measure;
pub mod model;
pub mod prefix;
pub mod sampling;

pub use backend::{Backend, BackendSession};
pub use constraint::{Constraint, Grammar, Grammars, ToolSpec};
pub use conversation::{Conversation, Turn};
pub use demo::{demo_dir, DEMO_MODEL_ID};
pub use device::Device;
pub use error::{Result, RuntimeError};
pub use generate::{
    Completion, Finish, Flow, GenerateOptions, ReasoningBudget, SequenceDecoder, SequenceMask,
    TokenLogprob, TokenStep,
};
pub use images::{check_image_pads, TokenPrompt};
pub use input::InputError;
pub use model::{Model, PreparedPrompt, Prompt};
