//! Borrowed weight matrices in the formats of [`crate::quant`]: what every backend's kernels
//! read and upload.

use crate::quant::blocks::{self, GROUP, Q4_GROUP_BYTES};
use crate::quant::ggml::{dequantize_into, GgmlType};

pub use crate::quant::blocks::bf16_to_f32;

/// Elements of a row-major weight matrix.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// bfloat16 bit patterns.
    Bf16(&'a [u16]),
    /// IEEE half bit patterns.
    F16(&'a [u16]),
    F32(&'a [f32]),
    /// Q8 blocks (layout in [`crate::quant`]): `qs [rows, cols]`, f16 `scales [rows, cols/32]`.
    Q8 {
        qs: &'a [i8],
        scales: &'a [u16],
    },
    /// Q4 blocks (layout in [`crate::quant`]): packed `qs [rows, cols/2]`, f16 `scales [rows, cols/32]`.
    Q4 {
        qs: &'a [u8],
        scales: &'a [u16],
    },
    /// A GGUF tensor kept in its ggml blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, laid out as in
    /// `crate::quant::ggml`), each row a whole number of blocks.
    Ggml {
        ty: GgmlType,
        blocks: &'a [u8],
    },
}

/// A row-major `[rows, cols]` matrix; y = x·Wᵀ reads one row per output.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub weights: Weights<'a>,
    pub rows: usize,
    pub cols: usize,
}

impl<'a> MatRef<'a> {
    /// Panics when the data does not match the shape, or a block format has `cols % 32 != 0`.
    pub fn new(weights: Weights<'a>, rows: usize, cols: usize) -> Self {
        let len = match weights {
            Weights::Bf16(w) | Weights::F16(w) => w.len(),
            Weights::F32(w) => w.len(),
            Weights::Q8 { qs, scales } => {
                check_scales(scales.len(), rows, cols);
                qs.len()
            }
            Weights::Q4 { qs, scales } => {
                check_scales(scales.len(), rows, cols);
                qs.len() * 2
            }
            Weights::Ggml { ty, blocks } => {
                assert_eq!(
                    cols % ty.block_elements(),
                    0,
                    "{} rows need a multiple of {} columns, got {cols}",
                    ty.name(),
                    ty.block_elements()
                );
                blocks.len() / ty.block_bytes() * ty.block_elements()
            }
        };
        assert_eq!(
            len,
            rows * cols,
            "matrix data does not match its shape [{rows}, {cols}]"
        );
        MatRef {
            weights,
            rows,
            cols,
        }
    }

    /// Rows `[first, first + count)`.
    pub fn rows_slice(&self, first: usize, count: usize) -> MatRef<'a> {
        let (a, b) = (first * self.cols, (first + count) * self.cols);
        let (ga, gb) = (a / GROUP, b / GROUP);
        let weights = match self.weights {
            Weights::Bf16(w) => Weights::Bf16(&w[a..b]),
            Weights::F16(w) => Weights::F16(&w[a..b]),
            Weights::F32(w) => Weights::F32(&w[a..b]),
            Weights::Q8 { qs, scales } => Weights::Q8 {
                qs: &qs[a..b],
                scales: &scales[ga..gb],
            },
            Weights::Q4 { qs, scales } => Weights::Q4 {
                qs: &qs[a / 2..b / 2],
                scales: &scales[ga..gb],
            },
            Weights::Ggml { ty, blocks } => {
                let row = ggml_row_bytes(ty, self.cols);
                Weights::Ggml {
                    ty,
                    blocks: &blocks[first * row..(first + count) * row],
                }
            }
        };
        MatRef {
            weights,
            rows: count,
            cols: self.cols,
        }
    }

    /// Row `r` as f32 values (embedding lookup; the GEMM's dequantized tiles).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let (a, b) = (r * self.cols, (r + 1) * self.cols);
        let (ga, gb) = (a / GROUP, b / GROUP);
        match self.weights {
            Weights::Bf16(w) => out
                .iter_mut()
                .zip(&w[a..b])
                .for_each(|(o, &x)| *o = bf16_to_f32(x)),
            Weights::F16(w) => out
                .iter_mut()
                .zip(&w[a..b])
                .for_each(|(o, &x)| *o = half::f16::from_bits(x).to_f32()),
            Weights::F32(w) => out.copy_from_slice(&w[a..b]),
            Weights::Q8 { qs, scales } => {
                blocks::dequantize_q8_row(&qs[a..b], &scales[ga..gb], out)
            }
            Weights::Q4 { qs, scales } => {
                let bytes = &qs[ga * Q4_GROUP_BYTES..gb * Q4_GROUP_BYTES];
                blocks::dequantize_q4_row(bytes, &scales[ga..gb], out)
            }
            Weights::Ggml { ty, blocks } => {
                let row = ggml_row_bytes(ty, self.cols);
                dequantize_into(ty, &blocks[r * row..(r + 1) * row], out)
            }
        }
    }

    /// Bytes of weights this matrix holds (codes and scales).
    pub fn size_bytes(&self) -> usize {
        match self.weights {
            Weights::Bf16(w) | Weights::F16(w) => w.len() * 2,
            Weights::F32(w) => w.len() * 4,
            Weights::Q8 { qs, scales } => qs.len() + scales.len() * 2,
            Weights::Q4 { qs, scales } => qs.len() + scales.len() * 2,
            Weights::Ggml { blocks, .. } => blocks.len(),
        }
    }
}

/// Bytes of one row of `cols` elements in ggml blocks of `ty`.
pub fn ggml_row_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_elements() * ty.block_bytes()
}

fn check_scales(scales: usize, rows: usize, cols: usize) {
    assert_eq!(
        cols % GROUP,
        0,
        "block-quantized rows need a multiple of {GROUP} columns, got {cols}"
    );
    assert_eq!(
        scales,
        rows * cols / GROUP,
        "scale count does not match the shape [{rows}, {cols}]"
    );
}
