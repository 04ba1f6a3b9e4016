//! AVX-512 (F, BW, VNNI) kernels. Callers reach them only through [`super::Isa::Avx512`] after
//! [`super::Isa::available`] confirmed the features.
//!
//! Quantized dots use `vpdpbusd` (unsigned × signed bytes summed into i32 lanes, two groups of
//! 32 per register): Q8 codes are made unsigned by flipping the sign bit (w + 128), Q4 codes
//! are unsigned already; the constant offsets (128 and 8) times Σx are subtracted at the end
//! from the activations' scaled sums `sd`.

use std::arch::x86_64::*;

use crate::quant::{GROUP, Q4_GROUP_BYTES};

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
    dot_f32_body!(w, x, load_bf16, crate::weights::bf16_to_f32)
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
    let tail = super::scalar::dot_q8(&qs[a..], &scales[done..], &xq[a..], &xd[done..], &[]);
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
    let tail = super::scalar::dot_q4(&qs[b..], &scales[done..], &xq[a..], &xd[done..], &[]);
    sum - 8.0 * offset + tail
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
