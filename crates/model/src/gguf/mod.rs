//! GGUF files made by llama.cpp's converter (`convert_hf_to_gguf.py`) for the Qwen hybrid
//! families: the container ([`file`]), the ggml types and their dequantizers ([`quants`]),
//! and the mapping of an architecture's metadata to a [`ModelConfig`] and of its tensors back
//! to the safetensors names and layout spindle loads ([`qwen`]), undoing the converter's
//! reorderings. Float tensors stored as the loader wants them stay memory-mapped, and so do
//! quantized ones, in their ggml blocks (`Part::Blocks`: run as they are by the CPU, or
//! dequantized exactly when read as a float matrix); reordered ones are converted on open
//! (whole block rows moved where the reordering moves rows, f32 otherwise), except a tiled
//! `ssm_out`, kept mapped with its input gathered into the stored column order.

pub mod file;
pub use crate::quant::ggml as quants;
pub mod qwen;
pub mod tokenizer;
pub mod write;

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};
use crate::tensor::Part;
use crate::ModelConfig;
use file::GgufFile;

/// Whether `path` names a GGUF file (by its extension; a directory never is).
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && !path.is_dir()
}

/// The files of the model at `path`: the file itself, or every part of a split set
/// (`name-00001-of-0000N.gguf`, given any part).
pub fn split_files(path: &Path) -> Result<Vec<PathBuf>> {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return Ok(vec![path.to_owned()]);
    };
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    // "model-00001-of-00003" splits (from the right) into ["00003", "of", "00001", "model"].
    let split = match parts.as_slice() {
        [count, "of", index, base]
            if count.len() == 5
                && index.len() == 5
                && count.bytes().all(|b| b.is_ascii_digit())
                && index.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Some((base.to_string(), count.parse::<usize>().unwrap_or(0)))
        }
        _ => None,
    };
    let Some((base, count)) = split.filter(|(_, n)| *n > 0) else {
        return Ok(vec![path.to_owned()]);
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    let files: Vec<PathBuf> = (1..=count)
        .map(|i| dir.join(format!("{base}-{i:05}-of-{count:05}.gguf")))
        .collect();
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        return Err(ModelError::Io {
            path: missing.clone(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("part of the split GGUF set {} is missing", path.display()),
            ),
        });
    }
    Ok(files)
}

/// Opens every file of the model at `path`, checking a split set's `split.*` keys.
pub fn open_files(path: &Path) -> Result<Vec<GgufFile>> {
    let names = split_files(path)?;
    let count = names.len();
    let files = names
        .iter()
        .map(|p| GgufFile::open(p))
        .collect::<Result<Vec<_>>>()?;
    if count > 1 {
        for (i, f) in files.iter().enumerate() {
            let no = f.get("split.no").and_then(|v| v.as_u64());
            let n = f.get("split.count").and_then(|v| v.as_u64());
            if no != Some(i as u64) || n != Some(count as u64) {
                return Err(ModelError::Gguf {
                    path: f.path.clone(),
                    message: format!(
                        "metadata keys `split.no` = {no:?}, `split.count` = {n:?}: expected {i} and {count} for part {} of the set",
                        i + 1
                    ),
                });
            }
        }
    }
    Ok(files)
}

/// A one-line description of the GGUF model at `path`: architecture, parts and tensor types
/// (`spindle inspect`).
pub fn describe(path: &Path) -> Result<String> {
    let files = open_files(path)?;
    let arch = files[0]
        .get("general.architecture")
        .and_then(file::Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for t in files.iter().flat_map(|f| &f.tensors) {
        match counts.iter_mut().find(|(n, _)| *n == t.ty.name()) {
            Some((_, c)) => *c += 1,
            None => counts.push((t.ty.name(), 1)),
        }
    }
    let types: Vec<String> = counts.iter().map(|(n, c)| format!("{n} x{c}")).collect();
    Ok(format!(
        "GGUF {arch}, {} file{}, tensors {}",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        types.join(", ")
    ))
}

/// The [`ModelConfig`] of the GGUF model at `path`, from its metadata.
pub fn open_config(path: &Path) -> Result<ModelConfig> {
    let files = open_files(path)?;
    let json = qwen::config_json(&files)?;
    ModelConfig::from_json_str(&json.to_string(), path)
}

/// The tensors of the GGUF model at `path`, under spindle's safetensors names and layout (a
/// checkpoint assembles them).
pub(crate) fn open_parts(path: &Path) -> Result<Vec<(String, Part)>> {
    let files = open_files(path)?;
    let json = qwen::config_json(&files)?;
    let config = ModelConfig::from_json_str(&json.to_string(), path)?;
    qwen::tensors(&files, &config)
}

/// The Hugging Face `tokenizer.json` rebuilt from the GGUF model's `tokenizer.ggml.*` keys
/// (serialized), or `None` when it carries no tokenizer.
pub fn open_tokenizer_json(path: &Path) -> Result<Option<String>> {
    let files = open_files(path)?;
    Ok(tokenizer::tokenizer_json(&files[0])?.map(|j| j.to_string()))
}

/// The GGUF model's `tokenizer.chat_template`, if any.
pub fn open_chat_template(path: &Path) -> Result<Option<String>> {
    let files = open_files(path)?;
    tokenizer::chat_template(&files[0])
}
