//! Block-quantized weight formats and their scalar reference (de)quantizers.
//!
//! Both formats are symmetric, with one IEEE-half scale per group of 32 consecutive weights of
//! a row. A `[rows, cols]` matrix requires `cols % 32 == 0` (every real model dimension is a
//! multiple of 64) and is stored as two plain arrays, each row-major:
//!
//! - **Q8** (8.5 bits/weight): `qs: [rows, cols]` of `i8` in `[-127, 127]`, and
//!   `scales: [rows, cols/32]` of f16 bits. Weight `(r, c)` = `scales[r, c/32] · qs[r, c]`.
//! - **Q4** (4.5 bits/weight): `qs: [rows, cols/2]` of `u8`, 16 bytes per group, and
//!   `scales: [rows, cols/32]` of f16 bits. In group `g` of a row, byte `j` (0..16) holds
//!   weight `32g + j` in its low nibble and weight `32g + 16 + j` in its high nibble (the
//!   llama.cpp Q4_0 order: one 16-byte load, masked and shifted, gives 32 weights in order).
//!   Weight = `scale · (nibble − 8)`. The scale is the group's largest-magnitude weight divided
//!   by −8, so that weight lands exactly on −8 and all 16 levels are used.
//!
//! Why symmetric Q4 with groups of 32: on Gaussian weights (2^20 samples, f16 scales) the
//! relative RMS reconstruction error is 0.0859 for symmetric/g32 (4.5 bits) against 0.0896 for
//! scale+min/g64 (also 4.5 bits), 0.0782 for scale+min/g32 (5.0 bits, 11% more bytes to read
//! per token) and 0.0948 for symmetric/g64 (4.25 bits). At equal size symmetric/g32 is the most
//! accurate, and it needs no min array. Q8/g32 measures 0.0053.
//!
//! Activations are quantized per token for the integer dot products ([`QuantizedActs`]): int8
//! per group of 32 with an f32 scale, plus `scale · Σq` per group, which folds the −8 (Q4) or
//! +128 (Q8 on AVX-512, read as unsigned) offsets out of the integer sums.

use half::f16;

/// Weights per scale group, both formats.
pub const GROUP: usize = 32;
/// Bytes of Q4 codes per group.
pub const Q4_GROUP_BYTES: usize = GROUP / 2;

fn f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Reference Q8 quantizer for one row: `qs` has `src.len()` codes, `scales` `src.len()/32`.
pub fn quantize_q8_row(src: &[f32], qs: &mut [i8], scales: &mut [u16]) {
    assert_eq!(
        src.len() % GROUP,
        0,
        "Q8 rows need a multiple of {GROUP} columns, got {}",
        src.len()
    );
    for ((w, q), s) in src
        .chunks_exact(GROUP)
        .zip(qs.chunks_exact_mut(GROUP))
        .zip(scales.iter_mut())
    {
        let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        *s = f16_bits(amax / 127.0);
        let d = f16_to_f32(*s);
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (qi, &wi) in q.iter_mut().zip(w) {
            *qi = (wi * inv).round().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// Reference Q8 dequantizer for one row.
pub fn dequantize_q8_row(qs: &[i8], scales: &[u16], out: &mut [f32]) {
    for ((q, &s), o) in qs
        .chunks_exact(GROUP)
        .zip(scales)
        .zip(out.chunks_exact_mut(GROUP))
    {
        let d = f16_to_f32(s);
        o.iter_mut().zip(q).for_each(|(o, &q)| *o = d * q as f32);
    }
}

/// Reference Q4 quantizer for one row: `qs` has `src.len()/2` bytes, `scales` `src.len()/32`.
pub fn quantize_q4_row(src: &[f32], qs: &mut [u8], scales: &mut [u16]) {
    assert_eq!(
        src.len() % GROUP,
        0,
        "Q4 rows need a multiple of {GROUP} columns, got {}",
        src.len()
    );
    let groups = src
        .chunks_exact(GROUP)
        .zip(qs.chunks_exact_mut(Q4_GROUP_BYTES));
    for ((w, q), s) in groups.zip(scales.iter_mut()) {
        let extreme = w
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        *s = f16_bits(extreme / -8.0);
        let d = f16_to_f32(*s);
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| ((v * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
        for j in 0..Q4_GROUP_BYTES {
            q[j] = code(w[j]) | (code(w[j + Q4_GROUP_BYTES]) << 4);
        }
    }
}

/// Reference Q4 dequantizer for one row.
pub fn dequantize_q4_row(qs: &[u8], scales: &[u16], out: &mut [f32]) {
    for ((q, &s), o) in qs
        .chunks_exact(Q4_GROUP_BYTES)
        .zip(scales)
        .zip(out.chunks_exact_mut(GROUP))
    {
        let d = f16_to_f32(s);
        for j in 0..Q4_GROUP_BYTES {
            o[j] = d * ((q[j] & 0xF) as i32 - 8) as f32;
            o[j + Q4_GROUP_BYTES] = d * ((q[j] >> 4) as i32 - 8) as f32;
        }
    }
}

/// An owned quantized `[rows, cols]` matrix (what `spindle convert` writes, and tests use).
#[derive(Clone, Debug)]
pub struct QuantizedMatrix {
    pub rows: usize,
    pub cols: usize,
    /// Q8: `i8` codes as bytes; Q4: packed nibbles.
    pub qs: Vec<u8>,
    pub scales: Vec<u16>,
    pub is_q4: bool,
}

impl QuantizedMatrix {
    /// Quantizes row-major f32 `src` to Q8, or to Q4 when `q4`.
    pub fn quantize(src: &[f32], rows: usize, cols: usize, q4: bool) -> Self {
        assert_eq!(
            src.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        let code_bytes = if q4 { cols / 2 } else { cols };
        let mut qs = vec![0u8; rows * code_bytes];
        let mut scales = vec![0u16; rows * cols / GROUP];
        let rows_iter = src.chunks_exact(cols).zip(qs.chunks_exact_mut(code_bytes));
        for ((row, q), s) in rows_iter.zip(scales.chunks_exact_mut(cols / GROUP)) {
            if q4 {
                quantize_q4_row(row, q, s);
            } else {
                quantize_q8_row(row, bytemuck::cast_slice_mut(q), s);
            }
        }
        QuantizedMatrix {
            rows,
            cols,
            qs,
            scales,
            is_q4: q4,
        }
    }

    pub fn mat(&self) -> crate::MatRef<'_> {
        let weights = if self.is_q4 {
            crate::Weights::Q4 {
                qs: &self.qs,
                scales: &self.scales,
            }
        } else {
            crate::Weights::Q8 {
                qs: bytemuck::cast_slice(&self.qs),
                scales: &self.scales,
            }
        };
        crate::MatRef::new(weights, self.rows, self.cols)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn round_trip_error_is_within_one_step() {
        let mut r = rng(11);
        let src = vec(&mut r, 4 * 128, 0.05);
        for q4 in [false, true] {
            let m = QuantizedMatrix::quantize(&src, 4, 128, q4);
            let mut back = vec![0.0; src.len()];
            for row in 0..4 {
                let s = &m.scales[row * 4..(row + 1) * 4];
                let o = &mut back[row * 128..(row + 1) * 128];
                if q4 {
                    dequantize_q4_row(&m.qs[row * 64..(row + 1) * 64], s, o);
                } else {
                    dequantize_q8_row(
                        bytemuck::cast_slice(&m.qs[row * 128..(row + 1) * 128]),
                        s,
                        o,
                    );
                }
            }
            for (g, (a, b)) in src.chunks(GROUP).zip(back.chunks(GROUP)).enumerate() {
                let d = f16_to_f32(m.scales[g]).abs();
                assert!(d > 0.0);
                // Q8 rounds (half a step); Q4 may also clip the far side of the group at +7.
                let bound = if q4 { 1.0 } else { 0.5 } * d * 1.01;
                assert!(max_abs_diff(a, b) <= bound, "q4={q4} group {g}");
            }
        }
    }

    #[test]
    fn q4_extreme_lands_on_minus_eight() {
        let mut w = [0.01f32; GROUP];
        w[20] = -0.4;
        let (mut q, mut s) = ([0u8; 16], [0u16; 1]);
        quantize_q4_row(&w, &mut q, &mut s);
        assert_eq!(
            q[4] >> 4,
            0,
            "weight 20 is the high nibble of byte 4, code 0 = −8·d"
        );
        let mut back = [0.0; GROUP];
        dequantize_q4_row(&q, &s, &mut back);
        assert!((back[20] + 0.4).abs() < 1e-3);
    }
}
