//! Block-FP8 checkpoints (MODEL_MATH §9): each fixture is turned into an FP8 checkpoint and
//! its exact f32 dequantization (`spindle_model::fp8::make`); spindle must run the two to the
//! same logits and tokens, loaded directly, quantized on load, and converted to an install.

mod common;

use std::path::Path;

use common::{fixture, max_abs_diff, Reference, TempDir};
use spindle_cpu::experts::ExpertResidency;
use spindle_cpu::{Engine, LoadOptions};
use spindle_model::fp8::make::write_fp8_pair;
use spindle_model::install;
use spindle_model::quant::WeightFormat;

/// Blocks that split every fixture matrix unevenly: 64 columns are a block of 48 and a partial
/// one of 16; 128 rows are four blocks of 32.
const BLOCK: [usize; 2] = [32, 48];

/// Bound on max |Δlogit| between the FP8 checkpoint and its dequantized copy (the 1e-5;
/// both hold the same f32 weights, so they agree exactly).
const TOLERANCE: f32 = 1e-5;

fn pair(name: &str, block: [usize; 2], tmp: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let (fp8, deq) = (tmp.0.join("fp8"), tmp.0.join("deq"));
    write_fp8_pair(&fixture(name), &fp8, &deq, block).unwrap();
    (fp8, deq)
}

fn load(dir: &Path, quant: WeightFormat) -> Engine {
    let options = LoadOptions {
        quant,
        ..LoadOptions::default()
    };
    Engine::load_with(dir, &options).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn check_same_run(name: &str, a: &Engine, b: &Engine, what: &str) {
    let prompt = Reference::load(name).ids("prompt_ids");
    let (ra, rb) = (a.greedy(&prompt, 4).unwrap(), b.greedy(&prompt, 4).unwrap());
    let prefill = max_abs_diff(&ra.prefill_logits, &rb.prefill_logits);
    let decode = max_abs_diff(&ra.decode_logits, &rb.decode_logits);
    println!("{name} {what}: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}");
    assert!(
        prefill <= TOLERANCE,
        "{name} {what}: prefill logits differ by {prefill}"
    );
    assert!(
        decode <= TOLERANCE,
        "{name} {what}: decode logits differ by {decode}"
    );
    assert_eq!(ra.gen_ids, rb.gen_ids, "{name} {what}: greedy tokens");
}

fn check_fixture(name: &str) {
    let tmp = TempDir::new(&format!("fp8-{name}"));
    let (fp8, deq) = pair(name, BLOCK, &tmp);
    let fp8_engine = load(&fp8, WeightFormat::Bf16);
    check_same_run(
        name,
        &fp8_engine,
        &load(&deq, WeightFormat::Bf16),
        "as stored",
    );

    // The FP8 rounding is real: the logits move away from the bf16 fixture's.
    let prompt = Reference::load(name).ids("prompt_ids");
    let original = load(&fixture(name), WeightFormat::Bf16)
        .greedy(&prompt, 1)
        .unwrap();
    let moved = max_abs_diff(
        &fp8_engine.greedy(&prompt, 1).unwrap().prefill_logits,
        &original.prefill_logits,
    );
    assert!(
        moved > 1e-4,
        "{name}: FP8 logits equal the bf16 fixture's (max|Δ| {moved})"
    );

    check_same_run(
        name,
        &load(&fp8, WeightFormat::Q8),
        &load(&deq, WeightFormat::Q8),
        "--quant q8",
    );
}

#[test]
fn fp8_dense_matches_its_dequantized_copy() {
    check_fixture("qwen3_5_dense");
}

#[test]
fn fp8_moe_per_expert_sharded_matches_its_dequantized_copy() {
    check_fixture("qwen3_5_moe");
}

#[test]
fn fp8_moe_fused_experts_match_their_dequantized_copy() {
    check_fixture("qwen3_5_moe_fused");
}

#[test]
fn fp8_qwen3_next_matches_its_dequantized_copy() {
    check_fixture("qwen3_next_moe");
}

#[test]
fn fp8_with_128_blocks_partial_in_both_dimensions() {
    // Every fixture dimension is below 128: one partial block per matrix.
    let tmp = TempDir::new("fp8-128");
    let (fp8, deq) = pair("qwen3_5_moe_fused", [128, 128], &tmp);
    check_same_run(
        "qwen3_5_moe_fused",
        &load(&fp8, WeightFormat::Bf16),
        &load(&deq, WeightFormat::Bf16),
        "[128, 128] blocks",
    );
}

#[test]
fn fp8_checkpoint_converts_to_installs_that_stream_experts() {
    let name = "qwen3_5_moe";
    let tmp = TempDir::new("fp8-convert");
    let (fp8, deq) = pair(name, BLOCK, &tmp);
    for quant in [WeightFormat::Bf16, WeightFormat::Q8] {
        let dst = tmp.0.join(format!("install-{quant}"));
        install::convert(&fp8, &dst, quant, &mut |_| true)
            .unwrap_or_else(|e| panic!("convert {quant}: {e}"));
        for file in ["manifest.json", "config.json"] {
            let text = std::fs::read_to_string(dst.join(file)).unwrap();
            assert!(
                !text.contains("quantization_config"),
                "the install's {file} keeps the FP8 config"
            );
        }
        let streamed = LoadOptions {
            experts: ExpertResidency::Streamed,
            expert_slots: Some(2),
            ..LoadOptions::default()
        };
        let installed = Engine::load_with(&dst, &streamed).unwrap();
        check_same_run(
            name,
            &installed,
            &load(&deq, quant),
            &format!("install {quant}"),
        );
    }
}
