//! Damaged GGUF files: every refusal names the file and the tensor or metadata key.

use std::fs;
use std::path::{Path, PathBuf};

use spindle_model::{Checkpoint, ModelConfig};
use spindle_testkit::fixtures;

fn source(name: &str) -> PathBuf {
    fixtures().join("gguf").join(name)
}

/// A copy of GGUF fixture `name` in `dir`, its bytes passed through `edit`.
fn damaged(dir: &Path, name: &str, edit: impl Fn(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = fs::read(source(name)).unwrap();
    edit(&mut bytes);
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    path
}

fn open_err(path: &Path) -> String {
    match Checkpoint::open(path) {
        Ok(_) => panic!("opened a damaged GGUF file {}", path.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(message.contains(needle), "lacks {needle:?}: {message}");
    }
}

fn position(bytes: &[u8], needle: &[u8]) -> usize {
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

const MOE: &str = "qwen3_5_moe.bf16.gguf";

#[test]
fn a_truncated_file_is_refused_naming_a_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let path = damaged(tmp.path(), MOE, |b| b.truncate(b.len() / 2));
    let message = open_err(&path);
    assert_names(&message, &[MOE, "tensor `", "truncated"]);
    // The header itself cut short.
    let path = damaged(tmp.path(), MOE, |b| b.truncate(100));
    assert_names(&open_err(&path), &[MOE, "truncated"]);
}

#[test]
fn an_unsupported_tensor_type_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let path = damaged(tmp.path(), MOE, |b| {
        // Tensor info: name, n_dims u32, dims u64 × n, type u32, offset u64.
        let name = b"blk.0.ssm_out.weight";
        let at = position(b, name) + name.len();
        let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let ty = at + 4 + 8 * n_dims;
        b[ty..ty + 4].copy_from_slice(&6u32.to_le_bytes()); // Q5_0
    });
    assert_names(
        &open_err(&path),
        &[MOE, "blk.0.ssm_out.weight", "Q5_0", "not supported", "Q4_K"],
    );
}

#[test]
fn an_unknown_architecture_is_refused_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let path = damaged(tmp.path(), MOE, |b| {
        // The first occurrence is general.architecture's value.
        let at = position(b, b"qwen35moe");
        b[at..at + 9].copy_from_slice(b"llama4moe");
    });
    let message = ModelConfig::from_dir(&path).unwrap_err().to_string();
    assert_names(&message, &[MOE, "general.architecture", "llama4moe"]);
    assert_names(&open_err(&path), &["general.architecture", "llama4moe"]);
}

#[test]
fn an_unknown_metadata_key_is_refused_rather_than_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let path = damaged(tmp.path(), MOE, |b| {
        let key = b"qwen35moe.full_attention_interval";
        let at = position(b, key);
        b[at + key.len() - 8..at + key.len()].copy_from_slice(b"windowed");
    });
    let message = ModelConfig::from_dir(&path).unwrap_err().to_string();
    assert_names(
        &message,
        &[MOE, "qwen35moe.full_attention_windowed", "refused"],
    );
}

#[test]
fn a_file_that_is_not_gguf_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    fs::write(&path, b"PK\x03\x04 not a gguf file at all").unwrap();
    assert_names(&open_err(&path), &["model.gguf", "not a GGUF file"]);
}

#[test]
fn a_split_set_missing_a_part_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    for i in [1, 2] {
        let name = format!("qwen3_5_dense.bf16-0000{i}-of-00003.gguf");
        fs::copy(source(&name), tmp.path().join(&name)).unwrap();
    }
    let first = tmp.path().join("qwen3_5_dense.bf16-00001-of-00003.gguf");
    assert_names(
        &open_err(&first),
        &["qwen3_5_dense.bf16-00003-of-00003.gguf", "missing"],
    );
}

#[test]
fn the_config_maps_the_metadata() {
    let c = ModelConfig::from_dir(&source(MOE)).unwrap();
    let reference = ModelConfig::from_dir(&fixtures().join("qwen3_5_moe")).unwrap();
    assert_eq!(c.hidden_size, reference.hidden_size);
    assert_eq!(c.layers, reference.layers);
    assert_eq!(c.attention, reference.attention);
    assert_eq!(c.gdn, reference.gdn);
    assert_eq!(c.moe, reference.moe);
    assert_eq!(c.rope.rotary_dim, reference.rope.rotary_dim);
    assert_eq!(c.eos_token_ids, reference.eos_token_ids);
}

#[test]
fn end_of_turn_joins_end_of_sequence_and_a_rewritten_file_loads_the_same() {
    use spindle_model::gguf::file::{GgufFile, Value};
    use spindle_model::gguf::write::{write, TensorOut};
    let src = GgufFile::open(&source(MOE)).unwrap();
    let mut metadata = src.metadata.clone();
    metadata.push(("tokenizer.ggml.eot_token_id".into(), Value::U64(7)));
    let tensors: Vec<TensorOut> = src
        .tensors
        .iter()
        .map(|t| TensorOut {
            name: &t.name,
            ty: t.ty,
            ne: t.ne.clone(),
            bytes: src.bytes(t),
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("eot.gguf");
    write(&path, &metadata, &tensors).unwrap();
    let c = ModelConfig::from_dir(&path).unwrap();
    assert_eq!(c.eos_token_ids, vec![1, 7]);
    let (a, b) = (
        Checkpoint::open(&path).unwrap(),
        Checkpoint::open(&source(MOE)).unwrap(),
    );
    let name = "model.layers.0.linear_attn.in_proj_qkv.weight";
    let shape = a.shape(name).unwrap().to_vec();
    assert_eq!(
        a.matrix(name, &shape).unwrap().to_f32(),
        b.matrix(name, &shape).unwrap().to_f32()
    );
}
