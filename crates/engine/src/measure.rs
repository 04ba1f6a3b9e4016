//! Helpers shared by the benchmarks of every backend.

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
#[derive(Clone, Copy, Debug, serde::Serialize)]
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
