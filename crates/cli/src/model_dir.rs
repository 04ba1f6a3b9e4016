//! Which model a command runs: `--model DIR`, or the embedded demo when it is omitted.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The directory of `--model` (or a GGUF file), or the embedded demo checkpoint.
pub fn resolve(model: Option<&PathBuf>) -> Result<PathBuf> {
    match model {
        Some(dir) => {
            if spindle_model::gguf::is_gguf(dir) {
                anyhow::ensure!(dir.is_file(), "GGUF file {} does not exist", dir.display());
                return Ok(dir.clone());
            }
            anyhow::ensure!(
                dir.is_dir(),
                "model directory {} does not exist",
                dir.display()
            );
            Ok(dir.clone())
        }
        None => spindle_runtime::demo_dir().context("unpacking the embedded demo model"),
    }
}

/// The model as messages show it: `--model`'s directory as given, or the embedded demo's name
/// (`spindle-demo (embedded)`), never the cache directory it is unpacked into.
pub fn name(model: Option<&PathBuf>) -> String {
    match model {
        Some(dir) => dir.display().to_string(),
        None => format!("{} (embedded)", spindle_runtime::DEMO_MODEL_ID),
    }
}
