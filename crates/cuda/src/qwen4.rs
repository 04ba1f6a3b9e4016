//! qwen4_exp on the device (MODEL_MATH §4): hyper-connections (§4.3) and PLE (§4.5). The PLE
//! n-gram table stays in host memory: the host hashes each token's n-grams, gathers the rows
//! and copies them over.

use spindle_engine::qwen4::ngram;
use spindle_engine::qwen4::PleWeights;

use crate::device::{f, i, p, threads_for, DevBuf, Device};
use crate::error::Result;
use crate::linear::project;
use crate::weights::{GpuHyper, GpuPle};

/// A hyper-connection block's sublayer input `x [T, H]` and the raw projection `[T, ld]`
/// whose columns `lowrank..` hold the injection logits (ω = 2·sigmoid(·/n) in `inject`).
pub struct HyperInput {
    pub x: DevBuf<f32>,
    pub mix: DevBuf<f32>,
}

/// Zero-centred RMSNorm of `groups` groups of `group` values in each of `tokens` rows
/// (row t of x at `t·ldx`, of y at `t·ldy`).
pub(crate) fn group_norm(
    dev: &Device,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    w: &DevBuf<f32>,
    tokens: usize,
    groups: usize,
    group: usize,
    eps: f32,
) -> Result<()> {
    dev.launch(
        "rms_norm_zc",
        (tokens as u32, groups as u32, 1),
        threads_for(group).min(256),
        0,
        &[p(x), i(ldx), p(y), i(ldy), p(w.ptr()), i(group), f(eps)],
    )
}

/// Zero-centred RMSNorm of `tokens` rows of `[groups · group]` (MODEL_MATH §1.1).
pub fn norm_rows(
    dev: &Device,
    x: u64,
    w: &DevBuf<f32>,
    tokens: usize,
    groups: usize,
    group: usize,
    eps: f32,
) -> Result<DevBuf<f32>> {
    let width = groups * group;
    let y = dev.scratch::<f32>(tokens * width)?;
    group_norm(dev, x, width, y.ptr(), width, w, tokens, groups, group, eps)?;
    Ok(y)
}

/// Reads the streams `hs [T, n·H]` into one sublayer input (MODEL_MATH §4.3).
pub fn enter(
    dev: &Device,
    w: &GpuHyper,
    hs: u64,
    tokens: usize,
    streams: usize,
    hidden: usize,
    eps: f32,
) -> Result<HyperInput> {
    let width = streams * hidden;
    let normed = norm_rows(dev, hs, &w.norm, tokens, streams, hidden, eps)?;
    let ld = w.down_inject.rows;
    let mix = project(dev, &w.down_inject, normed.ptr(), width, tokens)?;
    let m = dev.scratch::<f32>(tokens * w.lowrank)?;
    dev.launch_elementwise(
        "silu_scaled",
        tokens * w.lowrank,
        &[
            p(mix.ptr()),
            i(ld),
            f(1.0 / streams as f32),
            p(m.ptr()),
            i(tokens),
            i(w.lowrank),
        ],
    )?;
    let a = project(dev, &w.up, m.ptr(), w.lowrank, tokens)?;
    let x = dev.scratch::<f32>(tokens * hidden)?;
    dev.launch_elementwise(
        "hc_mix",
        tokens * hidden,
        &[
            p(a.ptr()),
            p(normed.ptr()),
            p(x.ptr()),
            i(tokens),
            i(streams),
            i(hidden),
        ],
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
    dev.launch_elementwise(
        "hc_inject",
        tokens * streams * hidden,
        &[
            p(hs.ptr()),
            p(y.ptr()),
            p(mix.at(w.lowrank)),
            i(w.down_inject.rows),
            i(tokens),
            i(streams),
            i(hidden),
        ],
    )
}

/// Computes PLE for `ids` and adds it to the streams `hs [T, n·H]` (MODEL_MATH §4.5).
/// `history` is the n-gram history before these ids; `conv_state` is updated.
pub fn add(
    dev: &Device,
    cpu: &PleWeights,
    w: &GpuPle,
    hs: &DevBuf<f32>,
    ids: &[u32],
    history: &[u32],
    conv_state: &DevBuf<f32>,
    streams: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    let tokens = ids.len();
    let width = streams * hidden;
    let ple_dim = w.kv_proj.cols;
    let heads = cpu.hash.vocab_sizes.len();
    let head_dim = ple_dim / heads;

    // Eng: one table row per hash head, gathered on the host.
    let rows = cpu.hash.rows(history, ids);
    let mut eng = vec![0.0f32; tokens * ple_dim];
    let table = &cpu.table;
    for (chunk, &row) in eng.chunks_mut(head_dim).zip(&rows) {
        let (shard, local) = (
            row as usize / table.shard_rows,
            row as usize % table.shard_rows,
        );
        table.shards[shard].mat().row_to_f32(local, chunk);
    }
    let eng = dev.upload(&eng)?;

    let kv = project(dev, &w.kv_proj, eng.ptr(), ple_dim, tokens)?; // [T, n·H + H]
    let ld = w.kv_proj.rows;
    let keys = dev.scratch::<f32>(tokens * width)?;
    group_norm(
        dev,
        kv.ptr(),
        ld,
        keys.ptr(),
        width,
        &w.norm_key,
        tokens,
        streams,
        hidden,
        eps,
    )?;
    let queries = norm_rows(dev, hs.ptr(), &w.norm_query, tokens, streams, hidden, eps)?;
    let gates = dev.scratch::<f32>(tokens * width)?;
    dev.launch(
        "ple_gates",
        (tokens as u32, streams as u32, 1),
        threads_for(hidden).min(256),
        0,
        &[
            p(keys.ptr()),
            p(queries.ptr()),
            p(kv.at(width)),
            i(ld),
            p(gates.ptr()),
            i(streams),
            i(hidden),
        ],
    )?;
    let normed = norm_rows(dev, gates.ptr(), &w.norm_conv, tokens, streams, hidden, eps)?;
    let kernel = w.conv.len() / width;
    dev.launch(
        "ple_conv",
        (width.div_ceil(128) as u32, 1, 1),
        128,
        0,
        &[
            p(hs.ptr()),
            p(gates.ptr()),
            p(normed.ptr()),
            p(conv_state.ptr()),
            p(w.conv.ptr()),
            i(tokens),
            i(width),
            i(kernel),
            i(cpu.dilation()),
        ],
    )
}

/// Appends `ids` to the n-gram history.
pub fn advance_history(history: &mut [u32], ids: &[u32]) {
    ngram::advance_history(history, ids);
}
