//! Launchers of the kernels in `elementwise.cu`.

use super::Ptr;

kernels! {
    /// h[t, s·H + i] = E[ids[t], i] for every stream s.
    EmbedBf16 = "embed_bf16"
    (
        experts: Ptr<u16>,
        ids: Ptr<i32>,
        h: Ptr<f32>,
        tokens: i32,
        hidden: i32,
        streams: i32,
    );
    /// y[i] += x[i].
    AddInPlace = "add_in_place"
    (
        y: Ptr<f32>,
        x: Ptr<f32>,
        n: i32,
    );
    /// out[t, i] = silu(in[t·ld + gate_off + i]) · in[t·ld + up_off + i], i < n.
    Swiglu = "swiglu"
    (
        input: Ptr<f32>,
        ld: i32,
        gate_off: i32,
        up_off: i32,
        out: Ptr<f32>,
        tokens: i32,
        n: i32,
    );
    /// out[t, i] = silu(in[t·ld + i] · scale), i < n.
    SiluScaled = "silu_scaled"
    (
        input: Ptr<f32>,
        ld: i32,
        scale: f32,
        out: Ptr<f32>,
        tokens: i32,
        n: i32,
    );
    /// y[t, i] *= sigmoid(gate[t·ld]) (the shared expert's gate).
    ScaleBySigmoid = "scale_by_sigmoid"
    (
        y: Ptr<f32>,
        gate: Ptr<f32>,
        ld: i32,
        tokens: i32,
        n: i32,
    );
    /// dst[r, i] = src[rows[r], i] for r < n, i < width (the wanted rows of a batched step).
    GatherRows = "gather_rows"
    (
        src: Ptr<f32>,
        rows: Ptr<i32>,
        dst: Ptr<f32>,
        n: i32,
        width: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    EmbedBf16::DECLS,
    AddInPlace::DECLS,
    Swiglu::DECLS,
    SiluScaled::DECLS,
    ScaleBySigmoid::DECLS,
    GatherRows::DECLS,
];
