//! `--check-weights`: scans stored weights for NaN and infinity before a model runs.
//!
//! A non-finite weight makes every logit NaN (and greedy decoding pick token 0) without any
//! error, so a load with `check_weights` reads every float of the checkpoint or install once
//! and refuses the first tensor holding one, by name and element.

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::install::Install;
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

/// Scans the routed experts of `install` (the files the manifest's expert layers name): the
/// f16 scales of q8/q4 parts, the values of bf16/f16/f32 parts. A region the file does not
/// hold is left to the loader, which refuses it by name.
pub fn check_install_experts(install: &Install) -> Result<()> {
    for layer in &install.manifest().experts {
        let path = install.path_of(&layer.file);
        let file = crate::install::MappedFile::open(&path).map_err(ModelError::from)?;
        let bytes = file.bytes();
        for expert in 0..layer.experts {
            for part in &layer.parts {
                let (dtype, offset, len) = match part.format.as_str() {
                    "bf16" => (DType::Bf16, part.codes_offset, part.codes_bytes),
                    "f16" => (DType::F16, part.codes_offset, part.codes_bytes),
                    "f32" => (DType::F32, part.codes_offset, part.codes_bytes),
                    _ => (DType::F16, part.scales_offset, part.scales_bytes),
                };
                let start = (expert as u64)
                    .checked_mul(layer.stride)
                    .and_then(|base| base.checked_add(offset));
                let region =
                    start
                        .and_then(|s| Some((s, s.checked_add(len)?)))
                        .and_then(|(s, e)| {
                            bytes.get(usize::try_from(s).ok()?..usize::try_from(e).ok()?)
                        });
                let Some(region) = region else { continue };
                if let Some((index, nan)) = first_non_finite(dtype, region) {
                    let what = if part.format.starts_with('q') {
                        format!(
                            "layer {} expert {expert} {} (scales)",
                            layer.layer, part.name
                        )
                    } else {
                        format!("layer {} expert {expert} {}", layer.layer, part.name)
                    };
                    return Err(non_finite_error(&path, &what, index, nan));
                }
            }
        }
    }
    Ok(())
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
