//! Prefill GEMMs: the tensor-core GEMM (`mma.sync`, dense or grouped by expert, on
//! activations prepared by [`GemmActs`]) and the SIMT f32 GEMM it falls back to.

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::kernels::gemm::{GemmSimt, GemmTensor};
use crate::kernels::{
    self, i, p, Launch, Ptr, TENSOR_GEMM_ROWS, TENSOR_GEMM_SCALE_GROUPS, TENSOR_GEMM_SKINNY_TOKENS,
    TENSOR_GEMM_STAGES, TENSOR_GEMM_TOKENS,
};
use crate::matrix::{DevFormat, DevPart, DeviceLayout};
use crate::matvec::ggml_only_decode;

/// Whether the tensor-core GEMM ([`tensor_gemm`]) takes a matrix of `cols` columns in `fmt`
/// (FP8: on sm_89 and later, the e4m3 `mma`).
pub fn tensor_gemm_ok(dev: &Device, fmt: DevFormat, cols: usize) -> bool {
    let Ok(kernel) = tensor_gemm_kernel(fmt) else {
        return false;
    };
    dev.tensor_cores()
        && (fmt != DevFormat::Fp8 || dev.fp8_tensor_cores())
        && cols % fmt.tensor_k() == 0
        && tensor_gemm_shared(fmt, TENSOR_GEMM_TOKENS) <= dev.shared_limit(kernel.name())
}

/// Activations in the form the tensor-core GEMM reads: for bf16 weights the f32 values split
/// into three bf16 planes (hi + mid + lo, within ~2^-24 of each value); for Q8/Q4 weights
/// int8 codes and f32 scales per group of 32, quantized exactly as the CPU engine does; for
/// FP8 weights e4m3 codes with an f32 scale per token and group of 128 (the dynamic scheme),
/// stored once per group of 32.
pub struct GemmActs {
    /// bf16 rows `[rows, 3·cols]` (hi, mid, lo), or i8 / e4m3 codes `[rows, cols]`.
    a: DevBuf<u8>,
    /// f32 scales `[rows, cols/32]` (Q8/Q4/FP8), or nothing.
    aux: Option<DevBuf<u8>>,
    /// [`DevFormat::acts_kind`] of the weights they were prepared for.
    kind: usize,
    cols: usize,
}

impl GemmActs {
    /// Prepares `rows` rows of `cols` from `x` (row r at `r·ldx`) for weights in `fmt`; with
    /// `up = Some(u)` each row is first the SwiGLU `silu(x[c])·x[u + c]`.
    pub fn prepare(
        dev: &Device,
        fmt: DevFormat,
        x: Ptr<f32>,
        ldx: usize,
        up: Option<usize>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let up = up.map_or(-1, |u| u as i32);
        let kind = fmt.acts_kind();
        if fmt == DevFormat::Fp8 {
            let a = dev.scratch::<u8>(rows * cols)?;
            let aux = dev.scratch::<u8>(rows * cols / 32 * 4)?;
            // One warp per group of 128.
            kernels::fp8::GemmFp8QuantizeActs::launch(
                dev,
                Launch::elementwise(rows * cols.div_ceil(128) * 32),
                x,
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
                kind,
                cols,
            })
        } else if fmt.int8() {
            let a = dev.scratch::<u8>(rows * cols)?;
            let aux = dev.scratch::<u8>(rows * cols / 32 * 4)?;
            // One warp per group of 32.
            kernels::gemm::GemmTensorQuantizeActs::launch(
                dev,
                Launch::elementwise(rows * cols),
                x,
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
                kind,
                cols,
            })
        } else {
            let a = dev.scratch::<u8>(rows * 3 * cols * 2)?;
            kernels::gemm::GemmTensorSplitActsBf16::launch(
                dev,
                Launch::elementwise(rows * cols),
                x,
                i(ldx),
                up,
                i(rows),
                i(cols),
                p(a.ptr()),
            )?;
            Ok(GemmActs {
                a,
                aux: None,
                kind,
                cols,
            })
        }
    }
}

impl GemmActs {
    /// The int8 codes `[rows, cols]` and f32 scales `[rows, cols/32]` (Q8/Q4 preparations).
    pub(crate) fn int8_rows(&self) -> Option<(Ptr<u8>, Ptr<u8>)> {
        let aux = self.aux.as_ref()?;
        (self.kind == 1).then(|| (self.a.arg(), aux.arg()))
    }
}

/// Which rows a tensor-core GEMM computes.
#[derive(Clone, Copy)]
pub enum GemmRows {
    /// Rows `0..tokens` of the activations into rows `0..tokens` of y.
    Dense(usize),
    /// MoE experts (`moe_group_by_expert`): `tiles` (expert, first, count) per tile of at most
    /// `tile` pairs ([`GROUP_TILE`] or [`SKINNY_TILE`]) over `order` (pair ids sorted by
    /// expert), at most `max_tiles`; activation row = pair / `a_div`, output row = pair;
    /// expert e's weights are rows `e·rows .. (e+1)·rows` of the part.
    Grouped {
        tiles: Ptr<i32>,
        order: Ptr<i32>,
        max_tiles: usize,
        a_div: usize,
        rows: usize,
        tile: usize,
    },
}

/// The rows of one grouped-GEMM tile (`moe_group_by_expert`).
pub const GROUP_TILE: usize = TENSOR_GEMM_TOKENS;

/// The rows of one tile of the skinny GEMM kernels (the same sums as [`GROUP_TILE`]'s).
pub const SKINNY_TILE: usize = TENSOR_GEMM_SKINNY_TOKENS;

/// Whether a dense GEMM of `tokens` rows runs on skinny tiles: up to two of them, where a wide
/// tile would be mostly padding (a short prompt chunk: the tokens after a cached prefix).
pub fn skinny_dense(dev: &Device, tokens: usize) -> bool {
    dev.skinny_gemm() && tokens <= 2 * SKINNY_TILE
}

/// The tile size the routed experts of `pairs` (token, expert) pairs over `experts` experts are
/// grouped in: skinny tiles while the experts see at most 4 pairs each on average, where a
/// 64-row tile would be mostly padding.
pub fn grouped_tile(dev: &Device, pairs: usize, experts: usize) -> usize {
    if dev.skinny_gemm() && pairs <= 4 * experts {
        SKINNY_TILE
    } else {
        GROUP_TILE
    }
}

fn tensor_gemm_kernel(fmt: DevFormat) -> Result<GemmTensor> {
    Ok(match fmt {
        DevFormat::Bf16 => GemmTensor::BF16,
        DevFormat::Q8 => GemmTensor::Q8,
        DevFormat::Q4 => GemmTensor::Q4,
        DevFormat::Fp8 => GemmTensor::FP8,
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => return Err(ggml_only_decode(fmt)),
    })
}

fn skinny_gemm_kernel(fmt: DevFormat) -> Result<GemmTensor> {
    Ok(match fmt {
        DevFormat::Bf16 => GemmTensor::SKINNY_BF16,
        DevFormat::Q8 => GemmTensor::SKINNY_Q8,
        DevFormat::Q4 => GemmTensor::SKINNY_Q4,
        DevFormat::Fp8 => GemmTensor::SKINNY_FP8,
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => return Err(ggml_only_decode(fmt)),
    })
}

/// Dynamic shared memory of one tensor-core GEMM block of `tokens`-row tiles: 4 stages of
/// staged A and B rows (`TgLayout` in gemm.cu), then for Q8/Q4/FP8 two blocks of scales
/// (`TgScales`).
fn tensor_gemm_shared(fmt: DevFormat, tokens: usize) -> usize {
    let (a_row, planes, b_row, weight_scale) = match fmt {
        DevFormat::Bf16 => (80, 3, 80, 0),
        DevFormat::Q8 => (48, 1, 48, 2),
        DevFormat::Fp8 => (48, 1, 48, 4),
        DevFormat::Q4 => (48, 1, 16, 2),
        // Not taken (tensor_gemm_kernel refuses them).
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => (0, 0, 0, 0),
    };
    let stages = TENSOR_GEMM_STAGES * (tokens * a_row * planes + TENSOR_GEMM_ROWS * b_row);
    let scales = match weight_scale {
        0 => 0,
        bytes => 2 * TENSOR_GEMM_SCALE_GROUPS * (TENSOR_GEMM_ROWS * bytes + tokens * 4),
    };
    stages + scales
}

/// `y[row·ldy + n] (+)= Σ_k acts[row, k]·W[n, k]` on the tensor cores (see gemm.cu).
pub fn tensor_gemm(
    dev: &Device,
    w: &DevPart,
    acts: &GemmActs,
    y: Ptr<f32>,
    ldy: usize,
    accumulate: bool,
    rows: GemmRows,
) -> Result<()> {
    assert_eq!(
        acts.kind,
        w.fmt.acts_kind(),
        "activations prepared for another format"
    );
    assert_eq!(acts.cols, w.cols, "activations of another width");
    let (n, m, m_tiles, tiles, order, a_div, tile) = match rows {
        GemmRows::Dense(tokens) => {
            let tile = if skinny_dense(dev, tokens) {
                SKINNY_TILE
            } else {
                TENSOR_GEMM_TOKENS
            };
            let (null, m_tiles) = (Ptr::null(), tokens.div_ceil(tile));
            (w.rows, tokens, m_tiles, null, null, 1, tile)
        }
        GemmRows::Grouped {
            tiles,
            order,
            max_tiles,
            a_div,
            rows,
            tile,
        } => (rows, 0, max_tiles, tiles, order, a_div, tile),
    };
    if n == 0 || m_tiles == 0 {
        return Ok(());
    }
    let launch = Launch::new(
        (n.div_ceil(TENSOR_GEMM_ROWS) as u32, m_tiles as u32, 1),
        256,
        tensor_gemm_shared(w.fmt, tile) as u32,
    );
    let kernel = match tile {
        SKINNY_TILE => skinny_gemm_kernel(w.fmt)?,
        _ => tensor_gemm_kernel(w.fmt)?,
    };
    kernel.launch(
        dev,
        launch,
        w.codes.arg(),
        w.scales.arg(),
        acts.a.arg(),
        p(acts.aux.as_ref().map_or(0, DevBuf::ptr)),
        y,
        i(ldy),
        i(accumulate as usize),
        i(n),
        i(w.cols),
        i(m),
        tiles,
        order,
        i(a_div),
    )
}

/// `y[t·ldy + r] (+)= Σ_c W[r, c]·x[t·ldx + c]` through the SIMT f32 GEMM (64×64 tiles).
#[allow(clippy::too_many_arguments)]
pub fn simt_gemm(
    dev: &Device,
    w: &DevPart,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    let grid = (w.rows.div_ceil(64) as u32, tokens.div_ceil(64) as u32, 1);
    gemm_kernel(w.fmt)?.launch(
        dev,
        Launch::new(grid, 256, 0),
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
    )
}

fn gemm_kernel(fmt: DevFormat) -> Result<GemmSimt> {
    Ok(match fmt {
        DevFormat::Bf16 => GemmSimt::BF16,
        DevFormat::Q8 => GemmSimt::Q8,
        DevFormat::Q4 => GemmSimt::Q4,
        DevFormat::Fp8 => GemmSimt::FP8,
        DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => return Err(ggml_only_decode(fmt)),
    })
}
