//! `POST /v1/responses` (OpenAI's Responses API, stateless): the answer as output items,
//! whole or streamed as the Responses events the openai SDK reads.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use spindle_runtime::{Completion, Prompt};
use spindle_text::{parse_output, OutputParser, ParseEvent};

use super::{admit_and_read, check_message_count, start_generation};
use crate::api::responses::{
    function_call_item, message_item, output_items, output_text, parse, reasoning_item,
    response_object,
};
use crate::error::ApiError;
use crate::response::{now_s, unique_id};
use crate::sse::{named_event, sse_response, ChunkFormatter, Framing};
use crate::state::AppState;
use crate::worker::wait_for_completion;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    let count = body
        .get("input")
        .and_then(Value::as_array)
        .map_or(1, Vec::len);
    check_message_count(&state, count, "input")?;
    let request = parse(&body, &state.model.defaults)?;
    drop(body);
    let prompt = Prompt::Chat {
        messages: request.messages,
        tools: request.tools,
        vars: request.vars,
        add_generation_prompt: true,
    };
    let generation = request.generation;
    let started = start_generation(
        &state,
        ticket,
        prompt,
        request.images,
        body_bytes,
        "input",
        &generation,
    )
    .await?;
    let (id, created) = (unique_id("resp_"), now_s());
    if generation.stream {
        let events = ResponseEvents {
            id,
            created,
            model: state.model_id.clone(),
            echo: request.echo,
            parser: OutputParser::new(started.starts_in_reasoning),
            sequence: 0,
            open: None,
            output: Vec::new(),
        };
        return Ok(sse_response(started.events, events));
    }
    let completion = wait_for_completion(started.events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let parsed = parse_output(&completion.text, started.starts_in_reasoning);
    Ok(Json(response_object(
        &id,
        created,
        &state.model_id,
        &request.echo,
        output_items(&parsed),
        Some(&completion.finish),
        Some((
            completion.prompt_tokens,
            completion.ids.len(),
            completion.cached_tokens,
        )),
    ))
    .into_response())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Reasoning,
    Message,
}

/// The output item being streamed.
struct OpenItem {
    kind: Item,
    id: String,
    text: String,
}

/// Streams an answer as Responses events: `response.created`, `response.in_progress`, per
/// output item `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
/// `response.output_text.delta` within a content part, `response.function_call_arguments.*`)
/// and `response.output_item.done`, then `response.completed` (or `response.incomplete`).
struct ResponseEvents {
    id: String,
    created: u64,
    model: String,
    echo: Map<String, Value>,
    parser: OutputParser,
    sequence: u64,
    open: Option<OpenItem>,
    /// Finished output items.
    output: Vec<Value>,
}

impl ResponseEvents {
    fn event(&mut self, mut data: Value, out: &mut Vec<String>) {
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let name = data["type"].as_str().unwrap_or("response").to_owned();
        out.push(named_event(&name, &data));
    }

    fn response(&self, completion: Option<&Completion>) -> Value {
        response_object(
            &self.id,
            self.created,
            &self.model,
            &self.echo,
            self.output.clone(),
            completion.map(|c| &c.finish),
            completion.map(|c| (c.prompt_tokens, c.ids.len(), c.cached_tokens)),
        )
    }

    fn close(&mut self, out: &mut Vec<String>) {
        let Some(item) = self.open.take() else { return };
        let index = self.output.len();
        let (id, text) = (item.id.as_str(), item.text.as_str());
        let done = match item.kind {
            Item::Reasoning => {
                self.event(
                    json!({"type": "response.reasoning_text.done", "item_id": id,
                                  "output_index": index, "content_index": 0, "text": text}),
                    out,
                );
                reasoning_item(id, text)
            }
            Item::Message => {
                self.event(json!({"type": "response.output_text.done", "item_id": id, "output_index": index,
                                  "content_index": 0, "text": text, "logprobs": []}), out);
                self.event(json!({"type": "response.content_part.done", "item_id": id, "output_index": index,
                                  "content_index": 0, "part": output_text(text)}), out);
                message_item(id, Some(text), "completed")
            }
        };
        self.event(
            json!({"type": "response.output_item.done", "output_index": index, "item": done}),
            out,
        );
        self.output.push(done);
    }

    fn open(&mut self, kind: Item, out: &mut Vec<String>) {
        if self.open.as_ref().is_some_and(|o| o.kind == kind) {
            return;
        }
        self.close(out);
        let index = self.output.len();
        let id = unique_id(if kind == Item::Reasoning {
            "rs_"
        } else {
            "msg_"
        });
        let item = match kind {
            Item::Reasoning => json!({"type": "reasoning", "id": id, "summary": [], "content": []}),
            Item::Message => message_item(&id, None, "in_progress"),
        };
        self.event(
            json!({"type": "response.output_item.added", "output_index": index, "item": item}),
            out,
        );
        if kind == Item::Message {
            self.event(
                json!({"type": "response.content_part.added", "item_id": id, "output_index": index,
                              "content_index": 0, "part": output_text("")}),
                out,
            );
        }
        self.open = Some(OpenItem {
            kind,
            id,
            text: String::new(),
        });
    }

    fn delta(&mut self, kind: Item, text: String, out: &mut Vec<String>) {
        self.open(kind, out);
        let index = self.output.len();
        let Some(item) = self.open.as_mut() else {
            return;
        };
        item.text.push_str(&text);
        let id = item.id.clone();
        let data = match kind {
            Item::Reasoning => json!({"type": "response.reasoning_text.delta", "item_id": id,
                                      "output_index": index, "content_index": 0, "delta": text}),
            Item::Message => {
                json!({"type": "response.output_text.delta", "item_id": id, "output_index": index,
                                    "content_index": 0, "delta": text, "logprobs": []})
            }
        };
        self.event(data, out);
    }

    fn events(&mut self, events: Vec<ParseEvent>) -> Vec<String> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ParseEvent::Reasoning(text) => self.delta(Item::Reasoning, text, &mut out),
                ParseEvent::Content(text) if text.is_empty() => {}
                ParseEvent::Content(text) => self.delta(Item::Message, text, &mut out),
                ParseEvent::ToolCall(call) => {
                    self.close(&mut out);
                    let index = self.output.len();
                    let (id, call_id, arguments) =
                        (unique_id("fc_"), unique_id("call_"), call.arguments_json());
                    let added = function_call_item(&id, &call_id, &call, "", "in_progress");
                    self.event(json!({"type": "response.output_item.added", "output_index": index, "item": added}), &mut out);
                    self.event(
                        json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                      "output_index": index, "delta": arguments}),
                        &mut out,
                    );
                    self.event(json!({"type": "response.function_call_arguments.done", "item_id": id,
                                      "output_index": index, "name": call.name, "arguments": arguments}), &mut out);
                    let done = function_call_item(&id, &call_id, &call, &arguments, "completed");
                    self.event(json!({"type": "response.output_item.done", "output_index": index, "item": done}), &mut out);
                    self.output.push(done);
                }
            }
        }
        out
    }
}

impl ChunkFormatter for ResponseEvents {
    fn start(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let response = self.response(None);
        self.event(
            json!({"type": "response.created", "response": response}),
            &mut out,
        );
        self.event(
            json!({"type": "response.in_progress", "response": response}),
            &mut out,
        );
        out
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        let events = self.parser.push(delta);
        self.events(events)
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let held = self.parser.finish();
        let mut out = self.events(held);
        if self.output.is_empty() && self.open.is_none() {
            // An empty answer is still one (empty) message, as the whole answer has.
            self.open(Item::Message, &mut out);
        }
        self.close(&mut out);
        let response = self.response(Some(completion));
        let name = if response["status"] == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        self.event(json!({"type": name, "response": response}), &mut out);
        out
    }

    fn framing(&self) -> Framing {
        Framing::SseEvents
    }

    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn failed(&mut self, error: &ApiError) -> Vec<String> {
        let mut out = Vec::new();
        self.event(json!({"type": "error", "code": error.code, "message": error.message, "param": error.param}), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use spindle_runtime::Finish;

    use super::*;

    #[test]
    fn streamed_items_rebuild_the_whole_answer() {
        let mut f = ResponseEvents {
            id: "resp_1".into(),
            created: 1,
            model: "m".into(),
            echo: Map::new(),
            parser: OutputParser::new(false),
            sequence: 0,
            open: None,
            output: Vec::new(),
        };
        let mut chunks = f.start();
        let text = "<think>\nplan\n</think>\n\nSure.\n\n<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n</function>\n</tool_call>";
        for piece in text.as_bytes().chunks(3) {
            chunks.extend(f.text(std::str::from_utf8(piece).unwrap()));
        }
        let completion = Completion {
            text: text.into(),
            ids: vec![1; 5],
            finish: Finish::Length,
            prompt_tokens: 2,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            logprobs: Vec::new(),
            cached_tokens: 0,
        };
        chunks.extend(f.finish(&completion));
        let events: Vec<Value> = chunks
            .iter()
            .map(|c| serde_json::from_str(c.split_once("\ndata: ").unwrap().1).unwrap())
            .collect();
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.incomplete");
        let output = &last["response"]["output"];
        let kinds: Vec<&str> = output
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(output[0]["content"][0]["text"], "plan");
        assert_eq!(output[1]["content"][0]["text"], "Sure.");
        assert_eq!(output[2]["arguments"], "{\"a\":\"x\"}");
        assert_eq!(last["response"]["usage"]["total_tokens"], 7);
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        let deltas: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, "Sure.");
    }
}
