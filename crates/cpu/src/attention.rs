//! Gated full attention over the KV cache (MODEL_MATH §1.4).

use rayon::prelude::*;
use spindle_kernels::activation::sigmoid;
use spindle_kernels::attention::{attend, HeadCache};
use spindle_kernels::norm::rms_norm_zc_in_place;
use spindle_kernels::rope::{apply_partial_rope, RopeFreqs};
use spindle_model::{AttentionConfig, QsaConfig};

use crate::qwen4::qsa;
use crate::session::KvCache;
use spindle_model::weights::AttentionWeights;

use crate::linear::LinearExt;

/// Runs `tokens` new tokens starting at absolute position `start` through one attention layer,
/// appending their keys and values to `cache`. `x` is the normed input `[tokens, H]`. With a
/// QSA indexer (qwen4_exp), each token attends only to the tokens the indexer selects.
pub fn forward(
    w: &AttentionWeights,
    shape: &AttentionConfig,
    qsa: Option<&QsaConfig>,
    rope: &RopeFreqs,
    eps: f32,
    cache: &mut KvCache,
    x: &[f32],
    tokens: usize,
    start: usize,
) -> Vec<f32> {
    let (n_h, n_kv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let selection = match (&w.indexer, qsa) {
        (Some(indexer), Some(cfg)) => qsa::select(
            indexer,
            cfg,
            rope,
            eps,
            &mut cache.indexer,
            x,
            tokens,
            start,
        ),
        _ => vec![None; tokens],
    };
    let q_full = w.q_proj.forward(x, tokens);
    let mut k = w.k_proj.forward(x, tokens);
    let v = w.v_proj.forward(x, tokens);

    // Split the per-head [query | gate] interleave; norm and rotate queries and keys.
    let mut q = vec![0.0f32; tokens * n_h * d];
    let mut gate = vec![0.0f32; tokens * n_h * d];
    for t in 0..tokens {
        let (cos, sin) = rope.cos_sin(start + t);
        for h in 0..n_h {
            let src = &q_full[(t * n_h + h) * 2 * d..][..2 * d];
            let qh = &mut q[(t * n_h + h) * d..][..d];
            qh.copy_from_slice(&src[..d]);
            gate[(t * n_h + h) * d..][..d].copy_from_slice(&src[d..]);
            rms_norm_zc_in_place(qh, &w.q_norm, eps);
            apply_partial_rope(qh, &cos, &sin);
        }
        for h in 0..n_kv {
            let kh = &mut k[(t * n_kv + h) * d..][..d];
            rms_norm_zc_in_place(kh, &w.k_norm, eps);
            apply_partial_rope(kh, &cos, &sin);
        }
    }
    cache.keys.extend_from_slice(&k);
    cache.values.extend_from_slice(&v);

    let keys = HeadCache {
        data: &cache.keys,
        heads: n_kv,
        head_dim: d,
    };
    let values = HeadCache {
        data: &cache.values,
        heads: n_kv,
        head_dim: d,
    };
    let group = n_h / n_kv;
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; tokens * n_h * d];
    // Every (token, head) on its own, in parallel (a thread keeps its scores buffer); each
    // output row is computed the same way whatever runs it.
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores, (row, o)| {
            let (t, h) = (row / n_h, row % n_h);
            let qh = &q[row * d..][..d];
            match &selection[t] {
                None => attend(
                    qh,
                    keys,
                    values,
                    h / group,
                    0..start + t + 1,
                    scale,
                    scores,
                    o,
                ),
                Some(list) => attend(
                    qh,
                    keys,
                    values,
                    h / group,
                    list.iter().copied(),
                    scale,
                    scores,
                    o,
                ),
            }
        });
    out.iter_mut()
        .zip(&gate)
        .for_each(|(o, &g)| *o *= sigmoid(g));
    w.o_proj.forward(&out, tokens)
}
