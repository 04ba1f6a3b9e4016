//! The tower on the tensor cores (`crate::tower`): the same steps as the SIMT path, with each
//! GEMM input as fp16 planes written by the step before it (LayerNorm, attention, the fc1
//! epilogue) and bias, GELU and the residual add inside the GEMMs.

use spindle_model::mrope::ImageFeatures;
use spindle_vision::PreparedImage;

use super::{layer_norm, Clock, GpuVision, GridTables, TowerTimes, TowerTrace, TowerWeights, EPS};
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::kernels::{self, i, Launch};
use crate::tower::{
    attention, half_gemm, layer_norm_planes, rope_split, split_planes, Act, AttentionShape,
    GemmOut, HalfMatrix, TowerPrecision,
};

impl GpuVision {
    pub(super) fn run_tensor(
        &self,
        w: &TowerWeights<HalfMatrix>,
        dev: &Device,
        image: &PreparedImage,
        keep: bool,
        mut times: Option<&mut TowerTimes>,
        precision: TowerPrecision,
    ) -> Result<TowerTrace> {
        let config = &self.config;
        let (t, gh, gw) = (image.grid.t, image.grid.h, image.grid.w);
        let n = t * gh * gw;
        let (d, inter) = (config.hidden, config.intermediate);
        let m2 = config.merge * config.merge;
        let planes = precision.gemm_planes;
        let shape = AttentionShape {
            n,
            heads: config.heads,
            hd: config.head_dim(),
        };
        let mut clock = Clock::new(dev, times.is_some());

        let grid = GridTables::upload(dev, config, image)?;
        // Set by any kernel that meets a value outside fp16's range.
        let flag = dev.zeros::<i32>(1)?;
        let f = flag.arg();
        clock.lap(&mut times, |t| &mut t.host_ms)?;

        // §3.1-3.2: patch embedding, plus the interpolated position table.
        let row = config.patch_row();
        let pix = dev.zeros::<u16>(n * planes * row)?;
        split_planes(dev, grid.pixels.arg(), row, n, row, planes, pix.arg(), f)?;
        let h = dev.zeros::<f32>(n * d)?;
        let rows_of =
            |y: &crate::device::DevBuf<f32>, ldy: usize, accumulate: bool| GemmOut::Rows {
                y: y.arg(),
                ldy,
                accumulate,
            };
        let pe = &w.patch_embed;
        half_gemm(
            dev,
            &pe.weight,
            pix.arg(),
            planes,
            Some(pe.bias.arg()),
            Act::None,
            rows_of(&h, d, false),
            n,
            f,
        )?;
        kernels::vision::VisionPosEmbedAdd::launch(
            dev,
            Launch::elementwise(n * d),
            h.arg(),
            self.pos_embed.arg(),
            grid.index.arg(),
            grid.weights.arg(),
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
        let x = dev.zeros::<u16>(n * planes * d)?;
        let qkv = dev.zeros::<f32>(n * 3 * d)?;
        // Padded to whole tiles; the pads stay zero.
        let q = dev.zeros::<u16>(shape.qkv_len())?;
        let k = dev.zeros::<u16>(shape.qkv_len())?;
        let vt = dev.zeros::<u16>(shape.qkv_len())?;
        let o = dev.zeros::<u16>(n * planes * d)?;
        let up = dev.zeros::<u16>(n * planes * inter)?;
        for block in &w.blocks {
            let norm = &block.norm1;
            layer_norm_planes(
                dev,
                h.arg(),
                norm.weight.arg(),
                norm.bias.arg(),
                EPS,
                n,
                d,
                planes,
                x.arg(),
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            half_gemm(
                dev,
                &block.qkv.weight,
                x.arg(),
                planes,
                Some(block.qkv.bias.arg()),
                Act::None,
                rows_of(&qkv, 3 * d, false),
                n,
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            rope_split(
                dev,
                shape,
                qkv.arg(),
                grid.cos.arg(),
                grid.sin.arg(),
                q.arg(),
                k.arg(),
                vt.arg(),
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            attention(
                dev,
                shape,
                precision.attention,
                q.arg(),
                k.arg(),
                vt.arg(),
                o.arg(),
                planes,
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.attention_ms)?;
            // h += proj(o) + b.
            half_gemm(
                dev,
                &block.proj.weight,
                o.arg(),
                planes,
                Some(block.proj.bias.arg()),
                Act::None,
                rows_of(&h, d, true),
                n,
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
            let norm = &block.norm2;
            layer_norm_planes(
                dev,
                h.arg(),
                norm.weight.arg(),
                norm.bias.arg(),
                EPS,
                n,
                d,
                planes,
                x.arg(),
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.norms_ms)?;
            half_gemm(
                dev,
                &block.fc1.weight,
                x.arg(),
                planes,
                Some(block.fc1.bias.arg()),
                Act::GeluTanh,
                GemmOut::Planes(up.arg()),
                n,
                f,
            )?;
            half_gemm(
                dev,
                &block.fc2.weight,
                up.arg(),
                planes,
                Some(block.fc2.bias.arg()),
                Act::None,
                rows_of(&h, d, true),
                n,
                f,
            )?;
            clock.lap(&mut times, |t| &mut t.gemm_ms)?;
        }
        let blocks_out = if keep {
            dev.download(&h, 0, n * d)?
        } else {
            Vec::new()
        };

        // §3.5: LayerNorm over D, 4 consecutive rows grouped (rows of 4D), fc1, erf-GELU, fc2.
        let normed = dev.zeros::<f32>(n * d)?;
        layer_norm(dev, &h, &normed, &w.merger_norm, n, d)?;
        let tokens = n / m2;
        let wide = d * m2;
        let merged = dev.zeros::<u16>(tokens * planes * wide)?;
        split_planes(
            dev,
            normed.arg(),
            wide,
            tokens,
            wide,
            planes,
            merged.arg(),
            f,
        )?;
        let hidden = dev.zeros::<u16>(tokens * planes * wide)?;
        half_gemm(
            dev,
            &w.merger_fc1.weight,
            merged.arg(),
            planes,
            Some(w.merger_fc1.bias.arg()),
            Act::GeluErf,
            GemmOut::Planes(hidden.arg()),
            tokens,
            f,
        )?;
        let out = dev.zeros::<f32>(tokens * config.out_hidden)?;
        half_gemm(
            dev,
            &w.merger_fc2.weight,
            hidden.arg(),
            planes,
            Some(w.merger_fc2.bias.arg()),
            Act::None,
            rows_of(&out, config.out_hidden, false),
            tokens,
            f,
        )?;
        let rows = dev.download(&out, 0, tokens * config.out_hidden)?;
        if dev.download(&flag, 0, 1)?[0] != 0 {
            return Err(CudaError::Image(
                "a value inside the vision tower left fp16's range (±65504) on the tensor-core \
                 path; SPINDLE_VISION_GEMM=simt runs the tower in f32"
                    .into(),
            ));
        }
        clock.lap(&mut times, |t| &mut t.merger_ms)?;
        Ok(TowerTrace {
            patch_embed,
            blocks_out,
            features: ImageFeatures::merged(rows, config.out_hidden, image.grid, config.merge),
        })
    }
}
