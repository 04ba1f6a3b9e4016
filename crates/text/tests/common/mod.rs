//! Fixture access shared by the integration tests. A missing fixture fails the test loudly.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use spindle_text::Tokenizer;

/// `relative` inside the repository's fixtures (through `spindle_testkit`, which unpacks the
/// compressed tokenizer).
pub fn fixture(relative: &str) -> PathBuf {
    let path = spindle_testkit::fixtures().join(relative);
    assert!(path.exists(), "fixture {} is missing", path.display());
    path
}

pub fn read_json(relative: &str) -> serde_json::Value {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The Qwen3.5/3.6 tokenizer, loaded once per test binary.
pub fn qwen_tokenizer() -> Arc<Tokenizer> {
    static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let path = fixture("tokenizer/tokenizer.json");
            Arc::new(Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}")))
        })
        .clone()
}
