//! Streamed experts: a fixed number of slots per MoE layer hold the experts last used; a miss
//! reads the expert's record (one aligned `pread` of `stride` bytes) on the read pool.
//!
//! A forward pass calls [`StreamedExperts::begin`] as soon as routing is known, computes what
//! does not need the routed experts (the shared expert), then [`StreamedExperts::wait`]s; the
//! time spent waiting is the stall.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::install::ExpertLayerLayout;

use super::buf::AlignedBuf;
use super::pool::ReadPool;
use super::record::expert_at;
use super::slots::{CachePolicy, SlotCache};
use super::ExpertCounters;
use crate::weights::packed::Owner;
use crate::weights::{Linear, MlpWeights};

/// One expert held in a slot.
pub struct LoadedExpert {
    pub weights: MlpWeights,
}

/// A slot being filled or filled: the reader thread stores the result and notifies.
#[derive(Default)]
pub struct Slot {
    state: Mutex<Option<Result<Arc<LoadedExpert>, String>>>,
    ready: Condvar,
}

impl Slot {
    /// Whether the read behind this slot finished with an error.
    fn failed(&self) -> bool {
        matches!(
            *self.state.lock().unwrap_or_else(|e| e.into_inner()),
            Some(Err(_))
        )
    }

    fn fill(&self, result: Result<Arc<LoadedExpert>, String>) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        self.ready.notify_all();
    }

    fn is_ready(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn wait(&self) -> Result<Arc<LoadedExpert>, String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.is_none() {
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.clone().expect("filled above")
    }
}

/// How misses are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub slots: usize,
    pub policy: CachePolicy,
    /// Read with O_DIRECT (bypassing the page cache) when the file system allows it.
    pub direct_io: bool,
}

/// One MoE layer's experts behind a slot cache, read from the layer's expert file on a miss.
pub struct StreamedExperts {
    layout: ExpertLayerLayout,
    path: PathBuf,
    file: Arc<File>,
    cache: Mutex<SlotCache<Arc<Slot>>>,
    pool: Arc<ReadPool>,
    counters: Arc<ExpertCounters>,
}

/// Linux's O_DIRECT open flag.
const O_DIRECT: i32 = 0o40000;

impl StreamedExperts {
    pub fn open(
        path: PathBuf,
        layout: ExpertLayerLayout,
        options: StreamOptions,
        pool: Arc<ReadPool>,
        counters: Arc<ExpertCounters>,
    ) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let direct = options
            .direct_io
            .then(|| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(O_DIRECT)
                    .open(&path)
                    .ok()
            })
            .flatten();
        let file = match direct {
            Some(f) => f,
            None => File::open(&path)?,
        };
        let cache = SlotCache::new(options.slots, layout.experts, options.policy);
        Ok(StreamedExperts {
            layout,
            path,
            file: Arc::new(file),
            cache: Mutex::new(cache),
            pool,
            counters,
        })
    }

    pub fn slots(&self) -> usize {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .capacity()
    }

    pub fn num_experts(&self) -> usize {
        self.layout.experts
    }

    /// Bytes of one expert's weights (the record without padding).
    pub fn bytes_per_expert(&self) -> usize {
        self.layout
            .parts
            .iter()
            .map(|p| (p.codes_bytes + p.scales_bytes) as usize)
            .sum()
    }

    /// Starts loading every expert of `experts` that is not held (at most the slot count at
    /// once is sensible); returns their slots in the same order.
    pub fn begin(&self, experts: &[usize]) -> Vec<Arc<Slot>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        experts
            .iter()
            .map(|&e| {
                match cache.get(e) {
                    Some(slot) if !slot.failed() => {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        return slot.clone();
                    }
                    // A read that failed is tried again.
                    Some(_) => drop(cache.remove(e)),
                    None => {}
                }
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                let slot = Arc::new(Slot::default());
                let buf = match cache.insert(e, slot.clone(), experts) {
                    Some(evicted) => recycle(evicted, self.layout.stride as usize),
                    None => AlignedBuf::zeroed(self.layout.stride as usize),
                };
                self.read(e, buf, slot.clone());
                slot
            })
            .collect()
    }

    fn read(&self, expert: usize, buf: AlignedBuf, slot: Arc<Slot>) {
        let parts = self.layout.parts.clone();
        let counters = self.counters.clone();
        let path = self.path.clone();
        let stride = self.layout.stride;
        self.pool.read(
            self.file.clone(),
            expert as u64 * stride,
            buf,
            Box::new(move |result| {
                let loaded = match result {
                    Ok(buf) => {
                        counters.bytes_read.fetch_add(stride, Ordering::Relaxed);
                        let owner = Owner::Heap(Arc::new(buf));
                        Ok(Arc::new(LoadedExpert {
                            weights: expert_at(&owner, 0, &parts),
                        }))
                    }
                    Err(e) => Err(format!(
                        "reading expert {expert} from {}: {e}",
                        path.display()
                    )),
                };
                slot.fill(loaded);
            }),
        );
    }

    /// Waits for `slots` to be filled, counting the time blocked as stall. A failed read (a
    /// disk or file system fault: the install passed its size checks when it was opened)
    /// comes back as its message, naming the expert and the file.
    pub fn wait(&self, slots: &[Arc<Slot>]) -> Result<Vec<Arc<LoadedExpert>>, String> {
        let start = (!slots.iter().all(|s| s.is_ready())).then(Instant::now);
        let loaded = slots.iter().map(|s| s.wait()).collect();
        if let Some(start) = start {
            self.counters
                .stall_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        loaded
    }
}

/// The buffer of an evicted slot for reuse, when nothing else still uses it; else a new one.
fn recycle(slot: Arc<Slot>, len: usize) -> AlignedBuf {
    let reused = Arc::try_unwrap(slot).ok().and_then(|slot| {
        let loaded = slot.state.into_inner().ok()??.ok()?;
        let LoadedExpert { weights } = Arc::try_unwrap(loaded).ok()?;
        let owner = match weights.gate {
            Linear::Packed(p) => p.into_owner(),
            _ => return None,
        };
        drop(weights.up);
        drop(weights.down);
        match owner {
            Owner::Heap(buf) => Arc::try_unwrap(buf).ok(),
            Owner::Mapped(_) => None,
        }
    });
    reused
        .filter(|b| b.len() == len)
        .unwrap_or_else(|| AlignedBuf::zeroed(len))
}
