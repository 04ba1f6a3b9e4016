//! PLE: hashed n-gram embeddings mixed into the residual streams before a linear layer
//! (MODEL_MATH §4.5). The n-gram table stays in its memory-mapped shards; each token gathers
//! one row per hash head.

use spindle_kernels::activation::{sigmoid, silu};
use spindle_kernels::norm::group_rms_norm_zc;

use spindle_model::weights::PleWeights;

use crate::linear::LinearExt;

/// Computes PLE for `ids` and adds it to the streams `hs [T, n·H]`.
/// `history` is the n-gram history before these ids; `conv_state` holds the last
/// (K − 1)·dilation rows of normed gates `[rows, n·H]` and is updated.
pub fn add(
    w: &PleWeights,
    hs: &mut [f32],
    ids: &[u32],
    history: &[u32],
    conv_state: &mut [f32],
    streams: usize,
    hidden: usize,
    eps: f32,
) {
    let tokens = ids.len();
    let width = streams * hidden;
    let heads = w.hash.vocab_sizes.len();
    let head_dim = w.key_proj.cols() / heads;
    let ple_dim = heads * head_dim;

    // Eng: one table row per head, in head order.
    let rows = w.hash.rows(history, ids);
    let mut eng = vec![0.0f32; tokens * ple_dim];
    for (chunk, &row) in eng.chunks_mut(head_dim).zip(&rows) {
        w.table.row(row, chunk);
    }

    let keys_raw = w.key_proj.forward(&eng, tokens);
    let values = w.value_proj.forward(&eng, tokens);
    let mut keys = vec![0.0f32; tokens * width];
    let mut queries = vec![0.0f32; tokens * width];
    for t in 0..tokens {
        let span = t * width..(t + 1) * width;
        group_rms_norm_zc(
            &keys_raw[span.clone()],
            &w.norm_key,
            hidden,
            eps,
            &mut keys[span.clone()],
        );
        group_rms_norm_zc(
            &hs[span.clone()],
            &w.norm_query,
            hidden,
            eps,
            &mut queries[span],
        );
    }

    // G_s = sigmoid(signed_sqrt(K_s·Q_s / √H)) · V.
    let inv_sqrt_h = 1.0 / (hidden as f32).sqrt();
    let mut gates = vec![0.0f32; tokens * width];
    for t in 0..tokens {
        let v = &values[t * hidden..(t + 1) * hidden];
        for s in 0..streams {
            let span = t * width + s * hidden..t * width + (s + 1) * hidden;
            let dot: f32 = keys[span.clone()]
                .iter()
                .zip(&queries[span.clone()])
                .map(|(a, b)| a * b)
                .sum();
            let gamma = dot * inv_sqrt_h;
            let gamma = gamma.signum() * gamma.abs().max(1e-6).sqrt();
            let g = sigmoid(gamma);
            gates[span].iter_mut().zip(v).for_each(|(o, &x)| *o = g * x);
        }
    }

    let mut normed = vec![0.0f32; tokens * width];
    for (src, dst) in gates.chunks(width).zip(normed.chunks_mut(width)) {
        group_rms_norm_zc(src, &w.norm_conv, hidden, eps, dst);
    }

    // Causal dilated depthwise conv over [past rows | new rows] of normed gates.
    let past = w.conv_history();
    let dilation = w.dilation();
    let k = w.conv_kernel;
    let mut window = Vec::with_capacity((past + tokens) * width);
    window.extend_from_slice(conv_state);
    window.extend_from_slice(&normed);
    for t in 0..tokens {
        let now = past + t;
        let out = &mut hs[t * width..(t + 1) * width];
        for c in 0..width {
            let mut acc = 0.0f32;
            for j in 0..k {
                acc += w.conv[c * k + j] * window[(now - dilation * (k - 1 - j)) * width + c];
            }
            out[c] += gates[t * width + c] + silu(acc);
        }
    }
    conv_state.copy_from_slice(&window[tokens * width..]);
}
