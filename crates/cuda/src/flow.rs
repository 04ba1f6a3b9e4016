//! The hybrid decoder flow on the device (MODEL_MATH §2, §3, §4.2), mirroring
//! the CPU backend's (`spindle_cpu`): embedding → per layer `h += Mixer(in(h)); h += FFN(in(h))` → head input
//! → LM head. Activations and state are f32; weights bf16, Q8 or Q4. With plain norms and a
//! small batch, each sublayer norms `h` and adds its output back inside its own first and
//! last kernels ([`Io::Fused`]); a decode step is captured as a CUDA graph (qwen4_exp's too:
//! its PLE and QSA steps are kernels that read the ids and the position on the device).

use spindle_model::forward::LogitsFor;
use spindle_model::mrope::{mrope_row, TokenRole};

use crate::attention::{self, AttentionCtx};
use crate::device::{DevBuf, Device};
use spindle_model::forward::NonFiniteSite;

use crate::error::{CudaError, DriverContext, Result};
use crate::io::{decode_sized, Io};
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
    // A graph replays text tokens only (an image row's embedding and 3-D position are not
    // in it).
    let text_only = session.rope.is_text_only();
    if ids.len() == 1 && text_only && e.graphs && !session.graph_failed && !e.probing() {
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
    ensure_capacity(e, session, start + ids.len())?;
    let small = ids.len() <= MATVEC_MAX_TOKENS;
    let ids_i32: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    let (ids_dev, _ids_buf) = if small {
        session.step_io.write_ids(dev, &ids_i32)?;
        (session.step_io.ids(), None)
    } else {
        let buf = dev.upload(&ids_i32)?;
        (buf.ptr(), Some(buf))
    };
    let placed = place_images(e, session, ids)?;
    let _arena = small.then(|| Workspace::begin(dev, &session.workspace));
    let seg = Seg {
        rope_delta: placed.rope_delta,
        slots: placed.slots.as_ref().map_or(0, DevBuf::ptr),
        ..Seg::text(0, ids.len(), start, 0)
    };
    let mut seqs = [StepSeq { session, seg, want }];
    let (logits, rows) = body(e, &mut seqs, ids.len(), ids_dev, None, placed.rows.as_ref())?;
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

/// Makes the session ready to hold `needed` tokens: its block table gets the blocks of its next
/// positions (a private copy of any block it shares with the prefix cache or another sequence,
/// new ones at its end; [`CudaError::KvPoolFull`] when the pool is short, the session unchanged),
/// and every attention layer's flash-decoding partials (or QSA indexer cache) cover them.
pub(crate) fn ensure_capacity(
    e: &CudaEngine,
    session: &mut CudaSession,
    needed: usize,
) -> Result<()> {
    session.kv.prepare_write(&e.dev, session.position, needed)?;
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
    let rope_delta = session.rope.delta;
    if session
        .graph
        .as_ref()
        .is_none_or(|g| g.generation != generation || g.rope_delta != rope_delta)
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
            rope_delta,
            ..Seg::text(0, 1, pos, start_dev)
        };
        let mut seqs = [StepSeq {
            session: &mut *session,
            seg,
            want: LogitsFor::Last,
        }];
        let result = body(e, &mut seqs, 1, ids_dev, None, None);
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
            rope_delta,
        });
    }
    let g = session.graph.as_ref().expect("captured above");
    g.graph.launch().during("launching the decode graph")?;
    Ok(g.logits)
}

/// Image rows of a step that replace their tokens' embeddings (shared docs `VISION.md` §4.1):
/// `rows` `[count, hidden]` go to step rows `index` `[count]`.
pub(crate) struct ImageRows {
    rows: DevBuf<f32>,
    index: DevBuf<i32>,
    count: usize,
}

/// How one sequence's chunk is placed on its rotary positions and images.
pub(crate) struct Placed {
    /// What a text token's rotary position adds to its cache index.
    pub rope_delta: i64,
    /// Per-token per-slot positions `[tokens, rotary_dim/2]` (a chunk placed on pending images).
    pub slots: Option<DevBuf<i32>>,
    pub rows: Option<ImageRows>,
}

/// Places `ids` on `session`'s pending images (advancing its [`RopeCursor`]): a text-only
/// session keeps today's path (positions = cache index + rope_delta, nothing uploaded); one with
/// images pending gets each token's 3-D position as per-slot positions and its image rows.
///
/// [`RopeCursor`]: spindle_model::mrope::RopeCursor
pub(crate) fn place_images(
    e: &CudaEngine,
    session: &mut CudaSession,
    ids: &[u32],
) -> Result<Placed> {
    let cursor = &mut session.rope;
    let image_token = e.image_token();
    let (Some(image_token), false) = (image_token, cursor.is_text_only()) else {
        return Ok(Placed {
            rope_delta: cursor.delta,
            slots: None,
            rows: None,
        });
    };
    let images: Vec<_> = cursor.pending.iter().map(|p| p.features.clone()).collect();
    let (roles, positions) = cursor
        .place(ids, session.position, image_token)
        .map_err(|err| CudaError::Image(err.to_string()))?;
    let section = e.config.rope.mrope_section.as_deref().unwrap_or(&[]);
    let slots = slot_positions(&positions, section, e.config.rope.rotary_dim / 2);
    let hidden = e.config.hidden_size;
    let mut rows = Vec::new();
    let mut index = Vec::new();
    for (t, role) in roles.iter().enumerate() {
        if let TokenRole::Image { image, row } = *role {
            rows.extend_from_slice(images[image].row(row));
            index.push(t as i32);
        }
    }
    let dev = &e.dev;
    let rows = if index.is_empty() {
        None
    } else {
        Some(ImageRows {
            rows: dev.upload(&rows)?,
            count: index.len(),
            index: dev.upload(&index)?,
        })
    };
    debug_assert!(rows
        .as_ref()
        .is_none_or(|r| r.rows.len() == r.count * hidden));
    Ok(Placed {
        rope_delta: 0,
        slots: Some(dev.upload(&slots)?),
        rows,
    })
}

/// Each token's rotary position per frequency slot `[tokens, half]` from its (T, H, W)
/// position: slot j takes row `mrope_row(j, section)` (the interleaved map of `VISION.md`
/// §4.3). With equal rows every slot holds that position, which is plain 1-D RoPE.
pub fn slot_positions(positions: &[[usize; 3]], section: &[usize], half: usize) -> Vec<i32> {
    let rows: Vec<usize> = (0..half)
        .map(|j| {
            if section.is_empty() {
                0
            } else {
                mrope_row(j, section)
            }
        })
        .collect();
    positions
        .iter()
        .flat_map(|pos| rows.iter().map(move |&r| pos[r] as i32))
        .collect()
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
    images: Option<&ImageRows>,
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
    if let Some(im) = images {
        kernels::vision::ScatterRows::launch(
            dev,
            Launch::elementwise(im.count * s.hidden),
            im.rows.arg(),
            im.index.arg(),
            h.arg(),
            i(im.count),
            i(s.hidden),
            i(s.streams),
        )?;
    }
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
                        pool: e
                            .kv_pool
                            .layer(index)
                            .expect("the pool has every attention layer"),
                    };
                    let mut caches: Vec<_> = seqs
                        .iter_mut()
                        .map(|sq| {
                            let session = &mut *sq.session;
                            let table = Ptr::raw(session.kv.table_ptr());
                            match &mut session.layers[index] {
                                LayerState::Attention(cache) => (cache, table, sq.seg),
                                LayerState::Gdn(_) => {
                                    unreachable!("session layers follow the config")
                                }
                            }
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
        let input = match (&e.gpu.head_input, &mixed) {
            (GpuHeadInput::Norm(w), _) => DecodeIn {
                x: rows,
                ldx: width,
                norm: Some((w, s.eps)),
                normed_out: Ptr::null(),
            },
            (_, Some(mixed)) => DecodeIn::plain(mixed.arg(), s.hidden),
            (GpuHeadInput::HyperMixer(_), None) => unreachable!("mixed above"),
        };
        let out = DecodeOut::Store {
            y: logits.arg(),
            ldy: lm_head.rows,
        };
        decode_linear(dev, lm_head, 0..lm_head.rows, input, count, out)?;
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

#[cfg(test)]
mod tests {
    use super::slot_positions;
    use spindle_kernels::rope::RopeFreqs;

    /// The per-slot positions, rotated as `rope_elem` does (pos · inv_freq in f64), give the
    /// CPU's interleaved mRoPE cos/sin exactly; equal rows give plain RoPE.
    #[test]
    fn slot_positions_reproduce_the_cpu_mrope() {
        let section = [11, 11, 10];
        let freqs = RopeFreqs::new(1e7, 64);
        let inv: Vec<f64> = (0..32)
            .map(|i| 1.0 / 1e7f64.powf(2.0 * i as f64 / 64.0))
            .collect();
        let positions = [[6, 6, 6], [6, 7, 10], [11, 11, 11], [40, 3, 17]];
        let slots = slot_positions(&positions, &section, 32);
        assert_eq!(slots.len(), 4 * 32);
        for (t, pos) in positions.iter().enumerate() {
            let (cos, sin) = freqs.cos_sin_mrope(*pos, &section);
            for j in 0..32 {
                let a = slots[t * 32 + j] as f64 * inv[j];
                assert_eq!(a.cos() as f32, cos[j], "token {t} slot {j}");
                assert_eq!(a.sin() as f32, sin[j], "token {t} slot {j}");
            }
        }
        // (6, 7, 10): slot 0 T, 1 H, 2 W, ..., 30 T, 31 H.
        assert_eq!(&slots[32..35], &[6, 7, 10]);
        assert_eq!(slots[32 + 30], 6);
        assert_eq!(slots[32 + 31], 7);
        assert!(slots[..32].iter().all(|&s| s == 6));
    }
}
