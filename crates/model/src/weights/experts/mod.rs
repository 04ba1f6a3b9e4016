//! The expert provider: where a MoE layer's routed experts live while the model runs.
//!
//! - `resident`: in RAM (a Hugging Face checkpoint's memory map, experts quantized on load, or
//!   an install's expert files read into the heap at load);
//! - `mapped`: memory-mapped from an install's expert files; the page cache decides;
//! - `streamed`: a few slots per layer ([`streamed`]), misses read from the install;
//! - `auto`: chosen from the memory plan and the memory available.
//!
//! This module is the storage and bookkeeping both backends share (residency, slot cache, read
//! pool, aligned buffers, counters); running the experts is each backend's.
//!
//! Residency changes speed, never results: an expert's bytes, and the order its output is
//! added in, are the same whatever holds it.

pub mod buf;
pub mod load;
pub mod pool;
pub mod record;
pub mod slots;
pub mod streamed;

use std::sync::atomic::{AtomicU64, Ordering};

pub use slots::CachePolicy;
pub use streamed::{StreamOptions, StreamedExperts};

/// `--experts`: where the routed experts live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertResidency {
    #[default]
    Resident,
    Mapped,
    Streamed,
    Auto,
}

impl ExpertResidency {
    pub fn name(self) -> &'static str {
        match self {
            ExpertResidency::Resident => "resident",
            ExpertResidency::Mapped => "mapped",
            ExpertResidency::Streamed => "streamed",
            ExpertResidency::Auto => "auto",
        }
    }
}

impl std::str::FromStr for ExpertResidency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "resident" => Ok(ExpertResidency::Resident),
            "mapped" => Ok(ExpertResidency::Mapped),
            "streamed" => Ok(ExpertResidency::Streamed),
            "auto" => Ok(ExpertResidency::Auto),
            _ => Err(format!(
                "unknown expert residency {s:?}: expected resident, mapped, streamed or auto"
            )),
        }
    }
}

/// Counters of expert lookups, shared by every MoE layer of an engine.
#[derive(Debug, Default)]
pub struct ExpertCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub stall_ns: AtomicU64,
}

impl ExpertCounters {
    pub fn snapshot(&self) -> ExpertStats {
        ExpertStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            stall_s: self.stall_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    pub fn reset(&self) {
        for c in [&self.hits, &self.misses, &self.bytes_read, &self.stall_ns] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Expert lookups since load (or the last reset). With resident or mapped experts every
/// lookup counts as a hit (a mapped page fault is not seen).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExpertStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes read from the expert files by slot misses.
    pub bytes_read: u64,
    /// Seconds the forward pass waited for expert reads.
    pub stall_s: f64,
}

impl ExpertStats {
    /// Hits over lookups, in [0, 1] (1 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            1.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }
}
