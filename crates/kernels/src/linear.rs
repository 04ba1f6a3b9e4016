//! y = x·Wᵀ for one token (matvec) and a batch of tokens (matmul), W row-major `[rows, cols]`.
//!
//! The batched form reads each weight row once and applies it to every token, so a prompt
//! costs one pass over the weights, not one per token. Rows are split across rayon threads.

use rayon::prelude::*;

use crate::weights::{bf16_to_f32, MatRef, Weights};

/// Rows per parallel task: large enough to amortise scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 64;

#[inline]
fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (wc, wr) = w.split_at(w.len() / 8 * 8);
    let (xc, xr) = x.split_at(wc.len());
    for (wb, xb) in wc.chunks_exact(8).zip(xc.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += wb[i] * xb[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (a, b) in wr.iter().zip(xr) {
        sum += a * b;
    }
    sum
}

#[inline]
fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (wc, wr) = w.split_at(w.len() / 8 * 8);
    let (xc, xr) = x.split_at(wc.len());
    for (wb, xb) in wc.chunks_exact(8).zip(xc.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += bf16_to_f32(wb[i]) * xb[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (a, b) in wr.iter().zip(xr) {
        sum += bf16_to_f32(*a) * b;
    }
    sum
}

#[inline]
fn dot_f16(w: &[u16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(&a, b)| half::f16::from_bits(a).to_f32() * b).sum()
}

/// Dot product of weight row `r` with `x`.
#[inline]
fn row_dot(w: &MatRef, r: usize, x: &[f32]) -> f32 {
    let (a, b) = (r * w.cols, (r + 1) * w.cols);
    match w.weights {
        Weights::Bf16(d) => dot_bf16(&d[a..b], x),
        Weights::F16(d) => dot_f16(&d[a..b], x),
        Weights::F32(d) => dot_f32(&d[a..b], x),
    }
}

/// y[r] = Σ_c W[r, c]·x[c]. `x` has `cols` elements, `y` has `rows`.
pub fn matvec(w: &MatRef, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), w.cols, "matvec input length");
    assert_eq!(y.len(), w.rows, "matvec output length");
    if w.rows * w.cols < 1 << 15 {
        y.iter_mut().enumerate().for_each(|(r, out)| *out = row_dot(w, r, x));
        return;
    }
    y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(chunk, ys)| {
        let first = chunk * ROWS_PER_TASK;
        ys.iter_mut()
            .enumerate()
            .for_each(|(i, out)| *out = row_dot(w, first + i, x));
    });
}

/// Y[t, r] = Σ_c W[r, c]·X[t, c] for `tokens` rows of X (`[tokens, cols]` → `[tokens, rows]`).
pub fn matmul(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    assert_eq!(x.len(), tokens * w.cols, "matmul input length");
    assert_eq!(y.len(), tokens * w.rows, "matmul output length");
    if tokens == 1 {
        return matvec(w, x, y);
    }
    // Compute Yᵀ [rows, tokens] so each task owns contiguous output, then transpose.
    let mut yt = vec![0.0f32; w.rows * tokens];
    let task = |(chunk, out): (usize, &mut [f32])| {
        let first = chunk * ROWS_PER_TASK;
        for (i, row_out) in out.chunks_mut(tokens).enumerate() {
            for (t, o) in row_out.iter_mut().enumerate() {
                *o = row_dot(w, first + i, &x[t * w.cols..(t + 1) * w.cols]);
            }
        }
    };
    if w.rows * w.cols * tokens < 1 << 15 {
        yt.chunks_mut(ROWS_PER_TASK * tokens).enumerate().for_each(task);
    } else {
        yt.par_chunks_mut(ROWS_PER_TASK * tokens).enumerate().for_each(task);
    }
    for r in 0..w.rows {
        for t in 0..tokens {
            y[t * w.rows + r] = yt[r * tokens + t];
        }
    }
}

/// Scalar reference: the plain triple loop, accumulated in f64.
pub fn matmul_ref(w: &MatRef, x: &[f32], tokens: usize, y: &mut [f32]) {
    for t in 0..tokens {
        for r in 0..w.rows {
            let mut acc = 0.0f64;
            for c in 0..w.cols {
                let wv = match w.weights {
                    Weights::Bf16(d) => bf16_to_f32(d[r * w.cols + c]),
                    Weights::F16(d) => half::f16::from_bits(d[r * w.cols + c]).to_f32(),
                    Weights::F32(d) => d[r * w.cols + c],
                };
                acc += wv as f64 * x[t * w.cols + c] as f64;
            }
            y[t * w.rows + r] = acc as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn matmul_matches_reference_for_every_format_and_batch() {
        let mut rng = rng(7);
        for &(rows, cols) in &[(3, 5), (130, 67), (300, 256)] {
            let wf = vec(&mut rng, rows * cols, 1.0);
            let wb = bf16_vec(&mut rng, rows * cols);
            let wh: Vec<u16> = wf.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            for weights in [Weights::F32(&wf), Weights::Bf16(&wb), Weights::F16(&wh)] {
                let w = MatRef::new(weights, rows, cols);
                for tokens in [1, 2, 7] {
                    let x = vec(&mut rng, tokens * cols, 1.0);
                    let mut fast = vec![0.0; tokens * rows];
                    let mut reference = vec![0.0; tokens * rows];
                    matmul(&w, &x, tokens, &mut fast);
                    matmul_ref(&w, &x, tokens, &mut reference);
                    let err = max_abs_diff(&fast, &reference);
                    assert!(err < 1e-4 * (cols as f32).sqrt(), "{rows}x{cols} t={tokens}: {err}");
                }
            }
        }
    }
}
