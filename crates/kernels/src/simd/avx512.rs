//! AVX-512 (F, BW, VNNI) kernels. Callers reach them only through [`super::Isa::Avx512`] after
//! [`super::Isa::available`] confirmed the features.
//!
//! Quantized dots use `vpdpbusd` (unsigned × signed bytes summed into i32 lanes, two groups of
//! 32 per register): Q8 codes are made unsigned by flipping the sign bit (w + 128), Q4 codes
//! are unsigned already; the constant offsets (128 and 8) times Σx are subtracted at the end
//! from the activations' scaled sums `sd`.

use std::arch::x86_64::*;

use crate::quant::QuantizedActs;
use spindle_model::quant::{GROUP, Q4_GROUP_BYTES};

/// Sixteen bf16 values at `p` as f32 (the caller guarantees 32 readable bytes).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_bf16(p: *const u16) -> __m512 {
    let h = _mm256_loadu_si256(p as *const __m256i);
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
}

/// Sixteen f16 values at `p` as f32 (the caller guarantees 32 readable bytes).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_f16(p: *const u16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// Σ w·x where `$load(p)` gives 16 weights at `p` as f32 and `$scalar` converts one.
macro_rules! dot_f32_body {
    ($w:ident, $x:ident, $load:path, $scalar:expr) => {{
        assert_eq!($w.len(), $x.len());
        let n = $w.len();
        let (wp, xp) = ($w.as_ptr(), $x.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        // No alignment peeling: the summation order must not depend on where the
        // weights sit in memory, so results are bit-identical across layouts and residencies.
        let mut i = 0;
        // SAFETY: every load reads [i, i+16) with i + 16 <= n for both slices (unaligned loads).
        unsafe {
            while i + 64 <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let j = i + 16 * k;
                    *a = _mm512_fmadd_ps($load(wp.add(j)), _mm512_loadu_ps(xp.add(j)), *a);
                }
                i += 64;
            }
            while i + 16 <= n {
                acc[0] = _mm512_fmadd_ps($load(wp.add(i)), _mm512_loadu_ps(xp.add(i)), acc[0]);
                i += 16;
            }
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut s = _mm512_reduce_add_ps(sum);
        for j in i..n {
            s += $scalar($w[j]) * $x[j];
        }
        s
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, _mm512_loadu_ps, |v: f32| v)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, load_bf16, spindle_model::quant::view::bf16_to_f32)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, load_f16, |v: u16| half::f16::from_bits(v).to_f32())
}

/// The shared loop of the quantized dots: `$codes(pair)` yields the unsigned codes of groups
/// `2·pair` and `2·pair + 1` as one register; returns (Σ_g d_w·d_x·isum_g, Σ_g d_w·sd_g)
/// over whole sets of 16 groups, plus the number of groups done.
macro_rules! quant_dot_body {
    ($scales:ident, $xq:ident, $xd:ident, $xsd:ident, $codes:expr) => {{
        let groups = $scales.len();
        let done = groups / 16 * 16;
        let mut acc = _mm512_setzero_ps();
        let mut offset = _mm512_setzero_ps();
        let (pair_lanes, two) = (
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_set1_epi32(2),
        );
        let mut g0 = 0;
        while g0 < done {
            // SAFETY: groups g0..g0+16 are in bounds of scales, xd and xsd (g0 + 16 <= groups).
            let (dw, xd, xsd) = unsafe {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(
                        $scales.as_ptr().add(g0) as *const __m256i
                    )),
                    _mm512_loadu_ps($xd.as_ptr().add(g0)),
                    _mm512_loadu_ps($xsd.as_ptr().add(g0)),
                )
            };
            let d = _mm512_mul_ps(dw, xd);
            offset = _mm512_fmadd_ps(dw, xsd, offset);
            let mut idx = pair_lanes;
            for p in 0..8 {
                let g = g0 + 2 * p;
                let w = $codes(g);
                // SAFETY: activations of groups g, g+1 are bytes [32g, 32g+64) of xq, in bounds.
                let x = unsafe { _mm512_loadu_si512($xq.as_ptr().add(g * GROUP) as *const _) };
                let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
                let scale = _mm512_permutexvar_ps(idx, d);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc);
                idx = _mm512_add_epi32(idx, two);
            }
            g0 += 16;
        }
        (
            _mm512_reduce_add_ps(acc),
            _mm512_reduce_add_ps(offset),
            done,
        )
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q8(qs: &[i8], scales: &[u16], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(qs.len() == groups * GROUP && xq.len() == qs.len());
    assert!(xd.len() == groups && xsd.len() == groups);
    let flip = _mm512_set1_epi8(-128);
    let codes = |g: usize| {
        // SAFETY: groups g, g+1 are bytes [32g, 32g+64) of qs, in bounds (g + 2 <= groups).
        let w = unsafe { _mm512_loadu_si512(qs.as_ptr().add(g * GROUP) as *const _) };
        _mm512_xor_si512(w, flip)
    };
    let (sum, offset, done) = quant_dot_body!(scales, xq, xd, xsd, codes);
    let a = done * GROUP;
    let tail = if done == scales.len() {
        0.0
    } else {
        super::scalar::dot_q8(&qs[a..], &scales[done..], &xq[a..], &xd[done..], &[])
    };
    sum - 128.0 * offset + tail
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dot_q4(qs: &[u8], scales: &[u16], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(qs.len() == groups * Q4_GROUP_BYTES && xq.len() == groups * GROUP);
    assert!(xd.len() == groups && xsd.len() == groups);
    let low = _mm256_set1_epi8(0x0F);
    let codes = |g: usize| {
        // SAFETY: groups g, g+1 are bytes [16g, 16g+32) of qs, in bounds (g + 2 <= groups).
        let b =
            unsafe { _mm256_loadu_si256(qs.as_ptr().add(g * Q4_GROUP_BYTES) as *const __m256i) };
        let lo = _mm256_and_si256(b, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
        // [lo.0, lo.1, hi.0, hi.1] → [lo.0, hi.0, lo.1, hi.1]: group g's 32 codes, then g+1's.
        let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
    };
    let (sum, offset, done) = quant_dot_body!(scales, xq, xd, xsd, codes);
    let (a, b) = (done * GROUP, done * Q4_GROUP_BYTES);
    // Most rows have no tail: skip the call (it shows in decode profiles).
    let tail = if done == scales.len() {
        0.0
    } else {
        super::scalar::dot_q4(&qs[b..], &scales[done..], &xq[a..], &xd[done..], &[])
    };
    sum - 8.0 * offset + tail
}

/// [`quant_dot_body`] for `T` tokens at once: the codes of each pair of groups are unpacked
/// once and dotted with every token. Each token's sums are formed by exactly the operations
/// (and in the order) the single-token body uses, so each is bit-identical to it.
macro_rules! quant_dots_body {
    ($T:ident, $scales:ident, $acts:ident, $t0:ident, $codes:expr) => {{
        let groups = $scales.len();
        let cols = $acts.cols;
        assert!(cols == groups * GROUP && ($t0 + $T) * cols <= $acts.qs.len());
        let done = groups / 16 * 16;
        let mut acc = [_mm512_setzero_ps(); $T];
        let mut offset = [_mm512_setzero_ps(); $T];
        let (pair_lanes, two) = (
            _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
            _mm512_set1_epi32(2),
        );
        let xq: [*const i8; $T] = std::array::from_fn(|t| $acts.qs[($t0 + t) * cols..].as_ptr());
        let xd: [*const f32; $T] = std::array::from_fn(|t| $acts.d[($t0 + t) * groups..].as_ptr());
        let xsd: [*const f32; $T] =
            std::array::from_fn(|t| $acts.sd[($t0 + t) * groups..].as_ptr());
        let mut g0 = 0;
        while g0 < done {
            // SAFETY: groups g0..g0+16 are in bounds of scales and of every token's d and sd
            // (g0 + 16 <= groups, tokens t0..t0+T exist: asserted above).
            let dw = unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(
                    $scales.as_ptr().add(g0) as *const __m256i
                ))
            };
            let mut d = [_mm512_setzero_ps(); $T];
            for t in 0..$T {
                // SAFETY: as above.
                let (xd, xsd) = unsafe {
                    (
                        _mm512_loadu_ps(xd[t].add(g0)),
                        _mm512_loadu_ps(xsd[t].add(g0)),
                    )
                };
                d[t] = _mm512_mul_ps(dw, xd);
                offset[t] = _mm512_fmadd_ps(dw, xsd, offset[t]);
            }
            let mut idx = pair_lanes;
            for p in 0..8 {
                let g = g0 + 2 * p;
                let w = $codes(g);
                for t in 0..$T {
                    // SAFETY: activations of groups g, g+1 are bytes [32g, 32g+64) of the
                    // token's codes, in bounds.
                    let x = unsafe { _mm512_loadu_si512(xq[t].add(g * GROUP) as *const _) };
                    let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, x);
                    let scale = _mm512_permutexvar_ps(idx, d[t]);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t]);
                }
                idx = _mm512_add_epi32(idx, two);
            }
            g0 += 16;
        }
        let sums: [f32; $T] = std::array::from_fn(|t| _mm512_reduce_add_ps(acc[t]));
        let offsets: [f32; $T] = std::array::from_fn(|t| _mm512_reduce_add_ps(offset[t]));
        (sums, offsets, done)
    }};
}

/// [`dot_q4`] of one row (`qs`, `scales`) with tokens `t0..t0+T` of `acts`, into `out [T]`;
/// each value bit-identical to `dot_q4` of that token.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn dots_q4_tile<const T: usize>(
    qs: &[u8],
    scales: &[u16],
    acts: &QuantizedActs,
    t0: usize,
    out: &mut [f32],
) {
    let groups = scales.len();
    assert!(qs.len() == groups * Q4_GROUP_BYTES && out.len() == T);
    let low = _mm256_set1_epi8(0x0F);
    let codes = |g: usize| {
        // SAFETY: groups g, g+1 are bytes [16g, 16g+32) of qs, in bounds (g + 2 <= groups).
        let b =
            unsafe { _mm256_loadu_si256(qs.as_ptr().add(g * Q4_GROUP_BYTES) as *const __m256i) };
        let lo = _mm256_and_si256(b, low);
        let hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
        let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
    };
    let (sums, offsets, done) = quant_dots_body!(T, scales, acts, t0, codes);
    let (a, b) = (done * GROUP, done * Q4_GROUP_BYTES);
    for t in 0..T {
        let tail = if done == groups {
            0.0
        } else {
            let (xq, xd, _) = acts.token(t0 + t);
            super::scalar::dot_q4(&qs[b..], &scales[done..], &xq[a..], &xd[done..], &[])
        };
        out[t] = sums[t] - 8.0 * offsets[t] + tail;
    }
}

/// [`dot_q8`] of one row with tokens `t0..t0+T` of `acts`, as [`dots_q4_tile`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn dots_q8_tile<const T: usize>(
    qs: &[i8],
    scales: &[u16],
    acts: &QuantizedActs,
    t0: usize,
    out: &mut [f32],
) {
    let groups = scales.len();
    assert!(qs.len() == groups * GROUP && out.len() == T);
    let flip = _mm512_set1_epi8(-128);
    let codes = |g: usize| {
        // SAFETY: groups g, g+1 are bytes [32g, 32g+64) of qs, in bounds (g + 2 <= groups).
        let w = unsafe { _mm512_loadu_si512(qs.as_ptr().add(g * GROUP) as *const _) };
        _mm512_xor_si512(w, flip)
    };
    let (sums, offsets, done) = quant_dots_body!(T, scales, acts, t0, codes);
    let a = done * GROUP;
    for t in 0..T {
        let tail = if done == groups {
            0.0
        } else {
            let (xq, xd, _) = acts.token(t0 + t);
            super::scalar::dot_q8(&qs[a..], &scales[done..], &xq[a..], &xd[done..], &[])
        };
        out[t] = sums[t] - 128.0 * offsets[t] + tail;
    }
}

/// Tokens per tile of the multi-token dots.
const DOT_TOKENS: usize = 8;

/// One Q4 row dotted with every token of `acts` (`out [tokens]`), each value bit-identical to
/// [`dot_q4`] of that token; the row's codes are unpacked once per tile of 8 tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dots_q4(qs: &[u8], scales: &[u16], acts: &QuantizedActs, out: &mut [f32]) {
    let tokens = out.len();
    assert_eq!(tokens, acts.tokens());
    let mut t0 = 0;
    while t0 < tokens {
        let n = DOT_TOKENS.min(tokens - t0);
        let o = &mut out[t0..t0 + n];
        match n {
            8 => dots_q4_tile::<8>(qs, scales, acts, t0, o),
            7 => dots_q4_tile::<7>(qs, scales, acts, t0, o),
            6 => dots_q4_tile::<6>(qs, scales, acts, t0, o),
            5 => dots_q4_tile::<5>(qs, scales, acts, t0, o),
            4 => dots_q4_tile::<4>(qs, scales, acts, t0, o),
            3 => dots_q4_tile::<3>(qs, scales, acts, t0, o),
            2 => dots_q4_tile::<2>(qs, scales, acts, t0, o),
            _ => dots_q4_tile::<1>(qs, scales, acts, t0, o),
        }
        t0 += n;
    }
}

/// One Q8 row dotted with every token of `acts`, as [`dots_q4`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn dots_q8(qs: &[i8], scales: &[u16], acts: &QuantizedActs, out: &mut [f32]) {
    let tokens = out.len();
    assert_eq!(tokens, acts.tokens());
    let mut t0 = 0;
    while t0 < tokens {
        let n = DOT_TOKENS.min(tokens - t0);
        let o = &mut out[t0..t0 + n];
        match n {
            8 => dots_q8_tile::<8>(qs, scales, acts, t0, o),
            7 => dots_q8_tile::<7>(qs, scales, acts, t0, o),
            6 => dots_q8_tile::<6>(qs, scales, acts, t0, o),
            5 => dots_q8_tile::<5>(qs, scales, acts, t0, o),
            4 => dots_q8_tile::<4>(qs, scales, acts, t0, o),
            3 => dots_q8_tile::<3>(qs, scales, acts, t0, o),
            2 => dots_q8_tile::<2>(qs, scales, acts, t0, o),
            _ => dots_q8_tile::<1>(qs, scales, acts, t0, o),
        }
        t0 += n;
    }
}

/// Tokens × rows per register tile (16 of the 32 zmm registers accumulate).
const MT: usize = 4;
const MR: usize = 4;
/// Columns per pass: a tile's 4 weight rows and 4 token rows of this many f32 stay in L1.
const KC: usize = 1024;

/// `out[r, t] += Σ_c w[r, c]·x[t, c]`: `x [tokens, cols]`, `w [rows, cols]`, `out [rows, tokens]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn gemm_block(x: &[f32], w: &[f32], cols: usize, out: &mut [f32]) {
    let (tokens, rows) = (x.len() / cols, w.len() / cols);
    assert!(x.len() == tokens * cols && w.len() == rows * cols && out.len() == rows * tokens);
    for k0 in (0..cols).step_by(KC) {
        let k1 = (k0 + KC).min(cols);
        let mut t0 = 0;
        while t0 < tokens {
            let mt = MT.min(tokens - t0);
            let mut r0 = 0;
            while r0 < rows {
                let at = Span {
                    cols,
                    tokens,
                    t0,
                    r0,
                    k0,
                    k1,
                };
                let full = rows - r0 >= MR;
                match (mt, full) {
                    (4, true) => tile::<4, MR>(x, w, at, out),
                    (3, true) => tile::<3, MR>(x, w, at, out),
                    (2, true) => tile::<2, MR>(x, w, at, out),
                    (1, true) => tile::<1, MR>(x, w, at, out),
                    (4, false) => tile::<4, 1>(x, w, at, out),
                    (3, false) => tile::<3, 1>(x, w, at, out),
                    (2, false) => tile::<2, 1>(x, w, at, out),
                    _ => tile::<1, 1>(x, w, at, out),
                }
                r0 += if full { MR } else { 1 };
            }
            t0 += mt;
        }
    }
}

/// Where a tile sits: tokens `t0..`, rows `r0..`, columns `k0..k1` of `cols`.
#[derive(Clone, Copy)]
struct Span {
    cols: usize,
    tokens: usize,
    t0: usize,
    r0: usize,
    k0: usize,
    k1: usize,
}

/// One `T × R` register tile of [`gemm_block`], added into `out`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn tile<const T: usize, const R: usize>(x: &[f32], w: &[f32], at: Span, out: &mut [f32]) {
    let Span {
        cols,
        tokens,
        t0,
        r0,
        k0,
        k1,
    } = at;
    assert!((t0 + T) * cols <= x.len() && (r0 + R) * cols <= w.len() && k1 <= cols);
    let mut acc = [[_mm512_setzero_ps(); R]; T];
    let main = k0 + (k1 - k0) / 16 * 16;
    let mut c = k0;
    while c < main {
        let mut wv = [_mm512_setzero_ps(); R];
        // SAFETY: rows r0..r0+R and tokens t0..t0+T are in bounds (assert) and c + 16 <= cols.
        unsafe {
            for (r, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.as_ptr().add((r0 + r) * cols + c));
            }
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.as_ptr().add((t0 + t) * cols + c));
                for r in 0..R {
                    a[r] = _mm512_fmadd_ps(xv, wv[r], a[r]);
                }
            }
        }
        c += 16;
    }
    for t in 0..T {
        for r in 0..R {
            let (wr, xt) = (
                &w[(r0 + r) * cols..][main..k1],
                &x[(t0 + t) * cols..][main..k1],
            );
            let tail: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
            out[(r0 + r) * tokens + t0 + t] += _mm512_reduce_add_ps(acc[t][r]) + tail;
        }
    }
}

/// `f32::round` (nearest, ties away from zero), exactly, lane by lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn round_away(y: __m512) -> __m512 {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
    // y − trunc(y) is exact; a fraction of ±0.5 or more rounds away from zero.
    let frac = _mm512_abs_ps(_mm512_sub_ps(y, t));
    let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
    let sign = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(i32::MIN));
    let one = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3F80_0000)));
    _mm512_mask_add_ps(t, away, t, one)
}

/// [`crate::quant::quantize_acts_ref`], bit for bit, 32 values per step.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn quantize_acts(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    sd: &mut [f32],
    sums: &mut [i32],
) {
    let groups = x.len() / GROUP;
    assert!(x.len() == groups * GROUP && qs.len() == x.len());
    assert!(d.len() == groups && sd.len() == groups && sums.len() == groups);
    for g in 0..groups {
        // SAFETY: values [32g, 32g + 32) are in bounds of x and qs (asserted above).
        unsafe {
            let p = x.as_ptr().add(g * GROUP);
            let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            let amax = amax.max(0.0);
            let dg = amax / 127.0;
            let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let vinv = _mm512_set1_ps(inv);
            let qa = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(a, vinv)));
            let qb = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(b, vinv)));
            let q = qs.as_mut_ptr().add(g * GROUP) as *mut __m128i;
            _mm_storeu_si128(q, _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128(q.add(1), _mm512_cvtepi32_epi8(qb));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            d[g] = dg;
            sums[g] = sum;
            sd[g] = dg * sum as f32;
        }
    }
}

/// Transposes a 16×16 matrix of 32-bit elements held one row per register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // s[4i + c], 128-bit lane L: rows 4i..4i+4 at column 4L + c.
    let mut s = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        s[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        s[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        s[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for c in 0..4 {
        let a0 = _mm512_shuffle_i32x4::<0x44>(s[c], s[4 + c]);
        let a1 = _mm512_shuffle_i32x4::<0xEE>(s[c], s[4 + c]);
        let a2 = _mm512_shuffle_i32x4::<0x44>(s[8 + c], s[12 + c]);
        let a3 = _mm512_shuffle_i32x4::<0xEE>(s[8 + c], s[12 + c]);
        r[c] = _mm512_shuffle_i32x4::<0x88>(a0, a2);
        r[4 + c] = _mm512_shuffle_i32x4::<0xDD>(a0, a2);
        r[8 + c] = _mm512_shuffle_i32x4::<0x88>(a1, a3);
        r[12 + c] = _mm512_shuffle_i32x4::<0xDD>(a1, a3);
    }
}

/// Rows of an int8 GEMM panel: one register of i32 (then f32) lanes, one lane per row.
pub(crate) const PANEL_ROWS: usize = 16;
/// Tokens per register tile of the int8 GEMM (accumulators + 8 weight registers + scales).
const QT: usize = 8;

/// Up to 16 rows of block-quantized codes (layout in [`crate::quant`]).
#[derive(Clone, Copy)]
pub(crate) enum QCodes<'a> {
    Q8(&'a [i8]),
    Q4(&'a [u8]),
}

/// A panel unpacked for [`gemm_q_panel`]: for group `g`, `wp[8g + s]` holds bytes `4s..4s+4`
/// of the group for each of the 16 rows (as unsigned codes), and `dw[g]` the rows' scales.
#[derive(Default)]
pub(crate) struct Panel {
    wp: Vec<__m512i>,
    dw: Vec<__m512>,
}

/// Unpacks `rows ≤ 16` rows of `cols` (codes and f16 `scales [rows, cols/32]`) into `panel`;
/// missing rows read as zero.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn pack_panel(
    codes: QCodes,
    scales: &[u16],
    rows: usize,
    cols: usize,
    panel: &mut Panel,
) {
    let groups = cols / GROUP;
    assert!(rows <= PANEL_ROWS && cols == groups * GROUP && scales.len() == rows * groups);
    if rows < PANEL_ROWS {
        // A partial panel: staged as a full one with zero rows, so the hot path is uniform.
        let mut s = vec![0u16; PANEL_ROWS * groups];
        s[..scales.len()].copy_from_slice(scales);
        return match codes {
            QCodes::Q8(q) => {
                let mut c = vec![0i8; PANEL_ROWS * cols];
                c[..q.len()].copy_from_slice(q);
                pack_panel(QCodes::Q8(&c), &s, PANEL_ROWS, cols, panel)
            }
            QCodes::Q4(q) => {
                let mut c = vec![0u8; PANEL_ROWS * cols / 2];
                c[..q.len()].copy_from_slice(q);
                pack_panel(QCodes::Q4(&c), &s, PANEL_ROWS, cols, panel)
            }
        };
    }
    panel.wp.resize(groups * 8, _mm512_setzero_si512());
    panel.dw.resize(groups, _mm512_setzero_ps());
    let wp = &mut panel.wp[..groups * 8];
    // Codes: 64 bytes of each row per step (4 groups of Q4, 2 of Q8), transposed to 16
    // registers that each hold one dword of every row.
    match codes {
        QCodes::Q8(q) => {
            assert_eq!(q.len(), PANEL_ROWS * cols);
            let flip = _mm512_set1_epi8(-128);
            for g0 in (0..groups).step_by(2) {
                let n = 2.min(groups - g0);
                // SAFETY: 16 rows of `cols` bytes; the mask keeps loads within [32g0, 32g0 + 32n).
                let v = unsafe { load_rows(q.as_ptr() as *const u8, cols, g0 * GROUP, 8 * n) };
                for (j, &vj) in v.iter().enumerate().take(8 * n) {
                    wp[g0 * 8 + j] = _mm512_xor_si512(vj, flip);
                }
            }
        }
        QCodes::Q4(q) => {
            assert_eq!(q.len(), PANEL_ROWS * cols / 2);
            let low = _mm512_set1_epi8(0x0F);
            let row_bytes = cols / 2;
            let full = groups / 4 * 4;
            for g0 in (0..groups).step_by(4) {
                let n = 4.min(groups - g0);
                // SAFETY: 16 rows of `cols/2` bytes; the mask keeps loads within
                // [16g0, 16g0 + 16n).
                let v = unsafe { load_rows(q.as_ptr(), row_bytes, g0 * Q4_GROUP_BYTES, 4 * n) };
                let out = &mut wp[g0 * 8..(g0 + n) * 8];
                if g0 < full {
                    for gi in 0..4 {
                        for s in 0..4 {
                            let vj = v[gi * 4 + s];
                            out[gi * 8 + s] = _mm512_and_si512(vj, low);
                            out[gi * 8 + 4 + s] = _mm512_and_si512(_mm512_srli_epi16(vj, 4), low);
                        }
                    }
                } else {
                    for (j, &vj) in v.iter().enumerate().take(4 * n) {
                        let (gi, s) = (j / 4, j % 4);
                        out[gi * 8 + s] = _mm512_and_si512(vj, low);
                        out[gi * 8 + 4 + s] = _mm512_and_si512(_mm512_srli_epi16(vj, 4), low);
                    }
                }
            }
        }
    }
    // Scales: 16 groups of each row per step, converted and transposed.
    for g0 in (0..groups).step_by(16) {
        let n = 16.min(groups - g0);
        let mask: __mmask32 = if n >= 16 { 0xFFFF } else { (1u32 << n) - 1 };
        let mut v = [_mm512_setzero_si512(); 16];
        for (r, vr) in v.iter_mut().enumerate() {
            // SAFETY: the mask keeps the load within row r's scales [g0, g0 + n).
            let h = unsafe {
                _mm512_maskz_loadu_epi16(mask, scales.as_ptr().add(r * groups + g0) as *const i16)
            };
            *vr = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(h)));
        }
        transpose16(&mut v);
        for (j, &vj) in v.iter().enumerate().take(n) {
            panel.dw[g0 + j] = _mm512_castsi512_ps(vj);
        }
    }
}

/// Dwords `[start/4, start/4 + dwords)` (`dwords ≤ 16`) of 16 rows of `row_bytes` at `p`,
/// transposed: register j holds dword j of every row.
///
/// # Safety
/// `p` must point to 16 rows of `row_bytes` readable bytes, and `start + 4·dwords ≤ row_bytes`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn load_rows(
    p: *const u8,
    row_bytes: usize,
    start: usize,
    dwords: usize,
) -> [__m512i; 16] {
    let mask: __mmask16 = if dwords >= 16 {
        0xFFFF
    } else {
        (1u16 << dwords) - 1
    };
    let mut v: [__m512i; 16] = std::array::from_fn(|r| {
        // SAFETY: the caller's contract; the mask limits the load to `dwords` dwords.
        unsafe { _mm512_maskz_loadu_epi32(mask, p.add(r * row_bytes + start) as *const i32) }
    });
    transpose16(&mut v);
    v
}

/// `out [tokens, 16]` = the packed panel times every token of `acts`, where `corr [tokens,
/// cols/32]` = −offset · Σ codes of each token's group (the codes' offset, 128 for Q8 and 8
/// for Q4, folded out in integers). Each output is Σ_g (isum_g · d_x) · d_w in group order.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn gemm_q_panel(panel: &Panel, acts: &QuantizedActs, corr: &[i32], out: &mut [f32]) {
    let tokens = acts.tokens();
    let groups = acts.cols / GROUP;
    assert!(panel.wp.len() >= groups * 8 && panel.dw.len() >= groups);
    assert!(corr.len() == tokens * groups && acts.d.len() == tokens * groups);
    assert_eq!(out.len(), tokens * PANEL_ROWS);
    let mut t0 = 0;
    while t0 < tokens {
        let n = QT.min(tokens - t0);
        match n {
            8 => q_tile::<8>(panel, acts, corr, t0, out),
            7 => q_tile::<7>(panel, acts, corr, t0, out),
            6 => q_tile::<6>(panel, acts, corr, t0, out),
            5 => q_tile::<5>(panel, acts, corr, t0, out),
            4 => q_tile::<4>(panel, acts, corr, t0, out),
            3 => q_tile::<3>(panel, acts, corr, t0, out),
            2 => q_tile::<2>(panel, acts, corr, t0, out),
            _ => q_tile::<1>(panel, acts, corr, t0, out),
        }
        t0 += n;
    }
}

/// Tokens `t0..t0+T` of [`gemm_q_panel`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn q_tile<const T: usize>(
    panel: &Panel,
    acts: &QuantizedActs,
    corr: &[i32],
    t0: usize,
    out: &mut [f32],
) {
    let cols = acts.cols;
    let groups = cols / GROUP;
    assert!((t0 + T) * cols <= acts.qs.len() && (t0 + T) * PANEL_ROWS <= out.len());
    assert!(panel.wp.len() >= groups * 8 && panel.dw.len() >= groups);
    assert!((t0 + T) * groups <= corr.len() && (t0 + T) * groups <= acts.d.len());
    let mut acc = [_mm512_setzero_ps(); T];
    let (xq, xd, xc) = (acts.qs.as_ptr(), acts.d.as_ptr(), corr.as_ptr());
    for g in 0..groups {
        let w: [__m512i; 8] = std::array::from_fn(|s| panel.wp[g * 8 + s]);
        let dw = panel.dw[g];
        for (t, a) in acc.iter_mut().enumerate() {
            let tok = t0 + t;
            // SAFETY: token tok < t0 + T and group g < groups are in bounds (asserted above);
            // the dword reads stay within the group's 32 codes.
            unsafe {
                let xp = xq.add(tok * cols + g * GROUP) as *const i32;
                // Two independent chains of exact integer sums (the order of the terms does
                // not change the result; the chains hide the latency at few tokens).
                let mut isum = _mm512_set1_epi32(*xc.add(tok * groups + g));
                let mut odd = _mm512_setzero_si512();
                for (s, &ws) in w.iter().enumerate() {
                    let x = _mm512_set1_epi32(xp.add(s).read_unaligned());
                    if s % 2 == 0 {
                        isum = _mm512_dpbusd_epi32(isum, ws, x);
                    } else {
                        odd = _mm512_dpbusd_epi32(odd, ws, x);
                    }
                }
                let isum = _mm512_add_epi32(isum, odd);
                let scaled = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(isum),
                    _mm512_set1_ps(*xd.add(tok * groups + g)),
                );
                *a = _mm512_fmadd_ps(scaled, dw, *a);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        let o = &mut out[(t0 + t) * PANEL_ROWS..(t0 + t + 1) * PANEL_ROWS];
        // SAFETY: o has 16 elements.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
    }
}

/// Most tokens per register tile of the f32 panel GEMM (24 accumulators + the weight vector).
pub(crate) const FT: usize = 24;

/// Where a float panel's weights come from: up to 16 rows of `cols`, row-major.
#[derive(Clone, Copy)]
pub(crate) enum FRows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    F16(&'a [u16]),
}

/// Transposes up to 16 rows of `cols` weights into `wp [cols]` (one register of the 16 rows'
/// values per column, as f32); missing rows read as zero.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn pack_f32_panel(src: FRows, rows: usize, cols: usize, wp: &mut Vec<__m512>) {
    let len = match src {
        FRows::F32(w) => w.len(),
        FRows::Bf16(w) | FRows::F16(w) => w.len(),
    };
    assert!(rows <= PANEL_ROWS && len == rows * cols);
    wp.resize(cols, _mm512_setzero_ps());
    for c0 in (0..cols).step_by(16) {
        let n = 16.min(cols - c0);
        let mask: __mmask16 = if n >= 16 { 0xFFFF } else { (1u16 << n) - 1 };
        let mut v = [_mm512_setzero_si512(); 16];
        for (r, vr) in v.iter_mut().enumerate().take(rows) {
            let at = r * cols + c0;
            // SAFETY: the mask keeps every load within row r's columns [c0, c0 + n).
            let row = unsafe {
                match src {
                    FRows::F32(w) => _mm512_maskz_loadu_ps(mask, w.as_ptr().add(at)),
                    FRows::Bf16(w) => {
                        let h = _mm512_maskz_loadu_epi16(
                            mask as __mmask32,
                            w.as_ptr().add(at) as *const i16,
                        );
                        let h = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(h));
                        _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
                    }
                    FRows::F16(w) => {
                        let h = _mm512_maskz_loadu_epi16(
                            mask as __mmask32,
                            w.as_ptr().add(at) as *const i16,
                        );
                        _mm512_cvtph_ps(_mm512_castsi512_si256(h))
                    }
                }
            };
            *vr = _mm512_castps_si512(row);
        }
        transpose16(&mut v);
        for (j, &vj) in v.iter().enumerate().take(n) {
            wp[c0 + j] = _mm512_castsi512_ps(vj);
        }
    }
}

/// `out [tokens, 16]` = a packed panel `wp [cols]` times the tokens packed by blocks of
/// [`FT`]: block `b` (tokens `FT·b..`, `n` of them) is `xp[FT·b·cols..]` laid out `[cols][n]`.
/// Each output is Σ_c w·x in column order, one fused multiply-add after another.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn gemm_f32_panel(wp: &[__m512], xp: &[f32], cols: usize, out: &mut [f32]) {
    let tokens = xp.len() / cols.max(1);
    assert!(wp.len() >= cols && xp.len() == tokens * cols);
    assert_eq!(out.len(), tokens * PANEL_ROWS);
    macro_rules! tiles {
        ($n:expr, $t0:expr, $($k:literal)*) => {
            match $n {
                $($k => f_tile::<$k>(wp, &xp[$t0 * cols..($t0 + $k) * cols], cols, &mut out[$t0 * PANEL_ROWS..($t0 + $k) * PANEL_ROWS]),)*
                _ => unreachable!(),
            }
        };
    }
    let mut t0 = 0;
    while t0 < tokens {
        let n = FT.min(tokens - t0);
        tiles!(n, t0, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24);
        t0 += n;
    }
}

/// One block of `T` tokens of [`gemm_f32_panel`]: `xp [cols][T]`, `out [T, 16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn f_tile<const T: usize>(wp: &[__m512], xp: &[f32], cols: usize, out: &mut [f32]) {
    assert!(wp.len() >= cols && xp.len() == cols * T && out.len() == T * PANEL_ROWS);
    let mut acc = [_mm512_setzero_ps(); T];
    let x = xp.as_ptr();
    for (c, &w) in wp[..cols].iter().enumerate() {
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: c < cols and t < T index within xp's cols·T values.
            let xv = unsafe { _mm512_set1_ps(*x.add(c * T + t)) };
            *a = _mm512_fmadd_ps(w, xv, *a);
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: out has T·16 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(t * PANEL_ROWS), *a) };
    }
}

/// `y[i] += s·x[i]` (elementwise: the same result wherever the slices sit).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    let n = y.len();
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    let sv = _mm512_set1_ps(s);
    let mut i = 0;
    // SAFETY: every access is [i, i+16) with i + 16 <= n for both slices (unaligned).
    unsafe {
        while i + 16 <= n {
            let v = _mm512_fmadd_ps(sv, _mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), v);
            i += 16;
        }
    }
    for j in i..n {
        y[j] = s.mul_add(x[j], y[j]);
    }
}
