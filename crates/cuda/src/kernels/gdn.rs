//! Launchers of the kernels in `gdn.cu`.

use super::Ptr;

kernels! {
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
    GdnConvStateUpdate = "gdn_conv_state_update"
    (
        proj: Ptr<f32>,
        ld: i32,
        state: Ptr<f32>,
        tokens: i32,
        channels: i32,
        taps: i32,
    );
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
    GdnChunkPrep::DECLS,
    GdnChunkScan::DECLS,
    GdnGatedNorm::DECLS,
];
