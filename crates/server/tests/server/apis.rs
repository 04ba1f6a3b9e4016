//! The other APIs clients speak: Anthropic's Messages, OpenAI's Responses, Ollama's, the
//! token endpoints, CORS and Anthropic's `x-api-key`. Answers are compared with the OpenAI
//! endpoints' and with themselves (streamed against whole), never with an expected text.

use serde_json::{json, Value};

use crate::common::{chat, user, TestServer};

/// Named SSE events (`event: name` / `data: {...}`) as (name, data).
fn named_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (name, data) = e
                .split_once('\n')
                .unwrap_or_else(|| panic!("not a named event: {e:?}"));
            let name = name.strip_prefix("event: ").expect("event line").to_owned();
            let data =
                serde_json::from_str(data.strip_prefix("data: ").expect("data line")).unwrap();
            (name, data)
        })
        .collect()
}

async fn post_text(
    server: &TestServer,
    path: &str,
    body: &Value,
) -> (u16, String, reqwest::header::HeaderMap) {
    let r = server
        .client
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, r.text().await.unwrap(), headers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_whole_and_streamed_agree_with_chat() {
    let server = TestServer::start(|_| {}).await;
    let body = json!({"model": "claude-x", "max_tokens": 16, "temperature": 0,
                      "system": "Be brief.", "messages": [{"role": "user", "content": "Hello!"}]});
    let (status, whole) = server.post("/v1/messages", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(
        (whole["type"].as_str(), whole["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"));
    let text: String = whole["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    // The same conversation through the OpenAI endpoint, thinking off as Anthropic's default.
    let openai = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
                        "max_tokens": 16, "temperature": 0,
                        "chat_template_kwargs": {"enable_thinking": false}});
    let (_, reference) = server.post("/v1/chat/completions", &openai).await;
    assert_eq!(
        text,
        reference["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
    );
    assert_eq!(
        whole["usage"]["input_tokens"],
        reference["usage"]["prompt_tokens"]
    );
    assert_eq!(
        whole["usage"]["output_tokens"],
        reference["usage"]["completion_tokens"]
    );
    let reason = whole["stop_reason"].as_str().unwrap();
    assert!(reason == "end_turn" || reason == "max_tokens", "{reason}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, raw, headers) = post_text(&server, "/v1/messages", &streamed).await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(headers["content-type"], "text/event-stream");
    let events = named_events(&raw);
    for (name, data) in &events {
        assert_eq!(name, data["type"].as_str().unwrap());
    }
    assert_eq!(events[0].0, "message_start");
    assert_eq!(events.last().unwrap().0, "message_stop");
    let deltas: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(deltas, text);
    let end = &events[events.len() - 2].1;
    assert_eq!(end["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(
        end["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );

    // count_tokens counts the prompt the answer was given; thinking on drops the empty
    // think block the Qwen3.6 template writes when it is off.
    let count = json!({"messages": body["messages"], "system": "Be brief."});
    let (status, counted) = server.post("/v1/messages/count_tokens", &count).await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["input_tokens"], whole["usage"]["input_tokens"]);
    let mut thinking = count.clone();
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let (_, with_thinking) = server.post("/v1/messages/count_tokens", &thinking).await;
    assert!(
        with_thinking["input_tokens"].as_u64() < counted["input_tokens"].as_u64(),
        "thinking on must reach the template's switch: {with_thinking} vs {counted}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_stop_sequences_and_errors_in_anthropic_shape() {
    let server = TestServer::start(|_| {}).await;
    let body = json!({"max_tokens": 30, "temperature": 0, "messages": user("Tell me a story.")});
    let (_, whole) = server.post("/v1/messages", &body).await;
    let text = whole["content"][0]["text"].as_str().unwrap().to_owned();
    let chars: Vec<char> = text.chars().collect();
    assert!(
        chars.len() > 8,
        "the demo model wrote too little to test stop_sequences: {text:?}"
    );
    let stop: String = chars[5..7].iter().collect();
    let mut stopped = body.clone();
    stopped["stop_sequences"] = json!([stop]);
    let (_, answer) = server.post("/v1/messages", &stopped).await;
    assert_eq!(answer["stop_reason"], "stop_sequence");
    assert_eq!(answer["stop_sequence"], json!(stop));
    assert_eq!(
        answer["content"][0]["text"],
        &text[..text.find(&stop).unwrap()]
    );

    let (status, error) = server
        .post("/v1/messages", &json!({"messages": user("hi")}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"),
        "{error}"
    );
    // A forced tool call comes back as a tool_use block of that tool, its input valid.
    // (A named tool: exactly one call, then the grammar allows only the end; `any` allows
    // several calls, which random weights may go on writing until max_tokens.)
    let forced = json!({"max_tokens": 64, "messages": user("hi"), "temperature": 0,
                        "tool_choice": {"type": "tool", "name": "f"},
                        "tools": [{"name": "f", "input_schema": {"type": "object",
                            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                            "required": ["n"]}}]});
    let (status, answer) = server.post("/v1/messages", &forced).await;
    assert_eq!(status, 200, "{answer}");
    let call = answer["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {answer}"));
    assert_eq!(call["name"], "f");
    let n = call["input"]["n"].as_i64().unwrap();
    assert!((0..=9).contains(&n), "{answer}");
    assert_eq!(answer["stop_reason"], "tool_use");
    let (status, error) = server.post("/v1/nothing", &json!({})).await;
    assert_eq!(
        (status, error["error"]["code"].as_str()),
        (404, Some("not_found")),
        "OpenAI shape elsewhere"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_api_key_is_accepted_and_refusals_read_in_each_dialect() {
    let server = TestServer::start(|c| c.api_key = Some("k-123".into())).await;
    let body = json!({"max_tokens": 2, "messages": user("hi")});
    let send = |path: &str, header: Option<(&str, &str)>| {
        let mut r = server.client.post(server.url(path)).json(&body);
        if let Some((name, value)) = header {
            r = r.header(name, value);
        }
        r.send()
    };
    let ok = send("/v1/messages", Some(("x-api-key", "k-123")))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let ok = send("/v1/messages", Some(("authorization", "Bearer k-123")))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let refused = send("/v1/messages", Some(("x-api-key", "wrong")))
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "authentication_error");
    let refused: Value = send("/api/chat", None).await.unwrap().json().await.unwrap();
    assert!(
        refused["error"].as_str().unwrap().contains("API key"),
        "{refused}"
    );
    let refused: Value = send("/v1/responses", None)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refused["error"]["code"], "invalid_api_key");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_whole_and_streamed_agree_and_state_is_refused() {
    let server = TestServer::start(|_| {}).await;
    let body = json!({"model": "m", "input": "Tell me about the sea.", "instructions": "Be brief.",
                      "max_output_tokens": 20, "temperature": 0});
    let (status, whole) = server.post("/v1/responses", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "response");
    assert!(whole["id"].as_str().unwrap().starts_with("resp_"));
    let message = whole["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "message")
        .unwrap();
    let text = message["content"][0]["text"].as_str().unwrap();
    let status_word = whole["status"].as_str().unwrap();
    assert!(
        status_word == "completed" || status_word == "incomplete",
        "{status_word}"
    );
    let usage = &whole["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, raw, _) = post_text(&server, "/v1/responses", &streamed).await;
    assert_eq!(status, 200, "{raw}");
    let events = named_events(&raw);
    assert_eq!(events[0].0, "response.created");
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let last = &events.last().unwrap().1;
    assert_eq!(last["response"]["status"], whole["status"]);
    assert_eq!(last["response"]["usage"], whole["usage"]);

    for (field, value) in [
        ("store", json!(true)),
        ("previous_response_id", json!("resp_1")),
        ("top_logprobs", json!(3)),
    ] {
        let mut refused = body.clone();
        refused[field] = value;
        let (status, error) = server.post("/v1/responses", &refused).await;
        assert_eq!(status, 400, "{field}");
        assert!(
            error["error"]["param"].as_str().unwrap().starts_with(field),
            "{error}"
        );
    }
    // `text.format` json_schema: the output text is JSON valid against it.
    let mut constrained = body.clone();
    constrained["max_output_tokens"] = json!(64);
    constrained["text"] = json!({"format": {"type": "json_schema", "name": "r", "schema":
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
         "required": ["n"], "additionalProperties": false}}});
    let (status, answer) = server.post("/v1/responses", &constrained).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "message")
        .map(|m| m["content"][0]["text"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no message: {answer}"));
    let value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"));
    assert!((1..=5).contains(&value["n"].as_i64().unwrap()), "{answer}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_chat_generate_and_model_listing() {
    let server = TestServer::start(|_| {}).await;
    let body = json!({"model": "spindle-demo", "messages": user("Hello!"), "think": false,
                      "options": {"temperature": 0, "num_predict": 12}});
    let (status, raw, headers) = post_text(&server, "/api/chat", &body).await;
    assert_eq!(status, 200, "{raw}");
    assert_eq!(
        headers["content-type"], "application/x-ndjson",
        "streams by default"
    );
    let lines: Vec<Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let streamed: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    let mut whole_request = body.clone();
    whole_request["stream"] = json!(false);
    let (status, whole) = server.post("/api/chat", &whole_request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["message"]["content"].as_str().unwrap(), streamed);
    assert_eq!(whole["eval_count"], last["eval_count"]);
    let (_, reference) = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Hello!"),
        "max_tokens": 12, "temperature": 0, "chat_template_kwargs": {"enable_thinking": false}}),
        )
        .await;
    assert_eq!(
        streamed,
        reference["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
    );
    assert_eq!(
        whole["prompt_eval_count"],
        reference["usage"]["prompt_tokens"]
    );
    assert!(whole["created_at"].as_str().unwrap().ends_with('Z'));

    let generate = json!({"prompt": "Once upon a time", "raw": true, "stream": false,
                          "options": {"temperature": 0, "num_predict": 10}});
    let (status, generated) = server.post("/api/generate", &generate).await;
    assert_eq!(status, 200, "{generated}");
    let (_, completion) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}),
        )
        .await;
    assert_eq!(generated["response"], completion["choices"][0]["text"]);
    assert_eq!(
        generated["done_reason"],
        if completion["choices"][0]["finish_reason"] == "length" {
            "length"
        } else {
            "stop"
        }
    );

    // `format` as a JSON schema: the answer is JSON valid against it.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    let (status, answer) = server
        .post(
            "/api/chat",
            &json!({"messages": user("hi"), "format": schema, "stream": false,
                    "options": {"num_predict": 64}}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let content: Value = serde_json::from_str(answer["message"]["content"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {answer}"));
    assert!(content["ok"].is_boolean(), "{answer}");

    let tags: Value = server
        .client
        .get(server.url("/api/tags"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tags["models"][0]["name"], "spindle-demo");
    assert!(tags["models"][0]["size"].as_u64().unwrap() > 0);
    let (status, show) = server
        .post("/api/show", &json!({"model": "spindle-demo"}))
        .await;
    assert_eq!(status, 200);
    assert!(show["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("tools")));
    let version: Value = server
        .client
        .get(server.url("/api/version"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(version["version"].is_string());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_endpoints_agree_with_generation() {
    let server = TestServer::start(|_| {}).await;
    let (status, tokens) = server
        .post("/tokenize", &json!({"content": "Once upon a time"}))
        .await;
    assert_eq!(status, 200, "{tokens}");
    let ids = tokens["tokens"].as_array().unwrap().clone();
    let (_, completion) = server
        .post("/v1/completions", &json!({"prompt": ids, "max_tokens": 1}))
        .await;
    let (_, by_text) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 1}),
        )
        .await;
    assert_eq!(
        completion["usage"]["prompt_tokens"],
        by_text["usage"]["prompt_tokens"]
    );
    let (_, text) = server.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(text["content"], "Once upon a time");
    let (_, pieces) = server
        .post(
            "/tokenize",
            &json!({"content": "Once upon", "with_pieces": true}),
        )
        .await;
    let joined: String = pieces["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["piece"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "Once upon");
    let (status, _) = server
        .post("/detokenize", &json!({"tokens": [u32::MAX]}))
        .await;
    assert_eq!(status, 400);

    // apply-template gives the prompt the chat endpoint prefills, and reasoning_effort and
    // enable_thinking reach the same switch.
    let off = json!({"messages": user("hi"), "chat_template_kwargs": {"enable_thinking": false}});
    let (status, rendered) = server.post("/apply-template", &off).await;
    assert_eq!(status, 200, "{rendered}");
    let prompt = rendered["prompt"].as_str().unwrap();
    assert!(
        prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{prompt:?}"
    );
    let (_, none) = server
        .post(
            "/apply-template",
            &json!({"messages": user("hi"), "reasoning_effort": "none"}),
        )
        .await;
    assert_eq!(none["prompt"], rendered["prompt"]);
    let (_, high) = server
        .post(
            "/apply-template",
            &json!({"messages": user("hi"), "reasoning_effort": "high"}),
        )
        .await;
    assert!(
        high["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n<think>\n"),
        "{high}"
    );
    let (_, counted) = server.post("/tokenize", &json!({"content": prompt})).await;
    let mut request = chat("hi", 1);
    request["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (_, answer) = server.post("/v1/chat/completions", &request).await;
    assert_eq!(
        counted["tokens"].as_array().unwrap().len() as u64,
        answer["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_answers_listed_origins() {
    let preflight = |server: &TestServer, origin: &str| {
        server
            .client
            .request(reqwest::Method::OPTIONS, server.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization",
            )
            .send()
    };
    let off = TestServer::start(|_| {}).await;
    let r = preflight(&off, "http://localhost:3000").await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    off.stop().await;

    let on = TestServer::start(|c| {
        c.cors_origins = vec!["http://localhost:3000".into()];
        c.api_key = Some("k".into());
    })
    .await;
    let r = preflight(&on, "http://localhost:3000").await.unwrap();
    assert_eq!(
        r.status(),
        204,
        "a preflight carries no key and is answered"
    );
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    assert_eq!(
        r.headers()["access-control-allow-headers"],
        "content-type, authorization"
    );
    assert!(r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    let r = preflight(&on, "http://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = on
        .client
        .get(on.url("/v1/models"))
        .header("origin", "http://localhost:3000")
        .header("authorization", "Bearer k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    on.stop().await;
}

/// Every field each endpoint accepts, set at once, is answered 200; a field no endpoint
/// implements is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_field_is_answered_and_unknown_ones_refused() {
    let server = TestServer::start(|_| {}).await;
    let tools_anthropic =
        json!([{"name": "f", "description": "d", "input_schema": {"type": "object"}}]);
    let tools_openai = json!([{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}]);
    let tools_ollama =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let cases = [
        (
            "/v1/messages",
            json!({
            "model": "m", "max_tokens": 4, "messages": user("hi"), "system": "s", "stop_sequences": ["zz"],
            "stream": false, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "tools": tools_anthropic,
            "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
            "service_tier": "auto", "output_config": {"effort": "low"}, "cache_control": {"type": "ephemeral"},
            "inference_geo": "us", "speed": "standard", "diagnostics": {"previous_message_id": null},
            "user_profile_id": "p", "workspace_id": "w"}),
        ),
        (
            "/v1/messages/count_tokens",
            json!({
            "model": "m", "messages": user("hi"), "system": "s", "tools": tools_anthropic,
            "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "output_config": {"effort": "low"}, "cache_control": {"type": "ephemeral"}}),
        ),
        (
            "/v1/responses",
            json!({
            "model": "m", "input": "hi", "instructions": "s", "max_output_tokens": 4, "temperature": 0.5,
            "top_p": 0.9, "stream": false, "tools": tools_openai, "tool_choice": "auto",
            "parallel_tool_calls": true, "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "text"}}, "store": false, "truncation": "disabled",
            "background": false, "metadata": {}, "user": "u", "safety_identifier": "s",
            "prompt_cache_key": "k", "service_tier": "auto", "include": [], "stream_options": {}}),
        ),
        (
            "/api/chat",
            json!({
            "model": "m", "messages": user("hi"), "tools": tools_ollama, "stream": false, "format": "",
            "think": true, "keep_alive": "5m", "options": {
                "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.01, "seed": 1, "num_predict": 4,
                "stop": ["zz"], "repeat_penalty": 1.1, "presence_penalty": 0.1, "frequency_penalty": 0.1,
                "num_ctx": 4096, "num_batch": 8, "num_gpu": 0, "main_gpu": 0, "num_thread": 2, "num_keep": 0,
                "use_mmap": true, "use_mlock": false, "numa": false, "low_vram": false, "vocab_only": false}}),
        ),
        (
            "/api/generate",
            json!({
            "model": "m", "prompt": "hi", "system": "s", "stream": false, "raw": false, "format": "",
            "think": "low", "keep_alive": 0, "options": {"num_predict": 4}}),
        ),
        (
            "/tokenize",
            json!({"content": "hi", "add_special": false, "parse_special": true, "with_pieces": false, "model": "m"}),
        ),
        ("/detokenize", json!({"tokens": [1, 2], "model": "m"})),
        (
            "/apply-template",
            json!({"messages": user("hi"), "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "auto", "chat_template_kwargs": {}, "reasoning_effort": "low", "model": "m"}),
        ),
    ];
    for (path, body) in &cases {
        let (status, answer) = server.post(path, body).await;
        assert_eq!(status, 200, "{path}: {answer}");
        let mut unknown = body.clone();
        unknown["grammar"] = json!("root ::= \"x\"");
        let (status, error) = server.post(path, &unknown).await;
        assert_eq!(
            status, 400,
            "{path} must refuse a field it does not implement"
        );
        let message = match &error["error"] {
            Value::String(s) => s.clone(),
            e => e["message"].as_str().unwrap().to_owned(),
        };
        assert!(message.contains("grammar"), "{path}: {error}");
    }
    server.stop().await;
}
