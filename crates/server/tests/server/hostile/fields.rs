//! Every field of every endpoint given each hostile value.

use serde_json::{json, Value};

use super::{endpoints, hostile_values, judge, send, splice};
use crate::common::TestServer;

/// Fields inside objects and lists, each with a valid request holding its parent.
fn nested_fields() -> Vec<(&'static str, Value, &'static str)> {
    let user = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut body = json!({"model": "m", "messages": user, "max_tokens": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let tools = json!([{"type": "function", "function": {"name": "f", "description": "d",
        "parameters": {"type": "object"}}}]);
    let messages = |extra: Value| {
        let mut body = json!({"model": "m", "messages": user, "max_tokens": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let responses = |extra: Value| {
        let mut body =
            json!({"model": "m", "input": "hi", "max_output_tokens": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    vec![
        ("/v1/chat/completions", chat(json!({})), "/messages/0/role"),
        (
            "/v1/chat/completions",
            chat(json!({})),
            "/messages/0/content",
        ),
        ("/v1/chat/completions", chat(json!({})), "/messages/0/name"),
        (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
            "/stream_options/include_usage",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_object"}})),
            "/response_format/type",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}}}})),
            "/response_format/json_schema",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}}}})),
            "/response_format/json_schema/schema",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools})),
            "/tools/0/type",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools})),
            "/tools/0/function",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools})),
            "/tools/0/function/name",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools})),
            "/tools/0/function/description",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "f"}}})),
            "/tool_choice/function/name",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"chat_template_kwargs": {"enable_thinking": false}})),
            "/chat_template_kwargs/enable_thinking",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"5": 1}})),
            "/logit_bias/5",
        ),
        (
            "/v1/messages",
            messages(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})),
            "/thinking/budget_tokens",
        ),
        (
            "/v1/messages",
            messages(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})),
            "/thinking/type",
        ),
        (
            "/v1/messages",
            messages(json!({"output_config": {"effort": "low"}})),
            "/output_config/effort",
        ),
        (
            "/v1/messages",
            messages(json!({"output_config": {"effort": "low"}})),
            "/output_config/format",
        ),
        (
            "/v1/messages",
            messages(json!({"system": [{"type": "text", "text": "s"}]})),
            "/system/0/text",
        ),
        (
            "/v1/messages",
            messages(json!({"system": [{"type": "text", "text": "s"}]})),
            "/system/0/type",
        ),
        ("/v1/messages", messages(json!({})), "/messages/0/role"),
        ("/v1/messages", messages(json!({})), "/messages/0/content"),
        (
            "/v1/messages",
            messages(json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}]})),
            "/tools/0/name",
        ),
        (
            "/v1/messages",
            messages(json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}]})),
            "/tools/0/input_schema",
        ),
        (
            "/v1/responses",
            responses(json!({"reasoning": {"effort": "low"}})),
            "/reasoning/effort",
        ),
        (
            "/v1/responses",
            responses(json!({"text": {"format": {"type": "text"}}})),
            "/text/format",
        ),
        (
            "/v1/responses",
            responses(json!({"text": {"format": {"type": "text"}}})),
            "/text/format/type",
        ),
        (
            "/v1/responses",
            responses(json!({"input": [{"role": "user", "content": "hi"}]})),
            "/input/0/role",
        ),
        (
            "/v1/responses",
            responses(json!({"input": [{"role": "user", "content": "hi"}]})),
            "/input/0/content",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": user, "stream": false,
            "options": {"num_predict": 2}}),
            "/messages/0/content",
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": user, "stream": false,
            "options": {"num_predict": 2}}),
            "/messages/0/images",
        ),
        (
            "/apply-template",
            json!({"messages": user}),
            "/messages/0/content",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_given_a_hostile_value_is_refused_by_name_or_served() {
    let server = TestServer::start(|_| {}).await;
    let mut failures = Vec::new();
    let mut served = Vec::new();
    let mut total = 0;
    let options: &[&str] = &[
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "num_predict",
        "stop",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
    ];
    let mut jobs: Vec<(&str, Value, String)> = Vec::new();
    for endpoint in endpoints() {
        for field in endpoint.fields {
            jobs.push((endpoint.path, endpoint.base.clone(), format!("/{field}")));
        }
        if endpoint.path.starts_with("/api/") {
            for option in options {
                jobs.push((
                    endpoint.path,
                    endpoint.base.clone(),
                    format!("/options/{option}"),
                ));
            }
        }
    }
    for (path, base, pointer) in nested_fields() {
        jobs.push((path, base, pointer.to_owned()));
    }
    for (path, base, pointer) in jobs {
        // The field the refusal names: the last segment that is not an index.
        let field = pointer
            .rsplit('/')
            .find(|s| s.parse::<usize>().is_err())
            .unwrap();
        for (value, raw) in hostile_values() {
            let label = format!("{path} {pointer} = {value}");
            let answer = send(&server, path, splice(&base, &pointer, &raw)).await;
            // A body too deeply nested to parse cannot be read as far as its field; a long
            // text may make the prompt longer than the context.
            let names: &[&str] = match value {
                v if v.starts_with("nested") => &[""],
                "a 200 kB string" => &[field, "the most the context holds"],
                _ => &[field],
            };
            total += 1;
            if matches!(&answer, Ok(a) if a.status == 200) {
                served.push(label.clone());
            }
            failures.extend(judge(&label, answer, names, true));
        }
    }
    eprintln!(
        "{total} hostile field values, {} served:\n  {}",
        served.len(),
        served.join("\n  ")
    );
    let (status, _) = server
        .post(
            "/v1/chat/completions",
            &crate::common::chat("still there?", 2),
        )
        .await;
    assert_eq!(status, 200, "the server stopped serving");
    assert!(
        failures.is_empty(),
        "{} of {total} hostile requests failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    server.stop().await;
}
