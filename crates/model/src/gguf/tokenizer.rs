//! The tokenizer and chat template a GGUF file carries (`tokenizer.ggml.*`,
//! `tokenizer.chat_template`), turned back into the Hugging Face `tokenizer.json` that
//! llama.cpp's converter read (`set_vocab_gpt2`: tokens by id, token types, merges, and the
//! pre-tokenizer named by `tokenizer.ggml.pre`).

use serde_json::{json, Map, Value as Json};

use super::file::{GgufFile, Value};
use crate::error::{ModelError, Result};

/// llama.cpp token types (`gguf.TokenType`).
const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;

/// The Hugging Face pre-tokenizer split of a `tokenizer.ggml.pre` name (the "original regex
/// from tokenizer.json" llama.cpp's `llama-vocab.cpp` cites for it), and whether that
/// tokenizer ignores merges for words in the vocabulary.
fn pre_tokenizer(pre: &str) -> Option<(&'static str, bool)> {
    match pre {
        "qwen35" => Some((
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            true,
        )),
        "qwen2" => Some((
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            false,
        )),
        _ => None,
    }
}

fn err(f: &GgufFile, message: String) -> ModelError {
    ModelError::Gguf {
        path: f.path.clone(),
        message,
    }
}

fn strings<'a>(f: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let v = f
        .get(key)
        .ok_or_else(|| err(f, format!("metadata key `{key}` is missing")))?;
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            err(
                f,
                format!("metadata key `{key}` is not an array of strings"),
            )
        })
}

/// The `tokenizer.json` of the file, or `None` when it carries no tokenizer.
pub fn tokenizer_json(f: &GgufFile) -> Result<Option<Json>> {
    let Some(model) = f.get("tokenizer.ggml.model") else {
        if f.get("tokenizer.ggml.tokens").is_some() {
            return Err(err(
                f,
                "metadata key `tokenizer.ggml.tokens` is there but `tokenizer.ggml.model` is missing: the tokenizer's kind is unknown".into(),
            ));
        }
        return Ok(None);
    };
    if model.as_str() != Some("gpt2") {
        return Err(err(
            f,
            format!("metadata key `tokenizer.ggml.model` = {model:?}: only \"gpt2\" (byte-level BPE, what the Qwen families use) is supported"),
        ));
    }
    let pre = f
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let (regex, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| {
        err(
            f,
            format!("metadata key `tokenizer.ggml.pre` = {pre:?}: spindle knows the pre-tokenizers \"qwen35\" and \"qwen2\""),
        )
    })?;
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let merges = strings(f, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match f.get("tokenizer.ggml.token_type") {
        None => vec![NORMAL; tokens.len()],
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| match *x {
                        Value::I64(n) => Some(n),
                        Value::U64(n) => i64::try_from(n).ok(),
                        _ => None,
                    })
                    // llama.cpp's types: undefined, normal, unknown, control, user-defined,
                    // unused, byte.
                    .map(|t| t.filter(|t| (0..=6).contains(t)))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|t| t.len() == tokens.len())
            .ok_or_else(|| {
                err(
                    f,
                    format!(
                        "metadata key `tokenizer.ggml.token_type` is not {} token types (integers 0 to 6)",
                        tokens.len()
                    ),
                )
            })?,
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, (&token, &ty)) in tokens.iter().zip(&types).enumerate() {
        match ty {
            CONTROL | USER_DEFINED => added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": ty == USER_DEFINED, "special": ty == CONTROL,
            })),
            UNUSED => {}
            _ => {
                vocab.insert(token.to_owned(), id.into());
            }
        }
    }
    let merges: Vec<Json> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok(json!([a, b])),
            None => Err(err(
                f,
                format!("merge {m:?} in `tokenizer.ggml.merges` is not two tokens"),
            )),
        })
        .collect::<Result<_>>()?;
    Ok(Some(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if pre == "qwen2" { json!({"type": "NFC"}) } else { Json::Null },
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    })))
}

/// `tokenizer.chat_template`, when the file carries one.
pub fn chat_template(f: &GgufFile) -> Result<Option<String>> {
    match f.get("tokenizer.chat_template") {
        None => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s.clone())),
        Some(other) => Err(err(
            f,
            format!("metadata key `tokenizer.chat_template` = {other:?}: expected a string"),
        )),
    }
}
