//! What every handler shares: the model, the queue, the metrics and the server's options.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use spindle_runtime::batch::Scheduler as BatchScheduler;
use spindle_runtime::Model;

use crate::metrics::{ExpertCacheProbe, Metrics};
use crate::queue::Scheduler;

pub struct AppState {
    pub model: Arc<Model>,
    /// How the model reads images (`vision_config`, `image_token_id`, the preprocessor's
    /// bounds); `None` for a text-only checkpoint, which refuses images.
    pub images: Option<spindle_vision::ImageInput>,
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// When the server started (Unix seconds), for `/v1/models`.
    pub created: u64,
    /// The bounded queue in front of the engine (`--parallel` slots, `--queue` places).
    pub scheduler: Arc<Scheduler>,
    /// The continuous-batching engine every generation runs in.
    pub engine: BatchScheduler,
    pub metrics: Arc<Metrics>,
    pub experts: Arc<dyn ExpertCacheProbe>,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Time a request has to send its whole body.
    pub body_timeout: std::time::Duration,
    /// Messages a chat request may hold.
    pub max_messages: usize,
    /// Host names answered besides the local ones (without an API key).
    pub allowed_hosts: Vec<String>,
    /// Origins whose browser pages may read answers (CORS); `*` for any, empty for none.
    pub cors_origins: Vec<String>,
    /// Set on shutdown: new generation requests get 503.
    pub shutting_down: AtomicBool,
    /// Set when in-flight generations must stop now (shutdown grace period over).
    pub cancel_all: Arc<AtomicBool>,
}
