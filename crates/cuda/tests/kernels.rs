//! The prefill GEMMs on the device against the CPU engine's arithmetic on random data.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test kernels -- --ignored`.

use spindle_cpu::LinearExt;
use spindle_cuda::{testing, Device};
use spindle_model::quant::WeightFormat;
use spindle_model::weights::Linear;
use spindle_testkit::Rng;

/// A `[rows, cols]` CPU matrix in `format` from f32 values (Q8/Q4: the reference
/// quantizer's codes, so both backends hold the same weights).
fn matrix(format: WeightFormat, values: &[f32], rows: usize, cols: usize) -> Linear {
    Linear::from_f32(format, values, rows, cols)
}

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"))
}

/// max |got − want| / max |want|.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err.is_finite(), "non-finite output");
    err / scale
}

/// Dense linear layers through the tensor-core GEMM (and, for scale, the SIMT GEMM) against
/// `Linear::forward` on the CPU: bf16 weights with f32 activations, Q8/Q4 weights with the
/// CPU's int8 activations. Shapes cover partial tiles in tokens and rows, K of one group,
/// K = 48 (bf16 only: not whole groups), a long K, and group counts that are odd (1, 3, 25:
/// Q8/Q4 scales staged one by one) or not a multiple of the 8 groups whose scales are staged
/// at a time (10, 25).
#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_gemm_matches_cpu_linear() {
    let dev = device();
    assert!(
        dev.tensor_cores(),
        "this test needs a GPU with tensor cores (sm_80+)"
    );
    let mut rng = Rng(7);
    let shapes = [
        (200, 64, 9),
        (130, 48, 77),
        (64, 32, 65),
        (384, 256, 100),
        (1000, 2048, 300),
        (136, 512, 5),
        (77, 96, 70),
        (150, 800, 40),
        (70, 320, 66),
    ];
    for (rows, cols, tokens) in shapes {
        let w = rng.signed_vec(rows * cols, 0.1);
        let x = rng.signed_vec(tokens * cols, 1.0);
        for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            if format != WeightFormat::Bf16 && cols % 32 != 0 {
                continue;
            }
            let m = matrix(format, &w, rows, cols);
            let want = m.forward(&x, tokens);
            dev.set_tensor_cores(true);
            let got = testing::linear(&dev, &m, &x, tokens).unwrap();
            dev.set_tensor_cores(false);
            let simt = testing::linear(&dev, &m, &x, tokens).unwrap();
            dev.set_tensor_cores(true);
            let err = relative_error(&got, &want);
            println!(
                "{format:?} [{rows}, {cols}] × {tokens} tokens: tensor cores vs CPU {err:.2e}, SIMT vs CPU {:.2e}",
                relative_error(&simt, &want)
            );
            // Q8/Q4: the CPU's integer dots, f32 sums in another order. bf16: exact products,
            // activations split into three bf16 planes (within 2^-24 of each), summed by the
            // tensor cores' f32 accumulation (measured ≤ 9.1e-6 at K = 2048). At most 8 tokens
            // run the plain matvec, which keeps Q8/Q4 activations in f32 (the fused decode
            // kernels, not this general layer, quantize them as the CPU does).
            let bound = match format {
                WeightFormat::Bf16 => 3e-5,
                _ if tokens <= 8 => 1e-2,
                _ => 1e-5,
            };
            assert!(err < bound, "{format:?} [{rows}, {cols}] × {tokens}: {err}");
        }
    }
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// The routed experts through the grouped tensor-core GEMMs against the CPU engine's
/// matrices applied pair by pair; also the per-pair kernels, for scale.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grouped_experts_match_cpu() {
    let dev = device();
    let (experts, k, hidden, inter, tokens) = (16, 4, 128, 64, 150);
    let mut rng = Rng(11);
    let gu_values = rng.signed_vec(experts * 2 * inter * hidden, 0.1);
    let down_values = rng.signed_vec(experts * hidden * inter, 0.1);
    let x = rng.signed_vec(tokens * hidden, 1.0);
    // Distinct experts per token (a step of 1..3 modulo the prime 13), skewed towards the
    // low experts so that some get several tiles of tokens and experts 13..15 none.
    let mut idx = Vec::new();
    for t in 0..tokens {
        let (base, step) = (t * t % 5, 1 + t % 3);
        idx.extend((0..k).map(|j| ((base + j * step) % 13) as i32));
    }
    let wt: Vec<f32> = (0..tokens * k)
        .map(|_| 0.5 + 0.5 * rng.signed(1.0))
        .collect();
    for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
        let gu = matrix(format, &gu_values, experts * 2 * inter, hidden);
        let down = matrix(format, &down_values, experts * hidden, inter);
        // CPU: every expert's rows for every token, then the chosen ones.
        let all_gu = gu.forward(&x, tokens);
        let mut acts = vec![0.0f32; tokens * k * inter];
        for t in 0..tokens {
            for j in 0..k {
                let e = idx[t * k + j] as usize;
                let row = &all_gu[t * experts * 2 * inter + e * 2 * inter..];
                for c in 0..inter {
                    acts[(t * k + j) * inter + c] = silu(row[c]) * row[inter + c];
                }
            }
        }
        let all_down = down.forward(&acts, tokens * k);
        let mut want = vec![0.0f32; tokens * hidden];
        for t in 0..tokens {
            for j in 0..k {
                let p = t * k + j;
                let e = idx[p] as usize;
                let row = &all_down[p * experts * hidden + e * hidden..];
                for r in 0..hidden {
                    want[t * hidden + r] += wt[p] * row[r];
                }
            }
        }
        dev.set_tensor_cores(true);
        let got = testing::routed_experts_of(&dev, &gu, &down, &x, &idx, &wt, tokens, k).unwrap();
        dev.set_tensor_cores(false);
        let pairs = testing::routed_experts_of(&dev, &gu, &down, &x, &idx, &wt, tokens, k).unwrap();
        dev.set_tensor_cores(true);
        let err = relative_error(&got, &want);
        println!(
            "{format:?} experts: grouped tensor cores vs CPU {err:.2e}, per-pair kernels vs CPU {:.2e}",
            relative_error(&pairs, &want)
        );
        // bf16: products exact, f32 sums. Q8/Q4: the CPU's integer dots; a SwiGLU value a few
        // ulps off can round to the neighbouring int8 code before the down projection.
        let bound = if format == WeightFormat::Bf16 {
            1e-5
        } else {
            2e-3
        };
        assert!(err < bound, "{format:?}: grouped experts differ by {err}");
    }
}

/// Bit patterns, for comparisons that must be exact.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The skinny GEMM tiles (16 rows) give the wide tiles' (64 rows) outputs bit for bit: dense
/// layers of 9..32 tokens (one or two skinny tiles), and routed experts that see few pairs each
/// (one skinny tile per expert) or up to ~30 (several), at bf16, Q8 and Q4, with group counts
/// of 1, 3 and 64.
#[test]
#[ignore = "needs a CUDA GPU"]
fn skinny_gemm_tiles_equal_wide_tiles() {
    let dev = device();
    let mut rng = Rng(31);
    for (rows, cols, tokens) in [(200, 64, 9), (130, 96, 17), (300, 2048, 32), (70, 32, 24)] {
        let w = rng.signed_vec(rows * cols, 0.1);
        let x = rng.signed_vec(tokens * cols, 1.0);
        for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let m = matrix(format, &w, rows, cols);
            dev.set_skinny_gemm(false);
            let wide = testing::linear(&dev, &m, &x, tokens).unwrap();
            dev.set_skinny_gemm(true);
            let skinny = testing::linear(&dev, &m, &x, tokens).unwrap();
            assert!(
                testing::skinny_dense_applies(&dev, tokens),
                "{tokens} tokens should take the skinny tiles"
            );
            assert_eq!(
                bits(&skinny),
                bits(&wide),
                "{format:?} [{rows}, {cols}] × {tokens}: skinny tiles differ from wide"
            );
        }
    }
    // Routed experts: 64 experts, 4 per token; spread over all of them (~1 pair each), or
    // skewed onto 12 (~20 pairs each: two skinny tiles per expert).
    let (experts, k, hidden, inter) = (64, 4, 128, 96);
    let gu_values = rng.signed_vec(experts * 2 * inter * hidden, 0.1);
    let down_values = rng.signed_vec(experts * hidden * inter, 0.1);
    for (tokens, spread) in [(20, 64), (60, 12)] {
        let x = rng.signed_vec(tokens * hidden, 1.0);
        let idx: Vec<i32> = (0..tokens * k)
            .map(|p| ((p / k) * 7 + (p % k) * 3) % spread)
            .map(|e| e as i32)
            .collect();
        let wt: Vec<f32> = (0..tokens * k)
            .map(|_| 0.5 + 0.5 * rng.signed(1.0))
            .collect();
        assert!(testing::skinny_grouped_applies(&dev, tokens * k, experts));
        for format in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let gu = matrix(format, &gu_values, experts * 2 * inter, hidden);
            let down = matrix(format, &down_values, experts * hidden, inter);
            let run = |skinny| {
                dev.set_skinny_gemm(skinny);
                testing::routed_experts_of(&dev, &gu, &down, &x, &idx, &wt, tokens, k).unwrap()
            };
            let (wide, skinny) = (run(false), run(true));
            assert_eq!(
                bits(&skinny),
                bits(&wide),
                "{format:?} experts, {tokens} tokens over {spread}: skinny tiles differ from wide"
            );
        }
    }
    dev.set_skinny_gemm(true);
}

/// The tiled prefill attention against the per-(token, head) kernel (the decode path the
/// fixtures check) on random data of the real head shapes: 35B-A3B (16 query heads on 2 KV
/// heads of 256), 27B (24 on 4: six rows of tokens per tile), one head per KV head, and the
/// fixtures' 16-wide heads; with and without cached positions before the new tokens.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiled_prefill_attention_matches_serial() {
    let dev = device();
    let mut rng = Rng(23);
    for (heads, tokens, start) in [
        ((16, 2, 256), 100, 37),
        ((24, 4, 256), 77, 0),
        ((8, 8, 128), 9, 300),
        ((4, 2, 16), 40, 5),
        ((16, 2, 256), 600, 0),
    ] {
        let (n_h, n_kv, d) = heads;
        let q = rng.signed_vec(tokens * n_h * d, 1.0);
        let gate = rng.signed_vec(tokens * n_h * d, 2.0);
        let keys = rng.signed_vec((start + tokens) * n_kv * d, 1.0);
        let values = rng.signed_vec((start + tokens) * n_kv * d, 1.0);
        let run = |tiled| {
            testing::attention_of(&dev, &q, &gate, &keys, &values, heads, tokens, start, tiled)
                .unwrap()
        };
        let tiled = run(true).expect("the tiled kernel takes these shapes");
        let serial = run(false).unwrap();
        let err = relative_error(&tiled, &serial);
        println!("heads {heads:?}, {tokens} tokens after {start}: tiled vs serial {err:.2e}");
        assert!(err < 1e-5, "{heads:?} {tokens} after {start}: {err}");
    }
}
