//! Matvecs for batches of at most [`MATVEC_MAX_TOKENS`](crate::kernels::MATVEC_MAX_TOKENS) tokens: the plain one (a warp per
//! row) and the decode matvec (input staged once per block, RMS-normed and for Q8/Q4
//! quantized to int8 as on the CPU, many rows per block, epilogues fused: store, accumulate,
//! sigmoid gate, SwiGLU, GDN's causal conv).

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::kernels::matvec::{DecodeMatvec, DecodeMatvecConv, Matvec};
use crate::kernels::{i, Launch, Ptr, DECODE_CONV_WINDOW, MATVEC_MAX_TOKENS, TCD_TOKENS};
use crate::matrix::{DevFormat, DevMatrix, DevPart, DeviceLayout};

/// `y[t·ldy + r] (+)= Σ_c W[r, c]·x[t·ldx + c]` for at most [`MATVEC_MAX_TOKENS`](crate::kernels::MATVEC_MAX_TOKENS) tokens
/// through the plain matvec: a warp per weight row, the row read once for all tokens.
#[allow(clippy::too_many_arguments)]
pub fn matvec(
    dev: &Device,
    w: &DevPart,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    let vec = w.vec_ok() && ldx % 4 == 0 && x.addr() % 16 == 0;
    let blocks = w.rows.div_ceil(8) as u32;
    matvec_kernel(w.fmt)?.launch(
        dev,
        Launch::new((blocks, 1, 1), 256, 0),
        w.codes.arg(),
        w.scales.arg(),
        x,
        y,
        i(w.rows),
        i(w.cols),
        i(tokens),
        i(ldx),
        i(ldy),
        i(accumulate as usize),
        i(vec as usize),
    )
}

fn matvec_kernel(fmt: DevFormat) -> Result<Matvec> {
    Ok(match fmt {
        DevFormat::Bf16 => Matvec::BF16,
        DevFormat::Q8 => Matvec::Q8,
        DevFormat::Q4 => Matvec::Q4,
        DevFormat::Fp8 => Matvec::FP8,
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => return Err(ggml_only_decode(fmt)),
    })
}

/// The error of a general (f32-activation) kernel asked to read a GGUF K-quant, which only the
/// decode kernels read (the `linear` module routes them there).
pub(crate) fn ggml_only_decode(fmt: DevFormat) -> CudaError {
    CudaError::Unsupported(format!(
        "{} weights run through the decode kernels only (a matrix whose input the decode matvec cannot stage)",
        fmt.name()
    ))
}

/// The input of a decode-path linear layer: `tokens` rows of `x` (stride `ldx`), optionally
/// RMS-normed first with a zero-centred weight (the norm is fused into the matvec).
#[derive(Clone, Copy)]
pub struct DecodeIn<'a> {
    pub x: Ptr<f32>,
    pub ldx: usize,
    pub norm: Option<(&'a DevBuf<f32>, f32)>,
    /// Where to also write the normed rows (`[tokens, cols]`), or null.
    pub normed_out: Ptr<f32>,
}

impl DecodeIn<'_> {
    /// Rows of `x` used as they are.
    pub fn plain(x: Ptr<f32>, ldx: usize) -> Self {
        DecodeIn {
            x,
            ldx,
            norm: None,
            normed_out: Ptr::null(),
        }
    }
}

/// What a decode-path linear layer does with its outputs (`y[t·ldy + j]`).
#[derive(Clone, Copy)]
pub enum DecodeOut {
    /// y = x·Wᵀ.
    Store { y: Ptr<f32>, ldy: usize },
    /// y += x·Wᵀ, times sigmoid(gate[t·ldg]) when `gate` is `Some((gate, ldg))`.
    Accumulate {
        y: Ptr<f32>,
        ldy: usize,
        gate: Option<(Ptr<f32>, usize)>,
    },
    /// The rows are [gate (n) | up (n)]: y[t·ldy + j] = silu(gate_j·x)·(up_j·x), j < n.
    SwiGlu { y: Ptr<f32>, ldy: usize },
}

/// Lanes that share one weight row: enough chunks per lane for DEC_BATCH loads in flight.
fn lanes_per_row(chunks: usize) -> usize {
    let per = (chunks / 4).max(1);
    (1usize << (usize::BITS - 1 - per.leading_zeros())).min(32)
}

/// Dynamic shared memory the decode kernels stage `tokens` rows of `cols` in.
pub fn staged_bytes(fmt: DevFormat, tokens: usize, cols: usize) -> usize {
    match fmt {
        DevFormat::Bf16 | DevFormat::Fp8 => tokens * cols * 4,
        DevFormat::Q8 | DevFormat::Q4 | DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => {
            tokens * cols + tokens * (cols / 32) * 8
        }
    }
}

/// GDN's in_proj with the causal conv fused into the decode matvec (`decode_matvec_conv_*`): outputs
/// `j < channels` become silu(conv) over `[conv_state rows | this step]` and `conv_state` keeps
/// the last K − 1 raw rows; the rest are stored as they are. `false` (nothing launched) when
/// the matrix is not one block the decode kernels can read.
#[allow(clippy::too_many_arguments)]
pub fn decode_linear_conv(
    dev: &Device,
    w: &DevMatrix,
    input: DecodeIn,
    tokens: usize,
    y: Ptr<f32>,
    ldy: usize,
    conv_state: Ptr<f32>,
    conv_w: Ptr<f32>,
    kernel: usize,
    channels: usize,
) -> Result<bool> {
    let [(0, part)] = w.parts.as_slice() else {
        return Ok(false);
    };
    if kernel == 0
        || kernel - 1 + tokens > DECODE_CONV_WINDOW
        || !decode_matvec_fits(dev, part, &input, tokens)
    {
        return Ok(false);
    }
    let conv = match (part.fmt, tokens) {
        // Released FP8 checkpoints leave GDN's b and a rows unconverted: in_proj is never one
        // FP8 block, and the conv runs on its own.
        (DevFormat::Fp8 | DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K, _) => return Ok(false),
        (DevFormat::Bf16, 1) => DecodeMatvecConv::BF16_T1,
        (DevFormat::Q8, 1) => DecodeMatvecConv::Q8_T1,
        (DevFormat::Q4, 1) => DecodeMatvecConv::Q4_T1,
        (DevFormat::Bf16, _) => DecodeMatvecConv::BF16_T8,
        (DevFormat::Q8, _) => DecodeMatvecConv::Q8_T8,
        (DevFormat::Q4, _) => DecodeMatvecConv::Q4_T8,
    };
    let kernel = DecodeMatvecKernel::Conv {
        kernel: conv,
        state: conv_state,
        weights: conv_w,
        taps: kernel,
        channels,
    };
    let out = DecodeOut::Store { y, ldy };
    decode_matvec_launch(dev, kernel, part, 0, part.rows, input, tokens, out, 0)?;
    Ok(true)
}

/// Whether the decode matvec can read `part` for this input.
pub(crate) fn decode_matvec_fits(
    dev: &Device,
    part: &DevPart,
    input: &DecodeIn,
    tokens: usize,
) -> bool {
    let cols = part.cols;
    let layout = match part.fmt {
        DevFormat::Bf16 => cols % 8 == 0,
        DevFormat::Q8 | DevFormat::Q4 => cols % 32 == 0,
        DevFormat::Fp8 => cols % 16 == 0,
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => cols % 256 == 0,
    };
    layout
        && part.codes.ptr() % 16 == 0
        && input.x.addr() % 16 == 0
        && input.ldx % 4 == 0
        && input
            .norm
            .is_none_or(|(w, _)| w.len() == cols && w.ptr() % 16 == 0)
        && input.normed_out.addr() % 16 == 0
        && staged_bytes(part.fmt, tokens.min(MATVEC_MAX_TOKENS), cols)
            <= dev.shared_limit(decode_matvec_kernel(part.fmt, tokens).name())
}

fn decode_matvec_kernel(fmt: DevFormat, tokens: usize) -> DecodeMatvec {
    match (fmt, tokens) {
        (DevFormat::Bf16, 1) => DecodeMatvec::BF16_T1,
        (DevFormat::Q8, 1) => DecodeMatvec::Q8_T1,
        (DevFormat::Q4, 1) => DecodeMatvec::Q4_T1,
        (DevFormat::Fp8, 1) => DecodeMatvec::FP8_T1,
        (DevFormat::Bf16, _) => DecodeMatvec::BF16_T8,
        (DevFormat::Q8, _) => DecodeMatvec::Q8_T8,
        (DevFormat::Q4, _) => DecodeMatvec::Q4_T8,
        (DevFormat::Fp8, _) => DecodeMatvec::FP8_T8,
        (DevFormat::Q4K, 1) => DecodeMatvec::Q4K_T1,
        (DevFormat::Q5K, 1) => DecodeMatvec::Q5K_T1,
        (DevFormat::Q6K, 1) => DecodeMatvec::Q6K_T1,
        (DevFormat::Q4K, _) => DecodeMatvec::Q4K_T8,
        (DevFormat::Q5K, _) => DecodeMatvec::Q5K_T8,
        (DevFormat::Q6K, _) => DecodeMatvec::Q6K_T8,
    }
}

/// The tensor-core decode matvec (`matvec_tc.cu`) for `tokens` rows of `cols` in `fmt`, where
/// it applies: Q8/Q4, at least [`Device::tc_decode_rows`] rows (0: never), and its staged input
/// within the kernel's shared memory. Its outputs are the bits of [`DecodeMatvec`]'s.
pub(crate) fn tc_decode_kernel(
    dev: &Device,
    fmt: DevFormat,
    cols: usize,
    tokens: usize,
) -> Option<DecodeMatvec> {
    let min_rows = dev.tc_decode_rows();
    if min_rows == 0 || tokens < min_rows.max(TCD_TOKENS) || cols % 32 != 0 {
        return None;
    }
    let kernel = match fmt {
        DevFormat::Q8 => DecodeMatvec::TC_Q8,
        DevFormat::Q4 => DecodeMatvec::TC_Q4,
        _ => return None,
    };
    (tc_staged_bytes(cols) <= dev.shared_limit(kernel.name())).then_some(kernel)
}

/// Dynamic shared memory of the tensor-core decode matvec: [`TCD_TOKENS`] token slots of
/// `cols` int8 codes and, per group of 32, an f32 scale and an i32 code sum.
fn tc_staged_bytes(cols: usize) -> usize {
    TCD_TOKENS * (cols + cols / 32 * 8)
}

/// A decode matvec kernel; with the causal-conv epilogue, its arguments (state, weights
/// `[channels, taps]`, taps, channels).
#[derive(Clone, Copy)]
enum DecodeMatvecKernel {
    Plain(DecodeMatvec),
    /// The tensor-core variant of a plain kernel (same arguments, same bits).
    Tensor(DecodeMatvec),
    Conv {
        kernel: DecodeMatvecConv,
        state: Ptr<f32>,
        weights: Ptr<f32>,
        taps: usize,
        channels: usize,
    },
}

impl DecodeMatvecKernel {
    fn name(self) -> &'static str {
        match self {
            DecodeMatvecKernel::Plain(k) | DecodeMatvecKernel::Tensor(k) => k.name(),
            DecodeMatvecKernel::Conv { kernel, .. } => kernel.name(),
        }
    }
}

/// One decode matvec launch over `outs` outputs starting at row `first` of `part` (with
/// `pair` > 0: SwiGLU of rows j and j + pair).
pub(crate) fn decode_matvec(
    dev: &Device,
    part: &DevPart,
    first: usize,
    outs: usize,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
    pair: usize,
) -> Result<()> {
    let kernel = match tc_decode_kernel(dev, part.fmt, part.cols, tokens) {
        Some(k) => DecodeMatvecKernel::Tensor(k),
        None => DecodeMatvecKernel::Plain(decode_matvec_kernel(part.fmt, tokens)),
    };
    decode_matvec_launch(dev, kernel, part, first, outs, input, tokens, out, pair)
}

/// Launches decode matvec `kernel`.
#[allow(clippy::too_many_arguments)]
fn decode_matvec_launch(
    dev: &Device,
    kernel: DecodeMatvecKernel,
    part: &DevPart,
    first: usize,
    outs: usize,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
    pair: usize,
) -> Result<()> {
    if outs == 0 || tokens == 0 {
        return Ok(());
    }
    let chunks = match part.fmt {
        DevFormat::Bf16 => part.cols / 8,
        DevFormat::Fp8 => part.cols / 16,
        DevFormat::Q8 | DevFormat::Q4 | DevFormat::Q4K | DevFormat::Q5K => part.cols / 32,
        DevFormat::Q6K => part.cols / 64,
    };
    let lpr = lanes_per_row(chunks);
    // Outputs a block takes at a time: 8 warps of 32 / lpr rows, or of 16 on the tensor cores.
    let per_block = match kernel {
        DecodeMatvecKernel::Tensor(_) => 8 * 16,
        _ => 8 * (32 / lpr),
    };
    // More than MATVEC_MAX_TOKENS rows (plain kernels only): a row of blocks per group of
    // MATVEC_MAX_TOKENS rows (TCD_TOKENS on the tensor cores), the GPU's resident blocks
    // shared among the groups.
    let groups = match kernel {
        DecodeMatvecKernel::Plain(_) => tokens.div_ceil(MATVEC_MAX_TOKENS),
        DecodeMatvecKernel::Tensor(_) => tokens.div_ceil(TCD_TOKENS),
        DecodeMatvecKernel::Conv { .. } => {
            debug_assert!(
                tokens <= MATVEC_MAX_TOKENS,
                "the conv matvec takes one group"
            );
            1
        }
    };
    let shared = match kernel {
        DecodeMatvecKernel::Tensor(_) => tc_staged_bytes(part.cols),
        _ => staged_bytes(part.fmt, tokens.min(MATVEC_MAX_TOKENS), part.cols),
    };
    let resident = dev.resident_grid(kernel.name(), 256, shared, usize::MAX)? as usize;
    let grid = outs
        .div_ceil(per_block)
        .min(resident.div_ceil(groups).max(1)) as u32;
    let (y, ldy, accumulate, gate, ldg) = match out {
        DecodeOut::Store { y, ldy } | DecodeOut::SwiGlu { y, ldy } => {
            (y, ldy, false, Ptr::null(), 0)
        }
        DecodeOut::Accumulate { y, ldy, gate } => {
            let (g, ldg) = gate.unwrap_or((Ptr::null(), 0));
            (y, ldy, true, g, ldg)
        }
    };
    let rb = part.fmt.row_bytes(part.cols);
    let rs = part.fmt.row_scales(part.cols);
    let (norm, eps) = match input.norm {
        Some((w, eps)) => (w.arg(), eps),
        None => (Ptr::null(), 0.0),
    };
    let cfg = Launch::new((grid, groups as u32, 1), 256, shared as u32);
    let codes = part.codes.arg_at(first * rb);
    let scales = part.scales.arg_at(first * rs);
    match kernel {
        DecodeMatvecKernel::Plain(k) | DecodeMatvecKernel::Tensor(k) => k.launch(
            dev,
            cfg,
            codes,
            scales,
            i(outs),
            i(part.cols),
            input.x,
            i(input.ldx),
            i(tokens),
            norm,
            eps,
            input.normed_out,
            y,
            i(ldy),
            i(accumulate as usize),
            i(pair),
            gate,
            i(ldg),
            i(lpr),
        ),
        DecodeMatvecKernel::Conv {
            kernel,
            state,
            weights,
            taps,
            channels,
        } => kernel.launch(
            dev,
            cfg,
            codes,
            scales,
            i(outs),
            i(part.cols),
            input.x,
            i(input.ldx),
            i(tokens),
            norm,
            eps,
            input.normed_out,
            y,
            i(ldy),
            i(accumulate as usize),
            i(pair),
            gate,
            i(ldg),
            i(lpr),
            state,
            weights,
            i(taps),
            i(channels),
        ),
    }
}
