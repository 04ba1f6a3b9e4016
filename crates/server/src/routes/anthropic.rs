//! `POST /v1/messages` (Anthropic's Messages API, whole or streamed as Anthropic's named
//! events) and `POST /v1/messages/count_tokens`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use spindle_runtime::{Completion, Prompt};
use spindle_text::{parse_output, OutputParser, ParseEvent};

use super::{admit_and_read, check_message_count, prepare, start_generation};
use crate::api::anthropic::{content_blocks, parse, stop_reason, usage, MessagesRequest};
use crate::error::ApiError;
use crate::response::unique_id;
use crate::sse::{named_event, sse_response, ChunkFormatter, Framing};
use crate::state::AppState;
use crate::worker::wait_for_completion;

/// Reads and checks a Messages body (`count_only`: a count_tokens body); returns the request,
/// its place in the queue and the body's size.
async fn read_request(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    count_only: bool,
) -> Result<(MessagesRequest, crate::queue::Ticket, usize), ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(state, headers, body).await?;
    let count = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    check_message_count(state, count, "messages")?;
    let request = parse(&body, &state.model.defaults, count_only)?;
    Ok((request, ticket, body_bytes))
}

fn chat_prompt(request: &mut MessagesRequest) -> Prompt {
    Prompt::Chat {
        messages: request.messages.take(),
        tools: request.tools.take(),
        vars: std::mem::take(&mut request.vars),
        add_generation_prompt: true,
    }
}

pub async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (mut request, ticket, body_bytes) = read_request(&state, &headers, body, false).await?;
    let prompt = chat_prompt(&mut request);
    let images = std::mem::take(&mut request.images);
    let generation = request.generation;
    let started = start_generation(
        &state,
        ticket,
        prompt,
        images,
        body_bytes,
        "messages",
        &generation,
    )
    .await?;
    let id = unique_id("msg_");
    if generation.stream {
        let events = MessageEvents {
            id,
            model: state.model_id.clone(),
            prompt_tokens: started.prompt_tokens,
            parser: OutputParser::new(started.starts_in_reasoning),
            open: None,
            index: 0,
            tool_calls: 0,
        };
        return Ok(sse_response(started.events, events));
    }
    let completion = wait_for_completion(started.events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let parsed = parse_output(&completion.text, started.starts_in_reasoning);
    let (reason, sequence) = stop_reason(&completion.finish, !parsed.tool_calls.is_empty());
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": state.model_id,
        "content": content_blocks(&parsed),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(completion.prompt_tokens, completion.ids.len(), completion.cached_tokens),
    }))
    .into_response())
}

/// `{"input_tokens": n}`: the prompt's tokens as it would be prefilled (generation prompt
/// included, each image's pads expanded to its token count).
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (mut request, ticket, body_bytes) = read_request(&state, &headers, body, true).await?;
    let prompt = chat_prompt(&mut request);
    let images = std::mem::take(&mut request.images);
    let _slot = ticket.start().await;
    let prepared = prepare(&state, prompt, images, body_bytes, "messages").await?;
    Ok(Json(json!({"input_tokens": prepared.ids.len()})).into_response())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
}

/// Streams an answer as Anthropic's events: `message_start`, per content block
/// `content_block_start`, `content_block_delta`s and `content_block_stop`, then
/// `message_delta` (stop reason, usage) and `message_stop`.
struct MessageEvents {
    id: String,
    model: String,
    prompt_tokens: usize,
    parser: OutputParser,
    /// The block being streamed.
    open: Option<Block>,
    /// The index of the open block, or of the next one.
    index: usize,
    tool_calls: usize,
}

fn event(data: Value) -> String {
    let name = data["type"].as_str().unwrap_or("message").to_owned();
    named_event(&name, &data)
}

impl MessageEvents {
    fn close(&mut self, out: &mut Vec<String>) {
        let Some(block) = self.open.take() else {
            return;
        };
        if block == Block::Thinking {
            out.push(event(
                json!({"type": "content_block_delta", "index": self.index,
                                  "delta": {"type": "signature_delta", "signature": ""}}),
            ));
        }
        out.push(event(
            json!({"type": "content_block_stop", "index": self.index}),
        ));
        self.index += 1;
    }

    fn open(&mut self, block: Block, out: &mut Vec<String>) {
        if self.open == Some(block) {
            return;
        }
        self.close(out);
        let start = match block {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text => json!({"type": "text", "text": ""}),
        };
        out.push(event(
            json!({"type": "content_block_start", "index": self.index, "content_block": start}),
        ));
        self.open = Some(block);
    }

    fn events(&mut self, events: Vec<ParseEvent>) -> Vec<String> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ParseEvent::Reasoning(text) => {
                    self.open(Block::Thinking, &mut out);
                    out.push(event(
                        json!({"type": "content_block_delta", "index": self.index,
                                          "delta": {"type": "thinking_delta", "thinking": text}}),
                    ));
                }
                ParseEvent::Content(text) if text.is_empty() => {}
                ParseEvent::Content(text) => {
                    self.open(Block::Text, &mut out);
                    out.push(event(
                        json!({"type": "content_block_delta", "index": self.index,
                                          "delta": {"type": "text_delta", "text": text}}),
                    ));
                }
                ParseEvent::ToolCall(call) => {
                    self.close(&mut out);
                    self.tool_calls += 1;
                    let start = json!({"type": "tool_use", "id": unique_id("toolu_"), "name": call.name, "input": {}});
                    out.push(event(json!({"type": "content_block_start", "index": self.index, "content_block": start})));
                    out.push(event(json!({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": call.arguments_json()}})));
                    out.push(event(
                        json!({"type": "content_block_stop", "index": self.index}),
                    ));
                    self.index += 1;
                }
            }
        }
        out
    }
}

impl ChunkFormatter for MessageEvents {
    fn start(&mut self) -> Vec<String> {
        vec![event(json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage(self.prompt_tokens, 0, 0),
        }}))]
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        let events = self.parser.push(delta);
        self.events(events)
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let held = self.parser.finish();
        let mut out = self.events(held);
        self.close(&mut out);
        let (reason, sequence) = stop_reason(&completion.finish, self.tool_calls > 0);
        out.push(event(json!({"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": completion.ids.len()}})));
        out.push(event(json!({"type": "message_stop"})));
        out
    }

    fn framing(&self) -> Framing {
        Framing::SseEvents
    }

    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn failed(&mut self, error: &ApiError) -> Vec<String> {
        vec![event(
            json!({"type": "error", "error": {"type": "api_error", "message": error.message}}),
        )]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spindle_runtime::Finish;

    use super::*;

    #[test]
    fn streamed_blocks_open_and_close_in_order() {
        let mut f = MessageEvents {
            id: "msg_1".into(),
            model: "m".into(),
            prompt_tokens: 3,
            parser: OutputParser::new(false),
            open: None,
            index: 0,
            tool_calls: 0,
        };
        let mut chunks = f.start();
        let text = "<think>\nplan\n</think>\n\nSure.\n\n<tool_call>\n<function=f>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>";
        for piece in text.as_bytes().chunks(4) {
            chunks.extend(f.text(std::str::from_utf8(piece).unwrap()));
        }
        let completion = Completion {
            text: text.into(),
            ids: vec![1; 7],
            finish: Finish::Eos(0),
            prompt_tokens: 3,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            logprobs: Vec::new(),
            cached_tokens: 0,
        };
        chunks.extend(f.finish(&completion));
        let events: Vec<(String, Value)> = chunks
            .iter()
            .map(|c| {
                let (name, data) = c.split_once('\n').unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (name.strip_prefix("event: ").unwrap().to_owned(), data)
            })
            .collect();
        for (name, data) in &events {
            assert_eq!(name, data["type"].as_str().unwrap());
        }
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[0], "message_start");
        assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
        let starts: Vec<(u64, &str)> = events
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, d)| {
                (
                    d["index"].as_u64().unwrap(),
                    d["content_block"]["type"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(starts, [(0, "thinking"), (1, "text"), (2, "tool_use")]);
        let stops = names.iter().filter(|n| **n == "content_block_stop").count();
        assert_eq!(stops, 3);
        let text: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"]["text"].as_str())
            .collect();
        assert_eq!(text, "Sure.");
        let json: String = events
            .iter()
            .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
            .collect();
        assert_eq!(json, "{\"a\":2}");
        let last = &events[events.len() - 2].1;
        assert_eq!(last["delta"]["stop_reason"], "tool_use");
        assert_eq!(last["usage"]["output_tokens"], 7);
    }
}
