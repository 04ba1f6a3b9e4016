//! Kernel-level entry points for the GPU tests (`tests/kernels.rs`, `tests/ops.rs`): each
//! runs one device path on host data and returns the result to the host. Not a stable
//! interface.

use spindle_model::weights::Linear;

use spindle_model::ModelConfig;

use crate::attention::{attend_serial, attend_split, attend_tiled, Heads};
use crate::device::Device;
use crate::error::Result;
use crate::io::Io;
use crate::kernels::{Ptr, ATTN_SPLIT_KEYS, MATVEC_MAX_TOKENS};
use crate::linear::{decode_linear, project};
use crate::matrix::DevMatrix;
use crate::matvec::{DecodeIn, DecodeOut};
use crate::moe::{routed_experts, Routes};
use crate::session::ARGMAX_BLOCKS;
use crate::weights::GpuMoe;

/// `x [tokens, cols] · Wᵀ` through the device's linear layer (the decode matvecs for at most
/// 8 tokens, the tensor-core or SIMT GEMM above, as [`Device::tensor_cores`] says).
pub fn linear(dev: &Device, w: &Linear, x: &[f32], tokens: usize) -> Result<Vec<f32>> {
    let m = DevMatrix::upload(dev, w)?;
    let x = dev.upload(x)?;
    let y = project(dev, &m, x.arg(), w.cols(), tokens)?;
    dev.download(&y, 0, tokens * w.rows())
}

/// Whether a dense tensor-core GEMM of `tokens` rows runs on the skinny tiles.
pub fn skinny_dense_applies(dev: &Device, tokens: usize) -> bool {
    crate::gemm::skinny_dense(dev, tokens)
}

/// Whether routed experts of `pairs` pairs over `experts` experts are grouped in skinny tiles.
pub fn skinny_grouped_applies(dev: &Device, pairs: usize, experts: usize) -> bool {
    crate::gemm::grouped_tile(dev, pairs, experts) == crate::gemm::SKINNY_TILE
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
    heads: (usize, usize, usize),
    tokens: usize,
    start: usize,
    tiled: bool,
) -> Result<Option<Vec<f32>>> {
    let path = if tiled {
        AttentionPath::Tiled
    } else {
        AttentionPath::Serial
    };
    attention_paged_of(dev, q, gate, keys, values, heads, tokens, start, path, None)
}

/// Which attention kernels [`attention_paged_of`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// `attention_prefill_tiled`.
    Tiled,
    /// `attention_serial`.
    Serial,
    /// Flash-decoding (`attention_decode_split` + combine) per group of at most 8 rows, over a
    /// grid covering `capacity` positions.
    Split { capacity: usize },
}

/// As [`attention_of`], through `path`, with the keys and values laid out as a paged cache when
/// `blocks` is given: position p at row `blocks[p / 16]·16 + p % 16` of a pool of
/// `max(blocks) + 1` blocks (the rows of other blocks hold garbage); contiguous otherwise.
/// None when the shape does not suit the kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention_paged_of(
    dev: &Device,
    q: &[f32],
    gate: &[f32],
    keys: &[f32],
    values: &[f32],
    (n_h, n_kv, d): (usize, usize, usize),
    tokens: usize,
    start: usize,
    path: AttentionPath,
    blocks: Option<&[i32]>,
) -> Result<Option<Vec<f32>>> {
    use spindle_model::paged::BLOCK_TOKENS;
    let heads = Heads { n_h, n_kv, d };
    let row = n_kv * d;
    let visible = start + tokens;
    let place = |rows: &[f32], pool_rows: usize| -> Vec<f32> {
        match blocks {
            None => {
                let mut out = rows.to_vec();
                out.resize(pool_rows * row, 0.0);
                out
            }
            Some(b) => {
                let mut out: Vec<f32> =
                    (0..pool_rows * row).map(|i| (i % 7) as f32 - 1e3).collect();
                for p in 0..visible {
                    let at = b[p / BLOCK_TOKENS] as usize * BLOCK_TOKENS + p % BLOCK_TOKENS;
                    out[at * row..(at + 1) * row].copy_from_slice(&rows[p * row..(p + 1) * row]);
                }
                out
            }
        }
    };
    let pool_rows = match (blocks, path) {
        (Some(b), _) => {
            assert!(
                b.len() * BLOCK_TOKENS >= visible,
                "the table covers every position"
            );
            (*b.iter().max().expect("a block") as usize + 1) * BLOCK_TOKENS
        }
        (None, AttentionPath::Split { capacity }) => capacity.max(visible),
        (None, _) => visible,
    };
    let (q, gate) = (dev.upload(q)?, dev.upload(gate)?);
    let (k_pool, v_pool) = (
        dev.upload(&place(keys, pool_rows))?,
        dev.upload(&place(values, pool_rows))?,
    );
    let table = blocks.map(|b| dev.upload(b)).transpose()?;
    let table_arg = table.as_ref().map_or(Ptr::null(), |t| t.arg());
    let kv = (k_pool.arg(), v_pool.arg(), table_arg);
    let out = dev.zeros::<f32>(tokens * n_h * d)?;
    match path {
        AttentionPath::Tiled => {
            if !attend_tiled(
                dev,
                heads,
                q.arg(),
                gate.arg(),
                kv,
                out.arg(),
                tokens,
                start,
            )? {
                return Ok(None);
            }
        }
        AttentionPath::Serial => attend_serial(
            dev,
            heads,
            q.arg(),
            gate.arg(),
            kv,
            None,
            out.arg(),
            tokens,
            start,
            Ptr::null(),
        )?,
        AttentionPath::Split { capacity } => {
            assert!(visible <= capacity, "the grid covers every position");
            let partials = dev.zeros::<f32>(
                MATVEC_MAX_TOKENS * n_h * capacity.div_ceil(ATTN_SPLIT_KEYS) * (d + 2),
            )?;
            let rows = n_h * d;
            for (t0, n) in crate::io::row_groups(tokens) {
                let ran = attend_split(
                    dev,
                    heads,
                    (
                        q.arg().at(t0 * rows),
                        gate.arg().at(t0 * rows),
                        out.arg().at(t0 * rows),
                    ),
                    (kv.0, kv.1, kv.2, partials.arg()),
                    capacity,
                    n,
                    start + t0,
                    Ptr::null(),
                )?;
                if !ran {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(dev.download(&out, 0, tokens * n_h * d)?))
}

/// What a decode matvec does with its outputs (see [`decode_linear_of`]).
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// `y = x·Wᵀ`, `[tokens, rows]`.
    Store,
    /// Rows `[gate (n) | up (n)]`: `y[t, j] = silu(gate_j·x_t)·(up_j·x_t)`, `[tokens, n]`.
    SwiGlu,
    /// `y = init + sigmoid(gate[t])·(x·Wᵀ)` (no sigmoid factor without `gate`), `[tokens, rows]`.
    Accumulate {
        init: &'a [f32],
        gate: Option<&'a [f32]>,
    },
}

/// `x [tokens, cols]` through the decode linear path (at most 8 tokens: the decode matvecs,
/// or the general kernels for shapes they do not take), RMS-normed first with the zero-centred
/// weight `norm` when given, with the outputs as `epilogue` says.
pub fn decode_linear_of(
    dev: &Device,
    w: &Linear,
    x: &[f32],
    tokens: usize,
    norm: Option<(&[f32], f32)>,
    epilogue: Epilogue,
) -> Result<Vec<f32>> {
    let m = DevMatrix::upload(dev, w)?;
    let rows = w.rows();
    let xb = dev.upload(x)?;
    let norm_w = norm.map(|(nw, _)| dev.upload(nw)).transpose()?;
    let input = DecodeIn {
        x: xb.arg(),
        ldx: w.cols(),
        norm: norm_w.as_ref().zip(norm.map(|(_, eps)| eps)),
        normed_out: Ptr::null(),
    };
    let (y, width, gate) = match epilogue {
        Epilogue::Store => (dev.zeros::<f32>(tokens * rows)?, rows, None),
        Epilogue::SwiGlu => (dev.zeros::<f32>(tokens * rows / 2)?, rows / 2, None),
        Epilogue::Accumulate { init, gate } => (
            dev.upload(init)?,
            rows,
            gate.map(|g| dev.upload(g)).transpose()?,
        ),
    };
    let out = match epilogue {
        Epilogue::Store => DecodeOut::Store {
            y: y.arg(),
            ldy: width,
        },
        Epilogue::SwiGlu => DecodeOut::SwiGlu {
            y: y.arg(),
            ldy: width,
        },
        Epilogue::Accumulate { .. } => DecodeOut::Accumulate {
            y: y.arg(),
            ldy: width,
            gate: gate.as_ref().map(|g| (g.arg(), 1)),
        },
    };
    decode_linear(dev, &m, 0..rows, input, tokens, out)?;
    dev.download(&y, 0, tokens * width)
}

/// Whether [`decode_linear_of`] takes the tensor-core decode matvec (`matvec_tc.cu`) for a
/// `[_, cols]` matrix in `format` and `tokens` rows (with [`Device::tc_decode_rows`] as it is
/// now).
pub fn tc_decode_applies(
    dev: &Device,
    format: spindle_model::quant::WeightFormat,
    cols: usize,
    tokens: usize,
) -> bool {
    crate::matvec::tc_decode_kernel(dev, format.into(), cols, tokens).is_some()
}

/// The MoE block of `config` (its `moe` sizes and `hidden_size`) for `x [tokens, hidden]`:
/// `input` is `[router (E) | shared expert gate (1) | shared gate (I_s) | shared up (I_s)]`
/// rows, `shared_down` `[hidden, I_s]`, `gate_up` `[E·2I, hidden]` (each expert's gate rows,
/// then its up rows), `down` `[E·hidden, I]`. At most 8 tokens run the decode kernels (when
/// the shapes suit them), more the general path (route, then grouped or per-pair experts).
#[allow(clippy::too_many_arguments)]
pub fn moe_block_of(
    dev: &Device,
    config: &ModelConfig,
    input: &Linear,
    shared_down: &Linear,
    gate_up: &Linear,
    down: &Linear,
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>> {
    let single = |m: DevMatrix| {
        m.parts
            .into_iter()
            .next()
            .map(|(_, part)| part)
            .expect("one block")
    };
    let w = GpuMoe {
        input: DevMatrix::upload(dev, input)?,
        shared_down: DevMatrix::upload(dev, shared_down)?,
        experts_gate_up: single(DevMatrix::upload(dev, gate_up)?),
        experts_down: single(DevMatrix::upload(dev, down)?),
    };
    let xb = dev.upload(x)?;
    let y = crate::moe::moe(dev, config, &w, Io::Split(&xb), tokens)?
        .expect("a split sublayer returns its output");
    dev.download(&y, 0, tokens * config.hidden_size)
}

/// Flash-decoding attention (split + combine) of `tokens` ≤ 8 tokens at positions `start..`
/// over `keys`/`values` (`[start + tokens, n_kv·d]`) in a cache of `capacity` positions; None
/// when the shape does not suit the kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention_split_of(
    dev: &Device,
    q: &[f32],
    gate: &[f32],
    keys: &[f32],
    values: &[f32],
    (n_h, n_kv, d): (usize, usize, usize),
    tokens: usize,
    start: usize,
    capacity: usize,
) -> Result<Option<Vec<f32>>> {
    assert!(start + tokens <= capacity, "the cache holds every position");
    let heads = Heads { n_h, n_kv, d };
    let (q, gate) = (dev.upload(q)?, dev.upload(gate)?);
    let mut k_cache = dev.zeros::<f32>(capacity * n_kv * d)?;
    let mut v_cache = dev.zeros::<f32>(capacity * n_kv * d)?;
    dev.write(&mut k_cache, 0, keys)?;
    dev.write(&mut v_cache, 0, values)?;
    let partials = dev.zeros::<f32>(tokens * n_h * capacity.div_ceil(ATTN_SPLIT_KEYS) * (d + 2))?;
    let out = dev.zeros::<f32>(tokens * n_h * d)?;
    let ran = attend_split(
        dev,
        heads,
        (q.arg(), gate.arg(), out.arg()),
        (k_cache.arg(), v_cache.arg(), Ptr::null(), partials.arg()),
        capacity,
        tokens,
        start,
        Ptr::null(),
    )?;
    if !ran {
        return Ok(None);
    }
    Ok(Some(dev.download(&out, 0, tokens * n_h * d)?))
}

/// Zero-centred RMSNorm of each group of `group` values of `x [tokens, groups·group]` with
/// the weight `w [group]`.
pub fn group_norm_of(
    dev: &Device,
    x: &[f32],
    w: &[f32],
    tokens: usize,
    groups: usize,
    group: usize,
    eps: f32,
) -> Result<Vec<f32>> {
    let (xb, wb) = (dev.upload(x)?, dev.upload(w)?);
    let y = crate::norm::norm_rows(dev, xb.arg(), &wb, tokens, groups, group, eps)?;
    dev.download(&y, 0, tokens * groups * group)
}

/// The index of the largest value (the first on ties) through the device argmax.
pub fn argmax_of(dev: &Device, values: &[f32]) -> Result<usize> {
    let x = dev.upload(values)?;
    let parts = dev.zeros::<u32>(2 * ARGMAX_BLOCKS + 1)?;
    let out = dev.zeros::<i32>(1)?;
    crate::reduce::argmax(dev, x.ptr(), values.len(), &parts, out.ptr())?;
    Ok(dev.download(&out, 0, 1)?[0] as usize)
}

/// A GGUF matrix in blocks uploaded in its device layout ([`crate::matrix::ggml_source`]):
/// its format's name, and for the K-quants every weight as the device reads it (f32
/// `[rows, cols]`, through the `ggml_dequantize_*` kernels); Q8_0 / Q4_0 become the Q8 / Q4
/// formats, whose values are not read back here (`None`).
pub fn ggml_upload_values(
    dev: &Device,
    w: &spindle_model::weights::BlockMatrix,
) -> Result<(&'static str, Option<Vec<f32>>)> {
    use crate::kernels::ggml::GgmlDequantize;
    use crate::kernels::{i, Launch};
    use crate::matrix::DevFormat;
    let m = DevMatrix::upload(dev, &Linear::Blocks(w.clone()))?;
    let [(0, part)] = m.parts.as_slice() else {
        unreachable!("one matrix uploads as one block");
    };
    let kernel = match part.fmt {
        DevFormat::Q4K => GgmlDequantize::Q4K,
        DevFormat::Q5K => GgmlDequantize::Q5K,
        DevFormat::Q6K => GgmlDequantize::Q6K,
        other => return Ok((other.name(), None)),
    };
    let out = dev.zeros::<f32>(w.rows * w.cols)?;
    kernel.launch(
        dev,
        Launch::elementwise(w.rows * w.cols),
        part.codes.arg(),
        part.scales.arg(),
        i(w.rows),
        i(w.cols),
        out.arg(),
    )?;
    Ok((
        part.fmt.name(),
        Some(dev.download(&out, 0, w.rows * w.cols)?),
    ))
}
