//! End-to-end tests of the `spindle` binary on the fixtures.

use std::path::Path;
use std::process::{Command, Output};

use safetensors::{Dtype, SafeTensors};
use spindle_model::Checkpoint;
use spindle_testkit::{fixture, fixtures};

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("cannot start the spindle binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn f32s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let view = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    assert_eq!(view.dtype(), Dtype::F32, "{name}");
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (view.shape().to_vec(), data)
}

fn i64s(st: &SafeTensors, name: &str) -> (Vec<usize>, Vec<i64>) {
    let view = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    assert_eq!(view.dtype(), Dtype::I64, "{name}");
    let data = view
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (view.shape().to_vec(), data)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) })
}

/// `spindle logits --tokens-from REF --decode G --compare REF` on a fixture writes what the
/// reference holds; the written file is checked here independently of `--compare`.
fn reproduces_reference(name: &str) {
    let dir = fixture(name);
    let reference_path = dir.join("reference.safetensors");
    let reference_bytes = std::fs::read(&reference_path).unwrap();
    let reference = SafeTensors::deserialize(&reference_bytes).unwrap();
    let (_, ref_gen) = i64s(&reference, "gen_ids");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("logits.safetensors");

    let output = spindle(&[
        "logits",
        "--model",
        p(&dir),
        "--tokens-from",
        p(&reference_path),
        "--decode",
        &ref_gen.len().to_string(),
        "--out",
        p(&out),
        "--compare",
        p(&reference_path),
    ]);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{name}: {}\n{stdout}\n{}",
        output.status,
        text(&output.stderr)
    );
    assert!(stdout.contains("match"), "{stdout}");

    let written_bytes = std::fs::read(&out).unwrap();
    let written = SafeTensors::deserialize(&written_bytes).unwrap();
    let mut names = written.names();
    names.sort();
    assert_eq!(
        names,
        ["decode_logits", "gen_ids", "prefill_logits", "prompt_ids"]
    );
    assert_eq!(
        i64s(&written, "prompt_ids"),
        i64s(&reference, "prompt_ids"),
        "{name}: prompt_ids"
    );
    assert_eq!(
        i64s(&written, "gen_ids"),
        i64s(&reference, "gen_ids"),
        "{name}: gen_ids"
    );
    for tensor in ["prefill_logits", "decode_logits"] {
        let (shape, ours) = f32s(&written, tensor);
        let (ref_shape, theirs) = f32s(&reference, tensor);
        assert_eq!(shape, ref_shape, "{name}: {tensor} shape");
        let diff = max_abs_diff(&ours, &theirs);
        assert!(diff < 1e-3, "{name}: {tensor} max abs diff {diff}");
    }
    // Written atomically: nothing but the output is left in the directory.
    assert_eq!(std::fs::read_dir(out_dir.path()).unwrap().count(), 1);
}

#[test]
fn logits_reproduce_qwen3_next_moe() {
    reproduces_reference("qwen3_next_moe");
}

#[test]
fn logits_reproduce_qwen3_5_dense() {
    reproduces_reference("qwen3_5_dense");
}

#[test]
fn logits_reproduce_qwen3_5_moe_sharded() {
    reproduces_reference("qwen3_5_moe");
}

#[test]
fn logits_reproduce_qwen3_5_moe_fused() {
    reproduces_reference("qwen3_5_moe_fused");
}

#[test]
fn logits_reproduce_qwen4_exp() {
    reproduces_reference("qwen4_exp");
}

/// With images in the reference (`image_0`, `image_1`), `spindle logits` patchifies them, places
/// them on the prompt's pads and writes `vision_embeds`: every tensor matches transformers
/// within 1e-4. With `--no-vision` the same run is refused by name.
#[test]
fn logits_place_the_references_images_and_write_vision_embeds() {
    for name in ["qwen3_5_dense_vision", "qwen3_5_moe_vision"] {
        let dir = fixture(name);
        let reference_path = dir.join("reference.safetensors");
        let out_dir = tempfile::tempdir().unwrap();
        let out = out_dir.path().join("logits.safetensors");
        let args = [
            "logits",
            "--model",
            p(&dir),
            "--tokens-from",
            p(&reference_path),
            "--decode",
            "6",
            "--out",
            p(&out),
        ];
        let compare = ["--compare", p(&reference_path), "--tolerance", "1e-4"];
        let output = spindle(&[&args[..], &compare[..]].concat());
        let stdout = text(&output.stdout);
        assert!(
            output.status.success(),
            "{name}: {}\n{stdout}\n{}",
            output.status,
            text(&output.stderr)
        );
        assert!(
            stdout.contains("vision_embeds") && stdout.contains("match"),
            "{stdout}"
        );
        let written_bytes = std::fs::read(&out).unwrap();
        let written = SafeTensors::deserialize(&written_bytes).unwrap();
        let (shape, _) = f32s(&written, "vision_embeds");
        assert_eq!(shape, [19, 64]);

        let output = spindle(&[&args[..], &["--no-vision"][..]].concat());
        let stderr = text(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains("--no-vision"), "{stderr}");
    }
}

#[test]
fn logits_with_explicit_tokens_and_no_decode_write_prompt_and_prefill_only() {
    let dir = fixture("qwen3_5_dense");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("x.safetensors");
    let output = spindle(&[
        "logits",
        "--model",
        p(&dir),
        "--tokens",
        "1,2,3",
        "--out",
        p(&out),
        "--device",
        "cpu",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let written = SafeTensors::deserialize(&bytes).unwrap();
    let mut names = written.names();
    names.sort();
    assert_eq!(names, ["prefill_logits", "prompt_ids"]);
    assert_eq!(i64s(&written, "prompt_ids"), (vec![3], vec![1, 2, 3]));
    let (shape, logits) = f32s(&written, "prefill_logits");
    assert_eq!(shape, [3, 512]);
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn compare_fails_when_the_prompt_differs_from_the_reference() {
    let dir = fixture("qwen3_5_dense");
    let reference = dir.join("reference.safetensors");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("x.safetensors");
    let output = spindle(&[
        "logits",
        "--model",
        p(&dir),
        "--tokens",
        "1,2,3",
        "--decode",
        "2",
        "--out",
        p(&out),
        "--compare",
        p(&reference),
    ]);
    assert!(!output.status.success());
    let all = text(&output.stdout) + &text(&output.stderr);
    assert!(all.contains("prompt_ids") && all.contains("FAIL"), "{all}");
}

#[test]
fn compare_fails_on_a_tolerance_no_run_can_meet() {
    let dir = fixture("qwen3_next_moe");
    let reference = dir.join("reference.safetensors");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("x.safetensors");
    let output = spindle(&[
        "logits",
        "--model",
        p(&dir),
        "--tokens-from",
        p(&reference),
        "--out",
        p(&out),
        "--compare",
        p(&reference),
        "--tolerance",
        "0",
    ]);
    // f32 arithmetic against a float64 reference is never exact.
    assert!(!output.status.success(), "{}", text(&output.stdout));
    assert!(
        text(&output.stderr).contains("prefill_logits"),
        "{}",
        text(&output.stderr)
    );
}

fn assert_fails_naming(args: &[&str], needles: &[&str]) {
    let output = spindle(args);
    assert!(!output.status.success(), "{args:?} succeeded");
    let stderr = text(&output.stderr);
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}:\n{stderr}"
        );
    }
}

#[test]
fn bad_tokens_are_refused_naming_the_entry() {
    let dir = fixture("qwen3_5_dense");
    let out = std::env::temp_dir().join("spindle-cli-test-never-written.safetensors");
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens",
            "1,2,x7",
            "--out",
            p(&out),
        ],
        &["entry 3", "\"x7\""],
    );
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens",
            "1,-2",
            "--out",
            p(&out),
        ],
        &["entry 2", "\"-2\""],
    );
    assert!(!out.exists());
}

#[test]
fn token_outside_the_vocabulary_is_refused_naming_it() {
    let dir = fixture("qwen3_5_dense");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("x.safetensors");
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens",
            "1,512",
            "--out",
            p(&out),
        ],
        &["512", "vocab"],
    );
    assert!(!out.exists());
}

#[test]
fn unknown_device_is_refused_listing_the_devices() {
    let dir = fixture("qwen3_5_dense");
    let out = std::env::temp_dir().join("spindle-cli-test-never-written.safetensors");
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens",
            "1",
            "--out",
            p(&out),
            "--device",
            "tpu",
        ],
        &["\"tpu\"", "available devices: cpu"],
    );
    // Without the `cuda` feature, CUDA is refused by name; with it, on a machine without a
    // driver, `--device cuda` fails with the backend's own message (tested in crates/cuda).
    #[cfg(not(feature = "cuda"))]
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens",
            "1",
            "--out",
            p(&out),
            "--device",
            "cuda:0",
        ],
        &["cuda:0", "available devices: cpu"],
    );
}

#[test]
fn missing_model_dir_is_refused_naming_it() {
    let out_dir = tempfile::tempdir().unwrap();
    let missing = out_dir.path().join("no-such-model");
    let out = out_dir.path().join("x.safetensors");
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&missing),
            "--tokens",
            "1",
            "--out",
            p(&out),
        ],
        &[p(&missing), "does not exist"],
    );
}

#[test]
fn tokens_from_a_file_without_prompt_ids_is_refused() {
    let dir = fixture("qwen3_5_dense");
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("x.safetensors");
    let weights = dir.join("model.safetensors");
    assert_fails_naming(
        &[
            "logits",
            "--model",
            p(&dir),
            "--tokens-from",
            p(&weights),
            "--out",
            p(&out),
        ],
        &["prompt_ids", p(&weights)],
    );
}

fn inspect_json(path: &Path) -> serde_json::Value {
    let output = spindle(&["inspect", "--json", p(path)]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("inspect --json prints JSON")
}

#[test]
fn inspect_35b_config_gives_plausible_totals() {
    let config = fixtures().join("configs/qwen3_6_35b_a3b.config.json");
    let json = inspect_json(&config);
    assert_eq!(json["family"], "qwen3_5_moe");
    assert_eq!(json["num_layers"], 40);
    let total = json["total_params"].as_u64().unwrap() as f64;
    let active = json["active_params"].as_u64().unwrap() as f64;
    // By hand (V 248320, H 2048, 40 layers, 10 attention + 30 GDN, 256 experts of I 512, top-8):
    // embedding + LM head 2·V·H = 1.017e9; attention 10·(16·256·2·H + 2·2·256·H + H·16·256 + 512)
    // = 0.273e9; GDN 30·(8192·H + 4096·H + 64·H + 8192·4 + 64 + 128 + H·4096) = 1.012e9; routed
    // experts 40·256·3·H·512 = 32.212e9; router 40·256·H = 0.021e9; shared 40·(3·H·512 + H)
    // = 0.126e9; norms 0.0002e9. Total 34.66e9 (the published 35B adds the vision tower and MTP);
    // active: routed experts 40·8·3·H·512 = 1.007e9 instead of 32.212e9, so 3.45e9 ("A3B").
    assert!((34e9..37e9).contains(&total), "total {total}");
    assert!((34.6e9..34.7e9).contains(&total), "total {total}");
    assert!((3.0e9..3.6e9).contains(&active), "active {active}");
    assert_eq!(
        json["parameters"]["routed_experts"]["total"],
        40 * 256 * 3 * 2048 * 512u64
    );
    assert_eq!(
        json["parameters"]["routed_experts"]["active"],
        40 * 8 * 3 * 2048 * 512u64
    );
    assert_eq!(json["parameters"]["embedding"]["total"], 248_320 * 2048u64);

    let output = spindle(&["inspect", p(&config)]);
    assert!(output.status.success());
    let table = text(&output.stdout);
    assert!(
        table.contains("34.66B") && table.contains("3.45B") && table.contains("GGGA ×10"),
        "{table}"
    );
}

#[test]
fn inspect_counts_match_the_fixture_tensors() {
    // Every parameter the loader reads (vision tower and MTP excluded) against the formula.
    for name in [
        "qwen3_next_moe",
        "qwen3_5_dense",
        "qwen3_5_moe",
        "qwen3_5_moe_fused",
        "qwen4_exp",
    ] {
        let dir = fixture(name);
        let json = inspect_json(&dir);
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let stored: u64 = checkpoint
            .names()
            .filter(|n| !n.starts_with("model.visual.") && !n.starts_with("mtp."))
            .map(|n| checkpoint.shape(n).unwrap().iter().product::<usize>() as u64)
            .sum();
        assert_eq!(json["total_params"].as_u64().unwrap(), stored, "{name}");
    }
}

#[test]
fn inspect_reads_the_fp8_27b_config_and_names_its_format() {
    let json = inspect_json(&fixtures().join("configs/qwen3_6_27b_fp8.config.json"));
    assert_eq!(json["family"], "qwen3_5");
    let format = json["source_format"].as_str().unwrap();
    assert!(
        format.contains("block FP8") && format.contains("128x128"),
        "{format}"
    );
}

#[test]
fn inspect_flash_next_config_counts_the_ngram_table_as_inactive() {
    let json = inspect_json(&fixtures().join("configs/qwen3_8_flash_next.config.json"));
    assert_eq!(json["family"], "qwen4_exp");
    assert_eq!(json["hyper_connections"]["streams"], 4);
    let params = &json["parameters"];
    let table = params["ngram_table"]["total"].as_u64().unwrap() as f64;
    assert!((51.0e9..51.3e9).contains(&table), "n-gram table {table}");
    assert_eq!(params["ngram_table"]["active"], 0);
    // About 125B without the 51B n-gram table (DESIGN.md); active: top-10 of 512 experts.
    let total = json["total_params"].as_u64().unwrap() as f64;
    assert!(
        (120e9..130e9).contains(&(total - table)),
        "total without the table {total}"
    );
    let routed = params["routed_experts"]["total"].as_u64().unwrap();
    assert_eq!(
        params["routed_experts"]["active"].as_u64().unwrap(),
        routed / 512 * 10
    );
    let active = json["active_params"].as_u64().unwrap() as f64;
    assert!((6e9..8e9).contains(&active), "active {active}");
}

#[test]
fn inspect_missing_path_is_refused_naming_it() {
    let missing = fixtures().join("configs/no_such.config.json");
    assert_fails_naming(&["inspect", p(&missing)], &[p(&missing), "does not exist"]);
}
