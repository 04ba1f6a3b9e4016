//! The hybrid decoder flow on the device (MODEL_MATH §2, §3, §4.2), mirroring
//! `spindle_engine`'s: embedding → per layer `h += Mixer(in(h)); h += FFN(in(h))` → head input
//! → LM head. Activations and state are f32; weights bf16.

use spindle_engine::weights::LayerWeights;
use spindle_engine::LogitsFor;

use crate::attention::{self, AttentionCtx};
use crate::device::{i, p, DevBuf, Device};
use crate::error::Result;
use crate::linear::project;
use crate::qwen4::{self, HyperInput};
use crate::session::{CudaSession, LayerState};
use crate::weights::{GpuFfn, GpuHeadInput, GpuHyper, GpuMixer, GpuResidual};
use crate::{ffn, gdn, CudaEngine};

#[derive(Clone, Copy)]
enum Sublayer {
    Mixer,
    Ffn,
}

/// Shapes every step needs.
struct Shape {
    hidden: usize,
    streams: usize,
    tokens: usize,
    eps: f32,
}

/// A hyper-connection block and its projection, kept from `enter` for `exit`.
type Injection<'w> = Option<(&'w GpuHyper, DevBuf<f32>)>;

/// The sublayer input read from the residual `h` and, for hyper-connections, the block and its
/// projection that `exit` needs to inject the output back.
fn enter<'w>(
    dev: &Device,
    residual: &'w GpuResidual,
    which: Sublayer,
    h: &DevBuf<f32>,
    s: &Shape,
) -> Result<(DevBuf<f32>, Injection<'w>)> {
    match residual {
        GpuResidual::Norms { input, post } => {
            let w = match which {
                Sublayer::Mixer => input,
                Sublayer::Ffn => post,
            };
            Ok((
                qwen4::norm_rows(dev, h.ptr(), w, s.tokens, 1, s.hidden, s.eps)?,
                None,
            ))
        }
        GpuResidual::Hyper { attn, mlp } => {
            let w = match which {
                Sublayer::Mixer => attn,
                Sublayer::Ffn => mlp,
            };
            let HyperInput { x, mix } =
                qwen4::enter(dev, w, h.ptr(), s.tokens, s.streams, s.hidden, s.eps)?;
            Ok((x, Some((w, mix))))
        }
    }
}

/// Adds the sublayer output `y` back into the residual.
fn exit(dev: &Device, hyper: Injection, h: &DevBuf<f32>, y: &DevBuf<f32>, s: &Shape) -> Result<()> {
    match hyper {
        None => dev.launch_elementwise(
            "add_in_place",
            h.len(),
            &[p(h.ptr()), p(y.ptr()), i(h.len())],
        ),
        Some((w, mix)) => qwen4::inject(dev, w, &mix, h, y, s.tokens, s.streams, s.hidden),
    }
}

/// Runs `ids` (validated, at most the engine's chunk) through the model from the session's state.
pub(crate) fn forward(
    e: &CudaEngine,
    session: &mut CudaSession,
    ids: &[u32],
    want: LogitsFor,
) -> Result<Vec<f32>> {
    let dev = &e.dev;
    let config = &e.config;
    let s = Shape {
        hidden: config.hidden_size,
        streams: config.hyper.as_ref().map_or(1, |h| h.streams),
        tokens: ids.len(),
        eps: config.rms_norm_eps as f32,
    };
    let width = s.streams * s.hidden;
    let start = session.position;

    // The embedding, replicated into every stream.
    let ids_i32: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    let ids_dev = dev.upload(&ids_i32)?;
    let h = dev.zeros::<f32>(s.tokens * width)?;
    dev.launch_elementwise(
        "embed_bf16",
        s.tokens * width,
        &[
            p(e.gpu.embed.buf.ptr()),
            p(ids_dev.ptr()),
            p(h.ptr()),
            i(s.tokens),
            i(s.hidden),
            i(s.streams),
        ],
    )?;

    let mut ple_ordinal = 0;
    for (index, layer) in e.gpu.layers.iter().enumerate() {
        let cpu: &LayerWeights = &e.cpu.layers[index];
        if let (Some(w), Some(cpu_ple), Some(ple)) = (&layer.ple, &cpu.ple, session.ple.as_ref()) {
            qwen4::add(
                dev,
                cpu_ple,
                w,
                &h,
                ids,
                &ple.history,
                &ple.conv[ple_ordinal],
                s.streams,
                s.hidden,
                s.eps,
            )?;
            ple_ordinal += 1;
        }

        let (x, hyper) = enter(dev, &layer.residual, Sublayer::Mixer, &h, &s)?;
        let y = match (&layer.mixer, &mut session.layers[index]) {
            (GpuMixer::Attention(w), LayerState::Attention(cache)) => {
                let ctx = AttentionCtx {
                    config,
                    inv_freq: &e.inv_freq,
                    rope: &e.rope,
                    cpu: &cpu.mixer,
                    eps: s.eps,
                };
                attention::forward(dev, &ctx, w, cache, &x, s.tokens, start)?
            }
            (GpuMixer::Gdn(w), LayerState::Gdn(state)) => {
                gdn::forward(dev, config, w, state, &x, s.tokens, s.eps)?
            }
            _ => unreachable!("session layers are built from the same config as the weights"),
        };
        exit(dev, hyper, &h, &y, &s)?;

        let (x, hyper) = enter(dev, &layer.residual, Sublayer::Ffn, &h, &s)?;
        let y = match &layer.ffn {
            GpuFfn::Dense(w) => ffn::mlp(dev, w, &x, s.tokens, s.hidden)?,
            GpuFfn::Moe(w) => ffn::moe(dev, config, w, &x, s.tokens)?,
        };
        exit(dev, hyper, &h, &y, &s)?;
    }
    if let Some(ple) = session.ple.as_mut() {
        qwen4::advance_history(&mut ple.history, ids);
    }
    session.position += s.tokens;

    let (rows, count) = match want {
        LogitsFor::All => (h.ptr(), s.tokens),
        LogitsFor::Last => (h.at((s.tokens - 1) * width), 1),
    };
    let head_in = match &e.gpu.head_input {
        GpuHeadInput::Norm(w) => qwen4::norm_rows(dev, rows, w, count, 1, s.hidden, s.eps)?,
        GpuHeadInput::HyperMixer(w) => {
            qwen4::enter(dev, w, rows, count, s.streams, s.hidden, s.eps)?.x
        }
    };
    let lm_head = e.gpu.lm_head();
    let logits = project(dev, lm_head, head_in.ptr(), s.hidden, count)?;
    dev.download(&logits, 0, count * lm_head.rows)
}
