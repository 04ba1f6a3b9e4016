//! Per-API latency: each generating request's API and arrival time, known to the code that
//! submits its generation (a task-local set by the request-counting middleware), and a
//! response body that records the request's duration when it ends (sent in full, or dropped
//! by a client that left).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};

use crate::metrics::Metrics;

/// Which API a request came through and when it arrived.
#[derive(Clone, Copy, Debug)]
pub struct RequestOrigin {
    pub api: &'static str,
    pub arrived: Instant,
}

tokio::task_local! {
    static ORIGIN: RequestOrigin;
}

/// Runs `future` (a request's handler) with `origin` known to [`current_origin`].
pub async fn with_origin<F: std::future::Future>(origin: RequestOrigin, future: F) -> F::Output {
    ORIGIN.scope(origin, future).await
}

/// The origin of the request being handled, when it is a generating API's.
pub fn current_origin() -> Option<RequestOrigin> {
    ORIGIN.try_with(|o| *o).ok()
}

/// A response body that records its request's duration when it ends.
pub struct TimedBody {
    inner: Body,
    origin: RequestOrigin,
    metrics: Option<Arc<Metrics>>,
}

impl TimedBody {
    pub fn wrap(inner: Body, origin: RequestOrigin, metrics: Arc<Metrics>) -> Body {
        Body::new(Self {
            inner,
            origin,
            metrics: Some(metrics),
        })
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.record_duration(self.origin.api, self.origin.arrived.elapsed());
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
