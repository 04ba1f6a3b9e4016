//! y = x·Wᵀ for one token (matvec) and a batch of tokens (matmul), W row-major `[rows, cols]`
//! in any [`Weights`] format.
//!
//! - One token, or a few (< [`gemm_min_tokens`]): each weight row is read once and dotted with
//!   every token while it sits in L1. Q8/Q4 rows are dotted in integers with the tokens
//!   quantized to int8 per group of 32 ([`QuantizedActs`]), as llama.cpp does.
//! - On AVX-512, panel GEMMs. Each task takes a panel of 16 weight rows, transposes it so
//!   that one register holds a column of the 16 rows, and multiplies it with every token, 16
//!   rows per accumulator register:
//!   - Q8/Q4 from one token on: int8 `vpdpbusd` on the codes with the tokens quantized per
//!     group of 32, each output the exact int32 dot of every group scaled and accumulated in
//!     group order ([`matmul_int8_exact_ref`]). Up to 8 tokens (decode, and batches of
//!     decoding sequences) the panel is transposed in registers as it is read; beyond, it is
//!     unpacked once into a packed copy and multiplied by tiles of 8 tokens. One arithmetic
//!     for every token count: a token's outputs are the same bits alone, in a batch of
//!     decoding sequences, or in a prompt, so a batched step sends all its rows through one
//!     pass over the weights;
//!   - f32/bf16/f16 from 32 tokens: f32 FMAs, 24 tokens per register tile, one fused
//!     multiply-add after another along the row (between 4 and 32 tokens float weights keep
//!     the 4×4-tile GEMM below, which needs no transposition).
//!
//!   `SPINDLE_GEMM=legacy` turns the panel GEMMs off (Q8/Q4 decode then takes the per-row
//!   dots, whose rounding differs: the earlier arithmetic, for A/B measurements).
//! - More tokens elsewhere (AVX2, scalar, or legacy): a blocked GEMM. Each task takes a block of
//!   rows, dequantizes it once into f32 scratch and runs a register-tiled kernel (4 tokens × 4
//!   rows on AVX-512, in passes of 1024 columns that stay in L1) over all tokens.
//!
//! No path peels for alignment: results are bit-identical wherever the weights sit.
//!
//! Rows are split across rayon threads; the SIMD path is [`Isa::active`] unless a `*_with`
//! function names one.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::quant::QuantizedActs;
#[cfg(target_arch = "x86_64")]
use crate::simd::avx512_direct::DIRECT_TOKENS;
use crate::simd::{self, scalar, Isa};
use spindle_model::gguf::quants::GgmlType;
use spindle_model::quant::view::{ggml_row_bytes, MatRef, Weights};
use spindle_model::quant::GROUP;

/// Rows per parallel task in matvec and the small-batch path (16 and 64 measured within noise
/// of each other; 16 balances small matrices better).
const ROWS_PER_TASK: usize = 16;
/// Rows per parallel task (and per dequantized f32 tile) in the GEMM.
const GEMM_ROWS_PER_TASK: usize = 64;
/// From this many tokens on, matmul runs a blocked GEMM rather than per-row dots (on the
/// active SIMD path).
pub fn gemm_min_tokens(w: &MatRef) -> usize {
    gemm_min_tokens_with(Isa::active(), w)
}

/// [`gemm_min_tokens`] on an explicit SIMD path.
pub fn gemm_min_tokens_with(isa: Isa, w: &MatRef) -> usize {
    match w.weights {
        // Rows in ggml blocks take the per-row int8 dots at every token count.
        Weights::Ggml { .. } => usize::MAX,
        Weights::Q8 { .. } | Weights::Q4 { .. } if int8_gemm(isa) => INT8_GEMM_MIN_TOKENS,
        Weights::Q8 { .. } | Weights::Q4 { .. } => QUANT_GEMM_MIN_TOKENS,
        _ => FLOAT_GEMM_MIN_TOKENS,
    }
}

/// Whether matmul of `tokens` on `isa` sees the activations as int8 ([`QuantizedActs`]):
/// always for Q8/Q4 weights, except in the f32 GEMM of the paths without the int8 GEMM, and
/// always for rows in ggml blocks.
pub fn int8_activations(isa: Isa, w: &MatRef, tokens: usize) -> bool {
    matches!(w.weights, Weights::Ggml { .. })
        || matches!(w.weights, Weights::Q8 { .. } | Weights::Q4 { .. })
            && (tokens < gemm_min_tokens_with(isa, w) || int8_gemm(isa))
}

/// Whether `isa` has the panel GEMMs (AVX-512: int8 VNNI for Q8/Q4, f32 panels for the rest).
/// `SPINDLE_GEMM=legacy` turns them off, so that prefill runs the earlier kernels (per-row
/// dots, then the f32 GEMM on dequantized weights): for A/B measurements and numerics checks.
fn panel_gemms(isa: Isa) -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled = *ENABLED.get_or_init(|| std::env::var("SPINDLE_GEMM").as_deref() != Ok("legacy"));
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        return enabled;
    }
    let _ = (isa, enabled);
    false
}

/// Whether `isa` runs Q8/Q4 prefill through the int8 GEMM.
fn int8_gemm(isa: Isa) -> bool {
    panel_gemms(isa)
}
/// Measured on a 2-thread Xeon (8192×2048): for f32/bf16 the GEMM beats per-row dots from 4
/// tokens (99 vs 57 GFLOP/s for f32); for Q8/Q4 the int8 dots win up to 16 tokens (109 vs 92
/// GFLOP/s) and lose from 64 (100 vs 127).
const FLOAT_GEMM_MIN_TOKENS: usize = 4;
const QUANT_GEMM_MIN_TOKENS: usize = 32;
/// From this many tokens on, f32/bf16/f16 weights go through the f32 panel GEMM (AVX-512)
/// rather than the 4×4-tile GEMM, whose lack of weight packing wins for fewer tokens.
const FLOAT_PANEL_MIN_TOKENS: usize = 32;
/// Q8/Q4 on AVX-512 VNNI take the int8 GEMM from one token on: its arithmetic is the one
/// every token count shares (so a decoding sequence's logits are the same bits alone and in a
/// batch, and a batch shares each panel's unpacking across its rows), and up to
/// [`DIRECT_TOKENS`] tokens it reads the weights in place rather than packing them first.
const INT8_GEMM_MIN_TOKENS: usize = 1;
/// Below this many multiply-adds a call stays on the calling thread.
const SERIAL_WORK: usize = 1 << 15;

/// Calls `$f` from the module of `$isa`.
macro_rules! dispatch {
    ($isa:expr, $f:ident($($arg:expr),*)) => {
        match $isa {
            // SAFETY: `*_with` asserted `isa.available()`, so the CPU has the target features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { simd::avx512::$f($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { simd::avx2::$f($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe { simd::neon::$f($($arg),*) },
            _ => scalar::$f($($arg),*),
        }
    };
}

/// The tokens in the form the weight format's dot product reads.
enum Acts<'x> {
    F32(&'x [f32]),
    Int8(QuantizedActs),
}

impl<'x> Acts<'x> {
    fn new(isa: Isa, w: &MatRef, x: &'x [f32]) -> Self {
        match w.weights {
            Weights::Q8 { .. } | Weights::Q4 { .. } | Weights::Ggml { .. } => {
                Acts::Int8(quantize_acts(isa, x, w.cols))
            }
            _ => Acts::F32(x),
        }
    }
}

/// `x [tokens, cols]` quantized per group of 32, bit-identical to [`QuantizedActs::quantize`];
/// tokens in parallel when there are many.
pub fn quantize_acts(isa: Isa, x: &[f32], cols: usize) -> QuantizedActs {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa; // only AVX-512 has its own quantizer
    let mut acts = QuantizedActs::zeroed(x.len(), cols);
    type Part<'a> = (
        ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [f32])),
        &'a mut [i32],
    );
    let task = |(((x, qs), (d, sd)), sums): Part| {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: callers pass an `isa` the CPU runs (asserted in the `*_with` entries).
            return unsafe { simd::avx512::quantize_acts(x, qs, d, sd, sums) };
        }
        crate::quant::quantize_acts_ref(x, qs, d, sd, sums)
    };
    // 64 tokens' worth of 2048 columns per task.
    let chunk = (1usize << 17) / cols.max(1) * cols;
    let chunk = chunk.max(cols);
    let gchunk = chunk / GROUP;
    let parts = x
        .chunks(chunk)
        .zip(acts.qs.chunks_mut(chunk))
        .zip(acts.d.chunks_mut(gchunk).zip(acts.sd.chunks_mut(gchunk)))
        .zip(acts.sums.chunks_mut(gchunk));
    if x.len() > chunk {
        let parts: Vec<_> = parts.collect();
        parts.into_par_iter().for_each(task);
    } else {
        parts.for_each(task);
    }
    acts
}

/// Weight row `r` dotted with token `t`.
#[inline]
fn row_dot(isa: Isa, w: &MatRef, r: usize, acts: &Acts, t: usize) -> f32 {
    let cols = w.cols;
    let (a, b) = (r * cols, (r + 1) * cols);
    let (ga, gb) = (a / GROUP, b / GROUP);
    match (w.weights, acts) {
        (Weights::F32(d), Acts::F32(x)) => {
            dispatch!(isa, dot_f32(&d[a..b], &x[t * cols..(t + 1) * cols]))
        }
        (Weights::Bf16(d), Acts::F32(x)) => {
            dispatch!(isa, dot_bf16(&d[a..b], &x[t * cols..(t + 1) * cols]))
        }
        (Weights::F16(d), Acts::F32(x)) => {
            dispatch!(isa, dot_f16(&d[a..b], &x[t * cols..(t + 1) * cols]))
        }
        (Weights::Q8 { qs, scales }, Acts::Int8(q)) => {
            let (xq, xd, xsd) = q.token(t);
            dispatch!(isa, dot_q8(&qs[a..b], &scales[ga..gb], xq, xd, xsd))
        }
        (Weights::Q4 { qs, scales }, Acts::Int8(q)) => {
            let (xq, xd, xsd) = q.token(t);
            dispatch!(isa, dot_q4(&qs[a / 2..b / 2], &scales[ga..gb], xq, xd, xsd))
        }
        (Weights::Ggml { ty, blocks }, Acts::Int8(q)) => {
            let (xq, xd, xsd) = q.token(t);
            let rb = ggml_row_bytes(ty, cols);
            dot_ggml(isa, ty, &blocks[r * rb..(r + 1) * rb], xq, xd, xsd)
        }
        _ => unreachable!("Acts::new picks the activation form from the weight format"),
    }
}

/// Weight row `r` dotted with every token of `acts` (`out [tokens]`), each value the one
/// [`row_dot`] gives. On AVX-512 a Q8/Q4 row's codes are unpacked once for several tokens, as
/// are a K-quant row's superblocks on AVX2 and AVX-512.
#[inline]
fn row_dots(isa: Isa, w: &MatRef, r: usize, acts: &Acts, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        let (a, b) = (r * w.cols, (r + 1) * w.cols);
        let (ga, gb) = (a / GROUP, b / GROUP);
        match (w.weights, acts) {
            (Weights::Q4 { qs, scales }, Acts::Int8(q)) => {
                // SAFETY: isa is Avx512, which the `*_with` entry points asserted is available.
                return unsafe {
                    simd::avx512::dots_q4(&qs[a / 2..b / 2], &scales[ga..gb], q, out)
                };
            }
            (Weights::Q8 { qs, scales }, Acts::Int8(q)) => {
                // SAFETY: as above.
                return unsafe { simd::avx512::dots_q8(&qs[a..b], &scales[ga..gb], q, out) };
            }
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2 | Isa::Avx512, Weights::Ggml { ty, blocks }, Acts::Int8(q)) =
        (isa, w.weights, acts)
    {
        let rb = ggml_row_bytes(ty, w.cols);
        // SAFETY: callers pass an `isa` the CPU runs, and AVX-512 implies AVX2 + FMA + F16C.
        return unsafe { simd::avx2_ggml::dots_ggml(ty, &blocks[r * rb..(r + 1) * rb], q, out) };
    }
    for (t, o) in out.iter_mut().enumerate() {
        *o = row_dot(isa, w, r, acts, t);
    }
}

/// One row in ggml blocks of `ty` dotted with a token quantized per group of 32, on `isa`
/// (AVX2 and AVX-512 run the AVX2 kernel; the others the reference): bit for bit
/// [`crate::ggml::dot_ggml_ref`].
pub fn dot_ggml(isa: Isa, ty: GgmlType, row: &[u8], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    match isa {
        // SAFETY: callers pass an `isa` the CPU runs, and AVX-512 implies AVX2 + FMA + F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => unsafe { simd::avx2_ggml::dot_ggml(ty, row, xq, xd, xsd) },
        _ => crate::ggml::dot_ggml_ref(ty, row, xq, xd, xsd),
    }
}

/// Σ a[i]·b[i] on the active SIMD path (the same summation order on every alignment).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot product lengths");
    // `Isa::active` only returns paths this CPU runs (no check per call: attention calls this
    // once per key).
    dispatch!(Isa::active(), dot_f32(a, b))
}

/// `y[i] += s·x[i]` on the active SIMD path.
pub fn axpy(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy lengths");
    // As in `dot`: the active path is one this CPU runs.
    dispatch!(Isa::active(), axpy_f32(y, s, x))
}

/// [`axpy`] on an explicit SIMD path; panics if this CPU lacks it.
pub fn axpy_with(isa: Isa, y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy lengths");
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernels");
    dispatch!(isa, axpy_f32(y, s, x))
}

/// [`dot`] on an explicit SIMD path; panics if this CPU lacks it.
pub fn dot_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot product lengths");
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernels");
    dispatch!(isa, dot_f32(a, b))
}

/// y[r] = Σ_c W[r, c]·x[c]. `x` has `cols` elements, `y` has `rows`.
pub fn matvec(w: &MatRef, x: &[f32], y: &mut [f32]) {
    matvec_with(Isa::active(), w, x, y)
}

/// [`matvec`] on an explicit SIMD path; panics if this CPU lacks it.
pub fn matvec_with(isa: Isa, w: &MatRef, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), w.cols, "matvec input length");
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernels");
    if path_for(isa, w, 1) == Path::Int8Gemm {
        return gemm_int8(isa, w, x, 1, y);
    }
    let acts = Acts::new(isa, w, x);
    // About four tasks per thread: enough to balance, few enough that scheduling stays small
    // next to the row dots (a decode step runs hundreds of these matvecs).
    let rows_per_task = (w.rows / (4 * rayon::current_num_threads())).max(ROWS_PER_TASK);
    let task = |(chunk, ys): (usize, &mut [f32])| {
        let first = chunk * rows_per_task;
        let rows = first..first + ys.len();
        let groups = w.cols / GROUP;
        // Quantized rows walk their codes and scales in step (the per-row index arithmetic
        // of `row_dot` showed in decode profiles); the same kernel runs on every row.
        match (w.weights, &acts) {
            (Weights::Q4 { qs, scales }, Acts::Int8(q)) => {
                let (xq, xd, xsd) = q.token(0);
                let rb = w.cols / 2;
                let codes = qs[rows.start * rb..rows.end * rb].chunks_exact(rb);
                let scales = scales[rows.start * groups..rows.end * groups].chunks_exact(groups);
                for ((out, wq), ws) in ys.iter_mut().zip(codes).zip(scales) {
                    *out = dispatch!(isa, dot_q4(wq, ws, xq, xd, xsd));
                }
            }
            (Weights::Ggml { ty, blocks }, Acts::Int8(q)) => {
                let (xq, xd, xsd) = q.token(0);
                let rb = ggml_row_bytes(ty, w.cols);
                let rows = blocks[rows.start * rb..rows.end * rb].chunks_exact(rb);
                for (out, row) in ys.iter_mut().zip(rows) {
                    *out = dot_ggml(isa, ty, row, xq, xd, xsd);
                }
            }
            (Weights::Q8 { qs, scales }, Acts::Int8(q)) => {
                let (xq, xd, xsd) = q.token(0);
                let rb = w.cols;
                let codes = qs[rows.start * rb..rows.end * rb].chunks_exact(rb);
                let scales = scales[rows.start * groups..rows.end * groups].chunks_exact(groups);
                for ((out, wq), ws) in ys.iter_mut().zip(codes).zip(scales) {
                    *out = dispatch!(isa, dot_q8(wq, ws, xq, xd, xsd));
                }
            }
            _ => {
                for (i, out) in ys.iter_mut().enumerate() {
                    *out = row_dot(isa, w, first + i, &acts, 0);
                }
            }
        }
    };
    if w.rows * w.cols < SERIAL_WORK {
        y.chunks_mut(rows_per_task).enumerate().for_each(task);
    } else {
        y.par_chunks_mut(rows_per_task).enumerate().for_each(task);
    }
}

/// Y[t, r] = Σ_c W[r, c]·X[t, c] for `tokens` rows of X (`[tokens, cols]` → `[tokens, rows]`).
pub fn matmul(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    matmul_with(Isa::active(), w, x, tokens, y)
}

/// [`matmul`] on an explicit SIMD path; panics if this CPU lacks it.
pub fn matmul_with(isa: Isa, w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernels");
    matmul_path(isa, w, x, tokens, path_for(isa, w, tokens), y)
}

/// The kernel [`matmul`] runs for a number of tokens. Within one path every token's outputs
/// are computed the same way whatever the other tokens of the call are (each token's
/// activations are quantized on their own, each output is its own sum in a fixed order), so a
/// token's result depends only on its row of `x` and on the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    /// Per-row dot products (one token: [`matvec`]).
    Dots,
    /// The int8 panel GEMM (Q8/Q4 on AVX-512 VNNI, every token count).
    Int8Gemm,
    /// The f32 panel GEMM (AVX-512).
    F32Panels,
    /// The blocked GEMM on f32 (dequantized) row tiles.
    BlockGemm,
}

/// The path [`matmul_with`] takes for `tokens` tokens of `w` on `isa`.
pub fn path_for(isa: Isa, w: &MatRef, tokens: usize) -> Path {
    let quantized = matches!(w.weights, Weights::Q8 { .. } | Weights::Q4 { .. });
    if quantized && int8_gemm(isa) {
        Path::Int8Gemm
    } else if tokens == 1 || tokens < gemm_min_tokens_with(isa, w) {
        Path::Dots
    } else if panel_gemms(isa) && tokens >= FLOAT_PANEL_MIN_TOKENS {
        Path::F32Panels
    } else {
        Path::BlockGemm
    }
}

/// Y = X·Wᵀ for rows of X that come in groups (`groups[i]` consecutive rows each: the
/// sequences of a batched step). Every group's rows get exactly the values [`matmul`] gives
/// that group alone, bit for bit: each group's rows go to the path `matmul` would take for
/// that many tokens. Groups of one path share one pass over W, so a step of many decoding
/// sequences reads each weight once.
pub fn matmul_groups(w: &MatRef, x: &[f32], groups: &[usize], y: &mut [f32]) {
    matmul_groups_with(Isa::active(), w, x, groups, y)
}

/// [`matmul_groups`] on an explicit SIMD path; panics if this CPU lacks it.
pub fn matmul_groups_with(isa: Isa, w: &MatRef, x: &[f32], groups: &[usize], y: &mut [f32]) {
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernels");
    let tokens: usize = groups.iter().sum();
    assert_eq!(x.len(), tokens * w.cols, "matmul input length");
    assert_eq!(y.len(), tokens * w.rows, "matmul output length");
    if let [n] = groups {
        // One sequence: exactly `matmul` (no bookkeeping on the batch-of-one path).
        return matmul_path(isa, w, x, tokens, path_for(isa, w, *n), y);
    }
    let paths: Vec<Path> = groups.iter().map(|&n| path_for(isa, w, n)).collect();
    let mut distinct = paths.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if let [path] = distinct[..] {
        return matmul_path(isa, w, x, tokens, path, y);
    }
    // Rows of each path gathered, multiplied, and put back in place.
    for path in distinct {
        let mut rows = Vec::new();
        let mut first = 0;
        for (&n, &p) in groups.iter().zip(&paths) {
            if p == path {
                rows.push(first..first + n);
            }
            first += n;
        }
        let count: usize = rows.iter().map(|r| r.len()).sum();
        let mut xs = Vec::with_capacity(count * w.cols);
        for r in &rows {
            xs.extend_from_slice(&x[r.start * w.cols..r.end * w.cols]);
        }
        let mut ys = vec![0.0f32; count * w.rows];
        matmul_path(isa, w, &xs, count, path, &mut ys);
        let mut at = 0;
        for r in rows {
            let len = r.len() * w.rows;
            y[r.start * w.rows..r.end * w.rows].copy_from_slice(&ys[at..at + len]);
            at += len;
        }
    }
}

/// Y = X·Wᵀ for `tokens` rows of X by `path` (`isa` checked by the caller).
fn matmul_path(isa: Isa, w: &MatRef, x: &[f32], tokens: usize, path: Path, y: &mut [f32]) {
    assert_eq!(x.len(), tokens * w.cols, "matmul input length");
    assert_eq!(y.len(), tokens * w.rows, "matmul output length");
    match path {
        Path::Dots if tokens == 1 => return matvec_with(isa, w, x, y),
        Path::Int8Gemm => return gemm_int8(isa, w, x, tokens, y),
        Path::F32Panels => return gemm_f32_panels(isa, w, x, tokens, y),
        Path::Dots | Path::BlockGemm => {}
    }
    // Each task owns a contiguous block of Yᵀ [rows, tokens]; transposed at the end.
    let mut yt = vec![0.0f32; w.rows * tokens];
    if path == Path::Dots {
        let acts = Acts::new(isa, w, x);
        let task = |(chunk, out): (usize, &mut [f32])| {
            let first = chunk * ROWS_PER_TASK;
            for (i, row_out) in out.chunks_mut(tokens).enumerate() {
                row_dots(isa, w, first + i, &acts, row_out);
            }
        };
        if w.rows * w.cols * tokens < SERIAL_WORK {
            yt.chunks_mut(ROWS_PER_TASK * tokens)
                .enumerate()
                .for_each(task);
        } else {
            yt.par_chunks_mut(ROWS_PER_TASK * tokens)
                .enumerate()
                .for_each(task);
        }
    } else {
        gemm(isa, w, x, tokens, &mut yt);
    }
    transpose(&yt, w.rows, tokens, y);
}

thread_local! {
    /// Each worker's dequantized row tile, reused across calls.
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Yᵀ = W·Xᵀ by row blocks: `yt [rows, tokens]`.
fn gemm(isa: Isa, w: &MatRef, x: &[f32], tokens: usize, yt: &mut [f32]) {
    let cols = w.cols;
    yt.par_chunks_mut(GEMM_ROWS_PER_TASK * tokens)
        .enumerate()
        .for_each(|(chunk, out)| {
            let (first, rows) = (chunk * GEMM_ROWS_PER_TASK, out.len() / tokens);
            if let Weights::F32(d) = w.weights {
                let block = &d[first * cols..(first + rows) * cols];
                return dispatch!(isa, gemm_block(x, block, cols, out));
            }
            TILE.with(|tile| {
                let mut tile = tile.borrow_mut();
                tile.resize(rows * cols, 0.0);
                for (i, row) in tile.chunks_exact_mut(cols).enumerate() {
                    w.row_to_f32(first + i, row);
                }
                dispatch!(isa, gemm_block(x, &tile, cols, out))
            })
        });
}

/// Runs `panel(r0, n, out)` for every panel of 16 rows (`n` ≤ 16 of them from row `r0`),
/// in parallel, each writing `out [tokens, 16]`; scatters the panels into `y [tokens, rows]`.
#[cfg(target_arch = "x86_64")]
fn by_panels(
    rows: usize,
    cols: usize,
    tokens: usize,
    y: &mut [f32],
    panel: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    use simd::avx512::PANEL_ROWS;
    let panels = rows.div_ceil(PANEL_ROWS);
    let mut buf = vec![0.0f32; panels * PANEL_ROWS * tokens];
    let task = |(p, out): (usize, &mut [f32])| {
        let r0 = p * PANEL_ROWS;
        panel(r0, PANEL_ROWS.min(rows - r0), out)
    };
    let chunk = PANEL_ROWS * tokens;
    if rows * cols * tokens < SERIAL_WORK {
        buf.chunks_mut(chunk).enumerate().for_each(task);
    } else {
        // About four tasks per thread, as in `matvec_with` (a decode step runs hundreds of
        // these calls, most of them small).
        let per_task = (panels / (4 * rayon::current_num_threads())).max(1);
        buf.par_chunks_mut(chunk)
            .with_min_len(per_task)
            .enumerate()
            .for_each(task);
    }
    let scatter = |(t, yt): (usize, &mut [f32])| {
        for (p, ys) in yt.chunks_mut(PANEL_ROWS).enumerate() {
            let src = &buf[(p * tokens + t) * PANEL_ROWS..];
            ys.copy_from_slice(&src[..ys.len()]);
        }
    };
    if rows * tokens < SERIAL_WORK {
        y.chunks_mut(rows).enumerate().for_each(scatter);
    } else {
        y.par_chunks_mut(rows).enumerate().for_each(scatter);
    }
}

/// Y = X·Wᵀ for Q8/Q4 weights with int8 activations on AVX-512 VNNI: 16-row panels are
/// unpacked once each and multiplied with every token (`simd::avx512::gemm_q_panel`), or for
/// up to [`DIRECT_TOKENS`] tokens read in place (`simd::avx512_direct::q_panel_direct`, the
/// same arithmetic bit for bit). Each output: per group the exact int32 dot, then
/// `acc = fma(f32(isum)·d_x, d_w, acc)` in group order ([`matmul_int8_exact_ref`]).
fn gemm_int8(isa: Isa, w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use simd::avx512::{gemm_q_panel, pack_panel, Panel, QCodes, PANEL_ROWS};
        use simd::avx512_direct::q_panel_direct;
        thread_local! {
            static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
        }
        assert_eq!(isa, Isa::Avx512);
        let cols = w.cols;
        let acts = quantize_acts(isa, x, cols);
        let offset = match w.weights {
            Weights::Q8 { .. } => 128,
            _ => 8,
        };
        let corr: Vec<i32> = acts.sums.iter().map(|&s| -offset * s).collect();
        by_panels(w.rows, cols, tokens, y, |r0, n, out| {
            let (a, b) = (r0 * cols, (r0 + n) * cols);
            let (codes, scales) = match w.weights {
                Weights::Q8 { qs, scales } => (QCodes::Q8(&qs[a..b]), scales),
                Weights::Q4 { qs, scales } => (QCodes::Q4(&qs[a / 2..b / 2]), scales),
                _ => unreachable!("gemm_int8 takes Q8/Q4 weights"),
            };
            let scales = &scales[a / GROUP..b / GROUP];
            if n == PANEL_ROWS && tokens <= DIRECT_TOKENS {
                // SAFETY: isa is Avx512 and `matmul_with` asserted it is available.
                return unsafe { q_panel_direct(codes, scales, &acts, &corr, out) };
            }
            PANEL.with(|panel| {
                let mut panel = panel.borrow_mut();
                // SAFETY: isa is Avx512 and `matmul_with` asserted it is available.
                unsafe {
                    pack_panel(codes, scales, n, cols, &mut panel);
                    gemm_q_panel(&panel, &acts, &corr, out);
                }
            });
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no int8 GEMM on {isa:?}: {w:?} {x:?} {tokens} {y:?}")
}

/// Y = X·Wᵀ in f32 on AVX-512 by panels: 16 weight rows transposed into one register per
/// column (converted to f32 on the way), times blocks of up to 24 tokens packed column-major,
/// 24 accumulators of 16 rows each (`simd::avx512::gemm_f32_panel`).
fn gemm_f32_panels(isa: Isa, w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use simd::avx512::{gemm_f32_panel, pack_f32_panel, FRows, FT};
        use std::arch::x86_64::__m512;
        thread_local! {
            static WP: RefCell<(Vec<__m512>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
        }
        assert_eq!(isa, Isa::Avx512);
        let cols = w.cols;
        // Tokens by blocks of FT, each block [cols][n].
        let mut xp = vec![0.0f32; tokens * cols];
        let pack = |(b, dst): (usize, &mut [f32])| {
            let n = dst.len() / cols;
            let src = &x[b * FT * cols..][..n * cols];
            for (t, row) in src.chunks_exact(cols).enumerate() {
                for (k, &v) in row.iter().enumerate() {
                    dst[k * n + t] = v;
                }
            }
        };
        if tokens * cols > 1 << 16 {
            xp.par_chunks_mut(FT * cols).enumerate().for_each(pack);
        } else {
            xp.chunks_mut(FT * cols).enumerate().for_each(pack);
        }
        by_panels(w.rows, cols, tokens, y, |r0, n, out| {
            let (a, b) = (r0 * cols, (r0 + n) * cols);
            WP.with(|scratch| {
                let (wp, rows_f32) = &mut *scratch.borrow_mut();
                let src = match w.weights {
                    Weights::F32(d) => FRows::F32(&d[a..b]),
                    Weights::Bf16(d) => FRows::Bf16(&d[a..b]),
                    Weights::F16(d) => FRows::F16(&d[a..b]),
                    _ => {
                        rows_f32.resize(n * cols, 0.0);
                        for (i, row) in rows_f32.chunks_exact_mut(cols).enumerate() {
                            w.row_to_f32(r0 + i, row);
                        }
                        FRows::F32(rows_f32)
                    }
                };
                // SAFETY: isa is Avx512 and `matmul_with` asserted it is available.
                unsafe {
                    pack_f32_panel(src, n, cols, wp);
                    gemm_f32_panel(wp, &xp, cols, out);
                }
            });
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no f32 panel GEMM on {isa:?}: {w:?} {x:?} {tokens} {y:?}")
}

/// `y [cols_in, rows_in]` = transpose of `a [rows_in, cols_in]`, in cache-sized blocks.
fn transpose(a: &[f32], rows_in: usize, cols_in: usize, y: &mut [f32]) {
    const B: usize = 32;
    for r0 in (0..rows_in).step_by(B) {
        for c0 in (0..cols_in).step_by(B) {
            for r in r0..(r0 + B).min(rows_in) {
                for c in c0..(c0 + B).min(cols_in) {
                    y[c * rows_in + r] = a[r * cols_in + c];
                }
            }
        }
    }
}

/// Scalar reference: the plain triple loop on dequantized weights, accumulated in f64.
pub fn matmul_ref(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    let mut row = vec![0.0f32; w.cols];
    for r in 0..w.rows {
        w.row_to_f32(r, &mut row);
        for t in 0..tokens {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            let acc: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
            y[t * w.rows + r] = acc as f32;
        }
    }
}

/// Scalar reference for Q8/Q4 with the activations quantized exactly as the fast path does.
pub fn matmul_quantized_ref(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    let acts = Acts::Int8(QuantizedActs::quantize(x, w.cols));
    for r in 0..w.rows {
        for t in 0..tokens {
            y[t * w.rows + r] = row_dot(Isa::Scalar, w, r, &acts, t);
        }
    }
}

/// Scalar reference of the int8 GEMM's arithmetic (Q8/Q4 on AVX-512 VNNI, every token count),
/// which the fast path must match bit for bit: activations quantized per token
/// ([`QuantizedActs::quantize`]); for each output, per group of 32 the exact integer dot
/// `isum` of the signed codes with the token's codes, then `acc = fma(f32(isum)·d_x, d_w, acc)`
/// in group order from zero.
pub fn matmul_int8_exact_ref(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    use spindle_model::quant::blocks::f16_to_f32;
    use spindle_model::quant::Q4_GROUP_BYTES;
    let (rows, cols) = (w.rows, w.cols);
    let groups = cols / GROUP;
    assert!(x.len() == tokens * cols && y.len() == tokens * rows);
    let acts = QuantizedActs::quantize(x, cols);
    let mut codes = vec![0i32; cols];
    for r in 0..rows {
        let scales = match w.weights {
            Weights::Q8 { qs, scales } => {
                let row = &qs[r * cols..(r + 1) * cols];
                codes.iter_mut().zip(row).for_each(|(c, &q)| *c = q as i32);
                &scales[r * groups..(r + 1) * groups]
            }
            Weights::Q4 { qs, scales } => {
                let row = &qs[r * cols / 2..(r + 1) * cols / 2];
                for (g, bytes) in row.chunks_exact(Q4_GROUP_BYTES).enumerate() {
                    for (j, &b) in bytes.iter().enumerate() {
                        codes[g * GROUP + j] = (b & 0xF) as i32 - 8;
                        codes[g * GROUP + j + Q4_GROUP_BYTES] = (b >> 4) as i32 - 8;
                    }
                }
                &scales[r * groups..(r + 1) * groups]
            }
            _ => panic!("matmul_int8_exact_ref takes Q8/Q4 weights"),
        };
        for t in 0..tokens {
            let (xq, xd, _) = acts.token(t);
            let mut acc = 0.0f32;
            for g in 0..groups {
                let span = g * GROUP..(g + 1) * GROUP;
                let isum: i32 = codes[span.clone()]
                    .iter()
                    .zip(&xq[span])
                    .map(|(&c, &q)| c * q as i32)
                    .sum();
                acc = (isum as f32 * xd[g]).mul_add(f16_to_f32(scales[g]), acc);
            }
            y[t * rows + r] = acc;
        }
    }
}

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;
