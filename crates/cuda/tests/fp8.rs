//! Block-FP8 checkpoints on CUDA (MODEL_MATH §9): the projections stay FP8 on the device (e4m3
//! codes, f32 block scales). Decode (and any batch with the FP8 tensor cores off) runs the
//! weight-only kernels and must give the CPU engine's logits on the exactly dequantized copy
//! within 1e-4, greedy tokens identical; prefill on the FP8 tensor cores quantizes the
//! activations to e4m3 (per token and group of 128) and is reported as a KL against that run.
//! Kernel checks: every FP8 kernel against a scalar reference on random data with partial
//! blocks. Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test fp8 -- --ignored
//! --test-threads=1`.

use std::path::{Path, PathBuf};

use spindle_cpu::Engine;
use spindle_cuda::{testing, CudaEngine, Device};
use spindle_model::forward::LogitsFor;
use spindle_model::fp8::make::write_fp8_pair;
use spindle_model::fp8::{e4m3_to_f32, f32_to_e4m3};
use spindle_model::weights::Linear;
use spindle_testkit::{fixture, max_abs_diff, Reference, Rng};

const FIXTURES: [&str; 4] = [
    "qwen3_5_dense",
    "qwen3_5_moe",
    "qwen3_5_moe_fused",
    "qwen3_next_moe",
];

/// Blocks that split the fixtures' matrices unevenly: 96 columns are a block of 64 and a
/// partial one of 32, 48 columns one partial block; 96 rows a block of 64 (or two of 48) and
/// a partial one. Every group of 32 columns lies in one block, so every projection stays FP8.
const BLOCKS: [[usize; 2]; 2] = [[64, 64], [48, 32]];

/// The weight-only FP8 path against the CPU on the dequantized copy (max |Δ logit|).
const TOLERANCE: f32 = 1e-4;

/// The largest mean KL(exact ‖ FP8 tensor cores) per prefill row accepted on the fixtures:
/// e4m3 activations carry 3 mantissa bits.
const KL_BOUND: f64 = 0.05;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("spindle-cuda-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn device_ordinal() -> usize {
    std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The FP8 checkpoint of fixture `name` with `block`, and its dequantized f32 copy.
fn pair(name: &str, block: [usize; 2], tmp: &TempDir) -> (PathBuf, PathBuf) {
    let tag = format!("{}x{}", block[0], block[1]);
    let (fp8, deq) = (
        tmp.0.join(format!("fp8-{tag}")),
        tmp.0.join(format!("deq-{tag}")),
    );
    write_fp8_pair(&fixture(name), &fp8, &deq, block).unwrap();
    (fp8, deq)
}

fn load_gpu(dir: &Path) -> CudaEngine {
    CudaEngine::load(dir, device_ordinal()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// KL(p ‖ q) of the softmaxes of two logit rows, in nats.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    let log_softmax = |x: &[f32]| {
        let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|&v| v as f64 - z).collect::<Vec<f64>>()
    };
    let (lp, lq) = (log_softmax(p), log_softmax(q));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// Every fixture in FP8 (each block size): the weight-only path within 1e-4 of the CPU on the
/// dequantized copy, greedy identical; then prefill on the FP8 tensor cores, its KL reported.
/// (CUDA on the dequantized copy itself rounds the f32 weights to bf16, so the exact reference
/// is the CPU engine's run of it, which equals its run of the FP8 checkpoint: tests/fp8.rs of
/// spindle-cpu.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_fixtures_match_the_dequantized_copy() {
    for name in FIXTURES {
        let prompt = Reference::load(name).ids("prompt_ids");
        assert!(
            prompt.len() > 8,
            "{name}: the prompt takes the prefill path"
        );
        for block in BLOCKS {
            let tmp = TempDir::new(&format!("fp8-{name}"));
            let (fp8, deq) = pair(name, block, &tmp);
            let cpu = Engine::load(&deq).unwrap();
            let gpu = load_gpu(&fp8);
            let formats = gpu.weight_bytes_by_format();
            let fp8_bytes = formats.iter().find(|(f, _)| *f == "fp8").map_or(0, |f| f.1);
            assert!(
                fp8_bytes > 0,
                "{name} {block:?}: no FP8 weights on the device: {formats:?}"
            );
            let want = cpu.greedy(&prompt, 6).unwrap();

            // The weight-only kernels for every batch.
            gpu.device().set_fp8_tensor_cores(false);
            let exact = gpu.greedy(&prompt, 6).unwrap();
            let prefill = max_abs_diff(&exact.prefill_logits, &want.prefill_logits);
            let decode = max_abs_diff(&exact.decode_logits, &want.decode_logits);
            println!(
                "{name} {block:?} ({formats:?}): weight-only FP8 vs CPU on the dequantized copy: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}; greedy {}",
                if exact.gen_ids == want.gen_ids { "identical" } else { "DIFFERS" }
            );
            assert!(
                prefill < TOLERANCE,
                "{name} {block:?}: prefill differs by {prefill}"
            );
            assert!(
                decode < TOLERANCE,
                "{name} {block:?}: decode differs by {decode}"
            );
            assert_eq!(
                exact.gen_ids, want.gen_ids,
                "{name} {block:?}: greedy tokens"
            );

            // Prefill on the FP8 tensor cores (where the device has them).
            gpu.device().set_fp8_tensor_cores(true);
            let mma = gpu.device().fp8_tensor_cores() && gpu.device().tensor_cores();
            let fast = gpu.greedy(&prompt, 1).unwrap();
            let vocab = gpu.config().vocab_size;
            let rows = prompt.len();
            let kls: Vec<f64> = (0..rows)
                .map(|r| {
                    let row = r * vocab..(r + 1) * vocab;
                    kl(&want.prefill_logits[row.clone()], &fast.prefill_logits[row])
                })
                .collect();
            let mean = kls.iter().sum::<f64>() / rows as f64;
            let max = kls.iter().fold(0.0f64, |a, &b| a.max(b));
            let delta = max_abs_diff(&fast.prefill_logits, &want.prefill_logits);
            println!(
                "{name} {block:?}: prefill of {rows} tokens on the FP8 tensor cores ({}): KL vs the exact run mean {mean:.2e}, max {max:.2e}; max|Δ logit| {delta:.2e}",
                if mma { "e4m3 mma" } else { "not on this device: the exact path" }
            );
            if mma {
                assert!(
                    delta > 0.0,
                    "{name}: the tensor-core prefill equals the exact one"
                );
                assert!(mean < KL_BOUND, "{name} {block:?}: mean KL {mean}");
            } else {
                assert!(delta < TOLERANCE, "{name}: the fallback differs by {delta}");
            }
        }
    }
}

/// FP8 decode through the captured CUDA graph equals eager decode.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_graph_decode_equals_eager_decode() {
    for name in ["qwen3_5_moe", "qwen3_next_moe"] {
        let tmp = TempDir::new(&format!("fp8-graph-{name}"));
        let (fp8, _) = pair(name, [64, 64], &tmp);
        let graphs = load_gpu(&fp8);
        // SAFETY: the tests of this binary run on one thread (--test-threads=1).
        unsafe { std::env::set_var("SPINDLE_CUDA_NO_GRAPHS", "1") };
        let eager = load_gpu(&fp8);
        unsafe { std::env::remove_var("SPINDLE_CUDA_NO_GRAPHS") };
        assert!(graphs.uses_graphs() && !eager.uses_graphs());
        let prompt = Reference::load(name).ids("prompt_ids");
        let vocab = graphs.config().vocab_size as u32;
        let mut a = graphs.new_session().unwrap();
        let mut b = eager.new_session().unwrap();
        graphs.forward(&mut a, &prompt, LogitsFor::Last).unwrap();
        eager.forward(&mut b, &prompt, LogitsFor::Last).unwrap();
        let mut err = 0.0f32;
        for step in 0..100u32 {
            let id = (step * 7919 + 3) % vocab;
            let x = graphs.forward(&mut a, &[id], LogitsFor::Last).unwrap();
            let y = eager.forward(&mut b, &[id], LogitsFor::Last).unwrap();
            err = err.max(max_abs_diff(&x, &y));
        }
        println!("{name}: 100 FP8 decode steps, graphs vs eager max|Δ| {err:.2e}");
        assert!(err < 1e-5, "{name}: graph decode differs by {err}");
    }
}

/// A random `[rows, cols]` block-FP8 matrix (codes over the whole e4m3 range but NaN, scales
/// spread over two decades): the matrix, and its exact values.
fn random_fp8(rng: &mut Rng, rows: usize, cols: usize, block: [usize; 2]) -> (Linear, Vec<f32>) {
    let codes: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let c = (rng.unit() * 256.0) as u8;
            if c & 0x7f == 0x7f {
                c ^ 1
            } else {
                c
            }
        })
        .collect();
    let grid = rows.div_ceil(block[0]) * cols.div_ceil(block[1]);
    let scales: Vec<f32> = (0..grid)
        .map(|_| 1e-3 * 10f32.powf(2.0 * rng.unit()))
        .collect();
    let m = spindle_model::fp8::matrix(&codes, scales, rows, cols, block);
    let values = m.to_f32();
    (Linear::Mapped(m), values)
}

/// `x [tokens, cols] · Wᵀ` in f64.
fn reference(w: &[f32], x: &[f32], rows: usize, cols: usize, tokens: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; tokens * rows];
    for t in 0..tokens {
        for r in 0..rows {
            let dot: f64 = (0..cols)
                .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                .sum();
            y[t * rows + r] = dot as f32;
        }
    }
    y
}

/// Rows of `x` as the FP8 GEMM quantizes them: e4m3 per group of 128 columns, scale amax/448.
fn quantized_acts(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (row, dst) in x.chunks(cols).zip(out.chunks_mut(cols)) {
        for (g, d) in row.chunks(128).zip(dst.chunks_mut(128)) {
            let amax = g.iter().fold(0.0f32, |a, &b| a.max(b.abs()));
            let scale = amax / 448.0;
            for (v, o) in g.iter().zip(d.iter_mut()) {
                let q = if amax != 0.0 { v / scale } else { 0.0 };
                *o = e4m3_to_f32(f32_to_e4m3(q)) * scale;
            }
        }
    }
    out
}

/// max |a − b| / max |b|.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, &v| m.max(v.abs())).max(1e-30);
    max_abs_diff(a, b) / scale
}

/// The FP8 matvecs and GEMMs against f64 references on a `[80, 96]` matrix with blocks
/// [32, 64] (a partial block of 16 rows and one of 32 columns): the weight-only kernels within
/// 1e-5 relative, the tensor-core GEMM against the reference on e4m3-quantized activations
/// (partial 128-group of 96) within 1e-5 relative too; a shape the tensor cores do not take
/// (48 columns) falls back to the exact kernel.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_kernels_match_scalar_references() {
    let dev = Device::open(device_ordinal()).unwrap();
    let mut rng = Rng(0x005e_edf8);
    let (rows, cols) = (80, 96);
    let (w, values) = random_fp8(&mut rng, rows, cols, [32, 64]);
    for tokens in [1, 3, 8, 40] {
        let x = rng.signed_vec(tokens * cols, 1.0);
        let want = reference(&values, &x, rows, cols, tokens);
        dev.set_fp8_tensor_cores(false);
        let got = testing::linear(&dev, &w, &x, tokens).unwrap();
        let err = relative_error(&got, &want);
        println!("fp8 linear, {tokens} tokens, weight-only: rel err {err:.2e}");
        assert!(
            err < 1e-5,
            "weight-only FP8 linear of {tokens} tokens: {err}"
        );
        if tokens <= 8 {
            let got =
                testing::decode_linear_of(&dev, &w, &x, tokens, None, testing::Epilogue::Store)
                    .unwrap();
            let err = relative_error(&got, &want);
            println!("fp8 decode matvec, {tokens} tokens: rel err {err:.2e}");
            assert!(err < 1e-5, "FP8 decode matvec of {tokens} tokens: {err}");
        } else {
            dev.set_fp8_tensor_cores(true);
            let got = testing::linear(&dev, &w, &x, tokens).unwrap();
            let want_q = reference(&values, &quantized_acts(&x, cols), rows, cols, tokens);
            let err = relative_error(&got, &want_q);
            let vs_exact = relative_error(&got, &want);
            let mma = dev.fp8_tensor_cores() && dev.tensor_cores();
            println!(
                "fp8 GEMM, {tokens} tokens ({}): rel err {err:.2e} vs e4m3 activations, {vs_exact:.2e} vs exact",
                if mma { "e4m3 mma" } else { "no FP8 tensor cores: exact path" }
            );
            if mma {
                // 1.2e-7 on the H200: the e4m3 products and their sums are exact in f32 there.
                assert!(err < 1e-5, "FP8 tensor-core GEMM: {err}");
                assert!(
                    vs_exact > 1e-4,
                    "the tensor-core GEMM did not quantize its input"
                );
            } else {
                assert!(vs_exact < 1e-5, "FP8 fallback GEMM: {vs_exact}");
            }
        }
    }

    // 48 columns: not a whole number of tensor-core steps; the exact SIMT kernel runs.
    let (w, values) = random_fp8(&mut rng, 40, 48, [32, 64]);
    let x = rng.signed_vec(20 * 48, 1.0);
    dev.set_fp8_tensor_cores(true);
    let got = testing::linear(&dev, &w, &x, 20).unwrap();
    let err = relative_error(&got, &reference(&values, &x, 40, 48, 20));
    println!("fp8 GEMM of 48 columns (tensor cores do not take it): rel err {err:.2e} vs exact");
    assert!(err < 1e-5, "FP8 fallback for 48 columns: {err}");
}

/// The routed experts in FP8 (4 experts, top 2): the weight-only kernels within 1e-5 relative
/// of an f64 reference, the grouped tensor-core GEMMs within 5% (e4m3 activations twice).
#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_routed_experts_match_scalar_reference() {
    let dev = Device::open(device_ordinal()).unwrap();
    let mut rng = Rng(0xe8_f8);
    let (experts, k, hidden, inter) = (4, 2, 64, 96);
    let (gu, gu_v) = random_fp8(&mut rng, experts * 2 * inter, hidden, [64, 64]);
    let (down, down_v) = random_fp8(&mut rng, experts * hidden, inter, [32, 64]);
    for tokens in [3, 40] {
        let x = rng.signed_vec(tokens * hidden, 1.0);
        let idx: Vec<i32> = (0..tokens * k)
            .map(|p| ((p / k + (p % k) * 3) % experts) as i32)
            .collect();
        let wt: Vec<f32> = (0..tokens * k).map(|_| rng.unit()).collect();
        let mut want = vec![0.0f32; tokens * hidden];
        for t in 0..tokens {
            for j in 0..k {
                let e = idx[t * k + j] as usize;
                let act: Vec<f64> = (0..inter)
                    .map(|i| {
                        let dot = |row: usize| -> f64 {
                            (0..hidden)
                                .map(|c| gu_v[row * hidden + c] as f64 * x[t * hidden + c] as f64)
                                .sum()
                        };
                        let g = dot(e * 2 * inter + i);
                        let u = dot(e * 2 * inter + inter + i);
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                for r in 0..hidden {
                    let row = e * hidden + r;
                    let d: f64 = (0..inter)
                        .map(|i| down_v[row * inter + i] as f64 * act[i])
                        .sum();
                    want[t * hidden + r] += (wt[t * k + j] as f64 * d) as f32;
                }
            }
        }
        dev.set_fp8_tensor_cores(false);
        let got = testing::routed_experts_of(&dev, &gu, &down, &x, &idx, &wt, tokens, k).unwrap();
        let err = relative_error(&got, &want);
        println!("fp8 routed experts, {tokens} tokens, weight-only: rel err {err:.2e}");
        assert!(err < 1e-5, "FP8 routed experts of {tokens} tokens: {err}");
        if tokens > 8 {
            dev.set_fp8_tensor_cores(true);
            let got =
                testing::routed_experts_of(&dev, &gu, &down, &x, &idx, &wt, tokens, k).unwrap();
            let err = relative_error(&got, &want);
            println!("fp8 routed experts, {tokens} tokens, grouped e4m3 GEMMs: rel err {err:.2e}");
            assert!(err < 0.05, "FP8 grouped expert GEMMs: {err}");
        }
    }
}
