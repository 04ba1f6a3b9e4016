//! Gated DeltaNet on the device (MODEL_MATH §1.5), token-serial: one fused projection, the
//! causal conv with its state, then the delta rule with the gated norm fused in.

use spindle_model::{GdnGate, ModelConfig};

use crate::device::{f, i, p, threads_for, DevBuf, Device};
use crate::error::Result;
use crate::linear::{linear, project};
use crate::session::GdnState;
use crate::weights::GpuGdn;

/// The largest d_k the recurrence kernel holds in registers (`GDN_MAX_DK` in gdn.cu).
pub const MAX_KEY_HEAD_DIM: usize = 128;

/// Runs `tokens` tokens through one GDN layer, updating `state`. `x` is `[tokens, H]`.
pub fn forward(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuGdn,
    state: &mut GdnState,
    x: &DevBuf<f32>,
    tokens: usize,
    eps: f32,
) -> Result<DevBuf<f32>> {
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
    let proj = project(dev, &w.in_proj, x.ptr(), hidden, tokens)?;

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

    let o = dev.scratch::<f32>(tokens * nv * dv)?;
    let z_off = channels;
    let b_off = channels + nv * dv;
    let a_off = b_off + nv;
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
            i((config.gdn_gate == GdnGate::Sigmoid) as usize),
        ],
    )?;
    let y = dev.scratch::<f32>(tokens * hidden)?;
    linear(
        dev,
        &w.out_proj,
        o.ptr(),
        nv * dv,
        y.ptr(),
        hidden,
        tokens,
        false,
    )?;
    Ok(y)
}
