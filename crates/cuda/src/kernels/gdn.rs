//! Launchers of the kernels in `gdn.cu`.

use super::Ptr;

kernels! {
    /// u[t, c] = silu(Σ_j w[c, j] · x_{t−K+1+j}[c]) over the window [state (K−1 rows) | x rows].
    GdnConv = "gdn_conv"
    (
        proj: Ptr<f32>,
        ld: i32,
        state: Ptr<f32>,
        w: Ptr<f32>,
        u: Ptr<f32>,
        tokens: i32,
        channels: i32,
        taps: i32,
    );
    /// The conv state after T more rows: the last K−1 raw rows of [state | x].
    GdnConvStateUpdate = "gdn_conv_state_update"
    (
        proj: Ptr<f32>,
        ld: i32,
        state: Ptr<f32>,
        tokens: i32,
        channels: i32,
        taps: i32,
    );
    /// One block per v-head h, thread j owns column j of S_h [d_k, d_v] in registers.
    GdnRecurrent = "gdn_recurrent"
    (
        u: Ptr<f32>,
        channels: i32,
        proj: Ptr<f32>,
        ld: i32,
        z_off: i32,
        b_off: i32,
        a_off: i32,
        state: Ptr<f32>,
        a_log: Ptr<f32>,
        dt_bias: Ptr<f32>,
        norm_w: Ptr<f32>,
        out: Ptr<f32>,
        tokens: i32,
        nk: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        eps: f32,
        gate_sigmoid: i32,
    );
    /// `u` rows hold the conv outputs [q (n_k·d_k) | k | v (n_v·d_v)] followed by z, b, a (the
    /// in_proj matvec applied the conv, decode_matvec_conv_*).
    GdnDecodeHeads = "gdn_decode_heads"
    (
        u: Ptr<f32>,
        ld: i32,
        tokens: i32,
        nk: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        z_off: i32,
        b_off: i32,
        a_off: i32,
        state: Ptr<f32>,
        a_log: Ptr<f32>,
        dt_bias: Ptr<f32>,
        norm_w: Ptr<f32>,
        out: Ptr<f32>,
        eps: f32,
        gate_sigmoid: i32,
        r: i32,
    );
    /// `gdn_decode_heads` with q, k, v from rows of `u` (stride `ld`) and z, b, a from rows of
    /// `p` (stride `ldp`): a few tokens of one sequence inside a larger step.
    GdnDecodeHeadsRows = "gdn_decode_heads_rows"
    (
        u: Ptr<f32>,
        ld: i32,
        p: Ptr<f32>,
        ldp: i32,
        tokens: i32,
        nk: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        z_off: i32,
        b_off: i32,
        a_off: i32,
        state: Ptr<f32>,
        a_log: Ptr<f32>,
        dt_bias: Ptr<f32>,
        norm_w: Ptr<f32>,
        out: Ptr<f32>,
        eps: f32,
        gate_sigmoid: i32,
        r: i32,
    );
    /// Batched decode: the conv of row b of `proj` `[B, ld]` from the conv state at
    /// `states[b]`, in place, the state moved on; a thread per (b, channel).
    GdnConvDecodeBatch = "gdn_conv_decode_batch"
    (
        proj: Ptr<f32>,
        ld: i32,
        states: Ptr<u64>,
        w: Ptr<f32>,
        seqs: i32,
        channels: i32,
        kernel: i32,
    );
    /// Batched decode: `gdn_decode_heads` with T = 1, grid (n_v, B), sequence b's recurrent
    /// state at `states[b]`, its rows b of `u` and `out`.
    GdnDecodeHeadsBatch = "gdn_decode_heads_batch"
    (
        u: Ptr<f32>,
        ld: i32,
        nk: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        z_off: i32,
        b_off: i32,
        a_off: i32,
        states: Ptr<u64>,
        a_log: Ptr<f32>,
        dt_bias: Ptr<f32>,
        norm_w: Ptr<f32>,
        out: Ptr<f32>,
        eps: f32,
        gate_sigmoid: i32,
        r: i32,
    );
    /// Grid (⌈T/CH⌉, n_v), GDN_PREP_THREADS threads.
    GdnChunkPrep = "gdn_chunk_prep"
    (
        u: Ptr<f32>,
        channels: i32,
        proj: Ptr<f32>,
        ld: i32,
        b_off: i32,
        a_off: i32,
        a_log: Ptr<f32>,
        dt_bias: Ptr<f32>,
        rec: Ptr<f32>,
        tokens: i32,
        nk: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        ldk: i32,
    );
    /// Grid (⌈d_v/32⌉, n_v), GDN_SCAN_THREADS threads.
    GdnChunkScan = "gdn_chunk_scan"
    (
        rec: Ptr<f32>,
        state: Ptr<f32>,
        out: Ptr<f32>,
        tokens: i32,
        nv: i32,
        dk: i32,
        dv: i32,
        ldk: i32,
    );
    /// The gated output norm of the chunked form, in place on o [T, n_v·d_v]: a warp per (t, h),
    /// out = o·rsqrt(mean(o²) + eps)·w·act(z) as in gdn_recurrent (act: sigmoid or SiLU).
    GdnGatedNorm = "gdn_gated_norm"
    (
        o: Ptr<f32>,
        proj: Ptr<f32>,
        ld: i32,
        z_off: i32,
        norm_w: Ptr<f32>,
        tokens: i32,
        nv: i32,
        dv: i32,
        eps: f32,
        gate_sigmoid: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    GdnConv::DECLS,
    GdnConvStateUpdate::DECLS,
    GdnRecurrent::DECLS,
    GdnDecodeHeads::DECLS,
    GdnDecodeHeadsRows::DECLS,
    GdnConvDecodeBatch::DECLS,
    GdnDecodeHeadsBatch::DECLS,
    GdnChunkPrep::DECLS,
    GdnChunkScan::DECLS,
    GdnGatedNorm::DECLS,
];
