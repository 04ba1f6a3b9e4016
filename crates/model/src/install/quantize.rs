//! The quantizer a convert writes with: whole matrices to Q8/Q4 with the reference row
//! quantizers of [`crate::quant::blocks`], so an install holds exactly the bytes that
//! quantizing on load produces.

use crate::quant::blocks::{quantize_q4_row, quantize_q8_row};
use crate::quant::{WeightFormat, GROUP};

/// Quantizes `rows` rows of `values` (row-major, `cols` wide) in `format` (q8 or q4), appending
/// codes and little-endian f16 scales.
pub fn quantize_rows(
    format: WeightFormat,
    values: &[f32],
    cols: usize,
    codes: &mut Vec<u8>,
    scales: &mut Vec<u8>,
) {
    use rayon::prelude::*;
    let rows = values.len() / cols;
    let code_cols = format.code_bytes(1, cols);
    let groups = cols / GROUP;
    let mut c = vec![0u8; rows * code_cols];
    let mut s = vec![0u16; rows * groups];
    values
        .par_chunks(cols)
        .zip(c.par_chunks_mut(code_cols))
        .zip(s.par_chunks_mut(groups))
        .for_each(|((row, c), s)| match format {
            WeightFormat::Q8 => quantize_q8_row(row, bytemuck::cast_slice_mut(c), s),
            WeightFormat::Q4 => quantize_q4_row(row, c, s),
            WeightFormat::Bf16 => unreachable!("bf16 is not quantized"),
        });
    codes.extend_from_slice(&c);
    scales.extend(s.iter().flat_map(|v| v.to_le_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantizedMatrix;

    #[test]
    fn convert_writes_the_bytes_quantizing_on_load_holds() {
        let (rows, cols) = (7, 96);
        let mut state = 0x1234_5678u64;
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.3
            })
            .collect();
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            quantize_rows(format, &values, cols, &mut codes, &mut scales);
            let reference = QuantizedMatrix::quantize(&values, rows, cols, format);
            assert_eq!(codes, reference.qs, "{format} codes");
            let ref_scales: Vec<u8> = reference
                .scales
                .iter()
                .flat_map(|s| s.to_le_bytes())
                .collect();
            assert_eq!(scales, ref_scales, "{format} scales");
        }
    }
}
