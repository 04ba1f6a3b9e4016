//! The CUDA backend against every fixture's reference logits, and against the CPU engine.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda -- --ignored`. Fixtures are read
//! from the repository's `fixtures/` (or `$SPINDLE_FIXTURES`).

use std::path::PathBuf;
use std::time::Instant;

use safetensors::{Dtype, SafeTensors};
use spindle_cpu::Engine;
use spindle_cuda::CudaEngine;
use spindle_model::forward::LogitsFor;

/// Bound on max |Δlogit| against the float64 reference.
const TOLERANCE: f32 = 1e-3;

const FAMILIES: [&str; 5] = [
    "qwen3_next_moe",
    "qwen3_5_dense",
    "qwen3_5_moe",
    "qwen3_5_moe_fused",
    "qwen4_exp",
];

fn fixture(name: &str) -> PathBuf {
    spindle_testkit::fixture(name)
}

fn device_ordinal() -> usize {
    std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

struct Reference(Vec<u8>);

impl Reference {
    fn load(name: &str) -> Self {
        let path = fixture(name).join("reference.safetensors");
        Reference(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.0).expect("reference parses");
        let v = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("reference has no `{name}`"));
        assert_eq!(v.dtype(), Dtype::F32, "{name} dtype");
        v.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        let st = SafeTensors::deserialize(&self.0).expect("reference parses");
        let v = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("reference has no `{name}`"));
        assert_eq!(v.dtype(), Dtype::I64, "{name} dtype");
        v.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}

fn load(name: &str) -> CudaEngine {
    CudaEngine::load(&fixture(name), device_ordinal()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn check_fixture(name: &str) {
    let reference = Reference::load(name);
    let engine = load(name);
    let prompt = reference.ids("prompt_ids");
    let expected_gen = reference.ids("gen_ids");

    let run = engine.greedy(&prompt, expected_gen.len()).unwrap();
    let prefill_err = max_abs_diff(&run.prefill_logits, &reference.f32("prefill_logits"));
    let decode_err = max_abs_diff(&run.decode_logits, &reference.f32("decode_logits"));

    let mut all = prompt.clone();
    all.extend_from_slice(&expected_gen[..expected_gen.len() - 1]);
    let mut session = engine.new_session().unwrap();
    let full = engine.forward(&mut session, &all, LogitsFor::All).unwrap();
    let full_err = max_abs_diff(&full, &reference.f32("full_logits"));
    println!(
        "{name} on {}: prompt {} tokens, {} generated; max|Δ| prefill {prefill_err:.2e}, decode {decode_err:.2e}, full {full_err:.2e}; greedy tokens {}",
        engine.device_name(),
        prompt.len(),
        expected_gen.len(),
        if run.gen_ids == expected_gen { "identical" } else { "DIFFER" }
    );
    assert!(
        prefill_err < TOLERANCE,
        "{name}: prefill logits differ by {prefill_err}"
    );
    assert_eq!(run.gen_ids, expected_gen, "{name}: greedy tokens");
    assert!(
        decode_err < TOLERANCE,
        "{name}: decode logits differ by {decode_err}"
    );
    assert!(
        full_err < TOLERANCE,
        "{name}: full logits differ by {full_err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_next_moe_matches_transformers() {
    check_fixture("qwen3_next_moe");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_dense_matches_transformers() {
    check_fixture("qwen3_5_dense");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_moe_sharded_matches_transformers() {
    check_fixture("qwen3_5_moe");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_moe_fused_matches_transformers() {
    check_fixture("qwen3_5_moe_fused");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen4_exp_matches_transformers() {
    check_fixture("qwen4_exp");
}

/// Prefill in uneven pieces (matvec batches of 2..8 tokens, single tokens, a GEMM chunk)
/// equals prefill at once, for every family.
#[test]
#[ignore = "needs a CUDA GPU"]
fn prefill_in_pieces_equals_prefill_at_once() {
    for name in FAMILIES {
        let prompt = Reference::load(name).ids("prompt_ids");
        let engine = load(name);
        let mut whole = engine.new_session().unwrap();
        let at_once = engine
            .forward(&mut whole, &prompt, LogitsFor::Last)
            .unwrap();
        let mut pieces = engine.new_session().unwrap();
        let mut rest = &prompt[..];
        let mut last = Vec::new();
        for size in [3, 1, 8, 2, 5].into_iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (a, b) = rest.split_at(size.min(rest.len()));
            last = engine.forward(&mut pieces, a, LogitsFor::Last).unwrap();
            rest = b;
        }
        let err = max_abs_diff(&at_once, &last);
        println!("{name}: pieces vs at once max|Δ| {err:.2e}");
        assert!(err < 1e-4, "{name}: prefill in pieces differs by {err}");
    }
}

/// A longer pseudo-random prompt (KV caches grow past their first allocation, QSA selects
/// among many blocks) gives the CPU engine's logits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn long_prompt_matches_cpu_engine() {
    for name in FAMILIES {
        let cpu = Engine::load(&fixture(name)).unwrap();
        let gpu = load(name);
        let vocab = cpu.config().vocab_size as u64;
        let mut state = 0x9E3779B97F4A7C15u64;
        let prompt: Vec<u32> = (0..300)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % vocab) as u32
            })
            .collect();
        let mut cs = cpu.new_session();
        let want = cpu.forward(&mut cs, &prompt, LogitsFor::All).unwrap();
        let mut gs = gpu.new_session().unwrap();
        let got = gpu.forward(&mut gs, &prompt, LogitsFor::All).unwrap();
        let mut err = max_abs_diff(&got, &want);
        // Then a few decode steps on both.
        for step in 0..4u32 {
            let id = (step * 37 + 11) % vocab as u32;
            let want = cpu.forward(&mut cs, &[id], LogitsFor::Last).unwrap();
            let got = gpu.forward(&mut gs, &[id], LogitsFor::Last).unwrap();
            err = err.max(max_abs_diff(&got, &want));
        }
        println!("{name}: 300-token prompt + 4 steps, GPU vs CPU max|Δ| {err:.2e}");
        assert!(err < 2e-3, "{name}: GPU and CPU differ by {err}");
    }
}

/// First decode timing (tiny models: launch-bound, not a benchmark).
#[test]
#[ignore = "needs a CUDA GPU"]
fn decode_timing() {
    for name in FAMILIES {
        let engine = load(name);
        let prompt = Reference::load(name).ids("prompt_ids");
        engine.greedy(&prompt, 4).unwrap(); // warm-up
        let steps = 64;
        let started = Instant::now();
        engine.greedy(&prompt, steps).unwrap();
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "{name}: prefill {} + {steps} greedy steps in {:.1} ms ({:.0} tokens/s incl. prefill)",
            prompt.len(),
            elapsed * 1e3,
            steps as f64 / elapsed
        );
    }
}

/// The reference prompt and generated ids of a fixture, teacher-forced: prefill logits of the
/// prompt, then one decode step per generated id (all but the last).
fn teacher_forced_gpu(engine: &CudaEngine, prompt: &[u32], gen: &[u32]) -> Vec<f32> {
    let mut session = engine.new_session().unwrap();
    let mut out = engine
        .forward(&mut session, prompt, LogitsFor::All)
        .unwrap();
    for &id in &gen[..gen.len() - 1] {
        out.extend(
            engine
                .forward(&mut session, &[id], LogitsFor::Last)
                .unwrap(),
        );
    }
    out
}

/// Q8 and Q4 weights, quantized on load by the CPU engine's quantizer (the same codes): GPU
/// logits against the CPU engine's at the same format (both quantize activations to int8 per
/// group of 32 for every Q8/Q4 matrix: decode matvecs and tensor-core prefill GEMMs),
/// teacher-forced over prompt and generation; and against the bf16 reference, for scale.
#[test]
#[ignore = "needs a CUDA GPU"]
fn quantized_weights_match_cpu_engine() {
    use spindle_cpu::LoadOptions;
    use spindle_model::quant::WeightFormat;
    let mut results = Vec::new();
    for name in FAMILIES {
        let reference = Reference::load(name);
        let prompt = reference.ids("prompt_ids");
        let gen = reference.ids("gen_ids");
        let mut all = prompt.clone();
        all.extend_from_slice(&gen[..gen.len() - 1]);
        let full_ref = reference.f32("full_logits");
        for quant in [WeightFormat::Q8, WeightFormat::Q4] {
            let options = LoadOptions {
                quant,
                ..Default::default()
            };
            let cpu = Engine::load_with(&fixture(name), &options).unwrap();
            let mut cs = cpu.new_session();
            let want = cpu.forward(&mut cs, &all, LogitsFor::All).unwrap();
            let gpu = CudaEngine::load_with(&fixture(name), device_ordinal(), quant, None)
                .unwrap_or_else(|e| panic!("{name} {quant}: {e}"));
            let got = teacher_forced_gpu(&gpu, &prompt, &gen);
            let err = max_abs_diff(&got, &want);
            let mean = mean_abs_diff(&got, &want);
            let vs_ref = max_abs_diff(&got, &full_ref);
            let cpu_vs_ref = max_abs_diff(&want, &full_ref);
            let greedy = gpu.greedy(&prompt, gen.len()).unwrap();
            let cpu_greedy = cpu.greedy(&prompt, gen.len()).unwrap();
            println!(
                "{name} {quant}: GPU vs CPU ({quant}) max|Δ| {err:.2e} mean|Δ| {mean:.2e}; vs bf16 reference: GPU {vs_ref:.2e} (mean {:.2e}), CPU {cpu_vs_ref:.2e} (mean {:.2e}); greedy tokens GPU vs CPU {}",
                mean_abs_diff(&got, &full_ref),
                mean_abs_diff(&want, &full_ref),
                if greedy.gen_ids == cpu_greedy.gen_ids { "identical" } else { "DIFFER" }
            );
            results.push((name, quant, mean, mean_abs_diff(&want, &full_ref)));
        }
    }
    // Same codes and the same int8 activations: what remains is f32 summation order (and in
    // the MoE fixtures the near-tied top-2-of-8 routing it can flip), so GPU and CPU agree far
    // more closely than either agrees with the bf16 model. Bounds from the H200 run of
    // 2026-11-30 (third session, docs/benchmarks/cuda-h200.md): mean |GPU−CPU| ≤ 5.3e-3 (q8), ≤ 3.8e-3 (q4, at
    // most 0.012× the q4 error); written after that run.
    for (name, quant, mean, cpu_err) in results {
        assert!(
            mean < 1e-2,
            "{name} {quant}: GPU and CPU differ by {mean} on average"
        );
        if quant == WeightFormat::Q4 {
            assert!(
                mean < 0.05 * cpu_err,
                "{name} {quant}: GPU−CPU mean {mean} is not small against the Q4 error {cpu_err}"
            );
        }
    }
}

fn mean_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len().max(1) as f32
}

/// Decode through the captured CUDA graph (re-captured when the KV cache grows past 256
/// and 512 tokens) equals decode without graphs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_decode_equals_eager_decode() {
    for name in FAMILIES {
        let graphs = load(name);
        // SAFETY: the tests of this binary run on one thread (--test-threads=1).
        unsafe { std::env::set_var("SPINDLE_CUDA_NO_GRAPHS", "1") };
        let eager = load(name);
        unsafe { std::env::remove_var("SPINDLE_CUDA_NO_GRAPHS") };
        let prompt = Reference::load(name).ids("prompt_ids");
        let vocab = graphs.config().vocab_size as u32;
        let mut a = graphs.new_session().unwrap();
        let mut b = eager.new_session().unwrap();
        graphs.forward(&mut a, &prompt, LogitsFor::Last).unwrap();
        eager.forward(&mut b, &prompt, LogitsFor::Last).unwrap();
        let mut err = 0.0f32;
        let mut same_argmax = true;
        for step in 0..600u32 {
            let id = (step * 7919 + 3) % vocab;
            let x = graphs.forward(&mut a, &[id], LogitsFor::Last).unwrap();
            let y = eager.forward(&mut b, &[id], LogitsFor::Last).unwrap();
            err = err.max(max_abs_diff(&x, &y));
        }
        let next_a = graphs.decode_argmax(&mut a, 5).unwrap();
        let last_b = eager.forward(&mut b, &[5], LogitsFor::Last).unwrap();
        same_argmax &= next_a == spindle_kernels::softmax::argmax(&last_b) as u32;
        println!(
            "{name}: 600 decode steps, graphs {} vs eager max|Δ| {err:.2e}; device argmax {}",
            graphs.uses_graphs(),
            if same_argmax { "matches" } else { "DIFFERS" }
        );
        assert!(err < 1e-5, "{name}: graph decode differs by {err}");
        assert!(same_argmax, "{name}: device argmax differs");
    }
}

/// qwen4_exp decodes through a captured CUDA graph, PLE and QSA selection included, and gives
/// the CPU engine's logits: the fixture's prompt (EOS inside, so the n-gram history resets)
/// and its generated ids teacher-forced, every step past the QSA budget of 8 positions, within
/// 1e-4; then 300 more steps (the KV and indexer caches grow past 256 positions, so the graph
/// is captured again; QSA picks among up to 89 blocks; an EOS every 37 steps) within the
/// bound of `long_prompt_matches_cpu_engine`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen4_exp_graph_decode_matches_cpu_engine() {
    let name = "qwen4_exp";
    let reference = Reference::load(name);
    let prompt = reference.ids("prompt_ids");
    let gen = reference.ids("gen_ids");
    let cpu = Engine::load(&fixture(name)).unwrap();
    let gpu = load(name);
    assert!(gpu.uses_graphs(), "{name}: decode does not use CUDA graphs");
    let qsa = gpu.config().qsa.clone().expect("qwen4_exp has QSA");
    assert!(
        prompt.len() > qsa.budget,
        "the fixture prompt is within the QSA budget"
    );
    let eos = gpu.config().ple.as_ref().expect("qwen4_exp has PLE").eos;

    let mut cs = cpu.new_session();
    let mut gs = gpu.new_session().unwrap();
    let want = cpu.forward(&mut cs, &prompt, LogitsFor::Last).unwrap();
    let got = gpu.forward(&mut gs, &prompt, LogitsFor::Last).unwrap();
    let prefill_err = max_abs_diff(&got, &want);
    let mut step = |id: u32| {
        let want = cpu.forward(&mut cs, &[id], LogitsFor::Last).unwrap();
        let got = gpu.forward(&mut gs, &[id], LogitsFor::Last).unwrap();
        assert!(
            gs.graph.is_some() && !gs.graph_failed,
            "{name}: the decode step at position {} did not replay a graph",
            gs.position - 1
        );
        (
            max_abs_diff(&got, &want),
            spindle_kernels::softmax::argmax(&want) as u32,
        )
    };
    let mut fixture_err = 0.0f32;
    let mut next = 0;
    for &id in &gen {
        let (err, argmax) = step(id);
        fixture_err = fixture_err.max(err);
        next = argmax;
    }
    let mut long_err = 0.0f32;
    for n in 1..=300u32 {
        let id = if n % 37 == 0 { eos } else { next };
        let (err, argmax) = step(id);
        long_err = long_err.max(err);
        next = argmax;
    }
    println!(
        "{name} on {}: graph decode vs CPU engine max|Δ| prefill {prefill_err:.2e}, fixture steps {fixture_err:.2e}, 300 more {long_err:.2e}",
        gpu.device_name()
    );
    assert!(
        prefill_err < 1e-4,
        "{name}: prefill differs by {prefill_err}"
    );
    assert!(
        fixture_err < 1e-4,
        "{name}: graph decode differs by {fixture_err}"
    );
    assert!(
        long_err < 2e-3,
        "{name}: long graph decode differs by {long_err}"
    );
}

/// The first index where two logit vectors differ in any bit, with both values.
fn first_bit_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| (i, a[i], b[i]))
}

/// Programmatic dependent launch (sm_90: the decode kernels start while their predecessor
/// finishes, and wait for it in `griddepcontrol.wait`) changes when a kernel runs, never what
/// it computes: on every fixture at bf16 and q4, with PDL on (the default) and off, the prompt's
/// logits, 48 single-token decode steps (through the captured graph, then eagerly), the device
/// argmax and three 3-token steps (the decode kernels' multi-token form) are the same bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pdl_launches_equal_plain_launches() {
    use spindle_model::quant::WeightFormat;
    for name in FAMILIES {
        let prompt = Reference::load(name).ids("prompt_ids");
        for quant in [WeightFormat::Bf16, WeightFormat::Q4] {
            let load_as = || {
                CudaEngine::load_with(&fixture(name), device_ordinal(), quant, None)
                    .unwrap_or_else(|e| panic!("{name} {quant}: {e}"))
            };
            let mut pdl = load_as();
            let mut plain = load_as();
            plain.set_pdl(false);
            assert!(!plain.device().pdl());
            if pdl.device().pdl_supported() {
                assert!(
                    pdl.device().pdl(),
                    "{name}: PDL is off on a device that has it (SPINDLE_CUDA_PDL=0?)"
                );
                let waiting = pdl.device().pdl_kernels();
                for k in [
                    "embed_bf16",
                    "decode_matvec_q4_t1",
                    "decode_matvec_conv_q4_t1",
                    "decode_moe_gate_up_q4",
                    "decode_moe_down_q4",
                    "gdn_decode_heads",
                    "attention_prepare",
                    "attention_decode_split",
                    "attention_decode_combine",
                    "argmax_two_stage",
                ] {
                    assert!(waiting.contains(&k), "{k} is not launched with PDL");
                }
            }
            let vocab = pdl.config().vocab_size as u32;
            for graphs in [true, false] {
                pdl.set_graphs(graphs);
                plain.set_graphs(graphs);
                let mut a = pdl.new_session().unwrap();
                let mut b = plain.new_session().unwrap();
                let check = |what: &str, x: &[f32], y: &[f32]| {
                    if let Some((i, u, v)) = first_bit_difference(x, y) {
                        panic!("{name} {quant} graphs {graphs}: {what}: logit {i} is {u} with PDL, {v} without");
                    }
                };
                let x = pdl.forward(&mut a, &prompt, LogitsFor::Last).unwrap();
                let y = plain.forward(&mut b, &prompt, LogitsFor::Last).unwrap();
                check("prompt", &x, &y);
                for step in 0..48u32 {
                    let id = (step * 7919 + 11) % vocab;
                    let x = pdl.forward(&mut a, &[id], LogitsFor::Last).unwrap();
                    let y = plain.forward(&mut b, &[id], LogitsFor::Last).unwrap();
                    check(&format!("decode step {step}"), &x, &y);
                }
                if graphs {
                    for (engine, s) in [("PDL", &a), ("plain", &b)] {
                        assert!(
                            s.graph.is_some() && !s.graph_failed,
                            "{name} {quant}: the {engine} engine did not decode through a graph"
                        );
                    }
                }
                let ta = pdl.decode_argmax(&mut a, 5).unwrap();
                let tb = plain.decode_argmax(&mut b, 5).unwrap();
                assert_eq!(ta, tb, "{name} {quant} graphs {graphs}: device argmax");
                for step in 0..3u32 {
                    let ids: Vec<u32> = (0..3)
                        .map(|j| (step * 104_729 + j * 31 + 7) % vocab)
                        .collect();
                    let x = pdl.forward(&mut a, &ids, LogitsFor::All).unwrap();
                    let y = plain.forward(&mut b, &ids, LogitsFor::All).unwrap();
                    check(&format!("3-token step {step}"), &x, &y);
                }
            }
            println!("{name} {quant}: PDL on == off, bit for bit (graphs and eager)");
        }
    }
}
