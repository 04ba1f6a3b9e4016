//! The MoE block with a shared expert on the device (MODEL_MATH §1.6). Routing (softmax,
//! top-k, renormalisation) runs on the device; decode runs the whole block in three launches
//! (router rows, experts' gate/up with routing, experts' down into the residual); a batched
//! step of decoding sequences groups the experts with each row's decode arithmetic
//! (`grouped`); prefill sorts the (token, expert) pairs by expert and runs grouped
//! tensor-core GEMMs.

use spindle_model::ModelConfig;

use crate::device::{threads_for, DevBuf, Device};
use crate::error::Result;
use crate::gemm::{grouped_tile, tensor_gemm, tensor_gemm_ok, GemmActs, GemmRows, GROUP_TILE};
use crate::io::{row_groups, Io};
use crate::kernels::moe::{DecodeMoeDown, DecodeMoeGateUp};
use crate::kernels::moe::{MoeDown, MoeGateUp};
use crate::kernels::{self, i, p, Launch, Ptr, MATVEC_MAX_TOKENS, MOE_MAX_K};
use crate::linear::{decode_linear, linear, project};
use crate::matrix::{DevFormat, DevPart, DeviceLayout};
use crate::matvec::{ggml_only_decode, staged_bytes, DecodeIn, DecodeOut};
use crate::norm::norm_rows;
use crate::weights::GpuMoe;

mod grouped;
use grouped::moe_decode_grouped;
use grouped::{grouped_decode_max_rows, grouped_down_kernel, grouped_gate_up_kernel};

/// The MoE block for `[tokens, H]`: sigmoid-gated shared expert plus the weighted top-k
/// experts (input and output as `io`).
pub fn moe(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuMoe,
    io: Io,
    tokens: usize,
) -> Result<Option<DevBuf<f32>>> {
    if tokens <= MATVEC_MAX_TOKENS {
        if let Some(plan) = DecodePlan::new(dev, config, w, tokens) {
            return moe_decode(dev, config, w, io, tokens, &plan);
        }
    }
    // A batched step of decoding sequences: each chosen expert read once for all its rows,
    // every row's arithmetic that of the same row decoded alone.
    if tokens > MATVEC_MAX_TOKENS && tokens <= grouped_decode_max_rows() && dev.decode_step() {
        if let Some(plan) = DecodePlan::new(dev, config, w, 1) {
            if plan.groupable(dev, config) {
                return moe_decode_grouped(dev, config, w, io, tokens, &plan);
            }
        }
    }
    // A small batch inside a batched step, experts not grouped above (bf16, a shared expert
    // in another format, a step with prompt rows): the decode kernels per group of
    // MATVEC_MAX_TOKENS rows (the grouped GEMM pads every expert's tile to TENSOR_GEMM_TOKENS
    // rows). Every row of these comes out bit for bit as in a step of its own (the decode
    // kernels' arithmetic), so a sequence's logits do not depend on its neighbours. Larger
    // steps take the general path below: the tensor-core GEMMs, or in a step of decoding
    // sequences only (up to 128) the routed experts grouped by expert (`routed_small`), the
    // same sums in another order.
    let batch_rows = match dev.small_batch_rows() {
        0 => 0,
        rows => rows.max(MOE_MATVEC_ROWS),
    };
    // GGUF K-quant experts run through the decode kernels only: any number of rows (prefill
    // too) per group of MATVEC_MAX_TOKENS.
    let ggml = w.experts_gate_up.fmt.ggml() || w.experts_down.fmt.ggml();
    if (tokens <= batch_rows || ggml)
        && DecodePlan::new(dev, config, w, MATVEC_MAX_TOKENS).is_some()
    {
        let hidden = config.hidden_size;
        let y = match io {
            Io::Split(_) => Some(dev.scratch::<f32>(tokens * hidden)?),
            Io::Fused { .. } => None,
        };
        for (t0, n) in row_groups(tokens) {
            let plan = DecodePlan::new(dev, config, w, n)
                .expect("fewer rows fit where MATVEC_MAX_TOKENS rows do");
            match io {
                Io::Split(x) => {
                    let rows = x.view(t0 * hidden, n * hidden);
                    let part = moe_decode(dev, config, w, Io::Split(&rows), n, &plan)?
                        .expect("a split MoE block returns its output");
                    let y = y.as_ref().expect("allocated for split");
                    dev.copy_raw(part.ptr(), y.at(t0 * hidden), n * hidden * 4)?;
                }
                Io::Fused { h, norm, eps } => {
                    let rows = h.view(t0 * hidden, n * hidden);
                    let io = Io::Fused {
                        h: &rows,
                        norm,
                        eps,
                    };
                    moe_decode(dev, config, w, io, n, &plan)?;
                }
            }
        }
        return Ok(y);
    }
    let x = match io {
        Io::Split(x) => moe_general(dev, config, w, x, tokens)?,
        Io::Fused { h, norm, eps } => {
            let hidden = config.hidden_size;
            let x = norm_rows(dev, h.arg(), norm, tokens, 1, hidden, eps)?;
            moe_general(dev, config, w, &x, tokens)?
        }
    };
    io.give(dev, x)
}

/// How the decode kernels run one MoE block: the routed experts' formats (gate|up and down:
/// a GGUF file may store them in different types), and whether the shared expert rides along
/// in the same launches (same format) or runs on its own.
struct DecodePlan {
    fmt: DevFormat,
    down_fmt: DevFormat,
    /// The shared gate|up rows' block and first row in it, when it shares `fmt`.
    shared_gate_up: Option<(usize, usize)>,
    shared_down: bool,
    gate_up_shared_bytes: usize,
    down_shared_bytes: usize,
}

impl DecodePlan {
    fn new(dev: &Device, config: &ModelConfig, w: &GpuMoe, tokens: usize) -> Option<Self> {
        let cfg = config.moe.as_ref()?;
        let (hidden, k, inter, shared) = (
            config.hidden_size,
            cfg.top_k,
            cfg.expert_intermediate,
            cfg.shared_intermediate,
        );
        let (gu, down) = (&w.experts_gate_up, &w.experts_down);
        let (fmt, down_fmt) = (gu.fmt, down.fmt);
        let unit = |fmt: DevFormat| match fmt {
            DevFormat::Bf16 => 8,
            DevFormat::Q8 | DevFormat::Q4 => 32,
            DevFormat::Fp8 => 16,
            DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => 256,
        };
        // Formats mix only where a GGUF file mixes them (bf16 / Q8 / Q4 / FP8 experts share
        // one format, as the decode path always assumed).
        if (down_fmt != fmt && !(fmt.ggml() || down_fmt.ggml()))
            || hidden % unit(fmt) != 0
            || inter % unit(down_fmt) != 0
            || !gu.vec_ok()
            || !down.vec_ok()
            || k > MOE_MAX_K
        {
            return None;
        }
        let e_count = cfg.num_experts;
        let rows = e_count + 1..e_count + 1 + 2 * shared;
        let shared_gate_up = w
            .input
            .parts
            .iter()
            .enumerate()
            .find_map(|(n, (row0, part))| {
                (part.fmt == fmt
                    && part.vec_ok()
                    && rows.start >= *row0
                    && rows.end <= row0 + part.rows)
                    .then_some((n, rows.start - row0))
            });
        let shared_down = match w.shared_down.parts.as_slice() {
            [(0, part)] => part.fmt == down_fmt && part.vec_ok() && shared % unit(down_fmt) == 0,
            _ => false,
        };
        // The staged input, then each token's routing probabilities.
        let gate_up_shared_bytes =
            staged_bytes(fmt, tokens, hidden).next_multiple_of(16) + tokens * cfg.num_experts * 4;
        let routed = staged_bytes(down_fmt, tokens * k, inter).next_multiple_of(16);
        let down_shared_bytes = routed
            + if shared_down {
                staged_bytes(down_fmt, tokens, shared)
            } else {
                0
            };
        let fits = gate_up_shared_bytes <= dev.shared_limit(gate_up_kernel(fmt).name())
            && down_shared_bytes <= dev.shared_limit(down_kernel(down_fmt).name());
        fits.then_some(DecodePlan {
            fmt,
            down_fmt,
            shared_gate_up,
            shared_down,
            gate_up_shared_bytes,
            down_shared_bytes,
        })
    }
}

/// Inside a batched step (the device's small-batch limit set), MoE blocks of up to this many
/// rows (or up to that limit, if higher) that are not grouped run the decode kernels per
/// MATVEC_MAX_TOKENS rows.
const MOE_MATVEC_ROWS: usize = 32;

fn gate_up_kernel(fmt: DevFormat) -> DecodeMoeGateUp {
    match fmt {
        DevFormat::Bf16 => DecodeMoeGateUp::BF16,
        DevFormat::Q8 => DecodeMoeGateUp::Q8,
        DevFormat::Q4 => DecodeMoeGateUp::Q4,
        DevFormat::Fp8 => DecodeMoeGateUp::FP8,
        DevFormat::Q4K => DecodeMoeGateUp::Q4K,
        DevFormat::Q5K => DecodeMoeGateUp::Q5K,
        DevFormat::Q6K => DecodeMoeGateUp::Q6K,
    }
}

fn down_kernel(fmt: DevFormat) -> DecodeMoeDown {
    match fmt {
        DevFormat::Bf16 => DecodeMoeDown::BF16,
        DevFormat::Q8 => DecodeMoeDown::Q8,
        DevFormat::Q4 => DecodeMoeDown::Q4,
        DevFormat::Fp8 => DecodeMoeDown::FP8,
        DevFormat::Q4K => DecodeMoeDown::Q4K,
        DevFormat::Q5K => DecodeMoeDown::Q5K,
        DevFormat::Q6K => DecodeMoeDown::Q6K,
    }
}

/// The address of row `row` of `part` (codes, scales).
fn row_ptrs(part: &DevPart, row: usize) -> (u64, u64) {
    (
        part.codes.ptr() + (row * part.fmt.row_bytes(part.cols)) as u64,
        part.scales.ptr() + (row * part.fmt.row_scales(part.cols) * 2) as u64,
    )
}

/// Decode MoE in three launches: the router and shared-expert gate rows (the norm fused in,
/// the normed input kept), routing and every selected expert's SwiGLU (with the shared
/// expert's; each block routes for itself), and the weighted down projections added into
/// the output.
fn moe_decode(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuMoe,
    io: Io,
    tokens: usize,
    plan: &DecodePlan,
) -> Result<Option<DevBuf<f32>>> {
    let cfg = config.moe.as_ref().expect("checked by the plan");
    let hidden = config.hidden_size;
    let (e_count, k, inter, shared) = (
        cfg.num_experts,
        cfg.top_k,
        cfg.expert_intermediate,
        cfg.shared_intermediate,
    );
    // Router logits and the shared expert's gate logit: [tokens, E + 1].
    let ld = e_count + 1;
    let logits = dev.scratch::<f32>(tokens * ld)?;
    let (xn_buf, x) = match io {
        Io::Split(x) => (None, x.arg()),
        Io::Fused { .. } => {
            let xn = dev.scratch::<f32>(tokens * hidden)?;
            let ptr = xn.arg();
            (Some(xn), ptr)
        }
    };
    let input = io.input(hidden, if xn_buf.is_some() { x } else { Ptr::null() });
    let out = DecodeOut::Store {
        y: logits.arg(),
        ldy: ld,
    };
    decode_linear(dev, &w.input, 0..ld, input, tokens, out)?;

    let idx = dev.scratch::<i32>(tokens * k)?;
    let wt = dev.scratch::<f32>(tokens * k)?;
    let act = dev.scratch::<f32>(tokens * k * inter)?;
    let act_s = dev.scratch::<f32>(tokens * shared)?;
    let (gu, down) = (&w.experts_gate_up, &w.experts_down);
    let (sgu, sgs) = match plan.shared_gate_up {
        Some((n, first)) => row_ptrs(&w.input.parts[n].1, first),
        None => (0, 0),
    };
    let items = tokens * k * inter + if sgu != 0 { tokens * shared } else { 0 };
    let kernel = gate_up_kernel(plan.fmt);
    let grid = dev.resident_grid(
        kernel.name(),
        256,
        plan.gate_up_shared_bytes,
        items.div_ceil(8),
    )?;
    kernel.launch(
        dev,
        Launch::new((grid, 1, 1), 256, plan.gate_up_shared_bytes as u32),
        gu.codes.arg(),
        gu.scales.arg(),
        p(sgu),
        p(sgs),
        x,
        i(tokens),
        logits.arg(),
        i(ld),
        i(e_count),
        i(cfg.renormalize as usize),
        idx.arg(),
        wt.arg(),
        i(k),
        i(inter),
        i(shared),
        i(hidden),
        act.arg(),
        act_s.arg(),
    )?;
    if sgu == 0 {
        let rows = ld..ld + 2 * shared;
        let out = DecodeOut::SwiGlu {
            y: act_s.arg(),
            ldy: shared,
        };
        decode_linear(dev, &w.input, rows, DecodeIn::plain(x, hidden), tokens, out)?;
    }

    // The output: the residual itself (fused), or a fresh buffer the routed sum is stored in.
    let (y, owned, accumulate) = match io {
        Io::Fused { h, .. } => (h.arg(), None, true),
        Io::Split(_) => {
            let y = dev.scratch::<f32>(tokens * hidden)?;
            (y.arg(), Some(y), false)
        }
    };
    let (sdw, sds) = if plan.shared_down {
        row_ptrs(&w.shared_down.parts[0].1, 0)
    } else {
        (0, 0)
    };
    let kernel = down_kernel(plan.down_fmt);
    let grid = dev.resident_grid(
        kernel.name(),
        256,
        plan.down_shared_bytes,
        (tokens * hidden).div_ceil(8),
    )?;
    kernel.launch(
        dev,
        Launch::new((grid, 1, 1), 256, plan.down_shared_bytes as u32),
        down.codes.arg(),
        down.scales.arg(),
        p(sdw),
        p(sds),
        act.arg(),
        act_s.arg(),
        idx.arg(),
        wt.arg(),
        logits.arg_at(e_count),
        i(ld),
        i(tokens),
        i(k),
        i(inter),
        i(shared),
        i(hidden),
        y,
        i(hidden),
        i(accumulate as usize),
    )?;
    if sdw == 0 {
        let out = DecodeOut::Accumulate {
            y,
            ldy: hidden,
            gate: Some((logits.arg_at(e_count), ld)),
        };
        let input = DecodeIn::plain(act_s.arg(), shared);
        decode_linear(dev, &w.shared_down, 0..hidden, input, tokens, out)?;
    }
    Ok(owned)
}

/// The MoE block for `[tokens, H]` through the general kernels (prefill).
fn moe_general(
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
    let width = w.input.rows; // E + 1 + 2·I_s
    let big = project(dev, &w.input, x.arg(), hidden, tokens)?;

    let idx = dev.scratch::<i32>(tokens * k)?;
    let wt = dev.scratch::<f32>(tokens * k)?;
    kernels::moe::MoeRoute::launch(
        dev,
        Launch::new(
            (tokens as u32, 1, 1),
            threads_for(e_count.max(k)),
            (e_count * 4) as u32,
        ),
        big.arg(),
        i(width),
        i(e_count),
        i(k),
        i(cfg.renormalize as usize),
        idx.arg(),
        wt.arg(),
    )?;

    // Shared expert, scaled by sigmoid(shared_expert_gate(x)).
    let act_shared = dev.scratch::<f32>(tokens * shared)?;
    kernels::elementwise::Swiglu::launch(
        dev,
        Launch::elementwise(tokens * shared),
        big.arg(),
        i(width),
        i(e_count + 1),
        i(e_count + 1 + shared),
        act_shared.arg(),
        i(tokens),
        i(shared),
    )?;
    let y = dev.scratch::<f32>(tokens * hidden)?;
    linear(
        dev,
        &w.shared_down,
        act_shared.arg(),
        shared,
        y.arg(),
        hidden,
        tokens,
        false,
    )?;
    kernels::elementwise::ScaleBySigmoid::launch(
        dev,
        Launch::elementwise(tokens * hidden),
        y.arg(),
        big.arg_at(e_count),
        i(width),
        i(tokens),
        i(hidden),
    )?;

    let routes = Routes {
        idx: &idx,
        wt: &wt,
        tokens,
        k,
        experts: e_count,
    };
    debug_assert_eq!(
        (w.experts_gate_up.cols, w.experts_down.cols),
        (hidden, inter)
    );
    routed_experts(dev, &w.experts_gate_up, &w.experts_down, &routes, x, &y)?;
    Ok(y)
}

/// Adds the routed experts' weighted outputs for `x [tokens, H]` into `y`: through the
/// grouped tensor-core GEMMs for prefill when the shapes suit them, otherwise through the
/// per-pair kernels (every (token, expert) pair's SwiGLU, then the weighted down rows).
/// `gu` is `[E·2I, H]` (each expert's gate rows, then its up rows), `down` is `[E·H, I]`.
pub(crate) fn routed_experts(
    dev: &Device,
    gu: &DevPart,
    down: &DevPart,
    r: &Routes,
    x: &DevBuf<f32>,
    y: &DevBuf<f32>,
) -> Result<()> {
    let (tokens, k) = (r.tokens, r.k);
    let (hidden, inter) = (gu.cols, down.cols);
    if small_grouped_fits(dev, gu, down, tokens) {
        return routed_small(dev, gu, down, r, x, y);
    }
    if tokens > MATVEC_MAX_TOKENS
        && tensor_gemm_ok(dev, gu.fmt, hidden)
        && tensor_gemm_ok(dev, down.fmt, inter)
        && 3 * 4 * r.experts <= dev.shared_limit(kernels::moe::MoeGroupByExpert::NAME)
    {
        return routed_grouped(dev, gu, down, r, x, y);
    }
    let act = dev.scratch::<f32>(tokens * k * inter)?;
    let gate_up_kernel = match gu.fmt {
        DevFormat::Bf16 => MoeGateUp::BF16,
        DevFormat::Q8 => MoeGateUp::Q8,
        DevFormat::Q4 => MoeGateUp::Q4,
        DevFormat::Fp8 => MoeGateUp::FP8,
        fmt @ (DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K) => {
            return Err(ggml_only_decode(fmt))
        }
    };
    let down_kernel = match down.fmt {
        DevFormat::Bf16 => MoeDown::BF16,
        DevFormat::Q8 => MoeDown::Q8,
        DevFormat::Q4 => MoeDown::Q4,
        DevFormat::Fp8 => MoeDown::FP8,
        fmt @ (DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K) => {
            return Err(ggml_only_decode(fmt))
        }
    };
    gate_up_kernel.launch(
        dev,
        Launch::new((inter.div_ceil(8) as u32, (tokens * k) as u32, 1), 256, 0),
        gu.codes.arg(),
        gu.scales.arg(),
        x.arg(),
        i(hidden),
        r.idx.arg(),
        act.arg(),
        i(k),
        i(inter),
        i(hidden),
        i((gu.vec_ok() && x.ptr() % 16 == 0 && hidden % 4 == 0) as usize),
    )?;
    down_kernel.launch(
        dev,
        Launch::new((hidden.div_ceil(8) as u32, tokens as u32, 1), 256, 0),
        down.codes.arg(),
        down.scales.arg(),
        act.arg(),
        r.idx.arg(),
        r.wt.arg(),
        y.arg(),
        i(k),
        i(inter),
        i(hidden),
        i((down.vec_ok() && act.ptr() % 16 == 0 && inter % 4 == 0) as usize),
    )
}

/// The routing of `tokens` tokens: `idx`/`wt` `[tokens, k]` (expert ids and weights).
pub(crate) struct Routes<'a> {
    pub idx: &'a DevBuf<i32>,
    pub wt: &'a DevBuf<f32>,
    pub tokens: usize,
    pub k: usize,
    pub experts: usize,
}

/// The routed experts through the tensor-core GEMMs (prefill): the (token, expert) pairs
/// sorted by expert, each expert's gate|up rows over its own tokens, the SwiGLU folded into
/// the preparation of the down GEMM's input, each expert's down rows, then every token's
/// weighted sum added into `y`. Every expert's weights are read once per 64 of its tokens
/// instead of once per token.
fn routed_grouped(
    dev: &Device,
    gu: &DevPart,
    down: &DevPart,
    r: &Routes,
    x: &DevBuf<f32>,
    y: &DevBuf<f32>,
) -> Result<()> {
    let (hidden, inter) = (gu.cols, down.cols);
    let pairs = r.tokens * r.k;
    let tile = grouped_tile(dev, pairs, r.experts);
    let Grouped {
        order,
        tiles,
        max_tiles,
    } = group_by_expert(dev, r, tile)?;
    let grouped = |a_div, rows| GemmRows::Grouped {
        tiles: tiles.arg(),
        order: order.arg(),
        max_tiles,
        a_div,
        rows,
        tile,
    };
    let acts = GemmActs::prepare(dev, gu.fmt, x.arg(), hidden, None, r.tokens, hidden)?;
    let gate_up = dev.scratch::<f32>(pairs * 2 * inter)?;
    tensor_gemm(
        dev,
        gu,
        &acts,
        gate_up.arg(),
        2 * inter,
        false,
        grouped(r.k, 2 * inter),
    )?;
    let act = GemmActs::prepare(
        dev,
        down.fmt,
        gate_up.arg(),
        2 * inter,
        Some(inter),
        pairs,
        inter,
    )?;
    let out = dev.scratch::<f32>(pairs * hidden)?;
    tensor_gemm(
        dev,
        down,
        &act,
        out.arg(),
        hidden,
        false,
        grouped(1, hidden),
    )?;
    combine(dev, r, &out, y, hidden)
}

/// The most tokens whose routed experts run through [`routed_small`] (above: the grouped
/// tensor-core GEMMs, whose 64-row tiles pay off once experts see many tokens each).
/// `SPINDLE_CUDA_SMALL_GROUPED_TOKENS` overrides it (0: never, for A/B measurements).
fn small_grouped_max_tokens() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("SPINDLE_CUDA_SMALL_GROUPED_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(SMALL_GROUPED_MAX_TOKENS)
    })
}

/// See [`small_grouped_max_tokens`].
const SMALL_GROUPED_MAX_TOKENS: usize = 128;

/// Whether the routed experts of `tokens` rows take [`routed_small`]: in a batched step of
/// decoding sequences only (prefill chunks keep the GEMMs, so that a prompt's rows come out the
/// same whichever step carries them), Q8/Q4 experts.
fn small_grouped_fits(dev: &Device, gu: &DevPart, down: &DevPart, tokens: usize) -> bool {
    let int8 = |part: &DevPart| matches!(part.fmt, DevFormat::Q8 | DevFormat::Q4);
    dev.decode_step()
        && tokens > MATVEC_MAX_TOKENS
        && tokens <= small_grouped_max_tokens()
        && int8(gu)
        && int8(down)
        && gu.cols % 32 == 0
        && down.cols % 32 == 0
        && 3 * 4 * (down.rows / gu.cols.max(1))
            <= dev.shared_limit(kernels::moe::MoeGroupByExpert::NAME)
}

/// The routed experts of a batched decode step (9-128 tokens, Q8/Q4): the (token, expert)
/// pairs sorted by expert, then per tile of one expert's pairs its gate|up rows (SwiGLU) and
/// its down rows, each weight chunk loaded once and dotted with every pair of the tile, on
/// int8 activations quantized as the CPU does; `moe_combine` adds each token's weighted sum.
/// Unlike the tensor-core GEMM, no tile is padded to 64 rows for the one or two tokens that
/// chose an expert.
fn routed_small(
    dev: &Device,
    gu: &DevPart,
    down: &DevPart,
    r: &Routes,
    x: &DevBuf<f32>,
    y: &DevBuf<f32>,
) -> Result<()> {
    let (hidden, inter) = (gu.cols, down.cols);
    let pairs = r.tokens * r.k;
    let Grouped {
        order,
        tiles,
        max_tiles,
    } = group_by_expert(dev, r, GROUP_TILE)?;
    let acts = GemmActs::prepare(dev, gu.fmt, x.arg(), hidden, None, r.tokens, hidden)?;
    let (xq, xd) = acts.int8_rows().expect("Q8/Q4 activations are int8");
    let act = dev.scratch::<f32>(pairs * inter)?;
    let gate_up = grouped_gate_up_kernel(gu.fmt);
    // 8 warps of GS_ROWS (2) rows per block.
    gate_up.launch(
        dev,
        Launch::new((inter.div_ceil(16) as u32, max_tiles as u32, 1), 256, 0),
        gu.codes.arg(),
        gu.scales.arg(),
        xq,
        xd,
        tiles.arg(),
        order.arg(),
        i(r.k),
        i(inter),
        i(hidden),
        act.arg(),
        i(0),
    )?;
    let acts = GemmActs::prepare(dev, down.fmt, act.arg(), inter, None, pairs, inter)?;
    let (aq, ad) = acts.int8_rows().expect("Q8/Q4 activations are int8");
    let out = dev.scratch::<f32>(pairs * hidden)?;
    let down_kernel = grouped_down_kernel(down.fmt);
    // 8 warps of GD_ROWS (8) rows per block.
    down_kernel.launch(
        dev,
        Launch::new((hidden.div_ceil(64) as u32, max_tiles as u32, 1), 256, 0),
        down.codes.arg(),
        down.scales.arg(),
        aq,
        ad,
        tiles.arg(),
        order.arg(),
        i(inter),
        i(hidden),
        out.arg(),
        i(0),
    )?;
    combine(dev, r, &out, y, hidden)
}

/// The (token, expert) pairs of `r` sorted by expert: `order` (pair ids), and `tiles`
/// (expert, first, count) per tile of at most `tile` pairs, `max_tiles` of them.
struct Grouped {
    order: DevBuf<i32>,
    tiles: DevBuf<i32>,
    max_tiles: usize,
}

fn group_by_expert(dev: &Device, r: &Routes, tile: usize) -> Result<Grouped> {
    let pairs = r.tokens * r.k;
    let max_tiles = pairs.div_ceil(tile) + r.experts.min(pairs);
    let order = dev.scratch::<i32>(pairs)?;
    let tiles = dev.scratch::<i32>(3 * max_tiles)?;
    kernels::moe::MoeGroupByExpert::launch(
        dev,
        Launch::new((1, 1, 1), 1024, (3 * 4 * r.experts) as u32),
        r.idx.arg(),
        i(pairs),
        i(r.experts),
        order.arg(),
        tiles.arg(),
        i(max_tiles),
        i(tile),
    )?;
    Ok(Grouped {
        order,
        tiles,
        max_tiles,
    })
}

/// `y[t] += Σ_j wt[t·k + j] · out[t·k + j]` over the pairs' rows `out [pairs, hidden]`.
fn combine(
    dev: &Device,
    r: &Routes,
    out: &DevBuf<f32>,
    y: &DevBuf<f32>,
    hidden: usize,
) -> Result<()> {
    kernels::moe::MoeCombine::launch(
        dev,
        Launch::elementwise(r.tokens * hidden),
        out.arg(),
        r.wt.arg(),
        y.arg(),
        i(r.tokens),
        i(r.k),
        i(hidden),
    )
}
