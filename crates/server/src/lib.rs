//! An OpenAI-compatible HTTP API over the spindle runtime: `/v1/chat/completions` (streaming,
//! tools, reasoning), `/v1/completions`, `/v1/models`, `/health` and `/metrics`, with an
//! optional API key, a request-size limit and a bounded queue in front of the engine.
//!
//! ```no_run
//! # async fn demo() -> Result<(), spindle_server::ServerError> {
//! let (model, id) = spindle_server::open_model(None, None, &Default::default())?;
//! let server = spindle_server::Server::new(model, spindle_server::ServerConfig::new(id))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod error;
mod metrics;
mod queue;
mod request;
mod response;
mod routes;
mod sse;
mod state;
mod worker;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_runtime::{demo_dir, Device, Model, DEMO_MODEL_ID};
use tokio::net::TcpListener;

pub use error::{ApiError, ServerError};
pub use metrics::{AllResident, EngineExperts, ExpertCacheProbe};
pub use spindle_runtime;

use metrics::Metrics;
use queue::Scheduler;
use state::AppState;

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sessions generating at once (at least 1).
    pub parallel: usize,
    /// Requests that may wait for a generation slot; more get HTTP 429.
    pub queue: usize,
    /// Largest request body accepted; larger gets HTTP 413.
    pub max_body_bytes: usize,
    /// On shutdown, how long in-flight generations may run before they are cancelled.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    pub fn new(model_id: impl Into<String>) -> Self {
        Self {
            model_id: model_id.into(),
            api_key: None,
            parallel: 1,
            queue: 16,
            max_body_bytes: 4 << 20,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Opens the model to serve: `dir`, or the embedded demo checkpoint when `None`, loaded with
/// `options` (weight format, expert residency) on the CPU. The id is `model_id`, else the
/// directory's name (`spindle-demo` for the demo).
pub fn open_model(
    dir: Option<&Path>,
    model_id: Option<String>,
    options: &spindle_cpu::LoadOptions,
) -> Result<(Arc<Model>, String), ServerError> {
    open_model_on(dir, model_id, options, Device::Cpu)
}

/// [`open_model`] on `device` (a CUDA GPU in a build whose runtime has the `cuda` feature).
pub fn open_model_on(
    dir: Option<&Path>,
    model_id: Option<String>,
    options: &spindle_cpu::LoadOptions,
    device: Device,
) -> Result<(Arc<Model>, String), ServerError> {
    let (dir, default_id) = match dir {
        Some(dir) => {
            let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
            let name = canonical
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            (dir.to_owned(), name)
        }
        None => (demo_dir()?, Some(DEMO_MODEL_ID.to_owned())),
    };
    let id = match model_id.or(default_id) {
        Some(id) if !id.is_empty() => id,
        _ => return Err(ServerError::NoModelId { path: dir }),
    };
    let model = Model::load_on(&dir, device, options)?;
    Ok((Arc::new(model), id))
}

/// A server over one model, ready to serve on a listener.
pub struct Server {
    state: Arc<AppState>,
    shutdown_grace: Duration,
}

impl Server {
    /// A server whose `/metrics` reports the model's own expert-cache hit rate (1 on CUDA,
    /// which keeps every expert in GPU memory).
    pub fn new(model: Arc<Model>, config: ServerConfig) -> Result<Self, ServerError> {
        let probe: Arc<dyn ExpertCacheProbe> = match model.backend.expert_counters() {
            Some(counters) => Arc::new(metrics::EngineExperts(counters)),
            None => Arc::new(AllResident),
        };
        Self::with_expert_probe(model, config, probe)
    }

    /// Like [`Server::new`], with the source of `spindle_expert_cache_hit_rate`.
    pub fn with_expert_probe(
        model: Arc<Model>,
        config: ServerConfig,
        experts: Arc<dyn ExpertCacheProbe>,
    ) -> Result<Self, ServerError> {
        if config.parallel == 0 {
            return Err(ServerError::Option(
                "--parallel is 0 but at least one session must be able to generate".into(),
            ));
        }
        if config.max_body_bytes == 0 {
            return Err(ServerError::Option(
                "--max-body-bytes must be positive".into(),
            ));
        }
        if config.api_key.as_deref() == Some("") {
            return Err(ServerError::Option("--api-key must not be empty".into()));
        }
        let state = AppState {
            model,
            model_id: config.model_id,
            created: response::now_s(),
            scheduler: Scheduler::new(config.parallel, config.queue),
            metrics: Metrics::default(),
            experts,
            api_key: config.api_key,
            max_body_bytes: config.max_body_bytes,
            shutting_down: AtomicBool::new(false),
            cancel_all: AtomicBool::new(false),
        };
        Ok(Self {
            state: Arc::new(state),
            shutdown_grace: config.shutdown_grace,
        })
    }

    /// The HTTP routes, for serving on a listener of the caller's choosing.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.state))
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight generations run
    /// for the grace period, cancels what is left and returns once every connection is done.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let state = Arc::clone(&self.state);
        let grace = self.shutdown_grace;
        let stopping = async move {
            shutdown.await;
            tracing::info!("shutting down: no new requests; in-flight ones have {grace:?}");
            state.shutting_down.store(true, Ordering::Release);
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                state.cancel_all.store(true, Ordering::Release);
            });
        };
        axum::serve(listener, self.router())
            .with_graceful_shutdown(stopping)
            .await
            .map_err(ServerError::Serve)
    }
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
