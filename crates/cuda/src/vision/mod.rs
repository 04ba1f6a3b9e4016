//! The Qwen3.5/3.6 vision tower on the device (shared docs `VISION.md` §3), the CUDA peer of
//! `spindle_cpu::vision`: patch embedding, the learned position table interpolated per image,
//! the pre-norm ViT blocks with 2-D rotary attention bidirectional within the image, and the
//! 2x2 patch merger. Two paths: the tensor-core kernels of `crate::tower` (fp16 weights, exact
//! conversions of the bf16 ones; activations as two fp16 planes; flash attention; `tensor.rs`)
//! wherever the weights and head size allow, else the SIMT f32 GEMM over the checkpoint's
//! matrices with the tiled f32 prefill attention (no causal mask, no gate). What depends only
//! on the image's grid (the interpolation's corners and weights, the rotary cos/sin) is
//! computed on the host exactly as the CPU computes it and uploaded. Rows stay in the
//! 2x2-block-major order of [`PreparedImage`] throughout, so 4 consecutive rows are one merged
//! token.

use std::sync::Mutex;

use spindle_model::mrope::ImageFeatures;
use spindle_model::weights::vision::{BiasedLinear, LayerNormWeights};
use spindle_model::weights::Linear;
use spindle_model::{VisionConfig, VisionWeights};
use spindle_vision::{interpolation, patch_coords, rope_tables, PreparedImage};

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::gemm::simt_gemm;
use crate::kernels::{self, i, Launch, ATTN_PREFILL_KEYS, ATTN_PREFILL_ROWS};
use crate::matrix::DevMatrix;
use crate::tower::{AttentionShape, HalfMatrix, TowerPrecision};

mod tensor;

/// LayerNorm eps of the tower (hard-coded 1e-6 in transformers, §1.1).
const EPS: f32 = 1e-6;

/// A linear layer with its bias on the device; `M` the matrix as the GEMM reads it.
struct GpuBiased<M> {
    weight: M,
    bias: DevBuf<f32>,
}

struct GpuLayerNorm {
    weight: DevBuf<f32>,
    bias: DevBuf<f32>,
}

struct GpuVisionBlock<M> {
    norm1: GpuLayerNorm,
    qkv: GpuBiased<M>,
    proj: GpuBiased<M>,
    norm2: GpuLayerNorm,
    fc1: GpuBiased<M>,
    fc2: GpuBiased<M>,
}

/// The tower's matrices in one form, with the norms beside them.
struct TowerWeights<M> {
    patch_embed: GpuBiased<M>,
    blocks: Vec<GpuVisionBlock<M>>,
    merger_norm: GpuLayerNorm,
    merger_fc1: GpuBiased<M>,
    merger_fc2: GpuBiased<M>,
}

/// Which GEMMs the tower's linears run on.
enum Matrices {
    /// The SIMT f32 GEMM over the checkpoint's matrices (bf16 or q8).
    Simt(TowerWeights<DevMatrix>),
    /// The tensor-core kernels of `tower.rs`: fp16 matrices, activations as fp16 planes.
    Tensor(TowerWeights<HalfMatrix>),
}

/// How a tower runs its linears and attention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TowerPath {
    /// The SIMT f32 GEMM and the tiled f32 attention, and why (the tensor-core path's
    /// refusal, or that it was asked for).
    Simt(String),
    /// The tensor-core kernels at this precision.
    Tensor(TowerPrecision),
}

/// The tower's weights on the device (matrices as [`Matrices`] says, vectors and the position
/// table f32) and its shape.
pub struct GpuVision {
    config: VisionConfig,
    matrices: Matrices,
    pos_embed: DevBuf<f32>,
    /// The tensor-core path's precision (unused on the SIMT path).
    precision: Mutex<TowerPrecision>,
    /// Why the SIMT path (empty on the tensor-core path).
    simt_reason: String,
    bytes: usize,
}

/// One image through the tower with its intermediates (for the fixture tests and
/// `spindle logits`): `[N, D]` after patch + position embedding, `[N, D]` after the last block,
/// and the merged features.
pub struct TowerTrace {
    pub patch_embed: Vec<f32>,
    pub blocks_out: Vec<f32>,
    pub features: ImageFeatures,
}

/// Wall time of each stage of one encoding (the device synchronised after each), for the
/// benchmark.
#[derive(Clone, Debug, Default)]
pub struct TowerTimes {
    /// Host preparation (coordinates, interpolation weights, rotary tables) and uploads.
    pub host_ms: f64,
    /// Patch embedding and position table.
    pub embed_ms: f64,
    /// LayerNorms, rotary, bias and GELU kernels of every block (all but attention and the
    /// GEMMs; on the tensor-core path the bias and GELU are inside the GEMMs).
    pub norms_ms: f64,
    /// The four GEMMs of every block.
    pub gemm_ms: f64,
    /// Attention of every block.
    pub attention_ms: f64,
    /// The merger.
    pub merger_ms: f64,
}

/// Uploads every matrix of `w` through `matrix` (Err(why) when one cannot take that form).
fn upload_weights<M>(
    dev: &Device,
    w: &VisionWeights,
    bytes: &mut usize,
    mut matrix: impl FnMut(&Linear) -> Result<std::result::Result<(M, usize), String>>,
) -> Result<std::result::Result<TowerWeights<M>, String>> {
    let mut biased = |l: &BiasedLinear| -> Result<std::result::Result<GpuBiased<M>, String>> {
        let (weight, size) = match matrix(&l.weight)? {
            Ok(m) => m,
            Err(why) => return Ok(Err(why)),
        };
        *bytes += size + l.bias.len() * 4;
        Ok(Ok(GpuBiased {
            weight,
            bias: dev.upload(&l.bias)?,
        }))
    };
    let norm = |n: &LayerNormWeights| -> Result<GpuLayerNorm> {
        Ok(GpuLayerNorm {
            weight: dev.upload(&n.weight)?,
            bias: dev.upload(&n.bias)?,
        })
    };
    macro_rules! take {
        ($e:expr) => {
            match $e? {
                Ok(v) => v,
                Err(why) => return Ok(Err(why)),
            }
        };
    }
    let patch_embed = take!(biased(&w.patch_embed));
    let mut blocks = Vec::with_capacity(w.blocks.len());
    for b in &w.blocks {
        blocks.push(GpuVisionBlock {
            norm1: norm(&b.norm1)?,
            qkv: take!(biased(&b.qkv)),
            proj: take!(biased(&b.proj)),
            norm2: norm(&b.norm2)?,
            fc1: take!(biased(&b.fc1)),
            fc2: take!(biased(&b.fc2)),
        });
    }
    Ok(Ok(TowerWeights {
        patch_embed,
        blocks,
        merger_norm: norm(&w.merger_norm)?,
        merger_fc1: take!(biased(&w.merger_fc1)),
        merger_fc2: take!(biased(&w.merger_fc2)),
    }))
}

impl GpuVision {
    /// Uploads `w` (shaped by `config`) for the tensor-core path when the device, the head
    /// size and every matrix allow it (bf16 values that fp16 holds exactly after a power-of-two
    /// scale), else for the SIMT path, saying why in the log. `SPINDLE_VISION_GEMM=simt` asks
    /// for the SIMT path.
    pub fn upload(dev: &Device, w: &VisionWeights, config: &VisionConfig) -> Result<Self> {
        let asked_simt = std::env::var("SPINDLE_VISION_GEMM").is_ok_and(|v| v == "simt");
        let why = if asked_simt {
            "SPINDLE_VISION_GEMM=simt".to_owned()
        } else {
            match Self::upload_tensor(dev, w, config)? {
                Ok(tower) => return Ok(tower),
                Err(why) => why,
            }
        };
        tracing::info!(reason = %why, "vision tower on the SIMT f32 GEMM");
        Self::upload_simt(dev, w, config, why)
    }

    /// Uploads `w` for the SIMT f32 path (`reason`: why, for [`GpuVision::path`]).
    pub fn upload_simt(
        dev: &Device,
        w: &VisionWeights,
        config: &VisionConfig,
        reason: String,
    ) -> Result<Self> {
        let mut bytes = 0;
        let weights = upload_weights(dev, w, &mut bytes, |l| {
            let m = DevMatrix::upload(dev, l)?;
            let size = m.size_bytes();
            Ok(Ok((m, size)))
        })?
        .map_err(CudaError::Unsupported)?;
        Self::finish(dev, w, config, Matrices::Simt(weights), bytes, reason)
    }

    /// Uploads `w` for the tensor-core path, or says why it cannot take it.
    pub fn upload_tensor(
        dev: &Device,
        w: &VisionWeights,
        config: &VisionConfig,
    ) -> Result<std::result::Result<Self, String>> {
        if !dev.tensor_cores() {
            return Ok(Err("the device has no tensor cores (sm_80+)".into()));
        }
        let shape = AttentionShape {
            n: 1,
            heads: config.heads,
            hd: config.head_dim(),
        };
        if let Err(why) = shape.kernel(TowerPrecision::SPLIT.attention) {
            return Ok(Err(why));
        }
        let (mut bytes, mut rounded) = (0, 0);
        let weights = upload_weights(dev, w, &mut bytes, |l| {
            Ok(HalfMatrix::upload(dev, l)?.map(|m| {
                rounded += m.rounded;
                let size = m.size_bytes();
                (m, size)
            }))
        })?;
        if rounded > 0 {
            tracing::info!(
                rounded,
                "vision tower in fp16: weights below 2^-39 of their matrix's largest rounded"
            );
        }
        match weights {
            Ok(weights) => Ok(Ok(Self::finish(
                dev,
                w,
                config,
                Matrices::Tensor(weights),
                bytes,
                String::new(),
            )?)),
            Err(why) => Ok(Err(why)),
        }
    }

    fn finish(
        dev: &Device,
        w: &VisionWeights,
        config: &VisionConfig,
        matrices: Matrices,
        mut bytes: usize,
        simt_reason: String,
    ) -> Result<Self> {
        let d = config.hidden;
        bytes += w.pos_embed.len() * 4 + (2 + 4 * w.blocks.len()) * d * 4;
        Ok(GpuVision {
            config: config.clone(),
            matrices,
            pos_embed: dev.upload(&w.pos_embed)?,
            precision: Mutex::new(TowerPrecision::SPLIT),
            simt_reason,
            bytes,
        })
    }

    /// Device bytes of the weights.
    pub fn size_bytes(&self) -> usize {
        self.bytes
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// How this tower runs.
    pub fn path(&self) -> TowerPath {
        match self.matrices {
            Matrices::Simt(_) => TowerPath::Simt(self.simt_reason.clone()),
            Matrices::Tensor(_) => TowerPath::Tensor(self.precision()),
        }
    }

    fn precision(&self) -> TowerPrecision {
        *self.precision.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the tensor-core path's precision (for comparisons; [`TowerPrecision::SPLIT`] is
    /// the default). Refused on the SIMT path and for a precision without a kernel for this
    /// head size.
    pub fn set_precision(&self, precision: TowerPrecision) -> Result<()> {
        if let Matrices::Simt(_) = self.matrices {
            return Err(CudaError::Unsupported(format!(
                "the vision tower runs on the SIMT GEMM ({}): it has no precision to set",
                self.simt_reason
            )));
        }
        let shape = AttentionShape {
            n: 1,
            heads: self.config.heads,
            hd: self.config.head_dim(),
        };
        shape
            .kernel(precision.attention)
            .map_err(CudaError::Unsupported)?;
        if !(1..=2).contains(&precision.gemm_planes) {
            return Err(CudaError::Unsupported(format!(
                "{} GEMM planes: 1 or 2",
                precision.gemm_planes
            )));
        }
        *self.precision.lock().unwrap_or_else(|e| e.into_inner()) = precision;
        Ok(())
    }

    /// Checks that `image` fits the tower (`VisionConfig::fits`, as the CPU checks) and that
    /// its sizes stay within the kernels' 32-bit indices (the head size is checked where the
    /// attention runs).
    pub fn check_image(&self, image: &PreparedImage, index: usize) -> Result<()> {
        let config = &self.config;
        let g = image.grid;
        let bad = |why: String| Err(CudaError::Image(format!("image {index}: {why}")));
        if let Err(why) = config.fits(image) {
            return bad(why);
        }
        if g.patches() > i32::MAX as usize / (3 * config.hidden.max(config.intermediate)) {
            return bad(format!(
                "{} patches overflow the kernels' 32-bit sizes",
                g.patches()
            ));
        }
        Ok(())
    }

    /// The tower's output for `image` (which passed [`GpuVision::check_image`]).
    pub fn encode(&self, dev: &Device, image: &PreparedImage) -> Result<ImageFeatures> {
        Ok(self.run(dev, image, false, None)?.features)
    }

    /// [`GpuVision::encode`] keeping the intermediates.
    pub fn trace(&self, dev: &Device, image: &PreparedImage) -> Result<TowerTrace> {
        self.run(dev, image, true, None)
    }

    /// [`GpuVision::encode`] timing each stage (the device synchronised between stages, so the
    /// total is a little above an untimed encoding's).
    pub fn encode_timed(
        &self,
        dev: &Device,
        image: &PreparedImage,
    ) -> Result<(ImageFeatures, TowerTimes)> {
        let mut times = TowerTimes::default();
        let trace = self.run(dev, image, false, Some(&mut times))?;
        Ok((trace.features, times))
    }

    fn run(
        &self,
        dev: &Device,
        image: &PreparedImage,
        keep: bool,
        times: Option<&mut TowerTimes>,
    ) -> Result<TowerTrace> {
        match &self.matrices {
            Matrices::Simt(w) => self.run_simt(w, dev, image, keep, times),
            Matrices::Tensor(w) => self.run_tensor(w, dev, image, keep, times, self.precision()),
        }
    }

    fn run_simt(
        &self,
        w: &TowerWeights<DevMatrix>,
        dev: &Device,
        image: &PreparedImage,
        keep: bool,
        mut times: Option<&mut TowerTimes>,
    ) -> Result<TowerTrace> {
        let config = &self.config;
        let (t, gh, gw) = (image.grid.t, image.grid.h, image.grid.w);
        let n = t * gh * gw;
        let (d, heads, hd) = (config.hidden, config.heads, config.head_dim());
        let inter = config.intermediate;
        let m2 = config.merge * config.merge;
        let mut clock = Clock::new(dev, times.is_some());

        let GridTables {
            pixels,
            index,
            weights,
            cos,
            sin,
        } = GridTables::upload(dev, config, image)?;
        clock.lap(&mut times, |t| &mut t.host_ms)?;

        // §3.1-3.2: patch embedding, plus the interpolated position table.
        let h = dev.zeros::<f32>(n * d)?;
        self.biased(dev, &w.patch_embed, pixels.arg(), config.patch_row(), &h, n)?;
        kernels::vision::VisionPosEmbedAdd::launch(
            dev,
            Launch::elementwise(n * d),
            h.arg(),
            self.pos_embed.arg(),
            index.arg(),
            weights.arg(),
            i(n),
            i(d),
        )?;
        let patch_embed = if keep {
            dev.download(&h, 0, n * d)?
        } else {
            Vec::new()
        };
        clock.lap(&mut times, |t| &mut t.embed_ms)?;

        // §3.4: the blocks.
        let x = dev.zeros::<f32>(n * d)?;
        let qkv = dev.zeros::<f32>(n * 3 * d)?;
        let q = dev.zeros::<f32>(n * d)?;
        let k = dev.zeros::<f32>(n * d)?;
        let v = dev.zeros::<f32>(n * d)?;
        let o = dev.zeros::<f32>(n * d)?;
        let up = dev.zeros::<f32>(n * inter)?;
        for block in &w.blocks {
            layer_norm(dev, &h, &x, &block.norm1, n, d)?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            self.gemm(
                dev,
                &block.qkv.weight,
                x.arg(),
                d,
                qkv.arg(),
                3 * d,
                n,
                false,
            )?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            bias_add(dev, &qkv, &block.qkv.bias, n, 3 * d)?;
            kernels::vision::VisionRopeSplit::launch(
                dev,
                Launch::elementwise(n * d),
                qkv.arg(),
                cos.arg(),
                sin.arg(),
                q.arg(),
                k.arg(),
                v.arg(),
                i(n),
                i(heads),
                i(hd),
            )?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            attend(dev, &q, &k, &v, &o, n, heads, hd)?;
            clock.lap(&mut times, |t| &mut t.attention_ms)?;
            // h += proj(o) + b: the GEMM accumulates into h, then the bias.
            self.gemm(dev, &block.proj.weight, o.arg(), d, h.arg(), d, n, true)?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            bias_add(dev, &h, &block.proj.bias, n, d)?;
            layer_norm(dev, &h, &x, &block.norm2, n, d)?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            self.gemm(
                dev,
                &block.fc1.weight,
                x.arg(),
                d,
                up.arg(),
                inter,
                n,
                false,
            )?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            bias_gelu(dev, &up, &block.fc1.bias, n, inter, false)?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            self.gemm(dev, &block.fc2.weight, up.arg(), inter, h.arg(), d, n, true)?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            bias_add(dev, &h, &block.fc2.bias, n, d)?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
        }
        let blocks_out = if keep {
            dev.download(&h, 0, n * d)?
        } else {
            Vec::new()
        };

        // §3.5: LayerNorm over D, 4 consecutive rows grouped (rows of 4D), fc1, erf-GELU, fc2.
        layer_norm(dev, &h, &x, &w.merger_norm, n, d)?;
        let tokens = n / m2;
        let wide = d * m2;
        let y = dev.zeros::<f32>(tokens * wide)?;
        self.gemm(
            dev,
            &w.merger_fc1.weight,
            x.arg(),
            wide,
            y.arg(),
            wide,
            tokens,
            false,
        )?;
        bias_gelu(dev, &y, &w.merger_fc1.bias, tokens, wide, true)?;
        let out = dev.zeros::<f32>(tokens * config.out_hidden)?;
        self.biased(dev, &w.merger_fc2, y.arg(), wide, &out, tokens)?;
        let rows = dev.download(&out, 0, tokens * config.out_hidden)?;
        clock.lap(&mut times, |t| &mut t.merger_ms)?;
        Ok(TowerTrace {
            patch_embed,
            blocks_out,
            features: ImageFeatures::merged(rows, config.out_hidden, image.grid, config.merge),
        })
    }

    /// `y (+)= x·Wᵀ` through the SIMT f32 GEMM (the SIMT path). Not the text model's
    /// tensor-core GEMM: on the vision fixtures its results (three bf16 planes of each
    /// activation, summed by the tensor cores' own accumulation) were 4x further from the
    /// float64 reference after the patch embedding (1.1e-5 against 2.9e-6), and the text model
    /// amplified that to 7.5e-4 in the logits (5.3e-5 with this GEMM); `crate::tower` adds each
    /// k-step's products in f32 instead.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        dev: &Device,
        w: &DevMatrix,
        x: kernels::Ptr<f32>,
        ldx: usize,
        y: kernels::Ptr<f32>,
        ldy: usize,
        tokens: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (row0, part) in &w.parts {
            simt_gemm(dev, part, x, ldx, y.at(*row0), ldy, tokens, accumulate)?;
        }
        Ok(())
    }

    /// `y = x·Wᵀ + b` for `rows` rows of `cols`.
    fn biased(
        &self,
        dev: &Device,
        layer: &GpuBiased<DevMatrix>,
        x: kernels::Ptr<f32>,
        cols: usize,
        y: &DevBuf<f32>,
        rows: usize,
    ) -> Result<()> {
        let out = layer.weight.rows;
        self.gemm(dev, &layer.weight, x, cols, y.arg(), out, rows, false)?;
        bias_add(dev, y, &layer.bias, rows, out)
    }
}

/// What depends on the image's grid only (computed on the host as the CPU computes it), and
/// its pixels, on the device.
struct GridTables {
    pixels: DevBuf<f32>,
    /// Interpolation corners and weights of the position table (4 per patch).
    index: DevBuf<i32>,
    weights: DevBuf<f64>,
    /// Rotary tables `[n, hd/2]`.
    cos: DevBuf<f32>,
    sin: DevBuf<f32>,
}

impl GridTables {
    fn upload(dev: &Device, config: &VisionConfig, image: &PreparedImage) -> Result<Self> {
        let (t, gh, gw) = (image.grid.t, image.grid.h, image.grid.w);
        let coords = patch_coords(gh, gw, config.merge, t);
        let (index, weights) = interpolation(config.pos_side, gh, gw, &coords);
        let (cos, sin) = rope_tables(config.head_dim(), config.rope_theta, &coords);
        Ok(GridTables {
            pixels: dev.upload(&image.pixels)?,
            index: dev.upload(&index)?,
            weights: dev.upload(&weights)?,
            cos: dev.upload(&cos)?,
            sin: dev.upload(&sin)?,
        })
    }
}

/// Times stages when asked: synchronises and adds the time since the last lap.
struct Clock<'d> {
    dev: &'d Device,
    on: bool,
    last: std::time::Instant,
}

impl<'d> Clock<'d> {
    fn new(dev: &'d Device, on: bool) -> Self {
        Clock {
            dev,
            on,
            last: std::time::Instant::now(),
        }
    }

    fn lap(
        &mut self,
        times: &mut Option<&mut TowerTimes>,
        stage: impl FnOnce(&mut TowerTimes) -> &mut f64,
    ) -> Result<()> {
        if let (true, Some(t)) = (self.on, times.as_deref_mut()) {
            self.dev.sync()?;
            let now = std::time::Instant::now();
            *stage(t) += (now - self.last).as_secs_f64() * 1e3;
            self.last = now;
        }
        Ok(())
    }
}

fn layer_norm(
    dev: &Device,
    x: &DevBuf<f32>,
    y: &DevBuf<f32>,
    w: &GpuLayerNorm,
    rows: usize,
    cols: usize,
) -> Result<()> {
    kernels::vision::LayerNormRows::launch(
        dev,
        Launch::new((rows as u32, 1, 1), 256, 0),
        x.arg(),
        y.arg(),
        w.weight.arg(),
        w.bias.arg(),
        i(cols),
        EPS,
    )
}

fn bias_add(
    dev: &Device,
    y: &DevBuf<f32>,
    b: &DevBuf<f32>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    kernels::vision::BiasAddRows::launch(
        dev,
        Launch::elementwise(rows * cols),
        y.arg(),
        b.arg(),
        i(rows),
        i(cols),
    )
}

fn bias_gelu(
    dev: &Device,
    y: &DevBuf<f32>,
    b: &DevBuf<f32>,
    rows: usize,
    cols: usize,
    erf_form: bool,
) -> Result<()> {
    kernels::vision::BiasGeluRows::launch(
        dev,
        Launch::elementwise(rows * cols),
        y.arg(),
        b.arg(),
        i(rows),
        i(cols),
        erf_form as i32,
    )
}

/// Bidirectional attention of the image's `n` rows: `o = softmax(q·kᵀ/√hd)·v` per head, through
/// the tiled prefill kernel with every key visible and no gate (q, k, v, o `[n, heads, hd]`).
fn attend(
    dev: &Device,
    q: &DevBuf<f32>,
    k: &DevBuf<f32>,
    v: &DevBuf<f32>,
    o: &DevBuf<f32>,
    n: usize,
    heads: usize,
    hd: usize,
) -> Result<()> {
    let shared = 4
        * ((ATTN_PREFILL_ROWS + 2 * ATTN_PREFILL_KEYS) * (hd + 4)
            + ATTN_PREFILL_ROWS * (ATTN_PREFILL_KEYS + 1));
    let name = kernels::attention::AttentionPrefillTiled::NAME;
    // The kernel reads float4 rows and holds at most 256 columns per row.
    if hd % 4 != 0 || hd > 256 || shared > dev.shared_limit(name) {
        return Err(CudaError::Unsupported(format!(
            "vision head size {hd}: the attention kernel takes multiples of 4 up to 256"
        )));
    }
    kernels::attention::AttentionPrefillTiled::launch(
        dev,
        Launch::new(
            (n.div_ceil(ATTN_PREFILL_ROWS) as u32, heads as u32, 1),
            256,
            shared as u32,
        ),
        q.arg(),
        kernels::Ptr::null(),
        k.arg(),
        v.arg(),
        kernels::Ptr::null(),
        o.arg(),
        i(n),
        i(heads),
        i(heads),
        i(hd),
        0,
        0,
        1.0 / (hd as f32).sqrt(),
    )
}
