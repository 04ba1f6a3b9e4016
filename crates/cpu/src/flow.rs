//! The hybrid decoder flow shared by every family (MODEL_MATH §2, §3, §4.2):
//! embedding → per layer `h += Mixer(in(h)); h += FFN(in(h))` → head input → LM head.
//!
//! For Qwen3-Next and Qwen3.5/3.6 the residual is one stream and `in` is a zero-centred
//! RMSNorm; qwen4_exp keeps n streams joined by hyper-connections, adds PLE before some
//! layers and lets a QSA indexer pick the attended tokens.

use std::convert::Infallible;

use spindle_kernels::norm::{rms_norm_zc, GateActivation};
use spindle_kernels::rope::RopeFreqs;
use spindle_model::{GdnGate, MixerKind, ModelConfig};

use crate::batch::Step;
use crate::error::{EngineError, NonFiniteSite, Result};
use crate::paged::KvPool;
use crate::qwen4::{hyper, ngram, ple};
use crate::session::LayerState;
use crate::BatchItem;
use spindle_model::weights::{
    FfnWeights, HeadInput, LayerWeights, MixerWeights, ModelWeights, PleWeights, Residual,
};

use crate::linear::LinearExt;
use crate::{attention, ffn, gdn};

/// Norms every `[H]` row of `x` with a zero-centred RMSNorm.
fn norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (xi, oi) in x.chunks(w.len()).zip(out.chunks_mut(w.len())) {
        rms_norm_zc(xi, w, eps, oi);
    }
    out
}

/// Everything a forward pass reads but does not change.
struct Ctx<'a> {
    config: &'a ModelConfig,
    rope: &'a RopeFreqs,
    /// `mrope_section` for rows with 3-D positions (empty for a text-only model).
    mrope_section: &'a [usize],
    eps: f32,
    hidden: usize,
    /// Residual streams: 1, or hc_count for qwen4_exp.
    streams: usize,
    /// The KV pool every session of the step keeps its keys and values in.
    pool: &'a KvPool,
}

/// Which sublayer of a layer is being wrapped.
#[derive(Clone, Copy)]
enum Sublayer {
    Mixer,
    Ffn,
}

/// Applies `f` to the sublayer input read from the residual `h [N, streams·H]` (every row of
/// the step) and adds its output back.
fn residual_step<E>(
    ctx: &Ctx,
    residual: &Residual,
    which: Sublayer,
    h: &mut [f32],
    groups: &[usize],
    f: impl FnOnce(&[f32]) -> std::result::Result<Vec<f32>, E>,
) -> std::result::Result<(), E> {
    match residual {
        Residual::Norms { input, post } => {
            let w = match which {
                Sublayer::Mixer => input,
                Sublayer::Ffn => post,
            };
            let y = f(&norm_rows(h, w, ctx.eps))?;
            h.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        }
        Residual::Hyper { attn, mlp } => {
            let w = match which {
                Sublayer::Mixer => attn,
                Sublayer::Ffn => mlp,
            };
            let input = hyper::enter(w, h, groups, ctx.streams, ctx.hidden, ctx.eps);
            let y = f(&input.x)?;
            hyper::inject(h, &y, &input.omega, ctx.streams, ctx.hidden);
        }
    }
    Ok(())
}

/// The mixer (attention or GDN) of layer `index` for every sequence of the step: token-wise
/// projections over all rows of `x`, the core per sequence on its own state.
fn mixer(ctx: &Ctx, index: usize, layer: &LayerWeights, step: &mut Step, x: &[f32]) -> Vec<f32> {
    let config = ctx.config;
    match &layer.mixer {
        MixerWeights::Attention(w) => {
            let seqs = step
                .seqs
                .iter_mut()
                .map(|seq| {
                    let session = &mut *seq.session;
                    match &mut session.layers[index] {
                        LayerState::Attention(cache) => (seq.span.clone(), cache, &session.kv),
                        LayerState::Gdn(_) => unreachable!("session layers follow the config"),
                    }
                })
                .collect();
            let ordinal = config.layers[..index]
                .iter()
                .filter(|l| l.mixer == MixerKind::FullAttention)
                .count();
            attention::forward(
                w,
                &config.attention,
                config.qsa.as_ref(),
                attention::Rope {
                    freqs: ctx.rope,
                    mrope_section: ctx.mrope_section,
                },
                ctx.eps,
                x,
                ctx.pool,
                ordinal,
                seqs,
            )
        }
        MixerWeights::Gdn(w) => {
            let act = match config.gdn_gate {
                GdnGate::Silu => GateActivation::Silu,
                GdnGate::Sigmoid => GateActivation::Sigmoid,
            };
            let seqs = step
                .seqs
                .iter_mut()
                .map(|seq| match &mut seq.session.layers[index] {
                    LayerState::Gdn(state) => (seq.span.clone(), state),
                    LayerState::Attention(_) => unreachable!("session layers follow the config"),
                })
                .collect();
            gdn::forward(w, &config.gdn, ctx.eps, act, x, seqs)
        }
    }
}

/// `h += Mixer(in(h)); h += FFN(in(h))` for layer `index` over every row of the step, with
/// the residual checked after each sublayer (a sequence whose rows went non-finite leaves the
/// step). A streamed expert that cannot be read fails every sequence of the step.
fn run_layer(ctx: &Ctx, index: usize, layer: &LayerWeights, step: &mut Step, h: &mut Vec<f32>) {
    let width = ctx.streams * ctx.hidden;
    let groups = step.groups();
    let Ok(()) = residual_step(ctx, &layer.residual, Sublayer::Mixer, h, &groups, |x| {
        Ok::<_, Infallible>(mixer(ctx, index, layer, step, x))
    });
    step.check_rows(h, width, NonFiniteSite::Mixer { layer: index });
    if step.seqs.is_empty() {
        return;
    }
    let groups = step.groups();
    let ffn = residual_step(
        ctx,
        &layer.residual,
        Sublayer::Ffn,
        h,
        &groups,
        |x| match &layer.ffn {
            FfnWeights::Dense(w) => Ok(ffn::mlp(w, x, &groups)),
            FfnWeights::Moe(w) => ffn::moe(
                w,
                ctx.config.moe.as_ref().expect("validated"),
                x,
                &groups,
                ctx.hidden,
            ),
        },
    );
    match ffn {
        // Not local to any sequence's rows: the experts of the whole step were being read.
        Err(message) => step.fail_all(|| EngineError::ExpertRead {
            message: message.clone(),
        }),
        Ok(()) => step.check_rows(h, width, NonFiniteSite::Ffn { layer: index }),
    }
}

/// PLE (qwen4_exp) before layer `index`, the `ordinal`-th PLE layer: each sequence's n-gram
/// rows and conv state, the projections over all rows.
fn add_ple(ctx: &Ctx, w: &PleWeights, ordinal: usize, step: &mut Step, h: &mut [f32]) {
    let seqs = step
        .seqs
        .iter_mut()
        .filter_map(|seq| {
            let state = seq.session.ple.as_mut()?;
            Some(ple::PleSeq {
                rows: seq.span.rows.clone(),
                ids: seq.ids,
                history: &state.history,
                conv_state: &mut state.conv[ordinal],
            })
        })
        .collect();
    ple::add(w, h, seqs, ctx.streams, ctx.hidden, ctx.eps);
}

/// Runs one step over the items' tokens (already validated; sessions not broken get rows):
/// each item's result is its logits `[rows, V]` for the rows it wants, or why it failed.
///
/// Token-wise work (embedding, norms, hyper-connections, projections, FFN/MoE, head) runs
/// once over the concatenated rows of every sequence; per-sequence work (GDN conv and delta
/// rule, attention, QSA, PLE n-grams and conv, positions) on each sequence's rows and state.
/// Each sequence's rows are computed as they would be alone, up to the matmul path chosen for
/// the step's number of rows; a sequence whose rows go non-finite fails alone.
///
/// With `image_token` (a model whose vision tower is loaded), each sequence's pads take the
/// rows of its pending images in place of their embeddings, and its rows rotate by 3-D
/// positions (shared docs `VISION.md` §4).
///
/// Every session's keys and values live in `pool`; a sequence whose new tokens the pool has no
/// blocks for gets [`EngineError::KvPoolFull`] and takes no part (its state is unchanged).
pub fn forward(
    config: &ModelConfig,
    weights: &ModelWeights,
    rope: &RopeFreqs,
    pool: &std::sync::Arc<KvPool>,
    image_token: Option<u32>,
    items: &mut [BatchItem],
) -> Vec<Result<Vec<f32>>> {
    let hidden = config.hidden_size;
    let streams = config.hyper.as_ref().map_or(1, |h| h.streams);
    let ctx = Ctx {
        config,
        rope,
        mrope_section: config.rope.mrope_section.as_deref().unwrap_or(&[]),
        eps: config.rms_norm_eps as f32,
        hidden,
        streams,
        pool,
    };
    let width = streams * hidden;
    let mut step = Step::with_pool(items, image_token, pool);
    if step.seqs.is_empty() {
        return step.into_results();
    }

    // The embedding, replicated into every stream.
    let ids = step.ids();
    let embed = weights.embed.mat();
    let mut h = vec![0.0f32; ids.len() * width];
    for (row, &id) in h.chunks_mut(width).zip(&ids) {
        embed.row_to_f32(id as usize, &mut row[..hidden]);
        for s in 1..streams {
            row.copy_within(..hidden, s * hidden);
        }
    }
    // Image features replace their pads' embeddings (VISION.md §4.1).
    for seq in &step.seqs {
        for image in &seq.images {
            let row = &mut h[(seq.span.rows.start + image.token) * width..][..width];
            for s in 0..streams {
                row[s * hidden..(s + 1) * hidden].copy_from_slice(image.features.row(image.row));
            }
        }
    }
    step.check_rows(&mut h, width, NonFiniteSite::Embedding);

    let mut ple_ordinal = 0;
    for (index, layer) in weights.layers.iter().enumerate() {
        if step.seqs.is_empty() {
            return step.into_results();
        }
        if let Some(w) = &layer.ple {
            add_ple(&ctx, w, ple_ordinal, &mut step, &mut h);
            ple_ordinal += 1;
            step.check_rows(&mut h, width, NonFiniteSite::Ple { layer: index });
        }
        run_layer(&ctx, index, layer, &mut step, &mut h);
    }
    for seq in &mut step.seqs {
        if let Some(ple_state) = seq.session.ple.as_mut() {
            ngram::advance_history(&mut ple_state.history, seq.ids);
        }
        seq.session.position += seq.ids.len();
    }

    // The head, over the rows each sequence wants.
    step.keep_wanted_rows(&mut h, width);
    let groups = step.groups();
    let mut head_in = match &weights.head_input {
        HeadInput::Norm(w) => norm_rows(&h, w, ctx.eps),
        HeadInput::HyperMixer(w) => hyper::enter(w, &h, &groups, streams, hidden, ctx.eps).x,
    };
    step.check_rows(&mut head_in, hidden, NonFiniteSite::HeadInput);
    if !step.seqs.is_empty() {
        let mut logits = weights.lm_head.forward_groups(&head_in, &step.groups());
        step.check_rows(&mut logits, config.vocab_size, NonFiniteSite::Logits);
        step.finish_all(&logits, config.vocab_size);
    }
    step.into_results()
}
