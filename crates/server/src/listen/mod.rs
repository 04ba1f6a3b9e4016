//! Accepting connections and speaking HTTP/1.1 on them, through hyper's connection builder:
//! a deadline for each request head (408 when part of one came and then stalled; an idle
//! keep-alive connection is just closed), a limit on open connections that makes room by
//! closing the one idle the longest, OpenAI error bodies for the requests hyper refuses
//! itself, and a graceful stop.

mod connections;
mod error_bodies;
mod socket;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http_body::Frame;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::ServiceExt;

use connections::{Busy, Connection, Connections};
use socket::ClientSocket;

use crate::error::ApiError;

/// The largest request head (request line and headers) read; beyond it, 431.
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// The most header fields a request may carry; beyond it, 431.
pub const MAX_HEADERS: usize = 100;

/// How connections are held to account.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Time a connection has for each complete request head, counted from when it opened or
    /// its previous answer was sent; then it is closed.
    pub header_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// After the stop, how long connections may take to finish before they are dropped.
    pub drain: Duration,
}

/// The address a connection was accepted on (its local end), for the `Host` check.
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// Serves `router` on `listener` until `stop` resolves; then stops accepting, closes idle
/// connections, lets busy ones finish their request and returns once all are closed (or
/// `limits.drain` has passed).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES);
    let builder = Arc::new(builder);
    let max_connections = fit_descriptor_limit(limits.max_connections);
    let registry = Connections::new();
    let mut tasks = JoinSet::new();
    tokio::pin!(stop);
    'accepting: loop {
        let stream = tokio::select! {
            biased;
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a connection reset before it was
                    // accepted: make room if that can help, and go on.
                    tracing::warn!("accepting a connection failed: {e}");
                    if is_out_of_descriptors(&e) && registry.evict_longest_idle() {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    continue;
                }
            },
        };
        while registry.len() >= max_connections && !registry.evict_longest_idle() {
            // Every connection has a request in progress: wait for one to finish.
            tokio::select! {
                biased;
                () = &mut stop => break 'accepting,
                _ = tokio::time::timeout(Duration::from_millis(50), registry.left.notified()) => {}
            }
        }
        while tasks.try_join_next().is_some() {}
        let (id, connection) = registry.add();
        tasks.spawn(serve_connection(
            stream,
            router.clone(),
            Arc::clone(&builder),
            limits.header_timeout,
            Arc::clone(&registry),
            id,
            connection,
        ));
    }
    drop(listener);
    registry.close_all();
    let all_closed = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(limits.drain, all_closed)
        .await
        .is_err()
    {
        tracing::warn!(
            "{} connections still open {:?} after the stop; dropping them",
            registry.len(),
            limits.drain
        );
        tasks.abort_all();
    }
}

/// Descriptors kept free for everything but client connections (model files, the listener,
/// blocking threads' needs).
const SPARE_DESCRIPTORS: u64 = 64;

/// The connection limit this process's descriptor limit can hold: raises the soft limit
/// towards the hard one if needed, and lowers `max_connections` (with a warning) when even
/// that is too few, so the limit is met before `accept` runs out of descriptors.
fn fit_descriptor_limit(max_connections: usize) -> usize {
    #[cfg(unix)]
    {
        let want = max_connections as u64 + SPARE_DESCRIPTORS;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct passed by pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return max_connections;
        }
        if limit.rlim_cur < want && limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: want.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            // SAFETY: setrlimit reads only the struct passed by pointer.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                limit = raised;
            }
        }
        let fits = limit.rlim_cur.saturating_sub(SPARE_DESCRIPTORS).max(1);
        if fits < max_connections as u64 {
            tracing::warn!(
                "--max-connections {max_connections} lowered to {fits}: the descriptor limit is \
                 {} ({SPARE_DESCRIPTORS} kept spare)",
                limit.rlim_cur
            );
            return fits as usize;
        }
    }
    max_connections
}

fn is_out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// A boxed response future, so the connection can be polled without shutting its socket
/// (hyper's `poll_without_shutdown` needs an `Unpin` service future).
type Responding = Pin<Box<dyn Future<Output = Result<hyper::Response<Body>, Infallible>> + Send>>;

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    builder: Arc<http1::Builder>,
    header_timeout: Duration,
    registry: Arc<Connections>,
    id: u64,
    connection: Arc<Connection>,
) {
    let local = stream.local_addr().ok();
    let io = TokioIo::new(ClientSocket::new(stream, Arc::clone(&connection)));
    let service = {
        let (registry, connection) = (Arc::clone(&registry), Arc::clone(&connection));
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = registry.busy(&connection);
            if let Some(local) = local {
                request.extensions_mut().insert(LocalAddr(local));
            }
            let router = router.clone();
            Box::pin(async move {
                let response = router.oneshot(request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(BusyBody { body, _busy: busy })))
            }) as Responding
        })
    };
    let mut served = builder.serve_connection(io, service);
    let mut closing = false;
    let result = loop {
        tokio::select! {
            result = std::future::poll_fn(|cx| served.poll_without_shutdown(cx)) => break result,
            () = connection.close.notified(), if !closing => {
                // Idle: its socket closed now (freeing the descriptor); busy or just answered:
                // closed once its answer is sent.
                if registry.can_drop(&connection) {
                    registry.remove(id);
                    return;
                }
                closing = true;
                Pin::new(&mut served).graceful_shutdown();
            }
        }
    };
    let parts = served.into_parts();
    let mut socket = parts.io.into_inner();
    match result {
        // Part of a request head arrived, then nothing more in time: say so before closing.
        // (An idle keep-alive connection, with no bytes waiting, is just closed.)
        Err(e) if e.is_timeout() && !parts.read_buf.is_empty() => {
            tracing::debug!(
                "closing a connection whose request head stalled after {} bytes",
                parts.read_buf.len()
            );
            let answer = error_bodies::render(&ApiError::header_timeout(header_timeout));
            // A client that does not read its answer does not hold the connection open.
            let _ = tokio::time::timeout(SEND_TIMEOUT, socket.send_and_close(&answer)).await;
        }
        Err(e) => tracing::debug!("connection closed: {e}"),
        Ok(()) => {
            let _ = tokio::time::timeout(SEND_TIMEOUT, socket.close()).await;
        }
    }
    registry.remove(id);
}

/// How long a closing connection may take to send its last bytes.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// A response body that keeps its connection marked busy until it is sent (or dropped).
struct BusyBody {
    body: Body,
    _busy: Busy,
}

impl http_body::Body for BusyBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
