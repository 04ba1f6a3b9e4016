//! The server under hostile clients: admission before work, timeouts, a connection limit,
//! every refusal as an OpenAI error object, `Host` and `Content-Type` checks, shutdown.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{closed_within, read_answer, user, TestServer};

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.addr()).await.unwrap()
}

/// With `--queue 2`, 24 concurrent requests far larger than the context get 429 at once: only
/// the 3 admitted ones are read and tokenized (one at a time, in the generation slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_concurrent_requests_get_429_before_tokenizing() {
    let server = std::sync::Arc::new(
        TestServer::start(|c| {
            c.parallel = 1;
            c.queue = 2;
        })
        .await,
    );
    let body = bytes_body(&json!({"messages": user(&"a ".repeat(500_000)), "max_tokens": 1}));
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let (server, body) = (std::sync::Arc::clone(&server), body.clone());
            tokio::spawn(async move {
                let r = server
                    .client
                    .post(server.url("/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let retry_after = r.headers().get("retry-after").cloned();
                let status = r.status().as_u16();
                let answer: serde_json::Value = r.json().await.unwrap();
                (status, retry_after, answer)
            })
        })
        .collect();
    let (mut busy, mut too_long) = (0, 0);
    for client in clients {
        let (status, retry_after, answer) = client.await.unwrap();
        match status {
            429 => {
                busy += 1;
                assert_eq!(answer["error"]["code"], "queue_full", "{answer}");
                assert_eq!(retry_after.unwrap(), "1");
            }
            400 => {
                too_long += 1;
                assert_eq!(answer["error"]["code"], "context_length_exceeded");
            }
            other => panic!("unexpected {other}: {answer}"),
        }
    }
    assert_eq!(busy + too_long, 24);
    assert!(
        busy >= 21,
        "1 slot + 2 places: at least 21 of 24 must be refused, {busy} were"
    );
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

fn bytes_body(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_short_bodies_and_idle_connections_are_closed() {
    let server = TestServer::start(|c| {
        c.header_timeout = Duration::from_secs(1);
        c.body_timeout = Duration::from_secs(1);
    })
    .await;
    // One header byte every 100 ms: closed after about a second, not kept.
    let mut slow = connect(&server).await;
    let started = Instant::now();
    let trickle = async {
        for byte in b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if slow.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(4), trickle)
        .await
        .expect("the slow sender is cut off within 4 s");
    closed_within(&mut slow, Duration::from_secs(1)).await;
    assert!(started.elapsed() < Duration::from_secs(4));

    // A body shorter than its Content-Length: 408 with an error object, then closed.
    let mut short = connect(&server).await;
    short
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
        )
        .await
        .unwrap();
    let answer = read_answer(&mut short, Duration::from_secs(4)).await;
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], "request_timeout");
    assert!(answer.head.contains("connection: close"), "{answer:?}");
    closed_within(&mut short, Duration::from_secs(2)).await;

    // An idle keep-alive connection after an answer: closed after the header timeout.
    let mut idle = connect(&server).await;
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_answer(&mut idle, Duration::from_secs(2)).await.status,
        200
    );
    let started = Instant::now();
    closed_within(&mut idle, Duration::from_secs(4)).await;
    assert!(started.elapsed() >= Duration::from_millis(500));
    server.stop().await;
}

/// A request head that stalls midway gets 408 with an error object, then the connection
/// closes; a connection that sent nothing is closed without an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_gets_408_and_a_silent_connection_is_just_closed() {
    let server = TestServer::start(|c| c.header_timeout = Duration::from_millis(500)).await;
    let mut stalled = connect(&server).await;
    let mut silent = connect(&server).await;
    let started = Instant::now();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Ty")
        .await
        .unwrap();
    let answer = read_answer(&mut stalled, Duration::from_secs(3)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{answer:?}"
    );
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(answer.head.contains("connection: close"), "{answer:?}");
    let error = &answer.json()["error"];
    assert_eq!(error["code"], "request_timeout", "{answer:?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("--header-timeout"),
        "{answer:?}"
    );
    closed_within(&mut stalled, Duration::from_secs(2)).await;

    let mut first = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut first))
        .await
        .expect("the silent connection is closed in time");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a connection that sent nothing gets no answer, only a close: {first:?}"
    );
    server.stop().await;
}

/// Raises this process's descriptor limit to hold `n` more (both ends of each loopback
/// connection live here).
fn room_for_descriptors(n: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        let want = (limit.rlim_cur).max(n).min(limit.rlim_max);
        limit.rlim_cur = want;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    assert!(
        limit.rlim_cur >= n,
        "the hard descriptor limit {} is below the {n} this test needs",
        limit.rlim_max
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_within_a_second_with_1000_idle_connections_open() {
    room_for_descriptors(4096);
    let server = TestServer::start(|_| {}).await;
    let mut idle = Vec::with_capacity(1000);
    for i in 0..1000 {
        let mut stream = connect(&server).await;
        if i % 2 == 0 {
            // Half have sent a partial request head, half nothing at all.
            stream.write_all(b"GET /health HT").await.unwrap();
        }
        idle.push(stream);
    }
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let health = tokio::time::timeout(
            Duration::from_secs(1),
            client.get(server.url("/health")).send(),
        )
        .await
        .expect("/health answers within 1 s")
        .unwrap();
        assert_eq!(health.status(), 200);
        eprintln!(
            "/health with 1000 idle connections: {:?}",
            started.elapsed()
        );
    }
    drop(idle);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparsable_requests_get_error_objects() {
    let server = TestServer::start(|_| {}).await;
    let long_target = format!(
        "GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(20_000)
    );
    let huge_header = format!(
        "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
        "b".repeat(100_000)
    );
    let cases: [(&[u8], u16); 5] = [
        (b"GARBAGE\r\n\r\n", 400),
        (
            b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
            400,
        ),
        (b"GET /\x01 HTTP/1.1\r\n\r\n", 400),
        (long_target.as_bytes(), 414),
        (huge_header.as_bytes(), 431),
    ];
    for (request, status) in cases {
        let mut stream = connect(&server).await;
        // The server may answer and close before reading all of a huge head.
        let _ = stream.write_all(request).await;
        let answer = read_answer(&mut stream, Duration::from_secs(5)).await;
        assert_eq!(answer.status, status, "{answer:?}");
        let error = &answer.json()["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer:?}"
        );
        assert!(
            error["type"].is_string() && error.get("code").is_some(),
            "{answer:?}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_and_content_type_are_checked() {
    let server = TestServer::start(|_| {}).await;
    let port = server.addr().rsplit_once(':').unwrap().1.to_owned();
    for (host, status) in [
        ("evil.example".to_owned(), 403),
        (format!("evil.example:{port}"), 403),
        (format!("localhost:{port}"), 200),
        ("127.0.0.1".to_owned(), 200),
        (format!("[::1]:{port}"), 200),
    ] {
        let r = server
            .client
            .get(server.url("/v1/models"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "Host {host}");
        if status == 403 {
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
        }
    }
    let request = serde_json::to_vec(&crate::common::chat("hi", 2)).unwrap();
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut post = server
            .client
            .post(server.url("/v1/chat/completions"))
            .body(request.clone());
        if let Some(t) = content_type {
            post = post.header("content-type", t);
        }
        let r = post.send().await.unwrap();
        assert_eq!(r.status(), 415, "{content_type:?}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    let r = server
        .client
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json; charset=utf-8")
        .body(request)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    server.stop().await;
    // With an API key the key is the guard: any Host is answered.
    let keyed = TestServer::start(|c| c.api_key = Some("k".into())).await;
    let r = keyed
        .client
        .get(keyed.url("/v1/models"))
        .header("host", "proxy.example")
        .bearer_auth("k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    keyed.stop().await;
}

/// SIGTERM: an idle keep-alive connection is closed; a connection opened before the signal
/// whose request arrives after it gets the 503 error object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_and_answers_late_requests_503() {
    let mut server = TestServer::start(|_| {}).await;
    let mut idle = connect(&server).await;
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        read_answer(&mut idle, Duration::from_secs(2)).await.status,
        200
    );
    let body = serde_json::to_vec(&crate::common::chat("hi", 2)).unwrap();
    let mut late = connect(&server).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (before, after) = head.split_at(20);
    late.write_all(before.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.begin_stop();
    closed_within(&mut idle, Duration::from_secs(2)).await;
    late.write_all(after.as_bytes()).await.unwrap();
    late.write_all(&body).await.unwrap();
    let answer = read_answer(&mut late, Duration::from_secs(5)).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.json()["error"]["code"], "shutting_down");
    assert!(
        TcpStream::connect(server.addr()).await.is_err() || {
            // The listener may still be closing; a new connection is never answered.
            tokio::time::sleep(Duration::from_millis(200)).await;
            TcpStream::connect(server.addr()).await.is_err()
        }
    );
    server.stop().await;
}
