//! The chat template against the prompts Jinja2 renders under transformers' configuration.

mod common;

use common::{case_extra, qwen_template, read_json};
use serde_json::{json, Map};
use spindle_text::{ChatTemplate, TextError};

#[test]
fn fixture_cases_render_byte_identically() {
    let template = qwen_template();
    let cases = read_json("chat/cases.json");
    let cases = cases.as_array().expect("cases.json is a list");
    assert!(
        cases.len() >= 8,
        "expected the full fixture, got {}",
        cases.len()
    );
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let extra = case_extra(case);
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap_or(false);
        let result = template.render(
            &case["messages"],
            case.get("tools"),
            add_generation_prompt,
            &extra,
        );
        match (case.get("expected"), case.get("expected_error")) {
            (Some(expected), None) => {
                let got = result.unwrap_or_else(|e| panic!("case {name}: {e}"));
                assert_eq!(got, expected.as_str().unwrap(), "case {name}");
            }
            (None, Some(message)) => match result {
                Err(TextError::TemplateException { message: got }) => {
                    assert_eq!(got, message.as_str().unwrap(), "case {name}")
                }
                other => panic!("case {name}: expected error {message}, got {other:?}"),
            },
            _ => panic!("case {name} has neither `expected` nor `expected_error`"),
        }
    }
}

#[test]
fn tojson_keeps_non_ascii_and_python_spacing() {
    let template = ChatTemplate::from_source(
        "{{ tools | tojson }}|{{ x | tojson(indent=2) }}|{{ bos_token }}{% for k, v in x|items %}{{ k }}{% endfor %}",
    )
    .unwrap();
    let tools = json!([{"name": "日本", "n": 1.5, "q": "a\"b"}]);
    let mut extra = Map::new();
    extra.insert("x".into(), json!({"z": [1], "a": true}));
    let out = template
        .render(&json!([]), Some(&tools), false, &extra)
        .unwrap();
    assert_eq!(
        out,
        "[{\"name\": \"日本\", \"n\": 1.5, \"q\": \"a\\\"b\"}]|{\n  \"z\": [\n    1\n  ],\n  \"a\": true\n}|za"
    );
}

#[test]
fn loop_controls_and_pycompat_methods_work() {
    let template = ChatTemplate::from_source(
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.startswith('s') %}{% continue %}{% endif %}{{ m.split(',')[0].rstrip('!') }};{% endfor %}",
    )
    .unwrap();
    let out = template
        .render(&json!(["a!,b", "skip", "c", "d"]), None, false, &Map::new())
        .unwrap();
    assert_eq!(out, "a;");
}

#[test]
fn model_dir_loading_picks_default_and_special_tokens() {
    let dir = std::env::temp_dir().join(format!("spindle-text-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = json!({
        "bos_token": {"content": "<s>", "special": true},
        "eos_token": "</s>",
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"},
            {"name": "tool_use", "template": "T"}
        ]
    });
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    let template = ChatTemplate::from_dir(&dir).unwrap();
    assert_eq!(
        template
            .render(&json!([]), None, false, &Map::new())
            .unwrap(),
        "<s>D</s>"
    );
    let tools = json!([]);
    assert_eq!(
        template
            .render(&json!([]), Some(&tools), false, &Map::new())
            .unwrap(),
        "T"
    );
    // A chat_template.jinja file takes precedence over the config field.
    std::fs::write(dir.join("chat_template.jinja"), "J{{ eos_token }}").unwrap();
    let template = ChatTemplate::from_dir(&dir).unwrap();
    assert_eq!(
        template
            .render(&json!([]), None, false, &Map::new())
            .unwrap(),
        "J</s>"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_are_typed_errors() {
    let err = ChatTemplate::from_source("{% if %}").unwrap_err();
    assert!(matches!(err, TextError::TemplateSyntax { .. }), "{err}");
    let template = ChatTemplate::from_source("{{ messages[0].content }}").unwrap();
    let err = template
        .render(&json!({"role": "user"}), None, false, &Map::new())
        .unwrap_err();
    assert!(err.to_string().contains("messages"), "{err}");
    let err = ChatTemplate::from_dir("/nonexistent/model").unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate { .. }), "{err}");
}
