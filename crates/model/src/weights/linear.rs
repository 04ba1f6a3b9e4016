//! A linear layer's weight matrix, wherever its bytes live.

use std::sync::Arc;

use crate::quant::view::{MatRef, Weights};
use crate::quant::{QuantizedMatrix, WeightFormat};
use crate::tensor::{DType, Matrix};

use super::packed::PackedMatrix;
use super::BlockMatrix;

/// A linear layer y = x·Wᵀ with W `[out, in]`: as stored in the checkpoint (memory-mapped)
/// or quantized on load. Backends run it (the CPU engine's `LinearExt::forward`, the CUDA
/// upload).
#[derive(Clone, Debug)]
pub enum Linear {
    Mapped(Matrix),
    Quantized(Arc<QuantizedMatrix>),
    /// Laid out by an install: a quantized resident tensor or an expert record's part.
    Packed(PackedMatrix),
    /// A GGUF tensor in its ggml blocks, run as stored (`--quant` not given on the CPU).
    Blocks(BlockMatrix),
}

impl Linear {
    /// A `[rows, cols]` matrix built from f32 `values` in `format`: bf16 rounded to nearest
    /// even (as a checkpoint stores it), Q8/Q4 by the reference quantizer. For tests and
    /// tools that compare backends on the same weights.
    pub fn from_f32(format: WeightFormat, values: &[f32], rows: usize, cols: usize) -> Linear {
        assert_eq!(
            values.len(),
            rows * cols,
            "[{rows}, {cols}] matrix from {} values",
            values.len()
        );
        match format {
            WeightFormat::Bf16 => {
                let mut words = vec![0u64; (rows * cols * 2).div_ceil(8)];
                for (i, &v) in values.iter().enumerate() {
                    let bits = v.to_bits();
                    let bf16 = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u64;
                    words[i / 4] |= bf16 << (16 * (i % 4));
                }
                let storage = crate::tensor::Storage::Owned {
                    words: Arc::new(words),
                    len: rows * cols * 2,
                };
                Linear::Mapped(Matrix::new(DType::Bf16, rows, cols, storage))
            }
            WeightFormat::Q8 | WeightFormat::Q4 => Linear::Quantized(Arc::new(
                QuantizedMatrix::quantize(values, rows, cols, format),
            )),
        }
    }

    /// The matrix as a borrowed view in its format.
    pub fn mat(&self) -> MatRef<'_> {
        match self {
            Linear::Mapped(m) => {
                let weights = match m.dtype {
                    DType::Bf16 => Weights::Bf16(bytemuck::cast_slice(m.bytes())),
                    DType::F16 => Weights::F16(bytemuck::cast_slice(m.bytes())),
                    DType::F32 => Weights::F32(bytemuck::cast_slice(m.bytes())),
                };
                MatRef::new(weights, m.rows, m.cols)
            }
            Linear::Quantized(q) => q.mat(),
            Linear::Packed(p) => p.mat(),
            Linear::Blocks(b) => b.mat(),
        }
    }

    /// The stored block-FP8 form of a matrix dequantized from one on load.
    pub fn fp8(&self) -> Option<&crate::tensor::StoredFp8> {
        match self {
            Linear::Mapped(m) => m.fp8(),
            _ => None,
        }
    }

    /// Output features (rows of W).
    pub fn rows(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.rows,
            Linear::Quantized(q) => q.rows,
            Linear::Packed(p) => p.rows,
            Linear::Blocks(b) => b.rows,
        }
    }

    /// Input features (columns of W).
    pub fn cols(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.cols,
            Linear::Quantized(q) => q.cols,
            Linear::Packed(p) => p.cols,
            Linear::Blocks(b) => b.cols,
        }
    }

    /// Output features (rows of W).
    pub fn out_features(&self) -> usize {
        self.rows()
    }

    /// Bytes of weights (codes and scales for quantized formats).
    pub fn size_bytes(&self) -> usize {
        self.mat().size_bytes()
    }

    /// This layer rounded to bf16 when it is mapped as f32 or f16, or held in GGUF blocks
    /// (dequantized exactly first, columns in input order); otherwise unchanged.
    pub fn rounded_to_bf16(&self) -> Linear {
        match self {
            Linear::Mapped(m) if m.dtype != DType::Bf16 => {
                Linear::from_f32(WeightFormat::Bf16, &m.to_f32(), m.rows, m.cols)
            }
            Linear::Blocks(b) => {
                let (mat, order) = (b.mat(), b.input_order());
                let mut values = vec![0.0f32; b.rows * b.cols];
                let mut stored = vec![0.0f32; b.cols];
                for (r, row) in values.chunks_mut(b.cols).enumerate() {
                    match order {
                        None => mat.row_to_f32(r, row),
                        Some(order) => {
                            mat.row_to_f32(r, &mut stored);
                            for (&to, &v) in order.iter().zip(&stored) {
                                row[to as usize] = v;
                            }
                        }
                    }
                }
                Linear::from_f32(WeightFormat::Bf16, &values, b.rows, b.cols)
            }
            _ => self.clone(),
        }
    }

    /// This layer in `format`; unchanged for bf16, or when the row length is not a whole
    /// number of quantization groups.
    pub fn quantized(&self, format: WeightFormat) -> Linear {
        if format == WeightFormat::Bf16 {
            return self.clone();
        }
        if !format.fits(self.cols()) || matches!(self, Linear::Quantized(_) | Linear::Packed(_)) {
            return self.clone();
        }
        let mat = self.mat();
        let mut values = vec![0.0f32; mat.rows * mat.cols];
        let order = match self {
            Linear::Blocks(b) => b.input_order(),
            _ => None,
        };
        let mut stored = vec![0.0f32; mat.cols];
        for (r, row) in values.chunks_mut(mat.cols).enumerate() {
            match order {
                None => mat.row_to_f32(r, row),
                Some(order) => {
                    // Columns back in input order.
                    mat.row_to_f32(r, &mut stored);
                    for (&to, &v) in order.iter().zip(&stored) {
                        row[to as usize] = v;
                    }
                }
            }
        }
        let quantized = QuantizedMatrix::quantize(&values, mat.rows, mat.cols, format);
        if let Linear::Mapped(m) = self {
            // The bf16 pages are not read again: keep them out of the resident set.
            m.release_pages();
        }
        Linear::Quantized(Arc::new(quantized))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_f32_rounds_bf16_to_nearest_even_and_quantizes_with_the_reference() {
        // 1 + 2^-8 is halfway between two bf16 values: it rounds to the even one (1.0);
        // 1 + 3·2^-8 rounds up to 1 + 2^-6.
        let values = [1.5, -2.25, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0];
        let m = Linear::from_f32(WeightFormat::Bf16, &values, 2, 2);
        let mut row = [0.0f32; 2];
        m.mat().row_to_f32(1, &mut row);
        assert_eq!(row, [1.0, 1.0 + 1.0 / 64.0]);
        m.mat().row_to_f32(0, &mut row);
        assert_eq!(row, [1.5, -2.25]);

        // An f32 matrix (dequantized FP8) rounds the same way; bf16 stays as it is.
        let wide = Linear::Mapped(Matrix::new(
            DType::F32,
            2,
            2,
            crate::tensor::Storage::from_f32(&values),
        ));
        let narrowed = wide.rounded_to_bf16();
        assert!(matches!(&narrowed, Linear::Mapped(m) if m.dtype == DType::Bf16));
        narrowed.mat().row_to_f32(1, &mut row);
        assert_eq!(row, [1.0, 1.0 + 1.0 / 64.0]);

        let values: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            let Linear::Quantized(q) = Linear::from_f32(format, &values, 2, 32) else {
                panic!("{format} is not quantized");
            };
            let want = QuantizedMatrix::quantize(&values, 2, 32, format);
            assert_eq!(
                (q.qs.as_slice(), q.scales.as_slice()),
                (want.qs.as_slice(), want.scales.as_slice())
            );
        }
    }
}
