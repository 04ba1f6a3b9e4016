//! Ollama's API: `POST /api/chat` and `/api/generate` (whole, or streamed as NDJSON, the
//! default), `GET /api/tags`, `POST /api/show`, `GET /api/version`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use spindle_runtime::{Completion, Finish};
use spindle_text::{parse_output, OutputParser, ParseEvent, ParsedOutput, ToolCall};

use super::{admit_and_read, check_message_count, start_generation};
use crate::api::ollama::{parse_chat, parse_generate, OllamaRequest};
use crate::api::rfc3339;
use crate::error::ApiError;
use crate::response::now_s;
use crate::sse::{sse_response, ChunkFormatter, Framing};
use crate::state::AppState;
use crate::worker::wait_for_completion;

/// Which endpoint answers: chat answers carry a `message`, generate answers `response`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Generate,
}

pub async fn chat(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    let count = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    check_message_count(&state, count, "messages")?;
    let request = parse_chat(&body, &state.model.defaults)?;
    drop(body);
    answer(&state, ticket, request, body_bytes, Shape::Chat, "messages").await
}

pub async fn generate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    let Some(request) = parse_generate(&body, &state.model.defaults)? else {
        // An empty prompt loads the model in Ollama; here it is always loaded.
        return Ok(Json(
            json!({"model": state.model_id, "created_at": rfc3339(now_s()),
                              "response": "", "done": true, "done_reason": "load"}),
        )
        .into_response());
    };
    drop(body);
    answer(
        &state,
        ticket,
        request,
        body_bytes,
        Shape::Generate,
        "prompt",
    )
    .await
}

async fn answer(
    state: &Arc<AppState>,
    ticket: crate::queue::Ticket,
    request: OllamaRequest,
    body_bytes: usize,
    shape: Shape,
    param: &str,
) -> Result<Response, ApiError> {
    let generation = request.generation;
    let started = start_generation(
        state,
        ticket,
        request.prompt,
        request.images,
        body_bytes,
        param,
        &generation,
    )
    .await?;
    let mut lines = Lines {
        shape,
        model: state.model_id.clone(),
        parser: OutputParser::new(started.starts_in_reasoning),
    };
    if generation.stream {
        return Ok(sse_response(started.events, lines));
    }
    let completion = wait_for_completion(started.events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let parsed = parse_output(&completion.text, started.starts_in_reasoning);
    Ok(Json(lines.last(&parsed, &completion)).into_response())
}

/// Builds Ollama's answers: one object per delta while streaming (`done: false`), and a last
/// one with `done: true`, `done_reason` and the counts and durations.
struct Lines {
    shape: Shape,
    model: String,
    parser: OutputParser,
}

impl Lines {
    fn line(&self, content: &str, thinking: &str, calls: &[ToolCall], done: bool) -> Value {
        let mut line = json!({"model": self.model, "created_at": rfc3339(now_s())});
        match self.shape {
            Shape::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if !thinking.is_empty() {
                    message["thinking"] = json!(thinking);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = calls
                        .iter()
                        .enumerate()
                        .map(|(i, c)| json!({"function": {"index": i, "name": c.name, "arguments": c.arguments}}))
                        .collect();
                }
                line["message"] = message;
            }
            Shape::Generate => {
                line["response"] = json!(content);
                if !thinking.is_empty() {
                    line["thinking"] = json!(thinking);
                }
            }
        }
        line["done"] = json!(done);
        line
    }

    /// The last object, carrying `parsed` (the whole answer, or what was held back).
    fn last(&mut self, parsed: &ParsedOutput, completion: &Completion) -> Value {
        let mut line = self.line(&parsed.content, &parsed.reasoning, &parsed.tool_calls, true);
        let reason = match completion.finish {
            Finish::Length | Finish::ContextFull => "length",
            Finish::Cancelled => "abort",
            Finish::Eos(_) | Finish::Stop(_) => "stop",
        };
        let nanos = |d: std::time::Duration| d.as_nanos() as u64;
        line["done_reason"] = json!(reason);
        line["total_duration"] = json!(nanos(completion.prefill_time + completion.decode_time));
        line["load_duration"] = json!(0);
        line["prompt_eval_count"] = json!(completion.prompt_tokens);
        line["prompt_eval_duration"] = json!(nanos(completion.prefill_time));
        line["eval_count"] = json!(completion.ids.len());
        line["eval_duration"] = json!(nanos(completion.decode_time));
        line
    }

    fn events(&self, events: Vec<ParseEvent>) -> Vec<String> {
        events
            .into_iter()
            .filter_map(|e| {
                let line = match e {
                    ParseEvent::Content(text) if text.is_empty() => return None,
                    ParseEvent::Content(text) => self.line(&text, "", &[], false),
                    ParseEvent::Reasoning(text) => self.line("", &text, &[], false),
                    ParseEvent::ToolCall(call) => self.line("", "", &[call], false),
                };
                Some(line.to_string())
            })
            .collect()
    }
}

impl ChunkFormatter for Lines {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        let events = self.parser.push(delta);
        self.events(events)
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let held = self.parser.finish();
        let mut parsed = ParsedOutput::default();
        let mut lines = Vec::new();
        for event in held {
            match event {
                ParseEvent::ToolCall(call) => {
                    lines.extend(self.events(vec![ParseEvent::ToolCall(call)]))
                }
                other => parsed.apply(other),
            }
        }
        lines.push(self.last(&parsed, completion).to_string());
        lines
    }

    fn framing(&self) -> Framing {
        Framing::Ndjson
    }

    fn end(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn failed(&mut self, error: &ApiError) -> Vec<String> {
        vec![json!({"error": error.message}).to_string()]
    }
}

/// The model's `details`, as `/api/tags` and `/api/show` give them.
fn details(state: &AppState) -> Value {
    let family = format!("{:?}", state.model.config().family).to_lowercase();
    json!({"parent_model": "", "format": "safetensors", "family": family, "families": [family],
           "parameter_size": "", "quantization_level": ""})
}

/// Bytes of the model's weight files.
fn weight_bytes(state: &AppState) -> u64 {
    std::fs::read_dir(&state.model.dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub async fn tags(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"models": [{
        "name": state.model_id, "model": state.model_id,
        "modified_at": rfc3339(state.created), "size": weight_bytes(&state), "digest": "",
        "details": details(&state),
    }]}))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // Small: read like any request, within the queue's limits.
    let (_ticket, _body, _) = admit_and_read(&state, &headers, body).await?;
    let config = state.model.config();
    let family = format!("{:?}", config.family).to_lowercase();
    let mut capabilities = vec!["completion"];
    if state.model.template.is_some() {
        capabilities.extend(["tools", "thinking"]);
    }
    Ok(Json(json!({
        "license": "", "modelfile": "", "parameters": "", "template": "",
        "details": details(&state),
        "model_info": {
            "general.architecture": family,
            format!("{family}.context_length"): config.max_position_embeddings,
            format!("{family}.embedding_length"): config.hidden_size,
            format!("{family}.block_count"): config.layers.len(),
        },
        "capabilities": capabilities,
        "modified_at": rfc3339(state.created),
    }))
    .into_response())
}

/// spindle's version (clients that check Ollama's version numbers see spindle's).
pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn streamed_lines_end_with_done_and_counts() {
        let mut f = Lines {
            shape: Shape::Chat,
            model: "m".into(),
            parser: OutputParser::new(false),
        };
        let text = "<think>\nhm\n</think>\n\nHi there";
        let mut lines = Vec::new();
        for piece in text.as_bytes().chunks(4) {
            lines.extend(f.text(std::str::from_utf8(piece).unwrap()));
        }
        let completion = Completion {
            text: text.into(),
            ids: vec![1; 6],
            finish: Finish::Length,
            prompt_tokens: 4,
            prefill_time: Duration::from_millis(2),
            decode_time: Duration::from_millis(3),
            logprobs: Vec::new(),
            cached_tokens: 0,
        };
        lines.extend(f.finish(&completion));
        let lines: Vec<Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let field = |name: &str| -> String {
            lines
                .iter()
                .filter_map(|l| l["message"][name].as_str())
                .collect()
        };
        assert_eq!(field("content"), "Hi there");
        assert_eq!(field("thinking"), "hm");
        let last = lines.last().unwrap();
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "length");
        assert_eq!(
            (
                last["eval_count"].as_u64(),
                last["prompt_eval_count"].as_u64()
            ),
            (Some(6), Some(4))
        );
        assert_eq!(last["total_duration"], 5_000_000);
        assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
    }
}
