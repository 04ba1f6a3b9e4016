//! Weight matrices in VRAM (bf16, or Q8/Q4 codes with f16 scales in the CPU layouts of
//! `spindle_kernels::quant`) and y = x·Wᵀ on the device. Batches of at most
//! [`MATVEC_MAX_TOKENS`] tokens run the decode matvecs ([`decode_linear`]: input staged once
//! per block, int8 activations for Q8/Q4 as on the CPU, norm and epilogue fused); larger
//! ones a tiled GEMM. [`Io`] is how a sublayer takes its input and gives its output, fused
//! with the residual on the decode path.

use spindle_engine::weights::Linear;
use spindle_kernels::quant::QuantizedMatrix;
use spindle_model::DType;

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::kernels::gemm::GemmSimt;
use crate::kernels::gemm::GemmTensor;
use crate::kernels::matvec::Matvec;
use crate::kernels::matvec::{DecodeMatvec, DecodeMatvecConv};
use crate::kernels::{
    self, i, p, Launch, DECODE_CONV_WINDOW, MATVEC_MAX_TOKENS, TENSOR_GEMM_ROWS,
    TENSOR_GEMM_STAGES, TENSOR_GEMM_TOKENS,
};

/// How a device matrix stores its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WFormat {
    /// bf16 words, row-major.
    Bf16,
    /// i8 codes `[rows, cols]` and f16 scales `[rows, cols/32]`: w = scale·code.
    Q8,
    /// Packed nibbles `[rows, cols/2]` (llama.cpp Q4_0 order within a group of 32) and f16
    /// scales `[rows, cols/32]`: w = scale·(nibble − 8).
    Q4,
}

impl WFormat {
    /// Bytes of codes per row.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WFormat::Bf16 => cols * 2,
            WFormat::Q8 => cols,
            WFormat::Q4 => cols / 2,
        }
    }

    /// f16 scales per row.
    pub fn row_scales(self, cols: usize) -> usize {
        match self {
            WFormat::Bf16 => 0,
            WFormat::Q8 | WFormat::Q4 => cols / 32,
        }
    }

    /// Bytes per row, codes and scales.
    pub fn row_size(self, cols: usize) -> usize {
        self.row_bytes(cols) + 2 * self.row_scales(cols)
    }

    /// The kernel-name suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            WFormat::Bf16 => "bf16",
            WFormat::Q8 => "q8",
            WFormat::Q4 => "q4",
        }
    }

    /// Whether the tensor-core GEMM reads int8 activations (Q8, Q4) or bf16 planes (bf16).
    pub fn int8_acts(self) -> bool {
        self != WFormat::Bf16
    }

    /// The tensor-core GEMM's granule of columns: a quantization group, or an mma k16 step.
    fn tensor_k(self) -> usize {
        match self {
            WFormat::Bf16 => 16,
            WFormat::Q8 | WFormat::Q4 => 32,
        }
    }

    /// Values per 16-byte chunk of codes (the vector kernels' unit).
    fn chunk_values(self) -> usize {
        match self {
            WFormat::Bf16 => 8,
            WFormat::Q8 => 16,
            WFormat::Q4 => 32,
        }
    }
}

/// A row-major `[rows, cols]` matrix in one format on the device.
pub struct DevPart {
    pub fmt: WFormat,
    pub codes: DevBuf<u8>,
    /// Empty for bf16.
    pub scales: DevBuf<u16>,
    pub rows: usize,
    pub cols: usize,
}

impl DevPart {
    pub fn new(dev: &Device, fmt: WFormat, rows: usize, cols: usize) -> Result<Self> {
        Ok(DevPart {
            fmt,
            codes: dev.zeros(rows * fmt.row_bytes(cols))?,
            scales: dev.zeros(rows * fmt.row_scales(cols))?,
            rows,
            cols,
        })
    }

    pub fn size_bytes(&self) -> usize {
        self.rows * self.fmt.row_size(self.cols)
    }

    /// Whether the 16-byte vector path can read rows of this matrix.
    pub fn vec_ok(&self) -> bool {
        self.cols % self.fmt.chunk_values() == 0 && self.codes.ptr() % 16 == 0
    }

    /// Copies rows `[from, from + count)` of `src` to rows `[to, to + count)`.
    pub fn put(
        &mut self,
        dev: &Device,
        src: &Source,
        from: usize,
        count: usize,
        to: usize,
    ) -> Result<()> {
        if src.fmt != self.fmt {
            return Err(CudaError::Unsupported(format!(
                "fusing a {} matrix into a {} one",
                src.fmt.suffix(),
                self.fmt.suffix()
            )));
        }
        assert_eq!(
            src.cols, self.cols,
            "fused matrices share their input width"
        );
        assert!(from + count <= src.rows && to + count <= self.rows);
        let rb = self.fmt.row_bytes(self.cols);
        dev.write(
            &mut self.codes,
            to * rb,
            &src.codes[from * rb..(from + count) * rb],
        )?;
        let rs = self.fmt.row_scales(self.cols);
        if rs > 0 {
            dev.write(
                &mut self.scales,
                to * rs,
                &src.scales[from * rs..(from + count) * rs],
            )?;
        }
        Ok(())
    }
}

/// The host bytes of a CPU engine matrix: bf16 as mapped, or Q8/Q4 as quantized on load.
pub struct Source<'a> {
    pub fmt: WFormat,
    pub codes: &'a [u8],
    pub scales: &'a [u16],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Source<'a> {
    pub fn of(linear: &'a Linear) -> Result<Self> {
        match linear {
            Linear::Mapped(m) => {
                if m.dtype != DType::Bf16 {
                    return Err(CudaError::Unsupported(format!(
                        "a [{}, {}] weight matrix is {}; the CUDA backend reads bf16 checkpoints only",
                        m.rows,
                        m.cols,
                        m.dtype.name()
                    )));
                }
                Ok(Source {
                    fmt: WFormat::Bf16,
                    codes: m.bytes(),
                    scales: &[],
                    rows: m.rows,
                    cols: m.cols,
                })
            }
            Linear::Quantized(q) => Ok(Self::quantized(q)),
            Linear::Packed(_) => Err(CudaError::Unsupported(
                "a weight matrix comes from a spindle install; the CUDA backend reads Hugging Face checkpoints only"
                    .into(),
            )),
        }
    }

    fn quantized(q: &'a QuantizedMatrix) -> Self {
        Source {
            fmt: if q.is_q4 { WFormat::Q4 } else { WFormat::Q8 },
            codes: &q.qs,
            scales: &q.scales,
            rows: q.rows,
            cols: q.cols,
        }
    }
}

/// A `[rows, cols]` weight matrix made of row blocks, each in one format (projections that
/// read the same input are fused; the CPU may have quantized some of them and not others).
pub struct DevMatrix {
    /// (first row, block).
    pub parts: Vec<(usize, DevPart)>,
    pub rows: usize,
    pub cols: usize,
}

impl DevMatrix {
    /// Uploads one CPU engine matrix as is.
    pub fn upload(dev: &Device, m: &Linear) -> Result<Self> {
        Self::stack(dev, &[m])
    }

    /// Uploads the vertical concatenation of `parts` (consecutive parts of one format share
    /// one block).
    pub fn stack(dev: &Device, parts: &[&Linear]) -> Result<Self> {
        let sources = parts
            .iter()
            .map(|m| Source::of(m))
            .collect::<Result<Vec<_>>>()?;
        let cols = sources[0].cols;
        let mut out = Vec::new();
        let mut at = 0;
        let mut k = 0;
        while k < sources.len() {
            let fmt = sources[k].fmt;
            let mut end = k;
            while end < sources.len() && sources[end].fmt == fmt {
                end += 1;
            }
            let rows: usize = sources[k..end].iter().map(|s| s.rows).sum();
            let mut part = DevPart::new(dev, fmt, rows, cols)?;
            let mut to = 0;
            for s in &sources[k..end] {
                part.put(dev, s, 0, s.rows, to)?;
                to += s.rows;
            }
            out.push((at, part));
            at += rows;
            k = end;
        }
        Ok(DevMatrix {
            parts: out,
            rows: at,
            cols,
        })
    }

    /// One block, for a matrix assembled row range by row range.
    pub fn single(part: DevPart) -> Self {
        DevMatrix {
            rows: part.rows,
            cols: part.cols,
            parts: vec![(0, part)],
        }
    }

    /// The block holding all of `rows`, and the first of them within it.
    pub fn part_of(&self, rows: std::ops::Range<usize>) -> Option<(&DevPart, usize)> {
        self.parts.iter().find_map(|(row0, part)| {
            (rows.start >= *row0 && rows.end <= row0 + part.rows).then(|| (part, rows.start - row0))
        })
    }

    /// The bf16 words of a one-block bf16 matrix (the embedding table).
    pub fn bf16_ptr(&self) -> Result<u64> {
        match self.parts.as_slice() {
            [(0, part)] if part.fmt == WFormat::Bf16 => Ok(part.codes.ptr()),
            _ => Err(CudaError::Unsupported(
                "the embedding table must be bf16".into(),
            )),
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(|(_, p)| p.size_bytes()).sum()
    }
}

/// `y[t·ldy + r] (+)= Σ_c W[r, c]·x[t·ldx + c]` for `tokens` rows of x (addresses of f32 data).
pub fn linear(
    dev: &Device,
    w: &DevMatrix,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    // Prepared once per weight family for the tensor-core GEMM: [bf16, int8].
    let mut prepared: [Option<GemmActs>; 2] = [None, None];
    for (row0, part) in &w.parts {
        let y = y + (*row0 * 4) as u64;
        if tokens > MATVEC_MAX_TOKENS && tensor_gemm_ok(dev, part.fmt, part.cols) {
            let slot = &mut prepared[part.fmt.int8_acts() as usize];
            if slot.is_none() {
                *slot = Some(GemmActs::prepare(
                    dev, part.fmt, x, ldx, None, tokens, part.cols,
                )?);
            }
            let acts = slot.as_ref().expect("prepared above");
            tensor_gemm(dev, part, acts, y, ldy, accumulate, GemmRows::Dense(tokens))?;
        } else {
            linear_part(dev, part, x, ldx, y, ldy, tokens, accumulate)?;
        }
    }
    Ok(())
}

/// Whether the tensor-core GEMM ([`tensor_gemm`]) takes a matrix of `cols` columns in `fmt`.
pub fn tensor_gemm_ok(dev: &Device, fmt: WFormat, cols: usize) -> bool {
    let kernel = tensor_gemm_kernel(fmt);
    dev.tensor_cores()
        && cols % fmt.tensor_k() == 0
        && tensor_gemm_shared(fmt) <= dev.shared_limit(kernel.name())
}

/// Activations in the form the tensor-core GEMM reads: for bf16 weights the f32 values split
/// into three bf16 planes (hi + mid + lo, within ~2^-24 of each value); for Q8/Q4 weights
/// int8 codes and f32 scales per group of 32, quantized exactly as the CPU engine does.
pub struct GemmActs {
    /// bf16 rows `[rows, 3·cols]` (hi, mid, lo), or i8 codes `[rows, cols]`.
    a: DevBuf<u8>,
    /// f32 scales `[rows, cols/32]` (Q8/Q4), or nothing.
    aux: Option<DevBuf<u8>>,
    int8: bool,
    cols: usize,
}

impl GemmActs {
    /// Prepares `rows` rows of `cols` from `x` (row r at `r·ldx`) for weights in `fmt`; with
    /// `up = Some(u)` each row is first the SwiGLU `silu(x[c])·x[u + c]`.
    pub fn prepare(
        dev: &Device,
        fmt: WFormat,
        x: u64,
        ldx: usize,
        up: Option<usize>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let up = up.map_or(-1, |u| u as i32);
        if fmt.int8_acts() {
            let a = dev.scratch::<u8>(rows * cols)?;
            let aux = dev.scratch::<u8>(rows * cols / 32 * 4)?;
            // One warp per group of 32.
            kernels::gemm::GemmTensorQuantizeActs::launch(
                dev,
                Launch::elementwise(rows * cols),
                p(x),
                i(ldx),
                up,
                i(rows),
                i(cols),
                p(a.ptr()),
                p(aux.ptr()),
            )?;
            Ok(GemmActs {
                a,
                aux: Some(aux),
                int8: true,
                cols,
            })
        } else {
            let a = dev.scratch::<u8>(rows * 3 * cols * 2)?;
            kernels::gemm::GemmTensorSplitActsBf16::launch(
                dev,
                Launch::elementwise(rows * cols),
                p(x),
                i(ldx),
                up,
                i(rows),
                i(cols),
                p(a.ptr()),
            )?;
            Ok(GemmActs {
                a,
                aux: None,
                int8: false,
                cols,
            })
        }
    }
}

/// Which rows a tensor-core GEMM computes.
#[derive(Clone, Copy)]
pub enum GemmRows {
    /// Rows `0..tokens` of the activations into rows `0..tokens` of y.
    Dense(usize),
    /// MoE experts (`moe_group_by_expert`): `tiles` (expert, first, count) per 64-row tile over `order`
    /// (pair ids sorted by expert), at most `max_tiles`; activation row = pair / `a_div`,
    /// output row = pair; expert e's weights are rows `e·rows .. (e+1)·rows` of the part.
    Grouped {
        tiles: u64,
        order: u64,
        max_tiles: usize,
        a_div: usize,
        rows: usize,
    },
}

/// The rows of one grouped-GEMM tile (`moe_group_by_expert`).
pub const GROUP_TILE: usize = TENSOR_GEMM_TOKENS;

fn tensor_gemm_kernel(fmt: WFormat) -> GemmTensor {
    match fmt {
        WFormat::Bf16 => GemmTensor::BF16,
        WFormat::Q8 => GemmTensor::Q8,
        WFormat::Q4 => GemmTensor::Q4,
    }
}

/// Dynamic shared memory of one tensor-core GEMM block: 4 stages of staged A and B rows
/// (`TgLayout` in gemm.cu).
fn tensor_gemm_shared(fmt: WFormat) -> usize {
    let (a_row, planes, b_row) = match fmt {
        WFormat::Bf16 => (80, 3, 80),
        WFormat::Q8 => (48, 1, 48),
        WFormat::Q4 => (48, 1, 16),
    };
    TENSOR_GEMM_STAGES * (TENSOR_GEMM_TOKENS * a_row * planes + TENSOR_GEMM_ROWS * b_row)
}

/// `y[row·ldy + n] (+)= Σ_k acts[row, k]·W[n, k]` on the tensor cores (see gemm.cu).
pub fn tensor_gemm(
    dev: &Device,
    w: &DevPart,
    acts: &GemmActs,
    y: u64,
    ldy: usize,
    accumulate: bool,
    rows: GemmRows,
) -> Result<()> {
    assert_eq!(
        acts.int8,
        w.fmt.int8_acts(),
        "activations prepared for another format"
    );
    assert_eq!(acts.cols, w.cols, "activations of another width");
    let (n, m, m_tiles, tiles, order, a_div) = match rows {
        GemmRows::Dense(tokens) => (w.rows, tokens, tokens.div_ceil(TENSOR_GEMM_TOKENS), 0, 0, 1),
        GemmRows::Grouped {
            tiles,
            order,
            max_tiles,
            a_div,
            rows,
        } => (rows, 0, max_tiles, tiles, order, a_div),
    };
    if n == 0 || m_tiles == 0 {
        return Ok(());
    }
    tensor_gemm_kernel(w.fmt).launch(
        dev,
        Launch::new(
            (n.div_ceil(TENSOR_GEMM_ROWS) as u32, m_tiles as u32, 1),
            256,
            tensor_gemm_shared(w.fmt) as u32,
        ),
        w.codes.arg(),
        w.scales.arg(),
        acts.a.arg(),
        p(acts.aux.as_ref().map_or(0, DevBuf::ptr)),
        p(y),
        i(ldy),
        i(accumulate as usize),
        i(n),
        i(w.cols),
        i(m),
        p(tiles),
        p(order),
        i(a_div),
    )
}

fn linear_part(
    dev: &Device,
    w: &DevPart,
    x: u64,
    ldx: usize,
    y: u64,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    if tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if tokens <= MATVEC_MAX_TOKENS {
        let vec = w.vec_ok() && ldx % 4 == 0 && x % 16 == 0;
        let blocks = w.rows.div_ceil(8) as u32;
        matvec_kernel(w.fmt).launch(
            dev,
            Launch::new((blocks, 1, 1), 256, 0),
            w.codes.arg(),
            w.scales.arg(),
            p(x),
            p(y),
            i(w.rows),
            i(w.cols),
            i(tokens),
            i(ldx),
            i(ldy),
            i(accumulate as usize),
            i(vec as usize),
        )
    } else {
        let grid = (w.rows.div_ceil(64) as u32, tokens.div_ceil(64) as u32, 1);
        gemm_kernel(w.fmt).launch(
            dev,
            Launch::new(grid, 256, 0),
            w.codes.arg(),
            w.scales.arg(),
            p(x),
            p(y),
            i(w.rows),
            i(w.cols),
            i(tokens),
            i(ldx),
            i(ldy),
            i(accumulate as usize),
        )
    }
}

fn matvec_kernel(fmt: WFormat) -> Matvec {
    match fmt {
        WFormat::Bf16 => Matvec::BF16,
        WFormat::Q8 => Matvec::Q8,
        WFormat::Q4 => Matvec::Q4,
    }
}

fn gemm_kernel(fmt: WFormat) -> GemmSimt {
    match fmt {
        WFormat::Bf16 => GemmSimt::BF16,
        WFormat::Q8 => GemmSimt::Q8,
        WFormat::Q4 => GemmSimt::Q4,
    }
}

/// `linear` into a new `[tokens, rows]` scratch buffer.
pub fn project(
    dev: &Device,
    w: &DevMatrix,
    x: u64,
    ldx: usize,
    tokens: usize,
) -> Result<DevBuf<f32>> {
    let y = dev.scratch::<f32>(tokens * w.rows)?;
    linear(dev, w, x, ldx, y.ptr(), w.rows, tokens, false)?;
    Ok(y)
}

/// The input of a decode-path linear layer: `tokens` rows of `x` (stride `ldx`), optionally
/// RMS-normed first with a zero-centred weight (the norm is fused into the matvec).
#[derive(Clone, Copy)]
pub struct DecodeIn<'a> {
    pub x: u64,
    pub ldx: usize,
    pub norm: Option<(&'a DevBuf<f32>, f32)>,
    /// Where to also write the normed rows (`[tokens, cols]`), or 0.
    pub normed_out: u64,
}

impl DecodeIn<'_> {
    /// Rows of `x` used as they are.
    pub fn plain(x: u64, ldx: usize) -> Self {
        DecodeIn {
            x,
            ldx,
            norm: None,
            normed_out: 0,
        }
    }
}

/// What a decode-path linear layer does with its outputs (`y[t·ldy + j]`).
#[derive(Clone, Copy)]
pub enum DecodeOut {
    /// y = x·Wᵀ.
    Store { y: u64, ldy: usize },
    /// y += x·Wᵀ, times sigmoid(gate[t·ldg]) when `gate` is `Some((gate, ldg))`.
    Accumulate {
        y: u64,
        ldy: usize,
        gate: Option<(u64, usize)>,
    },
    /// The rows are [gate (n) | up (n)]: y[t·ldy + j] = silu(gate_j·x)·(up_j·x), j < n.
    SwiGlu { y: u64, ldy: usize },
}

/// Lanes that share one weight row: enough chunks per lane for DEC_BATCH loads in flight.
fn lanes_per_row(chunks: usize) -> usize {
    let per = (chunks / 4).max(1);
    (1usize << (usize::BITS - 1 - per.leading_zeros())).min(32)
}

/// Dynamic shared memory the decode kernels stage `tokens` rows of `cols` in.
pub fn staged_bytes(fmt: WFormat, tokens: usize, cols: usize) -> usize {
    match fmt {
        WFormat::Bf16 => tokens * cols * 4,
        WFormat::Q8 | WFormat::Q4 => tokens * cols + tokens * (cols / 32) * 8,
    }
}

/// Rows `rows` of `w` for at most [`MATVEC_MAX_TOKENS`] tokens through the decode kernels
/// (input staged in shared memory, norm fused, output epilogue fused); falls back to a norm
/// kernel, the plain matvec and elementwise kernels when a shape does not suit them.
pub fn decode_linear(
    dev: &Device,
    w: &DevMatrix,
    rows: std::ops::Range<usize>,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
) -> Result<()> {
    debug_assert!(tokens <= MATVEC_MAX_TOKENS);
    if let DecodeOut::SwiGlu { .. } = out {
        // Gate and up rows must sit in one block of one format.
        let half = rows.len() / 2;
        if let Some((part, first)) = w.part_of(rows.clone()) {
            if decode_matvec_fits(dev, part, &input, tokens) {
                return decode_matvec(dev, part, first, half, input, tokens, out, half);
            }
        }
        return decode_fallback(dev, w, rows, input, tokens, out);
    }
    // Every block of the range on its own (each applies the norm again).
    let fits = w
        .parts
        .iter()
        .all(|(_, part)| decode_matvec_fits(dev, part, &input, tokens));
    if !fits {
        return decode_fallback(dev, w, rows, input, tokens, out);
    }
    let mut first_part = true;
    for (row0, part) in &w.parts {
        let (lo, hi) = (rows.start.max(*row0), rows.end.min(row0 + part.rows));
        if lo >= hi {
            continue;
        }
        let shift = |y: u64| y + ((lo - rows.start) * 4) as u64;
        let out = match out {
            DecodeOut::Store { y, ldy } => DecodeOut::Store { y: shift(y), ldy },
            DecodeOut::Accumulate { y, ldy, gate } => DecodeOut::Accumulate {
                y: shift(y),
                ldy,
                gate,
            },
            DecodeOut::SwiGlu { .. } => unreachable!("handled above"),
        };
        let input = DecodeIn {
            normed_out: if first_part { input.normed_out } else { 0 },
            ..input
        };
        first_part = false;
        decode_matvec(dev, part, lo - row0, hi - lo, input, tokens, out, 0)?;
    }
    Ok(())
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
    y: u64,
    ldy: usize,
    conv_state: u64,
    conv_w: u64,
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
        (WFormat::Bf16, 1) => DecodeMatvecConv::BF16_T1,
        (WFormat::Q8, 1) => DecodeMatvecConv::Q8_T1,
        (WFormat::Q4, 1) => DecodeMatvecConv::Q4_T1,
        (WFormat::Bf16, _) => DecodeMatvecConv::BF16_T8,
        (WFormat::Q8, _) => DecodeMatvecConv::Q8_T8,
        (WFormat::Q4, _) => DecodeMatvecConv::Q4_T8,
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
fn decode_matvec_fits(dev: &Device, part: &DevPart, input: &DecodeIn, tokens: usize) -> bool {
    let cols = part.cols;
    let layout = match part.fmt {
        WFormat::Bf16 => cols % 8 == 0,
        WFormat::Q8 | WFormat::Q4 => cols % 32 == 0,
    };
    layout
        && part.codes.ptr() % 16 == 0
        && input.x % 16 == 0
        && input.ldx % 4 == 0
        && input
            .norm
            .is_none_or(|(w, _)| w.len() == cols && w.ptr() % 16 == 0)
        && input.normed_out % 16 == 0
        && staged_bytes(part.fmt, tokens, cols)
            <= dev.shared_limit(decode_matvec_kernel(part.fmt, tokens).name())
}

fn decode_matvec_kernel(fmt: WFormat, tokens: usize) -> DecodeMatvec {
    match (fmt, tokens) {
        (WFormat::Bf16, 1) => DecodeMatvec::BF16_T1,
        (WFormat::Q8, 1) => DecodeMatvec::Q8_T1,
        (WFormat::Q4, 1) => DecodeMatvec::Q4_T1,
        (WFormat::Bf16, _) => DecodeMatvec::BF16_T8,
        (WFormat::Q8, _) => DecodeMatvec::Q8_T8,
        (WFormat::Q4, _) => DecodeMatvec::Q4_T8,
    }
}

/// A decode matvec kernel; with the causal-conv epilogue, its arguments (state, weights
/// `[channels, taps]`, taps, channels).
#[derive(Clone, Copy)]
enum DecodeMatvecKernel {
    Plain(DecodeMatvec),
    Conv {
        kernel: DecodeMatvecConv,
        state: u64,
        weights: u64,
        taps: usize,
        channels: usize,
    },
}

impl DecodeMatvecKernel {
    fn name(self) -> &'static str {
        match self {
            DecodeMatvecKernel::Plain(k) => k.name(),
            DecodeMatvecKernel::Conv { kernel, .. } => kernel.name(),
        }
    }
}

/// One decode matvec launch over `outs` outputs starting at row `first` of `part` (with
/// `pair` > 0: SwiGLU of rows j and j + pair).
fn decode_matvec(
    dev: &Device,
    part: &DevPart,
    first: usize,
    outs: usize,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
    pair: usize,
) -> Result<()> {
    decode_matvec_launch(
        dev,
        DecodeMatvecKernel::Plain(decode_matvec_kernel(part.fmt, tokens)),
        part,
        first,
        outs,
        input,
        tokens,
        out,
        pair,
    )
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
        WFormat::Bf16 => part.cols / 8,
        _ => part.cols / 32,
    };
    let lpr = lanes_per_row(chunks);
    let per_block = 8 * (32 / lpr);
    let shared = staged_bytes(part.fmt, tokens, part.cols);
    let grid = dev.resident_grid(kernel.name(), 256, shared, outs.div_ceil(per_block))?;
    let (y, ldy, accumulate, gate, ldg) = match out {
        DecodeOut::Store { y, ldy } | DecodeOut::SwiGlu { y, ldy } => (y, ldy, false, 0, 0),
        DecodeOut::Accumulate { y, ldy, gate } => {
            let (g, ldg) = gate.unwrap_or((0, 0));
            (y, ldy, true, g, ldg)
        }
    };
    let rb = part.fmt.row_bytes(part.cols);
    let rs = part.fmt.row_scales(part.cols);
    let (norm, eps) = match input.norm {
        Some((w, eps)) => (w.ptr(), eps),
        None => (0, 0.0),
    };
    let cfg = Launch::new((grid, 1, 1), 256, shared as u32);
    let codes = p(part.codes.ptr() + (first * rb) as u64);
    let scales = p(part.scales.ptr() + (first * rs * 2) as u64);
    match kernel {
        DecodeMatvecKernel::Plain(k) => k.launch(
            dev,
            cfg,
            codes,
            scales,
            i(outs),
            i(part.cols),
            p(input.x),
            i(input.ldx),
            i(tokens),
            p(norm),
            eps,
            p(input.normed_out),
            p(y),
            i(ldy),
            i(accumulate as usize),
            i(pair),
            p(gate),
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
            p(input.x),
            i(input.ldx),
            i(tokens),
            p(norm),
            eps,
            p(input.normed_out),
            p(y),
            i(ldy),
            i(accumulate as usize),
            i(pair),
            p(gate),
            i(ldg),
            i(lpr),
            p(state),
            p(weights),
            i(taps),
            i(channels),
        ),
    }
}

/// The same results through the general kernels: norm, matvec, then the epilogue.
fn decode_fallback(
    dev: &Device,
    w: &DevMatrix,
    rows: std::ops::Range<usize>,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
) -> Result<()> {
    let cols = w.cols;
    let normed;
    let (x, ldx) = match input.norm {
        Some((nw, eps)) => {
            let dst = if input.normed_out != 0 {
                input.normed_out
            } else {
                normed = dev.scratch::<f32>(tokens * cols)?;
                normed.ptr()
            };
            crate::qwen4::group_norm(dev, input.x, input.ldx, dst, cols, nw, tokens, 1, cols, eps)?;
            (dst, cols)
        }
        None => {
            if input.normed_out != 0 {
                for t in 0..tokens {
                    dev.copy_raw(
                        input.x + (t * input.ldx * 4) as u64,
                        input.normed_out + (t * cols * 4) as u64,
                        cols * 4,
                    )?;
                }
            }
            (input.x, input.ldx)
        }
    };
    let n = rows.len();
    let full = project(dev, w, x, ldx, tokens)?; // [tokens, w.rows]
    let src = full.at(rows.start);
    match out {
        DecodeOut::Store { y, ldy } => {
            for t in 0..tokens {
                dev.copy_raw(
                    src + (t * w.rows * 4) as u64,
                    y + (t * ldy * 4) as u64,
                    n * 4,
                )?;
            }
            Ok(())
        }
        DecodeOut::SwiGlu { y, ldy } => {
            let half = n / 2;
            for t in 0..tokens {
                kernels::elementwise::Swiglu::launch(
                    dev,
                    Launch::elementwise(half),
                    p(src + (t * w.rows * 4) as u64),
                    i(w.rows),
                    i(0),
                    i(half),
                    p(y + (t * ldy * 4) as u64),
                    i(1),
                    i(half),
                )?;
            }
            Ok(())
        }
        DecodeOut::Accumulate { y, ldy, gate } => {
            for t in 0..tokens {
                let row = src + (t * w.rows * 4) as u64;
                if let Some((g, ldg)) = gate {
                    kernels::elementwise::ScaleBySigmoid::launch(
                        dev,
                        Launch::elementwise(n),
                        p(row),
                        p(g + (t * ldg * 4) as u64),
                        i(ldg),
                        i(1),
                        i(n),
                    )?;
                }
                kernels::elementwise::AddInPlace::launch(
                    dev,
                    Launch::elementwise(n),
                    p(y + (t * ldy * 4) as u64),
                    p(row),
                    i(n),
                )?;
            }
            Ok(())
        }
    }
}

/// How a sublayer gets its input and gives back its output.
#[derive(Clone, Copy)]
pub enum Io<'a> {
    /// `x` (`[tokens, hidden]`) is the sublayer's input; its output is returned for the caller.
    Split(&'a DevBuf<f32>),
    /// Decode with a plain residual: the sublayer norms `h` itself (fused into its first
    /// matvec) and adds its output into `h` (fused into its last).
    Fused {
        h: &'a DevBuf<f32>,
        norm: &'a DevBuf<f32>,
        eps: f32,
    },
}

impl<'a> Io<'a> {
    /// The input of the sublayer's first linear layer(s); `normed_out` as in [`DecodeIn`].
    pub fn input(&self, hidden: usize, normed_out: u64) -> DecodeIn<'a> {
        match *self {
            Io::Split(x) => DecodeIn::plain(x.ptr(), hidden),
            Io::Fused { h, norm, eps } => DecodeIn {
                x: h.ptr(),
                ldx: hidden,
                norm: Some((norm, eps)),
                normed_out,
            },
        }
    }

    /// `x·Wᵀ` of the sublayer input into a new `[tokens, w.rows]` buffer.
    pub fn project(
        &self,
        dev: &Device,
        w: &DevMatrix,
        hidden: usize,
        tokens: usize,
    ) -> Result<DevBuf<f32>> {
        match *self {
            Io::Split(x) if tokens > MATVEC_MAX_TOKENS => project(dev, w, x.ptr(), hidden, tokens),
            _ => {
                let y = dev.scratch::<f32>(tokens * w.rows)?;
                let out = DecodeOut::Store {
                    y: y.ptr(),
                    ldy: w.rows,
                };
                decode_linear(dev, w, 0..w.rows, self.input(hidden, 0), tokens, out)?;
                Ok(y)
            }
        }
    }

    /// The sublayer's last linear layer on `x` (`[tokens, ldx]`): returned (split) or added
    /// into the residual (fused).
    pub fn finish(
        &self,
        dev: &Device,
        w: &DevMatrix,
        x: u64,
        ldx: usize,
        hidden: usize,
        tokens: usize,
    ) -> Result<Option<DevBuf<f32>>> {
        let input = DecodeIn::plain(x, ldx);
        match *self {
            Io::Split(_) => {
                let y = dev.scratch::<f32>(tokens * w.rows)?;
                if tokens > MATVEC_MAX_TOKENS {
                    linear(dev, w, x, ldx, y.ptr(), w.rows, tokens, false)?;
                } else {
                    let out = DecodeOut::Store {
                        y: y.ptr(),
                        ldy: w.rows,
                    };
                    decode_linear(dev, w, 0..w.rows, input, tokens, out)?;
                }
                Ok(Some(y))
            }
            Io::Fused { h, .. } => {
                let out = DecodeOut::Accumulate {
                    y: h.ptr(),
                    ldy: hidden,
                    gate: None,
                };
                decode_linear(dev, w, 0..w.rows, input, tokens, out)?;
                Ok(None)
            }
        }
    }

    /// Hands a sublayer output computed apart back: returned (split) or added into `h`.
    pub fn give(&self, dev: &Device, y: DevBuf<f32>) -> Result<Option<DevBuf<f32>>> {
        match *self {
            Io::Split(_) => Ok(Some(y)),
            Io::Fused { h, .. } => {
                kernels::elementwise::AddInPlace::launch(
                    dev,
                    Launch::elementwise(y.len()),
                    h.arg(),
                    y.arg(),
                    i(y.len()),
                )?;
                Ok(None)
            }
        }
    }
}
