//! Launchers of the kernels in `matvec.cu`.

use super::Ptr;

kernels! {
    /// Small-batch matvec (≤ MATVEC_MAX_TOKENS tokens), a warp per weight row: `y (+)= x·Wᵀ`.
    Matvec {
        BF16 = "matvec_bf16",
        Q8 = "matvec_q8",
        Q4 = "matvec_q4",
        FP8 = "matvec_fp8",
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
        vec: i32,
    );
    /// Decode matvec: input rows staged (optionally RMS-normed, int8-quantized) once per block,
    /// many rows per block; epilogues store, accumulate, gate or SwiGLU.
    DecodeMatvec {
        BF16_T1 = "decode_matvec_bf16_t1",
        Q8_T1 = "decode_matvec_q8_t1",
        Q4_T1 = "decode_matvec_q4_t1",
        BF16_T8 = "decode_matvec_bf16_t8",
        Q8_T8 = "decode_matvec_q8_t8",
        Q4_T8 = "decode_matvec_q4_t8",
        FP8_T1 = "decode_matvec_fp8_t1",
        FP8_T8 = "decode_matvec_fp8_t8",
        Q4K_T1 = "decode_matvec_q4k_t1",
        Q4K_T8 = "decode_matvec_q4k_t8",
        Q5K_T1 = "decode_matvec_q5k_t1",
        Q5K_T8 = "decode_matvec_q5k_t8",
        Q6K_T1 = "decode_matvec_q6k_t1",
        Q6K_T8 = "decode_matvec_q6k_t8",
        // Q8/Q4 for batched steps (`matvec_tc.cu`): the integer dot products on the tensor
        // cores, every output the bits of the plain kernel's for that row alone; TCD_TOKENS
        // tokens per row of blocks.
        TC_Q8 = "decode_matvec_tc_q8",
        TC_Q4 = "decode_matvec_tc_q4",
    }
    (
        w: Ptr<u8>,
        s: Ptr<u16>,
        outs: i32,
        cols: i32,
        x: Ptr<f32>,
        ldx: i32,
        tokens: i32,
        nw: Ptr<f32>,
        eps: f32,
        xn: Ptr<f32>,
        y: Ptr<f32>,
        ldy: i32,
        accumulate: i32,
        pair: i32,
        gate: Ptr<f32>,
        ldg: i32,
        lpr: i32,
    );
    /// Decode matvec with GDN's causal conv (and its state) fused into the epilogue.
    DecodeMatvecConv {
        BF16_T1 = "decode_matvec_conv_bf16_t1",
        Q8_T1 = "decode_matvec_conv_q8_t1",
        Q4_T1 = "decode_matvec_conv_q4_t1",
        BF16_T8 = "decode_matvec_conv_bf16_t8",
        Q8_T8 = "decode_matvec_conv_q8_t8",
        Q4_T8 = "decode_matvec_conv_q4_t8",
    }
    (
        w: Ptr<u8>,
        s: Ptr<u16>,
        outs: i32,
        cols: i32,
        x: Ptr<f32>,
        ldx: i32,
        tokens: i32,
        nw: Ptr<f32>,
        eps: f32,
        xn: Ptr<f32>,
        y: Ptr<f32>,
        ldy: i32,
        accumulate: i32,
        pair: i32,
        gate: Ptr<f32>,
        ldg: i32,
        lpr: i32,
        cstate: Ptr<f32>,
        cw: Ptr<f32>,
        conv_taps: i32,
        conv_channels: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] =
    &[Matvec::DECLS, DecodeMatvec::DECLS, DecodeMatvecConv::DECLS];
