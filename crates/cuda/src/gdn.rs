//! Gated DeltaNet on the device (MODEL_MATH §1.5), token-serial: one fused projection, the
//! causal conv with its state, then the delta rule with the gated norm fused in. Decode
//! (≤ 8 tokens) fuses the conv into the projection's matvec and runs a block per value head
//! (`gdn_heads`); prefill, and projections split across formats, run `gdn_conv` then
//! `gdn_recurrent`.

use spindle_model::{GdnGate, ModelConfig};

use crate::device::{f, i, p, threads_for, DevBuf, Device};
use crate::error::Result;
use crate::linear::{decode_linear_conv, Io, MATVEC_MAX_TOKENS};
use crate::session::GdnState;
use crate::weights::GpuGdn;

/// The largest d_k the recurrence kernel holds in registers (`GDN_MAX_DK` in gdn.cu).
pub const MAX_KEY_HEAD_DIM: usize = 128;

/// Runs `tokens` tokens through one GDN layer, updating `state` (input and output as `io`).
pub fn forward(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuGdn,
    state: &mut GdnState,
    io: Io,
    tokens: usize,
    eps: f32,
) -> Result<Option<DevBuf<f32>>> {
    let g = &config.gdn;
    let hidden = config.hidden_size;
    let (nk, nv, dk, dv) = (
        g.num_key_heads,
        g.num_value_heads,
        g.key_head_dim,
        g.value_head_dim,
    );
    let channels = g.conv_channels();
    let width = w.in_proj.rows; // C + n_v·d_v + 2·n_v
    let o = dev.scratch::<f32>(tokens * nv * dv)?;
    let z_off = channels;
    let b_off = channels + nv * dv;
    let a_off = b_off + nv;
    let gate_sigmoid = (config.gdn_gate == GdnGate::Sigmoid) as usize;

    // Decode, best case: the conv fused into the in_proj matvec, then a block per value head.
    if let (true, Some((threads, r, shared))) = (
        tokens <= MATVEC_MAX_TOKENS,
        heads_launch(dev, config, tokens),
    ) {
        let u = dev.scratch::<f32>(tokens * width)?;
        let input = io.input(hidden, 0);
        let fused = decode_linear_conv(
            dev,
            &w.in_proj,
            input,
            tokens,
            u.ptr(),
            width,
            state.conv.ptr(),
            w.conv.ptr(),
            g.conv_kernel,
            channels,
        )?;
        if fused {
            dev.launch(
                "gdn_heads",
                (nv as u32, 1, 1),
                threads,
                shared as u32,
                &[
                    p(u.ptr()),
                    i(width),
                    i(tokens),
                    i(nk),
                    i(nv),
                    i(dk),
                    i(dv),
                    i(z_off),
                    i(b_off),
                    i(a_off),
                    p(state.recurrent.ptr()),
                    p(w.a_log.ptr()),
                    p(w.dt_bias.ptr()),
                    p(w.norm.ptr()),
                    p(o.ptr()),
                    f(eps),
                    i(gate_sigmoid),
                    i(r),
                ],
            )?;
            return io.finish(dev, &w.out_proj, o.ptr(), nv * dv, hidden, tokens);
        }
    }

    let proj = io.project(dev, &w.in_proj, hidden, tokens)?;

    let u = dev.scratch::<f32>(tokens * channels)?;
    dev.launch(
        "gdn_conv",
        (channels.div_ceil(128) as u32, 1, 1),
        128,
        0,
        &[
            p(proj.ptr()),
            i(width),
            p(state.conv.ptr()),
            p(w.conv.ptr()),
            p(u.ptr()),
            i(tokens),
            i(channels),
            i(g.conv_kernel),
        ],
    )?;

    dev.launch(
        "gdn_recurrent",
        (nv as u32, 1, 1),
        threads_for(dv),
        0,
        &[
            p(u.ptr()),
            i(channels),
            p(proj.ptr()),
            i(width),
            i(z_off),
            i(b_off),
            i(a_off),
            p(state.recurrent.ptr()),
            p(w.a_log.ptr()),
            p(w.dt_bias.ptr()),
            p(w.norm.ptr()),
            p(o.ptr()),
            i(tokens),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            f(eps),
            i(gate_sigmoid),
        ],
    )?;
    io.finish(dev, &w.out_proj, o.ptr(), nv * dv, hidden, tokens)
}

/// The per-value-head decode kernel (after the conv fused into in_proj) when the shapes suit
/// it: (threads, row groups R, dynamic shared bytes).
fn heads_launch(dev: &Device, config: &ModelConfig, tokens: usize) -> Option<(u32, usize, usize)> {
    let g = &config.gdn;
    let (nk, nv, dk, dv) = (
        g.num_key_heads,
        g.num_value_heads,
        g.key_head_dim,
        g.value_head_dim,
    );
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
    (shared <= dev.shared_limit("gdn_heads")).then_some(((dv * r) as u32, r, shared))
}
