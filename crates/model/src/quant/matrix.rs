//! An owned block-quantized matrix.

use crate::quant::blocks::{quantize_q4_row, quantize_q8_row, GROUP};
use crate::quant::view::{MatRef, Weights};
use crate::quant::WeightFormat;

/// An owned quantized `[rows, cols]` matrix (what `spindle convert` writes, and tests use).
#[derive(Clone, Debug)]
pub struct QuantizedMatrix {
    pub rows: usize,
    pub cols: usize,
    /// Q8: `i8` codes as bytes; Q4: packed nibbles.
    pub qs: Vec<u8>,
    /// f16 bits, `[rows, cols/32]`.
    pub scales: Vec<u16>,
    /// [`WeightFormat::Q8`] or [`WeightFormat::Q4`].
    pub format: WeightFormat,
}

impl QuantizedMatrix {
    /// Quantizes row-major f32 `src` to `format` (Q8 or Q4; bf16 is not a block format and
    /// panics).
    pub fn quantize(src: &[f32], rows: usize, cols: usize, format: WeightFormat) -> Self {
        assert_ne!(
            format,
            WeightFormat::Bf16,
            "bf16 is not a block-quantized format"
        );
        assert_eq!(
            src.len(),
            rows * cols,
            "matrix data does not match its shape"
        );
        let code_bytes = format.code_bytes(1, cols);
        let mut qs = vec![0u8; rows * code_bytes];
        let mut scales = vec![0u16; rows * cols / GROUP];
        let rows_iter = src.chunks_exact(cols).zip(qs.chunks_exact_mut(code_bytes));
        for ((row, q), s) in rows_iter.zip(scales.chunks_exact_mut(cols / GROUP)) {
            match format {
                WeightFormat::Q4 => quantize_q4_row(row, q, s),
                _ => quantize_q8_row(row, bytemuck::cast_slice_mut(q), s),
            }
        }
        QuantizedMatrix {
            rows,
            cols,
            qs,
            scales,
            format,
        }
    }

    /// This matrix as a borrowed view.
    pub fn mat(&self) -> MatRef<'_> {
        let weights = if self.format == WeightFormat::Q4 {
            Weights::Q4 {
                qs: &self.qs,
                scales: &self.scales,
            }
        } else {
            Weights::Q8 {
                qs: bytemuck::cast_slice(&self.qs),
                scales: &self.scales,
            }
        };
        MatRef::new(weights, self.rows, self.cols)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::*;
    use spindle_testkit::{max_abs_diff, Rng};

    #[test]
    fn round_trip_error_is_within_one_step() {
        let src = Rng(11).signed_vec(4 * 128, 0.05);
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            let q4 = format == WeightFormat::Q4;
            let m = QuantizedMatrix::quantize(&src, 4, 128, format);
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
