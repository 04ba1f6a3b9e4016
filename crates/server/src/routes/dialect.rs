//! Error bodies in the dialect of the API a route speaks: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` everywhere but Anthropic's routes
//! (`/v1/messages...`: `{"type": "error", "error": {"type", "message"}}`) and Ollama's
//! (`/api/...`: `{"error": "message"}`). Every [`crate::ApiError`] is built in OpenAI's shape
//! and rewritten here, so refusals from the middleware (401, 413, 429, ...) read right too.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

/// The API a path belongs to, by its error dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Dialect {
    pub fn of(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Dialect::Anthropic
        } else if path.starts_with("/api/") {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }

    /// `body` (OpenAI's error body) in this dialect, for an answer with `status`.
    pub fn error_body(self, status: StatusCode, body: &Value) -> Value {
        let error = &body["error"];
        let mut message = error["message"].as_str().unwrap_or("").to_owned();
        if let Some(param) = error["param"].as_str() {
            if !message.contains(param) {
                message = format!("{param}: {message}");
            }
        }
        match self {
            Dialect::OpenAi => body.clone(),
            Dialect::Ollama => json!({"error": message}),
            Dialect::Anthropic => json!({
                "type": "error",
                "error": {"type": anthropic_type(status), "message": message},
            }),
        }
    }
}

/// Anthropic's error `type` for an HTTP status.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Rewrites error answers of Anthropic and Ollama routes into their dialect.
pub async fn errors_in_dialect(request: Request, next: Next) -> Response {
    let dialect = Dialect::of(request.uri().path());
    let response = next.run(request).await;
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if dialect == Dialect::OpenAi || response.status().is_success() || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Error bodies are small JSON objects built by this server.
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let rewritten = match serde_json::from_slice::<Value>(&bytes) {
        Ok(value) if value.get("error").is_some_and(Value::is_object) => {
            dialect.error_body(parts.status, &value).to_string()
        }
        _ => return Response::from_parts(parts, Body::from(bytes)),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_in_each_dialect() {
        let body = json!({"error": {"message": "must be at least 1", "type": "invalid_request_error",
                                    "param": "max_tokens", "code": null}});
        assert_eq!(Dialect::of("/v1/messages/count_tokens"), Dialect::Anthropic);
        assert_eq!(Dialect::of("/api/chat"), Dialect::Ollama);
        assert_eq!(Dialect::of("/v1/chat/completions"), Dialect::OpenAi);
        assert_eq!(
            Dialect::Anthropic.error_body(StatusCode::BAD_REQUEST, &body),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "max_tokens: must be at least 1"}})
        );
        assert_eq!(
            Dialect::Ollama.error_body(StatusCode::BAD_REQUEST, &body),
            json!({"error": "max_tokens: must be at least 1"})
        );
        let busy = Dialect::Anthropic.error_body(StatusCode::TOO_MANY_REQUESTS, &body);
        assert_eq!(busy["error"]["type"], "rate_limit_error");
    }

    #[tokio::test]
    async fn rewritten_refusals_keep_status_and_retry_after() {
        use tower::ServiceExt;
        let busy = || async { crate::ApiError::queue_full(3) };
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(busy))
            .route("/api/chat", axum::routing::post(busy))
            .route("/v1/chat/completions", axum::routing::post(busy))
            .layer(axum::middleware::from_fn(errors_in_dialect));
        let mut bodies = Vec::new();
        for path in ["/v1/messages", "/api/chat", "/v1/chat/completions"] {
            let request = Request::post(path).body(Body::empty()).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
            assert_eq!(response.headers()[header::RETRY_AFTER], "1", "{path}");
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            bodies.push(serde_json::from_slice::<Value>(&bytes).unwrap());
        }
        assert_eq!(bodies[0]["type"], "error");
        assert_eq!(bodies[0]["error"]["type"], "rate_limit_error");
        assert!(
            bodies[1]["error"].as_str().unwrap().contains("busy"),
            "{}",
            bodies[1]
        );
        assert_eq!(bodies[2]["error"]["code"], "queue_full");
    }
}
