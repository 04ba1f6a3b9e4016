//! The hybrid decoder flow shared by every family (MODEL_MATH §2, §3, §4.2):
//! embedding → per layer `h += Mixer(in(h)); h += FFN(in(h))` → head input → LM head.
//!
//! For Qwen3-Next and Qwen3.5/3.6 the residual is one stream and `in` is a zero-centred
//! RMSNorm; qwen4_exp keeps n streams joined by hyper-connections, adds PLE before some
//! layers and lets a QSA indexer pick the attended tokens.

use spindle_kernels::norm::{rms_norm_zc, GateActivation};
use spindle_kernels::rope::RopeFreqs;
use spindle_model::{GdnGate, ModelConfig};

use crate::error::{first_non_finite_row, EngineError, NonFiniteSite, Result};
use crate::qwen4::{hyper, ngram, ple};
use crate::session::{LayerState, Session};
use spindle_model::forward::LogitsFor;
use spindle_model::weights::{
    FfnWeights, HeadInput, LayerWeights, MixerWeights, ModelWeights, Residual,
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
    eps: f32,
    hidden: usize,
    /// Residual streams: 1, or hc_count for qwen4_exp.
    streams: usize,
    tokens: usize,
}

/// Which sublayer of a layer is being wrapped.
#[derive(Clone, Copy)]
enum Sublayer {
    Mixer,
    Ffn,
}

/// Applies `f` to the sublayer input read from the residual `h` and adds its output back.
fn residual_step(
    ctx: &Ctx,
    residual: &Residual,
    which: Sublayer,
    h: &mut [f32],
    f: impl FnOnce(&[f32]) -> Result<Vec<f32>>,
) -> Result<()> {
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
            let input = hyper::enter(w, h, ctx.tokens, ctx.streams, ctx.hidden, ctx.eps);
            let y = f(&input.x)?;
            hyper::inject(h, &y, &input.omega, ctx.streams, ctx.hidden);
        }
    }
    Ok(())
}

/// Refuses a residual stream (rows of `width`) that holds a NaN or an infinity, naming `site`.
fn check_finite(
    x: &[f32],
    width: usize,
    site: NonFiniteSite,
    start: usize,
    first_row: usize,
) -> Result<()> {
    match first_non_finite_row(x, width) {
        None => Ok(()),
        Some(row) => Err(EngineError::NonFinite {
            site,
            token: first_row + row,
            position: start + first_row + row,
        }),
    }
}

fn run_layer(
    ctx: &Ctx,
    index: usize,
    layer: &LayerWeights,
    state: &mut LayerState,
    h: &mut [f32],
    start: usize,
) -> Result<()> {
    let width = ctx.streams * ctx.hidden;
    let config = ctx.config;
    residual_step(ctx, &layer.residual, Sublayer::Mixer, h, |x| {
        Ok(match (&layer.mixer, state) {
            (MixerWeights::Attention(w), LayerState::Attention(cache)) => attention::forward(
                w,
                &config.attention,
                config.qsa.as_ref(),
                ctx.rope,
                ctx.eps,
                cache,
                x,
                ctx.tokens,
                start,
            ),
            (MixerWeights::Gdn(w), LayerState::Gdn(s)) => {
                let act = match config.gdn_gate {
                    GdnGate::Silu => GateActivation::Silu,
                    GdnGate::Sigmoid => GateActivation::Sigmoid,
                };
                gdn::forward(w, &config.gdn, ctx.eps, act, s, x, ctx.tokens)
            }
            _ => unreachable!("session layers are built from the same config as the weights"),
        })
    })?;
    check_finite(h, width, NonFiniteSite::Mixer { layer: index }, start, 0)?;
    residual_step(ctx, &layer.residual, Sublayer::Ffn, h, |x| {
        match &layer.ffn {
            FfnWeights::Dense(w) => Ok(ffn::mlp(w, x, ctx.tokens)),
            FfnWeights::Moe(w) => ffn::moe(
                w,
                config.moe.as_ref().expect("validated"),
                x,
                ctx.tokens,
                ctx.hidden,
            ),
        }
    })?;
    check_finite(h, width, NonFiniteSite::Ffn { layer: index }, start, 0)
}

/// Runs `ids` (already validated) through the model from the session's state.
pub fn forward(
    config: &ModelConfig,
    weights: &ModelWeights,
    rope: &RopeFreqs,
    session: &mut Session,
    ids: &[u32],
    want: LogitsFor,
) -> Result<Vec<f32>> {
    let hidden = config.hidden_size;
    let streams = config.hyper.as_ref().map_or(1, |h| h.streams);
    let ctx = Ctx {
        config,
        rope,
        eps: config.rms_norm_eps as f32,
        hidden,
        streams,
        tokens: ids.len(),
    };
    let start = session.position;
    let width = streams * hidden;

    // The embedding, replicated into every stream.
    let embed = weights.embed.mat();
    let mut h = vec![0.0f32; ids.len() * width];
    for (row, &id) in h.chunks_mut(width).zip(ids) {
        embed.row_to_f32(id as usize, &mut row[..hidden]);
        for s in 1..streams {
            row.copy_within(..hidden, s * hidden);
        }
    }

    check_finite(&h, width, NonFiniteSite::Embedding, start, 0)?;

    let mut ple_ordinal = 0;
    for (index, (layer, state)) in weights
        .layers
        .iter()
        .zip(session.layers.iter_mut())
        .enumerate()
    {
        if let (Some(w), Some(ple_state)) = (&layer.ple, session.ple.as_mut()) {
            let conv = &mut ple_state.conv[ple_ordinal];
            ple::add(
                w,
                &mut h,
                ids,
                &ple_state.history,
                conv,
                streams,
                hidden,
                ctx.eps,
            );
            ple_ordinal += 1;
            check_finite(&h, width, NonFiniteSite::Ple { layer: index }, start, 0)?;
        }
        run_layer(&ctx, index, layer, state, &mut h, start)?;
    }
    if let Some(ple_state) = session.ple.as_mut() {
        ngram::advance_history(&mut ple_state.history, ids);
    }
    session.position += ids.len();

    let rows = match want {
        LogitsFor::All => &h[..],
        LogitsFor::Last => &h[(ids.len() - 1) * width..],
    };
    let count = rows.len() / width;
    let first_row = ids.len() - count;
    let head_in = match &weights.head_input {
        HeadInput::Norm(w) => norm_rows(rows, w, ctx.eps),
        HeadInput::HyperMixer(w) => hyper::enter(w, rows, count, streams, hidden, ctx.eps).x,
    };
    check_finite(&head_in, hidden, NonFiniteSite::HeadInput, start, first_row)?;
    let logits = weights.lm_head.forward(&head_in, count);
    check_finite(
        &logits,
        config.vocab_size,
        NonFiniteSite::Logits,
        start,
        first_row,
    )?;
    Ok(logits)
}
