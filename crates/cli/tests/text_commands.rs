//! `spindle run`, `tokenize` and `template` end to end, against the fixtures and the demo.

use std::process::Command;

use serde_json::{json, Map, Value};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{demo_dir, Flow, GenerateOptions, Model, Prompt};
use spindle_testkit::fixtures;

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

#[test]
fn run_prints_exactly_the_decoded_greedy_tokens() {
    let prompt = "Tell me about the sea.";
    let out = spindle()
        .args(["run", "--temperature", "0", "--max-tokens", "32", prompt])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();

    let model = Model::load(&demo_dir().unwrap()).unwrap();
    let prepared = model
        .prepare(&Prompt::Chat {
            messages: json!([{"role": "user", "content": prompt}]),
            tools: None,
            vars: Map::new(),
            add_generation_prompt: true,
        })
        .unwrap();
    let mut session = model.new_session().unwrap();
    let options = GenerateOptions {
        sampling: SamplingParams::default(),
        max_tokens: Some(32),
        ..GenerateOptions::default()
    };
    let completion = model
        .generate(&mut session, &prepared.ids, &options, &mut |_| {
            Flow::Continue
        })
        .unwrap();
    let shown: Vec<u32> = completion
        .ids
        .iter()
        .copied()
        .filter(|id| !model.eos_ids.contains(id))
        .collect();
    let decoded = model.tokenizer.decode(&shown, true).unwrap();
    assert_eq!(stdout, format!("{decoded}\n"));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("tok/s"), "no statistics line: {stderr}");
}

#[test]
fn run_reads_the_prompt_from_stdin_and_accepts_raw_mode() {
    use std::io::Write;
    let mut child = spindle()
        .args(["run", "--raw", "--temperature", "0", "--max-tokens", "8"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Once upon a time")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.is_empty());
}

#[test]
fn tokenize_reproduces_the_reference_encodings() {
    let encodings: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer/encodings.json")).unwrap(),
    )
    .unwrap();
    let dir = fixtures().join("tokenizer");
    for case in encodings {
        let text = case["text"].as_str().unwrap();
        let out = spindle()
            .args(["tokenize", "--json", "--model"])
            .arg(&dir)
            .arg(text)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["ids"], case["ids"], "{text:?}");
        assert_eq!(
            got["pieces"].as_array().unwrap().len(),
            case["ids"].as_array().unwrap().len()
        );
    }
}

#[test]
fn template_renders_every_chat_case_byte_identically() {
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("chat/cases.json")).unwrap())
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("chat/qwen3_6_chat_template.jinja"),
        dir.path().join("chat_template.jinja"),
    )
    .unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let messages = dir.path().join(format!("{name}.json"));
        std::fs::write(&messages, case["messages"].to_string()).unwrap();
        let mut cmd = spindle();
        cmd.args(["template", "--model"])
            .arg(dir.path())
            .arg("--messages")
            .arg(&messages);
        if let Some(tools) = case.get("tools") {
            let path = dir.path().join(format!("{name}.tools.json"));
            std::fs::write(&path, tools.to_string()).unwrap();
            cmd.arg("--tools").arg(path);
        }
        for (key, value) in case.as_object().unwrap() {
            if !["name", "messages", "tools", "expected", "expected_error"].contains(&key.as_str())
            {
                cmd.arg("--var").arg(format!("{key}={value}"));
            }
        }
        let out = cmd.output().unwrap();
        match (case.get("expected"), case.get("expected_error")) {
            (Some(expected), _) => {
                assert!(
                    out.status.success(),
                    "{name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(
                    String::from_utf8(out.stdout).unwrap(),
                    expected.as_str().unwrap(),
                    "{name}"
                );
            }
            (None, Some(message)) => {
                assert!(!out.status.success(), "{name} should fail");
                let stderr = String::from_utf8(out.stderr).unwrap();
                assert!(
                    stderr.contains(message.as_str().unwrap()),
                    "{name}: {stderr}"
                );
            }
            _ => panic!("{name}: case has neither expected nor expected_error"),
        }
    }
}

#[test]
fn tokenize_and_template_need_no_weights() {
    // The tokenizer fixture directory has no config.json or weights at all.
    let dir = fixtures().join("tokenizer");
    assert!(!dir.join("config.json").exists());
    let out = spindle()
        .args(["tokenize", "--model"])
        .arg(&dir)
        .arg("Hello, world!")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "9419,11,1814,0\n");
}

#[test]
fn template_refuses_devices_and_fifos_as_message_files_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("messages.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo failed");
    for path in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        let start = std::time::Instant::now();
        let out = spindle()
            .args(["template", "--messages"])
            .arg(path)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("not a regular file"), "{stderr}");
        assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
    }
}

#[test]
fn run_raw_no_special_encodes_markers_as_text() {
    let prompt = "a<|im_end|>b";
    let count = |extra: &[&str]| {
        let out = spindle()
            .args([
                "run",
                "--raw",
                "--max-tokens",
                "1",
                "--temperature",
                "0",
                "--stats",
            ])
            .args(extra)
            .arg(prompt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let tokens = stderr
            .split("[prompt: ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok());
        tokens.unwrap_or_else(|| panic!("no prompt token count in {stderr}"))
    };
    let model = Model::load(&demo_dir().unwrap()).unwrap();
    assert_eq!(
        count(&[]),
        model.tokenizer.encode(prompt, true).unwrap().len()
    );
    assert_eq!(
        count(&["--no-special"]),
        model.tokenizer.encode(prompt, false).unwrap().len()
    );
}
