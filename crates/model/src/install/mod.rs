//! spindle installs: a checkpoint converted once (`spindle convert`) into the layout spindle
//! runs best from.
//!
//! ```text
//! DST/
//!   manifest.json            format version, config, quantization per class, files + SHA-256
//!   model.safetensors        every tensor but the routed experts (quantized: NAME.qs + NAME.scales),
//!                            the vision tower (`model.visual.*`) as stored (bf16)
//!   experts/layer-003.bin    one file per MoE layer: expert e at [e·stride, (e+1)·stride)
//!   config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja,
//!   generation_config.json   copied verbatim when the checkpoint has them
//!   verified.json            written by an open with --verify (not listed in the manifest)
//! ```
//!
//! The layouts are described in [`manifest`]. `config.json` and the tokenizer files sit where
//! a Hugging Face directory has them, so everything that reads those reads an install too.

pub mod check;
pub mod error;
pub mod lock;
pub mod manifest;
pub mod plan;
pub mod quantize;
pub mod reader;
pub mod scan;
pub mod sha256;
pub mod writer;

pub use error::InstallError;
pub use manifest::{ExpertLayerLayout, FileEntry, Manifest, PartLayout};
pub use reader::{Install, MappedFile, QuantTensor, Verify};
pub use writer::{convert, convert_with, Progress};

use crate::layout::TensorClass;

pub const MANIFEST: &str = "manifest.json";
pub const RESIDENT_FILE: &str = "model.safetensors";
pub const EXPERT_DIR: &str = "experts";
pub const RECEIPT: &str = "verified.json";
pub const CODES_SUFFIX: &str = ".qs";
pub const SCALES_SUFFIX: &str = ".scales";
/// Expert records are aligned to (and a multiple of) this many bytes.
pub const PAGE: u64 = 4096;

/// Files copied from the checkpoint when present.
pub const AUX_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
];

/// True when `dir` holds an install (a `manifest.json`), not a Hugging Face checkpoint.
pub fn is_install(dir: &std::path::Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// Whether the engine re-encodes tensor `name` when asked for q8/q4 (the large projections:
/// LM head, attention and GDN projections, dense and shared-expert MLPs; the routed experts
/// are handled apart). The embedding, router, shared-expert gate, norms, conv taps, hyper-
/// connection, PLE and QSA-indexer tensors stay as stored. This reads any checkpoint key;
/// a test checks that it agrees with the weight schema's [`crate::layout::TensorDef::quantizable`].
pub fn quantizable(name: &str) -> bool {
    const SUFFIXES: &[&str] = &[
        ".self_attn.q_proj.weight",
        ".self_attn.k_proj.weight",
        ".self_attn.v_proj.weight",
        ".self_attn.o_proj.weight",
        ".linear_attn.in_proj_qkvz.weight",
        ".linear_attn.in_proj_ba.weight",
        ".linear_attn.in_proj_qkv.weight",
        ".linear_attn.in_proj_z.weight",
        ".linear_attn.in_proj_b.weight",
        ".linear_attn.in_proj_a.weight",
        ".linear_attn.out_proj.weight",
        ".mlp.gate_proj.weight",
        ".mlp.up_proj.weight",
        ".mlp.down_proj.weight",
        ".mlp.shared_expert.gate_proj.weight",
        ".mlp.shared_expert.up_proj.weight",
        ".mlp.shared_expert.down_proj.weight",
    ];
    name == "lm_head.weight" || SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The class of a checkpoint tensor, from its name (a test checks that it agrees with the
/// weight schema's classes).
pub fn classify(name: &str) -> TensorClass {
    if name.starts_with(crate::layout::VISION_PREFIX) {
        TensorClass::Vision
    } else if name.contains("embed_tokens") {
        TensorClass::Embedding
    } else if name.starts_with("lm_head") {
        TensorClass::LmHead
    } else if name.contains(".mlp.experts.") {
        TensorClass::RoutedExperts
    } else if name.contains(".mlp.shared_expert") {
        TensorClass::SharedExpert
    } else if name.ends_with(".mlp.gate.weight") {
        TensorClass::Router
    } else if name.contains(".mlp.") {
        TensorClass::DenseMlp
    } else if name.contains("ple_embedding") {
        TensorClass::NgramTable
    } else if name.contains(".ple.") {
        TensorClass::Ple
    } else if name.contains("hyper_connection") {
        TensorClass::HyperConnection
    } else if name.contains(".self_attn.") {
        TensorClass::Attention
    } else if name.contains(".linear_attn.") {
        TensorClass::Gdn
    } else {
        TensorClass::Norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{checkpoint_tensors, ExpertKeys};
    use crate::ModelConfig;

    #[test]
    fn names_classify_and_quantize_as_the_schema_says() {
        let fixtures = spindle_testkit::fixtures();
        let mut configs: Vec<_> = [
            "qwen3_next_moe",
            "qwen3_5_dense",
            "qwen3_5_moe",
            "qwen4_exp",
        ]
        .iter()
        .map(|name| ModelConfig::from_dir(&fixtures.join(name)).unwrap())
        .collect();
        for name in ["qwen3_6_35b_a3b", "qwen3_8_flash_next"] {
            let path = fixtures.join(format!("configs/{name}.config.json"));
            configs.push(ModelConfig::from_file(&path).unwrap());
        }
        for config in &configs {
            for keys in [ExpertKeys::PerExpert, ExpertKeys::Fused] {
                for t in checkpoint_tensors(config, keys) {
                    assert_eq!(classify(&t.name), t.class, "{}", t.name);
                    let routed = t.class == TensorClass::RoutedExperts;
                    assert_eq!(quantizable(&t.name), t.quantizable && !routed, "{}", t.name);
                }
            }
        }
    }
}
