//! The pieces of a cached prefix ([`crate::Backend::capture_kv`],
//! [`crate::Backend::capture_state`], [`crate::Backend::restore_prefix`]): on the CPU,
//! references to blocks of the model's KV pool (shared with the sequences that use them, no
//! copy); on CUDA, host rows in the CPU session's layout (which the CUDA session's caches
//! share row for row) or device buffers of their own, captured and restored without crossing
//! the bus.

use spindle_cpu::paged::PagedKv;
use spindle_cpu::session::{BoundaryState, KvSegment};

/// The attention layers' KV rows of a run of tokens `[start, end)`: valid at any cut.
#[derive(Clone, Debug)]
pub enum PrefixKv {
    /// Blocks of the CPU engine's KV pool, referenced (each block returns to the pool when its
    /// last reference, a sequence's or the cache's, is dropped).
    Paged(PagedKv),
    /// Rows on the host (CUDA's pieces that did not go to the device).
    Host(KvSegment),
    #[cfg(feature = "cuda")]
    Device(spindle_cuda::DeviceKv),
}

/// The state valid only at one position (GDN conv and recurrent state, PLE state).
#[derive(Debug)]
pub enum PrefixState {
    Host(BoundaryState),
    #[cfg(feature = "cuda")]
    Device(spindle_cuda::DeviceState),
}

impl PrefixKv {
    pub fn start(&self) -> usize {
        match self {
            PrefixKv::Paged(p) => p.start,
            PrefixKv::Host(s) => s.start,
            #[cfg(feature = "cuda")]
            PrefixKv::Device(d) => d.start(),
        }
    }

    pub fn end(&self) -> usize {
        match self {
            PrefixKv::Paged(p) => p.end,
            PrefixKv::Host(s) => s.end,
            #[cfg(feature = "cuda")]
            PrefixKv::Device(d) => d.end(),
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            PrefixKv::Paged(p) => p.bytes() as u64,
            PrefixKv::Host(s) => s.bytes() as u64,
            #[cfg(feature = "cuda")]
            PrefixKv::Device(d) => d.bytes() as u64,
        }
    }

    /// `[start, at)` and `[at, end)`.
    pub fn split_at(&self, at: usize) -> (PrefixKv, PrefixKv) {
        match self {
            PrefixKv::Paged(p) => {
                let (a, b) = p.split_at(at);
                (PrefixKv::Paged(a), PrefixKv::Paged(b))
            }
            PrefixKv::Host(s) => {
                let (a, b) = s.split_at(at);
                (PrefixKv::Host(a), PrefixKv::Host(b))
            }
            #[cfg(feature = "cuda")]
            PrefixKv::Device(d) => {
                let (a, b) = d.split_at(at);
                (PrefixKv::Device(a), PrefixKv::Device(b))
            }
        }
    }
}

impl PrefixState {
    pub fn position(&self) -> usize {
        match self {
            PrefixState::Host(s) => s.position,
            #[cfg(feature = "cuda")]
            PrefixState::Device(d) => d.position(),
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            PrefixState::Host(s) => s.bytes() as u64,
            #[cfg(feature = "cuda")]
            PrefixState::Device(d) => d.bytes() as u64,
        }
    }
}
