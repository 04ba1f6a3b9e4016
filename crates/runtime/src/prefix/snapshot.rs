//! The pieces of a cached prefix, on the backend that captured them
//! ([`crate::Backend::capture_kv`], [`crate::Backend::capture_state`],
//! [`crate::Backend::restore_prefix`]).

use spindle_cpu::session::{BoundaryState, KvSegment};

/// The attention layers' KV rows of a run of tokens `[start, end)`: valid at any cut.
#[derive(Clone, Debug)]
pub enum PrefixKv {
    Cpu(KvSegment),
}

/// The state valid only at one position (GDN conv and recurrent state, PLE state).
#[derive(Clone, Debug)]
pub enum PrefixState {
    Cpu(BoundaryState),
}

impl PrefixKv {
    pub fn start(&self) -> usize {
        match self {
            PrefixKv::Cpu(s) => s.start,
        }
    }

    pub fn end(&self) -> usize {
        match self {
            PrefixKv::Cpu(s) => s.end,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            PrefixKv::Cpu(s) => s.bytes() as u64,
        }
    }

    /// `[start, at)` and `[at, end)`.
    pub fn split_at(&self, at: usize) -> (PrefixKv, PrefixKv) {
        match self {
            PrefixKv::Cpu(s) => {
                let (a, b) = s.split_at(at);
                (PrefixKv::Cpu(a), PrefixKv::Cpu(b))
            }
        }
    }
}

impl PrefixState {
    pub fn position(&self) -> usize {
        match self {
            PrefixState::Cpu(s) => s.position,
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            PrefixState::Cpu(s) => s.bytes() as u64,
        }
    }
}
