//! Hostile requests on every endpoint: each field (top-level, Ollama's options and nested
//! ones) given the wrong type, a negative, zero, fractional or huge number, a "NaN" string,
//! deep nesting, an enormous array or string ([`fields`]); hand-made hostile messages, tools,
//! stops, images and bodies ([`requests`]). Each answer is a 4xx naming the field, or a 200
//! where the value is a valid one; never a 5xx, a dropped connection, a hang or a refusal that
//! quotes a huge value whole, and the server keeps serving afterwards.

mod fields;
mod requests;

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::TestServer;

/// Where a raw hostile value is spliced into a request (serialized JSON).
const SLOT: &str = "\"__hostile__\"";

/// Raw JSON texts wrong for almost any field, each with a label.
pub(super) fn hostile_values() -> Vec<(&'static str, String)> {
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

pub(super) struct Endpoint {
    pub(super) path: &'static str,
    /// A valid request: a short greedy answer.
    pub(super) base: Value,
    /// The top-level fields the endpoint reads.
    pub(super) fields: &'static [&'static str],
}

pub(super) fn endpoints() -> Vec<Endpoint> {
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

/// What a hostile request got.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: String,
}

pub(super) async fn send(server: &TestServer, path: &str, body: String) -> Result<Answer, String> {
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
pub(super) fn judge(
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
pub(super) fn splice(base: &Value, pointer: &str, raw: &str) -> String {
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
