//! Server-sent events: a generation's events turned into `data: {json}` chunks by an
//! endpoint's [`ChunkFormatter`], ending with `data: [DONE]`. A failure midway is sent as an
//! `{"error": ...}` chunk before `[DONE]`, so a stream never hangs.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use spindle_runtime::Completion;

use crate::error::ApiError;
use crate::worker::{GenEvent, Generation};

/// Turns one endpoint's generation events into JSON chunks.
pub trait ChunkFormatter: Send + 'static {
    /// Chunks sent before any text (the chat role chunk).
    fn start(&mut self) -> Vec<String>;
    /// Chunks for a text delta (possibly none: text held back by a parser).
    fn text(&mut self, delta: &str) -> Vec<String>;
    /// The last chunks: held text, the finish reason, usage.
    fn finish(&mut self, completion: &Completion) -> Vec<String>;
}

struct StreamState<F> {
    events: Generation,
    formatter: F,
    ready: VecDeque<String>,
    ended: bool,
}

fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// The streaming response for a generation's `events`.
pub fn sse_response<F: ChunkFormatter>(events: Generation, mut formatter: F) -> Response {
    let ready = formatter.start().into();
    let state = StreamState {
        events,
        formatter,
        ready,
        ended: false,
    };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(chunk) = s.ready.pop_front() {
                return Some((Ok::<_, Infallible>(frame(&chunk)), s));
            }
            if s.ended {
                return None;
            }
            match s.events.recv().await {
                Some(GenEvent::Text(delta)) => s.ready.extend(s.formatter.text(&delta)),
                Some(GenEvent::Done(Ok(completion))) => {
                    s.ready.extend(s.formatter.finish(&completion));
                    s.ready.push_back("[DONE]".into());
                    s.ended = true;
                }
                Some(GenEvent::Done(Err(e))) => {
                    s.ready
                        .push_back(ApiError::internal(e.to_string()).body().to_string());
                    s.ready.push_back("[DONE]".into());
                    s.ended = true;
                }
                None => {
                    let e = ApiError::internal("generation ended without a result");
                    s.ready.push_back(e.body().to_string());
                    s.ready.push_back("[DONE]".into());
                    s.ended = true;
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
