//! The QSA indexer (MODEL_MATH §4.4): pooled, normed and rotated block keys scored by each
//! query; attention then sees only the top blocks plus the partial tail.

use spindle_kernels::norm::rms_norm_zc_in_place;
use spindle_kernels::rope::{apply_partial_rope, RopeFreqs};
use spindle_model::QsaConfig;

use spindle_model::weights::IndexerWeights;

use crate::linear::LinearExt;

/// The indexer's per-sequence state: the raw key of every token and the finished block keys.
#[derive(Clone, Debug, Default)]
pub struct IndexerCache {
    /// `[N, d_i]`: not normalised, not rotated.
    pub raw_keys: Vec<f32>,
    /// `[complete blocks, d_i]`: pooled, normed, rotated at the block's first position.
    /// A block's key never changes once its tokens are all seen, so it is computed once.
    pub block_keys: Vec<f32>,
}

/// For each new token, the cached tokens its attention may see: `None` means all of them
/// (the causal prefix is within the budget).
pub type Selection = Vec<Option<Vec<usize>>>;

/// The indexer's projection of a step's rows `x [N, H]` (rows in `groups`, one per sequence):
/// per row `[queries (n_i·d_i) | key (d_i)]`.
pub fn project(w: &IndexerWeights, x: &[f32], groups: &[usize]) -> Vec<f32> {
    w.qk_proj.forward_groups(x, groups)
}

/// Width of one row of [`project`]'s output.
pub fn projection_width(cfg: &QsaConfig) -> usize {
    (cfg.n_heads + 1) * cfg.head_dim
}

/// Runs the indexer for one sequence's new tokens at positions `start..`, from their rows `qk`
/// of [`project`], appending their raw keys.
pub fn select(
    w: &IndexerWeights,
    cfg: &QsaConfig,
    rope: &RopeFreqs,
    eps: f32,
    cache: &mut IndexerCache,
    qk: &[f32],
    start: usize,
) -> Selection {
    let (n_i, d_i, cr) = (cfg.n_heads, cfg.head_dim, cfg.compress_ratio);
    let width = projection_width(cfg);
    let tokens = qk.len() / width;
    for t in 0..tokens {
        cache
            .raw_keys
            .extend_from_slice(&qk[t * width + n_i * d_i..(t + 1) * width]);
    }

    let scale = 1.0 / (d_i as f32).sqrt();
    let mut selection = Vec::with_capacity(tokens);
    for t in 0..tokens {
        let visible = start + t + 1;
        if visible <= cfg.budget {
            selection.push(None);
            continue;
        }
        let blocks = visible / cr;
        extend_block_keys(w, rope, eps, cache, d_i, cr, blocks);

        let (cos, sin) = rope.cos_sin(start + t);
        let mut queries = qk[t * width..t * width + n_i * d_i].to_vec();
        for q in queries.chunks_mut(d_i) {
            rms_norm_zc_in_place(q, &w.q_norm, eps);
            apply_partial_rope(q, &cos, &sin);
        }
        let scores: Vec<f32> = (0..blocks)
            .map(|b| {
                let key = &cache.block_keys[b * d_i..(b + 1) * d_i];
                queries
                    .chunks(d_i)
                    .map(|q| q.iter().zip(key).map(|(a, b)| a * b).sum::<f32>().max(0.0))
                    .sum::<f32>()
                    * scale
            })
            .collect();
        // Top blocks by score; ties go to the earlier block (MODEL_MATH §4.4).
        let mut chosen = spindle_kernels::softmax::top_k(&scores, cfg.max_blocks().min(blocks));
        chosen.sort_unstable();
        let mut picked: Vec<usize> = chosen.iter().flat_map(|&b| b * cr..(b + 1) * cr).collect();
        picked.extend(blocks * cr..visible);
        selection.push(Some(picked));
    }
    selection
}

/// Computes the keys of blocks not yet pooled, up to `blocks` complete blocks.
fn extend_block_keys(
    w: &IndexerWeights,
    rope: &RopeFreqs,
    eps: f32,
    cache: &mut IndexerCache,
    d_i: usize,
    cr: usize,
    blocks: usize,
) {
    for b in cache.block_keys.len() / d_i..blocks {
        let mut key = vec![0.0f32; d_i];
        for token in b * cr..(b + 1) * cr {
            let raw = &cache.raw_keys[token * d_i..(token + 1) * d_i];
            key.iter_mut().zip(raw).for_each(|(k, &r)| *k += r);
        }
        key.iter_mut().for_each(|k| *k /= cr as f32);
        rms_norm_zc_in_place(&mut key, &w.k_norm, eps);
        let (cos, sin) = rope.cos_sin(b * cr);
        apply_partial_rope(&mut key, &cos, &sin);
        cache.block_keys.extend_from_slice(&key);
    }
}
