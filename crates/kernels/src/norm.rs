//! RMS norms (MODEL_MATH §1.1, §1.2). Statistics in f32.

use crate::activation::{sigmoid, silu};

#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (mean_sq + eps).sqrt()
}

/// LayerNorm with mean and bias (the vision tower's, eps 1e-6): `out = (x − mean) ·
/// rsqrt(var + eps) · w + b`, statistics in f64 over the row.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for (((o, &v), &g), &c) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = ((v as f64 - mean) * inv) as f32 * g + c;
    }
}

/// Zero-centred RMSNorm: `out = x · rsqrt(mean(x²) + eps) · (1 + w)`.
pub fn rms_norm_zc(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    let s = inv_rms(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * s * (1.0 + g);
    }
}

/// Zero-centred RMSNorm in place.
pub fn rms_norm_zc_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let s = inv_rms(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v *= s * (1.0 + g);
    }
}

/// Grouped zero-centred RMSNorm: each group of `group` values is normalised on its own, then
/// the whole vector is multiplied by (1 + w) (Qwen4-Exp hyper-connections).
pub fn group_rms_norm_zc(x: &[f32], w: &[f32], group: usize, eps: f32, out: &mut [f32]) {
    for ((xg, wg), og) in x
        .chunks(group)
        .zip(w.chunks(group))
        .zip(out.chunks_mut(group))
    {
        rms_norm_zc(xg, wg, eps, og);
    }
}

/// The activation applied to the gate of the GDN output norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateActivation {
    Silu,
    Sigmoid,
}

impl GateActivation {
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            GateActivation::Silu => silu(x),
            GateActivation::Sigmoid => sigmoid(x),
        }
    }
}

/// Gated RMSNorm, in place: `o = (o · rsqrt(mean(o²) + eps)) · w · act(z)` with a plain
/// weight (not 1 + w).
pub fn rms_norm_gated(o: &mut [f32], z: &[f32], w: &[f32], eps: f32, act: GateActivation) {
    let s = inv_rms(o, eps);
    for ((v, &g), &wv) in o.iter_mut().zip(z).zip(w) {
        *v = *v * s * wv * act.apply(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_centred_norm_matches_formula() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [0.0f32, 0.5, -0.5, 1.0];
        let mut out = [0.0; 4];
        rms_norm_zc(&x, &w, 1e-6, &mut out);
        let rms = ((1.0 + 4.0 + 9.0 + 0.25) / 4.0f64 + 1e-6).sqrt();
        for i in 0..4 {
            let expect = x[i] as f64 / rms * (1.0 + w[i] as f64);
            assert!((out[i] as f64 - expect).abs() < 1e-6);
        }
    }

    #[test]
    fn gated_norm_uses_plain_weight_and_gate() {
        let mut o = [3.0f32, 4.0];
        let z = [0.0f32, 100.0];
        gated(&mut o, &z);
        // rms = sqrt(12.5); sigmoid(0) = 0.5, sigmoid(100) ≈ 1.
        let rms = 12.5f32.sqrt();
        assert!((o[0] - 3.0 / rms * 2.0 * 0.5).abs() < 1e-5);
        assert!((o[1] - 4.0 / rms * 2.0).abs() < 1e-5);
    }

    fn gated(o: &mut [f32], z: &[f32]) {
        rms_norm_gated(o, z, &[2.0, 2.0], 0.0, GateActivation::Sigmoid);
    }
}
