//! An in-process server on an ephemeral loopback port, over the embedded demo model.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use spindle_server::spindle_runtime::Model;
use spindle_server::{open_model, Server, ServerConfig};
use tokio::sync::oneshot;

static MODEL: OnceLock<(Arc<Model>, String)> = OnceLock::new();

pub fn demo() -> (Arc<Model>, String) {
    MODEL
        .get_or_init(|| {
            open_model(None, None, &Default::default()).expect("the embedded demo model opens")
        })
        .clone()
}

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(configure: impl FnOnce(&mut ServerConfig)) -> Self {
        let (model, id) = demo();
        Self::start_with(model, id, configure).await
    }

    /// A server over `model`, served as `id`.
    pub async fn start_with(
        model: Arc<Model>,
        id: String,
        configure: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let mut config = ServerConfig::new(id);
        configure(&mut config);
        let server = Server::new(model, config).expect("valid config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
                .expect("server runs");
        });
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .no_proxy()
            .build()
            .unwrap();
        TestServer {
            base,
            client,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path} answered {status} with non-JSON {text:?}: {e}"));
        (status, value)
    }

    /// Posts a streaming request; returns the status and every `data:` payload in order (the
    /// error body when the status is not 200).
    pub async fn post_stream(&self, path: &str, body: &Value) -> (u16, Vec<String>) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        if status != 200 {
            return (status, vec![text]);
        }
        (status, sse_payloads(&text))
    }

    pub async fn metrics(&self) -> String {
        let r = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// The server's `host:port`.
    pub fn addr(&self) -> &str {
        self.base.strip_prefix("http://").unwrap()
    }

    /// Signals the server to stop without waiting for it (as SIGTERM does).
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops the server and waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("the server shuts down within 20 s")
                .expect("the server task does not panic");
        }
    }
}

/// The `data:` payloads of an SSE body.
pub fn sse_payloads(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// The value of an unlabelled metric.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// A greedy chat request.
pub fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": "anything", "messages": user(text), "temperature": 0, "max_tokens": max_tokens})
}

/// A raw HTTP/1.1 answer: status, lower-cased head, body.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl RawAnswer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} answered with non-JSON {:?}: {e}",
                self.status, self.body
            )
        })
    }
}

/// Reads one answer from `stream` (its head, then `content-length` bytes of body), within
/// `within`.
pub async fn read_answer(stream: &mut tokio::net::TcpStream, within: Duration) -> RawAnswer {
    use tokio::io::AsyncReadExt;
    let reading = async {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |n| n.trim().parse::<usize>().unwrap());
                if bytes.len() >= end + 4 + length {
                    let body =
                        String::from_utf8_lossy(&bytes[end + 4..end + 4 + length]).into_owned();
                    let status = head[9..12].parse().unwrap();
                    return RawAnswer { status, head, body };
                }
            }
            let n = stream.read(&mut chunk).await.expect("reading the answer");
            assert!(
                n > 0,
                "the connection closed before a whole answer: {:?}",
                String::from_utf8_lossy(&bytes)
            );
            bytes.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(within, reading)
        .await
        .expect("an answer in time")
}

/// Waits until the server closes `stream` (a read returns end of file or a reset), ignoring
/// what it sends first; panics after `within`.
pub async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) {
    use tokio::io::AsyncReadExt;
    let waiting = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, waiting)
        .await
        .expect("the server closes the connection in time");
}
