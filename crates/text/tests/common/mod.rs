//! Fixture access shared by the integration tests. A missing fixture fails the test loudly.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};
use spindle_text::{ChatTemplate, Tokenizer};

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

/// The Qwen3.6 chat template of the fixtures.
pub fn qwen_template() -> ChatTemplate {
    let path = fixture("chat/qwen3_6_chat_template.jinja");
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    ChatTemplate::from_source(&source).unwrap_or_else(|e| panic!("{e}"))
}

/// The extra template variables of a `chat/cases.json` case: its fields other than the
/// conversation and the expectations.
pub fn case_extra(case: &Value) -> Map<String, Value> {
    const CASE_FIELDS: [&str; 6] = [
        "name",
        "messages",
        "tools",
        "add_generation_prompt",
        "expected",
        "expected_error",
    ];
    case.as_object()
        .expect("a case is an object")
        .iter()
        .filter(|(k, _)| !CASE_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
