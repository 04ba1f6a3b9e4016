//! Time of one image through the vision tower on one GPU, at the released tower shape
//! (`vision_config` of Qwen3.6-35B-A3B, `fixtures/configs/qwen3_6_35b_a3b.config.json`: 27
//! blocks of width 1152, 16 heads, MLP 4304, merger to 2048) with random bf16 weights, so no
//! checkpoint is needed. Prints, for the SIMT f32 path (before) and the tensor-core path at each
//! precision (after), the median of `--runs` encodings after a warm-up and one encoding timed
//! stage by stage (the device synchronised between stages), and how far each tensor-core
//! precision's features are from the SIMT path's.
//!
//! ```sh
//! cargo build --release -p spindle-cuda --example vision_bench
//! vision_bench [--size 1024] [--runs 10]
//! ```

use std::path::Path;
use std::time::Instant;

use spindle_cuda::tower::TowerPrecision;
use spindle_cuda::{Device, GpuVision};
use spindle_model::quant::WeightFormat;
use spindle_model::weights::vision::{BiasedLinear, LayerNormWeights, VisionBlock};
use spindle_model::weights::Linear;
use spindle_model::{ModelConfig, VisionWeights};
use spindle_vision::{Grid, PreparedImage};

const RELEASED: &str = include_str!("../../../fixtures/configs/qwen3_6_35b_a3b.config.json");

/// A xorshift stream of values in [−scale, scale).
struct Noise(u64);

impl Noise {
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn linear(&mut self, rows: usize, cols: usize) -> BiasedLinear {
        let scale = 1.0 / (cols as f32).sqrt();
        BiasedLinear {
            weight: Linear::from_f32(
                WeightFormat::Bf16,
                &self.vec(rows * cols, scale),
                rows,
                cols,
            ),
            bias: self.vec(rows, 0.02),
        }
    }

    fn norm(&mut self, d: usize) -> LayerNormWeights {
        LayerNormWeights {
            weight: self.vec(d, 0.1).iter().map(|v| 1.0 + v).collect(),
            bias: self.vec(d, 0.02),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut size = 1024usize;
    let mut runs = 10usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--size" => size = value.parse()?,
            "--runs" => runs = value.parse::<usize>()?.max(1),
            _ => return Err(format!("unknown option {flag}").into()),
        }
    }
    let config = ModelConfig::from_json_str(RELEASED, Path::new("qwen3_6_35b_a3b.config.json"))?;
    let vc = config
        .vision
        .clone()
        .ok_or("the released config has a vision_config")?;
    let (d, i) = (vc.hidden, vc.intermediate);
    let wide = d * vc.merge * vc.merge;
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let weights = VisionWeights {
        patch_embed: noise.linear(d, vc.patch_row()),
        pos_embed: noise.vec(vc.pos_side * vc.pos_side * d, 0.1),
        blocks: (0..vc.depth)
            .map(|_| VisionBlock {
                norm1: noise.norm(d),
                qkv: noise.linear(3 * d, d),
                proj: noise.linear(d, d),
                norm2: noise.norm(d),
                fc1: noise.linear(i, d),
                fc2: noise.linear(d, i),
            })
            .collect(),
        merger_norm: noise.norm(d),
        merger_fc1: noise.linear(wide, wide),
        merger_fc2: noise.linear(vc.out_hidden, wide),
    };
    let dev = Device::open(0)?;
    // A size x size image (a multiple of 32: no resize) as its patch rows.
    let side = size / vc.patch;
    let grid = Grid {
        t: 1,
        h: side,
        w: side,
    };
    let image = PreparedImage {
        pixels: noise.vec(grid.patches() * vc.patch_row(), 1.0),
        row_len: vc.patch_row(),
        grid,
    };
    println!(
        "{} | tower {} blocks, D {d}, I {i}, {} heads, out {} | image {size}x{size}: {} patches, {} tokens",
        dev.describe(),
        vc.depth,
        vc.heads,
        vc.out_hidden,
        grid.patches(),
        grid.patches() / (vc.merge * vc.merge)
    );
    // Before: the SIMT f32 path; after: the tensor-core path at each precision.
    let simt = GpuVision::upload_simt(&dev, &weights, &vc, "asked for".into())?;
    let baseline = measure(&dev, &simt, &image, runs, "SIMT f32 (before)")?;
    drop(simt);
    let tower = match GpuVision::upload_tensor(&dev, &weights, &vc)? {
        Ok(t) => t,
        Err(why) => return Err(format!("the tensor-core tower refused the weights: {why}").into()),
    };
    for precision in TowerPrecision::ALL {
        tower.set_precision(precision)?;
        let features = measure(&dev, &tower, &image, runs, &precision.describe())?;
        let scale = baseline.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = baseline
            .iter()
            .zip(&features)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        println!("  features vs SIMT f32: max |Δ| {diff:.2e} (max |feature| {scale:.2e})");
    }
    Ok(())
}

/// Times `tower` on `image`: median of `runs` encodings after a warm-up, then one encoding
/// stage by stage; returns the features.
fn measure(
    dev: &Device,
    tower: &GpuVision,
    image: &PreparedImage,
    runs: usize,
    label: &str,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    tower.check_image(image, 0)?;
    tower.encode(dev, image)?; // warm-up
    let mut times = Vec::with_capacity(runs);
    let mut features = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let f = tower.encode(dev, image)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        assert!(f.rows.iter().all(|v| v.is_finite()), "non-finite features");
        features = f.rows;
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{label} | {:.2} GB weights | encode (upload, tower, features back): median {:.2} ms, min {:.2} ms over {runs} runs",
        tower.size_bytes() as f64 / 1e9,
        times[runs / 2],
        times[0]
    );
    let (_, t) = tower.encode_timed(dev, image)?;
    println!(
        "  stages (synchronised): host+upload {:.2} ms | patch+pos embed {:.2} ms | block GEMMs {:.2} ms | attention {:.2} ms | norms, rotary, bias, GELU {:.2} ms | merger {:.2} ms",
        t.host_ms, t.embed_ms, t.gemm_ms, t.attention_ms, t.norms_ms, t.merger_ms
    );
    Ok(features)
}
