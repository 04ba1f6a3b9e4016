//! Errors: [`ApiError`] is what a client sees (an HTTP status and OpenAI's error body,
//! `{"error": {"message", "type", "param", "code"}}`); [`ServerError`] is what starting the
//! server can fail with.

use std::path::PathBuf;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use spindle_runtime::RuntimeError;
use spindle_text::TextError;

/// An error answered to the client, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault (`messages[1].role`, `temperature`), when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()).filter(|p: &String| !p.is_empty()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (not valid JSON, ...).
    pub fn malformed(message: impl Into<String>) -> Self {
        Self {
            param: None,
            ..Self::invalid("", message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key: send `Authorization: Bearer <key>`".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    pub fn queue_full(waiting: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "the server is busy: every generation slot is taken and {waiting} requests are \
                 already waiting; retry later"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    pub fn shutting_down() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            kind: "server_error",
            param: None,
            code: Some("shutting_down"),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// Maps a runtime failure while preparing a prompt: what the request caused (a template
    /// that refuses the conversation, a prompt longer than the context) is a 400 naming
    /// `param`; the rest is the server's fault.
    pub fn from_prepare(err: RuntimeError, param: &str) -> Self {
        match err {
            RuntimeError::Text(TextError::TemplateException { message }) => {
                Self::invalid(param, message)
            }
            RuntimeError::Text(
                e @ (TextError::TemplateRender { .. } | TextError::InvalidTemplateArgument { .. }),
            ) => Self::invalid(param, e.to_string()),
            RuntimeError::EmptyPrompt => Self::invalid(param, err.to_string()),
            RuntimeError::PromptTooLong { .. } => {
                Self::invalid(param, err.to_string()).with_code("context_length_exceeded")
            }
            RuntimeError::Sampling(e) => Self::invalid(e.field, e.to_string()),
            RuntimeError::File { .. } if param == "messages" => {
                Self::invalid(param, err.to_string())
            }
            other => Self::internal(other.to_string()),
        }
    }

    /// The JSON body, also sent as an SSE event when a stream fails midway.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// What starting the server can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The cause is the source (shown by `{:#}` and error reporters), not repeated here.
    #[error("cannot open the model")]
    Model(#[from] RuntimeError),

    #[error("the server failed")]
    Serve(#[source] std::io::Error),

    #[error("{path}: the model directory has no name to serve it under; pass --model-id")]
    NoModelId { path: PathBuf },

    #[error("invalid server option: {0}")]
    Option(String),
}
