//! The HTTP surface: the router, the API-key and metrics middleware, and reading a bounded
//! JSON body.

mod chat;
mod completions;
mod info;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;

use crate::error::ApiError;
use crate::queue::Ticket;
use crate::request::parse_body;
use crate::state::AppState;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_api_key,
        ))
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

/// Counts every answered request by endpoint (the route, never the raw path) and status.
async fn count_request(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "other".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    state
        .metrics
        .record_request(&endpoint, response.status().as_u16());
    response
}

/// With `--api-key`, every endpoint but `/health` needs `Authorization: Bearer <key>`.
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
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
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

/// Reads a JSON object body of at most `--max-body-bytes` (413 beyond).
async fn read_json(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let limit = state.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::body_too_large(limit)
        } else {
            ApiError::malformed(format!("cannot read the request body: {e}"))
        }
    })?;
    parse_body(&bytes)
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
