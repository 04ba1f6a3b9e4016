//! Streamed answers: a generation's events turned into chunks by an endpoint's
//! [`ChunkFormatter`] and framed for the wire: server-sent `data: {json}` events ending with
//! `data: [DONE]` (OpenAI), named SSE events (Anthropic, Responses) or NDJSON lines (Ollama).
//! A failure midway is sent as an error chunk before the end, so a stream never hangs.

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
/// log-probabilities) implements the `choice_*` methods and `after_choices` as well.
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
    /// Chunks after every choice finished (the usage of them all), before [`ChunkFormatter::end`].
    fn after_choices(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// How chunks go on the wire (SSE `data:` events by default).
    fn framing(&self) -> Framing {
        Framing::SseData
    }
    /// The chunks after the last (`[DONE]` by default).
    fn end(&mut self) -> Vec<String> {
        vec!["[DONE]".into()]
    }
    /// The chunks that report a failure midway (the error body, then [`ChunkFormatter::end`]).
    fn failed(&mut self, error: &ApiError) -> Vec<String> {
        let mut chunks = vec![error.body().to_string()];
        chunks.extend(self.end());
        chunks
    }
}

/// How a stream's chunks are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `data: {chunk}` events (OpenAI).
    SseData,
    /// Chunks that are whole SSE events already (`event: name\ndata: {...}`: Anthropic,
    /// Responses).
    SseEvents,
    /// One JSON object a line (Ollama).
    Ndjson,
}

impl Framing {
    fn frame(self, chunk: &str) -> Bytes {
        Bytes::from(match self {
            Framing::SseData => format!("data: {chunk}\n\n"),
            Framing::SseEvents => format!("{chunk}\n\n"),
            Framing::Ndjson => format!("{chunk}\n"),
        })
    }

    fn content_type(self) -> &'static str {
        match self {
            Framing::SseData | Framing::SseEvents => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
        }
    }
}

/// A named SSE event (`event: name` and its `data:` line), for [`Framing::SseEvents`].
pub fn named_event(name: &str, data: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {data}")
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

/// The streaming response for a generation's `events`.
pub fn sse_response<F: ChunkFormatter>(events: Generation, mut formatter: F) -> Response {
    let framing = formatter.framing();
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
    let body = stream::unfold(state, move |mut s| async move {
        loop {
            if let Some(chunk) = s.ready.pop_front() {
                return Some((Ok::<_, Infallible>(framing.frame(&chunk)), s));
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
                        s.ready.extend(s.formatter.after_choices());
                        s.ready.extend(s.formatter.end());
                        s.ended = true;
                    }
                }
                Some((_, GenEvent::Done(Err(e)))) => {
                    let e = ApiError::internal(e.to_string());
                    s.ready.extend(s.formatter.failed(&e));
                    s.ended = true;
                }
                None => {
                    let e = ApiError::internal("generation ended without a result");
                    s.ready.extend(s.formatter.failed(&e));
                    s.ended = true;
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, framing.content_type()),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
