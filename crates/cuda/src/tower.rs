//! The vision tower's tensor-core pieces (`kernels/tower.cu`): weights as fp16 (the bf16
//! values times a power of two, exactly), activations as fp16 planes (hi, lo), the GEMM with
//! its bias, GELU and residual fused into the epilogue, and flash attention within one image.
//! `vision.rs` runs the tower on them; each is tested against an f64 reference in
//! `tests/tower.rs`.

use spindle_model::weights::Linear;

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::kernels::tower::{
    TowerAttention, TowerGemmF16, TowerLayerNormF16, TowerRopeSplitF16, TowerSplitF16,
    TowerVTransposeF16,
};
use crate::kernels::{i, Launch, Ptr};
use crate::matrix::{DevFormat, Source};

/// Rows and columns of one GEMM block tile, its pipeline depth and staged row (`tower.cu`).
const GEMM_TILE: usize = 128;
const GEMM_STAGES: usize = 3;
const GEMM_ROW_BYTES: usize = 144;
/// Query rows of one attention block (`n_pad` is a multiple of this), and keys per tile.
pub const ATTENTION_ROWS: usize = 128;
const ATTENTION_KEYS: usize = 64;

/// How finely the tensor-core tower splits its activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TowerPrecision {
    /// fp16 planes of each GEMM input: 2 (hi + lo, within ~2^-22 of the f32 value) or 1.
    pub gemm_planes: usize,
    pub attention: AttentionPlanes,
}

/// Which attention products take the lo planes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPlanes {
    /// Q·Kᵀ and P·V both split (hi·hi + hi·lo + lo·hi).
    Split,
    /// Q·Kᵀ split, P·V on single fp16 planes.
    QkSplit,
    /// Both on single fp16 planes.
    Single,
}

impl TowerPrecision {
    /// Split planes everywhere: the tower's default.
    pub const SPLIT: TowerPrecision = TowerPrecision {
        gemm_planes: 2,
        attention: AttentionPlanes::Split,
    };

    /// Every precision the kernels offer (the split ones first), for comparisons.
    pub const ALL: [TowerPrecision; 4] = [
        TowerPrecision::SPLIT,
        TowerPrecision {
            gemm_planes: 2,
            attention: AttentionPlanes::QkSplit,
        },
        TowerPrecision {
            gemm_planes: 1,
            attention: AttentionPlanes::Split,
        },
        TowerPrecision {
            gemm_planes: 1,
            attention: AttentionPlanes::Single,
        },
    ];

    pub fn describe(&self) -> String {
        let attention = match self.attention {
            AttentionPlanes::Split => "attention split",
            AttentionPlanes::QkSplit => "attention split in q·kᵀ only",
            AttentionPlanes::Single => "attention single fp16",
        };
        format!("GEMM planes {}, {attention}", self.gemm_planes)
    }
}

/// A weight matrix `[rows, cols]` in fp16: the bf16 values times `1/scale` (a power of two),
/// exact but for values below 2^-39 of the largest, which land within 2^-39 of it.
pub struct HalfMatrix {
    pub w: DevBuf<u16>,
    pub rows: usize,
    pub cols: usize,
    /// What the GEMM multiplies its sums by (a power of two).
    pub scale: f32,
    /// Values below fp16's normal range after the scale, rounded to its subnormal grid (each
    /// within 2^-39 of the matrix's largest magnitude; [`bf16_to_f16_scaled`]).
    pub rounded: usize,
}

impl HalfMatrix {
    /// Uploads `linear` as fp16, or says why it cannot be (not bf16, a width the GEMM does not
    /// take, a value that is not finite).
    pub fn upload(dev: &Device, linear: &Linear) -> Result<std::result::Result<Self, String>> {
        let src = Source::of(linear)?;
        if src.fmt != DevFormat::Bf16 {
            return Ok(Err(format!(
                "a [{}, {}] matrix is {}, not bf16",
                src.rows,
                src.cols,
                src.fmt.name()
            )));
        }
        if src.cols % 8 != 0 {
            return Ok(Err(format!(
                "a [{}, {}] matrix: the tensor-core GEMM takes widths that are multiples of 8",
                src.rows, src.cols
            )));
        }
        let bits: Vec<u16> = src
            .codes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        match bf16_to_f16_scaled(&bits) {
            Ok((half, scale, rounded)) => Ok(Ok(HalfMatrix {
                w: dev.upload(&half)?,
                rows: src.rows,
                cols: src.cols,
                scale,
                rounded,
            })),
            Err(why) => Ok(Err(format!("a [{}, {}] matrix {why}", src.rows, src.cols))),
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.rows * self.cols * 2
    }
}

/// bf16 bit patterns → fp16 bit patterns of the values times 2^s, with s chosen so that the
/// largest magnitude lands in [2^14, 2^15); the scale 2^-s that undoes it, and how many values
/// were rounded. Every value of magnitude above 2^-17 of the scaled range converts exactly
/// (bf16's 8 significant bits fit fp16's 11); smaller ones land on fp16's subnormal grid,
/// within 2^-25 of the scaled value, i.e. within 2^-39 of the largest magnitude. Err for a
/// value that is not finite.
pub fn bf16_to_f16_scaled(bits: &[u16]) -> std::result::Result<(Vec<u16>, f32, usize), String> {
    let value = |b: u16| f32::from_bits((b as u32) << 16);
    let mut max = 0.0f32;
    for &b in bits {
        let v = value(b);
        if !v.is_finite() {
            return Err(format!("holds a non-finite value ({v})"));
        }
        max = max.max(v.abs());
    }
    // max = f·2^e with f in [1, 2): 2^(14 − e) puts it in [2^14, 2^15). A bf16 max is at
    // least 2^-133 (subnormal), so s stays within f32's exponents once clamped.
    let e = if max > 0.0 {
        ((max.to_bits() >> 23) & 0xff) as i32 - 127
    } else {
        0
    };
    let s = (14 - e).clamp(-126, 126);
    let up = f32::from_bits(((s + 127) as u32) << 23);
    let down = f32::from_bits(((127 - s) as u32) << 23);
    let mut rounded = 0;
    let out = bits
        .iter()
        .map(|&b| {
            let (h, exact) = f16_nearest(value(b) * up);
            rounded += !exact as usize;
            h
        })
        .collect();
    Ok((out, down, rounded))
}

/// The fp16 bit pattern nearest `x` (finite, |x| < 2^15; ties to even), and whether it is
/// exact: always for a value of at most 11 significant bits in fp16's normal range (every
/// scaled bf16 value there); below it, `x` lands on the nearest multiple of 2^-24.
pub fn f16_nearest(x: f32) -> (u16, bool) {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let a = x.abs();
    let exp = ((bits >> 23) & 0xff) as i32 - 127;
    if a == 0.0 {
        return (sign, true);
    }
    if exp >= -14 {
        let mant = bits & 0x7f_ffff;
        let base = (((exp + 15) as u32) << 10) | (mant >> 13);
        let rest = mant & 0x1fff;
        let up = rest > 0x1000 || (rest == 0x1000 && base & 1 == 1);
        return (sign | (base + up as u32) as u16, rest == 0);
    }
    // Subnormal: a multiple of 2^-24 (1024·2^-24 is the smallest normal, whose bits follow).
    let m = a * 16_777_216.0;
    let r = m.round_ties_even();
    (sign | r as u16, r == m)
}

/// Epilogue activation of [`half_gemm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    None = 0,
    /// gelu_pytorch_tanh (the blocks' MLP).
    GeluTanh = 1,
    /// nn.GELU(), the erf form (the merger).
    GeluErf = 2,
}

/// Where [`half_gemm`] puts its result.
#[derive(Clone, Copy, Debug)]
pub enum GemmOut {
    /// f32 rows `y[m·ldy + n]`, added to what is there with `accumulate`.
    Rows {
        y: Ptr<f32>,
        ldy: usize,
        accumulate: bool,
    },
    /// fp16 planes `[rows][planes][n]` (the next GEMM's input), as many as the input's.
    Planes(Ptr<u16>),
}

/// `out = act(a·Wᵀ + bias)` for `rows` rows: `a` holds `planes` fp16 planes per row
/// (`[rows][planes][w.cols]`); `flag` is set when a value leaves fp16's range.
#[allow(clippy::too_many_arguments)]
pub fn half_gemm(
    dev: &Device,
    w: &HalfMatrix,
    a: Ptr<u16>,
    planes: usize,
    bias: Option<Ptr<f32>>,
    act: Act,
    out: GemmOut,
    rows: usize,
    flag: Ptr<i32>,
) -> Result<()> {
    let kernel = match planes {
        1 => TowerGemmF16::P1,
        2 => TowerGemmF16::P2,
        _ => {
            return Err(CudaError::Unsupported(format!(
                "{planes} activation planes: the tower's GEMM takes 1 or 2"
            )))
        }
    };
    if rows == 0 || w.rows == 0 {
        return Ok(());
    }
    let shared = GEMM_STAGES * (planes + 1) * GEMM_TILE * GEMM_ROW_BYTES;
    if shared > dev.shared_limit(kernel.name()) {
        return Err(CudaError::Unsupported(format!(
            "the tower's GEMM needs {shared} bytes of shared memory per block"
        )));
    }
    let (y, ldy, accumulate, p) = match out {
        GemmOut::Rows { y, ldy, accumulate } => (y, ldy, accumulate, Ptr::null()),
        GemmOut::Planes(p) => (Ptr::null(), 0, false, p),
    };
    kernel.launch(
        dev,
        Launch::new(
            (
                w.rows.div_ceil(GEMM_TILE) as u32,
                rows.div_ceil(GEMM_TILE) as u32,
                1,
            ),
            256,
            shared as u32,
        ),
        w.w.arg(),
        a,
        bias.unwrap_or(Ptr::null()),
        w.scale,
        y,
        i(ldy),
        i(accumulate as usize),
        p,
        i(planes),
        act as i32,
        i(rows),
        i(w.rows),
        i(w.cols),
        flag,
    )
}

/// f32 rows (row r at `x + r·ldx`) → fp16 planes `[rows][planes][cols]`.
#[allow(clippy::too_many_arguments)]
pub fn split_planes(
    dev: &Device,
    x: Ptr<f32>,
    ldx: usize,
    rows: usize,
    cols: usize,
    planes: usize,
    out: Ptr<u16>,
    flag: Ptr<i32>,
) -> Result<()> {
    TowerSplitF16::launch(
        dev,
        Launch::elementwise(rows * cols),
        x,
        i(ldx),
        i(rows),
        i(cols),
        i(planes),
        out,
        flag,
    )
}

/// LayerNorm of `rows` rows of `cols` (weight, bias, eps) into fp16 planes.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_planes(
    dev: &Device,
    x: Ptr<f32>,
    weight: Ptr<f32>,
    bias: Ptr<f32>,
    eps: f32,
    rows: usize,
    cols: usize,
    planes: usize,
    out: Ptr<u16>,
    flag: Ptr<i32>,
) -> Result<()> {
    TowerLayerNormF16::launch(
        dev,
        Launch::new((rows as u32, 1, 1), 256, 0),
        x,
        weight,
        bias,
        i(cols),
        eps,
        i(planes),
        out,
        flag,
    )
}

/// The shapes of one image's attention: `n` rows, `heads` heads of `hd`; q, k and vᵀ are
/// stored padded to `n_pad` rows and `hdp` columns.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n: usize,
    pub heads: usize,
    pub hd: usize,
}

impl AttentionShape {
    pub fn n_pad(&self) -> usize {
        self.n.next_multiple_of(ATTENTION_ROWS)
    }

    pub fn hdp(&self) -> usize {
        self.hd.next_multiple_of(16)
    }

    /// Elements of each of the q, k, vᵀ buffers (two planes).
    pub fn qkv_len(&self) -> usize {
        2 * self.heads * self.n_pad() * self.hdp()
    }

    /// The attention kernel for this head size and precision, or why there is none.
    pub fn kernel(&self, planes: AttentionPlanes) -> std::result::Result<TowerAttention, String> {
        use AttentionPlanes::*;
        if self.hd % 2 != 0 {
            return Err(format!("head size {}: odd", self.hd));
        }
        Ok(match (self.hdp(), planes) {
            (16, Split) => TowerAttention::H16,
            (32, Split) => TowerAttention::H32,
            (48, Split) => TowerAttention::H48,
            (64, Split) => TowerAttention::H64,
            (80, Split) => TowerAttention::H80,
            (32, Single) => TowerAttention::H32_FAST,
            (80, Single) => TowerAttention::H80_FAST,
            (32, QkSplit) => TowerAttention::H32_QK,
            (80, QkSplit) => TowerAttention::H80_QK,
            _ => {
                return Err(format!(
                    "head size {}: the tensor-core attention takes even head sizes up to 80 \
                     (single planes: 17-32 and 65-80)",
                    self.hd
                ))
            }
        })
    }
}

/// qkv `[n, 3·heads·hd]` → q, k (rotated by `cos`/`sin` `[n, hd/2]`) and vᵀ as two fp16 planes
/// each, in [`AttentionShape`]'s padded layouts (the pads must be zero).
#[allow(clippy::too_many_arguments)]
pub fn rope_split(
    dev: &Device,
    shape: AttentionShape,
    qkv: Ptr<f32>,
    cos: Ptr<f32>,
    sin: Ptr<f32>,
    q: Ptr<u16>,
    k: Ptr<u16>,
    vt: Ptr<u16>,
    flag: Ptr<i32>,
) -> Result<()> {
    TowerRopeSplitF16::launch(
        dev,
        Launch::elementwise(shape.n * shape.heads * shape.hd),
        qkv,
        cos,
        sin,
        q,
        k,
        i(shape.n),
        i(shape.n_pad()),
        i(shape.heads),
        i(shape.hd),
        i(shape.hdp()),
        flag,
    )?;
    let width = shape.heads * shape.hd;
    TowerVTransposeF16::launch(
        dev,
        Launch::new(
            (width.div_ceil(32) as u32, shape.n.div_ceil(32) as u32, 1),
            256,
            0,
        ),
        qkv,
        vt,
        i(shape.n),
        i(shape.n_pad()),
        i(shape.heads),
        i(shape.hd),
        i(shape.hdp()),
        flag,
    )
}

/// Bidirectional attention of one image: `o = softmax(q·kᵀ/√hd)·v` per head, written as
/// `out_planes` fp16 planes `[n][out_planes][heads·hd]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    dev: &Device,
    shape: AttentionShape,
    planes: AttentionPlanes,
    q: Ptr<u16>,
    k: Ptr<u16>,
    vt: Ptr<u16>,
    o: Ptr<u16>,
    out_planes: usize,
    flag: Ptr<i32>,
) -> Result<()> {
    let kernel = shape.kernel(planes).map_err(CudaError::Unsupported)?;
    let hdp = shape.hdp();
    let (k_planes, v_planes) = match planes {
        AttentionPlanes::Split => (2, 2),
        AttentionPlanes::QkSplit => (2, 1),
        AttentionPlanes::Single => (1, 1),
    };
    let stage = k_planes * ATTENTION_KEYS * (hdp * 2 + 16) + v_planes * hdp * 144;
    let shared = 2 * stage;
    if shared > dev.shared_limit(kernel.name()) {
        return Err(CudaError::Unsupported(format!(
            "the tower's attention needs {shared} bytes of shared memory per block"
        )));
    }
    let scale_log2 = std::f32::consts::LOG2_E / (shape.hd as f32).sqrt();
    kernel.launch(
        dev,
        Launch::new(
            (
                (shape.n_pad() / ATTENTION_ROWS) as u32,
                shape.heads as u32,
                1,
            ),
            256,
            shared as u32,
        ),
        q,
        k,
        vt,
        o,
        i(shape.n),
        i(shape.n_pad()),
        i(shape.heads),
        i(shape.hd),
        scale_log2,
        i(out_planes),
        flag,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(x: f32) -> u16 {
        (x.to_bits() >> 16) as u16
    }

    fn f16_value(h: u16) -> f32 {
        let (s, e, m) = (h >> 15, ((h >> 10) & 0x1f) as i32, (h & 0x3ff) as f32);
        let mag = if e == 0 {
            m * 2f32.powi(-24)
        } else {
            2f32.powi(e - 15) * (1.0 + m / 1024.0)
        };
        if s == 1 {
            -mag
        } else {
            mag
        }
    }

    #[test]
    fn f16_nearest_is_exact_where_fp16_holds_the_value() {
        assert_eq!(f16_nearest(1.0), (0x3c00, true));
        assert_eq!(f16_nearest(-2.0), (0xc000, true));
        assert_eq!(f16_nearest(65504.0), (0x7bff, true));
        assert_eq!(f16_nearest(2f32.powi(-24)), (0x0001, true));
        assert_eq!(f16_nearest(2f32.powi(-14)), (0x0400, true));
        assert_eq!(f16_nearest(0.0), (0, true));
        assert_eq!(f16_nearest(-0.0), (0x8000, true));
        assert_eq!(f16_nearest(1.0 + 2f32.powi(-11)), (0x3c00, false));
        assert_eq!(f16_nearest(1.0 + 3.0 * 2f32.powi(-11)), (0x3c02, false));
        // Below the subnormal grid: rounded, to even.
        assert_eq!(f16_nearest(2f32.powi(-25)), (0, false));
        assert_eq!(f16_nearest(3.0 * 2f32.powi(-25)), (0x0002, false));
        assert_eq!(f16_nearest(-1.25 * 2f32.powi(-24)), (0x8001, false));
        // Just below the smallest normal rounds up into it.
        assert_eq!(
            f16_nearest(2f32.powi(-14) - 2f32.powi(-26)),
            (0x0400, false)
        );
    }

    #[test]
    fn bf16_matrices_convert_exactly_but_for_tiny_values() {
        let values = [0.5f32, -0.0123, 3.0e-4, 0.0, 1.5, -7.25e-6, 1.0e-30];
        let bits: Vec<u16> = values.iter().map(|&v| bf16(v)).collect();
        let (half, scale, rounded) = bf16_to_f16_scaled(&bits).unwrap();
        assert_eq!(scale, 2f32.powi(-14));
        // 1e-30 is far below 2^-39 of 1.5: it becomes 0, the one value rounded.
        assert_eq!(rounded, 1);
        for (&b, &h) in bits.iter().zip(&half) {
            let v = f32::from_bits((b as u32) << 16);
            let back = f16_value(h) * scale;
            if v.abs() > 1.5 * 2f32.powi(-32) {
                assert_eq!(back, v, "{v} round trip");
            } else {
                assert!((back - v).abs() <= 1.5 * 2f32.powi(-39), "{v} → {back}");
            }
        }
        let err = bf16_to_f16_scaled(&[bf16(f32::INFINITY)]).unwrap_err();
        assert!(err.contains("non-finite"), "{err}");
        // All zeros, and a lone tiny value (scaled up into range, exact).
        let (half, _, rounded) = bf16_to_f16_scaled(&[0, 0x8000]).unwrap();
        assert_eq!((half, rounded), (vec![0, 0x8000], 0));
        let (half, scale, rounded) = bf16_to_f16_scaled(&[bf16(3.0e-20)]).unwrap();
        assert_eq!(rounded, 0);
        assert_eq!(
            f16_value(half[0]) * scale,
            f32::from_bits((bf16(3.0e-20) as u32) << 16)
        );
    }
}
