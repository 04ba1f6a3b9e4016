//! Borrowed weight matrices in the formats the kernels read.

/// Elements of a row-major weight matrix.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// bfloat16 bit patterns.
    Bf16(&'a [u16]),
    /// IEEE half bit patterns.
    F16(&'a [u16]),
    F32(&'a [f32]),
}

/// A row-major `[rows, cols]` matrix; y = x·Wᵀ reads one row per output.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub weights: Weights<'a>,
    pub rows: usize,
    pub cols: usize,
}

#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

impl<'a> MatRef<'a> {
    pub fn new(weights: Weights<'a>, rows: usize, cols: usize) -> Self {
        let len = match weights {
            Weights::Bf16(w) | Weights::F16(w) => w.len(),
            Weights::F32(w) => w.len(),
        };
        assert_eq!(len, rows * cols, "matrix data does not match its shape");
        MatRef { weights, rows, cols }
    }

    /// Rows `[first, first + count)`.
    pub fn rows_slice(&self, first: usize, count: usize) -> MatRef<'a> {
        let (a, b) = (first * self.cols, (first + count) * self.cols);
        let weights = match self.weights {
            Weights::Bf16(w) => Weights::Bf16(&w[a..b]),
            Weights::F16(w) => Weights::F16(&w[a..b]),
            Weights::F32(w) => Weights::F32(&w[a..b]),
        };
        MatRef {
            weights,
            rows: count,
            cols: self.cols,
        }
    }

    /// Row `r` as f32 values (embedding lookup).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        let (a, b) = (r * self.cols, (r + 1) * self.cols);
        match self.weights {
            Weights::Bf16(w) => out.iter_mut().zip(&w[a..b]).for_each(|(o, &x)| *o = bf16_to_f32(x)),
            Weights::F16(w) => out
                .iter_mut()
                .zip(&w[a..b])
                .for_each(|(o, &x)| *o = half::f16::from_bits(x).to_f32()),
            Weights::F32(w) => out.copy_from_slice(&w[a..b]),
        }
    }

    /// Bytes of weights this matrix holds.
    pub fn size_bytes(&self) -> usize {
        match self.weights {
            Weights::Bf16(w) | Weights::F16(w) => w.len() * 2,
            Weights::F32(w) => w.len() * 4,
        }
    }
}
