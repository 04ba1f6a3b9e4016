//! `Checkpoint` on damaged copies of the fixtures: every refusal names the file and/or tensor.
//! (Shape mismatches against the config need the engine's loader: `crates/cli/tests/load_errors.rs`.)

use std::fs;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use serde_json::Value;
use spindle_model::{Checkpoint, ModelError};
use spindle_testkit::{copy_fixture, fixture};

fn open_err(dir: &Path) -> ModelError {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("opened a damaged checkpoint at {}", dir.display()),
        Err(err) => err,
    }
}

fn assert_names(err: &ModelError, needles: &[&str]) {
    let message = err.to_string();
    for needle in needles {
        assert!(
            message.contains(needle),
            "message lacks {needle:?}: {message}"
        );
    }
}

/// Rewrites the safetensors file at `path` without tensor `drop`.
fn rewrite_without(path: &Path, drop: &str) {
    let bytes = fs::read(path).unwrap();
    let parsed = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, TensorView)> = parsed
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != drop)
        .collect();
    assert_eq!(
        kept.len() + 1,
        parsed.len(),
        "{drop} is not in {}",
        path.display()
    );
    let out = safetensors::serialize(kept, None).unwrap();
    fs::write(path, out).unwrap();
}

const DENSE_A_LOG: &str = "model.language_model.layers.1.linear_attn.A_log";
const SHARD_1: &str = "model-00001-of-00004.safetensors";
const SHARD_2: &str = "model-00002-of-00004.safetensors";
const INDEX: &str = "model.safetensors.index.json";

fn read_index(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join(INDEX)).unwrap()).unwrap()
}

fn write_index(dir: &Path, index: &Value) {
    fs::write(
        dir.join(INDEX),
        serde_json::to_string_pretty(index).unwrap(),
    )
    .unwrap();
}

/// A tensor the index places in `shard`.
fn tensor_in(index: &Value, shard: &str) -> String {
    index["weight_map"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, file)| *file == shard)
        .map(|(name, _)| name.clone())
        .unwrap()
}

#[test]
fn fixtures_open_cleanly() {
    for name in [
        "qwen3_next_moe",
        "qwen3_5_dense",
        "qwen3_5_moe",
        "qwen3_5_moe_fused",
    ] {
        let checkpoint = Checkpoint::open(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(checkpoint.names().count() > 10, "{name}");
    }
}

#[test]
fn missing_tensor_names_the_tensor_and_directory() {
    let tmp = copy_fixture("qwen3_5_dense");
    rewrite_without(&tmp.path().join("model.safetensors"), DENSE_A_LOG);
    let checkpoint = Checkpoint::open(tmp.path()).unwrap();
    assert!(!checkpoint.contains(DENSE_A_LOG));
    let err = checkpoint.f32_values(DENSE_A_LOG, &[4]).unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert_names(&err, &[DENSE_A_LOG, &tmp.path().display().to_string()]);
}

#[test]
fn wrong_shape_names_the_tensor_file_and_both_shapes() {
    let dir = fixture("qwen3_5_dense");
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let name = "model.language_model.embed_tokens.weight";
    let err = checkpoint.matrix(name, &[512, 32]).unwrap_err();
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err:?}");
    assert_names(&err, &[name, "model.safetensors", "[512, 64]", "[512, 32]"]);
}

#[test]
fn integer_read_of_a_float_tensor_names_the_dtype() {
    let checkpoint = Checkpoint::open(&fixture("qwen3_5_dense")).unwrap();
    let err = checkpoint.i64_values(DENSE_A_LOG, &[4]).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedDtype { .. }),
        "{err:?}"
    );
    assert_names(&err, &[DENSE_A_LOG, "model.safetensors", "BF16"]);
}

#[test]
fn truncated_file_names_the_file() {
    let tmp = copy_fixture("qwen3_5_dense");
    let path = tmp.path().join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err:?}");
    assert_names(
        &err,
        &[&path.display().to_string(), "not a valid safetensors file"],
    );
}

#[test]
fn file_shorter_than_the_length_prefix_names_the_file() {
    let tmp = copy_fixture("qwen3_5_dense");
    let path = tmp.path().join("model.safetensors");
    fs::write(&path, [1u8, 2, 3]).unwrap();
    assert_names(&open_err(tmp.path()), &[&path.display().to_string()]);
}

#[test]
fn truncated_shard_names_the_shard() {
    let tmp = copy_fixture("qwen3_5_moe");
    let path = tmp.path().join(SHARD_2);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err:?}");
    assert_names(&err, &[SHARD_2]);
}

#[test]
fn missing_shard_names_the_shard() {
    let tmp = copy_fixture("qwen3_5_moe");
    fs::remove_file(tmp.path().join(SHARD_2)).unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    assert_names(&err, &[SHARD_2]);
}

#[test]
fn index_pointing_a_tensor_at_a_missing_shard_names_the_shard() {
    let tmp = copy_fixture("qwen3_5_moe");
    let mut index = read_index(tmp.path());
    let name = tensor_in(&index, SHARD_1);
    index["weight_map"][&name] = "model-00005-of-00004.safetensors".into();
    write_index(tmp.path(), &index);
    let err = open_err(tmp.path());
    assert_names(&err, &["model-00005-of-00004.safetensors"]);
}

#[test]
fn index_naming_a_tensor_no_shard_holds() {
    let tmp = copy_fixture("qwen3_5_moe");
    let mut index = read_index(tmp.path());
    let ghost = "model.language_model.layers.9.mlp.gate.weight";
    index["weight_map"][ghost] = SHARD_1.into();
    write_index(tmp.path(), &index);
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Index { .. }), "{err:?}");
    assert_names(&err, &[ghost, SHARD_1, INDEX]);
}

#[test]
fn index_placing_a_tensor_in_the_wrong_shard() {
    let tmp = copy_fixture("qwen3_5_moe");
    let mut index = read_index(tmp.path());
    let name = tensor_in(&index, SHARD_1);
    index["weight_map"][&name] = SHARD_2.into();
    write_index(tmp.path(), &index);
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Index { .. }), "{err:?}");
    assert_names(&err, &[&name, SHARD_1, SHARD_2]);
}

#[test]
fn tensor_dropped_from_its_shard_but_listed_in_the_index() {
    let tmp = copy_fixture("qwen3_5_moe");
    let index = read_index(tmp.path());
    let name = tensor_in(&index, SHARD_2);
    rewrite_without(&tmp.path().join(SHARD_2), &name);
    let err = open_err(tmp.path());
    assert_names(&err, &[&name, SHARD_2]);
}

#[test]
fn tensor_stored_in_two_shards() {
    let tmp = copy_fixture("qwen3_5_moe");
    let index = read_index(tmp.path());
    let name = tensor_in(&index, SHARD_1);
    // Shard 2 gets a copy of a shard-1 tensor.
    let first = fs::read(tmp.path().join(SHARD_1)).unwrap();
    let second = fs::read(tmp.path().join(SHARD_2)).unwrap();
    let first = SafeTensors::deserialize(&first).unwrap();
    let second = SafeTensors::deserialize(&second).unwrap();
    let mut tensors: Vec<(String, TensorView)> = second.tensors();
    tensors.push((name.clone(), first.tensor(&name).unwrap()));
    fs::write(
        tmp.path().join(SHARD_2),
        safetensors::serialize(tensors, None).unwrap(),
    )
    .unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Index { .. }), "{err:?}");
    assert_names(&err, &[&name, "twice"]);
}

#[test]
fn shard_name_with_a_path_is_refused() {
    let tmp = copy_fixture("qwen3_5_moe");
    let mut index = read_index(tmp.path());
    let name = tensor_in(&index, SHARD_1);
    index["weight_map"][&name] = format!("../{SHARD_1}").into();
    write_index(tmp.path(), &index);
    let err = open_err(tmp.path());
    assert_names(&err, &[&name, "plain file names"]);
}

#[test]
fn index_that_is_not_json_names_the_index() {
    let tmp = copy_fixture("qwen3_5_moe");
    fs::write(tmp.path().join(INDEX), "{\"weight_map\": {").unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Json { .. }), "{err:?}");
    assert_names(&err, &[INDEX]);
}

#[test]
fn index_without_weight_map_names_the_field() {
    let tmp = copy_fixture("qwen3_5_moe");
    fs::write(tmp.path().join(INDEX), "{\"metadata\": {}}").unwrap();
    assert_names(&open_err(tmp.path()), &[INDEX, "weight_map"]);
}

#[test]
fn no_model_safetensors_names_the_expected_files() {
    let tmp = tempfile::tempdir().unwrap();
    fs::copy(
        fixture("qwen3_5_dense").join("config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    let err = open_err(tmp.path());
    assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    assert_names(&err, &["model.safetensors", INDEX]);
}

#[test]
fn a_safetensors_file_that_is_json_garbage_names_the_file() {
    let tmp = copy_fixture("qwen3_5_dense");
    let path = tmp.path().join("model.safetensors");
    let header = b"{\"a\": not json}";
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    fs::write(&path, bytes).unwrap();
    assert_names(
        &open_err(tmp.path()),
        &["model.safetensors", "not a valid safetensors file"],
    );
}
