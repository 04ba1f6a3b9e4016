//! Which model a command runs: `--model DIR`, or the embedded demo when it is omitted.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The directory of `--model`, or the embedded demo checkpoint.
pub fn resolve(model: Option<&PathBuf>) -> Result<PathBuf> {
    match model {
        Some(dir) => {
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
