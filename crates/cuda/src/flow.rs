//! The hybrid decoder flow on the device (MODEL_MATH §2, §3, §4.2), mirroring
//! the CPU backend's (`spindle_cpu`): embedding → per layer `h += Mixer(in(h)); h += FFN(in(h))` → head input
//! → LM head. Activations and state are f32; weights bf16, Q8 or Q4. With plain norms and a
//! small batch, each sublayer norms `h` and adds its output back inside its own first and
//! last kernels ([`Io::Fused`]); a decode step is captured as a CUDA graph (qwen4_exp's too:
//! its PLE and QSA steps are kernels that read the ids and the position on the device).

use spindle_model::forward::LogitsFor;

use crate::attention::{self, AttentionCtx};
use crate::device::{DevBuf, Device};
use spindle_model::forward::NonFiniteSite;

use crate::error::{CudaError, DriverContext, Result};
use crate::io::{decode_sized, row_groups, Io};
use crate::kernels::{self, i, p, Launch, Ptr, MATVEC_MAX_TOKENS};
use crate::linear::{decode_linear, project};
use crate::matvec::{DecodeIn, DecodeOut};
use crate::norm::norm_rows;
use crate::qwen4::{self, HyperInput};
use crate::session::{CudaSession, DecodeGraph, DecodeTables, LayerState, Seg};
use crate::weights::{GpuFfn, GpuHeadInput, GpuHyper, GpuMixer, GpuResidual};
use crate::{gdn, mlp, moe, CudaEngine};

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
                norm_rows(dev, h.arg(), w, s.tokens, 1, s.hidden, s.eps)?,
                None,
            ))
        }
        GpuResidual::Hyper { attn, mlp } => {
            let w = match which {
                Sublayer::Mixer => attn,
                Sublayer::Ffn => mlp,
            };
            let HyperInput { x, mix } =
                qwen4::enter(dev, w, h.arg(), s.tokens, s.streams, s.hidden, s.eps)?;
            Ok((x, Some((w, mix))))
        }
    }
}

/// Adds the sublayer output `y` back into the residual.
fn exit(dev: &Device, hyper: Injection, h: &DevBuf<f32>, y: &DevBuf<f32>, s: &Shape) -> Result<()> {
    match hyper {
        None => kernels::elementwise::AddInPlace::launch(
            dev,
            Launch::elementwise(h.len()),
            h.arg(),
            y.arg(),
            i(h.len()),
        ),
        Some((w, mix)) => qwen4::inject(dev, w, &mix, h, y, s.tokens, s.streams, s.hidden),
    }
}

/// Runs one sublayer on the residual `h`: with plain norms and a small batch the sublayer
/// norms `h` and adds its output back itself (fused into its first and last matvecs);
/// otherwise its input is prepared here and its output added here.
fn sublayer(
    dev: &Device,
    residual: &GpuResidual,
    which: Sublayer,
    h: &DevBuf<f32>,
    s: &Shape,
    run: impl FnOnce(Io) -> Result<Option<DevBuf<f32>>>,
) -> Result<()> {
    if let (GpuResidual::Norms { input, post }, true) = (residual, decode_sized(dev, s.tokens)) {
        let norm = match which {
            Sublayer::Mixer => input,
            Sublayer::Ffn => post,
        };
        let y = run(Io::Fused {
            h,
            norm,
            eps: s.eps,
        })?;
        debug_assert!(y.is_none(), "fused sublayers add their output themselves");
        return Ok(());
    }
    let (x, hyper) = enter(dev, residual, which, h, s)?;
    let y = run(Io::Split(&x))?.expect("split sublayers return their output");
    exit(dev, hyper, h, &y, s)
}

/// Ends the workspace arena when dropped (also on errors).
pub(crate) struct Workspace<'d>(&'d Device);

impl<'d> Workspace<'d> {
    pub(crate) fn begin(dev: &'d Device, workspace: &DevBuf<u8>) -> Self {
        dev.begin_workspace(workspace);
        Workspace(dev)
    }
}

impl Drop for Workspace<'_> {
    fn drop(&mut self) {
        self.0.end_workspace();
    }
}

/// The logits of one forward pass on the device: `rows × V` f32 at `ptr`, alive until the
/// session's next forward pass (`_owned` holds them when they are not in the workspace).
pub(crate) struct Logits {
    pub ptr: u64,
    pub rows: usize,
    pub _owned: Option<DevBuf<f32>>,
}

/// Runs `ids` (validated, at most the engine's chunk) through the model from the session's
/// state and returns the logits the caller wants, on the device.
pub(crate) fn forward_device(
    e: &CudaEngine,
    session: &mut CudaSession,
    ids: &[u32],
    want: LogitsFor,
) -> Result<Logits> {
    if ids.len() == 1 && e.graphs && !session.graph_failed && !e.probing() {
        match decode_graph(e, session, ids[0]) {
            Ok(ptr) => {
                session.position += 1;
                return Ok(Logits {
                    ptr,
                    rows: 1,
                    _owned: None,
                });
            }
            Err(err) => {
                tracing::warn!(error = %err, "CUDA graph capture failed: decoding without graphs");
                session.graph_failed = true;
                session.graph = None;
            }
        }
    }
    let dev = &e.dev;
    let start = session.position;
    let small = ids.len() <= MATVEC_MAX_TOKENS;
    let ids_i32: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    let (ids_dev, _ids_buf) = if small {
        session.step_io.write_ids(dev, &ids_i32)?;
        (session.step_io.ids(), None)
    } else {
        let buf = dev.upload(&ids_i32)?;
        (buf.ptr(), Some(buf))
    };
    let _arena = small.then(|| Workspace::begin(dev, &session.workspace));
    let seg = Seg {
        offset: 0,
        tokens: ids.len(),
        start,
        start_dev: 0,
    };
    let mut seqs = [StepSeq { session, seg, want }];
    let (logits, rows) = body(e, &mut seqs, ids.len(), ids_dev, None)?;
    seqs[0].session.position += ids.len();
    let ptr = logits.ptr();
    let owned = logits.is_owned().then_some(logits);
    Ok(Logits {
        ptr,
        rows,
        _owned: owned,
    })
}

/// As [`forward_device`], with the logits copied to the host (the one copy of the step).
pub(crate) fn forward(
    e: &CudaEngine,
    session: &mut CudaSession,
    ids: &[u32],
    want: LogitsFor,
) -> Result<Vec<f32>> {
    let logits = forward_device(e, session, ids, want)?;
    e.dev
        .download_raw(logits.ptr, logits.rows * e.gpu.lm_head().rows)
}

/// Grows every KV cache (and QSA indexer cache) to hold `needed` tokens.
pub(crate) fn ensure_capacity(
    e: &CudaEngine,
    session: &mut CudaSession,
    needed: usize,
) -> Result<()> {
    for layer in &mut session.layers {
        if let LayerState::Attention(cache) = layer {
            attention::reserve(&e.dev, cache, needed, &e.config)?;
        }
    }
    Ok(())
}

/// One decode step through the captured graph (captured first when there is none, or the KV
/// caches moved since). Returns the address of the logits row.
fn decode_graph(e: &CudaEngine, session: &mut CudaSession, id: u32) -> Result<u64> {
    let dev = &e.dev;
    let pos = session.position;
    ensure_capacity(e, session, pos + 1)?;
    session.step_io.write_step(dev, id, pos)?;
    let generation = session.cache_generation();
    if session
        .graph
        .as_ref()
        .is_none_or(|g| g.generation != generation)
    {
        session.graph = None;
        let started = std::time::Instant::now();
        let stream = dev.stream().clone();
        let ids_dev = session.step_io.ids();
        let start_dev = session.step_io.position();
        dev.begin_workspace(&session.workspace);
        stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .inspect_err(|_| {
                dev.end_workspace();
            })
            .during("beginning a CUDA graph capture")?;
        let seg = Seg {
            offset: 0,
            tokens: 1,
            start: pos,
            start_dev,
        };
        let mut seqs = [StepSeq {
            session: &mut *session,
            seg,
            want: LogitsFor::Last,
        }];
        let result = body(e, &mut seqs, 1, ids_dev, None);
        let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        let (_, overflowed) = dev.end_workspace();
        let (logits, _) = result?;
        let graph = graph
            .during("ending a CUDA graph capture")?
            .ok_or_else(|| {
                crate::error::CudaError::Unsupported("the captured CUDA graph is empty".into())
            })?;
        if overflowed || logits.is_owned() {
            return Err(crate::error::CudaError::Unsupported(
                "the decode step did not fit the session workspace".into(),
            ));
        }
        tracing::debug!(
            position = pos,
            elapsed_us = started.elapsed().as_micros() as u64,
            "captured the decode step as a CUDA graph"
        );
        session.graph = Some(DecodeGraph {
            graph,
            logits: logits.ptr(),
            generation,
        });
    }
    let g = session.graph.as_ref().expect("captured above");
    g.graph.launch().during("launching the decode graph")?;
    Ok(g.logits)
}

/// One sequence of a forward step: its session, its rows of the step and the logits it wants.
pub(crate) struct StepSeq<'s> {
    pub session: &'s mut CudaSession,
    pub seg: Seg,
    pub want: LogitsFor,
}

/// The layers and the head for a step of `tokens` tokens (the sequences' rows, concatenated)
/// whose ids are at device address `ids_dev`. Returns the logits of the rows the sequences
/// want (in sequence order) and their count.
/// With `batch`, every sequence feeds one token and the mixers run their batched decode
/// kernels from those device tables (the KV caches reserved for this step beforehand).
pub(crate) fn body(
    e: &CudaEngine,
    seqs: &mut [StepSeq],
    tokens: usize,
    ids_dev: u64,
    batch: Option<&DecodeTables>,
) -> Result<(DevBuf<f32>, usize)> {
    let dev = &e.dev;
    let config = &e.config;
    let s = Shape {
        hidden: config.hidden_size,
        streams: config.hyper.as_ref().map_or(1, |h| h.streams),
        tokens,
        eps: config.rms_norm_eps as f32,
    };
    let width = s.streams * s.hidden;

    // The embedding, replicated into every stream.
    let h = dev.scratch::<f32>(s.tokens * width)?;
    kernels::elementwise::EmbedBf16::launch(
        dev,
        Launch::elementwise(s.tokens * width),
        p(e.gpu.embed.bf16_ptr()?),
        p(ids_dev),
        h.arg(),
        i(s.tokens),
        i(s.hidden),
        i(s.streams),
    )?;
    let first_position = seqs[0].seg.start;
    let probe = |site| probe_rows(e, h.arg(), width, s.tokens, first_position, site);
    probe(NonFiniteSite::Embedding)?;

    let mut ple_ordinal = 0;
    for (index, layer) in e.gpu.layers.iter().enumerate() {
        if let Some(w) = &layer.ple {
            // Per-sequence work takes the path the sequence would take alone (the GEMM for
            // a prompt chunk), whatever the batch around it.
            let small_batch = dev.small_batch_rows();
            dev.set_small_batch_rows(0);
            let mut added = Ok(());
            for sq in seqs.iter() {
                let ple = sq
                    .session
                    .ple
                    .as_ref()
                    .expect("PLE state follows the config");
                added = qwen4::add(
                    dev,
                    w,
                    h.arg_at(sq.seg.offset * width),
                    ids_dev + 4 * sq.seg.offset as u64,
                    sq.seg.tokens,
                    &ple.history,
                    &ple.conv[ple_ordinal],
                    s.streams,
                    s.hidden,
                    s.eps,
                );
                if added.is_err() {
                    break;
                }
            }
            dev.set_small_batch_rows(small_batch);
            added?;
            probe(NonFiniteSite::Ple { layer: index })?;
            ple_ordinal += 1;
        }

        let tables = batch.map(|t| t.layer(index));
        sublayer(
            dev,
            &layer.residual,
            Sublayer::Mixer,
            &h,
            &s,
            |io| match &layer.mixer {
                GpuMixer::Attention(w) => {
                    let ctx = AttentionCtx {
                        config,
                        inv_freq: &e.inv_freq,
                        eps: s.eps,
                    };
                    let mut caches: Vec<_> = seqs
                        .iter_mut()
                        .map(|sq| match &mut sq.session.layers[index] {
                            LayerState::Attention(cache) => (cache, sq.seg),
                            LayerState::Gdn(_) => unreachable!("session layers follow the config"),
                        })
                        .collect();
                    attention::forward(dev, &ctx, w, &mut caches, io, s.tokens, tables)
                }
                GpuMixer::Gdn(w) => {
                    let mut states: Vec<_> = seqs
                        .iter_mut()
                        .map(|sq| match &mut sq.session.layers[index] {
                            LayerState::Gdn(state) => (state, sq.seg),
                            LayerState::Attention(_) => {
                                unreachable!("session layers follow the config")
                            }
                        })
                        .collect();
                    gdn::forward(dev, config, w, &mut states, io, s.tokens, s.eps, tables)
                }
            },
        )?;
        probe(NonFiniteSite::Mixer { layer: index })?;
        sublayer(
            dev,
            &layer.residual,
            Sublayer::Ffn,
            &h,
            &s,
            |io| match &layer.ffn {
                GpuFfn::Dense(w) => mlp::mlp(dev, w, io, s.tokens, s.hidden),
                GpuFfn::Moe(w) => moe::moe(dev, config, w, io, s.tokens),
            },
        )?;
        probe(NonFiniteSite::Ffn { layer: index })?;
    }

    for sq in seqs.iter() {
        if let Some(ple) = sq.session.ple.as_ref() {
            let ids = ids_dev + 4 * sq.seg.offset as u64;
            qwen4::advance_history(dev, &ple.history, ids, sq.seg.tokens)?;
        }
    }

    // The head runs over the wanted rows only: gathered when they are not one run. A decode
    // step from tables (perhaps a graph for more rows than sequences) wants every row.
    let mut wanted = Vec::new();
    if batch.is_some() {
        wanted.extend(0..tokens);
    }
    for sq in seqs.iter().filter(|_| batch.is_none()) {
        let Seg { offset, tokens, .. } = sq.seg;
        match sq.want {
            LogitsFor::All => wanted.extend(offset..offset + tokens),
            LogitsFor::Last => wanted.push(offset + tokens - 1),
        }
    }
    let count = wanted.len();
    let gathered;
    let rows = if wanted.windows(2).all(|w| w[1] == w[0] + 1) {
        h.arg_at(wanted[0] * width)
    } else {
        let index: Vec<i32> = wanted.iter().map(|&r| r as i32).collect();
        let index = dev.upload(&index)?;
        gathered = (dev.scratch::<f32>(count * width)?, index);
        kernels::elementwise::GatherRows::launch(
            dev,
            Launch::elementwise(count * width),
            h.arg(),
            gathered.1.arg(),
            gathered.0.arg(),
            i(count),
            i(width),
        )?;
        gathered.0.arg()
    };
    let lm_head = e.gpu.lm_head();
    if decode_sized(dev, count) && !e.probing() {
        // The final norm fused into the head's matvec (per group of MATVEC_MAX_TOKENS rows).
        let mixed = match &e.gpu.head_input {
            GpuHeadInput::Norm(_) => None,
            GpuHeadInput::HyperMixer(w) => {
                Some(qwen4::enter(dev, w, rows, count, s.streams, s.hidden, s.eps)?.x)
            }
        };
        let logits = dev.scratch::<f32>(count * lm_head.rows)?;
        for (t0, n) in row_groups(count) {
            let input = match (&e.gpu.head_input, &mixed) {
                (GpuHeadInput::Norm(w), _) => DecodeIn {
                    x: rows.at(t0 * width),
                    ldx: width,
                    norm: Some((w, s.eps)),
                    normed_out: Ptr::null(),
                },
                (_, Some(mixed)) => DecodeIn::plain(mixed.arg_at(t0 * s.hidden), s.hidden),
                (GpuHeadInput::HyperMixer(_), None) => unreachable!("mixed above"),
            };
            let out = DecodeOut::Store {
                y: logits.arg_at(t0 * lm_head.rows),
                ldy: lm_head.rows,
            };
            decode_linear(dev, lm_head, 0..lm_head.rows, input, n, out)?;
        }
        return Ok((logits, count));
    }
    let head_in = match &e.gpu.head_input {
        GpuHeadInput::Norm(w) => norm_rows(dev, rows, w, count, 1, s.hidden, s.eps)?,
        GpuHeadInput::HyperMixer(w) => {
            qwen4::enter(dev, w, rows, count, s.streams, s.hidden, s.eps)?.x
        }
    };
    let last_rows = first_position + tokens - count;
    probe_rows(
        e,
        head_in.arg(),
        s.hidden,
        count,
        last_rows,
        NonFiniteSite::HeadInput,
    )?;
    let logits = project(dev, lm_head, head_in.arg(), s.hidden, count)?;
    probe_rows(
        e,
        logits.arg(),
        lm_head.rows,
        count,
        last_rows,
        NonFiniteSite::Logits,
    )?;
    Ok((logits, count))
}

/// While the engine replays a sequence to locate a non-finite value
/// ([`CudaEngine::locate_non_finite`]): fails naming `site` when one of the `rows` rows of
/// `width` floats at `x` holds a NaN or an infinity (row r is input token `first_token + r`).
/// Otherwise does nothing.
fn probe_rows(
    e: &CudaEngine,
    x: Ptr<f32>,
    width: usize,
    rows: usize,
    first_token: usize,
    site: NonFiniteSite,
) -> Result<()> {
    if !e.probing() {
        return Ok(());
    }
    let values: Vec<f32> = e.dev.download_raw(x.addr(), rows * width)?;
    match spindle_model::forward::first_non_finite_row(&values, width) {
        None => Ok(()),
        Some(row) => Err(CudaError::NonFinite {
            site,
            token: first_token + row,
        }),
    }
}
