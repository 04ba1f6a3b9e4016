//! Every malformed request gets an OpenAI-style error naming the field; keys and sizes are
//! enforced.

use serde_json::{json, Value};

use crate::common::{user, TestServer};

fn assert_error(status: u16, body: &Value, want_status: u16, want_param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    assert_eq!(error["param"].as_str(), want_param, "{body}");
    assert!(error.get("code").is_some(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field() {
    let server = TestServer::start(|_| {}).await;
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({}), Some("messages")),
        (json!({"messages": []}), Some("messages")),
        (json!({"messages": "hi"}), Some("messages")),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            Some("messages[0].content"),
        ),
        (
            json!({"messages": user("x"), "temperature": -0.5}),
            Some("temperature"),
        ),
        (
            json!({"messages": user("x"), "temperature": "warm"}),
            Some("temperature"),
        ),
        (json!({"messages": user("x"), "top_p": 0}), Some("top_p")),
        (
            json!({"messages": user("x"), "max_tokens": -1}),
            Some("max_tokens"),
        ),
        (
            json!({"messages": user("x"), "max_tokens": 0}),
            Some("max_tokens"),
        ),
        (json!({"messages": user("x"), "n": 99}), Some("n")),
        (
            json!({"messages": user("x"), "functions": [{"name": "f"}]}),
            Some("functions"),
        ),
        (
            json!({"messages": user("x"), "stop": {"a": 1}}),
            Some("stop"),
        ),
        (
            json!({"messages": user("x"), "stream": "yes"}),
            Some("stream"),
        ),
        (
            json!({"messages": user("x"), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            Some("tool_choice"),
        ),
        // The template's own refusal, with its message.
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}),
            Some("messages"),
        ),
    ];
    for (body, param) in cases {
        let (status, answer) = server.post("/v1/chat/completions", &body).await;
        assert_error(status, &answer, 400, param);
    }
    let (status, answer) = server
        .post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]}))
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        answer["error"]["message"],
        "System message must be at the beginning."
    );
    for (body, param) in [
        (json!({"prompt": 7}), Some("prompt")),
        (json!({"prompt": ""}), Some("prompt")),
        (json!({"prompt": [1, 2, 999999]}), Some("prompt")),
        (json!({"prompt": "x", "logprobs": 21}), Some("logprobs")),
        (json!({"prompt": "x", "suffix": "y"}), Some("suffix")),
    ] {
        let (status, answer) = server.post("/v1/completions", &body).await;
        assert_error(status, &answer, 400, param);
    }
    // Not JSON at all.
    let r = server
        .client
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 400, None);
    // The server is still fine.
    let (status, _) = server
        .post("/v1/chat/completions", &crate::common::chat("hi", 2))
        .await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_longer_than_the_context_is_refused() {
    let server = TestServer::start(|_| {}).await;
    let long = "lorem ipsum dolor ".repeat(4000);
    let (status, body) = server
        .post(
            "/v1/chat/completions",
            &json!({"messages": user(&long), "max_tokens": 1}),
        )
        .await;
    assert_error(status, &body, 400, Some("messages"));
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let (status, body) = server
        .post("/v1/completions", &json!({"prompt": long, "max_tokens": 1}))
        .await;
    assert_error(status, &body, 400, Some("prompt"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_required_except_for_health() {
    let server = TestServer::start(|c| c.api_key = Some("sekrit".into())).await;
    for path in ["/v1/models", "/metrics"] {
        let r = server.client.get(server.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        assert_error(status, &r.json().await.unwrap(), 401, None);
    }
    let r = server
        .client
        .post(server.url("/v1/chat/completions"))
        .bearer_auth("wrong")
        .json(&crate::common::chat("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let health = server
        .client
        .get(server.url("/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ok = server
        .client
        .get(server.url("/v1/models"))
        .bearer_auth("sekrit")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_and_unknown_paths_404() {
    let server = TestServer::start(|c| c.max_body_bytes = 1024).await;
    let big = json!({"messages": user(&"x".repeat(2000))});
    let (status, body) = server.post("/v1/chat/completions", &big).await;
    assert_error(status, &body, 413, None);
    // Without a Content-Length (chunked), the limit still holds.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(vec![b' '; 800]), Ok(vec![b' '; 800])];
    let r = server
        .client
        .post(server.url("/v1/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 413, None);
    let r = server
        .client
        .get(server.url("/v2/nothing"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 404, None);
    let r = server
        .client
        .get(server.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_error(status, &r.json().await.unwrap(), 405, None);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_messages_than_max_messages_are_refused() {
    let server = TestServer::start(|c| c.max_messages = 2).await;
    let three = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]});
    let (status, body) = server.post("/v1/chat/completions", &three).await;
    assert_error(status, &body, 400, Some("messages"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-messages"),
        "{body}"
    );
    server.stop().await;
}
