//! qwen4_exp's QSA block pick on the device (`qsa_pick_blocks`) against the CPU engine's rule: the
//! top max_blocks blocks by score, ties to the earlier block, in block order, then the partial
//! tail; every visible position within the budget. Random scores with many ties and exact
//! zeros (what ReLU sums give), up to the released model's 2048-token budget at 262 143
//! positions. Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test qwen4 -- --ignored`.
//! (The whole decode, indexer keys and graph included, is checked against the CPU engine by
//! `qwen4_exp_graph_decode_matches_cpu_engine` in tests/fixtures.rs.)

use spindle_cuda::{qsa_pick_on_host, Device};
use spindle_kernels::softmax::top_k;
use spindle_model::QsaConfig;
use spindle_testkit::Rng;

/// The CPU engine's selection for one token (as `spindle_cpu::qwen4::qsa::select`).
fn cpu_pick(q: &QsaConfig, scores: &[f32], visible: usize) -> Vec<i32> {
    if visible <= q.budget {
        return (0..visible as i32).collect();
    }
    let cr = q.compress_ratio;
    let blocks = visible / cr;
    let mut chosen = top_k(scores, q.max_blocks().min(blocks));
    chosen.sort_unstable();
    let mut picked: Vec<i32> = chosen
        .iter()
        .flat_map(|&b| (b * cr..(b + 1) * cr).map(|p| p as i32))
        .collect();
    picked.extend((blocks * cr..visible).map(|p| p as i32));
    picked
}

/// Scores of `blocks` blocks in one of several shapes.
fn scores(rng: &mut Rng, blocks: usize, shape: usize) -> Vec<f32> {
    (0..blocks)
        .map(|_| {
            let u = rng.unit();
            match shape {
                // Distinct values.
                0 => u * 3.0,
                // Five levels, a fifth of them exact zeros: ties everywhere.
                1 => (u * 5.0).floor() * 0.25,
                // Mostly zero (every head's dot negative), a few positive.
                2 => {
                    if u < 0.9 {
                        0.0
                    } else {
                        u
                    }
                }
                // All equal: the first blocks win.
                3 => 0.0,
                // +0 and −0, which total_cmp orders (−0 < +0).
                _ => {
                    if u < 0.5 {
                        -0.0
                    } else {
                        0.0
                    }
                }
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qsa_pick_matches_cpu_selection() {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let dev = Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = Rng(0x9E3779B97F4A7C15);
    // (n_heads, head_dim, budget, compress_ratio) and the visible positions to try.
    let cases: [(usize, usize, &[usize]); 4] = [
        (8, 4, &[1, 5, 8, 9, 12, 13, 50, 203]),
        (64, 16, &[64, 65, 79, 80, 1000, 5003]),
        (2048, 4, &[2048, 2049, 2051, 4096, 9001, 65_536, 262_143]),
        (12, 3, &[13, 14, 15, 100, 1024]),
    ];
    let mut checked = 0;
    for (budget, cr, visibles) in cases {
        let q = QsaConfig {
            n_heads: 4,
            head_dim: 128,
            budget,
            compress_ratio: cr,
        };
        for &visible in visibles {
            for shape in 0..5 {
                let s = scores(&mut rng, visible / cr, shape);
                let got = qsa_pick_on_host(&dev, &q, &s, visible).unwrap_or_else(|e| panic!("{e}"));
                let want = cpu_pick(&q, &s, visible);
                assert_eq!(
                    got, want,
                    "budget {budget}, blocks of {cr}, {visible} visible, score shape {shape}"
                );
                checked += 1;
            }
        }
    }
    println!("qsa_pick_blocks: {checked} selections equal the CPU's");
}
