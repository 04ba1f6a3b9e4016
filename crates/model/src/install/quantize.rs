//! The Q8/Q4 row quantizers a convert writes with. They restate, operation for operation, the
//! reference quantizers of `spindle_kernels::quant` (this crate depends on no backend), so an
//! install holds exactly the bytes that quantizing on load produces; the engine's install tests
//! check the two byte for byte.

use half::f16;

use crate::quant::{QuantFormat, GROUP};

fn f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// One row to Q8: `codes` has `src.len()` bytes (i8), `scales` `src.len()/32`.
pub fn q8_row(src: &[f32], codes: &mut [u8], scales: &mut [u16]) {
    for ((w, q), s) in src
        .chunks_exact(GROUP)
        .zip(codes.chunks_exact_mut(GROUP))
        .zip(scales.iter_mut())
    {
        let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        *s = f16_bits(amax / 127.0);
        let d = f16_to_f32(*s);
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (qi, &wi) in q.iter_mut().zip(w) {
            *qi = ((wi * inv).round().clamp(-127.0, 127.0) as i8) as u8;
        }
    }
}

/// One row to Q4: `codes` has `src.len()/2` bytes, `scales` `src.len()/32`.
pub fn q4_row(src: &[f32], codes: &mut [u8], scales: &mut [u16]) {
    const HALF: usize = GROUP / 2;
    for ((w, q), s) in src
        .chunks_exact(GROUP)
        .zip(codes.chunks_exact_mut(HALF))
        .zip(scales.iter_mut())
    {
        let extreme = w
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        *s = f16_bits(extreme / -8.0);
        let d = f16_to_f32(*s);
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let code = |v: f32| ((v * inv).round() + 8.0).clamp(0.0, 15.0) as u8;
        for j in 0..HALF {
            q[j] = code(w[j]) | (code(w[j + HALF]) << 4);
        }
    }
}

/// Quantizes `rows` rows of `values` (row-major, `cols` wide) in `format` (q8 or q4), appending
/// codes and little-endian f16 scales.
pub fn quantize_rows(
    format: QuantFormat,
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
            QuantFormat::Q8 => q8_row(row, c, s),
            QuantFormat::Q4 => q4_row(row, c, s),
            QuantFormat::Bf16 => unreachable!("bf16 is not quantized"),
        });
    codes.extend_from_slice(&c);
    scales.extend(s.iter().flat_map(|v| v.to_le_bytes()));
}
