//! A chat template from a model directory runs within a budget (issue 17, item 9): a
//! template that loops or grows without end, in steps, output or memory, is stopped with an
//! error naming it and the budget; a cancelled render stops at once.

mod common;

use std::time::{Duration, Instant};

use common::fixture;
use serde_json::{json, Map};
use spindle_text::{Cancel, ChatTemplate, TextError};

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

/// How the memory budget is named in errors.
fn memory_budget() -> String {
    format!("{} MiB of memory", spindle_text::RENDER_MEMORY_BYTES >> 20)
}

/// This process's peak resident set (VmHWM), in bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

#[test]
fn a_string_doubling_template_is_stopped_by_its_memory_budget() {
    let before = peak_rss_bytes();
    let (result, took) = render(
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    );
    let grown = peak_rss_bytes().saturating_sub(before);
    eprintln!("string doubling stopped after {took:?}; this process's peak RSS grew {grown} bytes");
    assert_budget_error(result, &memory_budget());
    assert!(grown < 200 << 20, "peak RSS grew {grown} bytes");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // The worker it killed is replaced: the same template renders again and is refused again.
    let template = ChatTemplate::from_source(
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    )
    .unwrap();
    for _ in 0..2 {
        assert_budget_error(
            template.render(&json!([]), None, true, &Map::new()),
            &memory_budget(),
        );
    }
}

#[test]
fn a_cancelled_render_stops_at_once() {
    let template = ChatTemplate::from_source(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    )
    .unwrap();
    let cancel = Cancel::default();
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            cancel.cancel();
        })
    };
    let start = Instant::now();
    let result =
        template.render_prompt_cancellable(&json!([]), None, true, &Map::new(), &[], &cancel);
    let took = start.elapsed();
    canceller.join().unwrap();
    assert!(matches!(result, Err(TextError::Cancelled)), "{result:?}");
    assert!(took < Duration::from_millis(600), "took {took:?}");
}

#[test]
fn ordinary_renders_reuse_their_worker() {
    let source = std::fs::read_to_string(fixture("chat/qwen3_6_chat_template.jinja")).unwrap();
    let template = ChatTemplate::from_source(&source).unwrap();
    let messages = json!([{"role": "user", "content": "Write a haiku about spindles."}]);
    let first = template.render(&messages, None, true, &Map::new()).unwrap();
    let start = Instant::now();
    for _ in 0..200 {
        assert_eq!(
            template.render(&messages, None, true, &Map::new()).unwrap(),
            first
        );
    }
    let each = start.elapsed() / 200;
    eprintln!("a one-message chat renders in {each:?} through its worker");
    // A fork per render would cost milliseconds; a pipe round trip costs microseconds.
    assert!(each < Duration::from_millis(2), "{each:?} per render");
}
