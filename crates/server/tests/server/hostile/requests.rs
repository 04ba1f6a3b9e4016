//! Hand-made hostile requests: messages, tools, stops, logit biases, images, bodies.

use base64::Engine;
use serde_json::{json, Value};

use super::{endpoints, judge, send};
use crate::common::TestServer;

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
