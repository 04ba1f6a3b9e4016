//! Launchers of the kernels in `fp8.cu`.

use super::Ptr;

kernels! {
    /// e4m3 activations for the FP8 GEMM (per token and group of 128, scale amax/448):
    /// xq [rows, cols], xd [rows, cols/32] (each 32-column group's 128-group scale).
    GemmFp8QuantizeActs = "gemm_fp8_quantize_acts"
    (
        x: Ptr<f32>,
        ldx: i32,
        up: i32,
        rows: i32,
        cols: i32,
        xq: Ptr<u8>,
        xd: Ptr<f32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[GemmFp8QuantizeActs::DECLS];
