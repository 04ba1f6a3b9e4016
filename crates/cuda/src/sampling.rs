//! Sampling on the device: many rows of logits in, one token id per row out, with the
//! semantics of the host sampler (`spindle_runtime::sampling::Sampler::sample`) given each
//! row's draw. Penalties, greedy, temperature, top-k, top-p, min-p and the draw all run in at most nine
//! launches (no host work between them) (`kernels/sampling.cu` says how); only the ids come back (one small copy).
//!
//! A row whose cut or draw the kernels cannot settle inside their window (a top-p or min-p cut
//! far down a flat distribution, a top-k past the window, a draw within the histogram's
//! rounding of a bucket edge) comes back marked; its logits row is then read and sampled here
//! by [`sample_row_on_host`], the same algorithm. Rare for language-model logits.

use std::sync::Mutex;

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::kernels::sampling::{
    SampleCollect, SampleCountHistory, SampleHistogram, SamplePick, SampleRowStats,
    SampleWindowChoose, SAMPLE_BUCKETS, SAMPLE_GREEDY, SAMPLE_MASKED, SAMPLE_PARAM_WORDS,
    SAMPLE_PENALISE, SAMPLE_PICK_SHARED_BYTES, SAMPLE_PICK_THREADS, SAMPLE_SECOND_ROUND,
    SAMPLE_UNRESOLVED, SAMPLE_WINDOW, SAMPLE_WINDOW_SHARED_BYTES, SAMPLE_WIN_WORDS,
};
use crate::kernels::{i, p, Launch};
use crate::CudaEngine;

/// How one row is sampled (the fields of `spindle_runtime::sampling::SamplingParams`,
/// validated by the caller).
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// The draw in [0, 1), taken by the caller from the sequence's own seeded RNG (so a seed
    /// gives the same stream in any batch).
    pub uniform: f64,
    /// Ids to penalise; read only when a penalty is on. The repetition penalty takes every
    /// one, presence and frequency count those from `counted_from` on (the answer's, as
    /// OpenAI and vLLM count them; all of a window as llama.cpp does).
    pub history: &'a [u32],
    pub counted_from: usize,
}

impl RowSampling<'_> {
    /// Whether sampling reduces to the arg-max.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Whether a penalty changes any logit.
    pub fn penalises(&self) -> bool {
        !self.history.is_empty()
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One row's result of [`DeviceSampler::sample_rows_checked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampled {
    /// The chosen token (chosen as the host would, NaN never picked, whatever `finite` says).
    pub id: u32,
    /// Whether every raw logit of the row was finite.
    pub finite: bool,
}

/// Rows one batch may carry.
pub const MAX_SAMPLE_ROWS: usize = 128;

/// Device scratch of [`DeviceSampler::sample_rows`], grown on demand and reused.
#[derive(Default)]
pub struct DeviceSampler {
    /// Parameters of every row, then the histories.
    params: Option<DevBuf<u32>>,
    /// Per row and slice: greedy key, greedy id, largest scaled key, candidates.
    parts: Option<DevBuf<u32>>,
    /// Per row: bucket counts, then bucket masses (f32 bits).
    hist: Option<DevBuf<u32>>,
    /// Per row: the window to collect, its slot counter, the masses above and below it.
    win: Option<DevBuf<u32>>,
    /// Per row: the window's candidates as sort keys.
    keys: Option<DevBuf<u64>>,
    /// Per row `[V]` occurrences of each history id; zero between calls (the pick clears it).
    counts: Option<DevBuf<u32>>,
    out: Option<DevBuf<u32>>,
    /// Rows the host finished since this sampler was made.
    host_rows: usize,
}

/// A buffer of at least `len` elements in `slot` (a new zeroed one when it is too small).
fn ensure<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    dev: &Device,
    slot: &'a mut Option<DevBuf<T>>,
    len: usize,
) -> Result<&'a DevBuf<T>> {
    if slot.as_ref().is_none_or(|b| b.len() < len) {
        *slot = None;
        *slot = Some(dev.zeros::<T>(len)?);
    }
    Ok(slot.as_ref().expect("just filled"))
}

impl DeviceSampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows that came back unresolved and were sampled on the host, since this sampler was made.
    pub fn host_rows(&self) -> usize {
        self.host_rows
    }

    /// Samples one token from each row of `logits` (device f32 `[rows.len(), vocab]`, not
    /// modified): see [`CudaEngine::sample_rows`].
    pub fn sample_rows(
        &mut self,
        dev: &Device,
        logits: u64,
        vocab: usize,
        rows: &[RowSampling<'_>],
    ) -> Result<Vec<u32>> {
        Ok(self
            .sample_rows_checked(dev, logits, vocab, rows)?
            .into_iter()
            .map(|s| s.id)
            .collect())
    }

    /// [`DeviceSampler::sample_rows`], also telling for each row whether its raw logits hold
    /// a NaN or an infinity (found in the same pass, in the same copy back).
    pub fn sample_rows_checked(
        &mut self,
        dev: &Device,
        logits: u64,
        vocab: usize,
        rows: &[RowSampling<'_>],
    ) -> Result<Vec<Sampled>> {
        self.sample_rows_masked(dev, logits, vocab, rows, &[])
    }

    /// [`DeviceSampler::sample_rows_checked`] with a token mask per row: `masks[r]` (absent or
    /// `None`: every token allowed) holds at least `vocab.div_ceil(32)` words, bit `id % 32` of
    /// word `id / 32` set for an allowed id. A disallowed token's logit counts as -inf before
    /// the penalties and everything after them, greedy included (the host's order: the mask,
    /// then the sampler). The masks go up with the parameters, in the same copy; the finite
    /// check still reads the raw logits.
    pub fn sample_rows_masked(
        &mut self,
        dev: &Device,
        logits: u64,
        vocab: usize,
        rows: &[RowSampling<'_>],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<Sampled>> {
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        if n > MAX_SAMPLE_ROWS || vocab == 0 || vocab > i32::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "sampling {n} rows of {vocab} logits: at most {MAX_SAMPLE_ROWS} rows of 1 to {} logits",
                i32::MAX
            )));
        }
        let words = pack_params(rows, masks, vocab)?;
        let penalised = rows.iter().any(RowSampling::penalises);
        let sampled = rows.iter().any(|r| !r.is_greedy());
        let longest_history = rows
            .iter()
            .filter(|r| r.penalises())
            .map(|r| r.history.len())
            .max()
            .unwrap_or(0);
        // Slices per row for the two streaming passes: about eight blocks per SM in all.
        let split = 2048usize.div_ceil(n).clamp(1, 256);

        let params = ensure(dev, &mut self.params, words.len())?.ptr();
        dev.write_raw(params, &words)?;
        let parts = ensure(dev, &mut self.parts, n * split * 4)?.ptr();
        let hist = ensure(dev, &mut self.hist, n * 2 * SAMPLE_BUCKETS)?.ptr();
        // The ids, then a non-finite flag per row.
        let out = ensure(dev, &mut self.out, 2 * n)?.ptr();
        let win = ensure(dev, &mut self.win, n * SAMPLE_WIN_WORDS)?.ptr();
        let keys = ensure(dev, &mut self.keys, n * SAMPLE_WINDOW)?.ptr();
        let counts = if penalised {
            ensure(dev, &mut self.counts, n * vocab)?.ptr()
        } else {
            0
        };
        for (name, bytes) in [
            (SamplePick::NAME, SAMPLE_PICK_SHARED_BYTES),
            (SampleWindowChoose::NAME, SAMPLE_WINDOW_SHARED_BYTES),
        ] {
            if dev.shared_limit(name) < bytes {
                return Err(CudaError::Unsupported(format!(
                    "sampling on the device needs {bytes} bytes of shared memory per block in {name}; this GPU gives {}",
                    dev.shared_limit(name)
                )));
            }
        }

        if penalised {
            let blocks = longest_history.div_ceil(256).clamp(1, 256) as u32;
            SampleCountHistory::launch(
                dev,
                Launch::new((blocks, n as u32, 1), 256, 0),
                p(params),
                i(vocab),
                p(counts),
            )?;
        }
        let grid = (split as u32, n as u32, 1);
        SampleRowStats::launch(
            dev,
            Launch::new(grid, 256, 0),
            p(params),
            p(logits),
            i(vocab),
            p(counts),
            p(parts),
            p(hist),
        )?;
        if sampled {
            SampleHistogram::launch(
                dev,
                Launch::new(grid, 512, 0),
                p(params),
                p(logits),
                i(vocab),
                p(counts),
                p(parts),
                p(hist),
            )?;
        }
        let rows_grid = (n as u32, 1, 1);
        let pick = |round: i32, last: bool| {
            SamplePick::launch(
                dev,
                Launch::new(
                    rows_grid,
                    SAMPLE_PICK_THREADS,
                    SAMPLE_PICK_SHARED_BYTES as u32,
                ),
                p(params),
                i(vocab),
                p(counts),
                p(parts),
                i(split),
                p(win),
                p(keys),
                p(out),
                round,
                i32::from(last),
            )
        };
        if sampled {
            // Round 1 settles most rows; round 2 draws for those whose cut fell in a window
            // inside the row (the draw above or below it).
            for round in [1, 2] {
                SampleWindowChoose::launch(
                    dev,
                    Launch::new(
                        rows_grid,
                        SAMPLE_PICK_THREADS,
                        SAMPLE_WINDOW_SHARED_BYTES as u32,
                    ),
                    p(params),
                    p(parts),
                    i(split),
                    p(hist),
                    p(win),
                    round,
                )?;
                SampleCollect::launch(
                    dev,
                    Launch::new(grid, 256, 0),
                    p(params),
                    p(logits),
                    i(vocab),
                    p(counts),
                    p(parts),
                    p(win),
                    p(keys),
                )?;
                pick(round, round == 2)?;
            }
        } else {
            pick(1, true)?;
        }
        let words = dev.download_raw::<u32>(out, 2 * n)?;
        let (ids, flags) = words.split_at(n);
        let mut ids = ids.to_vec();
        for (r, id) in ids.iter_mut().enumerate() {
            if *id == SAMPLE_UNRESOLVED || *id == SAMPLE_SECOND_ROUND {
                let at = logits + (r * vocab * std::mem::size_of::<f32>()) as u64;
                let mut row = dev.download_raw::<f32>(at, vocab)?;
                if let Some(Some(bits)) = masks.get(r) {
                    apply_mask(&mut row, bits);
                }
                *id = sample_row_on_host(&mut row, &rows[r]);
                self.host_rows += 1;
            }
        }
        Ok(ids
            .into_iter()
            .zip(flags)
            .map(|(id, &flag)| Sampled {
                id,
                finite: flag == 0,
            })
            .collect())
    }
}

/// Every row's parameters (`SAMPLE_PARAM_WORDS` words, the layout of `SampleRow` in
/// sampling.cu), then the histories of the penalised rows and the masks of the masked ones
/// (`vocab.div_ceil(32)` words each).
fn pack_params(
    rows: &[RowSampling<'_>],
    masks: &[Option<&[u32]>],
    vocab: usize,
) -> Result<Vec<u32>> {
    let mask_words = vocab.div_ceil(32);
    let mut words = vec![0u32; rows.len() * SAMPLE_PARAM_WORDS];
    for (r, row) in rows.iter().enumerate() {
        let mask = masks.get(r).copied().flatten();
        let mask_at = match mask {
            Some(bits) if bits.len() < mask_words => {
                return Err(CudaError::Unsupported(format!(
                    "row {r}'s token mask has {} words; {vocab} logits need {mask_words}",
                    bits.len()
                )))
            }
            Some(bits) => {
                let at = words.len();
                words.extend_from_slice(&bits[..mask_words]);
                at
            }
            None => 0,
        };
        let greedy = row.is_greedy();
        let penalise = row.penalises();
        let (history_at, history_len) = if penalise {
            let at = words.len();
            words.extend_from_slice(row.history);
            (at, row.history.len())
        } else {
            (0, 0)
        };
        if words.len() > u32::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "sampling histories of {} ids in all: at most {}",
                words.len(),
                u32::MAX
            )));
        }
        let inv_t = if greedy { 0.0 } else { 1.0 / row.temperature };
        let flags = if greedy { SAMPLE_GREEDY } else { 0 }
            | if penalise { SAMPLE_PENALISE } else { 0 }
            | if mask.is_some() { SAMPLE_MASKED } else { 0 };
        let uniform = row.uniform.to_bits();
        let w = &mut words[r * SAMPLE_PARAM_WORDS..(r + 1) * SAMPLE_PARAM_WORDS];
        w[0] = inv_t.to_bits();
        w[1] = row.top_k.min(u32::MAX as usize) as u32;
        w[2] = row.top_p.to_bits();
        w[3] = row.min_p.to_bits();
        w[4] = row.repetition_penalty.to_bits();
        w[5] = row.presence_penalty.to_bits();
        w[6] = row.frequency_penalty.to_bits();
        w[7] = flags;
        w[8] = history_at as u32;
        w[9] = history_len as u32;
        w[10] = uniform as u32;
        w[11] = (uniform >> 32) as u32;
        w[12] = mask_at as u32;
        w[13] = row.counted_from.min(row.history.len()) as u32;
    }
    Ok(words)
}

impl CudaEngine {
    /// Samples one token from each row of `logits` (device f32 `[rows.len(), vocab_size]`, at
    /// most [`MAX_SAMPLE_ROWS`] rows; the buffer is not modified) with the host sampler's
    /// semantics, the draw `target = uniform · total` taken from each row's `uniform`: penalties
    /// on the raw logits, then greedy (temperature 0 or top-k 1: the arg-max, lowest id on ties,
    /// never NaN) or temperature, top-k, top-p, min-p and the draw. Only the ids come back.
    pub fn sample_rows(&self, logits: u64, rows: &[RowSampling<'_>]) -> Result<Vec<u32>> {
        let mut sampler = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        sampler.sample_rows(&self.dev, logits, self.config.vocab_size, rows)
    }

    /// [`CudaEngine::sample_rows`], also telling for each row whether its logits were all
    /// finite (so a caller can refuse a step that went NaN without copying the logits back).
    pub fn sample_rows_checked(
        &self,
        logits: u64,
        rows: &[RowSampling<'_>],
    ) -> Result<Vec<Sampled>> {
        self.sample_rows_masked(logits, rows, &[])
    }

    /// [`CudaEngine::sample_rows_checked`] with each row's allowed tokens (see
    /// [`DeviceSampler::sample_rows_masked`]): constrained decoding without the row leaving
    /// the device.
    pub fn sample_rows_masked(
        &self,
        logits: u64,
        rows: &[RowSampling<'_>],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<Sampled>> {
        let mut sampler = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
        sampler.sample_rows_masked(&self.dev, logits, self.config.vocab_size, rows, masks)
    }
}

/// The sampler's scratch, shared by the engine's callers.
pub(crate) type SharedSampler = Mutex<DeviceSampler>;

/// Sets every logit whose bit in `bits` (bit `id % 32` of word `id / 32`) is clear to -inf:
/// the mask as the host applies it (`spindle_runtime::generate::apply_mask_words`).
pub fn apply_mask(logits: &mut [f32], bits: &[u32]) {
    for (id, logit) in logits.iter_mut().enumerate() {
        if bits
            .get(id / 32)
            .is_none_or(|w| w & (1u32 << (id % 32)) == 0)
        {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// The host sampler's algorithm on one row (the penalties are applied to `logits` in place),
/// with the draw `uniform`: what the device computes, for the rows it leaves to the host.
pub fn sample_row_on_host(logits: &mut [f32], row: &RowSampling<'_>) -> u32 {
    if row.penalises() {
        // id·2, +1 where presence and frequency count it.
        let mut sorted: Vec<u64> = row
            .history
            .iter()
            .enumerate()
            .map(|(j, &id)| (id as u64) << 1 | (j >= row.counted_from) as u64)
            .collect();
        sorted.sort_unstable();
        for run in sorted.chunk_by(|a, b| a >> 1 == b >> 1) {
            let Some(logit) = logits.get_mut((run[0] >> 1) as usize) else {
                continue;
            };
            if *logit > 0.0 {
                *logit /= row.repetition_penalty;
            } else {
                *logit *= row.repetition_penalty;
            }
            let count = run.iter().filter(|&&x| x & 1 == 1).count();
            if count > 0 {
                *logit -= row.presence_penalty + row.frequency_penalty * count as f32;
            }
        }
    }
    if row.is_greedy() {
        return argmax(logits);
    }
    let inv_t = 1.0 / row.temperature;
    let mut c: Vec<(u32, f32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite() || **l == f32::INFINITY)
        .map(|(i, &l)| (i as u32, l * inv_t, 0.0))
        .collect();
    if c.is_empty() {
        return argmax(logits);
    }
    let by_logit_desc =
        |a: &(u32, f32, f64), b: &(u32, f32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let k = row.top_k;
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, by_logit_desc);
        c.truncate(k);
    }
    c.sort_unstable_by(by_logit_desc);
    let max = c[0].1;
    let mut total = 0.0f64;
    for x in &mut c {
        x.2 = if max == f32::INFINITY {
            f64::from(u8::from(x.1 == f32::INFINITY))
        } else {
            f64::from(x.1 - max).exp()
        };
        total += x.2;
    }
    for x in &mut c {
        x.2 /= total;
    }
    let top_p = f64::from(row.top_p);
    if top_p < 1.0 {
        let mut mass = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            mass += x.2;
            if mass >= top_p {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep);
    }
    let min_p = f64::from(row.min_p);
    if min_p > 0.0 {
        let threshold = min_p * c[0].2;
        c.retain(|x| x.2 >= threshold);
    }
    let total: f64 = c.iter().map(|x| x.2).sum();
    let mut target = row.uniform * total;
    for x in &c {
        if target < x.2 {
            return x.0;
        }
        target -= x.2;
    }
    c.iter().rev().find(|x| x.2 > 0.0).map_or(c[0].0, |x| x.0)
}

/// Lowest index of the largest value, NaN skipped; 0 when there is none.
fn argmax(values: &[f32]) -> u32 {
    spindle_kernels::softmax::argmax(values) as u32
}
