//! Continuous batching: one engine thread owns every sequence and runs them together, one
//! batched forward step ([`crate::Backend::forward_batch`]) after another. Each step feeds
//! every decoding sequence its next token and fills the rest of a token budget with chunks of
//! the prompts waiting to be prefilled ([`plan`]); sequences join and leave between steps.
//! Each sequence samples, detokenizes and stops through its own
//! [`crate::generate::SequenceDecoder`], the code [`crate::Model::generate`] runs, so its text
//! does not depend on what else is in the batch. `spindle serve` and `spindle bench` both
//! drive it.

pub mod plan;
mod scheduler;
pub mod stats;

pub use scheduler::{BatchConfig, Scheduler, SeqEvent, SequenceGuard, SequenceHandle};
pub use stats::{Histogram, HistogramSnapshot, SchedulerStats};
