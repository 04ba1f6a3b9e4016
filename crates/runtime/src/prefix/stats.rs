//! The prefix cache's counters, read by `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared between the engine thread and readers.
#[derive(Debug, Default)]
pub struct PrefixStats {
    enabled: AtomicU64,
    hit_tokens: AtomicU64,
    miss_tokens: AtomicU64,
    bytes: AtomicU64,
    entries: AtomicU64,
    evictions: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStatsSnapshot {
    /// Whether the scheduler runs a prefix cache.
    pub enabled: bool,
    /// Prompt tokens restored from the cache instead of prefilled (a sequence recomputed after
    /// a preemption counts again).
    pub hit_tokens: u64,
    /// Prompt tokens prefilled (not found in the cache), recomputes included.
    pub miss_tokens: u64,
    /// Bytes the cache holds (KV rows and states).
    pub bytes: u64,
    /// Snapshots held (prefixes a request can resume from).
    pub entries: u64,
    /// Entries evicted for memory (a snapshot's state, or a node with its KV rows).
    pub evictions: u64,
}

impl PrefixStats {
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on as u64, Ordering::Relaxed);
    }

    /// Counts one admission: `hit` tokens restored, `miss` to prefill.
    pub fn record_lookup(&self, hit: usize, miss: usize) {
        self.hit_tokens.fetch_add(hit as u64, Ordering::Relaxed);
        self.miss_tokens.fetch_add(miss as u64, Ordering::Relaxed);
    }

    pub fn record_evictions(&self, n: u64) {
        self.evictions.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set_size(&self, bytes: u64, entries: u64) {
        self.bytes.store(bytes, Ordering::Relaxed);
        self.entries.store(entries, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> PrefixStatsSnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefixStatsSnapshot {
            enabled: load(&self.enabled) != 0,
            hit_tokens: load(&self.hit_tokens),
            miss_tokens: load(&self.miss_tokens),
            bytes: load(&self.bytes),
            entries: load(&self.entries),
            evictions: load(&self.evictions),
        }
    }
}
