//! Launchers of the kernels in `sampling.cu` (sampling on the device; the host side is the crate's sampling module).

use super::Ptr;

/// Buckets of the per-row histogram of distances below the maximum (`SAMPLE_BUCKETS`).
pub const SAMPLE_BUCKETS: usize = 4096;
/// The most candidates `sample_pick` sorts per row (`SAMPLE_WINDOW`).
pub const SAMPLE_WINDOW: usize = 8192;
/// Threads of a `sample_pick` block (`SAMPLE_PICK_THREADS`).
pub const SAMPLE_PICK_THREADS: u32 = 1024;
/// Words of one row's parameters (`SAMPLE_PARAM_WORDS`).
pub const SAMPLE_PARAM_WORDS: usize = 16;
/// Parameter flag: the row is greedy (`SAMPLE_GREEDY`).
pub const SAMPLE_GREEDY: u32 = 1;
/// Parameter flag: the row has penalties and a history (`SAMPLE_PENALISE`).
pub const SAMPLE_PENALISE: u32 = 2;
/// Parameter flag: the row has allowed-token bits (`SAMPLE_MASKED`).
pub const SAMPLE_MASKED: u32 = 4;
/// What `sample_pick` writes for a row the host must sample (`SAMPLE_UNRESOLVED`).
pub const SAMPLE_UNRESOLVED: u32 = u32::MAX;
/// What round 1 of `sample_pick` writes for a row whose draw takes round 2
/// (`SAMPLE_SECOND_ROUND`).
pub const SAMPLE_SECOND_ROUND: u32 = u32::MAX - 1;
/// Words of one row's window record (`SAMPLE_WIN_WORDS`).
pub const SAMPLE_WIN_WORDS: usize = 16;
/// Dynamic shared memory of `sample_window_choose`: the histogram's cumulative masses (f64),
/// counts and cumulative counts (u32).
pub const SAMPLE_WINDOW_SHARED_BYTES: usize = SAMPLE_BUCKETS * 16;
/// Dynamic shared memory of `sample_pick`: window keys (u64) and cumulative masses (f64).
pub const SAMPLE_PICK_SHARED_BYTES: usize = SAMPLE_WINDOW * 16;

kernels! {
    /// grid (blocks, rows): counts each penalised row's history ids into `counts [rows, V]`.
    SampleCountHistory = "sample_count_history"
    (
        params: Ptr<u32>,
        vocab: i32,
        counts: Ptr<u32>,
    );
    /// grid (split, rows): per slice, the greedy candidate, the largest scaled logit and the
    /// number of candidates; zeroes the row's histogram.
    SampleRowStats = "sample_row_stats"
    (
        params: Ptr<u32>,
        logits: Ptr<f32>,
        vocab: i32,
        counts: Ptr<u32>,
        parts: Ptr<u32>,
        hist: Ptr<u32>,
    );
    /// grid (split, rows): the row's histogram of distances below the maximum.
    SampleHistogram = "sample_histogram"
    (
        params: Ptr<u32>,
        logits: Ptr<f32>,
        vocab: i32,
        counts: Ptr<u32>,
        parts: Ptr<u32>,
        hist: Ptr<u32>,
    );
    /// grid (rows): each row's window of buckets to collect, from its histogram (round 1: for
    /// its cuts and draw; round 2: around the draw of the rows round 1 left for it).
    SampleWindowChoose = "sample_window_choose"
    (
        params: Ptr<u32>,
        parts: Ptr<u32>,
        split: i32,
        hist: Ptr<u32>,
        win: Ptr<u32>,
        round: i32,
    );
    /// grid (split, rows): the window's candidates as sort keys; the masses above and below.
    SampleCollect = "sample_collect"
    (
        params: Ptr<u32>,
        logits: Ptr<f32>,
        vocab: i32,
        counts: Ptr<u32>,
        parts: Ptr<u32>,
        win: Ptr<u32>,
        keys: Ptr<u64>,
    );
    /// grid (rows): the chosen id of each row (round 1 also `SAMPLE_SECOND_ROUND`, either
    /// `SAMPLE_UNRESOLVED`); the last round clears the counts.
    SamplePick = "sample_pick"
    (
        params: Ptr<u32>,
        vocab: i32,
        counts: Ptr<u32>,
        parts: Ptr<u32>,
        split: i32,
        win: Ptr<u32>,
        keys: Ptr<u64>,
        out: Ptr<u32>,
        round: i32,
        last: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    SampleCountHistory::DECLS,
    SampleRowStats::DECLS,
    SampleHistogram::DECLS,
    SampleWindowChoose::DECLS,
    SampleCollect::DECLS,
    SamplePick::DECLS,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants above are the `#define`s of sampling.cu.
    #[test]
    fn constants_match_the_cuda_source() {
        let source = include_str!("sampling.cu");
        let define = |name: &str| -> u64 {
            let line = source
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("sampling.cu defines no {name}"));
            let value = line.split_whitespace().nth(2).unwrap_or("");
            match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex.trim_end_matches('u'), 16).unwrap(),
                None => value.trim_end_matches('u').parse().unwrap(),
            }
        };
        assert_eq!(define("SAMPLE_BUCKETS"), SAMPLE_BUCKETS as u64);
        assert_eq!(define("SAMPLE_WINDOW"), SAMPLE_WINDOW as u64);
        assert_eq!(define("SAMPLE_PICK_THREADS"), SAMPLE_PICK_THREADS as u64);
        assert_eq!(define("SAMPLE_PARAM_WORDS"), SAMPLE_PARAM_WORDS as u64);
        assert_eq!(define("SAMPLE_GREEDY"), SAMPLE_GREEDY as u64);
        assert_eq!(define("SAMPLE_PENALISE"), SAMPLE_PENALISE as u64);
        assert_eq!(define("SAMPLE_MASKED"), SAMPLE_MASKED as u64);
        assert_eq!(define("SAMPLE_UNRESOLVED"), SAMPLE_UNRESOLVED as u64);
        assert_eq!(define("SAMPLE_WIN_WORDS"), SAMPLE_WIN_WORDS as u64);
        assert_eq!(define("SAMPLE_SECOND_ROUND"), SAMPLE_SECOND_ROUND as u64);
    }
}
