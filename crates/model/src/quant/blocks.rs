//! The block layouts of the Q8 and Q4 formats and their scalar reference (de)quantizers, the
//! one copy every kernel (CPU SIMD, CUDA) and `spindle convert` is checked against. The layouts
//! are described in [`crate::quant`].

use half::f16;

/// Weights per scale group, both formats.
pub const GROUP: usize = 32;
/// Bytes of Q4 codes per group.
pub const Q4_GROUP_BYTES: usize = GROUP / 2;

/// `v` rounded to an IEEE half, as bits.
pub fn f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

/// An IEEE half bit pattern as f32.
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

/// A bfloat16 bit pattern as f32.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}
