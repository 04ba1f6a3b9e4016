//! A NaN written into a fixture's weights: `--check-weights` refuses the tensor by name at
//! load; without it the forward pass fails naming where the hidden state went non-finite
//! (before this check the logits were all NaN, greedy picked token 0 and `spindle` exited 0).

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use spindle_testkit::copy_fixture;

fn spindle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .output()
        .expect("cannot start the spindle binary")
}

/// Overwrites element `index` of tensor `name` (bf16, f16 or f32) with a NaN in whichever
/// safetensors file of `dir` holds it.
fn write_nan(dir: &Path, name: &str, index: usize) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let Some(tensor) = header.get(name) else {
            continue;
        };
        let start = tensor["data_offsets"][0].as_u64().unwrap() as usize;
        let nan: &[u8] = match tensor["dtype"].as_str().unwrap() {
            "BF16" => &[0xc0, 0x7f],
            "F16" => &[0x00, 0x7e],
            "F32" => &[0x00, 0x00, 0xc0, 0x7f],
            other => panic!("{name} is {other}"),
        };
        let mut file = OpenOptions::new().write(true).open(&path).unwrap();
        let at = 8 + n + start + index * nan.len();
        file.seek(SeekFrom::Start(at as u64)).unwrap();
        file.write_all(nan).unwrap();
        return;
    }
    panic!("no safetensors file in {} holds {name}", dir.display());
}

/// Runs `spindle logits` on `dir` (plus `extra`), which must fail; returns stderr.
fn logits_fails(dir: &Path, extra: &[&str]) -> String {
    // Outside the model: --out refuses a path inside the model being read.
    let out_dir = tempfile::tempdir().unwrap();
    let out_file = out_dir.path().join("out.safetensors");
    let mut args = vec![
        "logits",
        "--model",
        dir.to_str().unwrap(),
        "--tokens",
        "1,2,3",
        "--decode",
        "2",
        "--out",
        out_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = spindle(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "succeeded on NaN weights: {stderr}");
    assert!(!out_file.exists(), "wrote logits from NaN weights");
    stderr
}

#[test]
fn nan_in_lm_head_is_refused_by_name_with_check_weights() {
    let tmp = copy_fixture("qwen3_5_moe");
    write_nan(tmp.path(), "lm_head.weight", 100);
    let err = logits_fails(tmp.path(), &["--check-weights"]);
    assert!(
        err.contains("`lm_head.weight`") && err.contains("element 100 is NaN"),
        "{err}"
    );
    assert!(err.contains("--check-weights"), "{err}");
}

#[test]
fn nan_in_lm_head_fails_the_step_naming_the_head() {
    let tmp = copy_fixture("qwen3_5_moe");
    write_nan(tmp.path(), "lm_head.weight", 100);
    let err = logits_fails(tmp.path(), &[]);
    assert!(
        err.contains("non-finite") && err.contains("LM head"),
        "{err}"
    );
}

#[test]
fn nan_in_a_layer_weight_names_the_layer() {
    let tmp = copy_fixture("qwen3_5_moe");
    let tensor = "model.language_model.layers.2.mlp.shared_expert.down_proj.weight";
    write_nan(tmp.path(), tensor, 5);
    let err = logits_fails(tmp.path(), &[]);
    assert!(
        err.contains("non-finite") && err.contains("in layer 2 (its FFN)"),
        "{err}"
    );
    let err = logits_fails(tmp.path(), &["--check-weights"]);
    assert!(err.contains(&format!("`{tensor}`")), "{err}");
}

#[test]
fn nan_in_an_attention_weight_names_the_layer_on_every_family() {
    // The mixer of the last layer (full attention in every fixture's pattern).
    for (fixture, prefix) in [
        ("qwen3_5_dense", "model.language_model."),
        ("qwen3_next_moe", "model."),
    ] {
        let tmp = copy_fixture(fixture);
        let config: Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("config.json")).unwrap())
                .unwrap();
        let text = config.get("text_config").unwrap_or(&config);
        let layers = text["num_hidden_layers"].as_u64().unwrap() as usize;
        let last = layers - 1;
        write_nan(
            tmp.path(),
            &format!("{prefix}layers.{last}.self_attn.o_proj.weight"),
            0,
        );
        let err = logits_fails(tmp.path(), &[]);
        assert!(
            err.contains(&format!("in layer {last} (its mixer)")),
            "{fixture}: {err}"
        );
    }
}

#[test]
fn clean_fixture_passes_check_weights() {
    let tmp = copy_fixture("qwen3_5_moe");
    let out_dir = tempfile::tempdir().unwrap();
    let out_file = out_dir.path().join("out.safetensors");
    let out = spindle(&[
        "logits",
        "--model",
        tmp.path().to_str().unwrap(),
        "--tokens",
        "1,2,3",
        "--out",
        out_file.to_str().unwrap(),
        "--check-weights",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn nan_in_an_install_expert_pack_is_refused_by_name_with_check_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let install = tmp.path().join("q8");
    let src = spindle_testkit::fixture("qwen3_5_moe");
    let out = spindle(&[
        "convert",
        src.to_str().unwrap(),
        install.to_str().unwrap(),
        "--quant",
        "q8",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(install.join("manifest.json")).unwrap()).unwrap();
    let layer = &manifest["experts"][1];
    let part = &layer["parts"][0];
    let mut file = OpenOptions::new()
        .write(true)
        .open(install.join(layer["file"].as_str().unwrap()))
        .unwrap();
    // The f16 scale of the fourth block of expert 0's first part.
    let at = part["scales_offset"].as_u64().unwrap() + 2 * 3;
    file.seek(SeekFrom::Start(at)).unwrap();
    file.write_all(&[0x00, 0x7e]).unwrap();
    drop(file);
    let err = logits_fails(&install, &["--check-weights"]);
    let name = format!(
        "layer {} expert 0 {} (scales)",
        layer["layer"],
        part["name"].as_str().unwrap()
    );
    assert!(
        err.contains(&name) && err.contains("element 3 is NaN"),
        "{err}"
    );
}

/// On CUDA the steps carry no checks: a step whose logits are not finite replays the sequence
/// with a check after every sublayer and names the same site as the CPU engine.
#[cfg(feature = "cuda")]
#[test]
fn on_cuda_a_nan_weight_names_the_layer_as_on_the_cpu() {
    let tmp = copy_fixture("qwen3_5_moe");
    let tensor = "model.language_model.layers.2.mlp.shared_expert.down_proj.weight";
    write_nan(tmp.path(), tensor, 5);
    let err = logits_fails(tmp.path(), &["--device", "cuda"]);
    assert!(
        err.contains("not finite") && err.contains("in layer 2 (its FFN)"),
        "{err}"
    );
    let tmp = copy_fixture("qwen3_5_moe");
    write_nan(tmp.path(), "lm_head.weight", 100);
    let err = logits_fails(tmp.path(), &["--device", "cuda"]);
    assert!(err.contains("in the LM head"), "{err}");
}
