//! `GET /v1/models`, `/v1/models/{id}`, `/health` and `/metrics`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;

fn model_object(state: &AppState) -> Value {
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "spindle",
        "max_model_len": state.model.config().max_position_embeddings,
    })
}

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&state)]}))
}

pub async fn model(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id == state.model_id {
        Ok(Json(model_object(&state)))
    } else {
        Err(ApiError::not_found(format!(
            "no model {id:?}: this server serves {:?}",
            state.model_id
        )))
    }
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let text = state
        .metrics
        .render(&state.scheduler, state.engine.stats(), &state.experts);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
