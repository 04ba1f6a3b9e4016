//! `spindle bench --serve URL`: a load generator for a running OpenAI-compatible server, in the
//! manner of `vllm bench serve`. For each client count C, C clients each send `--requests`
//! streamed chat requests one after another (a prompt of `--prompt-words` words of its own,
//! temperature 0, `--max-tokens`), all clients at once; reported per C: generated tokens/s
//! over all clients (usage's completion tokens over the wall time), time to first token and
//! inter-token latency (between streamed content chunks) p50/p99, and request latency.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{json, Value};

/// What to send.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `http://host:port` (a trailing `/v1` is accepted).
    pub url: String,
    pub clients: Vec<usize>,
    pub prompt_words: usize,
    pub max_tokens: usize,
    /// Requests each client sends, one after another.
    pub requests_per_client: usize,
    pub api_key: Option<String>,
    /// An image sent before each request's text, as a `data:` URL (`image_url` content part),
    /// so the time to first token includes the vision tower.
    pub image_url: Option<String>,
}

/// `path` as a `data:` URL for an `image_url` content part (PNG, JPEG, WebP or GIF, by the
/// file's extension).
pub fn image_data_url(path: &std::path::Path) -> Result<String> {
    use base64::Engine as _;
    let mime = match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("webp") => "image/webp",
        Some("gif") => "image/gif",
        _ => anyhow::bail!(
            "--image {}: the extension must be png, jpg, jpeg, webp or gif",
            path.display()
        ),
    };
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read --image {}", path.display()))?;
    Ok(format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}

/// The user message's content: the prompt's text, after the image when there is one.
fn user_content(text: String, image_url: Option<&str>) -> Value {
    match image_url {
        None => Value::String(text),
        Some(url) => json!([
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text},
        ]),
    }
}

/// One client count's results.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub requests: usize,
    pub failed: usize,
    pub completion_tokens: usize,
    pub wall_s: f64,
    /// Completion tokens over the wall time, all clients together.
    pub tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    pub latency_p50_s: f64,
    /// One stream's decode rate once its first token arrived (its later tokens over the time
    /// they took), median over the requests: the figure to set beside `spindle bench`'s decode.
    pub stream_decode_tok_s_p50: f64,
}

/// What one streamed request saw.
struct RequestTimes {
    first_chunk: Option<Duration>,
    gaps: Vec<Duration>,
    completion_tokens: usize,
    total: Duration,
}

/// Where to connect and what to put in `Host`.
#[derive(Clone, Debug)]
struct Target {
    addr: String,
}

impl Target {
    fn parse(url: &str) -> Result<Self> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("--serve {url:?}: expected an http:// URL such as http://127.0.0.1:8080 (https is not supported)");
        };
        let addr = rest.trim_end_matches('/').trim_end_matches("/v1");
        if addr.is_empty() || addr.contains('/') {
            bail!("--serve {url:?}: expected http://HOST:PORT, optionally followed by /v1");
        }
        let addr = if addr.contains(':') && !addr.ends_with(']') {
            addr.to_owned()
        } else {
            format!("{addr}:80")
        };
        Ok(Self { addr })
    }
}

const WORDS: [&str; 32] = [
    "river", "mountain", "light", "engine", "garden", "silver", "quiet", "window", "paper",
    "storm", "harbor", "candle", "forest", "signal", "winter", "bridge", "orange", "music",
    "stone", "market", "cloud", "letter", "thread", "valley", "mirror", "summer", "island",
    "station", "feather", "planet", "ladder", "morning",
];

/// `words` words of a prompt of its own for request `n` (a simple generator, so runs repeat).
fn prompt(n: usize, words: usize) -> String {
    let mut state = (n as u64)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut text = String::from("Continue this text: ");
    for _ in 0..words {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(WORDS[(state >> 59) as usize]);
        text.push(' ');
    }
    text
}

/// Runs every client count in turn (after one warm-up request) and returns their reports.
pub fn run(options: &LoadOptions) -> Result<Vec<LoadReport>> {
    let target = Target::parse(&options.url)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        one_request(&target, options, usize::MAX)
            .await
            .with_context(|| format!("the warm-up request to {} failed", options.url))?;
        let mut reports = Vec::new();
        for &clients in &options.clients {
            reports.push(measure(&target, options, clients.max(1)).await);
        }
        Ok(reports)
    })
}

async fn measure(target: &Target, options: &LoadOptions, clients: usize) -> LoadReport {
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (target, options) = (target.clone(), options.clone());
            tokio::spawn(async move {
                let mut results = Vec::new();
                for r in 0..options.requests_per_client {
                    let n = c * options.requests_per_client + r;
                    results.push(one_request(&target, &options, n).await);
                }
                results
            })
        })
        .collect();
    let mut times = Vec::new();
    let mut failed = 0;
    for task in tasks {
        match task.await {
            Ok(results) => {
                for result in results {
                    match result {
                        Ok(t) => times.push(t),
                        Err(e) => {
                            tracing::warn!("a request failed: {e:#}");
                            failed += 1;
                        }
                    }
                }
            }
            Err(_) => failed += options.requests_per_client,
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let completion_tokens = times.iter().map(|t| t.completion_tokens).sum();
    let ms = |d: &Duration| d.as_secs_f64() * 1e3;
    let ttft: Vec<f64> = times
        .iter()
        .filter_map(|t| t.first_chunk.as_ref().map(ms))
        .collect();
    let itl: Vec<f64> = times.iter().flat_map(|t| t.gaps.iter().map(ms)).collect();
    let latency: Vec<f64> = times.iter().map(|t| t.total.as_secs_f64()).collect();
    let stream_decode: Vec<f64> = times.iter().filter_map(stream_decode_rate).collect();
    LoadReport {
        clients,
        requests: times.len() + failed,
        failed,
        completion_tokens,
        wall_s,
        tokens_per_s: completion_tokens as f64 / wall_s.max(1e-9),
        ttft_p50_ms: percentile(&ttft, 50.0),
        ttft_p99_ms: percentile(&ttft, 99.0),
        itl_p50_ms: percentile(&itl, 50.0),
        itl_p99_ms: percentile(&itl, 99.0),
        latency_p50_s: percentile(&latency, 50.0),
        stream_decode_tok_s_p50: percentile(&stream_decode, 50.0),
    }
}

/// Tokens after the first over the time from the first token to the end of the stream; None
/// for a stream of fewer than two tokens.
fn stream_decode_rate(t: &RequestTimes) -> Option<f64> {
    let first = t.first_chunk?;
    let later = t.completion_tokens.checked_sub(1).filter(|&n| n > 0)?;
    let span = t.total.checked_sub(first)?.as_secs_f64();
    (span > 0.0).then(|| later as f64 / span)
}

/// The `p`th percentile (nearest rank) of `values`; NaN when empty.
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sends request `n` and times its stream: the first content chunk, the gaps between content
/// chunks, the usage's completion tokens.
async fn one_request(target: &Target, options: &LoadOptions, n: usize) -> Result<RequestTimes> {
    let body = json!({
        "model": "bench",
        "messages": [{
            "role": "user",
            "content": user_content(prompt(n, options.prompt_words), options.image_url.as_deref()),
        }],
        "max_tokens": options.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let stream = tokio::net::TcpStream::connect(&target.addr)
        .await
        .with_context(|| format!("cannot connect to {}", target.addr))?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    tokio::spawn(connection);
    let mut request = hyper::Request::post("/v1/chat/completions")
        .header(hyper::header::HOST, &target.addr)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(key) = &options.api_key {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::from(body.to_string())))?;
    let started = Instant::now();
    let response = sender
        .send_request(request)
        .await
        .context("sending the request")?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
    }
    let mut times = RequestTimes {
        first_chunk: None,
        gaps: Vec::new(),
        completion_tokens: 0,
        total: Duration::ZERO,
    };
    let mut last: Option<Instant> = None;
    let mut pending = String::new();
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading the stream")?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = Instant::now();
        pending.push_str(&String::from_utf8_lossy(data));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let Some(payload) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let chunk: Value = serde_json::from_str(payload)
                .with_context(|| format!("a stream chunk is not JSON: {payload:?}"))?;
            if let Some(error) = chunk.get("error") {
                bail!("the server reported an error mid-stream: {error}");
            }
            if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
                times.completion_tokens = tokens as usize;
            }
            let delta = &chunk["choices"][0]["delta"];
            let has_text = ["content", "reasoning_content"]
                .iter()
                .any(|k| delta[k].as_str().is_some_and(|s| !s.is_empty()));
            if has_text {
                match last {
                    None => times.first_chunk = Some(now - started),
                    Some(previous) => times.gaps.push(now - previous),
                }
                last = Some(now);
            }
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    times.total = started.elapsed();
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_decode_rate_counts_the_tokens_after_the_first() {
        let t = RequestTimes {
            first_chunk: Some(Duration::from_millis(100)),
            gaps: Vec::new(),
            completion_tokens: 11,
            total: Duration::from_millis(600),
        };
        assert!((stream_decode_rate(&t).unwrap() - 20.0).abs() < 1e-9);
        let single = RequestTimes {
            completion_tokens: 1,
            ..t
        };
        assert_eq!(stream_decode_rate(&single), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn urls_and_prompts() {
        assert_eq!(
            Target::parse("http://127.0.0.1:8080/v1").unwrap().addr,
            "127.0.0.1:8080"
        );
        assert_eq!(
            Target::parse("http://localhost/").unwrap().addr,
            "localhost:80"
        );
        assert!(Target::parse("https://x:1").is_err());
        assert_eq!(
            prompt(3, 200).split(' ').filter(|w| !w.is_empty()).count(),
            203
        );
        assert_ne!(prompt(1, 20), prompt(2, 20));
        assert_eq!(prompt(1, 20), prompt(1, 20));
    }

    #[test]
    fn an_image_goes_before_the_text_as_a_data_url() {
        assert_eq!(user_content("hi".into(), None), json!("hi"));
        let parts = user_content("hi".into(), Some("data:image/png;base64,AAAA"));
        assert_eq!(parts[0]["image_url"]["url"], "data:image/png;base64,AAAA");
        assert_eq!(parts[1], json!({"type": "text", "text": "hi"}));
        let dir = std::env::temp_dir().join(format!("spindle-loadgen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let png = dir.join("x.PNG");
        std::fs::write(&png, [1u8, 2, 3]).unwrap();
        assert_eq!(image_data_url(&png).unwrap(), "data:image/png;base64,AQID");
        let err = image_data_url(&dir.join("x.bmp")).unwrap_err().to_string();
        assert!(err.contains("x.bmp") && err.contains("extension"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
