//! OpenAI error bodies for the requests hyper refuses itself. A request line or header that
//! does not parse (400), a target longer than hyper reads (414) or a head larger than its
//! buffer (431) never reaches the router: hyper answers with an empty body and closes. The
//! connection's socket (`super::socket`) recognises that automatic answer (a 400, 414 or 431
//! head with `content-length: 0`, which the router never sends: its errors all carry a JSON
//! body) and sends the same status with `{"error": {...}}` instead; it also renders the 408
//! sent when a request head stalls.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use tokio::io::AsyncWrite;

use crate::error::ApiError;

/// The replacement of hyper's automatic answer being written: the bytes left, and the length
/// of hyper's write it stands for (reported once the replacement is out).
#[derive(Default)]
pub struct Replacing(Option<(Vec<u8>, usize)>);

/// Writes `buf` to `inner`, unless it is hyper's automatic parse-error answer: then the same
/// status with an OpenAI error body is written in its place (over as many calls as it takes).
pub fn poll_write_replacing<S: AsyncWrite + Unpin>(
    inner: &mut S,
    replacing: &mut Replacing,
    cx: &mut Context<'_>,
    buf: &[u8],
) -> Poll<io::Result<usize>> {
    if replacing.0.is_none() {
        match automatic_error(buf) {
            Some(status) => {
                tracing::debug!("refused an unparsable request with {status}");
                replacing.0 = Some((render(&ApiError::unparsable(status)), buf.len()));
            }
            None => return Pin::new(inner).poll_write(cx, buf),
        }
    }
    let Some((left, stands_for)) = replacing.0.as_mut() else {
        unreachable!("set above")
    };
    while !left.is_empty() {
        let n = ready!(Pin::new(&mut *inner).poll_write(cx, left))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        left.drain(..n);
    }
    let stands_for = *stands_for;
    replacing.0 = None;
    Poll::Ready(Ok(stands_for))
}

/// The status of hyper's automatic parse-error answer, when `buf` is one.
fn automatic_error(buf: &[u8]) -> Option<StatusCode> {
    let status = match buf.get(..13)? {
        b"HTTP/1.1 400 " => StatusCode::BAD_REQUEST,
        b"HTTP/1.1 414 " => StatusCode::URI_TOO_LONG,
        b"HTTP/1.1 431 " => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        _ => return None,
    };
    let head_only = buf.ends_with(b"\r\n\r\n") && buf.len() < 512;
    let empty = buf
        .windows(19)
        .any(|w| w.eq_ignore_ascii_case(b"content-length: 0\r\n"));
    (head_only && empty).then_some(status)
}

/// The full HTTP/1.1 answer for `error`, closing the connection.
pub fn render(error: &ApiError) -> Vec<u8> {
    let body = error.body().to_string();
    let reason = error.status.canonical_reason().unwrap_or("Error");
    format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        error.status.as_u16(),
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hyper_s_empty_parse_error_heads_are_replaced() {
        let auto = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 17:00:00 GMT\r\n\r\n";
        assert_eq!(
            automatic_error(auto),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 90\r\n\r\n";
        assert_eq!(automatic_error(ours), None);
        assert_eq!(
            automatic_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            None
        );
        let text =
            String::from_utf8(render(&ApiError::unparsable(StatusCode::BAD_REQUEST))).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "bad_request");
    }
}
