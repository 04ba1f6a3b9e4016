//! Hyper-connections (MODEL_MATH §4.3): n residual streams, a low-rank input mix that reads
//! them into one sublayer input, and per-stream injection weights for the sublayer output.

use spindle_kernels::activation::{sigmoid, silu};
use spindle_kernels::norm::group_rms_norm_zc;

use spindle_model::weights::HyperWeights;

use crate::linear::LinearExt;

/// The sublayer input `x [T, H]` and the injection weights `ω [T, n]`.
pub struct HyperInput {
    pub x: Vec<f32>,
    pub omega: Vec<f32>,
}

/// Reads the streams `hs [T, n·H]` (left unchanged: the residual keeps the raw streams); the
/// rows come in `groups` (one per sequence of a step).
pub fn enter(
    w: &HyperWeights,
    hs: &[f32],
    groups: &[usize],
    streams: usize,
    hidden: usize,
    eps: f32,
) -> HyperInput {
    let tokens: usize = groups.iter().sum();
    let width = streams * hidden;
    let mut normed = vec![0.0f32; hs.len()];
    for (src, dst) in hs.chunks(width).zip(normed.chunks_mut(width)) {
        group_rms_norm_zc(src, &w.norm, hidden, eps, dst);
    }
    let n = streams as f32;
    let mut m = w.mix_down.forward_groups(&normed, groups);
    m.iter_mut().for_each(|v| *v = silu(*v / n));
    let mut a = w.mix_up.forward_groups(&m, groups);
    a.iter_mut().for_each(|v| *v = sigmoid(*v));

    let mut x = vec![0.0f32; tokens * hidden];
    for t in 0..tokens {
        let xt = &mut x[t * hidden..(t + 1) * hidden];
        for s in 0..streams {
            let base = t * width + s * hidden;
            for (i, o) in xt.iter_mut().enumerate() {
                *o += a[base + i] * normed[base + i];
            }
        }
        xt.iter_mut().for_each(|v| *v /= n);
    }
    let omega = match &w.inject {
        Some(inject) => {
            let mut o = inject.forward_groups(&normed, groups);
            o.iter_mut().for_each(|v| *v = 2.0 * sigmoid(*v / n));
            o
        }
        None => Vec::new(),
    };
    HyperInput { x, omega }
}

/// `hs_s += ω_s · y` for every stream s.
pub fn inject(hs: &mut [f32], y: &[f32], omega: &[f32], streams: usize, hidden: usize) {
    for (t, (row, yt)) in hs
        .chunks_mut(streams * hidden)
        .zip(y.chunks(hidden))
        .enumerate()
    {
        for (s, stream) in row.chunks_mut(hidden).enumerate() {
            let w = omega[t * streams + s];
            stream.iter_mut().zip(yt).for_each(|(h, &v)| *h += w * v);
        }
    }
}
