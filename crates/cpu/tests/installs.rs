//! Installs (`spindle convert`) on every MoE fixture: outputs bit-identical whatever the expert
//! residency and slot count, identical to quantizing on load, and damaged installs refused by
//! file name.

mod common;

use std::path::Path;

use common::{fixture, Reference, TempDir};
use spindle_cpu::{Engine, GreedyRun, LoadOptions};
use spindle_model::experts::{CachePolicy, ExpertResidency};
use spindle_model::install::{self, Verify};
use spindle_model::quant::WeightFormat;

const MOE_FIXTURES: &[&str] = &[
    "qwen3_next_moe",
    "qwen3_5_moe",
    "qwen3_5_moe_fused",
    "qwen4_exp",
];

fn convert(name: &str, quant: WeightFormat, dst: &Path) {
    install::convert(&fixture(name), dst, quant, &mut |_| true)
        .unwrap_or_else(|e| panic!("{name} {quant}: {e}"));
}

fn options(experts: ExpertResidency, slots: Option<usize>) -> LoadOptions {
    LoadOptions {
        experts,
        expert_slots: slots,
        ..Default::default()
    }
}

fn greedy(dir: &Path, options: &LoadOptions, prompt: &[u32], steps: usize) -> (GreedyRun, Engine) {
    let engine =
        Engine::load_with(dir, options).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    (engine.greedy(prompt, steps).unwrap(), engine)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_identical(a: &GreedyRun, b: &GreedyRun, what: &str) {
    assert_eq!(a.gen_ids, b.gen_ids, "{what}: greedy tokens");
    assert!(
        bits(&a.prefill_logits) == bits(&b.prefill_logits),
        "{what}: prefill logits differ"
    );
    assert!(
        bits(&a.decode_logits) == bits(&b.decode_logits),
        "{what}: decode logits differ"
    );
}

#[test]
fn every_residency_and_slot_count_gives_identical_outputs() {
    let tmp = TempDir::new("installs-residency");
    for name in MOE_FIXTURES {
        let reference = Reference::load(name);
        let prompt = reference.ids("prompt_ids");
        let steps = reference.ids("gen_ids").len();
        for quant in [WeightFormat::Bf16, WeightFormat::Q8] {
            let dst = tmp.0.join(format!("{name}-{quant}"));
            convert(name, quant, &dst);
            let (base, _) = greedy(
                &dst,
                &options(ExpertResidency::Resident, None),
                &prompt,
                steps,
            );

            // Loading the checkpoint and quantizing on load gives the same bytes, so the same
            // outputs, as the install.
            let on_load = LoadOptions {
                quant,
                ..Default::default()
            };
            let (hf, _) = greedy(&fixture(name), &on_load, &prompt, steps);
            assert_identical(
                &base,
                &hf,
                &format!("{name} {quant}: install vs checkpoint"),
            );

            let all = spindle_model::ModelConfig::from_dir(&dst)
                .unwrap()
                .moe
                .unwrap()
                .num_experts;
            let mut runs = vec![("mapped".to_string(), options(ExpertResidency::Mapped, None))];
            for slots in [1, 2, all] {
                runs.push((
                    format!("streamed/{slots}"),
                    options(ExpertResidency::Streamed, Some(slots)),
                ));
            }
            runs.push((
                "streamed/2/lfu".into(),
                LoadOptions {
                    expert_policy: CachePolicy::Lfu,
                    ..options(ExpertResidency::Streamed, Some(2))
                },
            ));
            for (label, opts) in runs {
                let (run, engine) = greedy(&dst, &opts, &prompt, steps);
                assert_identical(&base, &run, &format!("{name} {quant} {label}"));
                if label.starts_with("streamed") {
                    let stats = engine.expert_stats();
                    assert!(
                        stats.misses > 0 && stats.bytes_read > 0,
                        "{name} {label}: {stats:?}"
                    );
                    if label == "streamed/1" {
                        assert!(stats.hit_rate() < 1.0);
                    }
                }
            }
        }
    }
}

fn load_err(dir: &Path, verify: Verify) -> String {
    match Engine::load_with(
        dir,
        &LoadOptions {
            verify,
            ..Default::default()
        },
    ) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn damaged_installs_are_refused_by_file_name() {
    let tmp = TempDir::new("installs-damaged");
    let fresh = |tag: &str| {
        let dst = tmp.0.join(tag);
        convert("qwen3_5_moe", WeightFormat::Q8, &dst);
        dst
    };

    let dir = fresh("missing");
    std::fs::remove_file(dir.join("experts/layer-002.bin")).unwrap();
    let err = load_err(&dir, Verify::Sizes);
    assert!(
        err.contains("layer-002.bin") && err.contains("missing"),
        "{err}"
    );

    let dir = fresh("truncated");
    let path = dir.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let err = load_err(&dir, Verify::Sizes);
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );

    let dir = fresh("altered");
    let path = dir.join("experts/layer-001.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = load_err(&dir, Verify::Full);
    assert!(
        err.contains("layer-001.bin") && err.contains("SHA-256"),
        "{err}"
    );

    // An intact install verifies, and leaves a receipt that `Once` trusts.
    let dir = fresh("intact");
    Engine::load_with(
        &dir,
        &LoadOptions {
            verify: Verify::Full,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(dir.join(install::RECEIPT).exists());
    Engine::load_with(
        &dir,
        &LoadOptions {
            verify: Verify::Once,
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn a_cancelled_convert_leaves_nothing() {
    let tmp = TempDir::new("installs-cancel");
    let dst = tmp.0.join("install");
    let mut calls = 0;
    let err = install::convert(
        &fixture("qwen3_next_moe"),
        &dst,
        WeightFormat::Q4,
        &mut |p| {
            calls += 1;
            p.tensors_done < p.tensors_total / 2
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, install::InstallError::Cancelled { .. }),
        "{err}"
    );
    assert!(calls > 2);
    assert!(!dst.exists(), "a cancelled convert left {}", dst.display());
    assert!(
        !tmp.0.join("install.partial").exists(),
        "the partial directory remains"
    );
    // A convert onto an existing directory is refused.
    std::fs::create_dir_all(&dst).unwrap();
    let err = install::convert(
        &fixture("qwen3_next_moe"),
        &dst,
        WeightFormat::Q4,
        &mut |_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[test]
fn streaming_a_checkpoint_asks_for_a_convert() {
    let err = match Engine::load_with(
        &fixture("qwen3_5_moe"),
        &options(ExpertResidency::Streamed, Some(2)),
    ) {
        Ok(_) => panic!("streamed a checkpoint"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("spindle convert"), "{err}");
}

/// A streamed expert that cannot be read (its file shrank after the install was opened) fails
/// the step with an error naming the file, and the session refuses further steps; nothing
/// panics, and a new session on the same engine works once the file is whole again.
#[test]
fn a_failed_expert_read_is_an_error_not_a_crash() {
    let tmp = TempDir::new("installs-read-error");
    let dst = tmp.0.join("install");
    convert("qwen3_5_moe", WeightFormat::Q8, &dst);
    let engine = Engine::load_with(&dst, &options(ExpertResidency::Streamed, Some(1))).unwrap();
    let path = dst.join("experts/layer-000.bin");
    let whole = std::fs::read(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let prompt = Reference::load("qwen3_5_moe").ids("prompt_ids");
    let mut session = engine.new_session();
    let err = engine
        .forward(
            &mut session,
            &prompt,
            spindle_model::forward::LogitsFor::Last,
        )
        .expect_err("the experts of layer 0 cannot be read")
        .to_string();
    assert!(
        err.contains("layer-000.bin") && err.contains("reading expert"),
        "{err}"
    );
    let again = engine
        .forward(
            &mut session,
            &prompt[..1],
            spindle_model::forward::LogitsFor::Last,
        )
        .expect_err("the session is incomplete")
        .to_string();
    assert!(again.contains("incomplete"), "{again}");

    std::fs::write(&path, &whole).unwrap();
    let mut fresh = engine.new_session();
    engine
        .forward(&mut fresh, &prompt, spindle_model::forward::LogitsFor::Last)
        .unwrap();
}
