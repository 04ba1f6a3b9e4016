//! GGUF files of the fixtures (`fixtures/gguf/`, written by `tools/gguf_from_fixture.py` in
//! llama.cpp's converter layout): bf16 files reproduce transformers' logits, quantized files
//! their exactly dequantized copy, directly, quantized on load and converted to an install.

mod common;

use std::path::{Path, PathBuf};

use common::{fixtures, max_abs_diff, Reference, TempDir};
use spindle_cpu::experts::ExpertResidency;
use spindle_cpu::{Engine, LoadOptions};
use spindle_model::install;
use spindle_model::quant::WeightFormat;

/// Bound on max |Δlogit| against the float64 reference (as `tests/fixtures.rs`).
const TOLERANCE: f32 = 1e-4;

fn gguf(name: &str) -> PathBuf {
    let path = fixtures().join("gguf").join(name);
    assert!(path.is_file(), "GGUF fixture {} is missing", path.display());
    path
}

fn load(path: &Path, quant: WeightFormat) -> Engine {
    let options = LoadOptions {
        quant,
        ..LoadOptions::default()
    };
    Engine::load_with(path, &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check_against_reference(file: &str, fixture: &str) {
    let reference = Reference::load(fixture);
    let engine = load(&gguf(file), WeightFormat::Bf16);
    let prompt = reference.ids("prompt_ids");
    let expected = reference.ids("gen_ids");
    let run = engine.greedy(&prompt, expected.len()).unwrap();
    let prefill = max_abs_diff(&run.prefill_logits, &reference.f32("prefill_logits").1);
    let decode = max_abs_diff(&run.decode_logits, &reference.f32("decode_logits").1);
    println!("{file}: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}");
    assert!(prefill < TOLERANCE, "{file}: prefill logits differ by {prefill}");
    assert!(decode < TOLERANCE, "{file}: decode logits differ by {decode}");
    assert_eq!(run.gen_ids, expected, "{file}: greedy tokens");
}

#[test]
fn qwen35moe_bf16_gguf_matches_transformers() {
    check_against_reference("qwen3_5_moe.bf16.gguf", "qwen3_5_moe");
}

#[test]
fn qwen35_split_bf16_gguf_matches_transformers() {
    // A split set, opened from its first part.
    check_against_reference("qwen3_5_dense.bf16-00001-of-00003.gguf", "qwen3_5_dense");
}

#[test]
fn qwen3next_bf16_gguf_matches_transformers() {
    check_against_reference("qwen3_next_moe.bf16.gguf", "qwen3_next_moe");
}

fn same_run(a: &Engine, b: &Engine, what: &str) {
    let prompt = Reference::load("qwen3_5_moe_fused").ids("prompt_ids");
    let (ra, rb) = (a.greedy(&prompt, 6).unwrap(), b.greedy(&prompt, 6).unwrap());
    let prefill = max_abs_diff(&ra.prefill_logits, &rb.prefill_logits);
    let decode = max_abs_diff(&ra.decode_logits, &rb.decode_logits);
    println!("{what}: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}");
    assert!(prefill <= 1e-5 && decode <= 1e-5, "{what}: logits differ by {prefill} / {decode}");
    assert_eq!(ra.gen_ids, rb.gen_ids, "{what}: greedy tokens");
}

#[test]
fn q8_0_and_q4_0_gguf_match_their_dequantized_copy() {
    // Q8_0 projections, Q4_0 routed experts; the copy holds gguf.quants.dequantize of each.
    let quantized = gguf("qwen3_5_moe_fused.q8_0.gguf");
    let dequantized = gguf("qwen3_5_moe_fused.q8_0.dequantized.gguf");
    same_run(
        &load(&quantized, WeightFormat::Bf16),
        &load(&dequantized, WeightFormat::Bf16),
        "as stored",
    );
    same_run(
        &load(&quantized, WeightFormat::Q8),
        &load(&dequantized, WeightFormat::Q8),
        "--quant q8",
    );
    // The quantization is real: the logits differ from the bf16 fixture's.
    let prompt = Reference::load("qwen3_5_moe_fused").ids("prompt_ids");
    let original = Reference::load("qwen3_5_moe_fused").f32("prefill_logits").1;
    let run = load(&quantized, WeightFormat::Bf16).greedy(&prompt, 1).unwrap();
    assert!(max_abs_diff(&run.prefill_logits, &original) > 1e-3);
}

#[test]
fn gguf_converts_to_an_install_that_streams_experts() {
    let src = gguf("qwen3_5_moe_fused.q8_0.gguf");
    let tmp = TempDir::new("gguf-convert");
    let dst = tmp.0.join("install");
    install::convert(&src, &dst, WeightFormat::Bf16, &mut |_| true)
        .unwrap_or_else(|e| panic!("convert: {e}"));
    let streamed = LoadOptions {
        experts: ExpertResidency::Streamed,
        expert_slots: Some(2),
        ..LoadOptions::default()
    };
    let installed = Engine::load_with(&dst, &streamed).unwrap();
    same_run(&installed, &load(&src, WeightFormat::Bf16), "install from GGUF");
}
