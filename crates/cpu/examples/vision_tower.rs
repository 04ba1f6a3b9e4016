//! Times the vision tower on the CPU at a released shape with random weights: the
//! `vision_config` of a config.json (default: the repository's Qwen3.6-35B-A3B config), one
//! random image of SIDE x SIDE pixels (a multiple of 32).
//!
//! `cargo run --release -p spindle-cpu --example vision_tower -- [SIDE] [CONFIG]`

use std::path::PathBuf;
use std::time::Instant;

use spindle_model::quant::WeightFormat;
use spindle_model::weights::vision::{BiasedLinear, LayerNormWeights, VisionBlock};
use spindle_model::weights::Linear;
use spindle_model::{ModelConfig, VisionWeights};
use spindle_testkit::Rng;
use spindle_vision::{Grid, PreparedImage};

fn main() {
    let mut args = std::env::args().skip(1);
    let side: usize = args
        .next()
        .map_or(256, |s| s.parse().expect("SIDE: pixels"));
    let config = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/configs/qwen3_6_35b_a3b.config.json"
        ))
    });
    let config = ModelConfig::from_file(&config).unwrap_or_else(|e| panic!("{e}"));
    let v = config.vision.expect("a config with vision_config");
    assert_eq!(
        side % (v.patch * v.merge),
        0,
        "SIDE must be a multiple of {}",
        v.patch * v.merge
    );
    let mut rng = Rng(7);
    let started = Instant::now();
    let mut linear = |rows: usize, cols: usize| BiasedLinear {
        weight: Linear::from_f32(
            WeightFormat::Bf16,
            &rng.signed_vec(rows * cols, 1.0 / (cols as f32).sqrt()),
            rows,
            cols,
        ),
        bias: rng.signed_vec(rows, 0.02),
    };
    let (d, i) = (v.hidden, v.intermediate);
    let wide = d * v.merge * v.merge;
    let norm = || LayerNormWeights {
        weight: vec![1.0; d],
        bias: vec![0.0; d],
    };
    let weights = VisionWeights {
        patch_embed: linear(d, v.patch_row()),
        pos_embed: Rng(8).signed_vec(v.pos_side * v.pos_side * d, 0.02),
        blocks: (0..v.depth)
            .map(|_| VisionBlock {
                norm1: norm(),
                qkv: linear(3 * d, d),
                proj: linear(d, d),
                norm2: norm(),
                fc1: linear(i, d),
                fc2: linear(d, i),
            })
            .collect(),
        merger_norm: norm(),
        merger_fc1: linear(wide, wide),
        merger_fc2: linear(v.out_hidden, wide),
    };
    eprintln!(
        "random tower ({} blocks, {:.2} GB) built in {:.1} s",
        v.depth,
        weights.size_bytes() as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    let grid = Grid {
        t: 1,
        h: side / v.patch,
        w: side / v.patch,
    };
    let image = PreparedImage {
        pixels: Rng(9).signed_vec(grid.patches() * v.patch_row(), 1.0),
        row_len: v.patch_row(),
        grid,
    };
    for run in 0..2 {
        let started = Instant::now();
        let features = spindle_cpu::vision::encode(&weights, &v, &image);
        println!(
            "{side}x{side} image ({} patches, {} tokens): {:.3} s (run {run}, {} threads)",
            grid.patches(),
            features.tokens(),
            started.elapsed().as_secs_f64(),
            rayon::current_num_threads()
        );
    }
}
