//! Damaged block-FP8 checkpoints: each refusal names the file and the tensor or field.

use std::fs;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use spindle_model::fp8::make::write_fp8_pair;
use spindle_model::{Checkpoint, ModelConfig};
use spindle_testkit::fixture;

const DOWN: &str = "model.language_model.layers.0.mlp.down_proj.weight";
const DOWN_SCALE: &str = "model.language_model.layers.0.mlp.down_proj.weight_scale_inv";

/// The dense fixture as block FP8 ([32, 48] blocks) in a temporary directory.
fn fp8_dense() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    write_fp8_pair(
        &fixture("qwen3_5_dense"),
        &tmp.path().join("fp8"),
        &tmp.path().join("deq"),
        [32, 48],
    )
    .unwrap();
    tmp
}

/// Rewrites `dir/model.safetensors` with `edit` applied to its tensor list.
fn rewrite(dir: &Path, edit: impl Fn(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = fs::read(&path).unwrap();
    let parsed = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = parsed
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("opened a damaged FP8 checkpoint at {}", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(message.contains(needle), "lacks {needle:?}: {message}");
    }
}

#[test]
fn the_generated_checkpoint_opens_and_hides_its_scales() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.fp8().unwrap().block, [32, 48]);
    assert!(ck.contains(DOWN_SCALE));
    assert!(!ck.names().any(|n| n.ends_with("_scale_inv")));
    // down_proj [64, 128]: scales [2, 3] (the last column block is partial, 128 = 2·48 + 32).
    assert_eq!(ck.shape(DOWN_SCALE), Some(&[2, 3][..]));
    let config = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(config.fp8.unwrap().block, [32, 48]);
}

#[test]
fn a_missing_scale_tensor_is_named() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    rewrite(&dir, |t| t.retain(|(n, ..)| n != DOWN_SCALE));
    assert_names(
        &open_err(&dir),
        &[
            DOWN,
            "model.safetensors",
            "without its scale tensor",
            DOWN_SCALE,
        ],
    );
}

#[test]
fn a_scale_of_the_wrong_shape_is_named_with_both_shapes() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    rewrite(&dir, |t| {
        let scale = t.iter_mut().find(|(n, ..)| n == DOWN_SCALE).unwrap();
        scale.2 = vec![3, 2];
    });
    assert_names(
        &open_err(&dir),
        &[DOWN, "model.safetensors", "[3, 2]", "[2, 3]", "[32, 48]"],
    );
}

#[test]
fn a_scale_of_an_integer_dtype_is_refused() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    rewrite(&dir, |t| {
        let scale = t.iter_mut().find(|(n, ..)| n == DOWN_SCALE).unwrap();
        scale.1 = Dtype::I32;
    });
    assert_names(&open_err(&dir), &[DOWN, DOWN_SCALE, "I32"]);
}

#[test]
fn fp8_tensors_without_a_quantization_config_are_refused() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    fs::copy(
        fixture("qwen3_5_dense").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    assert_names(
        &open_err(&dir),
        &[
            "model.safetensors",
            "F8_E4M3",
            "quantization_config",
            "config.json",
        ],
    );
}

#[test]
fn an_unsupported_fmt_is_refused_when_the_checkpoint_opens() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    v["quantization_config"]["fmt"] = "e5m2".into();
    fs::write(&path, v.to_string()).unwrap();
    assert_names(
        &open_err(&dir),
        &["config.json", "quantization_config.fmt", "e5m2"],
    );
}

#[test]
fn check_weights_finds_an_fp8_nan_code() {
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    rewrite(&dir, |t| {
        let w = t.iter_mut().find(|(n, ..)| n == DOWN).unwrap();
        w.3[5] = 0xff;
    });
    let message = Checkpoint::open(&dir)
        .unwrap()
        .check_finite()
        .unwrap_err()
        .to_string();
    assert_names(&message, &[DOWN, "element 5", "NaN"]);
}

#[test]
fn bf16_scales_as_qwen_releases_them_are_applied() {
    // Qwen3's released FP8 checkpoints store the scales as BF16 (MODEL_MATH §9).
    let tmp = fp8_dense();
    let dir = tmp.path().join("fp8");
    rewrite(&dir, |t| {
        let scale = t.iter_mut().find(|(n, ..)| n == DOWN_SCALE).unwrap();
        scale.1 = Dtype::BF16;
        scale.3 = scale
            .3
            .chunks_exact(4)
            .flat_map(|b| {
                let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                ((bits >> 16) as u16).to_le_bytes()
            })
            .collect();
    });
    let ck = Checkpoint::open(&dir).unwrap();
    let codes_path = dir.join("model.safetensors");
    let bytes = fs::read(&codes_path).unwrap();
    let parsed = SafeTensors::deserialize(&bytes).unwrap();
    let codes = parsed.tensor(DOWN).unwrap();
    let scales: Vec<f32> = parsed
        .tensor(DOWN_SCALE)
        .unwrap()
        .data()
        .chunks_exact(2)
        .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        .collect();
    let m = ck.matrix(DOWN, &[64, 128]).unwrap().to_f32();
    for i in 0..64 {
        for j in 0..128 {
            let code = codes.data()[i * 128 + j];
            let want = spindle_model::fp8::e4m3_to_f32(code) * scales[(i / 32) * 3 + j / 48];
            assert_eq!(m[i * 128 + j], want, "[{i}, {j}]");
        }
    }
}
