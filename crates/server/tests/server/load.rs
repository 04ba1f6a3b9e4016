//! Under load: a bounded queue (429 beyond it), answers never mixed between concurrent
//! requests, and a client that disconnects mid-stream cancels its generation.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{chat, metric, TestServer};

const PROMPTS: [&str; 4] = [
    "Tell me about rivers.",
    "What is a prime number?",
    "Write a haiku about rain.",
    "Explain gravity to a child.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_get_their_own_answer_or_429() {
    let server = TestServer::start(|c| {
        c.parallel = 2;
        c.queue = 4;
    })
    .await;
    // What each prompt yields alone.
    let mut alone = BTreeMap::new();
    for prompt in PROMPTS {
        let (status, body) = server.post("/v1/chat/completions", &chat(prompt, 64)).await;
        assert_eq!(status, 200, "{body}");
        alone.insert(prompt, body["choices"][0]["message"]["content"].clone());
    }
    let server = std::sync::Arc::new(server);
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let server = std::sync::Arc::clone(&server);
            let prompt = PROMPTS[i % PROMPTS.len()];
            tokio::spawn(async move {
                let mut request = chat(prompt, 64);
                if i % 2 == 1 {
                    request["stream"] = json!(true);
                    let (status, events) =
                        server.post_stream("/v1/chat/completions", &request).await;
                    if status != 200 {
                        return (prompt, status, Value::Null);
                    }
                    assert_eq!(events.last().unwrap(), "[DONE]");
                    let text: String = events[..events.len() - 1]
                        .iter()
                        .map(|e| serde_json::from_str::<Value>(e).unwrap())
                        .filter_map(|c| {
                            c["choices"][0]["delta"]["content"]
                                .as_str()
                                .map(str::to_owned)
                        })
                        .collect();
                    (prompt, status, Value::String(text))
                } else {
                    let (status, body) = server.post("/v1/chat/completions", &request).await;
                    if status == 429 {
                        assert_eq!(body["error"]["code"], "queue_full", "{body}");
                        assert_eq!(body["error"]["type"], "rate_limit_error");
                    }
                    (
                        prompt,
                        status,
                        body["choices"][0]["message"]["content"].clone(),
                    )
                }
            })
        })
        .collect();
    let all = async {
        let mut results = Vec::new();
        for client in clients {
            results.push(client.await);
        }
        results
    };
    let results = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("32 clients finish within 60 s");
    let (mut ok, mut busy) = (0, 0);
    for result in results {
        let (prompt, status, content) = result.expect("client task");
        match status {
            200 => {
                ok += 1;
                assert_eq!(
                    content, alone[prompt],
                    "answer for {prompt:?} differs from its answer alone"
                );
            }
            429 => busy += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok + busy, 32);
    assert!(
        ok >= 6,
        "at least the slots and the queue are served ({ok} were)"
    );
    assert!(
        busy > 0,
        "32 clients at once over 2 slots + 4 places must see some 429s"
    );
    let metrics = server.metrics().await;
    assert_eq!(metric(&metrics, "spindle_active_sessions"), 0.0);
    assert_eq!(metric(&metrics, "spindle_queue_depth"), 0.0);
    let health = server
        .client
        .get(server.url("/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

/// A streamed completion that cannot end early: a large negative presence penalty makes the
/// prompt's tokens win every step, so no end-of-turn token is ever chosen.
fn endless_stream() -> Value {
    json!({"prompt": "Once upon a time", "max_tokens": 8000, "temperature": 0,
           "presence_penalty": -100, "stream": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_stream_cancels_its_generation_and_frees_the_slot() {
    let server = TestServer::start(|c| {
        c.parallel = 1;
        c.queue = 0;
    })
    .await;
    let long =
        json!({"prompt": "Once upon a time", "max_tokens": 8000, "temperature": 0, "stream": true});
    let mut response = server
        .client
        .post(server.url("/v1/completions"))
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: {"));
    // The one slot is taken and nothing may wait: another request is refused.
    let (status, body) = server.post("/v1/chat/completions", &chat("hi", 2)).await;
    assert_eq!(status, 429, "{body}");
    drop(response);
    let mut freed = false;
    for _ in 0..200 {
        let metrics = server.metrics().await;
        if metric(&metrics, "spindle_cancelled_generations_total") == 1.0
            && metric(&metrics, "spindle_active_sessions") == 0.0
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        freed,
        "the generation was not cancelled: {}",
        server.metrics().await
    );
    let (status, body) = server.post("/v1/chat/completions", &chat("hi", 2)).await;
    assert_eq!(status, 200, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_in_flight_streams_after_the_grace_period() {
    let server = TestServer::start(|c| c.shutdown_grace = Duration::ZERO).await;
    let mut response = server
        .client
        .post(server.url("/v1/completions"))
        .json(&endless_stream())
        .send()
        .await
        .unwrap();
    let first = response.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: {"));
    let reading = tokio::spawn(async move { response.text().await.unwrap() });
    server.stop().await;
    let rest = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the stream ends after shutdown")
        .unwrap();
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
    assert!(rest.contains("\"finish_reason\":\"abort\""), "{rest}");
}
