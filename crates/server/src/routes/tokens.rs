//! llama-server's token endpoints: `POST /tokenize` (`{"content", "add_special",
//! "parse_special", "with_pieces"}` to `{"tokens": [...]}`), `POST /detokenize`
//! (`{"tokens"}` to `{"content"}`) and `POST /apply-template` (a chat request's `messages`,
//! `tools` and `chat_template_kwargs` to `{"prompt"}`, the text the model would be given).
//! Tokenizing and rendering cost what a prompt does, so they wait for a generation slot.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use spindle_runtime::Prompt;

use super::{admit_and_read, check_message_count, prepare};
use crate::api::{optional, Fields};
use crate::error::ApiError;
use crate::request::{from_value, RawChat, RawCommon};
use crate::state::AppState;

const TOKENIZE_FIELDS: Fields = Fields {
    endpoint: "/tokenize",
    read: &["content", "add_special", "parse_special", "with_pieces"],
    ignored: &["model"],
};

const DETOKENIZE_FIELDS: Fields = Fields {
    endpoint: "/detokenize",
    read: &["tokens"],
    ignored: &["model"],
};

const TEMPLATE_FIELDS: Fields = Fields {
    endpoint: "/apply-template",
    read: &[
        "messages",
        "tools",
        "tool_choice",
        "chat_template_kwargs",
        "reasoning_effort",
    ],
    ignored: &["model"],
};

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    TOKENIZE_FIELDS.check(&body, "")?;
    let content: String = optional(&body, "content", "")?.ok_or_else(|| {
        ApiError::invalid("content", "content (the text to tokenize) is required")
    })?;
    // Qwen tokenizers add no BOS or EOS: add_special changes nothing.
    let _add_special: Option<bool> = optional(&body, "add_special", "")?;
    let special_tokens = optional(&body, "parse_special", "")?.unwrap_or(true);
    let with_pieces = optional(&body, "with_pieces", "")?.unwrap_or(false);
    drop(body);
    let ids = if content.is_empty() {
        Vec::new()
    } else {
        let _slot = ticket.start().await;
        let prompt = Prompt::Text {
            text: content,
            special_tokens,
        };
        prepare(&state, prompt, Vec::new(), body_bytes, "content")
            .await?
            .ids
    };
    let tokens: Vec<Value> = if with_pieces {
        let tokenizer = &state.model.tokenizer;
        ids.iter()
            .map(|&id| {
                let piece = tokenizer.decode(&[id], false).unwrap_or_default();
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({"tokens": tokens})).into_response())
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, _) = admit_and_read(&state, &headers, body).await?;
    DETOKENIZE_FIELDS.check(&body, "")?;
    let ids: Vec<u32> = optional(&body, "tokens", "")?
        .ok_or_else(|| ApiError::invalid("tokens", "tokens (a list of token ids) is required"))?;
    drop(body);
    let vocab = state.model.config().vocab_size;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    let _slot = ticket.start().await;
    let model = Arc::clone(&state.model);
    let content = tokio::task::spawn_blocking(move || model.tokenizer.decode(&ids, false))
        .await
        .map_err(|e| ApiError::internal(format!("decoding failed: {e}")))?
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(json!({"content": content})).into_response())
}

pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, _) = admit_and_read(&state, &headers, body).await?;
    TEMPLATE_FIELDS.check(&body, "")?;
    let count = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    check_message_count(&state, count, "messages")?;
    // The chat endpoint's own checks, so the prompt is exactly the one it would render.
    let generation = RawCommon::default().check(&state.model.defaults)?;
    let request = from_value::<RawChat>(&body)?.check(generation)?;
    drop(body);
    let _slot = ticket.start().await;
    let model = Arc::clone(&state.model);
    let rendered = tokio::task::spawn_blocking(move || {
        let template = model.template.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "the model has no chat template; use a raw prompt",
            )
        })?;
        let cancel = spindle_text::Cancel::default();
        template
            .render_prompt_cancellable(
                &request.messages,
                request.tools.as_ref(),
                true,
                &request.vars,
                &model.tokenizer.special_spellings(),
                &cancel,
            )
            .map_err(|e| ApiError::from_prepare(e.into(), "messages"))
    })
    .await
    .map_err(|e| ApiError::internal(format!("rendering failed: {e}")))??;
    Ok(Json(json!({"prompt": rendered.text})).into_response())
}
