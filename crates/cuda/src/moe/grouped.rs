//! The MoE block of a batched step of decoding sequences with the experts grouped: each
//! chosen expert's weights read once per step, every row's arithmetic that of the same row
//! decoded alone (`moe_decode`), so a sequence's logits do not depend on its neighbours.

use spindle_model::ModelConfig;

use super::{group_by_expert, row_ptrs, DecodePlan, Grouped, Routes};
use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::gemm::{GemmActs, GROUP_TILE};
use crate::io::Io;
use crate::kernels::moe::{MoeGroupedDown, MoeGroupedGateUp};
use crate::kernels::{self, i, p, Launch, Ptr, MATVEC_MAX_TOKENS};
use crate::linear::decode_linear;
use crate::matrix::DevFormat;
use crate::matvec::{DecodeIn, DecodeOut};
use crate::weights::GpuMoe;

impl DecodePlan {
    /// Whether [`moe_decode_grouped`] runs this block: Q8/Q4, the shared expert in the decode
    /// launches (as a row alone computes it), shapes in whole groups of 32, and the routing and
    /// sorting kernels' shared memory within bounds.
    pub(super) fn groupable(&self, dev: &Device, config: &ModelConfig) -> bool {
        let Some(cfg) = config.moe.as_ref() else {
            return false;
        };
        let experts = cfg.num_experts;
        matches!(self.fmt, DevFormat::Q8 | DevFormat::Q4)
            && self.down_fmt == self.fmt
            && self.shared_gate_up.is_some()
            && self.shared_down
            && cfg.shared_intermediate > 0
            && 3 * 4 * experts <= dev.shared_limit(kernels::moe::MoeGroupByExpert::NAME)
            && ROUTE_WARPS * 4 * experts <= dev.shared_limit(kernels::moe::MoeRouteWarps::NAME)
    }
}

/// Tokens (warps) per `moe_route_warps` block.
const ROUTE_WARPS: usize = 8;

/// The most rows of a batched decode step whose MoE blocks run through
/// [`moe_decode_grouped`]; `SPINDLE_CUDA_GROUPED_DECODE_ROWS` overrides it (0: never, for A/B
/// measurements: steps of up to MOE_MATVEC_ROWS rows then run the decode kernels per
/// MATVEC_MAX_TOKENS rows, larger ones `moe_general`).
pub(super) fn grouped_decode_max_rows() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("SPINDLE_CUDA_GROUPED_DECODE_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(GROUPED_DECODE_MAX_ROWS)
    })
}

/// See [`grouped_decode_max_rows`]: the largest decode-graph bucket.
const GROUPED_DECODE_MAX_ROWS: usize = 128;

pub(super) fn grouped_gate_up_kernel(fmt: DevFormat) -> MoeGroupedGateUp {
    match fmt {
        DevFormat::Q8 => MoeGroupedGateUp::Q8,
        _ => MoeGroupedGateUp::Q4,
    }
}

pub(super) fn grouped_down_kernel(fmt: DevFormat) -> MoeGroupedDown {
    match fmt {
        DevFormat::Q8 => MoeGroupedDown::Q8,
        _ => MoeGroupedDown::Q4,
    }
}

/// The MoE block of a batched step of decoding sequences (9-128 rows, Q8/Q4), each row's
/// arithmetic that of the same row decoded alone ([`super::moe_decode`]) while every chosen expert's
/// weights, and the shared expert's, are read once per step instead of once per
/// MATVEC_MAX_TOKENS rows: the router rows through the decode matvecs per group of
/// MATVEC_MAX_TOKENS rows (norm fused, normed rows kept), routing a warp per token
/// (`route_warp`, as in `decode_moe_gate_up`), the input quantized as the decode kernels stage
/// it, the grouped gate|up and down kernels over the (token, expert) pairs sorted by expert
/// (the shared expert as one more matrix over all rows, same lanes per row as the decode
/// kernels), then `moe_combine_slots` sums each token's slots in `decode_moe_down`'s order.
pub(super) fn moe_decode_grouped(
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
    let pairs = tokens * k;
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
    let input = DecodeIn {
        normed_out: if xn_buf.is_some() { x } else { Ptr::null() },
        ..io.input_rows(hidden, 0)
    };
    let out = DecodeOut::Store {
        y: logits.arg(),
        ldy: ld,
    };
    decode_linear(dev, &w.input, 0..ld, input, tokens, out)?;

    let idx = dev.scratch::<i32>(pairs)?;
    let wt = dev.scratch::<f32>(pairs)?;
    kernels::moe::MoeRouteWarps::launch(
        dev,
        Launch::new(
            (tokens.div_ceil(ROUTE_WARPS) as u32, 1, 1),
            (32 * ROUTE_WARPS) as u32,
            (ROUTE_WARPS * e_count * 4) as u32,
        ),
        logits.arg(),
        i(ld),
        i(e_count),
        i(k),
        i(cfg.renormalize as usize),
        i(tokens),
        idx.arg(),
        wt.arg(),
    )?;
    let routes = Routes {
        idx: &idx,
        wt: &wt,
        tokens,
        k,
        experts: e_count,
    };
    let Grouped {
        order,
        tiles,
        max_tiles,
    } = group_by_expert(dev, &routes, GROUP_TILE)?;
    let (gu, down) = (&w.experts_gate_up, &w.experts_down);
    let (part, first) = plan.shared_gate_up.expect("checked by groupable");
    let (sgu, sgs) = row_ptrs(&w.input.parts[part].1, first);
    let (sdw, sds) = row_ptrs(&w.shared_down.parts[0].1, 0);
    // The shared expert in tiles of MATVEC_MAX_TOKENS rows (`grouped_tile`).
    let dense_tiles = tokens.div_ceil(MATVEC_MAX_TOKENS) as u32;

    // SwiGLU of every pair (8 warps of GS_ROWS = 2 rows per block) and of the shared expert.
    let acts = GemmActs::prepare(dev, plan.fmt, x, hidden, None, tokens, hidden)?;
    let (xq, xd) = acts.int8_rows().expect("Q8/Q4 activations are int8");
    let act = dev.scratch::<f32>(pairs * inter)?;
    let act_s = dev.scratch::<f32>(tokens * shared)?;
    let gate_up = grouped_gate_up_kernel(plan.fmt);
    gate_up.launch(
        dev,
        Launch::new((inter.div_ceil(16) as u32, max_tiles as u32, 1), 256, 0),
        gu.codes.arg(),
        gu.scales.arg(),
        xq,
        xd,
        tiles.arg(),
        order.arg(),
        i(k),
        i(inter),
        i(hidden),
        act.arg(),
        i(0),
    )?;
    gate_up.launch(
        dev,
        Launch::new((shared.div_ceil(16) as u32, dense_tiles, 1), 256, 0),
        p(sgu),
        p(sgs),
        xq,
        xd,
        Ptr::null(),
        Ptr::null(),
        i(1),
        i(shared),
        i(hidden),
        act_s.arg(),
        i(tokens),
    )?;

    // Each pair's and the shared expert's down rows, unweighted (8 warps of GD_ROWS = 8 rows
    // per block), then the weighted sums.
    let down_kernel = grouped_down_kernel(plan.fmt);
    let acts = GemmActs::prepare(dev, plan.fmt, act.arg(), inter, None, pairs, inter)?;
    let (aq, ad) = acts.int8_rows().expect("Q8/Q4 activations are int8");
    let out = dev.scratch::<f32>(pairs * hidden)?;
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
    let acts_s = GemmActs::prepare(dev, plan.fmt, act_s.arg(), shared, None, tokens, shared)?;
    let (sq, sd) = acts_s.int8_rows().expect("Q8/Q4 activations are int8");
    let out_s = dev.scratch::<f32>(tokens * hidden)?;
    down_kernel.launch(
        dev,
        Launch::new((hidden.div_ceil(64) as u32, dense_tiles, 1), 256, 0),
        p(sdw),
        p(sds),
        sq,
        sd,
        Ptr::null(),
        Ptr::null(),
        i(shared),
        i(hidden),
        out_s.arg(),
        i(tokens),
    )?;
    let (y, owned, accumulate) = match io {
        Io::Fused { h, .. } => (h.arg(), None, true),
        Io::Split(_) => {
            let y = dev.scratch::<f32>(tokens * hidden)?;
            (y.arg(), Some(y), false)
        }
    };
    kernels::moe::MoeCombineSlots::launch(
        dev,
        Launch::elementwise(tokens * hidden),
        out.arg(),
        wt.arg(),
        out_s.arg(),
        logits.arg_at(e_count),
        i(ld),
        y,
        i(hidden),
        i(tokens),
        i(k),
        i(hidden),
        i(accumulate as usize),
    )?;
    Ok(owned)
}
