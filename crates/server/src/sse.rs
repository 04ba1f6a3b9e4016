//! Server-sent events: a generation's events turned into `data: {json}` chunks by an
//! endpoint's [`ChunkFormatter`], ending with `data: [DONE]`. A failure midway is sent as an
//! `{"error": ...}` chunk before `[DONE]`, so a stream never hangs.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use spindle_runtime::{Completion, TokenLogprob};

use crate::error::ApiError;
use crate::worker::{GenEvent, Generation};

/// Turns one endpoint's generation events into JSON chunks. A formatter of one choice
/// implements `start`, `text` and `finish`; one that serves `n` choices (and
/// log-probabilities) implements the `choice_*` methods and `end` as well.
pub trait ChunkFormatter: Send + 'static {
    /// Chunks sent before any text (the chat role chunk).
    fn start(&mut self) -> Vec<String>;
    /// Chunks for a text delta (possibly none: text held back by a parser).
    fn text(&mut self, delta: &str) -> Vec<String>;
    /// The last chunks: held text, the finish reason, usage.
    fn finish(&mut self, completion: &Completion) -> Vec<String>;
    /// Chunks for choice `index`'s text delta, with the log-probabilities of the tokens
    /// behind it (empty unless asked for).
    fn choice_text(
        &mut self,
        index: usize,
        delta: &str,
        logprobs: Vec<TokenLogprob>,
    ) -> Vec<String> {
        let _ = (index, logprobs);
        self.text(delta)
    }
    /// Choice `index`'s last chunks.
    fn choice_finish(&mut self, index: usize, completion: &Completion) -> Vec<String> {
        let _ = index;
        self.finish(completion)
    }
    /// Chunks after every choice finished (the usage of them all).
    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }
}

struct StreamState<F> {
    events: Generation,
    formatter: F,
    ready: VecDeque<String>,
    ended: bool,
    /// Log-probabilities received for each choice's next text.
    logprobs: Vec<Vec<TokenLogprob>>,
    /// Choices not finished yet.
    running: usize,
}

fn frame(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// The streaming response for a generation's `events`.
pub fn sse_response<F: ChunkFormatter>(events: Generation, mut formatter: F) -> Response {
    let ready = formatter.start().into();
    let choices = events.choices();
    let state = StreamState {
        events,
        formatter,
        ready,
        ended: false,
        logprobs: vec![Vec::new(); choices],
        running: choices,
    };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            if let Some(chunk) = s.ready.pop_front() {
                return Some((Ok::<_, Infallible>(frame(&chunk)), s));
            }
            if s.ended {
                return None;
            }
            match s.events.recv_choice().await {
                Some((i, GenEvent::Text(delta))) => {
                    let logprobs = std::mem::take(&mut s.logprobs[i]);
                    s.ready.extend(s.formatter.choice_text(i, &delta, logprobs));
                }
                Some((i, GenEvent::Logprobs(logprobs))) => s.logprobs[i].extend(logprobs),
                Some((i, GenEvent::Done(Ok(completion)))) => {
                    s.ready.extend(s.formatter.choice_finish(i, &completion));
                    s.running -= 1;
                    if s.running == 0 {
                        s.ready.extend(s.formatter.end());
                        s.ready.push_back("[DONE]".into());
                        s.ended = true;
                    }
                }
                Some((_, GenEvent::Done(Err(e)))) => {
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
