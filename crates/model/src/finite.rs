//! `--check-weights`: scans stored weights for NaN and infinity before a model runs.
//!
//! A non-finite weight makes every logit NaN (and greedy decoding pick token 0) without any
//! error, so a load with `check_weights` reads every float of the checkpoint or install once
//! and refuses the first tensor holding one, by name and element.

use std::path::Path;

use crate::error::ModelError;
use crate::tensor::DType;

/// The index of the first NaN or infinity among the little-endian `dtype` values in `bytes`
/// (scanned on the bit patterns: exponent all ones), and whether it is a NaN.
pub fn first_non_finite(dtype: DType, bytes: &[u8]) -> Option<(usize, bool)> {
    // Each chunk is scanned without an early exit (so it vectorizes); the rare bad chunk is
    // then searched element by element.
    const CHUNK: usize = 1 << 16;
    let size = dtype.size();
    let classify = |b: &[u8]| -> Option<bool> {
        match dtype {
            DType::Bf16 => {
                let v = u16::from_le_bytes([b[0], b[1]]);
                (v & 0x7f80 == 0x7f80).then_some(v & 0x007f != 0)
            }
            DType::F16 => {
                let v = u16::from_le_bytes([b[0], b[1]]);
                (v & 0x7c00 == 0x7c00).then_some(v & 0x03ff != 0)
            }
            DType::F32 => {
                let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                (v & 0x7f80_0000 == 0x7f80_0000).then_some(v & 0x007f_ffff != 0)
            }
        }
    };
    for (c, chunk) in bytes.chunks(CHUNK * size).enumerate() {
        let any = chunk
            .chunks_exact(size)
            .fold(false, |any, b| any | classify(b).is_some());
        if any {
            return chunk
                .chunks_exact(size)
                .enumerate()
                .find_map(|(i, b)| classify(b).map(|nan| (c * CHUNK + i, nan)));
        }
    }
    None
}

/// The error for a non-finite element `index` of tensor `tensor` in `path`.
pub(crate) fn non_finite_error(path: &Path, tensor: &str, index: usize, nan: bool) -> ModelError {
    ModelError::NonFinite {
        path: path.to_owned(),
        tensor: tensor.to_owned(),
        index,
        what: if nan { "NaN" } else { "an infinity" },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nan_and_infinity_in_every_dtype() {
        let f32s: Vec<u8> = [1.0f32, -2.5, f32::INFINITY, f32::NAN]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(DType::F32, &f32s), Some((2, false)));
        assert_eq!(first_non_finite(DType::F32, &f32s[..8]), None);
        let bf16 = |v: f32| ((v.to_bits() >> 16) as u16).to_le_bytes();
        let b: Vec<u8> = [0.0f32, 65504.0, f32::NAN]
            .iter()
            .flat_map(|&v| bf16(v))
            .collect();
        assert_eq!(first_non_finite(DType::Bf16, &b), Some((2, true)));
        let h: Vec<u8> = [half::f16::MAX, half::f16::NEG_INFINITY]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(first_non_finite(DType::F16, &h), Some((1, false)));
        // Past the first chunk.
        let mut big = vec![0u8; (1 << 17) * 4];
        big[(100_000 * 4)..(100_000 * 4 + 4)].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(first_non_finite(DType::F32, &big), Some((100_000, true)));
    }
}
