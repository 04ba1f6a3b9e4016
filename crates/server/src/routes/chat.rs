//! `POST /v1/chat/completions`: messages through the chat template, reasoning and tool calls
//! parsed out of the answer, whole or streamed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_runtime::{Completion, Prompt};
use spindle_text::{parse_output, OutputParser, ParseEvent};

use super::{admit_and_read, check_prompt_fits, prepare};
use crate::error::ApiError;
use crate::request::{from_value, RawChat, RawCommon};
use crate::response::{
    finish_reason, now_s, unique_id, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion,
    ChunkChoice, Delta, ToolCallOut, Usage,
};
use crate::sse::{sse_response, ChunkFormatter};
use crate::state::AppState;
use crate::worker::{spawn_generation, wait_for_completion};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    let generation = from_value::<RawCommon>(&body)?.check(&state.model.defaults)?;
    let messages = body
        .get("messages")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len);
    if messages > state.max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the request holds {messages} messages; at most {} are accepted (--max-messages)",
                state.max_messages
            ),
        ));
    }
    let request = from_value::<RawChat>(&body)?.check(generation)?;
    drop(body);
    let prompt = Prompt::Chat {
        messages: request.messages,
        tools: request.tools,
        vars: request.vars,
        add_generation_prompt: true,
    };
    let slot = ticket.start().await;
    let prepared = prepare(&state, prompt, body_bytes, "messages").await?;
    check_prompt_fits(&state, prepared.ids.len(), "messages")?;
    let generation = request.generation;
    let events = spawn_generation(&state, slot, prepared.ids, generation.options);
    let (id, created) = (unique_id("chatcmpl-"), now_s());
    if generation.stream {
        let formatter = ChatChunks {
            id,
            created,
            model: state.model_id.clone(),
            include_usage: generation.include_usage,
            parser: OutputParser::new(prepared.starts_in_reasoning),
            tool_calls: 0,
        };
        return Ok(sse_response(events, formatter));
    }
    let completion = wait_for_completion(events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let parsed = parse_output(&completion.text, prepared.starts_in_reasoning);
    let reason = finish_reason(&completion.finish, !parsed.tool_calls.is_empty());
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: state.model_id.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage::from_parsed(parsed),
            logprobs: None,
            finish_reason: reason,
        }],
        usage: Usage::of(&completion),
        system_fingerprint: None,
    })
    .into_response())
}

/// Streams a chat answer as `chat.completion.chunk` objects.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    parser: OutputParser,
    /// Tool calls sent so far (the next call's `index`).
    tool_calls: usize,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
        let chunk = ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: self.include_usage.then_some(usage),
        };
        serde_json::to_string(&chunk).expect("chunks serialize")
    }

    fn delta(&self, delta: Delta, finish_reason: Option<&'static str>) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        };
        self.chunk(vec![choice], None)
    }

    fn events(&mut self, events: Vec<ParseEvent>) -> Vec<String> {
        events
            .into_iter()
            .map(|event| {
                let delta = match event {
                    ParseEvent::Content(text) => Delta {
                        content: Some(text),
                        ..Delta::default()
                    },
                    ParseEvent::Reasoning(text) => Delta {
                        reasoning_content: Some(text),
                        ..Delta::default()
                    },
                    ParseEvent::ToolCall(call) => {
                        self.tool_calls += 1;
                        Delta {
                            tool_calls: Some(vec![ToolCallOut::new(
                                &call,
                                Some(self.tool_calls - 1),
                            )]),
                            ..Delta::default()
                        }
                    }
                };
                self.delta(delta, None)
            })
            .collect()
    }
}

impl ChunkFormatter for ChatChunks {
    fn start(&mut self) -> Vec<String> {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        vec![self.delta(delta, None)]
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        let events = self.parser.push(delta);
        self.events(events)
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let held = self.parser.finish();
        let mut chunks = self.events(held);
        let reason = finish_reason(&completion.finish, self.tool_calls > 0);
        chunks.push(self.delta(Delta::default(), Some(reason)));
        if self.include_usage {
            chunks.push(self.chunk(Vec::new(), Some(Usage::of(completion))));
        }
        chunks
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use spindle_runtime::Finish;

    use super::*;

    fn formatter(include_usage: bool) -> ChatChunks {
        ChatChunks {
            id: "chatcmpl-test".into(),
            created: 1,
            model: "m".into(),
            include_usage,
            parser: OutputParser::new(false),
            tool_calls: 0,
        }
    }

    #[test]
    fn streamed_tool_calls_have_openai_delta_shape() {
        let mut f = formatter(true);
        let mut chunks = f.start();
        let text =
            "<think>\nplan\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n\
                    <parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        // Fed in small pieces, as a decode loop would.
        for piece in text.as_bytes().chunks(5) {
            chunks.extend(f.text(std::str::from_utf8(piece).unwrap()));
        }
        let completion = Completion {
            text: text.into(),
            ids: vec![1; 9],
            finish: Finish::Eos(0),
            prompt_tokens: 4,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            logprobs: Vec::new(),
        };
        chunks.extend(f.finish(&completion));
        let chunks: Vec<Value> = chunks
            .iter()
            .map(|c| serde_json::from_str(c).unwrap())
            .collect();
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert!(chunks[0]["usage"].is_null() && chunks[0].get("usage").is_some());
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["delta"])
            .collect();
        let field =
            |name: &str| -> String { deltas.iter().filter_map(|d| d[name].as_str()).collect() };
        assert_eq!(field("reasoning_content"), "plan");
        assert_eq!(field("content"), "Let me check.");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 1);
        let call = &calls[0][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[n - 2]["choices"][0]["delta"], json!({}));
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(chunks[n - 1]["usage"]["total_tokens"], 13);
    }
}
