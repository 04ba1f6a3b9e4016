//! The kernels of `linear.cu`.

use super::Ptr;

kernels! {
    Matvec { BF16 = "matvec_bf16", Q8 = "matvec_q8", Q4 = "matvec_q4" }
        (w: Ptr<u8>, s: Ptr<u16>, x: Ptr<f32>, y: Ptr<f32>, rows: i32, cols: i32, tokens: i32, ldx: i32, ldy: i32, accumulate: i32, vec: i32);
    Gemm { BF16 = "gemm_bf16", Q8 = "gemm_q8", Q4 = "gemm_q4" }
        (w: Ptr<u8>, s: Ptr<u16>, x: Ptr<f32>, y: Ptr<f32>, rows: i32, cols: i32, tokens: i32, ldx: i32, ldy: i32, accumulate: i32);
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[Matvec::DECLS, Gemm::DECLS];
