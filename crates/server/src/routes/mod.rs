//! The HTTP surface: the router; the target, `Host`, CORS, API-key, error-dialect and metrics
//! middleware; and the order every generation request follows, whatever its API: a place in
//! the queue before its body is kept, a generation slot before its prompt is rendered and
//! tokenized ([`start_generation`]).

mod anthropic;
mod chat;
mod completions;
mod cors;
mod dialect;
mod host;
mod info;
mod ollama;
mod responses;
mod tokens;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;
use spindle_vision::{ImageInput, PreparedImage};

use spindle_runtime::{GenerateOptions, PreparedPrompt, Prompt, ReasoningBudget, RuntimeError};

use crate::error::ApiError;
use crate::images::{
    check_model_reads_images, expand_pads, prepare_images, request_engine_prompt, RequestImage,
};
use crate::latency::{with_origin, RequestOrigin, TimedBody};
use crate::listen::LocalAddr;
use crate::memory::{release_freed_memory, LARGE_REQUEST_BYTES};
use crate::queue::Ticket;
use crate::request::{parse_body, Generation};
use crate::state::AppState;
use crate::worker::spawn_generation;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::handle))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/apply-template", post(tokens::apply_template))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_api_key,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            cors::cors,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            check_target_and_host,
        ))
        .layer(middleware::from_fn(dialect::errors_in_dialect))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            count_request,
        ))
        .with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no endpoint {} {}",
        request.method(),
        request.uri().path()
    ))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
        code: Some("method_not_allowed"),
        ..ApiError::not_found(format!(
            "{} does not accept {}",
            request.uri().path(),
            request.method()
        ))
    }
}

/// Counts every answered request by endpoint (the route, never the raw path) and status; a
/// generating API's request is also timed ([`crate::latency`]).
async fn count_request(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let Some(api) = crate::metrics::api_of(&endpoint) else {
        let response = next.run(request).await;
        state
            .metrics
            .record_request(&endpoint, response.status().as_u16());
        return response;
    };
    // A generating API's request: its handler knows where it came from (for the time to its
    // first token), and its body records the whole duration when it ends.
    let origin = RequestOrigin {
        api,
        arrived: Instant::now(),
    };
    let response = with_origin(origin, next.run(request)).await;
    state
        .metrics
        .record_request(&endpoint, response.status().as_u16());
    let metrics = Arc::clone(&state.metrics);
    response.map(|body| TimedBody::wrap(body, origin, metrics))
}

/// With `--api-key`, every endpoint but `/health` needs the key, as `Authorization: Bearer
/// <key>` or (Anthropic's header) `x-api-key: <key>`.
async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = state.api_key.as_deref() else {
        return next.run(request).await;
    };
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    match given {
        Some(given) if same_secret(given.as_bytes(), key.as_bytes()) => next.run(request).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Longest request target answered; longer gets 414.
const MAX_URI_BYTES: usize = 8 << 10;

/// Refuses, before anything else is read: an overlong request target (414) and, when no API
/// key is set, a `Host` that is not this machine (403: DNS rebinding).
async fn check_target_and_host(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let target = request.uri().to_string().len();
    if target > MAX_URI_BYTES {
        return ApiError::uri_too_long(target, MAX_URI_BYTES).into_response();
    }
    if state.api_key.is_none() && request.uri().path() != "/health" {
        let local = request.extensions().get::<LocalAddr>().map(|a| a.0.ip());
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| {
                let value = request.headers().get(header::HOST)?;
                Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
            });
        if let Some(host) = host {
            if !host::is_allowed(&host, local, &state.allowed_hosts) {
                return ApiError::host_not_allowed(&host).into_response();
            }
        }
    }
    next.run(request).await
}

/// Checks the body's declared type (415) and size (413), takes the request's place in the
/// queue (429 or 503, before any work: the body of a refused request is read and thrown
/// away, never kept), then reads the JSON body within `--body-timeout` (408). Returns the
/// place, the body and its size in bytes.
async fn admit_and_read(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Ticket, Value, usize), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_json = content_type.as_deref().is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    });
    if !is_json {
        return Err(ApiError::not_json(content_type.as_deref()));
    }
    let limit = state.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let ticket = match admit(state) {
        Ok(ticket) => ticket,
        Err(mut refused) => {
            refused.close |= !discard_body(state, body).await;
            return Err(refused);
        }
    };
    let reading = axum::body::to_bytes(body, limit);
    let bytes = match tokio::time::timeout(state.body_timeout, reading).await {
        Err(_) => return Err(ApiError::body_timeout(state.body_timeout)),
        Ok(read) => read.map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError::body_too_large(limit)
            } else {
                ApiError {
                    close: true,
                    ..ApiError::malformed(format!("cannot read the request body: {e}"))
                }
            }
        })?,
    };
    let value = parse_body(&bytes)?;
    Ok((ticket, value, bytes.len()))
}

/// Reads a refused request's body to its end without keeping it (so the client reads the
/// refusal rather than a reset); false when it is longer than `--max-body-bytes` or slower
/// than `--body-timeout`, and the connection must close instead.
async fn discard_body(state: &AppState, body: Body) -> bool {
    use http_body_util::BodyExt;
    let limit = state.max_body_bytes;
    let draining = async {
        let mut body = body;
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > limit {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(state.body_timeout, draining)
        .await
        .unwrap_or(false)
}

/// A request's prompt, rendered and tokenized, with its images prepared for the tower and
/// their pads expanded in `ids`.
pub(crate) struct Prepared {
    pub ids: Vec<u32>,
    /// In the order of their pads in `ids`.
    pub images: Vec<PreparedImage>,
    /// The prompt ends inside an open `<think>`: the answer starts as reasoning.
    pub starts_in_reasoning: bool,
}

/// Renders and tokenizes a prompt on a blocking thread (the caller holds a generation slot,
/// so at most `--parallel` prompts are prepared at once), and prepares its `images` (decode,
/// resize, patchify; errors name each image's field) and expands their pads. After a large
/// request the freed memory of the rendering and tokenizing is given back to the OS.
async fn prepare(
    state: &AppState,
    prompt: Prompt,
    images: Vec<RequestImage>,
    body_bytes: usize,
    param: &str,
) -> Result<Prepared, ApiError> {
    check_model_reads_images(state.images.as_ref(), &images)?;
    let model = Arc::clone(&state.model);
    let input = state.images.clone();
    let param_owned = param.to_owned();
    let (cancel, _cancel_when_dropped) = spindle_text::Cancel::with_guard();
    tokio::task::spawn_blocking(move || {
        let prepared = model
            .prepare_cancellable(&prompt, &cancel)
            .map_err(|e| ApiError::from_prepare(e, &param_owned));
        drop(prompt);
        let prepared = prepared.and_then(|p| match &input {
            Some(input) if !images.is_empty() => {
                let context = model.config().max_position_embeddings;
                let prepared_images = prepare_images(&images, input, context)?;
                drop(images);
                let ids = expand_pads(&p.ids, input, &prepared_images, &param_owned)?;
                Ok(Prepared {
                    ids,
                    images: prepared_images,
                    starts_in_reasoning: p.starts_in_reasoning,
                })
            }
            _ => plain(p, input.as_ref(), &param_owned),
        });
        if body_bytes >= LARGE_REQUEST_BYTES {
            release_freed_memory();
        }
        prepared
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))?
}

/// A prompt without images; an image placeholder in it (a vision model's template writes one
/// only for an image) is refused, as a pad without an image would run as an ordinary token.
fn plain(p: PreparedPrompt, input: Option<&ImageInput>, param: &str) -> Result<Prepared, ApiError> {
    let ids = match input {
        Some(input) => expand_pads(&p.ids, input, &[], param)?,
        None => p.ids,
    };
    Ok(Prepared {
        ids,
        images: Vec::new(),
        starts_in_reasoning: p.starts_in_reasoning,
    })
}

/// Admits a generation request to the queue: 503 while shutting down, 429 when full.
fn admit(state: &AppState) -> Result<Ticket, ApiError> {
    if state.shutting_down.load(Ordering::Acquire) {
        return Err(ApiError::shutting_down());
    }
    state
        .scheduler
        .admit()
        .map_err(|full| ApiError::queue_full(full.waiting))
}

/// Refuses a prompt that leaves no room to generate.
fn check_prompt_fits(state: &AppState, prompt_tokens: usize, param: &str) -> Result<(), ApiError> {
    let limit = state.model.config().max_position_embeddings;
    if prompt_tokens >= limit {
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt has {prompt_tokens} tokens but the model's context holds {limit} \
                 (and at least one must be left to generate)"
            ),
        )
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

/// A generation started from a request's prompt.
pub(crate) struct Started {
    pub events: crate::worker::Generation,
    /// The prompt ends inside an open `<think>`: the answer starts as reasoning.
    pub starts_in_reasoning: bool,
    pub prompt_tokens: usize,
}

/// Waits for a generation slot, prepares `prompt` and its `images` (errors name `param`, or
/// the image's field), checks that it fits the context, compiles the generation's constraint
/// (see [`choice_options`]) and submits it.
pub(crate) async fn start_generation(
    state: &Arc<AppState>,
    ticket: Ticket,
    prompt: Prompt,
    images: Vec<RequestImage>,
    body_bytes: usize,
    param: &str,
    generation: &Generation,
) -> Result<Started, ApiError> {
    let slot = ticket.start().await;
    let prepared = prepare(state, prompt, images, body_bytes, param).await?;
    check_prompt_fits(state, prepared.ids.len(), param)?;
    let options = choice_options(state, generation, prepared.starts_in_reasoning)
        .await?
        .swap_remove(0);
    let prompt_tokens = prepared.ids.len();
    let ids = request_engine_prompt(state, prepared.ids, prepared.images, param)?;
    Ok(Started {
        events: spawn_generation(state, slot, ids, options),
        starts_in_reasoning: prepared.starts_in_reasoning,
        prompt_tokens,
    })
}

/// Refuses a conversation of more than `--max-messages` messages (`count` of them, in `param`).
fn check_message_count(state: &AppState, count: usize, param: &str) -> Result<(), ApiError> {
    if count > state.max_messages {
        return Err(ApiError::invalid(
            param,
            format!(
                "the request holds {count} messages; at most {} are accepted (--max-messages)",
                state.max_messages
            ),
        ));
    }
    Ok(())
}

/// What opens a tool call in the Qwen chat templates (one token in their vocabularies).
const TOOL_CALL_OPENER: &str = "<tool_call>";

/// Each choice's options (`n` of them, choice `i` seeded `seed + i`), with the request's
/// structured output compiled against the model on a blocking thread (the first compile
/// builds the model's token trie). A bad grammar is a 400 naming the field that gave it; a
/// prompt that ends inside a reasoning block leaves the reasoning free and constrains what
/// follows `</think>`.
async fn choice_options(
    state: &AppState,
    generation: &Generation,
    starts_in_reasoning: bool,
) -> Result<Vec<GenerateOptions>, ApiError> {
    let mut options = generation.options.clone();
    let vocab = state.model.config().vocab_size;
    if generation.tools_off {
        if let Some(id) = state.model.tokenizer.token_to_id(TOOL_CALL_OPENER) {
            options.banned_ids.push(id);
        }
    }
    if let Some(tokens) = generation.reasoning_budget {
        let id = |t: &str| state.model.tokenizer.token_to_id(t);
        if let (Some(open), Some(close)) = (id("<think>"), id("</think>")) {
            options.reasoning_budget = Some(ReasoningBudget {
                tokens,
                open,
                close,
                starts_inside: starts_in_reasoning,
            });
        }
    }
    if let Some((id, _)) = options
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            format!("logit_bias.{id}"),
            format!("token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some(id) = options
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("token id {id} is outside the vocabulary of {vocab}"),
        ));
    }
    if let Some((field, grammar)) = generation.grammar.clone() {
        if options.ignore_eos {
            return Err(ApiError::invalid(
                "ignore_eos",
                format!("ignore_eos cannot be combined with {field}: the grammar ends at EOS"),
            ));
        }
        let model = Arc::clone(&state.model);
        let compiled = tokio::task::spawn_blocking(move || model.constraint(&grammar))
            .await
            .map_err(|e| ApiError::internal(format!("compiling the grammar failed: {e}")))?;
        let mut constraint = compiled.map_err(|e| match e {
            RuntimeError::Grammar(message) => {
                ApiError::invalid(&field, format!("{field}: invalid grammar: {message}"))
            }
            other => ApiError::internal(other.to_string()),
        })?;
        if starts_in_reasoning {
            if let Some(end) = state.model.tokenizer.token_to_id("</think>") {
                constraint = constraint.after(end);
            }
        }
        options.constraint = Some(constraint);
    }
    let generation = Generation {
        options,
        ..generation.clone()
    };
    Ok((0..generation.n)
        .map(|i| generation.choice_options(i))
        .collect())
}
