//! `POST /v1/completions`: a raw prompt continued, whole or streamed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_runtime::{Completion, Prompt};

use super::{admit_and_read, check_prompt_fits, prepare};
use crate::error::ApiError;
use crate::request::{from_value, PromptInput, RawCommon, RawCompletion};
use crate::response::{finish_reason, now_s, unique_id, TextChoice, TextCompletion, Usage};
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
    let request = from_value::<RawCompletion>(&body)?.check(generation)?;
    drop(body);
    let prompt = match request.prompt {
        PromptInput::Text(text) => Prompt::Text {
            text,
            special_tokens: request.special_tokens,
        },
        PromptInput::Tokens(ids) => {
            let vocab = state.model.config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            Prompt::Tokens(ids)
        }
    };
    let slot = ticket.start().await;
    let prepared = prepare(&state, prompt, body_bytes, "prompt").await?;
    if prepared.ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
    }
    check_prompt_fits(&state, prepared.ids.len(), "prompt")?;
    let generation = request.generation;
    let events = spawn_generation(&state, slot, prepared.ids, generation.options);
    let mut chunks = TextChunks {
        id: unique_id("cmpl-"),
        created: now_s(),
        model: state.model_id.clone(),
        include_usage: generation.include_usage,
    };
    if generation.stream {
        return Ok(sse_response(events, chunks));
    }
    let completion = wait_for_completion(events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    chunks.include_usage = true;
    let reason = finish_reason(&completion.finish, false);
    let body = chunks.body(
        completion.text.clone(),
        Some(reason),
        Some(Usage::of(&completion)),
    );
    Ok(Json(body).into_response())
}

/// Builds `text_completion` objects: the whole answer or its streamed chunks.
struct TextChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl TextChunks {
    fn body(
        &self,
        text: String,
        reason: Option<&'static str>,
        usage: Option<Usage>,
    ) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices: vec![TextChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: reason,
            }],
            usage: self.include_usage.then_some(usage),
        }
    }

    fn json(body: &TextCompletion) -> String {
        serde_json::to_string(body).expect("chunks serialize")
    }
}

impl ChunkFormatter for TextChunks {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        vec![Self::json(&self.body(delta.to_owned(), None, None))]
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let reason = finish_reason(&completion.finish, false);
        let mut chunks = vec![Self::json(&self.body(String::new(), Some(reason), None))];
        if self.include_usage {
            let mut last = self.body(String::new(), None, Some(Usage::of(completion)));
            last.choices.clear();
            chunks.push(Self::json(&last));
        }
        chunks
    }
}
