//! Hostile requests on every endpoint: each top-level field (and each of Ollama's options)
//! given the wrong type, a negative, zero, fractional or huge number, a "NaN" string, deep
//! nesting, an enormous array or string; then hand-made hostile messages, tools, stops and
//! images. Each answer is a 4xx naming the field, or a 200 where the value is a valid one; never
//! a 5xx, a dropped connection or a hang, and the server keeps serving afterwards.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::common::TestServer;

/// Where a raw hostile value is spliced into a request (serialized JSON).
const SLOT: &str = "\"__hostile__\"";

/// Raw JSON texts wrong for almost any field, each with a label.
fn hostile_values() -> Vec<(&'static str, String)> {
    vec![
        ("a string", "\"x\"".into()),
        ("-1", "-1".into()),
        ("0", "0".into()),
        ("1.5", "1.5".into()),
        ("1e300", "1e300".into()),
        ("-1e300", "-1e300".into()),
        ("u64::MAX", u64::MAX.to_string()),
        ("i64::MIN", i64::MIN.to_string()),
        ("beyond u64", "123456789012345678901234567890".into()),
        ("true", "true".into()),
        ("[]", "[]".into()),
        ("{}", "{}".into()),
        ("\"NaN\"", "\"NaN\"".into()),
        ("\"-Infinity\"", "\"-Infinity\"".into()),
        ("[null]", "[null]".into()),
        ("nested 5000 deep", "[".repeat(5000) + &"]".repeat(5000)),
        (
            "a 20000-entry array",
            format!("[{}]", vec!["7"; 20000].join(",")),
        ),
        ("a 200 kB string", format!("\"{}\"", "a".repeat(200_000))),
    ]
}

struct Endpoint {
    path: &'static str,
    /// A valid request: a short greedy answer.
    base: Value,
    /// The top-level fields the endpoint reads.
    fields: &'static [&'static str],
}

fn endpoints() -> Vec<Endpoint> {
    let messages = json!([{"role": "user", "content": "hi"}]);
    let common: &[&str] = &[
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "n",
        "logprobs",
        "logit_bias",
        "stop_token_ids",
        "min_tokens",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "grammar",
        "json_schema",
    ];
    let chat: &'static [&'static str] = Box::leak(
        [
            common,
            &[
                "messages",
                "max_completion_tokens",
                "top_logprobs",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "chat_template_kwargs",
                "reasoning_effort",
            ],
        ]
        .concat()
        .into_boxed_slice(),
    );
    let completions: &'static [&'static str] = Box::leak(
        [
            common,
            &["prompt", "special_tokens", "echo", "suffix", "best_of"],
        ]
        .concat()
        .into_boxed_slice(),
    );
    vec![
        Endpoint {
            path: "/v1/chat/completions",
            base: json!({"model": "m", "messages": messages, "max_tokens": 2, "temperature": 0}),
            fields: chat,
        },
        Endpoint {
            path: "/v1/completions",
            base: json!({"model": "m", "prompt": "hi", "max_tokens": 2, "temperature": 0}),
            fields: completions,
        },
        Endpoint {
            path: "/v1/messages",
            base: json!({"model": "m", "messages": messages, "max_tokens": 2, "temperature": 0}),
            fields: &[
                "model",
                "max_tokens",
                "messages",
                "system",
                "stop_sequences",
                "stream",
                "temperature",
                "top_p",
                "top_k",
                "tools",
                "tool_choice",
                "thinking",
                "output_config",
            ],
        },
        Endpoint {
            path: "/v1/messages/count_tokens",
            base: json!({"model": "m", "messages": messages}),
            fields: &[
                "model",
                "messages",
                "system",
                "tools",
                "tool_choice",
                "thinking",
                "output_config",
            ],
        },
        Endpoint {
            path: "/v1/responses",
            base: json!({"model": "m", "input": "hi", "max_output_tokens": 2, "temperature": 0}),
            fields: &[
                "model",
                "input",
                "instructions",
                "max_output_tokens",
                "temperature",
                "top_p",
                "stream",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "reasoning",
                "text",
                "store",
                "truncation",
                "background",
                "include",
            ],
        },
        Endpoint {
            path: "/api/chat",
            base: json!({"model": "m", "messages": messages, "stream": false,
                "options": {"num_predict": 2, "temperature": 0}}),
            fields: &[
                "model", "messages", "tools", "stream", "format", "options", "think",
            ],
        },
        Endpoint {
            path: "/api/generate",
            base: json!({"model": "m", "prompt": "hi", "stream": false,
                "options": {"num_predict": 2, "temperature": 0}}),
            fields: &[
                "model", "prompt", "system", "stream", "raw", "format", "options", "think",
                "images",
            ],
        },
        Endpoint {
            path: "/tokenize",
            base: json!({"content": "hi"}),
            fields: &["content", "add_special", "parse_special", "with_pieces"],
        },
        Endpoint {
            path: "/detokenize",
            base: json!({"tokens": [1, 2]}),
            fields: &["tokens"],
        },
        Endpoint {
            path: "/apply-template",
            base: json!({"messages": messages}),
            fields: &[
                "messages",
                "tools",
                "tool_choice",
                "chat_template_kwargs",
                "reasoning_effort",
            ],
        },
    ]
}

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

/// What a hostile request got.
struct Answer {
    status: u16,
    body: String,
}

async fn send(server: &TestServer, path: &str, body: String) -> Result<Answer, String> {
    let sent = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(30))
        .body(body)
        .send();
    let r = sent.await.map_err(|e| format!("no answer: {e}"))?;
    let status = r.status().as_u16();
    let body = r
        .text()
        .await
        .map_err(|e| format!("{status}, then the body broke off: {e}"))?;
    Ok(Answer { status, body })
}

/// Checks one answer: a 4xx naming one of `names` (an empty name: any 4xx), or a 200 when
/// `may_succeed`; returns the failure.
fn judge(
    label: &str,
    answer: Result<Answer, String>,
    names: &[&str],
    may_succeed: bool,
) -> Option<String> {
    let answer = match answer {
        Ok(a) => a,
        Err(e) => return Some(format!("{label}: {e}")),
    };
    let shown: String = answer.body.chars().take(300).collect();
    match answer.status {
        200 if may_succeed => None,
        // A refusal quotes what it refuses in brief, not a 200 kB value whole.
        400..=499 if answer.body.len() > 4096 => Some(format!(
            "{label}: {} of {} bytes: {shown}",
            answer.status,
            answer.body.len()
        )),
        400..=499 if names.iter().any(|n| answer.body.contains(n)) => None,
        400..=499 => Some(format!(
            "{label}: {} names none of {names:?}: {shown}",
            answer.status
        )),
        status => Some(format!("{label}: {status}: {shown}")),
    }
}

/// The request `base` with `pointer` set to the raw JSON `raw`.
fn splice(base: &Value, pointer: &str, raw: &str) -> String {
    let mut body = base.clone();
    match body.pointer_mut(pointer) {
        Some(slot) => *slot = Value::String("__hostile__".into()),
        None => {
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            body.pointer_mut(parent).unwrap()[key] = Value::String("__hostile__".into());
        }
    }
    body.to_string().replacen(SLOT, raw, 1)
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

/// A PNG whose header claims `w` x `h` (CRC fixed), holding a 1x1 image's data.
fn forged_png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(1, 1, image::Rgb([1, 2, 3]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    let mut bytes = out.into_inner();
    bytes[16..20].copy_from_slice(&w.to_be_bytes());
    bytes[20..24].copy_from_slice(&h.to_be_bytes());
    let mut crc = !0u32;
    for &b in &bytes[12..29] {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    bytes[29..33].copy_from_slice(&(!crc).to_be_bytes());
    bytes
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_messages_tools_stops_and_images_are_refused_by_name() {
    let server = TestServer::start(|_| {}).await;
    let chat = |extra: Value| {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let image_part = |url: String| {
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}]}]})
    };
    let huge_png = format!(
        "data:image/png;base64,{}",
        b64(&forged_png(1 << 20, 1 << 20))
    );
    let zero_png = format!("data:image/png;base64,{}", b64(&forged_png(0, 1)));
    let text_png = format!("data:image/png;base64,{}", b64(b"not an image at all"));
    let recursive = json!({"type": "object", "properties": {"a": {"$ref": "#"}}});
    let mut deep_schema = json!({"type": "string"});
    for _ in 0..100 {
        deep_schema = json!({"type": "object", "properties": {"a": deep_schema}});
    }
    let tool = |parameters: Value| {
        json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": "required"})
    };
    // (label, endpoint, body, the field the refusal must name, whether a 200 is right)
    let cases: Vec<(&str, &str, Value, &str, bool)> = vec![
        (
            "no messages",
            "/v1/chat/completions",
            chat(json!({"messages": []})),
            "messages",
            false,
        ),
        (
            "an empty message",
            "/v1/chat/completions",
            chat(json!({"messages": [{}]})),
            "role",
            false,
        ),
        (
            "a message without content",
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user"}]})),
            "messages",
            true,
        ),
        (
            "an unknown role",
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "wizard", "content": "x"}]})),
            "role",
            false,
        ),
        (
            "a role that is a number",
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": 1, "content": "x"}]})),
            "role",
            false,
        ),
        (
            "content parts of an unknown type",
            "/v1/chat/completions",
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]}),
            ),
            "content",
            false,
        ),
        (
            "content parts nested in parts",
            "/v1/chat/completions",
            chat(
                json!({"messages": [{"role": "user", "content": [[{"type": "text", "text": "x"}]]}]}),
            ),
            "content",
            false,
        ),
        (
            "20000 messages",
            "/v1/chat/completions",
            chat(json!({"messages": vec![json!({"role": "user", "content": "hi"}); 20000]})),
            "",
            false,
        ),
        (
            "a tool call without a function",
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "1"}]}]})),
            "function",
            false,
        ),
        (
            "tool-call arguments that are not JSON",
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                    "function": {"name": "f", "arguments": "{not json"}}]}]})),
            "arguments",
            false,
        ),
        (
            "tool parameters that are a string",
            "/v1/chat/completions",
            chat(tool(json!("an object please"))),
            "parameters",
            false,
        ),
        (
            "tool parameters that are an array",
            "/v1/chat/completions",
            chat(tool(json!([1, 2]))),
            "parameters",
            false,
        ),
        (
            "a recursive tool schema",
            "/v1/chat/completions",
            chat(tool(recursive.clone())),
            "",
            true,
        ),
        (
            "a tool schema 100 objects deep",
            "/v1/chat/completions",
            chat(tool(deep_schema.clone())),
            "",
            true,
        ),
        (
            "a tool without a name",
            "/v1/chat/completions",
            chat(json!({"tools": [{"type": "function", "function": {}}]})),
            "name",
            false,
        ),
        (
            "20000 tools",
            "/v1/chat/completions",
            chat(
                json!({"tools": (0..20000).map(|i| json!({"type": "function",
                "function": {"name": format!("f{i}")}})).collect::<Vec<_>>()}),
            ),
            "",
            true,
        ),
        (
            "20000 stop strings",
            "/v1/chat/completions",
            chat(json!({"stop": vec!["x"; 20000]})),
            "stop",
            false,
        ),
        (
            "an empty stop string",
            "/v1/chat/completions",
            chat(json!({"stop": [""]})),
            "stop",
            false,
        ),
        (
            "a logit bias for a token beyond the vocabulary",
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"99999999": 5}})),
            "logit_bias",
            false,
        ),
        (
            "a logit bias keyed by a word",
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"hello": 5}})),
            "logit_bias",
            false,
        ),
        (
            "a logit bias of 1e300",
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"5": 1e300}})),
            "logit_bias",
            false,
        ),
        (
            "a stop token beyond the vocabulary",
            "/v1/chat/completions",
            chat(json!({"stop_token_ids": [4000000000u32]})),
            "stop_token_ids",
            false,
        ),
        (
            "top_logprobs 1000000",
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 1000000})),
            "top_logprobs",
            false,
        ),
        (
            "n 1000000",
            "/v1/chat/completions",
            chat(json!({"n": 1000000})),
            "n",
            false,
        ),
        (
            "max_tokens 2^40",
            "/v1/chat/completions",
            chat(json!({"max_tokens": 1u64 << 40})),
            "max_tokens",
            true,
        ),
        (
            "an image that is text",
            "/v1/chat/completions",
            chat(image_part(text_png)),
            "image_url",
            false,
        ),
        (
            "an image claiming 2^20 x 2^20",
            "/v1/chat/completions",
            chat(image_part(huge_png.clone())),
            "image_url",
            false,
        ),
        (
            "an image claiming 0 x 1",
            "/v1/chat/completions",
            chat(image_part(zero_png)),
            "image_url",
            false,
        ),
        (
            "an image of bad base64",
            "/v1/chat/completions",
            chat(image_part("data:image/png;base64,!!!not base64!!!".into())),
            "image_url",
            false,
        ),
        (
            "a data URL without a comma",
            "/v1/chat/completions",
            chat(image_part("data:image/png;base64".into())),
            "image_url",
            false,
        ),
        (
            "an http image URL",
            "/v1/chat/completions",
            chat(image_part("http://127.0.0.1:9/x.png".into())),
            "image_url",
            false,
        ),
        (
            "an image URL that is a number",
            "/v1/chat/completions",
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]}),
            ),
            "url",
            false,
        ),
        (
            "an Ollama image that is not base64",
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "stream": false, "images": ["@@@@"]}),
            "images",
            false,
        ),
        (
            "an Ollama image claiming 2^20 x 2^20",
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "stream": false,
                "images": [b64(&forged_png(1 << 20, 1 << 20))]}),
            "images",
            false,
        ),
        (
            "an Anthropic image of bad base64",
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}]}]}),
            "source",
            false,
        ),
        (
            "an Anthropic message of an unknown role",
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}),
            "role",
            false,
        ),
        (
            "Anthropic content blocks of an unknown type",
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
            "type",
            false,
        ),
        (
            "a Responses input item of an unknown type",
            "/v1/responses",
            json!({"model": "m", "input": [{"type": "hologram"}]}),
            "input",
            false,
        ),
        (
            "an Ollama message of an unknown role",
            "/api/chat",
            json!({"model": "m", "stream": false, "messages": [{"role": "wizard", "content": "x"}]}),
            "role",
            false,
        ),
        (
            "enable_thinking given as the string \"false\"",
            "/v1/chat/completions",
            chat(json!({"chat_template_kwargs": {"enable_thinking": "false"}})),
            "enable_thinking",
            false,
        ),
        (
            "a Responses message of an unknown role",
            "/v1/responses",
            json!({"model": "m", "input": [{"role": "wizard", "content": "x"}]}),
            "input[0].role",
            false,
        ),
        (
            "an Anthropic output_config that is a string",
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
                "output_config": "high"}),
            "output_config",
            false,
        ),
        (
            "Ollama options that are a list",
            "/api/generate",
            json!({"model": "m", "prompt": "hi", "stream": false, "options": [1, 2]}),
            "options",
            false,
        ),
        (
            "an Anthropic tool schema that is a string",
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "f", "input_schema": "object"}]}),
            "input_schema",
            false,
        ),
        (
            "a Responses tool schema that is a list",
            "/v1/responses",
            json!({"model": "m", "input": "x",
                "tools": [{"type": "function", "name": "f", "parameters": [1]}]}),
            "parameters",
            false,
        ),
        (
            "an Ollama tool schema that is a number",
            "/api/chat",
            json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}),
            "parameters",
            false,
        ),
        (
            "detokenizing a token beyond the vocabulary",
            "/detokenize",
            json!({"tokens": [4000000000u32]}),
            "tokens",
            false,
        ),
    ];
    let mut failures = Vec::new();
    let mut total = cases.len();
    for (label, path, body, field, may_succeed) in cases {
        let answer = send(&server, path, body.to_string()).await;
        failures.extend(judge(label, answer, &[field], may_succeed));
    }
    // Bodies that are not a JSON object at all: refused with a message (there is no field).
    for endpoint in endpoints() {
        for body in [
            "5",
            "[]",
            "\"x\"",
            "null",
            "",
            "{",
            "{\"messages\": [",
            "\u{0}",
        ] {
            total += 1;
            let label = format!("{} with the body {body:?}", endpoint.path);
            let answer = send(&server, endpoint.path, body.to_owned()).await;
            failures.extend(judge(&label, answer, &["request body"], false));
        }
    }
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
