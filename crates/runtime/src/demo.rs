//! The embedded demo checkpoint (`models/demo`): a toy model of the Qwen3.5-MoE architecture
//! with random weights, a cut-down Qwen tokenizer and the Qwen3.6 chat template, built into the
//! binary so that spindle runs with no download. It is written to a cache directory on first
//! use (memory maps need a file) and verified by SHA-256 afterwards.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};

const FILES: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../../../models/demo/config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../../models/demo/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../../models/demo/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../../models/demo/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_bytes!("../../../models/demo/tokenizer_config.json"),
    ),
    (
        "chat_template.jinja",
        include_bytes!("../../../models/demo/chat_template.jinja"),
    ),
];

/// The name `/v1/models` and the CLI show for the embedded model.
pub const DEMO_MODEL_ID: &str = "spindle-demo";

fn digest() -> String {
    let mut h = Sha256::new();
    for (name, bytes) in FILES {
        h.update(name.as_bytes());
        h.update(bytes);
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPINDLE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("spindle");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/spindle"),
        None => std::env::temp_dir().join("spindle"),
    }
}

fn intact(dir: &Path) -> bool {
    FILES
        .iter()
        .all(|(name, bytes)| std::fs::read(dir.join(name)).is_ok_and(|on_disk| on_disk == *bytes))
}

/// The directory holding the demo checkpoint, written (atomically) if missing or damaged.
pub fn demo_dir() -> Result<PathBuf> {
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_writer_per_process = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = cache_root().join(format!("demo-{}", digest()));
    if intact(&dir) {
        return Ok(dir);
    }
    let io = |path: &Path, e: std::io::Error| RuntimeError::File {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let parent = dir.parent().expect("cache dir has a parent");
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = parent.join(format!(".demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    for (name, bytes) in FILES {
        std::fs::write(tmp.join(name), bytes).map_err(|e| io(&tmp.join(name), e))?;
    }
    if dir.exists() {
        // Damaged (an interrupted copy from an older version): replace it.
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another process may have won the race; use its copy if it is intact.
        let _ = std::fs::remove_dir_all(&tmp);
        if !intact(&dir) {
            return Err(io(&dir, e));
        }
    }
    Ok(dir)
}
