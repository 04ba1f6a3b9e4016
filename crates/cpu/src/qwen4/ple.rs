//! PLE: hashed n-gram embeddings mixed into the residual streams before a linear layer
//! (MODEL_MATH §4.5). The n-gram table stays in its memory-mapped shards; each token gathers
//! one row per hash head.

use std::ops::Range;

use spindle_kernels::activation::{sigmoid, silu};
use spindle_kernels::norm::group_rms_norm_zc;

use spindle_model::weights::PleWeights;

use crate::linear::LinearExt;

/// One sequence's part of a PLE step.
pub struct PleSeq<'a> {
    /// Its rows of the step's streams.
    pub rows: Range<usize>,
    /// Its new tokens.
    pub ids: &'a [u32],
    /// The n-gram history before `ids`.
    pub history: &'a [u32],
    /// The last (K − 1)·dilation rows of normed gates `[rows, n·H]`; updated.
    pub conv_state: &'a mut [f32],
}

/// Computes PLE for a step's tokens and adds it to the streams `hs [N, n·H]`. The n-gram rows
/// and the dilated conv are per sequence (`seqs`: consecutive rows, in order); the projections,
/// norms and gates run once over all rows.
pub fn add(
    w: &PleWeights,
    hs: &mut [f32],
    seqs: Vec<PleSeq>,
    streams: usize,
    hidden: usize,
    eps: f32,
) {
    let groups: Vec<usize> = seqs.iter().map(|s| s.rows.len()).collect();
    let tokens: usize = groups.iter().sum();
    let width = streams * hidden;
    let heads = w.hash.vocab_sizes.len();
    let head_dim = w.key_proj.cols() / heads;
    let ple_dim = heads * head_dim;

    // Eng: one table row per head, in head order, from each sequence's own n-gram history.
    let mut eng = vec![0.0f32; tokens * ple_dim];
    for seq in &seqs {
        let rows = w.hash.rows(seq.history, seq.ids);
        let dst = &mut eng[seq.rows.start * ple_dim..seq.rows.end * ple_dim];
        for (chunk, &row) in dst.chunks_mut(head_dim).zip(&rows) {
            w.table.row(row, chunk);
        }
    }

    let keys_raw = w.key_proj.forward_groups(&eng, &groups);
    let values = w.value_proj.forward_groups(&eng, &groups);
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

    // Causal dilated depthwise conv over [past rows | new rows] of normed gates, per sequence.
    for seq in seqs {
        let r = seq.rows;
        dilated_conv(
            w,
            &mut hs[r.start * width..r.end * width],
            &gates[r.start * width..r.end * width],
            &normed[r.start * width..r.end * width],
            seq.conv_state,
            width,
        );
    }
}

/// `hs += gates + silu(conv(normed))` for one sequence's rows, the conv reading
/// `conv_state` (its past rows of `normed`) first; `conv_state` moves on to the last rows.
fn dilated_conv(
    w: &PleWeights,
    hs: &mut [f32],
    gates: &[f32],
    normed: &[f32],
    conv_state: &mut [f32],
    width: usize,
) {
    let tokens = hs.len() / width;
    let past = w.conv_history();
    let dilation = w.dilation();
    let k = w.conv_kernel;
    let mut window = Vec::with_capacity((past + tokens) * width);
    window.extend_from_slice(conv_state);
    window.extend_from_slice(normed);
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
