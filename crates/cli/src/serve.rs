//! `spindle serve`: the OpenAI-compatible HTTP server (crates/server) on one model.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use spindle_runtime::Device;
use spindle_server::{open_model_on, shutdown_signal, PrefixCacheOptions, Server, ServerConfig};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (a Hugging Face checkpoint or a spindle install) or a GGUF file. Without it, the
    /// embedded demo model (random weights) is served.
    #[arg(long)]
    model: Option<PathBuf>,

    #[command(flatten)]
    load: crate::load_args::LoadArgs,
    /// Backend to run on: cpu, or (in a build with the `cuda` feature) cuda or cuda:N (CUDA GPU
    /// N; Hugging Face checkpoints only, every expert in GPU memory).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Address to listen on. The default serves this machine only; use 0.0.0.0 to listen on
    /// every interface (then set --api-key).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint except /health. The
    /// SPINDLE_API_KEY environment variable is used when this is not given (it keeps the key
    /// out of the process list).
    #[arg(long)]
    api_key: Option<String>,
    /// Sequences generating at once: the most the continuous-batching scheduler runs in one
    /// forward step. Requests beyond it wait in the queue.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Tokens one batched step feeds at most: each running sequence's next token first, then
    /// chunks of the prompts being prefilled (a long prompt is spread over several steps, so
    /// it never stalls the others' next token). Raised to --parallel when below it.
    #[arg(long, default_value_t = 1024)]
    token_budget: usize,
    /// Requests that may wait for a free session; beyond that the server answers 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Bytes of sequence state (KV caches, GDN and PLE state) the running sequences may hold at
    /// once: beyond it new requests wait, and the sequence admitted last is preempted (freed,
    /// then recomputed when memory allows). Default: no limit beyond the device's memory.
    #[arg(long, value_name = "BYTES")]
    state_memory: Option<u64>,
    /// Bytes the prefix cache may hold: the KV rows and GDN/PLE state snapshots of earlier
    /// requests, so a request that starts with a prefix served before (a system prompt, a
    /// chat's history) prefills only the rest. Least recently used entries are evicted past
    /// it. Default: a quarter of the memory available once the model is loaded (MemAvailable,
    /// or the cgroup limit when lower); on CUDA, where the cache lives in device memory (a
    /// piece the GPU has no room for goes to the host), at most a quarter of the free device
    /// memory. qwen4_exp on CUDA runs without a cache.
    #[arg(long, value_name = "BYTES", conflicts_with = "no_prefix_cache")]
    prefix_cache: Option<u64>,
    /// Serve without a prefix cache: every request is prefilled from nothing.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Tokens between prefix-cache snapshots of a long prompt (a prompt is also snapshotted
    /// before each chat turn marker and at its end, and a sequence when it finishes).
    #[arg(long, value_name = "TOKENS", default_value_t = spindle_server::spindle_runtime::prefix::DEFAULT_INTERVAL)]
    prefix_cache_interval: usize,
    /// Largest request body in bytes; larger bodies get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// The model id /v1/models lists and responses carry (default: the directory's name, or
    /// `spindle-demo`). Requests may name any model: the one model is served.
    #[arg(long)]
    model_id: Option<String>,
    /// Seconds in-flight generations may run after SIGTERM/Ctrl-C before they are cancelled.
    #[arg(long, default_value_t = 5.0)]
    shutdown_grace: f64,
    /// Seconds a connection has to send each complete request head, counted from when it
    /// opened or its previous answer was sent; then it is closed (slow senders and idle
    /// keep-alive connections).
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a request has to send its whole body once its head is in; then 408.
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Connections open at once; at the limit the one idle the longest is closed to make room
    /// (with every connection busy, a new one waits).
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Messages a chat request may hold; more get 400.
    #[arg(long, default_value_t = 2048)]
    max_messages: usize,
    /// A host name (the `Host` header) to answer besides localhost, 127.0.0.1, [::1] and the
    /// listening address, when no API key is set (DNS-rebinding protection). Repeatable.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// Origins whose browser pages may call the API (CORS), comma-separated, or `*` for any
    /// (then set --api-key). Off by default.
    #[arg(long, value_name = "ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
}

/// A positive number of seconds from an option.
fn seconds(value: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} must be a positive number of seconds, not {value}"))
}

/// `--api-key`, else `SPINDLE_API_KEY`; a variable that is set but empty is refused by name
/// (it would otherwise be mistaken for "no key").
fn api_key(flag: Option<&str>) -> anyhow::Result<Option<String>> {
    if let Some(key) = flag {
        anyhow::ensure!(!key.is_empty(), "--api-key must not be empty");
        return Ok(Some(key.to_owned()));
    }
    match std::env::var("SPINDLE_API_KEY") {
        Ok(key) if key.is_empty() => anyhow::bail!(
            "SPINDLE_API_KEY is set but empty: give it a key, or unset it to serve without one"
        ),
        Ok(key) => Ok(Some(key)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("SPINDLE_API_KEY is not valid UTF-8")
        }
    }
}

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let grace = Duration::try_from_secs_f64(args.shutdown_grace)
        .context("--shutdown-grace must be a non-negative number of seconds")?;
    let header_timeout = seconds(args.header_timeout, "--header-timeout")?;
    let body_timeout = seconds(args.body_timeout, "--body-timeout")?;
    let api_key = api_key(args.api_key.as_deref())?;
    let (model, id) = open_model_on(
        args.model.as_deref(),
        args.model_id.clone(),
        &args.load.options(),
        args.device,
    )?;
    tracing::info!(device = %model.backend.describe(), "serving {id}");
    let config = ServerConfig {
        api_key,
        parallel: args.parallel,
        token_budget: args.token_budget,
        state_memory: args.state_memory,
        prefix_cache: (!args.no_prefix_cache).then(|| PrefixCacheOptions {
            bytes: args
                .prefix_cache
                .unwrap_or_else(|| model.backend.prefix_cache_default_bytes()),
            interval: args.prefix_cache_interval,
        }),
        queue: args.queue,
        max_body_bytes: args.max_body_bytes,
        shutdown_grace: grace,
        header_timeout,
        body_timeout,
        max_connections: args.max_connections,
        max_messages: args.max_messages,
        allowed_hosts: args
            .allow_hosts
            .iter()
            .chain([&args.host])
            .cloned()
            .collect(),
        cors_origins: args.cors_origins.clone(),
        ..ServerConfig::new(id.clone())
    };
    match config.prefix_cache {
        Some(p) => tracing::info!(
            "prefix cache: up to {} MiB, a snapshot every {} tokens",
            p.bytes >> 20,
            p.interval
        ),
        None => tracing::info!("no prefix cache (--no-prefix-cache)"),
    }
    let server = Server::new(model, config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr().context("no local address")?;
        println!("spindle serve: {id} on http://{local}/v1 (Ctrl-C to stop)");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        server.serve(listener, shutdown_signal()).await?;
        eprintln!("spindle serve: stopped");
        anyhow::Ok(())
    })?;
    // Generation threads still finishing a cancelled step must not hold up the exit.
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(ExitCode::SUCCESS)
}
