//! Feed-forward blocks on the device: the dense SwiGLU MLP and the MoE with a shared expert
//! (MODEL_MATH §1.6). Routing (softmax, top-k, renormalisation) runs on the device.

use spindle_model::ModelConfig;

use crate::device::{i, p, threads_for, DevBuf, Device};
use crate::error::Result;
use crate::linear::{linear, project, WFormat};
use crate::weights::{GpuMlp, GpuMoe};

/// `down(silu(gate(x)) ⊙ up(x))` for `[tokens, H]`.
pub fn mlp(
    dev: &Device,
    w: &GpuMlp,
    x: &DevBuf<f32>,
    tokens: usize,
    hidden: usize,
) -> Result<DevBuf<f32>> {
    let inter = w.down.cols;
    let gu = project(dev, &w.gate_up, x.ptr(), hidden, tokens)?;
    let act = dev.scratch::<f32>(tokens * inter)?;
    dev.launch_elementwise(
        "swiglu",
        tokens * inter,
        &[
            p(gu.ptr()),
            i(2 * inter),
            i(0),
            i(inter),
            p(act.ptr()),
            i(tokens),
            i(inter),
        ],
    )?;
    let y = dev.scratch::<f32>(tokens * hidden)?;
    linear(
        dev,
        &w.down,
        act.ptr(),
        inter,
        y.ptr(),
        hidden,
        tokens,
        false,
    )?;
    Ok(y)
}

/// The MoE block for `[tokens, H]`: sigmoid-gated shared expert plus the weighted top-k experts.
pub fn moe(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuMoe,
    x: &DevBuf<f32>,
    tokens: usize,
) -> Result<DevBuf<f32>> {
    let cfg = config
        .moe
        .as_ref()
        .expect("validated: MoE layers have a MoE config");
    let hidden = config.hidden_size;
    let (e_count, k, inter, shared) = (
        cfg.num_experts,
        cfg.top_k,
        cfg.expert_intermediate,
        cfg.shared_intermediate,
    );
    let width = w.input.rows; // E + 2·I_s + 1
    let big = project(dev, &w.input, x.ptr(), hidden, tokens)?;

    let idx = dev.scratch::<i32>(tokens * k)?;
    let wt = dev.scratch::<f32>(tokens * k)?;
    dev.launch(
        "moe_route",
        (tokens as u32, 1, 1),
        threads_for(e_count.max(k)),
        (e_count * 4) as u32,
        &[
            p(big.ptr()),
            i(width),
            i(e_count),
            i(k),
            i(cfg.renormalize as usize),
            p(idx.ptr()),
            p(wt.ptr()),
        ],
    )?;

    // Shared expert, scaled by sigmoid(shared_expert_gate(x)).
    let act_shared = dev.scratch::<f32>(tokens * shared)?;
    dev.launch_elementwise(
        "swiglu",
        tokens * shared,
        &[
            p(big.ptr()),
            i(width),
            i(e_count),
            i(e_count + shared),
            p(act_shared.ptr()),
            i(tokens),
            i(shared),
        ],
    )?;
    let y = dev.scratch::<f32>(tokens * hidden)?;
    linear(
        dev,
        &w.shared_down,
        act_shared.ptr(),
        shared,
        y.ptr(),
        hidden,
        tokens,
        false,
    )?;
    dev.launch_elementwise(
        "scale_by_sigmoid",
        tokens * hidden,
        &[
            p(y.ptr()),
            p(big.at(e_count + 2 * shared)),
            i(width),
            i(tokens),
            i(hidden),
        ],
    )?;

    // Routed experts: every (token, expert) pair's SwiGLU, then the weighted down projections.
    let act = dev.scratch::<f32>(tokens * k * inter)?;
    let (gu, down) = (&w.experts_gate_up, &w.experts_down);
    let gate_up_kernel = match gu.fmt {
        WFormat::Bf16 => "moe_gate_up_bf16",
        WFormat::Q8 => "moe_gate_up_q8",
        WFormat::Q4 => "moe_gate_up_q4",
    };
    let down_kernel = match down.fmt {
        WFormat::Bf16 => "moe_down_bf16",
        WFormat::Q8 => "moe_down_q8",
        WFormat::Q4 => "moe_down_q4",
    };
    dev.launch(
        gate_up_kernel,
        (inter.div_ceil(8) as u32, (tokens * k) as u32, 1),
        256,
        0,
        &[
            p(gu.codes.ptr()),
            p(gu.scales.ptr()),
            p(x.ptr()),
            i(hidden),
            p(idx.ptr()),
            p(act.ptr()),
            i(k),
            i(inter),
            i(hidden),
            i((gu.vec_ok() && x.ptr() % 16 == 0 && hidden % 4 == 0) as usize),
        ],
    )?;
    dev.launch(
        down_kernel,
        (hidden.div_ceil(8) as u32, tokens as u32, 1),
        256,
        0,
        &[
            p(down.codes.ptr()),
            p(down.scales.ptr()),
            p(act.ptr()),
            p(idx.ptr()),
            p(wt.ptr()),
            p(y.ptr()),
            i(k),
            i(inter),
            i(hidden),
            i((down.vec_ok() && act.ptr() % 16 == 0 && inter % 4 == 0) as usize),
        ],
    )?;
    Ok(y)
}
