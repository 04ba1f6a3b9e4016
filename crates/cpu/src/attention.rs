//! Gated full attention over the KV cache (MODEL_MATH §1.4) for a step of sequences: projections
//! over all their rows, then per sequence RoPE, the new keys and values written into its own
//! blocks of the model's KV pool, and attention over its cache through its block table.

use rayon::prelude::*;
use spindle_kernels::activation::sigmoid;
use spindle_kernels::attention::{attend, PagedHeads};
use spindle_kernels::norm::rms_norm_zc_in_place;
use spindle_kernels::rope::{apply_partial_rope, RopeFreqs};
use spindle_model::{AttentionConfig, QsaConfig};

use crate::paged::{BlockTable, KvPool, LayerAccess};
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
/// its own positions), its layer state and its block table into `pool` (made writable for the
/// step's tokens: [`crate::paged::BlockTable::prepare_write`]), into which the new keys and
/// values are written as layer `layer` (its index among the attention layers). The projections
/// run once over all rows; the indexer's selection (qwen4_exp's QSA), RoPE and attention run
/// per sequence over its own cache (in parallel across sequences).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    w: &AttentionWeights,
    shape: &AttentionConfig,
    qsa: Option<&QsaConfig>,
    rope: Rope,
    eps: f32,
    x: &[f32],
    pool: &KvPool,
    layer: usize,
    seqs: Vec<(Span, &mut KvCache, &BlockTable)>,
) -> Vec<f32> {
    let (n_h, d) = (shape.num_heads, shape.head_dim);
    let spans: Vec<Span> = seqs.iter().map(|(span, _, _)| span.clone()).collect();
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
    let mut tables = Vec::with_capacity(seqs.len());
    let mut parts = Vec::with_capacity(seqs.len());
    for (span, cache, table) in seqs {
        tables.push(table);
        parts.push((span, cache));
    }
    // Per sequence: the indexer's selection, queries, gates and keys after norms and RoPE.
    let prepared = map_seqs(parts, |(span, cache)| {
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
        prepare(w, shape, rope, eps, &projected, span, selection)
    });
    // The new keys and values into each sequence's own blocks, then attention reading them
    // through the block tables.
    let mut access = LayerAccess::new(pool, layer);
    let row = shape.num_kv_heads * d;
    for (p, table) in prepared.iter().zip(&tables) {
        let r = &p.span.rows;
        access.write(
            table,
            p.span.start,
            &p.k,
            &projected.v[r.start * row..r.end * row],
        );
    }
    let mut out = vec![0.0f32; tokens * n_h * d];
    let parts: Vec<_> = split_rows(&mut out, n_h * d, &spans)
        .into_iter()
        .zip(prepared.iter().zip(&tables))
        .collect();
    let access = &access;
    for_each_seq(parts, |(out, (p, table))| {
        core(shape, p, access, table, out)
    });
    w.o_proj.forward_groups(&out, &groups)
}

/// `f` over every part, in parallel when there are several, results in order.
fn map_seqs<T: Send, U: Send>(parts: Vec<T>, f: impl Fn(T) -> U + Sync + Send) -> Vec<U> {
    if parts.len() == 1 {
        parts.into_iter().map(f).collect()
    } else {
        parts.into_par_iter().map(f).collect()
    }
}

/// The step's query/gate, key and value projections, `[N, ·]` each.
struct Projected {
    q_full: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// One sequence's rows ready for attention: queries and keys normed and rotated at their
/// positions, the output gates, and which cached tokens each row attends to.
struct Prepared {
    span: Span,
    q: Vec<f32>,
    gate: Vec<f32>,
    k: Vec<f32>,
    selection: qsa::Selection,
}

/// q/k norms and RoPE at the sequence's positions for its rows `span` of the projections.
fn prepare(
    w: &AttentionWeights,
    shape: &AttentionConfig,
    rope: Rope,
    eps: f32,
    projected: &Projected,
    span: Span,
    selection: qsa::Selection,
) -> Prepared {
    let (n_h, n_kv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let tokens = span.tokens();
    let r = &span.rows;
    let q_full = &projected.q_full[r.start * n_h * 2 * d..r.end * n_h * 2 * d];
    let mut k = projected.k[r.start * n_kv * d..r.end * n_kv * d].to_vec();

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
    Prepared {
        span,
        q,
        gate,
        k,
        selection,
    }
}

/// One sequence's attention over its cache (its keys and values through `table`, the new
/// rows already written), the indexer's selection where it chose, then the output gate; into
/// `out [tokens, n_h·d]`.
fn core(
    shape: &AttentionConfig,
    p: &Prepared,
    access: &LayerAccess,
    table: &BlockTable,
    out: &mut [f32],
) {
    let (n_h, n_kv, d) = (shape.num_heads, shape.num_kv_heads, shape.head_dim);
    let start = p.span.start;
    let (key_blocks, value_blocks) = (access.blocks(table, false), access.blocks(table, true));
    let keys = PagedHeads {
        blocks: &key_blocks,
        heads: n_kv,
        head_dim: d,
    };
    let values = PagedHeads {
        blocks: &value_blocks,
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
            let qh = &p.q[row * d..][..d];
            match &p.selection[t] {
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
        .zip(&p.gate)
        .for_each(|(o, &g)| *o *= sigmoid(g));
}
