//! Answers on the happy path: shapes, streaming, usage, stop strings, models, metrics.

use serde_json::{json, Value};

use crate::common::{chat, metric, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completion_has_openai_shape_and_usage() {
    let server = TestServer::start(|_| {}).await;
    let (status, body) = server
        .post("/v1/chat/completions", &chat("Hello!", 12))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["model"], "spindle-demo");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(reason == "length" || reason == "stop", "{reason}");
    let usage = &body["usage"];
    let completion_tokens = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=12).contains(&completion_tokens));
    if reason == "length" {
        assert_eq!(completion_tokens, 12);
    }
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 3);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion_tokens
    );
    let metrics = server.metrics().await;
    assert!(metric(&metrics, "spindle_generated_tokens_total") >= completion_tokens as f64);
    assert!(metrics
        .contains("spindle_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"));
    assert_eq!(metric(&metrics, "spindle_expert_cache_hit_rate"), 1.0);
    assert_eq!(metric(&metrics, "spindle_active_sessions"), 0.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_deltas_equal_the_whole_answer() {
    let server = TestServer::start(|_| {}).await;
    let request = chat("Tell me about the sea.", 40);
    let (_, whole) = server.post("/v1/chat/completions", &request).await;
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, events) = server.post_stream("/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut content = String::new();
    let mut reasons = Vec::new();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id);
        if let Some(choice) = chunk["choices"].get(0) {
            assert!(chunk["usage"].is_null(), "usage only on the last chunk");
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(r) = choice["finish_reason"].as_str() {
                reasons.push(r.to_owned());
            }
        }
    }
    assert_eq!(
        content,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        reasons,
        vec![whole["choices"][0]["finish_reason"].as_str().unwrap()]
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], whole["usage"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stop_at_a_stop_string() {
    let server = TestServer::start(|_| {}).await;
    let request = json!({"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0});
    let (status, whole) = server.post("/v1/completions", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_owned();
    let chars: Vec<char> = text.chars().collect();
    assert!(
        chars.len() > 8,
        "the demo model wrote too little to test stop strings: {text:?}"
    );
    let stop: String = chars[5..7].iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    let mut stopped = request.clone();
    stopped["stop"] = json!([stop, "never-generated-zzz"]);
    let (_, body) = server.post("/v1/completions", &stopped).await;
    assert_eq!(body["choices"][0]["text"], expected);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // Streaming: the same text in pieces, then [DONE].
    stopped["stream"] = json!(true);
    let (_, events) = server.post_stream("/v1/completions", &stopped).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let pieces: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pieces, expected);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_named_model() {
    let server = TestServer::start(|c| c.model_id = "my-model".into()).await;
    let models: Value = server
        .client
        .get(server.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "my-model");
    assert_eq!(models["data"][0]["object"], "model");
    let health = server
        .client
        .get(server.url("/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let one = server
        .client
        .get(server.url("/v1/models/my-model"))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let (status, body) = server.post("/v1/chat/completions", &chat("hi", 2)).await;
    assert_eq!((status, body["model"].as_str()), (200, Some("my-model")));
    server.stop().await;
}

/// `/metrics` times generating requests by API: the whole request
/// (`spindle_request_duration_seconds`) and its first generated text
/// (`spindle_api_time_to_first_token_seconds`), labelled `api="chat"`, `"completions"`, ...;
/// a streamed request is timed to its last event, and other endpoints are not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_histograms_are_labelled_by_api() {
    let server = TestServer::start(|_| {}).await;
    let (status, _) = server.post("/v1/chat/completions", &chat("Hi", 6)).await;
    assert_eq!(status, 200);
    let mut streamed = chat("Hello", 6);
    streamed["stream"] = json!(true);
    let (status, _) = server.post_stream("/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let (status, _) = server
        .post(
            "/v1/completions",
            &json!({"model": "m", "prompt": "Once", "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200);
    let metrics = server.metrics().await;
    let count = |name: &str, api: &str| metric(&metrics, &format!("{name}_count{{api=\"{api}\"}}"));
    assert_eq!(count("spindle_request_duration_seconds", "chat"), 2.0);
    assert_eq!(
        count("spindle_request_duration_seconds", "completions"),
        1.0
    );
    assert_eq!(count("spindle_request_duration_seconds", "messages"), 0.0);
    assert_eq!(count("spindle_request_duration_seconds", "ollama"), 0.0);
    assert_eq!(
        count("spindle_api_time_to_first_token_seconds", "chat"),
        2.0
    );
    assert_eq!(
        count("spindle_api_time_to_first_token_seconds", "completions"),
        1.0
    );
    let sum = |name: &str, api: &str| metric(&metrics, &format!("{name}_sum{{api=\"{api}\"}}"));
    // The first token comes before the end of the request.
    assert!(
        sum("spindle_api_time_to_first_token_seconds", "chat")
            <= sum("spindle_request_duration_seconds", "chat")
    );
    assert!(sum("spindle_request_duration_seconds", "chat") > 0.0);
    assert!(metrics
        .contains("spindle_request_duration_seconds_bucket{api=\"responses\",le=\"+Inf\"} 0"));
    server.stop().await;
}
