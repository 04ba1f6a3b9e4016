//! Kernel-level entry points for the GPU tests (`tests/kernels.rs`): each runs one device
//! path on host data and returns the result to the host. Not a stable interface.

use spindle_engine::weights::Linear;

use crate::attention::{attend_serial, attend_tiled, Heads};
use crate::device::Device;
use crate::error::Result;
use crate::linear::project;
use crate::matrix::DevMatrix;
use crate::moe::{routed_experts, Routes};

/// `x [tokens, cols] · Wᵀ` through the device's linear layer (the decode matvecs for at most
/// 8 tokens, the tensor-core or SIMT GEMM above, as [`Device::tensor_cores`] says).
pub fn linear(dev: &Device, w: &Linear, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
    let m = DevMatrix::upload(dev, w)?;
    let x = dev.upload(x)?;
    let y = project(dev, &m, x.ptr(), w.cols(), tokens)?;
    dev.download(&y, 0, tokens * w.rows())
}

/// The routed experts of a MoE block for `x [tokens, hidden]`: `gate_up` is `[E·2I, hidden]`
/// (each expert's gate rows, then its up rows), `down` is `[E·hidden, I]`; token t uses
/// experts `idx[t·k..]` with weights `wt[t·k..]`. Returns `Σ_j wt·down_e(silu(gate_e·x)·(up_e·x))`.
pub fn routed_experts_of(
    dev: &Device,
    gate_up: &Linear,
    down: &Linear,
    x: &[f32],
    idx: &[i32],
    wt: &[f32],
    tokens: usize,
    k: usize,
) -> Result<Vec<f32>> {
    let hidden = gate_up.cols();
    let experts = down.rows() / hidden;
    let single = |m: DevMatrix| {
        m.parts
            .into_iter()
            .next()
            .map(|(_, part)| part)
            .expect("one block")
    };
    let gu = single(DevMatrix::upload(dev, gate_up)?);
    let dn = single(DevMatrix::upload(dev, down)?);
    let x = dev.upload(x)?;
    let (idx, wt) = (dev.upload(idx)?, dev.upload(wt)?);
    let y = dev.zeros::<f32>(tokens * hidden)?;
    let routes = Routes {
        idx: &idx,
        wt: &wt,
        tokens,
        k,
        experts,
    };
    routed_experts(dev, &gu, &dn, &routes, &x, &y)?;
    dev.download(&y, 0, tokens * hidden)
}

/// Causal gated attention of `tokens` tokens at positions `start..` over `keys`/`values`
/// (`[start + tokens, n_kv·d]`, the new tokens' rows included): through the tiled prefill
/// kernel when `tiled` (None if the shape does not suit it), else a block per (token, head).
pub fn attention_of(
    dev: &Device,
    q: &[f32],
    gate: &[f32],
    keys: &[f32],
    values: &[f32],
    (n_h, n_kv, d): (usize, usize, usize),
    tokens: usize,
    start: usize,
    tiled: bool,
) -> Result<Option<Vec<f32>>> {
    let heads = Heads { n_h, n_kv, d };
    let (q, gate) = (dev.upload(q)?, dev.upload(gate)?);
    let (keys, values) = (dev.upload(keys)?, dev.upload(values)?);
    let out = dev.zeros::<f32>(tokens * n_h * d)?;
    let args = (q.ptr(), gate.ptr(), keys.ptr(), values.ptr(), out.ptr());
    if tiled {
        if !attend_tiled(
            dev, heads, args.0, args.1, args.2, args.3, args.4, tokens, start,
        )? {
            return Ok(None);
        }
    } else {
        attend_serial(
            dev, heads, args.0, args.1, args.2, args.3, None, args.4, tokens, start, 0,
        )?;
    }
    Ok(Some(dev.download(&out, 0, tokens * n_h * d)?))
}
