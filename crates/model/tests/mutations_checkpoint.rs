//! Safetensors checkpoints and their config.json damaged field by field: every config field
//! given the wrong type, a negative, zero, fractional or huge value, or removed; safetensors
//! headers with overflowing shapes, offsets past the end, unknown dtypes and absurd lengths;
//! block-FP8 scales that are NaN, infinite, zero or negative. Each is refused naming the file
//! or field, never a panic, never an allocation beyond what the file could hold
//! (`spindle_testkit::mutate`).

use std::fs;
use std::path::Path;

use serde_json::{json, Value};
use spindle_model::fp8::make::write_fp8_pair;
use spindle_model::{weights, Checkpoint, ModelConfig};
use spindle_testkit::copy_fixture;
use spindle_testkit::mutate::{self, run_cases, Case};

#[global_allocator]
static ALLOC: mutate::Bounded = mutate::Bounded;

/// Everything spindle reads from a checkpoint directory: config, tensors, the weight tree,
/// the vision tower and its preprocessing.
fn load_dir(dir: &Path) -> Result<(), String> {
    let err = |e: spindle_model::ModelError| e.to_string();
    let config = ModelConfig::from_dir(dir).map_err(err)?;
    let checkpoint = Checkpoint::open(dir).map_err(err)?;
    weights::load(&checkpoint, &config).map_err(err)?;
    if let Some(vision) = &config.vision {
        weights::load_vision(&checkpoint, vision).map_err(err)?;
    }
    spindle_vision::ImageInput::from_model_dir(dir).map_err(|e| e.to_string())?;
    Ok(())
}

/// The JSON pointer of every value in `v` (objects and arrays as well as leaves).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                pointers(child, format!("{at}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    if !at.is_empty() {
        out.push(at);
    }
}

/// Replacements that are each wrong for almost any field.
fn hostile_values() -> Vec<Value> {
    vec![
        json!("x"),
        json!(-1),
        json!(0),
        json!(1.5),
        json!(1e300),
        json!(u64::MAX),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
    ]
}

/// Every pointer of `text` (a JSON document) replaced by each hostile value, and removed.
fn json_cases(file: &str, text: &str) -> Vec<(String, String)> {
    let doc: Value = serde_json::from_str(text).unwrap();
    let mut all = Vec::new();
    pointers(&doc, String::new(), &mut all);
    let mut out = Vec::new();
    for pointer in all {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        for value in hostile_values() {
            let mut d = doc.clone();
            *d.pointer_mut(&pointer).unwrap() = value.clone();
            out.push((format!("{file} {pointer} = {value}"), d.to_string()));
        }
        let mut d = doc.clone();
        match d.pointer_mut(parent).unwrap() {
            Value::Object(map) => {
                map.remove(key);
            }
            Value::Array(items) => {
                items.remove(key.parse::<usize>().unwrap());
            }
            _ => unreachable!(),
        }
        out.push((format!("{file} {pointer} removed"), d.to_string()));
    }
    out
}

#[test]
fn every_config_field_given_a_hostile_value_is_refused_or_harmless() {
    let dir = copy_fixture("qwen3_5_dense_vision");
    let mut cases = Vec::new();
    for file in ["config.json", "preprocessor_config.json"] {
        let path = dir.path().join(file);
        let pristine = fs::read_to_string(&path).unwrap();
        for (label, text) in json_cases(file, &pristine) {
            cases.push((file, Case::either(label, text.into_bytes())));
        }
    }
    let pristine: Vec<(&str, String)> = ["config.json", "preprocessor_config.json"]
        .iter()
        .map(|f| (*f, fs::read_to_string(dir.path().join(f)).unwrap()))
        .collect();
    let mut files = Vec::new();
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|(file, case)| {
            files.push(file);
            case
        })
        .collect();
    let mut next = files.into_iter();
    run_cases(
        "config fields",
        cases,
        &[
            "config.json",
            "preprocessor_config.json",
            "model.safetensors",
            // A config that asks for more layers than stored names the first missing tensor.
            "not found in the checkpoint",
        ],
        |bytes| {
            for (file, text) in &pristine {
                fs::write(dir.path().join(file), text).unwrap();
            }
            fs::write(dir.path().join(next.next().unwrap()), bytes).unwrap();
            load_dir(dir.path())
        },
    );
}

/// A safetensors file from a JSON header and `data` (the header padded to 8 bytes as the
/// format's writers do).
fn safetensors_bytes(header: &Value, data: &[u8]) -> Vec<u8> {
    let mut text = header.to_string().into_bytes();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(data);
    out
}

#[test]
fn an_mrope_section_that_sums_right_only_by_wrapping_around_is_refused() {
    let dir = copy_fixture("qwen3_5_dense_vision");
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    // 11 + 11 + 10 = 32 = rotary_dim / 2; (2^64 - 10) + 21 + 21 wraps to 32 as well.
    config["text_config"]["rope_parameters"]["mrope_section"] = json!([u64::MAX - 9, 21, 21]);
    fs::write(&path, config.to_string()).unwrap();
    let message = ModelConfig::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains("config.json") && message.contains("mrope_section"),
        "{message}"
    );
}

#[test]
fn hostile_safetensors_headers_are_refused_naming_the_file() {
    let dir = copy_fixture("qwen3_5_dense_vision");
    let path = dir.path().join("model.safetensors");
    let pristine = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(pristine[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&pristine[8..8 + n]).unwrap();
    let data = &pristine[8 + n..];
    let norm = "model.language_model.norm.weight";
    let embed = "model.language_model.embed_tokens.weight";
    let with = |name: &str, field: &str, value: Value| {
        let mut h = header.clone();
        h[name][field] = value;
        safetensors_bytes(&h, data)
    };
    let mut cases = vec![
        Case::refused("header length u64::MAX", {
            let mut b = pristine.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        Case::refused("header length 0", {
            let mut b = pristine.clone();
            b[..8].copy_from_slice(&0u64.to_le_bytes());
            b
        }),
        Case::refused("header length 1 past the file", {
            let mut b = pristine.clone();
            b[..8].copy_from_slice(&(pristine.len() as u64 - 7).to_le_bytes());
            b
        }),
        Case::refused("header not UTF-8", {
            let mut b = pristine.clone();
            b[9] = 0xff;
            b
        }),
        Case::refused("header a JSON array", safetensors_bytes(&json!([]), data)),
    ];
    for (label, value) in [
        (
            "shape overflowing",
            json!([1u64 << 32, 1u64 << 32, 1u64 << 32]),
        ),
        ("shape u64::MAX", json!([u64::MAX])),
        ("shape negative", json!([-64])),
        ("shape a string", json!("64")),
        ("shape doubled", json!([128])),
        ("shape empty", json!([])),
    ] {
        cases.push(Case::refused(
            format!("{norm} {label}"),
            with(norm, "shape", value),
        ));
    }
    for dtype in ["I64", "F64", "U8", "BOOL", "F8_E5M2", "Q4", ""] {
        cases.push(Case::refused(
            format!("{embed} dtype {dtype:?}"),
            with(embed, "dtype", json!(dtype)),
        ));
    }
    for (label, value) in [
        ("offsets past the end", json!([0, data.len() as u64 + 64])),
        ("offsets u64::MAX", json!([u64::MAX - 1, u64::MAX])),
        ("offsets reversed", json!([64, 0])),
        ("offsets a string", json!("0")),
    ] {
        cases.push(Case::refused(
            format!("{embed} {label}"),
            with(embed, "data_offsets", value),
        ));
    }
    let mut h = header.clone();
    h["__metadata__"] = json!({"format": ["not", "a", "string"]});
    cases.push(Case::refused(
        "__metadata__ holds an array",
        safetensors_bytes(&h, data),
    ));
    run_cases(
        "safetensors headers",
        cases,
        &["model.safetensors"],
        |bytes| {
            fs::write(&path, bytes).unwrap();
            load_dir(dir.path())
        },
    );
}

#[test]
fn hostile_fp8_scales_and_quantization_configs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let fp8 = tmp.path().join("fp8");
    write_fp8_pair(
        &spindle_testkit::fixture("qwen3_5_dense"),
        &fp8,
        &tmp.path().join("deq"),
        [32, 48],
    )
    .unwrap();
    let model = fp8.join("model.safetensors");
    let config = fp8.join("config.json");
    let pristine_model = fs::read(&model).unwrap();
    let pristine_config = fs::read_to_string(&config).unwrap();
    let n = u64::from_le_bytes(pristine_model[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&pristine_model[8..8 + n]).unwrap();
    let scale = "model.language_model.layers.0.mlp.down_proj.weight_scale_inv";
    let [start, _] = [0, 1].map(|i| header[scale]["data_offsets"][i].as_u64().unwrap() as usize);
    assert_eq!(header[scale]["dtype"], "F32");
    let mut cases = Vec::new();
    // A zero scale (an all-zero block) is what a quantizer writes for zeros: allowed.
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 0.0] {
        let mut b = pristine_model.clone();
        let at = 8 + n + start;
        b[at..at + 4].copy_from_slice(&value.to_le_bytes());
        let label = format!("{scale}[0] = {value}");
        cases.push((
            "model",
            match value == 0.0 {
                true => Case::either(label, b),
                false => Case::refused(label, b),
            },
        ));
    }
    let doc: Value = serde_json::from_str(&pristine_config).unwrap();
    let qc_at = if doc.get("quantization_config").is_some() {
        "/quantization_config"
    } else {
        "/text_config/quantization_config"
    };
    for (label, text) in json_cases("config.json", &doc.pointer(qc_at).unwrap().to_string()) {
        let mut d = doc.clone();
        *d.pointer_mut(qc_at).unwrap() = serde_json::from_str(&text).unwrap();
        cases.push(("config", Case::either(label, d.to_string().into_bytes())));
    }
    let mut kinds = Vec::new();
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|(kind, case)| {
            kinds.push(kind);
            case
        })
        .collect();
    let mut next = kinds.into_iter();
    run_cases(
        "block-FP8 checkpoint",
        cases,
        &["config.json", "model.safetensors"],
        |bytes| {
            fs::write(&model, &pristine_model).unwrap();
            fs::write(&config, &pristine_config).unwrap();
            match next.next().unwrap() {
                "model" => fs::write(&model, bytes).unwrap(),
                _ => fs::write(&config, bytes).unwrap(),
            }
            load_dir(&fp8)
        },
    );
}

#[test]
fn hostile_shard_indexes_are_refused_naming_the_index() {
    let dir = copy_fixture("qwen3_5_moe");
    let index = dir.path().join("model.safetensors.index.json");
    let pristine = fs::read_to_string(&index).unwrap();
    // The top level, the weight map itself and a few of its entries (every entry would be
    // a thousand cases of the same code).
    let keep = |label: &str| {
        let pointer = label.split(' ').nth(1).unwrap_or("");
        pointer.matches('/').count() < 2
            || pointer.ends_with("/lm_head.weight")
            || pointer.ends_with("/model.language_model.norm.weight")
            || pointer.ends_with("/model.language_model.layers.3.mlp.gate.weight")
    };
    let mut cases: Vec<Case> = json_cases("index.json", &pristine)
        .into_iter()
        .filter(|(label, _)| keep(label))
        .map(|(label, text)| Case::either(label, text.into_bytes()))
        .collect();
    let doc: Value = serde_json::from_str(&pristine).unwrap();
    for shard in [
        "../model-00001-of-00004.safetensors",
        "/etc/passwd",
        "model-00009-of-00004.safetensors",
        "",
        "config.json",
        "model.safetensors.index.json",
    ] {
        let mut d = doc.clone();
        d["weight_map"]["lm_head.weight"] = json!(shard);
        cases.push(Case::refused(
            format!("lm_head.weight in shard {shard:?}"),
            d.to_string().into_bytes(),
        ));
    }
    let mut d = doc.clone();
    d["weight_map"]["model.language_model.no_such.weight"] =
        json!("model-00001-of-00004.safetensors");
    cases.push(Case::refused(
        "a tensor no shard holds",
        d.to_string().into_bytes(),
    ));
    run_cases(
        "shard index",
        cases,
        &[
            "model.safetensors.index.json",
            "model-0000",
            "not found in the checkpoint",
            // A shard that is another file of the checkpoint.
            "config.json: not a valid safetensors file",
        ],
        |bytes| {
            fs::write(&index, bytes).unwrap();
            load_dir(dir.path())
        },
    );
}

#[test]
fn hostile_install_manifests_are_refused_naming_the_manifest() {
    use spindle_model::install::{self, Install, Verify};
    use spindle_model::quant::WeightFormat;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("install");
    install::convert(
        &spindle_testkit::fixture("qwen3_5_moe"),
        &dir,
        WeightFormat::Q8,
        &mut |_| true,
    )
    .unwrap();
    let path = dir.join(install::MANIFEST);
    let pristine = fs::read_to_string(&path).unwrap();
    // The top level, the resident section, the first expert layer and its first part, the
    // first file entry and the first classes (every entry would be thousands of cases).
    let keep = |label: &str| {
        let pointer = label.split(' ').nth(1).unwrap_or("");
        let depth = pointer.matches('/').count();
        depth < 2
            || pointer.starts_with("/resident/")
            || (pointer.starts_with("/experts/0/") && !pointer.starts_with("/experts/0/parts/1"))
            || pointer.starts_with("/files/0/")
            || pointer.starts_with("/classes/lm_head")
    };
    let mut cases: Vec<Case> = json_cases("manifest.json", &pristine)
        .into_iter()
        .filter(|(label, _)| keep(label))
        .map(|(label, text)| Case::either(label, text.into_bytes()))
        .collect();
    // Two parts of an expert record that share bytes.
    let doc: Value = serde_json::from_str(&pristine).unwrap();
    for (field, from) in [
        ("codes_offset", "/experts/0/parts/0/codes_offset"),
        ("scales_offset", "/experts/0/parts/1/scales_offset"),
    ] {
        let mut d = doc.clone();
        d["experts"][0]["parts"][2][field] = d.pointer(from).unwrap().clone();
        cases.push(Case::refused(
            format!("experts[0].parts[2].{field} overlapping another part"),
            d.to_string().into_bytes(),
        ));
    }
    run_cases(
        "install manifest",
        cases,
        &["manifest.json", "install"],
        |bytes| {
            fs::write(&path, bytes).unwrap();
            let install = Install::open(&dir, Verify::Sizes).map_err(|e| e.to_string())?;
            let names: Vec<String> = install.manifest().classes.keys().cloned().collect();
            for name in names {
                install.quantized(&name).map_err(|e| e.to_string())?;
            }
            for layer in 0..install.config().num_layers() {
                let _ = install.expert_layer(layer);
            }
            Ok(())
        },
    );
}
