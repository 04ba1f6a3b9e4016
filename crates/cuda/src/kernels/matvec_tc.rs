//! Launchers of the kernels in `matvec_tc.cu`.

use super::Ptr;

kernels! {
    /// Decode matvec of Q8/Q4 weights for batched steps (more than MATVEC_MAX_TOKENS rows):
    /// the integer dot products on the tensor cores, every output the bits of
    /// [`DecodeMatvec`](super::matvec::DecodeMatvec) for that row alone; 16 tokens per row of
    /// blocks. Its arguments are the decode matvec's.
    DecodeMatvecTc {
        Q8 = "decode_matvec_tc_q8",
        Q4 = "decode_matvec_tc_q4",
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
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[DecodeMatvecTc::DECLS];
