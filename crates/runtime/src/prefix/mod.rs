//! Prefix caching across requests: a radix tree over token ids ([`PrefixCache`]) whose nodes
//! are snapshot points of the sequences that ran. A node at position p holds the attention
//! layers' KV rows of the tokens between its parent and p (so a long prompt's KV is stored
//! once, not once per snapshot) and, when it is a snapshot, the state that is valid only
//! exactly at p: every GDN layer's conv and recurrent state and qwen4_exp's PLE state. A new
//! sequence restores the longest cached prefix that ends on a snapshot and prefills only the
//! rest; recurrent state is never resumed anywhere but where it was taken.
//!
//! The scheduler (the `batch` module) takes snapshots where its chunked prefill is cut
//! ([`snapshot_points`]: every `interval` tokens, before every chat turn marker, at the end of
//! the prompt) and where a sequence ends (prompt and answer, which the next turn of a chat
//! extends). The cache is bounded in bytes and evicts the least recently used entries first.

mod points;
mod snapshot;
mod stats;
mod tree;

pub use points::snapshot_points;
pub use snapshot::{PrefixKv, PrefixState};
pub use stats::{PrefixStats, PrefixStatsSnapshot};
pub use tree::{CachedPrefix, PrefixCache};

/// How the prefix cache of a scheduler is sized and where it snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Bytes the cached KV rows and states may hold; past it the least recently used entries
    /// are evicted.
    pub capacity_bytes: u64,
    /// A prompt is snapshotted every `interval` tokens (besides its turn markers and its end).
    pub interval: usize,
    /// Token ids before which a prompt is snapshotted: the chat template's turn markers
    /// (`<|im_start|>`), where the next request of an agent or a chat diverges.
    pub markers: Vec<u32>,
}

impl PrefixCacheConfig {
    /// A cache of `capacity_bytes` snapshotting every `interval` tokens and before each of the
    /// model's chat turn markers (the tokenizer's `<|im_start|>`, when it has one).
    pub fn for_model(model: &crate::Model, capacity_bytes: u64, interval: usize) -> Self {
        Self {
            capacity_bytes,
            interval,
            markers: model
                .tokenizer
                .token_to_id("<|im_start|>")
                .into_iter()
                .collect(),
        }
    }

    /// A quarter of the memory this process may use now (MemAvailable, or the cgroup limit
    /// when lower; 4 GiB when neither can be read): call it once the model is loaded.
    pub fn default_capacity() -> u64 {
        spindle_model::install::plan::memory_budget().unwrap_or(4 << 30) / 4
    }
}

/// Snapshot interval when none is given: the scheduler's default token budget, so a prompt
/// prefilled alone is cut where its chunks end anyway. Smaller intervals cut prefill chunks
/// shorter, and an MoE prefill slows with fewer tokens per step (fewer per expert); short
/// shared prefixes are found through the turn markers, not the interval.
pub const DEFAULT_INTERVAL: usize = 1024;
