//! bf16 weight matrices in VRAM and y = x·Wᵀ on the device: a warp-per-row matvec for decode
//! and small batches, a tiled GEMM for prefill.

use spindle_engine::weights::Linear;
use spindle_model::{DType, Matrix};

use crate::device::{i, p, DevBuf, Device};
use crate::error::{CudaError, Result};

/// Up to this many tokens a linear layer runs the matvec kernel (the weights are read once
/// for all of them); more run the GEMM.
const MATVEC_MAX_TOKENS: usize = 8;

/// A row-major `[rows, cols]` bf16 matrix on the device.
pub struct DevMatrix {
    pub buf: DevBuf<u16>,
    pub rows: usize,
    pub cols: usize,
}

/// The bf16 elements of a checkpoint matrix, or an error naming its dtype.
pub fn bf16_words(m: &Matrix) -> Result<&[u16]> {
    if m.dtype != DType::Bf16 {
        return Err(CudaError::Unsupported(format!(
            "a [{}, {}] weight matrix is {}; the CUDA backend reads bf16 weights only",
            m.rows,
            m.cols,
            m.dtype.name()
        )));
    }
    Ok(bytemuck::cast_slice(m.bytes()))
}

/// Builds one device matrix out of row ranges of checkpoint matrices (to fuse projections
/// that read the same input).
pub struct MatrixBuilder<'d> {
    dev: &'d Device,
    m: DevMatrix,
}

impl<'d> MatrixBuilder<'d> {
    pub fn new(dev: &'d Device, rows: usize, cols: usize) -> Result<Self> {
        Ok(MatrixBuilder {
            dev,
            m: DevMatrix {
                buf: dev.zeros(rows * cols)?,
                rows,
                cols,
            },
        })
    }

    /// Copies rows `[from, from + count)` of `src` to rows `[to, to + count)`.
    pub fn put(&mut self, src: &Matrix, from: usize, count: usize, to: usize) -> Result<&mut Self> {
        assert_eq!(
            src.cols, self.m.cols,
            "fused matrices share their input width"
        );
        assert!(from + count <= src.rows && to + count <= self.m.rows);
        let words = bf16_words(src)?;
        let cols = self.m.cols;
        self.dev.write(
            &mut self.m.buf,
            to * cols,
            &words[from * cols..(from + count) * cols],
        )?;
        Ok(self)
    }

    /// Copies all of `src` to rows `[to, to + src.rows)`.
    pub fn put_all(&mut self, src: &Matrix, to: usize) -> Result<&mut Self> {
        self.put(src, 0, src.rows, to)
    }

    pub fn finish(self) -> DevMatrix {
        self.m
    }
}

impl DevMatrix {
    /// Uploads one checkpoint matrix as is.
    pub fn upload(dev: &Device, m: &Matrix) -> Result<Self> {
        let mut b = MatrixBuilder::new(dev, m.rows, m.cols)?;
        b.put_all(m, 0)?;
        Ok(b.finish())
    }

    /// Uploads the vertical concatenation of `parts`.
    pub fn stack(dev: &Device, parts: &[&Matrix]) -> Result<Self> {
        let rows = parts.iter().map(|m| m.rows).sum();
        let mut b = MatrixBuilder::new(dev, rows, parts[0].cols)?;
        let mut at = 0;
        for m in parts {
            b.put_all(m, at)?;
            at += m.rows;
        }
        Ok(b.finish())
    }
}

/// `y[t·ldy + r] (+)= Σ_c W[r, c]·x[t·ldx + c]` for `tokens` rows of x (addresses of f32 data).
pub fn linear(
    dev: &Device,
    w: &DevMatrix,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    if tokens == 0 {
        return Ok(());
    }
    let common = [
        p(w.buf.ptr()),
        p(x),
        p(y),
        i(w.rows),
        i(w.cols),
        i(tokens),
        i(ldx),
        i(ldy),
        i(accumulate as usize),
    ];
    if tokens <= MATVEC_MAX_TOKENS {
        let vec = w.cols % 8 == 0 && ldx % 4 == 0 && x % 16 == 0 && w.buf.ptr() % 16 == 0;
        let mut args = common.to_vec();
        args.push(i(vec as usize));
        let blocks = w.rows.div_ceil(8) as u32;
        dev.launch("matvec_bf16", (blocks, 1, 1), 256, 0, &args)
    } else {
        let grid = (w.rows.div_ceil(64) as u32, tokens.div_ceil(64) as u32, 1);
        dev.launch("gemm_bf16", grid, 256, 0, &common)
    }
}

/// `linear` into a new `[tokens, rows]` buffer.
pub fn project(
    dev: &Device,
    w: &DevMatrix,
    x: u64,
    ldx: usize,
    tokens: usize,
) -> Result<DevBuf<f32>> {
    let y = dev.zeros::<f32>(tokens * w.rows)?;
    linear(dev, w, x, ldx, y.ptr(), w.rows, tokens, false)?;
    Ok(y)
}

/// The checkpoint matrix behind a CPU engine layer.
pub trait CheckpointMatrix {
    fn m(&self) -> Result<&Matrix>;
}

impl CheckpointMatrix for Linear {
    fn m(&self) -> Result<&Matrix> {
        match self {
            Linear::Mapped(m) => Ok(m),
            Linear::Quantized(_) => Err(CudaError::Unsupported(
                "a weight matrix was quantized on load; the CUDA backend reads bf16 weights only"
                    .into(),
            )),
            Linear::Packed(_) => Err(CudaError::Unsupported(
                "a weight matrix comes from a spindle install; the CUDA backend reads Hugging Face checkpoints only"
                    .into(),
            )),
        }
    }
}
