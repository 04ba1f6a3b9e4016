//! Gated DeltaNet on the device (MODEL_MATH §1.5): one fused projection, the causal conv with
//! its state, then the delta rule with the gated norm. What runs when:
//! - decode (≤ 8 tokens): the conv fused into the projection's matvec, then `gdn_decode_heads`, a
//!   block per value head;
//! - prefill (> 8 tokens): the conv (`gdn_conv`, a thread per token and channel, then
//!   `gdn_conv_state_update` keeps the last rows), then the chunked form ("Chunked prefill form", chunks
//!   of 64 tokens as on the CPU): `gdn_chunk_prep` builds every chunk's state-independent
//!   products in parallel, `gdn_chunk_scan` carries S through the chunks (a block per 32
//!   columns of each S_h), `gdn_gated_norm` applies the output norm;
//! - otherwise (decode whose projection is split across formats or whose shape `gdn_decode_heads`
//!   refuses, prefill whose shape the chunked kernels refuse: d_k > 128 or too little shared
//!   memory): `gdn_conv` then `gdn_recurrent`, token-serial.

use spindle_model::{GdnConfig, GdnGate, ModelConfig};

use crate::device::{threads_for, DevBuf, Device};
use crate::error::Result;
use crate::io::Io;
use crate::kernels::{
    self, i, Launch, Ptr, GDN_CHUNK, GDN_PREP_THREADS, GDN_SCAN_COLS, GDN_SCAN_THREADS,
    MATVEC_MAX_TOKENS,
};
use crate::matvec::decode_linear_conv;
use crate::session::{GdnState, LayerTables, Seg};
use crate::weights::GpuGdn;

/// Runs a step's `tokens` tokens through one GDN layer (input and output as `io`): each
/// sequence's rows (its [`Seg`]) through its own conv and recurrent state. The projections
/// run once over all rows; the conv and the delta rule per sequence.
pub fn forward(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuGdn,
    seqs: &mut [(&mut GdnState, Seg)],
    io: Io,
    tokens: usize,
    eps: f32,
    batch: Option<LayerTables>,
) -> Result<Option<DevBuf<f32>>> {
    let g = &config.gdn;
    let hidden = config.hidden_size;
    let (nk, nv, dk, dv) = g.dims();
    let channels = g.conv_channels();
    let width = w.in_proj.rows; // C + n_v·d_v + 2·n_v
    let o = dev.scratch::<f32>(tokens * nv * dv)?;
    let z_off = channels;
    let b_off = channels + nv * dv;
    let a_off = b_off + nv;
    let gate_sigmoid = (config.gdn_gate == GdnGate::Sigmoid) as usize;

    // Decode of B sequences (one token each, state addresses in device tables): the conv of
    // every row in one launch (in place), then a block per (value head, sequence).
    if let (Some(t), Some((threads, r, shared))) = (batch, heads_launch(dev, config, 1)) {
        debug_assert_eq!(t.seqs, tokens, "one token per sequence");
        let b = t.seqs;
        let proj = io.project(dev, &w.in_proj, hidden, tokens)?;
        kernels::gdn::GdnConvDecodeBatch::launch(
            dev,
            Launch::elementwise(b * channels),
            proj.arg(),
            i(width),
            t.table,
            w.conv.arg(),
            i(b),
            i(channels),
            i(g.conv_kernel),
        )?;
        kernels::gdn::GdnDecodeHeadsBatch::launch(
            dev,
            Launch::new((nv as u32, b as u32, 1), threads, shared as u32),
            proj.arg(),
            i(width),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            i(z_off),
            i(b_off),
            i(a_off),
            t.table.at(b),
            w.a_log.arg(),
            w.dt_bias.arg(),
            w.norm.arg(),
            o.arg(),
            eps,
            i(gate_sigmoid),
            i(r),
        )?;
        return io.finish(dev, &w.out_proj, o.arg(), nv * dv, hidden, tokens);
    }

    // Decode of one sequence, best case: the conv fused into the in_proj matvec, then a block
    // per value head.
    if let ([(state, _)], true, Some((threads, r, shared))) = (
        &mut *seqs,
        tokens <= MATVEC_MAX_TOKENS,
        heads_launch(dev, config, tokens),
    ) {
        let u = dev.scratch::<f32>(tokens * width)?;
        let input = io.input(hidden, Ptr::null());
        let fused = decode_linear_conv(
            dev,
            &w.in_proj,
            input,
            tokens,
            u.arg(),
            width,
            state.conv.arg(),
            w.conv.arg(),
            g.conv_kernel,
            channels,
        )?;
        if fused {
            kernels::gdn::GdnDecodeHeads::launch(
                dev,
                Launch::new((nv as u32, 1, 1), threads, shared as u32),
                u.arg(),
                i(width),
                i(tokens),
                i(nk),
                i(nv),
                i(dk),
                i(dv),
                i(z_off),
                i(b_off),
                i(a_off),
                state.recurrent.arg(),
                w.a_log.arg(),
                w.dt_bias.arg(),
                w.norm.arg(),
                o.arg(),
                eps,
                i(gate_sigmoid),
                i(r),
            )?;
            return io.finish(dev, &w.out_proj, o.arg(), nv * dv, hidden, tokens);
        }
    }

    let proj = io.project(dev, &w.in_proj, hidden, tokens)?;
    let u = dev.scratch::<f32>(tokens * channels)?;
    for (state, seg) in seqs.iter_mut() {
        let (t0, n) = (seg.offset, seg.tokens);
        if n == 0 {
            continue;
        }
        kernels::gdn::GdnConv::launch(
            dev,
            Launch::elementwise(n * channels),
            proj.arg_at(t0 * width),
            i(width),
            state.conv.arg(),
            w.conv.arg(),
            u.arg_at(t0 * channels),
            i(n),
            i(channels),
            i(g.conv_kernel),
        )?;
        kernels::gdn::GdnConvStateUpdate::launch(
            dev,
            Launch::new((channels.div_ceil(128) as u32, 1, 1), 128, 0),
            proj.arg_at(t0 * width),
            i(width),
            state.conv.arg(),
            i(n),
            i(channels),
            i(g.conv_kernel),
        )?;
        // A few tokens: the solo decode's kernel (the same arithmetic as a sequence alone).
        if let (true, Some((threads, r, shared))) =
            (n <= MATVEC_MAX_TOKENS, heads_launch(dev, config, n))
        {
            kernels::gdn::GdnDecodeHeadsRows::launch(
                dev,
                Launch::new((nv as u32, 1, 1), threads, shared as u32),
                u.arg_at(t0 * channels),
                i(channels),
                proj.arg_at(t0 * width),
                i(width),
                i(n),
                i(nk),
                i(nv),
                i(dk),
                i(dv),
                i(z_off),
                i(b_off),
                i(a_off),
                state.recurrent.arg(),
                w.a_log.arg(),
                w.dt_bias.arg(),
                w.norm.arg(),
                o.arg_at(t0 * nv * dv),
                eps,
                i(gate_sigmoid),
                i(r),
            )?;
            continue;
        }
        let form = if n > MATVEC_MAX_TOKENS {
            DeltaForm::Chunked
        } else {
            DeltaForm::Serial
        };
        let rows = DeltaRows {
            u: u.arg_at(t0 * channels),
            proj: proj.arg_at(t0 * width),
            width,
            z_off,
            b_off,
            a_off,
            state: state.recurrent.arg(),
            a_log: w.a_log.arg(),
            dt_bias: w.dt_bias.arg(),
            norm: w.norm.arg(),
            out: o.arg_at(t0 * nv * dv),
            tokens: n,
            eps,
            gate_sigmoid: gate_sigmoid == 1,
        };
        delta_rule(dev, g, &rows, form)?;
    }
    io.finish(dev, &w.out_proj, o.arg(), nv * dv, hidden, tokens)
}

/// Whether a decode step of many sequences runs this model's GDN layers through the batched
/// kernels (state addresses from device tables) on this device.
pub fn batch_decode_supported(dev: &Device, config: &ModelConfig) -> bool {
    heads_launch(dev, config, 1).is_some()
}

/// The form of the delta rule a prefill runs (MODEL_MATH §1.5).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaForm {
    /// Token by token (`gdn_recurrent`): a block per value head, serial over the tokens.
    Serial,
    /// The chunked form (`gdn_chunk_prep`, `gdn_chunk_scan`, `gdn_gated_norm`).
    Chunked,
}

/// Device addresses of the delta rule's operands for `tokens` tokens of one layer (after the
/// conv), as the kernels take them.
struct DeltaRows {
    /// The conv output `[T, C]`, channels `[q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v)]`.
    u: Ptr<f32>,
    /// Rows `[T, width]` holding z `[n_v·d_v]` at `z_off`, b `[n_v]` at `b_off`, a at `a_off`.
    proj: Ptr<f32>,
    width: usize,
    z_off: usize,
    b_off: usize,
    a_off: usize,
    /// S `[n_v, d_k, d_v]`, updated in place.
    state: Ptr<f32>,
    /// A_log and dt_bias `[n_v]`, the gated norm's weight `[d_v]`.
    a_log: Ptr<f32>,
    dt_bias: Ptr<f32>,
    norm: Ptr<f32>,
    /// The gated-norm output `[T, n_v·d_v]`.
    out: Ptr<f32>,
    tokens: usize,
    eps: f32,
    /// The norm's gate is sigmoid(z) (else SiLU(z)).
    gate_sigmoid: bool,
}

/// Steps 3–7 of MODEL_MATH §1.5 after the conv (gating, l2 norms, the delta rule from the
/// state in `r.state`, the gated norm) in form `form`; `Chunked` runs `Serial` for shapes the
/// chunked kernels do not take. Returns the form that ran.
fn delta_rule(dev: &Device, g: &GdnConfig, r: &DeltaRows, form: DeltaForm) -> Result<DeltaForm> {
    if r.tokens == 0 {
        return Ok(form);
    }
    if form == DeltaForm::Chunked {
        if let Some(shape) = ChunkShape::of(dev, g) {
            delta_rule_chunked(dev, g, r, &shape)?;
            return Ok(DeltaForm::Chunked);
        }
    }
    let (nk, nv, dk, dv) = g.dims();
    kernels::gdn::GdnRecurrent::launch(
        dev,
        Launch::new((nv as u32, 1, 1), threads_for(dv), 0),
        r.u,
        i(g.conv_channels()),
        r.proj,
        i(r.width),
        i(r.z_off),
        i(r.b_off),
        i(r.a_off),
        r.state,
        r.a_log,
        r.dt_bias,
        r.norm,
        r.out,
        i(r.tokens),
        i(nk),
        i(nv),
        i(dk),
        i(dv),
        r.eps,
        i(r.gate_sigmoid as usize),
    )?;
    Ok(DeltaForm::Serial)
}

/// The largest d_k the chunked kernels take (the scan's 16 warps × 8 rows of S).
const CHUNK_MAX_DK: usize = 128;
/// Chunks whose records are held at once: the prompt runs through prep + scan in windows of
/// this many chunks, bounding the scratch (~77 MB for n_v = 32, d_k = d_v = 128).
const WINDOW_CHUNKS: usize = 16;

/// The chunked kernels' layout for one GDN shape (see the record layout in gdn.cu).
struct ChunkShape {
    /// Row stride of the d_k-wide rows: d_k rounded up to 4, plus 4 when that is a multiple of 8
    /// floats (so ldk/4 is odd and a quarter-warp's 16-byte reads of 8 rows miss each other's banks).
    ldk: usize,
    /// Floats in one (v-head, chunk) record.
    record: usize,
    /// Dynamic shared bytes of `gdn_chunk_prep` and `gdn_chunk_scan`.
    prep_shared: usize,
    scan_shared: usize,
}

impl ChunkShape {
    /// The layout, or None when the chunked kernels do not take this shape on this device.
    fn of(dev: &Device, g: &GdnConfig) -> Option<Self> {
        let (nk, nv, dk, dv) = g.dims();
        if dk == 0 || dk > CHUNK_MAX_DK || dv == 0 || nk == 0 || nv % nk != 0 {
            return None;
        }
        let dkp = dk.next_multiple_of(4);
        let ldk = if (dkp / 4) % 2 == 0 { dkp + 4 } else { dkp };
        let record = GDN_CHUNK * GDN_CHUNK + 3 * GDN_CHUNK * ldk + GDN_CHUNK * dv + 4;
        let prep_shared = 4 * (2 * GDN_CHUNK * ldk + GDN_CHUNK * GDN_CHUNK + 5 * GDN_CHUNK);
        let scan_shared = 4
            * (GDN_CHUNK * GDN_CHUNK
                + 3 * GDN_CHUNK * ldk
                + GDN_CHUNK * GDN_SCAN_COLS
                + dkp * GDN_SCAN_COLS);
        (prep_shared <= dev.shared_limit(kernels::gdn::GdnChunkPrep::NAME)
            && scan_shared <= dev.shared_limit(kernels::gdn::GdnChunkScan::NAME))
        .then_some(ChunkShape {
            ldk,
            record,
            prep_shared,
            scan_shared,
        })
    }
}

/// The chunked form: per window of [`WINDOW_CHUNKS`] chunks, `gdn_chunk_prep` (a block per
/// (chunk, v-head): everything that does not depend on S) then `gdn_chunk_scan` (a block per
/// 32 columns of each S_h, serial over the window's chunks); then `gdn_gated_norm` over all
/// tokens.
fn delta_rule_chunked(
    dev: &Device,
    g: &GdnConfig,
    r: &DeltaRows,
    shape: &ChunkShape,
) -> Result<()> {
    let (nk, nv, dk, dv) = g.dims();
    let channels = g.conv_channels();
    let window = WINDOW_CHUNKS * GDN_CHUNK;
    let records =
        dev.scratch::<f32>(nv * r.tokens.min(window).div_ceil(GDN_CHUNK) * shape.record)?;
    for t0 in (0..r.tokens).step_by(window) {
        let len = (r.tokens - t0).min(window);
        let row = |base: Ptr<f32>, width: usize| base.at(t0 * width);
        kernels::gdn::GdnChunkPrep::launch(
            dev,
            Launch::new(
                (len.div_ceil(GDN_CHUNK) as u32, nv as u32, 1),
                GDN_PREP_THREADS as u32,
                shape.prep_shared as u32,
            ),
            row(r.u, channels),
            i(channels),
            row(r.proj, r.width),
            i(r.width),
            i(r.b_off),
            i(r.a_off),
            r.a_log,
            r.dt_bias,
            records.arg(),
            i(len),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            i(shape.ldk),
        )?;
        kernels::gdn::GdnChunkScan::launch(
            dev,
            Launch::new(
                (dv.div_ceil(GDN_SCAN_COLS) as u32, nv as u32, 1),
                GDN_SCAN_THREADS as u32,
                shape.scan_shared as u32,
            ),
            records.arg(),
            r.state,
            row(r.out, nv * dv),
            i(len),
            i(nv),
            i(dk),
            i(dv),
            i(shape.ldk),
        )?;
    }
    let rows_per_block = 8; // a warp per (token, v-head) row
    kernels::gdn::GdnGatedNorm::launch(
        dev,
        Launch::new(
            ((r.tokens * nv).div_ceil(rows_per_block) as u32, 1, 1),
            32 * rows_per_block as u32,
            0,
        ),
        r.out,
        r.proj,
        i(r.width),
        i(r.z_off),
        r.norm,
        i(r.tokens),
        i(nv),
        i(dv),
        r.eps,
        i(r.gate_sigmoid as usize),
    )
}

/// The per-value-head decode kernel (after the conv fused into in_proj) when the shapes suit
/// it: (threads, row groups R, dynamic shared bytes).
fn heads_launch(dev: &Device, config: &ModelConfig, tokens: usize) -> Option<(u32, usize, usize)> {
    let g = &config.gdn;
    let (nk, nv, dk, dv) = g.dims();
    if nv % nk != 0 || (dk * dv) % 4 != 0 || !(dv % 32 == 0 || (dv < 32 && dv.is_power_of_two())) {
        return None;
    }
    // Row groups: as many as 1024 threads allow, dividing d_k, whole warps.
    let mut r = 1;
    while dv * r * 2 <= 1024 && dk % (r * 2) == 0 {
        r *= 2;
    }
    if (dv * r) % 32 != 0 {
        return None;
    }
    let shared = 4 * (dk * dv + tokens * 2 * dk + 2 * tokens + r * dv + dv / dv.min(32));
    (shared <= dev.shared_limit(kernels::gdn::GdnDecodeHeads::NAME)).then_some((
        (dv * r) as u32,
        r,
        shared,
    ))
}

/// The host-side operands of [`delta_rule_on_host`], for T tokens of one layer.
#[doc(hidden)]
pub struct DeltaInputs<'a> {
    /// The conv output `[T, C]`, channels `[q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v)]`.
    pub u: &'a [f32],
    /// Per token `[z (n_v·d_v) | b (n_v) | a (n_v)]`: `[T, n_v·d_v + 2·n_v]`.
    pub zba: &'a [f32],
    /// `[n_v]` each.
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
    /// The gated norm's weight `[d_v]`.
    pub norm: &'a [f32],
    pub eps: f32,
    /// The norm's gate is sigmoid(z) (else SiLU(z)).
    pub gate_sigmoid: bool,
}

/// For the GPU tests that compare the forms: runs the delta rule and gated norm (MODEL_MATH
/// §1.5 steps 3–7, after the conv) on the device in form `form`, from `state` `[n_v, d_k, d_v]`
/// (updated), and returns the output `[T, n_v·d_v]` and the form that ran (`Chunked` runs
/// `Serial` for shapes the chunked kernels refuse). Panics when the slices disagree with `g`.
#[doc(hidden)]
pub fn delta_rule_on_host(
    dev: &Device,
    g: &GdnConfig,
    x: &DeltaInputs,
    state: &mut [f32],
    form: DeltaForm,
) -> Result<(Vec<f32>, DeltaForm)> {
    let (nv, dk, dv) = (g.num_value_heads, g.key_head_dim, g.value_head_dim);
    let channels = g.conv_channels();
    let width = nv * dv + 2 * nv;
    let tokens = x.u.len() / channels;
    assert_eq!(x.u.len(), tokens * channels, "u is [T, C = {channels}]");
    assert_eq!(x.zba.len(), tokens * width, "zba is [T, {width}]");
    assert_eq!(state.len(), nv * dk * dv, "state is [n_v, d_k, d_v]");
    assert!(x.a_log.len() == nv && x.dt_bias.len() == nv && x.norm.len() == dv);
    let u = dev.upload(x.u)?;
    let zba = dev.upload(x.zba)?;
    let s = dev.upload(state)?;
    let (a_log, dt_bias, norm) = (
        dev.upload(x.a_log)?,
        dev.upload(x.dt_bias)?,
        dev.upload(x.norm)?,
    );
    let out = dev.zeros::<f32>(tokens * nv * dv)?;
    let rows = DeltaRows {
        u: u.arg(),
        proj: zba.arg(),
        width,
        z_off: 0,
        b_off: nv * dv,
        a_off: nv * dv + nv,
        state: s.arg(),
        a_log: a_log.arg(),
        dt_bias: dt_bias.arg(),
        norm: norm.arg(),
        out: out.arg(),
        tokens,
        eps: x.eps,
        gate_sigmoid: x.gate_sigmoid,
    };
    let ran = delta_rule(dev, g, &rows, form)?;
    state.copy_from_slice(&dev.download(&s, 0, state.len())?);
    Ok((dev.download(&out, 0, tokens * nv * dv)?, ran))
}
