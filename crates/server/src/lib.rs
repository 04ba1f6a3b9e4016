//! An OpenAI-compatible HTTP API over the spindle runtime: `/v1/chat/completions` (streaming,
//! tools, reasoning), `/v1/completions`, `/v1/responses`, `/v1/models`, `/health` and
//! `/metrics`; Anthropic's `/v1/messages`; Ollama's `/api/chat`, `/api/generate`, `/api/tags`;
//! llama-server's `/tokenize`, `/detokenize`, `/apply-template`; with an optional API key,
//! CORS, a request-size limit and a bounded queue in front of the engine.
//!
//! ```no_run
//! # async fn demo() -> Result<(), spindle_server::ServerError> {
//! let (model, id) = spindle_server::open_model(None, None, &Default::default())?;
//! let server = spindle_server::Server::new(model, spindle_server::ServerConfig::new(id))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

mod api;
mod error;
mod images;
mod latency;
mod listen;
mod memory;
mod metrics;
mod queue;
mod request;
mod response;
mod routes;
mod sse;
mod state;
mod structured;
mod worker;

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_runtime::batch::{BatchConfig, Scheduler as BatchScheduler};
use spindle_runtime::prefix::PrefixCacheConfig;
use spindle_runtime::{demo_dir, Device, Model, DEMO_MODEL_ID};
use tokio::net::TcpListener;

pub use error::{ApiError, ServerError};
pub use images::engine_prompt;
pub use metrics::{AllResident, EngineExperts, ExpertCacheProbe};
pub use spindle_runtime;

use listen::ConnectionLimits;
use metrics::Metrics;
use queue::Scheduler;
use state::AppState;

/// How the server behaves.
/// The prefix cache's size and snapshot interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheOptions {
    /// Bytes of cached KV rows and states (least recently used entries evicted past it).
    pub bytes: u64,
    /// Tokens between snapshots of a long prompt (besides its chat turns and its end).
    pub interval: usize,
}

impl PrefixCacheOptions {
    /// The defaults: [`PrefixCacheConfig::default_capacity`] bytes, every
    /// [`spindle_runtime::prefix::DEFAULT_INTERVAL`] tokens.
    pub fn from_free_memory() -> Self {
        Self {
            bytes: PrefixCacheConfig::default_capacity(),
            interval: spindle_runtime::prefix::DEFAULT_INTERVAL,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sequences generating at once, batched together in each forward step (at least 1).
    pub parallel: usize,
    /// Tokens one batched step feeds at most: every running sequence's next token, then
    /// chunks of the prompts being prefilled (raised to `parallel` when below it).
    pub token_budget: usize,
    /// Bytes of sequence state (KV caches, GDN state) the running sequences may hold at once;
    /// beyond it new sequences wait and the latest admitted are preempted and recomputed later
    /// (`None`: no limit beyond the backend's memory).
    pub state_memory: Option<u64>,
    /// The prefix cache shared by every request (`--prefix-cache`); `None`: none
    /// (`--no-prefix-cache`).
    pub prefix_cache: Option<PrefixCacheOptions>,
    /// Requests that may wait for a generation slot; more get HTTP 429.
    pub queue: usize,
    /// Largest request body accepted; larger gets HTTP 413.
    pub max_body_bytes: usize,
    /// On shutdown, how long in-flight generations may run before they are cancelled.
    pub shutdown_grace: Duration,
    /// Time a connection has to send each complete request head, counted from when it opened
    /// or its previous answer was sent: closes slow senders and idle keep-alive connections.
    pub header_timeout: Duration,
    /// Time a request has to send its whole body once its head is in; then 408.
    pub body_timeout: Duration,
    /// Connections open at once; beyond it the one idle the longest is closed (or, with every
    /// connection busy, the new one waits).
    pub max_connections: usize,
    /// Messages a chat request may hold.
    pub max_messages: usize,
    /// Host names answered besides localhost, 127.0.0.1, [::1] and the listening address,
    /// when no API key is set (the DNS-rebinding check).
    pub allowed_hosts: Vec<String>,
    /// Origins whose browser pages may call the API (CORS: `Access-Control-Allow-Origin`,
    /// preflights answered); `*` for any. Empty (the default): CORS off.
    pub cors_origins: Vec<String>,
}

impl ServerConfig {
    pub fn new(model_id: impl Into<String>) -> Self {
        Self {
            model_id: model_id.into(),
            api_key: None,
            parallel: 1,
            state_memory: None,
            prefix_cache: None,
            token_budget: 1024,
            queue: 16,
            max_body_bytes: 4 << 20,
            shutdown_grace: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            max_messages: 2048,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
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
    limits: ConnectionLimits,
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
        for (name, value) in [
            ("--header-timeout", config.header_timeout),
            ("--body-timeout", config.body_timeout),
        ] {
            if value.is_zero() {
                return Err(ServerError::Option(format!("{name} must be positive")));
            }
        }
        if config.max_connections == 0 || config.max_messages == 0 {
            return Err(ServerError::Option(
                "--max-connections and --max-messages must be positive".into(),
            ));
        }
        if config.token_budget == 0 {
            return Err(ServerError::Option(
                "--token-budget must be positive".into(),
            ));
        }
        let images = spindle_vision::ImageInput::from_model_dir(&model.dir).map_err(|source| {
            ServerError::ImageInput {
                path: model.dir.clone(),
                source,
            }
        })?;
        let prefix_cache = match config.prefix_cache {
            Some(PrefixCacheOptions { bytes, interval }) => {
                if interval == 0 {
                    return Err(ServerError::Option(
                        "--prefix-cache-interval must be positive".into(),
                    ));
                }
                Some(PrefixCacheConfig::for_model(&model, bytes, interval))
            }
            None => None,
        };
        let engine = BatchScheduler::start_with_prefix_cache(
            Arc::clone(&model),
            BatchConfig {
                max_seqs: config.parallel,
                token_budget: config.token_budget.max(config.parallel),
                state_budget: config.state_memory,
            },
            prefix_cache,
        )?;
        let state = AppState {
            engine,
            images,
            model,
            model_id: config.model_id,
            created: response::now_s(),
            scheduler: Scheduler::new(config.parallel, config.queue),
            metrics: Arc::new(Metrics::default()),
            experts,
            api_key: config.api_key,
            max_body_bytes: config.max_body_bytes,
            body_timeout: config.body_timeout,
            max_messages: config.max_messages,
            allowed_hosts: config.allowed_hosts,
            cors_origins: config.cors_origins,
            shutting_down: AtomicBool::new(false),
            cancel_all: Arc::new(AtomicBool::new(false)),
        };
        let limits = ConnectionLimits {
            header_timeout: config.header_timeout,
            max_connections: config.max_connections,
            drain: config.shutdown_grace + config.body_timeout.max(config.header_timeout),
        };
        Ok(Self {
            state: Arc::new(state),
            shutdown_grace: config.shutdown_grace,
            limits,
        })
    }

    /// The HTTP routes, for serving on a listener of the caller's choosing.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.state))
    }

    /// Serves until `shutdown` resolves, then stops accepting, closes idle connections, answers
    /// new requests on open ones with 503, lets in-flight generations run for the grace
    /// period, cancels what is left and returns once every connection is closed.
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
                state.engine.cancel_all();
            });
        };
        listen::serve(listener, self.router(), self.limits, stopping).await;
        Ok(())
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
