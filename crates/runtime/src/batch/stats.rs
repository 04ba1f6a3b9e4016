//! What the scheduler counts while it runs: sequences running and waiting, the state they
//! hold, and histograms of each step (sequences, tokens) and of each sequence's latencies
//! (time to first token, time between tokens). The server renders them at `/metrics`; the
//! values are plain numbers here.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::prefix::PrefixStats;
use spindle_model::paged::BlockCounts;

/// A histogram with fixed upper bounds, like Prometheus's.
#[derive(Debug)]
pub struct Histogram {
    bounds: Vec<f64>,
    inner: Mutex<HistogramSnapshot>,
}

/// A histogram's values at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds of the buckets, ascending (the last, `+Inf`, is implied).
    pub bounds: Vec<f64>,
    /// Observations at or below each bound, cumulative, one per bound.
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

impl Histogram {
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            inner: Mutex::new(HistogramSnapshot {
                bounds: bounds.to_vec(),
                cumulative: vec![0; bounds.len()],
                count: 0,
                sum: 0.0,
            }),
        }
    }

    pub fn observe(&self, value: f64) {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (bound, n) in self.bounds.iter().zip(h.cumulative.iter_mut()) {
            if value <= *bound {
                *n += 1;
            }
        }
        h.count += 1;
        h.sum += value;
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Powers of two from 1 to `max`.
fn powers_of_two(max: usize) -> Vec<f64> {
    std::iter::successors(Some(1usize), |n| Some(n * 2))
        .take_while(|&n| n <= max)
        .map(|n| n as f64)
        .collect()
}

/// Latency buckets, seconds: 1 ms to 60 s.
const LATENCY_BOUNDS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The scheduler's counters, shared with whoever reports them.
#[derive(Debug)]
pub struct SchedulerStats {
    running: AtomicUsize,
    waiting: AtomicUsize,
    state_bytes: AtomicUsize,
    steps: AtomicU64,
    preemptions: AtomicU64,
    /// Sequences in each step.
    pub batch_size: Histogram,
    /// Tokens fed in each step (decode tokens plus prompt chunks).
    pub step_tokens: Histogram,
    /// From submission to the first generated token, seconds.
    pub time_to_first_token: Histogram,
    /// Between consecutive generated tokens of a sequence, seconds.
    pub inter_token_latency: Histogram,
    /// The prefix cache's counters (all zero without one).
    pub prefix: PrefixStats,
    /// The KV block pool (CPU): `None` until the scheduler publishes it, and on CUDA.
    kv_blocks: Mutex<Option<BlockCounts>>,
}

impl SchedulerStats {
    pub fn new(max_seqs: usize, token_budget: usize) -> Self {
        Self {
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            state_bytes: AtomicUsize::new(0),
            steps: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            batch_size: Histogram::new(&powers_of_two(max_seqs.next_power_of_two())),
            step_tokens: Histogram::new(&powers_of_two(token_budget.next_power_of_two())),
            time_to_first_token: Histogram::new(&LATENCY_BOUNDS),
            inter_token_latency: Histogram::new(&LATENCY_BOUNDS),
            prefix: PrefixStats::default(),
            kv_blocks: Mutex::new(None),
        }
    }

    /// The KV block pool's occupancy when the backend pages its KV cache (the CPU), as of the
    /// scheduler's last look (before and after every step).
    pub fn kv_blocks(&self) -> Option<BlockCounts> {
        *self.kv_blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_kv_blocks(&self, counts: BlockCounts) {
        *self.kv_blocks.lock().unwrap_or_else(|e| e.into_inner()) = Some(counts);
    }

    /// Sequences with a session, being prefilled or decoded.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Sequences submitted and waiting for a place (`max_seqs`) or for memory.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Bytes the running sequences' sessions hold (KV caches, GDN and PLE states).
    pub fn state_bytes(&self) -> usize {
        self.state_bytes.load(Ordering::Acquire)
    }

    /// Batched steps run.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    /// Sequences preempted for state memory (freed, to be recomputed later).
    pub fn preemptions(&self) -> u64 {
        self.preemptions.load(Ordering::Acquire)
    }

    pub(crate) fn record_preemption(&self) {
        self.preemptions.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn set_occupancy(&self, running: usize, waiting: usize, state_bytes: usize) {
        self.running.store(running, Ordering::Release);
        self.waiting.store(waiting, Ordering::Release);
        self.state_bytes.store(state_bytes, Ordering::Release);
    }

    pub(crate) fn record_step(&self, sequences: usize, tokens: usize) {
        self.steps.fetch_add(1, Ordering::AcqRel);
        self.batch_size.observe(sequences as f64);
        self.step_tokens.observe(tokens as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_counts_cumulatively() {
        let h = Histogram::new(&[1.0, 2.0, 4.0]);
        for v in [0.5, 2.0, 3.0, 9.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.cumulative, [1, 2, 3]);
        assert_eq!((s.count, s.sum), (4, 14.5));
        assert_eq!(powers_of_two(16), [1.0, 2.0, 4.0, 8.0, 16.0]);
    }
}
