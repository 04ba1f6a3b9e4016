//! aarch64 NEON kernels, kept simple: f32/bf16 FMA dots and widening int8 dots for Q8/Q4.
//! f16 weights and the GEMM block use the portable code. Compiled only on aarch64 (not built
//! on the x86 development machine: check it on an ARM host before relying on it).

use std::arch::aarch64::*;

use spindle_model::quant::{GROUP, Q4_GROUP_BYTES};

/// Σ w·x, `$load(p)` giving four weights at `p` as f32.
macro_rules! dot_f32_body {
    ($w:ident, $x:ident, $load:path, $scalar:expr) => {{
        assert_eq!($w.len(), $x.len());
        let n = $w.len();
        let (wp, xp) = ($w.as_ptr(), $x.as_ptr());
        let mut i = 0;
        // SAFETY: every load reads [i, i+4) with i + 4 <= n for both slices.
        let mut s = unsafe {
            let mut acc = [vdupq_n_f32(0.0); 4];
            while i + 16 <= n {
                for (k, a) in acc.iter_mut().enumerate() {
                    let j = i + 4 * k;
                    *a = vfmaq_f32(*a, $load(wp.add(j)), vld1q_f32(xp.add(j)));
                }
                i += 16;
            }
            vaddvq_f32(vaddq_f32(
                vaddq_f32(acc[0], acc[1]),
                vaddq_f32(acc[2], acc[3]),
            ))
        };
        for j in i..n {
            s += $scalar($w[j]) * $x[j];
        }
        s
    }};
}

/// Four bf16 values at `p` as f32 (the caller guarantees 8 readable bytes).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_bf16(p: *const u16) -> float32x4_t {
    vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(vld1_u16(p))))
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, vld1q_f32, |v: f32| v)
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    dot_f32_body!(w, x, load_bf16, spindle_model::quant::view::bf16_to_f32)
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    super::scalar::dot_f16(w, x)
}

/// Σ over 32 signed bytes of a·b as i32 (`a`, `b` two 16-byte halves each).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot32(a0: int8x16_t, a1: int8x16_t, b0: int8x16_t, b1: int8x16_t) -> i32 {
    let mut acc = vdupq_n_s32(0);
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a0), vget_low_s8(b0)));
    acc = vpadalq_s16(acc, vmull_high_s8(a0, b0));
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a1), vget_low_s8(b1)));
    acc = vpadalq_s16(acc, vmull_high_s8(a1, b1));
    vaddvq_s32(acc)
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_q8(qs: &[i8], scales: &[u16], xq: &[i8], xd: &[f32], _xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(qs.len() == groups * GROUP && xq.len() == qs.len() && xd.len() == groups);
    let mut s = 0.0f32;
    for g in 0..groups {
        let (w, x) = (qs[g * GROUP..].as_ptr(), xq[g * GROUP..].as_ptr());
        // SAFETY: group g is bytes [32g, 32g+32) of qs and xq, in bounds by the assert.
        let isum = unsafe {
            dot32(
                vld1q_s8(w),
                vld1q_s8(w.add(16)),
                vld1q_s8(x),
                vld1q_s8(x.add(16)),
            )
        };
        s += spindle_model::quant::blocks::f16_to_f32(scales[g]) * xd[g] * isum as f32;
    }
    s
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_q4(qs: &[u8], scales: &[u16], xq: &[i8], xd: &[f32], _xsd: &[f32]) -> f32 {
    let groups = scales.len();
    assert!(
        qs.len() == groups * Q4_GROUP_BYTES && xq.len() == groups * GROUP && xd.len() == groups
    );
    let mut s = 0.0f32;
    for g in 0..groups {
        let (w, x) = (qs[g * Q4_GROUP_BYTES..].as_ptr(), xq[g * GROUP..].as_ptr());
        // SAFETY: group g is bytes [16g, 16g+16) of qs and [32g, 32g+32) of xq, in bounds.
        let isum = unsafe {
            let b = vld1q_u8(w);
            let eight = vdupq_n_s8(8);
            let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))), eight);
            let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(b)), eight);
            dot32(lo, hi, vld1q_s8(x), vld1q_s8(x.add(16)))
        };
        s += spindle_model::quant::blocks::f16_to_f32(scales[g]) * xd[g] * isum as f32;
    }
    s
}

#[target_feature(enable = "neon")]
pub(crate) fn gemm_block(x: &[f32], w: &[f32], cols: usize, out: &mut [f32]) {
    super::scalar::gemm_block(x, w, cols, out)
}

/// `y[i] += s·x[i]`.
#[target_feature(enable = "neon")]
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    super::scalar::axpy_f32(y, s, x)
}
