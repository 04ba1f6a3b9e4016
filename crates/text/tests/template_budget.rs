//! A chat template from a model directory runs within a budget (issue 17, item 9): a
//! template that loops or grows without end is stopped with an error naming it and the budget.

mod common;

use std::time::{Duration, Instant};

use common::fixture;
use serde_json::{json, Map};
use spindle_text::{ChatTemplate, TextError};

fn render(source: &str) -> (Result<String, TextError>, Duration) {
    let template = ChatTemplate::from_source(source).unwrap();
    let start = Instant::now();
    let result = template.render(&json!([]), None, true, &Map::new());
    (result, start.elapsed())
}

fn assert_budget_error(result: Result<String, TextError>, budget: &str) {
    match result {
        Err(e @ TextError::TemplateBudget { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains("\"default\"") && message.contains(budget),
                "{message}"
            );
        }
        Err(e) => panic!("expected a budget error, got {e}"),
        Ok(text) => panic!("rendered {} bytes", text.len()),
    }
}

#[test]
fn nested_loops_stop_quickly_naming_the_budget() {
    let (result, took) =
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    eprintln!("nested loops stopped after {took:?}");
    assert_budget_error(result, "fuel");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn growing_output_stops_at_the_output_cap() {
    let (result, took) = render(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endfor %}",
    );
    eprintln!("output growth stopped after {took:?}");
    assert_budget_error(result, "bytes of output");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_long_tool_conversation_renders_well_within_the_budget() {
    let source = std::fs::read_to_string(fixture("chat/qwen3_6_chat_template.jinja")).unwrap();
    let template = ChatTemplate::from_source(&source).unwrap();
    let mut messages = vec![json!({"role": "system", "content": "You are helpful."})];
    for i in 0..2000 {
        messages.push(json!({"role": "user", "content": format!("question {i}")}));
        messages.push(json!({"role": "assistant", "content": "<think>\nhm\n</think>\n\nlet me look", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": format!("q{i}"), "n": 3}}}
        ]}));
        messages.push(json!({"role": "tool", "content": format!("result {i}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
    }
    let tools = json!([{"type": "function", "function": {"name": "search", "description": "web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "n": {"type": "integer"}}}}}]);
    let start = Instant::now();
    let text = template
        .render(&json!(messages), Some(&tools), true, &Map::new())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(text.len() > 100_000);
    eprintln!("8001 messages rendered in {:?}", start.elapsed());
}
