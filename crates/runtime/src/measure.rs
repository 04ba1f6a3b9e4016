//! What the bench measures beside the model: the host's read bandwidth, the process's peak
//! memory, a prompt that is the same on every backend, and the spread of repeated figures.

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

/// Read bandwidth of host memory: the median of several parallel passes summing a buffer of
/// `bytes` bytes, bytes per second. (Median, not best: on a shared virtual machine a single
/// pass now and then reads 40% faster than the rest, which no decode step sees.)
pub fn measure_read_bandwidth(bytes: usize) -> f64 {
    let words = bytes / 8;
    let buffer: Vec<u64> = (0..words as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9E37_79B9))
        .collect();
    let chunk = (words / (rayon::current_num_threads() * 8)).max(1 << 12);
    let mut passes = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let sum: u64 = buffer
            .par_chunks(chunk)
            .map(|c| {
                // Eight independent accumulators so the loop is bound by loads, not adds.
                let mut acc = [0u64; 8];
                for block in c.chunks_exact(8) {
                    for i in 0..8 {
                        acc[i] = acc[i].wrapping_add(block[i]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, u64::wrapping_add);
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        passes.push((words * 8) as f64 / secs);
    }
    passes.sort_by(f64::total_cmp);
    passes[passes.len() / 2]
}

/// Peak resident set size of this process (VmHWM), in bytes; 0 where /proc is unavailable.
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A deterministic prompt of `n` ordinary token ids (below the special tokens at the top of
/// the vocabulary), the same on every backend so their figures compare.
pub fn synthetic_prompt(vocab_size: usize, n: usize) -> Vec<u32> {
    let span = (vocab_size as u64).saturating_sub(512).max(1);
    (0..n as u64)
        .map(|i| ((i * 7919 + 17) % span) as u32)
        .collect()
}

/// Median and spread of one quantity over the runs of a benchmark.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    /// The statistics of `values` (at least one).
    pub fn of(mut values: Vec<f64>) -> Stat {
        values.sort_by(f64::total_cmp);
        Stat {
            median: values[values.len() / 2],
            min: values[0],
            max: values[values.len() - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_the_median_and_the_extremes() {
        let s = Stat::of(vec![3.0, 1.0, 10.0, 2.0, 5.0]);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 10.0));
        let one = Stat::of(vec![7.0]);
        assert_eq!((one.median, one.min, one.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn the_synthetic_prompt_is_fixed_and_avoids_the_special_tokens() {
        let a = synthetic_prompt(1000, 64);
        assert_eq!(a, synthetic_prompt(1000, 64));
        assert_eq!(a.len(), 64);
        assert!(a.iter().all(|&id| id < 1000 - 512), "{a:?}");
        assert_eq!(&a[..2], &[17, (7919 + 17) % 488]);
    }

    #[test]
    fn this_process_has_a_peak_rss_and_memory_reads_at_a_positive_rate() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(peak_rss_bytes() > 0);
        }
        let bandwidth = measure_read_bandwidth(1 << 20);
        assert!(bandwidth.is_finite() && bandwidth > 0.0, "{bandwidth}");
    }
}

/// One kernel at one grid: its launches and their total time.
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub name: &'static str,
    pub grid: (u32, u32, u32),
    pub calls: usize,
    pub total_us: f64,
}
