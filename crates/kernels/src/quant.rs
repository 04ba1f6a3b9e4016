//! Activations quantized per token for the integer dot products with Q8/Q4 weights, and the
//! scalar reference dots. The weight formats themselves (layouts, reference quantizers) are
//! `spindle_model::quant`.
//!
//! Activations are quantized per token ([`QuantizedActs`]): int8 per group of 32 with an f32
//! scale, plus `scale · Σq` per group, which folds the −8 (Q4) or +128 (Q8 on AVX-512, read as
//! unsigned) offsets out of the integer sums.

use spindle_model::quant::blocks::f16_to_f32;
use spindle_model::quant::{GROUP, Q4_GROUP_BYTES};

/// Tokens quantized to int8 per group of 32 for the integer dot products.
/// For `tokens` rows of `cols`: `qs [tokens, cols]`, `d [tokens, cols/32]` (scales),
/// `sums [tokens, cols/32]` = `Σ qs` over the group and `sd` = `d · sums`.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    pub cols: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub sd: Vec<f32>,
    pub sums: Vec<i32>,
}

/// Reference quantizer of whole groups: `x` → codes `qs`, and per group the scale `d`, the
/// scaled sum `sd` and the code sum `sums`. The SIMD quantizers must give the same bits.
pub fn quantize_acts_ref(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    sd: &mut [f32],
    sums: &mut [i32],
) {
    let blocks = x.chunks_exact(GROUP).zip(qs.chunks_exact_mut(GROUP));
    let per_group = d.iter_mut().zip(sd.iter_mut()).zip(sums.iter_mut());
    for ((xb, qb), ((d, sd), s)) in blocks.zip(per_group) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        *d = amax / 127.0;
        let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round() as i8;
            sum += *q as i32;
        }
        *s = sum;
        *sd = *d * sum as f32;
    }
}

impl QuantizedActs {
    /// Reference quantizer: `x` is `[tokens, cols]`, `cols % 32 == 0`.
    pub fn quantize(x: &[f32], cols: usize) -> Self {
        let mut acts = Self::zeroed(x.len(), cols);
        quantize_acts_ref(x, &mut acts.qs, &mut acts.d, &mut acts.sd, &mut acts.sums);
        acts
    }

    /// Storage for `len` activations of rows of `cols`, all zero.
    pub(crate) fn zeroed(len: usize, cols: usize) -> Self {
        assert_eq!(
            cols % GROUP,
            0,
            "quantized activations need a multiple of {GROUP} columns"
        );
        let groups = len / GROUP;
        QuantizedActs {
            cols,
            qs: vec![0; len],
            d: vec![0.0; groups],
            sd: vec![0.0; groups],
            sums: vec![0; groups],
        }
    }

    /// Tokens in this batch.
    pub fn tokens(&self) -> usize {
        self.qs.len() / self.cols.max(1)
    }

    /// Token `t`'s codes, scales and scaled sums.
    pub fn token(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let g = self.cols / GROUP;
        (
            &self.qs[t * self.cols..(t + 1) * self.cols],
            &self.d[t * g..(t + 1) * g],
            &self.sd[t * g..(t + 1) * g],
        )
    }
}

/// Reference integer dot of a Q8 row with quantized activations.
pub fn dot_q8_ref(qs: &[i8], scales: &[u16], xq: &[i8], xd: &[f32]) -> f32 {
    let groups = qs.chunks_exact(GROUP).zip(xq.chunks_exact(GROUP));
    groups
        .zip(scales.iter().zip(xd))
        .map(|((w, x), (&s, &d))| {
            let isum: i32 = w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum();
            f16_to_f32(s) * d * isum as f32
        })
        .sum()
}

/// Reference integer dot of a Q4 row with quantized activations.
pub fn dot_q4_ref(qs: &[u8], scales: &[u16], xq: &[i8], xd: &[f32]) -> f32 {
    let groups = qs.chunks_exact(Q4_GROUP_BYTES).zip(xq.chunks_exact(GROUP));
    groups
        .zip(scales.iter().zip(xd))
        .map(|((w, x), (&s, &d))| {
            let mut isum = 0i32;
            for j in 0..Q4_GROUP_BYTES {
                isum += ((w[j] & 0xF) as i32 - 8) * x[j] as i32;
                isum += ((w[j] >> 4) as i32 - 8) * x[j + Q4_GROUP_BYTES] as i32;
            }
            f16_to_f32(s) * d * isum as f32
        })
        .sum()
}
