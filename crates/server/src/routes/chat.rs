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

use super::{admit, check_prompt_fits, read_json};
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
    let body = read_json(&state, &headers, body).await?;
    let generation = from_value::<RawCommon>(&body)?.check(&state.model.defaults)?;
    let request = from_value::<RawChat>(&body)?.check(generation)?;
    let prompt = Prompt::Chat {
        messages: request.messages,
        tools: request.tools,
        vars: request.vars,
        add_generation_prompt: true,
    };
    let model = Arc::clone(&state.model);
    let prepared = tokio::task::spawn_blocking(move || model.prepare(&prompt))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))?
        .map_err(|e| ApiError::from_prepare(e, "messages"))?;
    check_prompt_fits(&state, prepared.ids.len(), "messages")?;
    let generation = request.generation;
    let ticket = admit(&state)?;
    let events = spawn_generation(&state, ticket, prepared.ids, generation.options);
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
