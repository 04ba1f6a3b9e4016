//! Continuous batching through the server: concurrent streamed requests (greedy and seeded
//! sampling) give the texts they give one at a time, and the batch metrics count steps that
//! carried several sequences.

#[path = "server/common.rs"]
#[allow(dead_code)]
mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{chat, metric, sse_payloads, TestServer};

fn requests() -> Vec<Value> {
    let mut all = vec![
        chat("Tell me about rivers.", 48),
        chat(
            "What is a prime number? Answer at length, please, with examples.",
            20,
        ),
        chat("Hi", 5),
        json!({"model": "m", "messages": [{"role": "user", "content": "Write a poem."}],
               "temperature": 0.9, "top_p": 0.9, "seed": 5, "max_tokens": 40}),
        json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}),
    ];
    for r in &mut all {
        r["stream"] = json!(true);
    }
    all
}

fn path(request: &Value) -> &'static str {
    if request.get("prompt").is_some() {
        "/v1/completions"
    } else {
        "/v1/chat/completions"
    }
}

/// The streamed text of an SSE answer (chat content or completion text).
fn streamed_text(events: &[String]) -> String {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            let choice = &c["choices"][0];
            choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_give_the_texts_they_give_one_at_a_time() {
    let server = std::sync::Arc::new(
        TestServer::start(|c| {
            c.parallel = 8;
            c.queue = 8;
            c.token_budget = 16;
        })
        .await,
    );
    let mut alone = Vec::new();
    for request in requests() {
        let (status, events) = server.post_stream(path(&request), &request).await;
        assert_eq!(status, 200, "{events:?}");
        alone.push(streamed_text(&events));
    }
    // A stream that runs until dropped: every request below shares steps with it.
    let endless = json!({"prompt": "Once upon a time", "max_tokens": 8000, "temperature": 0,
                         "presence_penalty": -100, "stream": true});
    let mut held = server
        .client
        .post(server.url("/v1/completions"))
        .json(&endless)
        .send()
        .await
        .unwrap();
    assert!(held.chunk().await.unwrap().is_some());
    let clients: Vec<_> = requests()
        .into_iter()
        .map(|request| {
            let server = std::sync::Arc::clone(&server);
            tokio::spawn(async move {
                let r = server
                    .client
                    .post(server.url(path(&request)))
                    .json(&request)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                streamed_text(&sse_payloads(&r.text().await.unwrap()))
            })
        })
        .collect();
    for (n, client) in clients.into_iter().enumerate() {
        assert_eq!(client.await.unwrap(), alone[n], "request {n}");
    }
    drop(held);
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = server.metrics().await;
        if metric(&metrics, "spindle_running_sequences") == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(&metrics, "spindle_running_sequences"),
        0.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "spindle_waiting_sequences"), 0.0);
    assert_eq!(metric(&metrics, "spindle_state_bytes"), 0.0);
    // Some step carried more than one sequence.
    let sum = metric(&metrics, "spindle_batch_size_sum");
    let count = metric(&metrics, "spindle_batch_size_count");
    assert!(count > 0.0 && sum > count, "{metrics}");
    assert!(metric(&metrics, "spindle_time_to_first_token_seconds_count") >= 11.0);
    assert!(metric(&metrics, "spindle_inter_token_latency_seconds_count") > 0.0);
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}
