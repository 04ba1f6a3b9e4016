//! Launchers of the kernels in `moe.cu`.

use super::Ptr;

kernels! {
    /// One block per token: softmax over the E router logits (row t of `logits`, stride ld), top-k
    /// by repeated argmax (ties to the lower expert index, as the CPU), optional renormalisation.
    MoeRoute = "moe_route"
    (
        logits: Ptr<f32>,
        ld: i32,
        experts: i32,
        k: i32,
        renormalize: i32,
        idx: Ptr<i32>,
        wt: Ptr<f32>,
    );
    /// MoE per (token, expert) pair: gate|up rows and SwiGLU.
    MoeGateUp {
        BF16 = "moe_gate_up_bf16",
        Q8 = "moe_gate_up_q8",
        Q4 = "moe_gate_up_q4",
        FP8 = "moe_gate_up_fp8",
    }
    (
        gu: Ptr<u8>,
        gs: Ptr<u16>,
        x: Ptr<f32>,
        ldx: i32,
        idx: Ptr<i32>,
        act: Ptr<f32>,
        k: i32,
        inter: i32,
        hidden: i32,
        vec: i32,
    );
    /// MoE per (token, expert) pair: weighted down projections summed per token.
    MoeDown {
        BF16 = "moe_down_bf16",
        Q8 = "moe_down_q8",
        Q4 = "moe_down_q4",
        FP8 = "moe_down_fp8",
    }
    (
        down: Ptr<u8>,
        ds: Ptr<u16>,
        act: Ptr<f32>,
        idx: Ptr<i32>,
        wt: Ptr<f32>,
        y: Ptr<f32>,
        k: i32,
        inter: i32,
        hidden: i32,
        vec: i32,
    );
    /// Decode MoE: routing per block, then every selected expert's (and the shared expert's)
    /// gate|up rows and SwiGLU.
    DecodeMoeGateUp {
        BF16 = "decode_moe_gate_up_bf16",
        Q8 = "decode_moe_gate_up_q8",
        Q4 = "decode_moe_gate_up_q4",
        FP8 = "decode_moe_gate_up_fp8",
        Q4K = "decode_moe_gate_up_q4k",
        Q5K = "decode_moe_gate_up_q5k",
        Q6K = "decode_moe_gate_up_q6k",
    }
    (
        gu: Ptr<u8>,
        gs: Ptr<u16>,
        sgu: Ptr<u8>,
        sgs: Ptr<u16>,
        x: Ptr<f32>,
        tokens: i32,
        logits: Ptr<f32>,
        ld: i32,
        experts: i32,
        renormalize: i32,
        idx: Ptr<i32>,
        wt: Ptr<f32>,
        k: i32,
        inter: i32,
        inter_shared: i32,
        hidden: i32,
        act: Ptr<f32>,
        act_s: Ptr<f32>,
    );
    /// Decode MoE: the weighted down projections of the selected experts and the gated shared
    /// expert, added into the output.
    DecodeMoeDown {
        BF16 = "decode_moe_down_bf16",
        Q8 = "decode_moe_down_q8",
        Q4 = "decode_moe_down_q4",
        FP8 = "decode_moe_down_fp8",
        Q4K = "decode_moe_down_q4k",
        Q5K = "decode_moe_down_q5k",
        Q6K = "decode_moe_down_q6k",
    }
    (
        dw: Ptr<u8>,
        ds: Ptr<u16>,
        sdw: Ptr<u8>,
        sds: Ptr<u16>,
        act: Ptr<f32>,
        act_s: Ptr<f32>,
        idx: Ptr<i32>,
        wt: Ptr<f32>,
        sg: Ptr<f32>,
        ldsg: i32,
        tokens: i32,
        k: i32,
        inter: i32,
        inter_shared: i32,
        hidden: i32,
        h: Ptr<f32>,
        ldh: i32,
        accumulate: i32,
    );
    /// Batched decode MoE (9-128 tokens), per tile of pairs sorted by expert: each expert's
    /// gate|up rows read once for its pairs, SwiGLU into `act [pairs, I]`. With `dense` > 0
    /// (`tiles`, `order` null) one matrix for rows `0..dense` (the shared expert), pair = row.
    MoeGroupedGateUp {
        Q8 = "moe_grouped_gate_up_q8",
        Q4 = "moe_grouped_gate_up_q4",
    }
    (
        gu: Ptr<u8>,
        gs: Ptr<u16>,
        xq: Ptr<u8>,
        xd: Ptr<u8>,
        tiles: Ptr<i32>,
        order: Ptr<i32>,
        k: i32,
        inter: i32,
        hidden: i32,
        act: Ptr<f32>,
        dense: i32,
    );
    /// Batched decode MoE, per tile of pairs sorted by expert: each expert's down rows read
    /// once for its pairs, unweighted into `out [pairs, H]` (`moe_combine` or
    /// `moe_combine_slots` weighs and adds). With `dense` > 0 (`tiles`, `order` null) one
    /// matrix for rows `0..dense` (the shared expert), pair = row.
    MoeGroupedDown {
        Q8 = "moe_grouped_down_q8",
        Q4 = "moe_grouped_down_q4",
    }
    (
        dw: Ptr<u8>,
        ds: Ptr<u16>,
        aq: Ptr<u8>,
        ad: Ptr<u8>,
        tiles: Ptr<i32>,
        order: Ptr<i32>,
        inter: i32,
        hidden: i32,
        out: Ptr<f32>,
        dense: i32,
    );
    /// Sorts the `pairs` (token, expert) pairs by expert for the grouped GEMMs: `order` lists the
    /// pair ids of expert 0, then of expert 1, and so on, and `tiles` the tiles of at most
    /// `tile` pairs of one expert.
    MoeGroupByExpert = "moe_group_by_expert"
    (
        idx: Ptr<i32>,
        pairs: i32,
        experts: i32,
        order: Ptr<i32>,
        tiles: Ptr<i32>,
        max_tiles: i32,
        tile: i32,
    );
    /// y[t, r] += Σ_j wt[t·k + j] · out[(t·k + j)·H + r]: the routed experts' weighted sum
    /// (grid-stride).
    MoeCombine = "moe_combine"
    (
        out: Ptr<f32>,
        wt: Ptr<f32>,
        y: Ptr<f32>,
        tokens: i32,
        k: i32,
        hidden: i32,
    );
    /// Routing of a batched decode step, a warp per token (the decode kernels' arithmetic):
    /// idx/wt `[tokens, k]` from the router logits. Dynamic shared memory: 8·E floats.
    MoeRouteWarps = "moe_route_warps"
    (
        logits: Ptr<f32>,
        ld: i32,
        experts: i32,
        k: i32,
        renormalize: i32,
        tokens: i32,
        idx: Ptr<i32>,
        wt: Ptr<f32>,
    );
    /// y[t·ldy + r] (+)= the routed pairs' outputs weighted and summed in slot order, then the
    /// gated shared expert's (when `out_s` is not null): `decode_moe_down`'s order.
    MoeCombineSlots = "moe_combine_slots"
    (
        out: Ptr<f32>,
        wt: Ptr<f32>,
        out_s: Ptr<f32>,
        sg: Ptr<f32>,
        ldsg: i32,
        y: Ptr<f32>,
        ldy: i32,
        tokens: i32,
        k: i32,
        hidden: i32,
        accumulate: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    MoeRoute::DECLS,
    MoeGateUp::DECLS,
    MoeDown::DECLS,
    DecodeMoeGateUp::DECLS,
    DecodeMoeDown::DECLS,
    MoeGroupedGateUp::DECLS,
    MoeGroupedDown::DECLS,
    MoeGroupByExpert::DECLS,
    MoeCombine::DECLS,
    MoeRouteWarps::DECLS,
    MoeCombineSlots::DECLS,
];
