//! The int8 panel GEMM for few tokens (decode: one sequence, or a batch of decoding sequences)
//! on AVX-512 VNNI, reading a panel's 16 weight rows in place instead of unpacking them into a
//! packed copy first.
//!
//! Each output is computed exactly as [`super::avx512::gemm_q_panel`] computes it (one lane
//! per weight row): per group of 32 the exact int32 dot of the codes with the token's int8
//! activations (the codes' offset folded out through `corr`), then
//! `acc = fma(f32(isum)·d_x, d_w, acc)` in group order. The integer sums are exact whatever
//! the order of their terms, so results are bit-identical to the packed GEMM for any number of
//! tokens, and a token's result never depends on the other tokens of the call.

use std::arch::x86_64::*;

use super::avx512::{load_rows, transpose16, QCodes, PANEL_ROWS};
use crate::quant::QuantizedActs;
use spindle_model::quant::{GROUP, Q4_GROUP_BYTES};

/// Most tokens per call of [`q_panel_direct`] (one accumulator register per token).
pub(crate) const DIRECT_TOKENS: usize = 8;
/// Extra distance of the next-panel prefetch, in bytes.
const PREFETCH_SHIFT: usize = 0;

/// `out [tokens, 16]` = 16 full weight rows (`codes`, f16 `scales [16, cols/32]`) times every
/// token of `acts` (at most [`DIRECT_TOKENS`]), `corr [tokens, cols/32]` = −offset · Σ codes
/// of each token's group, as for [`super::avx512::gemm_q_panel`], bit for bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) fn q_panel_direct(
    codes: QCodes,
    scales: &[u16],
    acts: &QuantizedActs,
    corr: &[i32],
    out: &mut [f32],
) {
    match acts.tokens() {
        8 => direct::<8>(codes, scales, acts, corr, out),
        7 => direct::<7>(codes, scales, acts, corr, out),
        6 => direct::<6>(codes, scales, acts, corr, out),
        5 => direct::<5>(codes, scales, acts, corr, out),
        4 => direct::<4>(codes, scales, acts, corr, out),
        3 => direct::<3>(codes, scales, acts, corr, out),
        2 => direct::<2>(codes, scales, acts, corr, out),
        1 => direct::<1>(codes, scales, acts, corr, out),
        n => panic!("q_panel_direct takes 1..={DIRECT_TOKENS} tokens, not {n}"),
    }
}

/// [`q_panel_direct`] for `T` tokens.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn direct<const T: usize>(
    codes: QCodes,
    scales: &[u16],
    acts: &QuantizedActs,
    corr: &[i32],
    out: &mut [f32],
) {
    let cols = acts.cols;
    let groups = cols / GROUP;
    assert!(cols == groups * GROUP && acts.qs.len() == T * cols);
    assert!(scales.len() == PANEL_ROWS * groups && corr.len() == T * groups);
    assert!(acts.d.len() == T * groups && out.len() == T * PANEL_ROWS);
    // Groups per load of 64 bytes of each row.
    let step = match codes {
        QCodes::Q8(q) => {
            assert_eq!(q.len(), PANEL_ROWS * cols);
            2
        }
        QCodes::Q4(q) => {
            assert_eq!(q.len(), PANEL_ROWS * cols / 2);
            4
        }
    };
    let (low, flip) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(-128));
    let (xq, xd, xc) = (acts.qs.as_ptr(), acts.d.as_ptr(), corr.as_ptr());
    let mut acc = [_mm512_setzero_ps(); T];
    for g0 in (0..groups).step_by(16) {
        let n = 16.min(groups - g0);
        // The 16 rows' scales of groups g0..g0+n, one register (lane = row) per group.
        let mask: __mmask32 = if n >= 16 { 0xFFFF } else { (1u32 << n) - 1 };
        let mut dw: [__m512i; 16] = std::array::from_fn(|r| {
            // SAFETY: the mask keeps the load within row r's scales [g0, g0 + n).
            let h = unsafe {
                _mm512_maskz_loadu_epi16(mask, scales.as_ptr().add(r * groups + g0) as *const i16)
            };
            _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(h)))
        });
        transpose16(&mut dw);
        for gb in (g0..g0 + n).step_by(step) {
            let m = step.min(g0 + n - gb);
            // The next panel's bytes (the 16 rows after these, contiguous), one kilobyte per
            // kilobyte read here, in address order: the loads below walk 16 rows at once,
            // which the hardware prefetchers do not follow as they follow one stream (a
            // prefetch never faults, so past the matrix's end it only wastes a slot).
            let (base, row_bytes, at) = match codes {
                QCodes::Q8(q) => (q.as_ptr() as *const u8, cols, gb * GROUP),
                QCodes::Q4(q) => (q.as_ptr(), cols / 2, gb * Q4_GROUP_BYTES),
            };
            let next = base.wrapping_add(PANEL_ROWS * row_bytes + at * PANEL_ROWS);
            for r in 0..PANEL_ROWS {
                let p = next.wrapping_add(r * 64 + PREFETCH_SHIFT);
                _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            }
            // The next panel's scales too (contiguous after these, 32 bytes a group of its 16
            // rows), at the pace of its codes: the loads above read 16 rows' scales at once
            // (32 bytes of each), which the hardware does not stream in either; left to
            // demand, each panel's first loads waited on memory (6-10% of a decode's kernel
            // time, README "Prefix cache (CPU, 2 cores)").
            let next_scales = scales.as_ptr().wrapping_add(PANEL_ROWS * groups) as *const u8;
            for line in 0..2 {
                let p = next_scales.wrapping_add(32 * gb + 64 * line);
                _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            }
            // Dword j of every row: group gb + j/4 (Q4) or gb + j/8 (Q8).
            // SAFETY: 16 rows of `row_bytes`; groups gb..gb+m are within each row.
            let v = unsafe {
                match codes {
                    QCodes::Q8(q) => load_rows(q.as_ptr() as *const u8, cols, gb * GROUP, 8 * m),
                    QCodes::Q4(q) => load_rows(q.as_ptr(), cols / 2, gb * Q4_GROUP_BYTES, 4 * m),
                }
            };
            for gi in 0..m {
                let g = gb + gi;
                // The group's unsigned codes: register s holds dword s (values 4s..4s+4) of
                // every row.
                let w: [__m512i; 8] = match codes {
                    QCodes::Q8(_) => std::array::from_fn(|s| _mm512_xor_si512(v[8 * gi + s], flip)),
                    QCodes::Q4(_) => std::array::from_fn(|s| {
                        let b = v[4 * gi + s % 4];
                        if s < 4 {
                            _mm512_and_si512(b, low)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16(b, 4), low)
                        }
                    }),
                };
                let dwg = _mm512_castsi512_ps(dw[g - g0]);
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: token t < T and group g < groups are in bounds (asserted above);
                    // the dword reads stay within the group's 32 codes.
                    unsafe {
                        let xp = xq.add(t * cols + g * GROUP) as *const i32;
                        let x = |s: usize| _mm512_set1_epi32(xp.add(s).read_unaligned());
                        // Two independent chains (exact integer sums: the order is free).
                        let mut i0 = _mm512_set1_epi32(*xc.add(t * groups + g));
                        let mut i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x(1));
                        i0 = _mm512_dpbusd_epi32(i0, w[0], x(0));
                        i0 = _mm512_dpbusd_epi32(i0, w[2], x(2));
                        i1 = _mm512_dpbusd_epi32(i1, w[3], x(3));
                        i0 = _mm512_dpbusd_epi32(i0, w[4], x(4));
                        i1 = _mm512_dpbusd_epi32(i1, w[5], x(5));
                        i0 = _mm512_dpbusd_epi32(i0, w[6], x(6));
                        i1 = _mm512_dpbusd_epi32(i1, w[7], x(7));
                        let isum = _mm512_add_epi32(i0, i1);
                        let scaled = _mm512_mul_ps(
                            _mm512_cvtepi32_ps(isum),
                            _mm512_set1_ps(*xd.add(t * groups + g)),
                        );
                        *a = _mm512_fmadd_ps(scaled, dwg, *a);
                    }
                }
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        let o = &mut out[t * PANEL_ROWS..(t + 1) * PANEL_ROWS];
        // SAFETY: o has 16 elements.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
    }
}
