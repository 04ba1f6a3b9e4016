//! Gated full attention over the KV cache (MODEL_MATH §1.4) for a step of sequences: projections
//! over all their rows, then per sequence RoPE, KV append and attention over its own cache.

use rayon::prelude::*;
use spindle_kernels::activation::sigmoid;
use spindle_kernels::attention::{attend, HeadCache};
use spindle_kernels::norm::rms_norm_zc_in_place;
use spindle_kernels::rope::{apply_partial_rope, RopeFreqs};
use spindle_model::{AttentionConfig, QsaConfig};

use crate::qwen4::qsa;
use crate::session::KvCache;
use spindle_model::weights::AttentionWeights;

use crate::batch::{for_each_seq, split_rows, RopeSpan, Span};

/// The rotary embedding of the attention layers: the frequencies, and the interleaved mRoPE
/// sections for rows with 3-D positions.
#[derive(Clone, Copy)]
pub struct Rope<'a> {
    pub freqs: &'a RopeFreqs,
    pub mrope_section: &'a [usize],
}
use crate::linear::LinearExt;

/// Runs a step's tokens through one attention layer. `x` is the normed input `[N, H]` of every
/// sequence in the step; `seqs` gives each sequence's rows of `x` (consecutive, in order, at
/// its own positions) and its cache, to which the new keys and values are appended. The
/// projections run once over all rows; the indexer's selection (qwen4_exp's QSA), RoPE and
/// attention run per sequence over its own cache (in parallel across sequences).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    w: &AttentionWeights,
    shape: &AttentionConfig,
    qsa: Option<&QsaConfig>,
    rope: Rope,
    eps: f32,
    x: &[f32],
    seqs: Vec<(Span, &mut KvCache)>,
) -> Vec<f32> {
    let (n_h, d) = (shape.num_heads, shape.head_dim);
    let spans: Vec<Span> = seqs.iter().map(|(span, _)| span.clone()).collect();
    let groups: Vec<usize> = spans.iter().map(Span::tokens).collect();
    let tokens: usize = groups.iter().sum();
    let indexer = match (&w.indexer, qsa) {
        (Some(indexer), Some(cfg)) => Some((indexer, cfg, qsa::project(indexer, x, &groups))),
        _ => None,
    };
    let projected = Projected {
        q_full: w.q_proj.forward_groups(x, &groups),
        k: w.k_proj.forward_groups(x, &groups),
        v: w.v_proj.forward_groups(x, &groups),
    };
    let mut out = vec![0.0f32; tokens * n_h * d];
    let parts: Vec<_> = split_rows(&mut out, n_h * d, &spans)
        .into_iter()
        .zip(seqs)
        .collect();
    for_each_seq(parts, |(out, (span, cache))| {
        let selection = match &indexer {
            Some((iw, cfg, qk)) => {
                let width = qsa::projection_width(cfg);
                let rows = &qk[span.rows.start * width..span.rows.end * width];
                qsa::select(
                    iw,
                    cfg,
                    rope.freqs,
                    eps,
                    &mut cache.indexer,
                    rows,
                    span.start,
                )
            }
            None => vec![None; span.tokens()],
        };
        core(
            w, shape, rope, eps, cache, &projected, &span, &selection, out,
        )
    });
    w.o_proj.forward_groups(&out, &groups)
}

/// The step's query/gate, key and value projections, `[N, ·]` each.
struct Projected {
    q_full: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// One sequence's attention core over its rows `span` of the projections: q/k norms, RoPE at
/// its positions, KV append, attention over its cache (the indexer's `selection` where it
/// chose), output gate; into `out [tokens, n_h·d]`.
#[allow(clippy::too_many_arguments)]
fn core(
    w: &AttentionWeights,
    shape: &AttentionConfig,
    rope: Rope,
    eps: f32,
    cache: &mut KvCache,
    projected: &Projected,
    span: &Span,
    selection: &qsa::Selection,
    out: &mut [f32],
) {
    let (n_h, n_kv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let (tokens, start) = (span.tokens(), span.start);
    let r = &span.rows;
    let q_full = &projected.q_full[r.start * n_h * 2 * d..r.end * n_h * 2 * d];
    let mut k = projected.k[r.start * n_kv * d..r.end * n_kv * d].to_vec();
    let v = &projected.v[r.start * n_kv * d..r.end * n_kv * d];

    // Split the per-head [query | gate] interleave; norm and rotate queries and keys.
    let mut q = vec![0.0f32; tokens * n_h * d];
    let mut gate = vec![0.0f32; tokens * n_h * d];
    for t in 0..tokens {
        let (cos, sin) = match &span.rope {
            RopeSpan::Text(first) => rope.freqs.cos_sin(first + t),
            RopeSpan::Mrope(positions) => {
                rope.freqs.cos_sin_mrope(positions[t], rope.mrope_section)
            }
        };
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
    cache.values.extend_from_slice(v);

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
}
