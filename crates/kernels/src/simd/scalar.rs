//! Portable kernels: the fallback path, and the shape every SIMD path must match.

use crate::quant::{dot_q4_ref, dot_q8_ref};
use spindle_model::quant::view::bf16_to_f32;

/// Σ w·x with eight partial sums (the compiler vectorises this for the baseline target).
#[inline]
fn dot_by<T: Copy>(w: &[T], x: &[f32], to_f32: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let (wc, wr) = w.split_at(w.len() / 8 * 8);
    let (xc, xr) = x.split_at(wc.len());
    for (wb, xb) in wc.chunks_exact(8).zip(xc.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += to_f32(wb[i]) * xb[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (&a, b) in wr.iter().zip(xr) {
        sum += to_f32(a) * b;
    }
    sum
}

pub(crate) fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    dot_by(w, x, |v| v)
}

pub(crate) fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    dot_by(w, x, bf16_to_f32)
}

pub(crate) fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    dot_by(w, x, |v| half::f16::from_bits(v).to_f32())
}

pub(crate) fn dot_q8(qs: &[i8], scales: &[u16], xq: &[i8], xd: &[f32], _xsd: &[f32]) -> f32 {
    dot_q8_ref(qs, scales, xq, xd)
}

pub(crate) fn dot_q4(qs: &[u8], scales: &[u16], xq: &[i8], xd: &[f32], _xsd: &[f32]) -> f32 {
    dot_q4_ref(qs, scales, xq, xd)
}

/// `out[r, t] += Σ_c w[r, c]·x[t, c]` for a block: `x [tokens, cols]`, `w [rows, cols]`,
/// `out [rows, tokens]`.
pub(crate) fn gemm_block(x: &[f32], w: &[f32], cols: usize, out: &mut [f32]) {
    let tokens = x.len() / cols;
    for (wr, o) in w.chunks_exact(cols).zip(out.chunks_exact_mut(tokens)) {
        for (xt, ot) in x.chunks_exact(cols).zip(o.iter_mut()) {
            *ot += dot_f32(wr, xt);
        }
    }
}

/// `y[i] += s·x[i]` (a multiply and an add: a baseline x86-64 build has no FMA instruction).
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += s * x);
}
