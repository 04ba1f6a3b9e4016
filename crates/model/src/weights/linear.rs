//! A linear layer's weight matrix, wherever its bytes live.

use std::sync::Arc;

use crate::quant::view::{MatRef, Weights};
use crate::quant::{QuantizedMatrix, WeightFormat};
use crate::tensor::{DType, Matrix};

use super::packed::PackedMatrix;

/// A linear layer y = x·Wᵀ with W `[out, in]`: as stored in the checkpoint (memory-mapped)
/// or quantized on load. Backends run it (the CPU engine's `LinearExt::forward`, the CUDA
/// upload).
#[derive(Clone, Debug)]
pub enum Linear {
    Mapped(Matrix),
    Quantized(Arc<QuantizedMatrix>),
    /// Laid out by an install: a quantized resident tensor or an expert record's part.
    Packed(PackedMatrix),
}

impl Linear {
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
        }
    }

    /// Output features (rows of W).
    pub fn rows(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.rows,
            Linear::Quantized(q) => q.rows,
            Linear::Packed(p) => p.rows,
        }
    }

    /// Input features (columns of W).
    pub fn cols(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.cols,
            Linear::Quantized(q) => q.cols,
            Linear::Packed(p) => p.cols,
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
        for (r, row) in values.chunks_mut(mat.cols).enumerate() {
            mat.row_to_f32(r, row);
        }
        let quantized = QuantizedMatrix::quantize(&values, mat.rows, mat.cols, format);
        if let Linear::Mapped(m) = self {
            // The bf16 pages are not read again: keep them out of the resident set.
            m.release_pages();
        }
        Linear::Quantized(Arc::new(quantized))
    }
}
