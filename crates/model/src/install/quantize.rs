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
