//! `ModelConfig` on the released configs in `fixtures/configs/` and on invalid configs made by
//! editing a fixture's config.json in memory: every refusal names the field at fault.

use std::path::Path;

use serde_json::{json, Value};
use spindle_model::{Family, FfnKind, MixerKind, ModelConfig, ModelError};
use spindle_testkit::fixtures;

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("fixture {} is missing: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The tiny MoE fixture's config (nested under `text_config`).
fn moe_config() -> Value {
    read_json(&fixtures().join("qwen3_5_moe/config.json"))
}

/// The released Qwen3.6-35B-A3B config (has `mrope_section`).
fn config_35b() -> Value {
    read_json(&fixtures().join("configs/qwen3_6_35b_a3b.config.json"))
}

const EDITED: &str = "edited/config.json";

fn parse(value: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json_str(&value.to_string(), Path::new(EDITED))
}

/// Parses `value`, expects a refusal and checks its message names the file and each of `needles`.
fn refused(value: &Value, needles: &[&str]) -> String {
    let err = match parse(value) {
        Ok(config) => panic!("accepted an invalid config: {config:?}"),
        Err(err) => err,
    };
    let message = err.to_string();
    assert!(
        message.contains(EDITED),
        "message does not name the file: {message}"
    );
    for needle in needles {
        assert!(
            message.contains(needle),
            "message lacks {needle:?}: {message}"
        );
    }
    message
}

fn text_config(value: &mut Value) -> &mut serde_json::Map<String, Value> {
    value["text_config"].as_object_mut().expect("nested config")
}

// ---- the released configs ----

#[test]
fn qwen3_6_35b_a3b_parses_with_its_real_shape() {
    let path = fixtures().join("configs/qwen3_6_35b_a3b.config.json");
    let c = ModelConfig::from_file(&path).unwrap();
    assert_eq!(c.family, Family::Qwen35Moe);
    assert!(c.multimodal_wrapper);
    assert_eq!(c.num_layers(), 40);
    for (i, layer) in c.layers.iter().enumerate() {
        let expected = if (i + 1) % 4 == 0 {
            MixerKind::FullAttention
        } else {
            MixerKind::LinearAttention
        };
        assert_eq!(layer.mixer, expected, "layer {i}");
        assert_eq!(layer.ffn, FfnKind::Moe, "layer {i}");
    }
    assert_eq!(c.vocab_size, 248_320);
    assert_eq!(c.hidden_size, 2048);
    assert_eq!(c.attention.head_dim, 256);
    assert_eq!(c.rope.rotary_dim, 64);
    assert_eq!(c.rope.mrope_section, Some(vec![11, 11, 10]));
    assert!(c.rope.mrope_interleaved);
    assert_eq!(c.rope.theta, 1e7);
    assert_eq!(c.eos_token_ids, vec![248_044]);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k), (256, 8));
    assert_eq!(
        (moe.expert_intermediate, moe.shared_intermediate),
        (512, 512)
    );
    assert!(moe.renormalize);
    assert!(!c.tie_word_embeddings);
}

#[test]
fn fp8_27b_parses_its_block_fp8_quantization_config() {
    let path = fixtures().join("configs/qwen3_6_27b_fp8.config.json");
    let c = ModelConfig::from_file(&path).unwrap();
    let fp8 = c.fp8.expect("quantization_config read");
    assert_eq!(fp8.block, [128, 128]);
    assert!(fp8.modules_to_not_convert.iter().any(|m| m == "lm_head"));
    assert!(fp8
        .modules_to_not_convert
        .iter()
        .any(|m| m == "model.language_model.layers.0.linear_attn.in_proj_a"));
}

/// The 27B FP8 config with its `quantization_config` edited by `edit`.
fn fp8_config_with(edit: impl Fn(&mut serde_json::Value)) -> ModelError {
    let path = fixtures().join("configs/qwen3_6_27b_fp8.config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v["quantization_config"]);
    ModelConfig::from_json_str(&v.to_string(), &path).unwrap_err()
}

#[test]
fn fp8_configs_spindle_cannot_apply_are_refused_by_field() {
    let cases: [(&str, Box<dyn Fn(&mut serde_json::Value)>); 5] = [
        (
            "quantization_config.fmt",
            Box::new(|q| q["fmt"] = "e5m2".into()),
        ),
        (
            "quantization_config.activation_scheme",
            Box::new(|q| q["activation_scheme"] = "static".into()),
        ),
        (
            "quantization_config.weight_block_size is missing",
            Box::new(|q| {
                q.as_object_mut().unwrap().remove("weight_block_size");
            }),
        ),
        (
            "quantization_config.weight_block_size",
            Box::new(|q| q["weight_block_size"] = serde_json::json!([128, 0])),
        ),
        (
            "quantization_config.quant_method = \"gptq\"",
            Box::new(|q| q["quant_method"] = "gptq".into()),
        ),
    ];
    for (needle, edit) in cases {
        let message = fp8_config_with(edit).to_string();
        assert!(message.contains(needle), "lacks {needle:?}: {message}");
        assert!(message.contains("qwen3_6_27b_fp8.config.json"), "{message}");
    }
}

#[test]
fn qwen3_8_flash_next_parses_as_qwen4_exp() {
    let path = fixtures().join("configs/qwen3_8_flash_next.config.json");
    let c = ModelConfig::from_file(&path).unwrap();
    assert_eq!(c.family, Family::Qwen4Exp);
    assert_eq!(c.num_layers(), 48);
    assert_eq!(c.hyper.as_ref().map(|h| h.streams), Some(4));
    assert_eq!(c.ple.as_ref().map(|p| p.layers.clone()), Some(vec![1]));
    assert_eq!(c.qsa.as_ref().map(|q| q.budget), Some(2048));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.top_k), (512, 10));
}

#[test]
fn qwen4_exp_indexer_with_two_kv_heads_is_refused() {
    let mut c = read_json(&fixtures().join("configs/qwen3_8_flash_next.config.json"));
    text_config(&mut c).insert("indexer_kv_heads".into(), json!(2));
    refused(&c, &["text_config.indexer_kv_heads = 2"]);
}

#[test]
fn qwen4_exp_ple_on_an_attention_layer_is_refused() {
    let mut c = read_json(&fixtures().join("configs/qwen3_8_flash_next.config.json"));
    text_config(&mut c).insert("ple_layer_ids".into(), json!([4]));
    refused(&c, &["ple_layer_ids [4]", "attention layer"]);
}

#[test]
fn missing_config_file_is_an_io_error_naming_it() {
    let path = fixtures().join("configs/no_such.config.json");
    let message = ModelConfig::from_file(&path).unwrap_err().to_string();
    assert!(message.contains("no_such.config.json"), "{message}");
}

#[test]
fn invalid_json_is_refused_naming_the_file() {
    let err =
        ModelConfig::from_json_str("{\"model_type\": \"qwen3_5\",", Path::new(EDITED)).unwrap_err();
    assert!(matches!(err, ModelError::Json { .. }), "{err:?}");
    assert!(err.to_string().contains(EDITED), "{err}");
}

// ---- flat (text-only) layout ----

/// The nested config with `text_config`'s fields moved to the top level, as a text-only
/// checkpoint writes them.
fn flatten(nested: &Value) -> Value {
    let mut flat = nested["text_config"].as_object().unwrap().clone();
    flat.insert(
        "tie_word_embeddings".into(),
        nested["tie_word_embeddings"].clone(),
    );
    Value::Object(flat)
}

#[test]
fn flat_configs_parse_like_their_nested_versions() {
    for nested in [
        moe_config(),
        config_35b(),
        read_json(&fixtures().join("qwen3_5_dense/config.json")),
    ] {
        let from_nested = parse(&nested).unwrap();
        let mut from_flat = parse(&flatten(&nested)).unwrap();
        assert!(from_nested.multimodal_wrapper);
        assert!(!from_flat.multimodal_wrapper);
        from_flat.multimodal_wrapper = true;
        // The flat form is a text-only checkpoint's: no vision tower.
        assert!(from_flat.vision.is_none());
        from_flat.vision = from_nested.vision.clone();
        assert_eq!(from_flat, from_nested);
    }
}

// ---- invalid configs ----

#[test]
fn experts_without_top_k() {
    let mut c = moe_config();
    text_config(&mut c).remove("num_experts_per_tok");
    refused(&c, &["num_experts 8", "num_experts_per_tok"]);
}

#[test]
fn top_k_above_expert_count() {
    let mut c = moe_config();
    text_config(&mut c).insert("num_experts_per_tok".into(), json!(9));
    refused(&c, &["num_experts 8", "num_experts_per_tok 9"]);
}

#[test]
fn moe_family_without_experts() {
    let mut c = moe_config();
    text_config(&mut c).remove("num_experts");
    refused(&c, &["num_experts", "qwen3_5_moe"]);
}

#[test]
fn head_dim_not_divisible_for_the_rotary_fraction() {
    let mut c = moe_config();
    text_config(&mut c).insert("head_dim".into(), json!(10));
    refused(&c, &["head_dim 10", "partial_rotary_factor 0.25", "2.5"]);
}

#[test]
fn odd_rotary_dim() {
    let mut c = moe_config();
    text_config(&mut c).insert("head_dim".into(), json!(12));
    refused(&c, &["head_dim 12", "gives 3 rotary dims", "even"]);
}

#[test]
fn mrope_section_not_summing_to_half_the_rotary_dim() {
    let mut c = config_35b();
    c["text_config"]["rope_parameters"]["mrope_section"] = json!([11, 11, 11]);
    refused(&c, &["mrope_section", "[11, 11, 11]", "32"]);
}

#[test]
fn mrope_section_with_two_entries() {
    let mut c = config_35b();
    c["text_config"]["rope_parameters"]["mrope_section"] = json!([16, 16]);
    refused(&c, &["mrope_section", "3 entries"]);
}

#[test]
fn unknown_layer_type() {
    let mut c = moe_config();
    c["text_config"]["layer_types"][2] = json!("sliding_attention");
    refused(&c, &["layer_types[2]", "sliding_attention"]);
}

#[test]
fn layer_types_length_differs_from_num_hidden_layers() {
    let mut c = moe_config();
    c["text_config"]["layer_types"]
        .as_array_mut()
        .unwrap()
        .pop();
    refused(&c, &["layer_types has 3 entries", "num_hidden_layers is 4"]);
}

#[test]
fn attention_heads_not_a_multiple_of_kv_heads() {
    let mut c = moe_config();
    text_config(&mut c).insert("num_attention_heads".into(), json!(3));
    refused(&c, &["num_attention_heads 3", "num_key_value_heads 2"]);
}

#[test]
fn linear_value_heads_not_a_multiple_of_key_heads() {
    let mut c = moe_config();
    text_config(&mut c).insert("linear_num_value_heads".into(), json!(3));
    refused(&c, &["linear_num_value_heads 3", "linear_num_key_heads 2"]);
}

#[test]
fn missing_hidden_size() {
    let mut c = moe_config();
    text_config(&mut c).remove("hidden_size");
    refused(&c, &["text_config.hidden_size is missing"]);
}

#[test]
fn string_where_a_number_is_expected() {
    let mut c = moe_config();
    text_config(&mut c).insert("hidden_size".into(), json!("64"));
    refused(&c, &["text_config.hidden_size", "\"64\"", "integer"]);
}

#[test]
fn negative_number_where_a_size_is_expected() {
    let mut c = moe_config();
    text_config(&mut c).insert("num_hidden_layers".into(), json!(-4));
    refused(&c, &["text_config.num_hidden_layers", "-4"]);
}

#[test]
fn unknown_model_type() {
    let mut c = moe_config();
    c["model_type"] = json!("llama");
    refused(&c, &["model_type \"llama\"", "qwen3_5_moe"]);
}

#[test]
fn missing_model_type() {
    let mut c = flatten(&moe_config());
    c.as_object_mut().unwrap().remove("model_type");
    refused(&c, &["model_type is missing"]);
}

#[test]
fn yarn_rope_is_refused() {
    let mut c = moe_config();
    c["text_config"]["rope_parameters"]["rope_type"] = json!("yarn");
    refused(&c, &["rope_type", "\"yarn\""]);
}

#[test]
fn gelu_activation_is_refused() {
    let mut c = moe_config();
    text_config(&mut c).insert("hidden_act".into(), json!("gelu"));
    refused(&c, &["hidden_act", "\"gelu\""]);
}

#[test]
fn text_config_that_is_not_an_object() {
    let mut c = moe_config();
    c["text_config"] = json!([1, 2]);
    refused(&c, &["text_config"]);
}

#[test]
fn top_level_that_is_not_an_object() {
    refused(&json!([moe_config()]), &["top level"]);
}

#[test]
fn absurd_sizes_are_refused_before_any_allocation() {
    // No layer_types: the layer list would be built from num_hidden_layers alone.
    let mut v = moe_config();
    text_config(&mut v).remove("layer_types");
    text_config(&mut v).insert("num_hidden_layers".into(), json!(u64::MAX));
    refused(&v, &["num_hidden_layers", "larger than spindle accepts"]);
    let mut v = moe_config();
    text_config(&mut v).insert("head_dim".into(), json!(1u64 << 62));
    refused(&v, &["head_dim", "larger than spindle accepts"]);
}

#[test]
fn eos_ids_must_be_token_ids_in_the_vocabulary() {
    let mut v = moe_config();
    text_config(&mut v).insert("eos_token_id".into(), json!(4_294_967_297u64));
    refused(&v, &["eos_token_id"]);
    let mut v = moe_config();
    text_config(&mut v).insert("eos_token_id".into(), json!([1, 512]));
    refused(&v, &["eos_token_id 512", "vocab_size 512"]);
}

#[test]
fn zero_context_is_refused() {
    let mut v = moe_config();
    text_config(&mut v).insert("max_position_embeddings".into(), json!(0));
    refused(&v, &["max_position_embeddings = 0"]);
}
