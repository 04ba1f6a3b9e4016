//! AVX2 + FMA + F16C kernels. Callers reach them only through [`super::Isa::Avx2`] (or
//! `Avx512`, a superset) after [`super::Isa::available`] confirmed the features.
//!
//! Quantized dots follow llama.cpp: `maddubs` multiplies unsigned by signed bytes, so Q8 uses
//! the sign trick (|w| times x·sign(w)); Q4 codes are already unsigned and their −8 offset is
//! folded out afterwards with the activations' scaled sums.

use std::arch::x86_64::*;

use spindle_model::quant::{GROUP, Q4_GROUP_BYTES};

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ w·x where `load(i)` gives weights `[i, i+8)` as f32 and `scalar(i)` weight i.
macro_rules! dot_f32_body {
    ($w:ident, $x:ident, $load:expr, $scalar:expr) => {{
        assert_eq!($w.len(), $x.len());
        let n = $w.len();
        let (wp, xp) = ($w.as_ptr(), $x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        // No alignment peeling: the summation order must not depend on where the
        // weights sit in memory, so results are bit-identical across layouts and residencies.
        let mut i = 0;
        // SAFETY: every load reads [i, i+8) with i + 8 <= n for both slices (unaligned loads).
        unsafe {
            while i + 32 <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let j = i + 8 * k;
                    *a = _mm256_fmadd_ps($load(wp.add(j)), _mm256_loadu_ps(xp.add(j)), *a);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps($load(wp.add(i)), _mm256_loadu_ps(xp.add(i)), acc[0]);
                i += 8;
            }
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(sum);
        for j in i..n {
            s += $scalar($w[j]) * $x[j];
        }
        s
    }};
}

/// Eight bf16 values at `p` as f32 (the caller guarantees 16 readable bytes).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_bf16(p: *const u16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// Eight f16 values at `p` as f32 (the caller guarantees 16 readable bytes).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_f16(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, _mm256_loadu_ps, |v: f32| v)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, load_bf16, spindle_model::quant::view::bf16_to_f32)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, load_f16, |v: u16| half::f16::from_bits(v).to_f32())
}

/// The shared loop of the quantized dots, eight groups per step: `$group(g)` yields group g's
/// 32 products summed pairwise into eight i32 lanes. Returns (Σ_g d_w·d_x·isum_g,
/// Σ_g d_w·sd_g, groups done); the remaining `groups % 8` are left to the caller.
macro_rules! quant_dot_body {
    ($scales:ident, $xd:ident, $xsd:ident, $group:expr) => {{
        let done = $scales.len() / 8 * 8;
        let (mut acc, mut offset) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut g0 = 0;
        while g0 < done {
            // SAFETY: groups g0..g0+8 are in bounds of scales, xd and xsd (g0 + 8 <= groups).
            let (dw, xd, xsd) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128($scales.as_ptr().add(g0) as *const __m128i)),
                    _mm256_loadu_ps($xd.as_ptr().add(g0)),
                    _mm256_loadu_ps($xsd.as_ptr().add(g0)),
                )
            };
            let d = _mm256_mul_ps(dw, xd);
            offset = _mm256_fmadd_ps(dw, xsd, offset);
            for p in 0..8 {
                let isum = _mm256_cvtepi32_ps($group(g0 + p));
                let scale = _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(p as i32));
                acc = _mm256_fmadd_ps(isum, scale, acc);
            }
            g0 += 8;
        }
        (hsum(acc), hsum(offset), done)
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q8(qs: &[i8], scales: &[u16], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(qs.len() == groups * GROUP && xq.len() == qs.len());
    assert!(xd.len() == groups && xsd.len() == groups);
    let ones = _mm256_set1_epi16(1);
    let group = |g: usize| {
        // SAFETY: group g covers bytes [32g, 32g+32) of qs and xq, in bounds by the assert.
        let (w, x) = unsafe {
            (
                _mm256_loadu_si256(qs.as_ptr().add(g * GROUP) as *const __m256i),
                _mm256_loadu_si256(xq.as_ptr().add(g * GROUP) as *const __m256i),
            )
        };
        // |w| · (x·sign(w)) = w·x, with the unsigned operand ≤ 128 so maddubs cannot saturate.
        _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)),
            ones,
        )
    };
    let (sum, _, done) = quant_dot_body!(scales, xd, xsd, group);
    let a = done * GROUP;
    if done == scales.len() {
        sum
    } else {
        sum + super::scalar::dot_q8(&qs[a..], &scales[done..], &xq[a..], &xd[done..], &[])
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_q4(qs: &[u8], scales: &[u16], xq: &[i8], xd: &[f32], xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(qs.len() == groups * Q4_GROUP_BYTES && xq.len() == groups * GROUP);
    assert!(xd.len() == groups && xsd.len() == groups);
    let (ones, low) = (_mm256_set1_epi16(1), _mm_set1_epi8(0x0F));
    let group = |g: usize| {
        // SAFETY: group g covers qs bytes [16g, 16g+16) and xq bytes [32g, 32g+32), in bounds.
        let (b, x) = unsafe {
            (
                _mm_loadu_si128(qs.as_ptr().add(g * Q4_GROUP_BYTES) as *const __m128i),
                _mm256_loadu_si256(xq.as_ptr().add(g * GROUP) as *const __m256i),
            )
        };
        let w = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(b, 4), low),
            _mm_and_si128(b, low),
        );
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones)
    };
    let (sum, offset, done) = quant_dot_body!(scales, xd, xsd, group);
    let (a, b) = (done * GROUP, done * Q4_GROUP_BYTES);
    // Most rows have no tail: skip the call (it shows in decode profiles).
    let tail = if done == scales.len() {
        0.0
    } else {
        super::scalar::dot_q4(&qs[b..], &scales[done..], &xq[a..], &xd[done..], &[])
    };
    sum - 8.0 * offset + tail
}

/// Tokens × rows per register tile (8 accumulators of 16 ymm registers).
const MT: usize = 4;
const MR: usize = 2;
/// Columns per pass: a tile's 2 weight rows and 4 token rows of this many f32 stay in L1.
const KC: usize = 1024;

/// `out[r, t] += Σ_c w[r, c]·x[t, c]`: `x [tokens, cols]`, `w [rows, cols]`, `out [rows, tokens]`.
#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
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
    let mut acc = [[_mm256_setzero_ps(); R]; T];
    let main = k0 + (k1 - k0) / 8 * 8;
    let mut c = k0;
    while c < main {
        let mut wv = [_mm256_setzero_ps(); R];
        // SAFETY: rows r0..r0+R and tokens t0..t0+T are in bounds (assert) and c + 8 <= cols.
        unsafe {
            for (r, v) in wv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(w.as_ptr().add((r0 + r) * cols + c));
            }
            for (t, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.as_ptr().add((t0 + t) * cols + c));
                for r in 0..R {
                    a[r] = _mm256_fmadd_ps(xv, wv[r], a[r]);
                }
            }
        }
        c += 8;
    }
    for t in 0..T {
        for r in 0..R {
            let (wr, xt) = (
                &w[(r0 + r) * cols..][main..k1],
                &x[(t0 + t) * cols..][main..k1],
            );
            let tail: f32 = wr.iter().zip(xt).map(|(a, b)| a * b).sum();
            out[(r0 + r) * tokens + t0 + t] += hsum(acc[t][r]) + tail;
        }
    }
}

/// `y[i] += s·x[i]` (elementwise: the same result wherever the slices sit).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    let n = y.len();
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    // SAFETY: every access is [i, i+8) with i + 8 <= n for both slices (unaligned).
    unsafe {
        while i + 8 <= n {
            let v = _mm256_fmadd_ps(sv, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), v);
            i += 8;
        }
    }
    for j in i..n {
        y[j] = s.mul_add(x[j], y[j]);
    }
}
