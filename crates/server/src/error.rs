//! Errors: [`ApiError`] is what a client sees (an HTTP status and OpenAI's error body,
//! `{"error": {"message", "type", "param", "code"}}`); [`ServerError`] is what starting the
//! server can fail with.

use std::path::PathBuf;

use axum::http::{header, HeaderValue, StatusCode};
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
    /// Seconds a client should wait before retrying (`Retry-After`), for 429 and 503.
    pub retry_after_s: Option<u32>,
    /// Close the connection after answering (`Connection: close`): the request body was not
    /// read to its end, or the client is too slow to keep.
    pub close: bool,
}

/// The most characters of a 400's message: enough for any message spindle writes, not for a
/// 200 kB value a deserializer quotes whole.
pub const MESSAGE_CHARS: usize = 1024;

fn bounded(message: String) -> String {
    match message.char_indices().nth(MESSAGE_CHARS) {
        Some((cut, _)) => format!(
            "{}… (a message of {} bytes, cut)",
            &message[..cut],
            message.len()
        ),
        None => message,
    }
}

impl ApiError {
    /// A 400 naming the field at fault. A message longer than [`MESSAGE_CHARS`] (one that
    /// quotes a huge value it refuses) is cut.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: bounded(message.into()),
            kind: "invalid_request_error",
            param: Some(param.into()).filter(|p: &String| !p.is_empty()),
            code: None,
            retry_after_s: None,
            close: false,
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
            message: "invalid or missing API key: send `Authorization: Bearer <key>` or \
                      `x-api-key: <key>`"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after_s: None,
            close: false,
        }
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after_s: None,
            close: true,
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
            retry_after_s: Some(1),
            close: false,
        }
    }

    pub fn shutting_down() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            kind: "server_error",
            param: None,
            code: Some("shutting_down"),
            retry_after_s: Some(5),
            close: false,
        }
    }

    /// The client took longer than `--body-timeout` to send its body (408; the connection is
    /// closed).
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("request_timeout"),
            close: true,
            ..Self::malformed(format!(
                "the request body did not arrive within {} s (--body-timeout)",
                timeout.as_secs_f64()
            ))
        }
    }

    /// The client sent part of a request head and then nothing more within
    /// `--header-timeout` (408; the connection is closed).
    pub fn header_timeout(timeout: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("request_timeout"),
            close: true,
            ..Self::malformed(format!(
                "the request line and headers did not arrive within {} s (--header-timeout)",
                timeout.as_secs_f64()
            ))
        }
    }

    /// A POST body that is not declared as JSON (415).
    pub fn not_json(content_type: Option<&str>) -> Self {
        let given = content_type.map_or_else(|| "none".to_owned(), |t| format!("{t:?}"));
        Self {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: Some("unsupported_media_type"),
            ..Self::malformed(format!(
                "the request body must be sent with `Content-Type: application/json` (given: {given})"
            ))
        }
    }

    /// A `Host` header naming another machine while no API key is set (403): a page from
    /// another site reaching a local server through DNS rebinding.
    pub fn host_not_allowed(host: &str) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            code: Some("host_not_allowed"),
            ..Self::malformed(format!(
                "Host {host:?} is not this server: without --api-key only localhost, 127.0.0.1, \
                 [::1] and the address the server listens on are answered (see --allow-host)"
            ))
        }
    }

    /// A request target longer than the server reads (414).
    pub fn uri_too_long(len: usize, limit: usize) -> Self {
        Self {
            status: StatusCode::URI_TOO_LONG,
            code: Some("uri_too_long"),
            close: true,
            ..Self::malformed(format!(
                "the request target is {len} bytes; at most {limit} are accepted"
            ))
        }
    }

    /// What the server sends for a request it cannot parse as HTTP/1.1 (hyper's own status:
    /// 400 for a bad request line or header, 414, 431), before closing the connection.
    pub fn unparsable(status: StatusCode) -> Self {
        let (code, message) = match status {
            StatusCode::URI_TOO_LONG => ("uri_too_long", "the request target is too long"),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => (
                "headers_too_large",
                "the request line and headers are larger than the server reads (64 KiB) or \
                 number more than 100",
            ),
            _ => (
                "bad_request",
                "the request is not valid HTTP/1.1 (bad request line or header)",
            ),
        };
        Self {
            status,
            code: Some(code),
            close: true,
            ..Self::malformed(message)
        }
    }

    /// Every connection is busy with a request (503).
    pub fn too_many_connections(limit: usize) -> Self {
        Self {
            code: Some("too_many_connections"),
            retry_after_s: Some(1),
            close: true,
            ..Self::shutting_down()
        }
        .with_message(format!(
            "the server is busy: all {limit} connections (--max-connections) have a request in \
             progress; retry later"
        ))
    }

    fn with_message(mut self, message: String) -> Self {
        self.message = message;
        self
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
            retry_after_s: None,
            close: false,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after_s: None,
            close: false,
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
            RuntimeError::EmptyPrompt | RuntimeError::Image(_) => {
                Self::invalid(param, err.to_string())
            }
            RuntimeError::PromptTooLong { .. }
            | RuntimeError::Text(TextError::TooManyTokens { .. }) => {
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
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(seconds) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
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

    #[error("{}: the model's image input cannot be read", path.display())]
    ImageInput {
        path: PathBuf,
        #[source]
        source: spindle_vision::VisionError,
    },
}
