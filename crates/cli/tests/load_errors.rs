//! Whole-model load errors through `spindle_cpu::Engine::load` on damaged copies of the
//! fixtures: the config and the tensors disagree, and the message says where.

use std::fs;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use spindle_cpu::Engine;
use spindle_testkit::copy_fixture;

fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// `Engine::load` must fail; returns its message after checking it names each of `needles`.
fn load_fails_naming(dir: &Path, needles: &[&str]) -> String {
    let message = match Engine::load(dir) {
        Ok(_) => panic!("loaded a damaged checkpoint at {}", dir.display()),
        Err(err) => err.to_string(),
    };
    for needle in needles {
        assert!(
            message.contains(needle),
            "message lacks {needle:?}: {message}"
        );
    }
    message
}

#[test]
fn config_hidden_size_disagreeing_with_the_weights() {
    let tmp = copy_fixture("qwen3_5_dense");
    // The vision tower's output width follows the text width (a disagreement between the two
    // is refused before any tensor is read), so both change and the weights disagree.
    edit_config(tmp.path(), |c| {
        c["text_config"]["hidden_size"] = 32.into();
        c["vision_config"]["out_hidden_size"] = 32.into();
    });
    load_fails_naming(
        tmp.path(),
        &[
            "model.language_model.embed_tokens.weight",
            "model.safetensors",
            "[512, 64]",
            "[512, 32]",
        ],
    );
}

#[test]
fn vision_width_disagreeing_with_the_text_width_is_refused_by_field() {
    let tmp = copy_fixture("qwen3_5_dense");
    edit_config(tmp.path(), |c| c["text_config"]["hidden_size"] = 32.into());
    load_fails_naming(
        tmp.path(),
        &[
            "config.json",
            "vision_config.out_hidden_size 64",
            "hidden_size is 32",
        ],
    );
}

#[test]
fn config_intermediate_size_disagreeing_with_the_weights() {
    let tmp = copy_fixture("qwen3_5_dense");
    edit_config(tmp.path(), |c| {
        c["text_config"]["intermediate_size"] = 100.into()
    });
    load_fails_naming(
        tmp.path(),
        &[
            "model.language_model.layers.0.mlp.gate_proj.weight",
            "[128, 64]",
            "[100, 64]",
        ],
    );
}

#[test]
fn config_expert_count_disagreeing_with_fused_experts() {
    let tmp = copy_fixture("qwen3_5_moe_fused");
    edit_config(tmp.path(), |c| c["text_config"]["num_experts"] = 4.into());
    load_fails_naming(
        tmp.path(),
        &[
            "model.language_model.layers.0.mlp.experts.gate_up_proj",
            "[8, 64, 64]",
            "[4, 64, 64]",
        ],
    );
}

#[test]
fn config_expert_count_above_the_per_expert_tensors_in_a_sharded_checkpoint() {
    let tmp = copy_fixture("qwen3_5_moe");
    edit_config(tmp.path(), |c| c["text_config"]["num_experts"] = 9.into());
    load_fails_naming(tmp.path(), &["mlp.experts.8.gate_proj.weight", "not found"]);
}

#[test]
fn tensor_missing_from_the_file() {
    let tmp = copy_fixture("qwen3_5_dense");
    let path = tmp.path().join("model.safetensors");
    let name = "model.language_model.layers.2.linear_attn.dt_bias";
    let bytes = fs::read(&path).unwrap();
    let parsed = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView)> = parsed
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect();
    fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
    load_fails_naming(
        tmp.path(),
        &[name, "not found", &tmp.path().display().to_string()],
    );
}

#[test]
fn tensor_of_an_unsupported_dtype() {
    let tmp = copy_fixture("qwen3_5_dense");
    let path = tmp.path().join("model.safetensors");
    let name = "model.language_model.norm.weight";
    let bytes = fs::read(&path).unwrap();
    let parsed = SafeTensors::deserialize(&bytes).unwrap();
    // The same values' bit patterns stored as I16: same size, not a float type.
    let norm = parsed.tensor(name).unwrap();
    let data = norm.data().to_vec();
    let shape = norm.shape().to_vec();
    let mut tensors: Vec<(String, TensorView)> = parsed
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect();
    tensors.push((
        name.to_owned(),
        TensorView::new(Dtype::I16, shape, &data).unwrap(),
    ));
    fs::write(&path, safetensors::serialize(tensors, None).unwrap()).unwrap();
    load_fails_naming(
        tmp.path(),
        &[name, "model.safetensors", "I16", "not supported"],
    );
}

#[test]
fn missing_config_json_names_it() {
    let tmp = copy_fixture("qwen3_5_dense");
    fs::remove_file(tmp.path().join("config.json")).unwrap();
    load_fails_naming(tmp.path(), &["config.json"]);
}

#[test]
fn missing_shard_names_it() {
    let tmp = copy_fixture("qwen3_5_moe");
    fs::remove_file(tmp.path().join("model-00003-of-00004.safetensors")).unwrap();
    load_fails_naming(tmp.path(), &["model-00003-of-00004.safetensors"]);
}

#[test]
fn unknown_model_type_is_refused_by_name() {
    let tmp = copy_fixture("qwen3_5_dense");
    edit_config(tmp.path(), |c| c["model_type"] = "qwen9_hyper".into());
    load_fails_naming(tmp.path(), &["model_type \"qwen9_hyper\"", "config.json"]);
}
