//! GGUF files through the CLI: the tokenizer and chat template rebuilt from a GGUF file's
//! metadata (written here as llama.cpp's converter writes them: `tokenizer.ggml.tokens` by
//! id, `token_type`, `merges` as "a b", `pre`, `tokenizer.chat_template`), and the commands
//! that take `--model x.gguf`.

use std::path::Path;
use std::process::Command;

use serde_json::Value as Json;
use spindle_model::gguf::file::Value;
use spindle_model::gguf::write::write;
use spindle_testkit::fixtures;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

/// Writes `path`: the fixture Qwen3.5 tokenizer and `template` as GGUF metadata.
fn write_tokenizer_gguf(path: &Path, template: &str) {
    let text = std::fs::read_to_string(fixtures().join("tokenizer/tokenizer.json")).unwrap();
    let t: Json = serde_json::from_str(&text).unwrap();
    let vocab = t["model"]["vocab"].as_object().unwrap();
    let added = t["added_tokens"].as_array().unwrap();
    let n = vocab.len() + added.len();
    let mut tokens = vec![String::new(); n];
    let mut types = vec![Value::I64(1); n];
    for (token, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = token.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = a["content"].as_str().unwrap().to_owned();
        types[id] = Value::I64(if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        });
    }
    let merges: Vec<Value> = t["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let pair = m.as_array().unwrap();
            Value::Str(format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ))
        })
        .collect();
    let s = |x: &str| Value::Str(x.to_owned());
    let metadata = vec![
        ("general.architecture".to_owned(), s("qwen35moe")),
        ("tokenizer.ggml.model".to_owned(), s("gpt2")),
        ("tokenizer.ggml.pre".to_owned(), s("qwen35")),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(tokens.into_iter().map(Value::Str).collect()),
        ),
        ("tokenizer.ggml.token_type".to_owned(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_owned(), Value::Array(merges)),
        ("tokenizer.chat_template".to_owned(), s(template)),
    ];
    write(path, &metadata, &[]).unwrap();
}

#[test]
fn the_gguf_tokenizer_encodes_as_the_original_and_its_template_renders_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("tokenizer.gguf");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    let template = std::fs::read_to_string(demo.join("chat_template.jinja")).unwrap();
    write_tokenizer_gguf(&gguf, &template);

    let cases: Json = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer/encodings.json")).unwrap(),
    )
    .unwrap();
    let tokenizer = spindle_runtime::model::load_tokenizer(&gguf).unwrap();
    let original =
        spindle_text::Tokenizer::from_file(fixtures().join("tokenizer/tokenizer.json")).unwrap();
    let cases = cases.as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tokenizer.encode(text, true).unwrap(), want, "{text:?}");
        assert_eq!(
            original.encode(text, true).unwrap(),
            want,
            "{text:?} (original)"
        );
        assert_eq!(
            tokenizer.decode(&want, false).unwrap(),
            original.decode(&want, false).unwrap()
        );
    }

    // Through the CLI: tokenize and template take the GGUF file as --model.
    let out = spindle()
        .args(["tokenize", "--model"])
        .arg(&gguf)
        .arg(cases[0]["text"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = cases[0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), ids.join(","));

    let messages = tmp.path().join("messages.json");
    std::fs::write(&messages, r#"[{"role": "user", "content": "Hello there"}]"#).unwrap();
    let render = |model: &Path| {
        let out = spindle()
            .args([
                "template",
                "--var",
                "add_generation_prompt=true",
                "--messages",
            ])
            .arg(&messages)
            .arg("--model")
            .arg(model)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let rendered = render(&gguf);
    assert!(rendered.contains("Hello there"), "{rendered}");
    assert_eq!(rendered, render(&demo));
}

#[test]
fn a_gguf_without_a_tokenizer_is_refused_by_run_naming_the_file() {
    let gguf = fixtures().join("gguf/qwen3_5_moe.bf16.gguf");
    let out = spindle()
        .args(["run", "--max-tokens", "2", "--model"])
        .arg(&gguf)
        .arg("hello")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("qwen3_5_moe.bf16.gguf") && stderr.contains("no tokenizer"),
        "{stderr}"
    );
}

#[test]
fn logits_and_inspect_take_a_gguf_file() {
    let gguf = fixtures().join("gguf/qwen3_5_moe.bf16.gguf");
    let reference = fixtures().join("qwen3_5_moe/reference.safetensors");
    let tmp = tempfile::tempdir().unwrap();
    let out = spindle()
        .args(["logits", "--decode", "4", "--tolerance", "1e-4", "--model"])
        .arg(&gguf)
        .arg("--tokens-from")
        .arg(&reference)
        .arg("--compare")
        .arg(&reference)
        .arg("--out")
        .arg(tmp.path().join("out.safetensors"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = spindle()
        .args(["inspect", "--json"])
        .arg(&gguf)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["family"], "qwen3_5_moe");
    assert!(json["source_format"]
        .as_str()
        .unwrap()
        .starts_with("GGUF qwen35moe"));
}

#[test]
fn inspect_lists_the_k_quant_types_of_a_llama_quantize_file() {
    let gguf = fixtures().join("gguf/llama_cpp/qwen35moe_k256.Q4_K_M.gguf");
    let out = spindle().arg("inspect").arg(&gguf).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let weights = text
        .lines()
        .find(|l| l.trim_start().starts_with("weights"))
        .unwrap_or_else(|| panic!("no weights line in:\n{text}"));
    for ty in ["GGUF qwen35moe", "Q4_K x", "Q6_K x"] {
        assert!(weights.contains(ty), "{ty} missing from {weights:?}");
    }
}
