//! Launchers of the kernels in `ggml.cu`.

use super::Ptr;

kernels! {
    /// A GGUF K-quant matrix as stored on the device (codes, scale words), dequantized to f32
    /// `[rows, cols]` with the host dequantizers' arithmetic (tests).
    GgmlDequantize {
        Q4K = "ggml_dequantize_q4k",
        Q5K = "ggml_dequantize_q5k",
        Q6K = "ggml_dequantize_q6k",
    }
    (
        w: Ptr<u8>,
        s: Ptr<u16>,
        rows: i32,
        cols: i32,
        out: Ptr<f32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[GgmlDequantize::DECLS];
