//! Random-weight checkpoints with the exact shapes of released models (or fewer layers), in the
//! Hugging Face text-only layout: `config.json` + sharded safetensors + index. For benchmarks
//! and tests on machines without the real weights.

use std::path::Path;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layout::{checkpoint_tensors, ExpertKeys, SpecDtype, TensorSpec};
use crate::ngram::NgramHash;
use crate::writer::{SafetensorsWriter, TensorHeader};

/// Named shapes `spindle synth --shape` knows.
pub const SHAPES: &[&str] = &[
    "qwen3.6-35b-a3b",
    "qwen3.6-27b",
    "qwen3.8-flash-next",
    "demo",
];

/// The released config of a named shape, flattened to the text-only layout.
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
    Some(text)
}

/// The embedded demo model: the Qwen3.5-MoE architecture at toy size. Its tokenizer
/// (`tools/make_demo_tokenizer.py`) puts the 33 Qwen special tokens last, so `<|endoftext|>`
/// is `vocab_size − 33` and `<|im_end|>` two after it.
pub fn demo_config(vocab_size: usize) -> Value {
    let endoftext = vocab_size - 33;
    json!({
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

/// Bytes of a bf16 tensor filled with random values, produced in parallel chunks.
fn random_bf16(spec: &TensorSpec, seed: u64) -> Vec<u8> {
    const CHUNK: usize = 1 << 20;
    let n = spec.elements();
    let fan_in = *spec.shape.last().unwrap_or(&1);
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
    let tensors = checkpoint_tensors(&config, ExpertKeys::Fused);

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
