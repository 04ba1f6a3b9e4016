//! Every family against the logits transformers computed (the repository's `fixtures/`).

mod common;

use common::{fixture, max_abs_diff, Reference};
use spindle_cpu::{Engine, LogitsFor};

/// Bound on max |Δlogit| against the float64 reference (MODEL_MATH §8 expects about 1e-4).
const TOLERANCE: f32 = 2e-4;

fn check_fixture(name: &str) {
    let reference = Reference::load(name);
    let engine = Engine::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let prompt = reference.ids("prompt_ids");
    let expected_gen = reference.ids("gen_ids");
    let (_, prefill_ref) = reference.f32("prefill_logits");
    let (_, decode_ref) = reference.f32("decode_logits");
    let (_, full_ref) = reference.f32("full_logits");

    let run = engine.greedy(&prompt, expected_gen.len()).unwrap();
    let prefill_err = max_abs_diff(&run.prefill_logits, &prefill_ref);
    let decode_err = max_abs_diff(&run.decode_logits, &decode_ref);
    println!("{name}: prefill max|Δ| {prefill_err:.2e}, decode max|Δ| {decode_err:.2e}");
    assert!(
        prefill_err < TOLERANCE,
        "{name}: prefill logits differ by {prefill_err}"
    );
    assert_eq!(run.gen_ids, expected_gen, "{name}: greedy tokens");
    assert!(
        decode_err < TOLERANCE,
        "{name}: decode logits differ by {decode_err}"
    );

    // One no-cache pass over prompt + gen[..G-1] reproduces full_logits.
    let mut all = prompt.clone();
    all.extend_from_slice(&expected_gen[..expected_gen.len() - 1]);
    let mut session = engine.new_session();
    let full = engine.forward(&mut session, &all, LogitsFor::All).unwrap();
    let full_err = max_abs_diff(&full, &full_ref);
    assert!(
        full_err < TOLERANCE,
        "{name}: full logits differ by {full_err}"
    );
}

#[test]
fn qwen3_next_moe_matches_transformers() {
    check_fixture("qwen3_next_moe");
}

#[test]
fn qwen3_5_dense_matches_transformers() {
    check_fixture("qwen3_5_dense");
}

#[test]
fn qwen3_5_moe_sharded_matches_transformers() {
    check_fixture("qwen3_5_moe");
}

#[test]
fn qwen3_5_moe_fused_matches_transformers() {
    check_fixture("qwen3_5_moe_fused");
}

#[test]
fn sharded_per_expert_and_fused_layouts_give_identical_logits() {
    let prompt = Reference::load("qwen3_5_moe").ids("prompt_ids");
    let run = |name: &str| {
        let engine = Engine::load(&fixture(name)).unwrap();
        engine.greedy(&prompt, 4).unwrap()
    };
    let (a, b) = (run("qwen3_5_moe"), run("qwen3_5_moe_fused"));
    assert_eq!(a.prefill_logits, b.prefill_logits);
    assert_eq!(a.decode_logits, b.decode_logits);
    assert_eq!(a.gen_ids, b.gen_ids);
}

#[test]
fn prefill_in_pieces_equals_prefill_at_once() {
    let name = "qwen3_next_moe";
    let prompt = Reference::load(name).ids("prompt_ids");
    let engine = Engine::load(&fixture(name)).unwrap();
    let mut whole = engine.new_session();
    let at_once = engine
        .forward(&mut whole, &prompt, LogitsFor::Last)
        .unwrap();
    let mut pieces = engine.new_session();
    let (a, b) = prompt.split_at(prompt.len() / 3);
    engine.forward(&mut pieces, a, LogitsFor::Last).unwrap();
    let mut last = Vec::new();
    for &id in b {
        last = engine.forward(&mut pieces, &[id], LogitsFor::Last).unwrap();
    }
    assert!(max_abs_diff(&at_once, &last) < 1e-5);
}

#[test]
fn qwen4_exp_matches_transformers() {
    check_fixture("qwen4_exp");
}
