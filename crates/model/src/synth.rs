//! Random-weight checkpoints with the exact shapes of released models (or fewer layers), in the
//! Hugging Face text-only layout: `config.json` + sharded safetensors + index. For benchmarks
//! and tests on machines without the real weights. Shapes whose releases carry a vision tower
//! (Qwen3.6, and the demo's tiny one) get it too: `model.visual.*` with the released
//! `vision_config` and image token ids ([`without_vision`] leaves it out).

use std::path::Path;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layout::{checkpoint_tensors, vision_tensors, ExpertKeys, SpecDtype, TensorSpec};
use crate::ngram::NgramHash;
use crate::writer::{SafetensorsWriter, TensorHeader};

/// Named shapes `spindle synth --shape` knows.
pub const SHAPES: &[&str] = &[
    "qwen3.6-35b-a3b",
    "qwen3.6-27b",
    "qwen3.8-flash-next",
    "demo",
];

/// The top-level fields of a released config that describe image input.
const VISION_FIELDS: &[&str] = &[
    "vision_config",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
];

/// The released config of a named shape, flattened to the text-only layout. A Qwen3.5/3.6
/// shape keeps its `vision_config` and image token ids at the top level, where the loader
/// reads them.
pub fn shape_config(shape: &str) -> Option<Value> {
    let nested: Value = match shape {
        "qwen3.6-35b-a3b" => {
            serde_json::from_str(include_str!("../configs/qwen3_6_35b_a3b.config.json")).ok()?
        }
        "qwen3.6-27b" => {
            serde_json::from_str(include_str!("../configs/qwen3_6_27b.config.json")).ok()?
        }
        "qwen3.8-flash-next" => {
            serde_json::from_str(include_str!("../configs/qwen3_8_flash_next.config.json")).ok()?
        }
        "demo" => return Some(demo_config(4096)),
        _ => return None,
    };
    let mut text = nested.get("text_config")?.clone();
    let model_type = nested.get("model_type")?.clone();
    let obj = text.as_object_mut()?;
    obj.insert("model_type".into(), model_type);
    obj.insert(
        "tie_word_embeddings".into(),
        nested
            .get("tie_word_embeddings")
            .cloned()
            .unwrap_or(json!(false)),
    );
    // qwen4_exp releases carry the same tower, but spindle reads no vision for that family.
    if matches!(
        nested.get("model_type")?.as_str()?,
        "qwen3_5" | "qwen3_5_moe"
    ) {
        for &key in VISION_FIELDS {
            if let Some(v) = nested.get(key) {
                obj.insert(key.into(), v.clone());
            }
        }
    }
    Some(text)
}

/// Drops the vision tower from a flat config (`spindle synth --no-vision`): no
/// `vision_config`, no image token ids, so no `model.visual.*` tensors are written.
pub fn without_vision(config: &mut Value) {
    if let Some(obj) = config.as_object_mut() {
        for &key in VISION_FIELDS {
            obj.remove(key);
        }
    }
}

/// Every tensor a checkpoint of `config` holds: the text model's, then the vision tower's.
pub fn checkpoint_specs(config: &ModelConfig) -> Vec<TensorSpec> {
    let mut tensors = checkpoint_tensors(config, ExpertKeys::Fused);
    if let Some(v) = &config.vision {
        tensors.extend(vision_tensors(v));
    }
    tensors
}

/// The embedded demo model: the Qwen3.5-MoE architecture at toy size, with a tiny vision
/// tower (2 blocks of width 32, the released patch 16 / merge 2, an 8x8 position table; about
/// 90k parameters). Its tokenizer (`tools/make_demo_tokenizer.py`) puts the 33 Qwen special
/// tokens last, so `<|endoftext|>` is `vocab_size − 33`, `<|im_end|>` two after it and
/// `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>` at +9, +10, +12, +13.
pub fn demo_config(vocab_size: usize) -> Value {
    let endoftext = vocab_size - 33;
    json!({
        "image_token_id": endoftext + 12,
        "video_token_id": endoftext + 13,
        "vision_start_token_id": endoftext + 9,
        "vision_end_token_id": endoftext + 10,
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "num_heads": 2,
            "intermediate_size": 64,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 128,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": []
        },
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "linear_conv_kernel_dim": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": true},
        "max_position_embeddings": 8192,
        "tie_word_embeddings": false,
        "eos_token_id": [endoftext + 2, endoftext],
        "dtype": "bfloat16"
    })
}

/// Keeps the first `layers` layers of a flat text config.
pub fn truncate_layers(config: &mut Value, layers: usize) {
    if let Some(obj) = config.as_object_mut() {
        obj.insert("num_hidden_layers".into(), json!(layers));
        if let Some(Value::Array(types)) = obj.get_mut("layer_types") {
            types.truncate(layers);
        }
    }
}

/// A fast deterministic generator (splitmix64) for random weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        crate::ngram::splitmix64(self.0.wrapping_sub(0x9E37_79B9_7F4A_7C15))
    }
    /// Uniform in [−1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01B3)
    })
}

/// How a tensor is initialised (MODEL_MATH conventions: zero-centred norms store w, not 1+w).
fn init_value(name: &str, rng: &mut Rng, fan_in: usize) -> f32 {
    if name.starts_with(crate::layout::VISION_PREFIX) {
        return vision_init_value(name, rng, fan_in);
    }
    let zero_centred_norm = name.ends_with("layernorm.weight")
        || name.ends_with("model.norm.weight")
        || name.ends_with("q_norm.weight")
        || name.ends_with("k_norm.weight")
        || name.ends_with("hc_norm.weight")
        || name.contains("ple.norm_");
    if zero_centred_norm {
        0.1 * rng.unit()
    } else if name.ends_with("linear_attn.norm.weight") {
        1.0 + 0.1 * rng.unit()
    } else if name.ends_with("A_log") {
        (1.0 + 7.5 * (rng.unit() + 1.0)).ln()
    } else if name.ends_with("dt_bias") {
        1.0 + 0.5 * rng.unit()
    } else {
        // Uniform with std 1/√fan_in keeps activations O(1) through the layers.
        rng.unit() * (3.0 / fan_in as f32).sqrt()
    }
}

/// The vision tower's LayerNorms (with bias, weight near 1), biases, and matrices with std
/// 1/√fan_in.
fn vision_init_value(name: &str, rng: &mut Rng, fan_in: usize) -> f32 {
    if name.ends_with("norm1.weight")
        || name.ends_with("norm2.weight")
        || name.ends_with("merger.norm.weight")
    {
        1.0 + 0.1 * rng.unit()
    } else if name.ends_with(".bias") {
        0.05 * rng.unit()
    } else {
        rng.unit() * (3.0 / fan_in as f32).sqrt()
    }
}

/// Bytes of a bf16 tensor filled with random values, produced in parallel chunks.
fn random_bf16(spec: &TensorSpec, seed: u64) -> Vec<u8> {
    const CHUNK: usize = 1 << 20;
    let n = spec.elements();
    // The patch embedding's Conv3d kernel [D, C, T, P, P] reads C·T·P·P inputs per output;
    // every other matrix (fused experts included) reads its last dimension.
    let fan_in = if spec.class == crate::layout::TensorClass::Vision && spec.shape.len() > 2 {
        spec.shape[1..].iter().product()
    } else {
        *spec.shape.last().unwrap_or(&1)
    };
    let base = name_seed(seed, &spec.name);
    let mut out = vec![0u8; n * 2];
    out.par_chunks_mut(CHUNK * 2)
        .enumerate()
        .for_each(|(c, bytes)| {
            let mut rng = Rng(base.wrapping_add((c as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)));
            for b in bytes.chunks_exact_mut(2) {
                let v = init_value(&spec.name, &mut rng, fan_in);
                // Round to nearest bf16.
                let bits = v.to_bits();
                let rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
                b.copy_from_slice(&rounded.to_le_bytes());
            }
        });
    out
}

/// The int64 n-gram buffers, computed from the config exactly as the loader checks them.
fn ngram_buffer(config: &ModelConfig, spec: &TensorSpec) -> Vec<u8> {
    let ple = config
        .ple
        .as_ref()
        .expect("n-gram buffers exist only with PLE");
    let layer = spec.layer.expect("PLE tensors belong to a layer");
    let ordinal = ple.ordinal(layer).expect("a PLE layer");
    let hash = NgramHash::from_config(ple, ordinal, config.vocab_size);
    let values = if spec.name.ends_with("layer_multipliers") {
        hash.multipliers
    } else if spec.name.ends_with("ngram_heads_vocab_sizes") {
        hash.vocab_sizes
    } else {
        hash.offsets
    };
    values
        .iter()
        .flat_map(|v| (*v as i64).to_le_bytes())
        .collect()
}

/// Writes `config` (a flat text config) and random weights into `dir`, in shards of at most
/// `shard_bytes`. `progress(bytes)` is called after each tensor.
pub fn write_checkpoint(
    dir: &Path,
    config_json: &Value,
    seed: u64,
    shard_bytes: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    write_checkpoint_with(dir, config_json, seed, shard_bytes, false, progress)
}

/// [`write_checkpoint`], optionally writing the routed experts as zeros in sparse files (holes
/// take no disk space), so a checkpoint far larger than the disk can be converted to an install
/// for streaming benchmarks: the install still holds and reads every expert byte.
pub fn write_checkpoint_with(
    dir: &Path,
    config_json: &Value,
    seed: u64,
    shard_bytes: usize,
    zero_experts: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let config_path = dir.join("config.json");
    let config = ModelConfig::from_json_str(&config_json.to_string(), &config_path)?;
    std::fs::create_dir_all(dir).map_err(|error| ModelError::Io {
        path: dir.to_owned(),
        error,
    })?;
    let tensors = checkpoint_specs(&config);

    // Group tensors into shards in order.
    let mut shards: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
    let mut size = 0usize;
    for t in &tensors {
        let bytes = TensorHeader {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        }
        .byte_len();
        if size > 0 && size + bytes > shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("non-empty").push(t);
        size += bytes;
    }

    let count = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let headers: Vec<TensorHeader> = shard
            .iter()
            .map(|t| TensorHeader {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect();
        let mut writer = SafetensorsWriter::create(&dir.join(&file), headers)?;
        for t in shard {
            if zero_experts && t.class == crate::layout::TensorClass::RoutedExperts {
                total += (t.elements() * 2) as u64;
                writer.write_zeros()?;
                weight_map.insert(t.name.clone(), json!(file));
                progress(total);
                continue;
            }
            let bytes = match t.dtype {
                SpecDtype::I64 => ngram_buffer(&config, t),
                _ => random_bf16(t, seed),
            };
            total += bytes.len() as u64;
            writer.write_tensor(&bytes)?;
            weight_map.insert(t.name.clone(), json!(file));
            progress(total);
        }
        writer.finish()?;
    }
    if count > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write_json(&dir.join("model.safetensors.index.json"), &index)?;
    }
    write_json(&config_path, config_json)
}

pub fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(|error| ModelError::Io {
        path: path.to_owned(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_parses_and_truncates() {
        for shape in SHAPES {
            let mut c = shape_config(shape).unwrap();
            truncate_layers(&mut c, 4);
            let parsed =
                ModelConfig::from_json_str(&c.to_string(), Path::new("config.json")).unwrap();
            assert_eq!(parsed.num_layers(), 4, "{shape}");
        }
    }

    #[test]
    fn written_checkpoint_loads_with_every_shape_checked() {
        let dir = std::env::temp_dir().join(format!("spindle-synth-test-{}", std::process::id()));
        let mut c = shape_config("qwen3.8-flash-next").unwrap();
        truncate_layers(&mut c, 4);
        // A small n-gram table and narrow shapes keep the test fast.
        let obj = c.as_object_mut().unwrap();
        for (k, v) in [
            ("hidden_size", 64),
            ("num_attention_heads", 4),
            ("head_dim", 16),
            ("linear_num_key_heads", 2),
            ("linear_num_value_heads", 4),
            ("linear_key_head_dim", 16),
            ("linear_value_head_dim", 16),
            ("num_experts", 4),
            ("num_experts_per_tok", 2),
            ("moe_intermediate_size", 32),
            ("shared_expert_intermediate_size", 32),
            ("hc_lowrank", 8),
            ("indexer_head_dim", 16),
            ("ple_embed_dim", 64),
            ("heads_per_ngram", 2),
            ("ngram_vocab_size_base", 1000),
            ("split_ngram_parts", 2),
            ("vocab_size", 300),
            ("eos_token_id", 1),
        ] {
            obj.insert(k.into(), json!(v));
        }
        obj.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 1e7, "partial_rotary_factor": 0.25}),
        );
        write_checkpoint(&dir, &c, 7, 20_000, &mut |_| {}).unwrap();
        let cfg = ModelConfig::from_dir(&dir).unwrap();
        let ck = crate::Checkpoint::open(&dir).unwrap();
        for t in checkpoint_tensors(&cfg, ExpertKeys::Fused) {
            assert_eq!(ck.shape(&t.name), Some(t.shape.as_slice()), "{}", t.name);
        }
        assert!(
            dir.join("model.safetensors.index.json").exists(),
            "small shards force an index"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod vision_tests {
    use super::*;

    #[test]
    fn qwen3_6_shapes_carry_the_released_tower_and_no_vision_drops_it() {
        for (shape, out_hidden) in [("qwen3.6-35b-a3b", 2048), ("qwen3.6-27b", 5120)] {
            let mut c = shape_config(shape).unwrap();
            truncate_layers(&mut c, 1);
            let parsed = ModelConfig::from_json_str(&c.to_string(), Path::new("c.json")).unwrap();
            let v = parsed.vision.as_ref().expect(shape);
            assert_eq!(
                (
                    v.depth,
                    v.hidden,
                    v.heads,
                    v.intermediate,
                    v.pos_side,
                    v.out_hidden
                ),
                (27, 1152, 16, 4304, 48, out_hidden),
                "{shape}"
            );
            assert_eq!(v.tokens.image, 248_056, "{shape}");
            let specs = checkpoint_specs(&parsed);
            let tower: usize = specs
                .iter()
                .filter(|t| t.class == crate::layout::TensorClass::Vision)
                .map(TensorSpec::elements)
                .sum();
            assert_eq!(
                tower,
                v.parameters(),
                "{shape}: every tower tensor is written"
            );
            without_vision(&mut c);
            let parsed = ModelConfig::from_json_str(&c.to_string(), Path::new("c.json")).unwrap();
            assert!(parsed.vision.is_none(), "{shape}");
            assert!(checkpoint_specs(&parsed)
                .iter()
                .all(|t| !t.name.contains("visual")));
        }
        let flash = shape_config("qwen3.8-flash-next").unwrap();
        assert!(
            flash.get("vision_config").is_none(),
            "qwen4_exp reads no tower"
        );
    }

    #[test]
    fn the_demo_tower_loads_and_leaves_the_text_weights_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let (with, without) = (dir.path().join("with"), dir.path().join("without"));
        let config = demo_config(4096);
        write_checkpoint(&with, &config, 0x5eed, usize::MAX, &mut |_| {}).unwrap();
        let mut text_only = config.clone();
        without_vision(&mut text_only);
        write_checkpoint(&without, &text_only, 0x5eed, usize::MAX, &mut |_| {}).unwrap();
        let parsed = ModelConfig::from_dir(&with).unwrap();
        let v = parsed.vision.as_ref().unwrap();
        assert_eq!(
            (v.tokens.image, v.tokens.vision_start, v.tokens.vision_end),
            (4075, Some(4072), Some(4073)),
            "the demo tokenizer's <|image_pad|>, <|vision_start|>, <|vision_end|>"
        );
        let (a, b) = (
            crate::Checkpoint::open(&with).unwrap(),
            crate::Checkpoint::open(&without).unwrap(),
        );
        let tower = crate::weights::load_vision(&a, v).unwrap();
        assert!(tower.size_bytes() < 400_000, "{} bytes", tower.size_bytes());
        assert!(tower.blocks[0]
            .norm1
            .weight
            .iter()
            .all(|w| (0.85..1.15).contains(w)));
        for t in checkpoint_tensors(&parsed, ExpertKeys::Fused) {
            let (x, y) = (
                a.matrix(&t.name, &t.shape).unwrap(),
                b.matrix(&t.name, &t.shape).unwrap(),
            );
            assert_eq!(x.bytes(), y.bytes(), "{}", t.name);
        }
    }
}

#[cfg(test)]
mod zero_expert_tests {
    use super::*;

    #[test]
    fn zero_experts_are_holes_that_read_as_zeros() {
        let dir = std::env::temp_dir().join(format!("spindle-synth-zero-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = demo_config(4096);
        c["moe_intermediate_size"] = json!(1024);
        write_checkpoint_with(&dir, &c, 1, usize::MAX, true, &mut |_| {}).unwrap();
        let ck = crate::Checkpoint::open(&dir).unwrap();
        let name = "model.layers.0.mlp.experts.gate_up_proj";
        let m = ck.matrix(name, &[8, 2048, 128]).unwrap();
        assert!(
            m.to_f32().iter().all(|&v| v == 0.0),
            "experts read as zeros"
        );
        let router = ck
            .matrix("model.layers.0.mlp.gate.weight", &[8, 128])
            .unwrap();
        assert!(
            router.to_f32().iter().any(|&v| v != 0.0),
            "other tensors stay random"
        );
        // The file is as long as the header says but occupies less disk than its length.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir.join("model.safetensors")).unwrap();
        assert!(meta.blocks() * 512 < meta.len(), "experts should be holes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
