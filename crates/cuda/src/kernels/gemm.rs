//! Launchers of the kernels in `gemm.cu`.

use super::Ptr;

kernels! {
    /// SIMT f32 GEMM, 64×64 tiles (prefill where the tensor cores are off or the shape does not
    /// suit them).
    GemmSimt {
        BF16 = "gemm_simt_bf16",
        Q8 = "gemm_simt_q8",
        Q4 = "gemm_simt_q4",
        FP8 = "gemm_simt_fp8",
    }
    (
        w: Ptr<u8>,
        s: Ptr<u16>,
        x: Ptr<f32>,
        y: Ptr<f32>,
        rows: i32,
        cols: i32,
        tokens: i32,
        ldx: i32,
        ldy: i32,
        accumulate: i32,
    );
    /// int8 activations for the Q8/Q4 GEMM: xq [rows, cols], xd [rows, cols/32].
    GemmTensorQuantizeActs = "gemm_tensor_quantize_acts"
    (
        x: Ptr<f32>,
        ldx: i32,
        up: i32,
        rows: i32,
        cols: i32,
        xq: Ptr<i8>,
        xd: Ptr<f32>,
    );
    /// bf16 activations for the bf16 GEMM: row r of `out` is [hi | mid | lo] (3·cols values) with
    /// hi + mid + lo ≈ x to ~2^-24 (grid-stride).
    GemmTensorSplitActsBf16 = "gemm_tensor_split_acts_bf16"
    (
        x: Ptr<f32>,
        ldx: i32,
        up: i32,
        rows: i32,
        cols: i32,
        out: Ptr<u16>,
    );
    /// Tensor-core GEMM (`mma.sync`), dense or grouped by expert, on prepared activations:
    /// tiles of `TENSOR_GEMM_TOKENS` tokens, or (`SKINNY_*`) of `TENSOR_GEMM_SKINNY_TOKENS`
    /// tokens (a few tokens, or experts that see a few tokens each), bit for bit the same
    /// outputs.
    GemmTensor {
        BF16 = "gemm_tensor_bf16",
        Q8 = "gemm_tensor_q8",
        Q4 = "gemm_tensor_q4",
        FP8 = "gemm_tensor_fp8",
        SKINNY_BF16 = "gemm_tensor_skinny_bf16",
        SKINNY_Q8 = "gemm_tensor_skinny_q8",
        SKINNY_Q4 = "gemm_tensor_skinny_q4",
        SKINNY_FP8 = "gemm_tensor_skinny_fp8",
    }
    (
        w: Ptr<u8>,
        s: Ptr<u16>,
        a: Ptr<u8>,
        a_aux: Ptr<u8>,
        y: Ptr<f32>,
        ldy: i32,
        accumulate: i32,
        n: i32,
        k_dim: i32,
        m: i32,
        tiles: Ptr<i32>,
        order: Ptr<i32>,
        a_div: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    GemmSimt::DECLS,
    GemmTensorQuantizeActs::DECLS,
    GemmTensorSplitActsBf16::DECLS,
    GemmTensor::DECLS,
];
