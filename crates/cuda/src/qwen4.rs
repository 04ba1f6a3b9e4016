//! qwen4_exp on the device (MODEL_MATH §4): hyper-connections (§4.3) and PLE (§4.5), all
//! kernels, so a decode step holds no host work and is captured in a CUDA graph. PLE hashes
//! each token's n-grams on the device from the ids and the session's n-gram history (§4.6) and
//! gathers the rows straight from the n-gram table, which stays in page-locked host memory
//! mapped into the device (`ple_gather`). QSA selection (§4.4) is with attention.

use crate::device::{threads_for, DevBuf, Device};
use crate::error::Result;
use crate::kernels::{self, i, p, Launch, Ptr};
use crate::linear::project;
use crate::norm::{group_norm, norm_rows};
use crate::weights::{GpuHyper, GpuPle};

/// A hyper-connection block's sublayer input `x [T, H]` and the raw projection `[T, ld]`
/// whose columns `lowrank..` hold the injection logits (ω = 2·sigmoid(·/n) in `inject`).
pub struct HyperInput {
    pub x: DevBuf<f32>,
    pub mix: DevBuf<f32>,
}

/// Reads the streams `hs [T, n·H]` into one sublayer input (MODEL_MATH §4.3).
pub fn enter(
    dev: &Device,
    w: &GpuHyper,
    hs: Ptr<f32>,
    tokens: usize,
    streams: usize,
    hidden: usize,
    eps: f32,
) -> Result<HyperInput> {
    let width = streams * hidden;
    let normed = norm_rows(dev, hs, &w.norm, tokens, streams, hidden, eps)?;
    let ld = w.down_inject.rows;
    let mix = project(dev, &w.down_inject, normed.arg(), width, tokens)?;
    let m = dev.scratch::<f32>(tokens * w.lowrank)?;
    kernels::elementwise::SiluScaled::launch(
        dev,
        Launch::elementwise(tokens * w.lowrank),
        mix.arg(),
        i(ld),
        1.0 / streams as f32,
        m.arg(),
        i(tokens),
        i(w.lowrank),
    )?;
    let a = project(dev, &w.up, m.arg(), w.lowrank, tokens)?;
    let x = dev.scratch::<f32>(tokens * hidden)?;
    kernels::qwen4::HyperConnectionMix::launch(
        dev,
        Launch::elementwise(tokens * hidden),
        a.arg(),
        normed.arg(),
        x.arg(),
        i(tokens),
        i(streams),
        i(hidden),
    )?;
    Ok(HyperInput { x, mix })
}

/// `hs_s += ω_s · y` for every stream s; `mix` is [`HyperInput::mix`].
pub fn inject(
    dev: &Device,
    w: &GpuHyper,
    mix: &DevBuf<f32>,
    hs: &DevBuf<f32>,
    y: &DevBuf<f32>,
    tokens: usize,
    streams: usize,
    hidden: usize,
) -> Result<()> {
    kernels::qwen4::HyperConnectionInject::launch(
        dev,
        Launch::elementwise(tokens * streams * hidden),
        hs.arg(),
        y.arg(),
        mix.arg_at(w.lowrank),
        i(w.down_inject.rows),
        i(tokens),
        i(streams),
        i(hidden),
    )
}

/// Computes PLE for the `tokens` ids at device address `ids` (i32) and adds it to the streams
/// `hs [T, n·H]` (MODEL_MATH §4.5). `history` is the n-gram history before these ids (device,
/// i32, advanced by [`advance_history`] after the last PLE layer); `conv_state` is updated.
pub fn add(
    dev: &Device,
    w: &GpuPle,
    hs: Ptr<f32>,
    ids: u64,
    tokens: usize,
    history: &DevBuf<i32>,
    conv_state: &DevBuf<f32>,
    streams: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    let width = streams * hidden;
    let ple_dim = w.kv_proj.cols;

    // Eng: one table row per hash head, hashed and gathered on the device.
    let eng = dev.scratch::<f32>(tokens * ple_dim)?;
    kernels::qwen4::PleGather::launch(
        dev,
        Launch::new(
            (tokens as u32, w.heads as u32, 1),
            threads_for(w.table.dim).min(256),
            0,
        ),
        p(ids),
        history.arg(),
        w.hash.arg(),
        i(w.ngram_size),
        i(w.heads_per_ngram),
        i(w.eos as usize),
        p(w.table.memory.ptr()),
        i(w.table.dtype),
        i(w.table.dim),
        eng.arg(),
    )?;

    let kv = project(dev, &w.kv_proj, eng.arg(), ple_dim, tokens)?; // [T, n·H + H]
    let ld = w.kv_proj.rows;
    let keys = dev.scratch::<f32>(tokens * width)?;
    group_norm(
        dev,
        kv.arg(),
        ld,
        keys.arg(),
        width,
        &w.norm_key,
        tokens,
        streams,
        hidden,
        eps,
    )?;
    let queries = norm_rows(dev, hs, &w.norm_query, tokens, streams, hidden, eps)?;
    let gates = dev.scratch::<f32>(tokens * width)?;
    kernels::qwen4::PleGates::launch(
        dev,
        Launch::new(
            (tokens as u32, streams as u32, 1),
            threads_for(hidden).min(256),
            0,
        ),
        keys.arg(),
        queries.arg(),
        kv.arg_at(width),
        i(ld),
        gates.arg(),
        i(streams),
        i(hidden),
    )?;
    let normed = norm_rows(dev, gates.arg(), &w.norm_conv, tokens, streams, hidden, eps)?;
    let kernel = w.conv.len() / width;
    kernels::qwen4::PleConv::launch(
        dev,
        Launch::new((width.div_ceil(128) as u32, 1, 1), 128, 0),
        hs,
        gates.arg(),
        normed.arg(),
        conv_state.arg(),
        w.conv.arg(),
        i(tokens),
        i(width),
        i(kernel),
        i(w.dilation),
    )
}

/// Shifts the `tokens` ids at device address `ids` into the n-gram history (which keeps its
/// length, ngram_size − 1), on the device.
pub fn advance_history(dev: &Device, history: &DevBuf<i32>, ids: u64, tokens: usize) -> Result<()> {
    kernels::qwen4::PleAdvance::launch(
        dev,
        Launch::new((1, 1, 1), 32, 0),
        history.arg(),
        p(ids),
        i(tokens),
        i(history.len()),
    )
}
