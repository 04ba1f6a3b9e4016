//! Weight formats: how a weight matrix is stored (bf16 as in the checkpoint, or a block format
//! quantized by the reference quantizers in [`blocks`]), their sizes, and an owned quantized
//! matrix ([`QuantizedMatrix`]). Every backend's kernels read these layouts; this module is
//! their one description.
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
//! [`ggml`] describes llama.cpp's block types as a GGUF file stores them (Q8_0, Q4_0, Q4_K,
//! Q5_K, Q6_K) and dequantizes them exactly; the CPU runs them in those blocks.
//!
//! Activations quantized for the integer dot products are the CPU kernels' business
//! (`spindle_kernels::quant`).

use std::fmt;
use std::str::FromStr;

pub mod blocks;
pub mod ggml;
mod matrix;
pub mod view;

pub use blocks::{GROUP, Q4_GROUP_BYTES};
pub use matrix::QuantizedMatrix;

/// How a weight matrix is stored: as in the checkpoint, or in a block format (how an install
/// stores a class of matrices, and what `--quant` asks for on load).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// As stored in the checkpoint (bf16 for every released checkpoint).
    #[default]
    Bf16,
    Q8,
    Q4,
}

/// A `--quant` value that is not a format.
#[derive(Debug, thiserror::Error)]
#[error("unknown quantization {0:?}: expected bf16, q8 or q4")]
pub struct UnknownWeightFormat(pub String);

impl FromStr for WeightFormat {
    type Err = UnknownWeightFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(WeightFormat::Bf16),
            "q8" => Ok(WeightFormat::Q8),
            "q4" => Ok(WeightFormat::Q4),
            _ => Err(UnknownWeightFormat(s.to_string())),
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl WeightFormat {
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Q8 => "q8",
            WeightFormat::Q4 => "q4",
        }
    }

    /// Weights per scale, or None for bf16.
    pub fn group(self) -> Option<usize> {
        match self {
            WeightFormat::Bf16 => None,
            WeightFormat::Q8 | WeightFormat::Q4 => Some(GROUP),
        }
    }

    /// Storage bits per weight, scales included.
    pub fn bits_per_weight(self) -> f64 {
        match self {
            WeightFormat::Bf16 => 16.0,
            WeightFormat::Q8 => 8.0 + 16.0 / GROUP as f64,
            WeightFormat::Q4 => 4.0 + 16.0 / GROUP as f64,
        }
    }

    /// Whether a `[rows, cols]` matrix can be stored in this format.
    pub fn fits(self, cols: usize) -> bool {
        self.group().is_none_or(|g| cols % g == 0)
    }

    /// Bytes of codes (bf16: the values) of a `[rows, cols]` matrix.
    pub fn code_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WeightFormat::Bf16 => rows * cols * 2,
            WeightFormat::Q8 => rows * cols,
            WeightFormat::Q4 => rows * cols / 2,
        }
    }

    /// Bytes of f16 scales of a `[rows, cols]` matrix.
    pub fn scale_bytes(self, rows: usize, cols: usize) -> usize {
        self.group().map_or(0, |g| rows * (cols / g) * 2)
    }

    /// Total bytes of a `[rows, cols]` matrix, or None when `cols` is not a whole number of
    /// groups.
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        self.fits(cols)
            .then(|| self.code_bytes(rows, cols) + self.scale_bytes(rows, cols))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_names_and_refuses_others() {
        for f in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            assert_eq!(f.name().parse::<WeightFormat>().unwrap(), f);
            assert_eq!(
                f.to_string()
                    .to_uppercase()
                    .parse::<WeightFormat>()
                    .unwrap(),
                f
            );
        }
        let err = "q5".parse::<WeightFormat>().unwrap_err();
        assert!(err.to_string().contains("\"q5\""), "{err}");
    }

    #[test]
    fn sizes_agree_with_bits_per_weight() {
        let (rows, cols) = (8192, 2048);
        for f in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let bytes = f.matrix_bytes(rows, cols).unwrap();
            assert_eq!(
                bytes as f64 * 8.0,
                f.bits_per_weight() * (rows * cols) as f64
            );
        }
        assert_eq!(
            WeightFormat::Q4.matrix_bytes(2, 64),
            Some(2 * 32 + 2 * 2 * 2)
        );
        assert_eq!(WeightFormat::Q8.matrix_bytes(3, 48), None);
        assert_eq!(WeightFormat::Bf16.matrix_bytes(3, 47), Some(3 * 47 * 2));
    }
}
