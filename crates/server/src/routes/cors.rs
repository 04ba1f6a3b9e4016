//! CORS for browser front ends, off unless `--cors-origins` names origins: a request whose
//! `Origin` is listed (or any, with `*`) gets `Access-Control-Allow-Origin`, and its `OPTIONS`
//! preflight is answered 204 before the API key is asked for (a preflight carries no
//! credentials). Without the option, or from another origin, nothing is added, so a browser
//! keeps the page from reading the answer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// Headers a preflight may ask for when it names none.
const ALLOWED_HEADERS: &str =
    "authorization, content-type, x-api-key, anthropic-version, anthropic-beta";

pub async fn cors(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_owned);
    let Some(origin) = origin.filter(|o| allowed(o, &state.cors_origins)) else {
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let asked = request
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or(HeaderValue::from_static(ALLOWED_HEADERS));
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let h = r.headers_mut();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("86400"),
        );
        r
    } else {
        next.run(request).await
    };
    let h = response.headers_mut();
    let any = state.cors_origins.iter().any(|o| o == "*");
    let value = if any {
        HeaderValue::from_static("*")
    } else {
        HeaderValue::from_str(&origin).unwrap_or(HeaderValue::from_static("null"))
    };
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    // So a page can read how long to wait after a 429 or 503.
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("retry-after"),
    );
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    response
}

/// True when `origin` is one of `allowed` (exactly, without a trailing slash) or `*` is.
fn allowed(origin: &str, allowed: &[String]) -> bool {
    allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_exactly_or_by_star() {
        let list = vec!["http://localhost:3000/".to_owned()];
        assert!(allowed("http://localhost:3000", &list));
        assert!(!allowed("http://localhost:3001", &list));
        assert!(!allowed("http://evil.example", &list));
        assert!(allowed("http://evil.example", &["*".to_owned()]));
        assert!(!allowed("http://localhost:3000", &[]));
    }
}
