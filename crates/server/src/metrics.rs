//! Counters and gauges, rendered in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_runtime::batch::{Histogram, HistogramSnapshot, SchedulerStats};
use spindle_runtime::{Completion, Finish};

use crate::queue::Scheduler;

/// Where the expert-cache hit rate comes from. The expert streaming work implements this over
/// its slot cache; until then every expert is resident and [`AllResident`] reports 1.0.
pub trait ExpertCacheProbe: Send + Sync {
    /// Hits over lookups since start, in [0, 1].
    fn hit_rate(&self) -> f64;
}

/// Every expert in memory: every lookup hits.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllResident;

impl ExpertCacheProbe for AllResident {
    fn hit_rate(&self) -> f64 {
        1.0
    }
}

/// The engine's own expert counters: slot-cache hits over lookups for streamed experts (1.0
/// before any lookup, and always for resident or mapped experts, which never miss).
pub struct EngineExperts(pub std::sync::Arc<spindle_cpu::experts::ExpertCounters>);

impl ExpertCacheProbe for EngineExperts {
    fn hit_rate(&self) -> f64 {
        self.0.snapshot().hit_rate()
    }
}

/// The generating APIs the latency histograms are labelled by (`api="..."`).
pub const APIS: [&str; 5] = ["chat", "completions", "messages", "responses", "ollama"];

/// The API a route belongs to, for the latency histograms: `/v1/chat/completions` is `chat`,
/// `/v1/completions` `completions`, `/v1/messages` `messages` (Anthropic), `/v1/responses`
/// `responses`, `/api/chat` and `/api/generate` `ollama`; `None` for the rest.
pub fn api_of(route: &str) -> Option<&'static str> {
    match route {
        "/v1/chat/completions" => Some("chat"),
        "/v1/completions" => Some("completions"),
        "/v1/messages" => Some("messages"),
        "/v1/responses" => Some("responses"),
        "/api/chat" | "/api/generate" => Some("ollama"),
        _ => None,
    }
}

/// Upper bounds of the latency histograms, seconds.
const LATENCY_BOUNDS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// One API's latency histograms.
struct ApiLatency {
    /// From the request's arrival to the end of its response body (the last streamed event).
    duration: Histogram,
    /// From the request's arrival to its first generated text.
    first_token: Histogram,
}

#[derive(Default)]
pub struct Metrics {
    /// Per API of [`APIS`], in that order (built on first use).
    latency: std::sync::OnceLock<Vec<ApiLatency>>,
    /// (endpoint, HTTP status) -> requests answered.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cancelled: AtomicU64,
    /// f64 bits of the last request's decode tokens/s.
    last_decode_tps: AtomicU64,
    /// f64 bits of the last request's prefill tokens/s.
    last_prefill_tps: AtomicU64,
}

impl Metrics {
    fn latency(&self, api: &str) -> Option<&ApiLatency> {
        let all = self.latency.get_or_init(|| {
            APIS.iter()
                .map(|_| ApiLatency {
                    duration: Histogram::new(&LATENCY_BOUNDS),
                    first_token: Histogram::new(&LATENCY_BOUNDS),
                })
                .collect()
        });
        APIS.iter().position(|a| *a == api).map(|n| &all[n])
    }

    /// A request of `api` ([`APIS`]) answered in `elapsed` (its whole body sent or dropped).
    pub fn record_duration(&self, api: &str, elapsed: Duration) {
        if let Some(l) = self.latency(api) {
            l.duration.observe(elapsed.as_secs_f64());
        }
    }

    /// A request of `api` ([`APIS`]) got its first generated text `elapsed` after it arrived.
    pub fn record_first_token(&self, api: &str, elapsed: Duration) {
        if let Some(l) = self.latency(api) {
            l.first_token.observe(elapsed.as_secs_f64());
        }
    }

    pub fn record_request(&self, endpoint: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry((endpoint.to_owned(), status)).or_default() += 1;
    }

    /// Counts one finished generation.
    pub fn record_generation(&self, completion: &Completion) {
        self.prompt_tokens
            .fetch_add(completion.prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(completion.ids.len() as u64, Ordering::Relaxed);
        if completion.finish == Finish::Cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        self.last_prefill_tps.store(
            completion.prefill_tokens_per_s().to_bits(),
            Ordering::Relaxed,
        );
        if completion.ids.len() > 1 {
            self.last_decode_tps.store(
                completion.decode_tokens_per_s().to_bits(),
                Ordering::Relaxed,
            );
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(
        &self,
        scheduler: &Scheduler,
        engine: &SchedulerStats,
        experts: &Arc<dyn ExpertCacheProbe>,
    ) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let plain = |v: String| vec![(String::new(), v)];
        let requests: Vec<(String, String)> = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((endpoint, status), n)| {
                let labels = format!("{{endpoint=\"{endpoint}\",status=\"{status}\"}}");
                (labels, n.to_string())
            })
            .collect();
        metric(
            "spindle_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status.",
            &requests,
        );
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        let load_f = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed)).to_string();
        metric(
            "spindle_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            &plain(load(&self.prompt_tokens)),
        );
        metric(
            "spindle_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &plain(load(&self.generated_tokens)),
        );
        metric(
            "spindle_cancelled_generations_total",
            "counter",
            "Generations stopped early (client disconnected or server shutting down).",
            &plain(load(&self.cancelled)),
        );
        metric(
            "spindle_decode_tokens_per_second",
            "gauge",
            "Decode speed of the last finished generation.",
            &plain(load_f(&self.last_decode_tps)),
        );
        metric(
            "spindle_prefill_tokens_per_second",
            "gauge",
            "Prefill speed of the last finished generation.",
            &plain(load_f(&self.last_prefill_tps)),
        );
        metric(
            "spindle_queue_depth",
            "gauge",
            "Requests waiting for a generation slot.",
            &plain(scheduler.waiting().to_string()),
        );
        metric(
            "spindle_queue_capacity",
            "gauge",
            "Requests that may wait for a slot (--queue).",
            &plain(scheduler.queue_capacity().to_string()),
        );
        metric(
            "spindle_active_sessions",
            "gauge",
            "Sessions generating now.",
            &plain(scheduler.active().to_string()),
        );
        metric(
            "spindle_parallel_sessions",
            "gauge",
            "Sessions that may generate at once (--parallel).",
            &plain(scheduler.parallel().to_string()),
        );
        metric(
            "spindle_expert_cache_hit_rate",
            "gauge",
            "Routed-expert lookups served from memory, over all lookups (1 when all resident).",
            &plain(experts.hit_rate().to_string()),
        );
        metric(
            "spindle_running_sequences",
            "gauge",
            "Sequences in the engine's batch (being prefilled or decoded).",
            &plain(engine.running().to_string()),
        );
        metric(
            "spindle_waiting_sequences",
            "gauge",
            "Requests admitted and waiting to join the batch (for a slot or for memory).",
            &plain((scheduler.waiting() + engine.waiting()).to_string()),
        );
        metric(
            "spindle_state_bytes",
            "gauge",
            "Bytes the running sequences' states hold (KV caches, GDN and PLE states).",
            &plain(engine.state_bytes().to_string()),
        );
        metric(
            "spindle_batch_steps_total",
            "counter",
            "Batched forward steps run.",
            &plain(engine.steps().to_string()),
        );
        metric(
            "spindle_preemptions_total",
            "counter",
            "Sequences preempted for state memory (--state-memory) and recomputed later.",
            &plain(engine.preemptions().to_string()),
        );
        // The KV block pool (the CPU's in host memory, CUDA's on the device).
        if let Some(kv) = engine.kv_blocks() {
            for (name, help, value) in [
                (
                    "spindle_kv_blocks_used",
                    "KV cache blocks in use (by running sequences and the prefix cache), each counted once.",
                    kv.used,
                ),
                (
                    "spindle_kv_blocks_free",
                    "KV cache blocks the pool can still hand out (--kv-pool).",
                    kv.free(),
                ),
                (
                    "spindle_kv_blocks_shared",
                    "KV cache blocks referenced more than once (a cached prefix shared by sequences).",
                    kv.shared,
                ),
                (
                    "spindle_kv_block_bytes",
                    "Bytes of one KV cache block (16 tokens of every attention layer's keys and values).",
                    kv.block_bytes,
                ),
            ] {
                metric(name, "gauge", help, &plain(value.to_string()));
            }
        }
        let prefix = engine.prefix.snapshot();
        for (name, kind, help, value) in [
            (
                "spindle_prefix_cache_enabled",
                "gauge",
                "1 when requests share a prefix cache (off: --no-prefix-cache).",
                prefix.enabled as u64,
            ),
            (
                "spindle_prefix_cache_hit_tokens_total",
                "counter",
                "Prompt tokens restored from the prefix cache instead of prefilled.",
                prefix.hit_tokens,
            ),
            (
                "spindle_prefix_cache_miss_tokens_total",
                "counter",
                "Prompt tokens prefilled (not found in the prefix cache).",
                prefix.miss_tokens,
            ),
            (
                "spindle_prefix_cache_bytes",
                "gauge",
                "Bytes the prefix cache holds (KV rows and GDN/PLE state snapshots).",
                prefix.bytes,
            ),
            (
                "spindle_prefix_cache_entries",
                "gauge",
                "Snapshots in the prefix cache (prefixes a request can resume from).",
                prefix.entries,
            ),
            (
                "spindle_prefix_cache_evictions_total",
                "counter",
                "Prefix cache entries evicted for memory (--prefix-cache).",
                prefix.evictions,
            ),
        ] {
            metric(name, kind, help, &plain(value.to_string()));
        }
        let histograms = [
            (
                "spindle_batch_size",
                "Sequences in each batched step.",
                engine.batch_size.snapshot(),
            ),
            (
                "spindle_step_tokens",
                "Tokens fed in each batched step (decode tokens plus prompt chunks).",
                engine.step_tokens.snapshot(),
            ),
            (
                "spindle_time_to_first_token_seconds",
                "From a sequence's submission to its first generated token.",
                engine.time_to_first_token.snapshot(),
            ),
            (
                "spindle_inter_token_latency_seconds",
                "Between consecutive generated tokens of a sequence.",
                engine.inter_token_latency.snapshot(),
            ),
        ];
        for (name, help, h) in histograms {
            render_histogram(&mut out, name, help, &h);
        }
        let by_api = |pick: fn(&ApiLatency) -> &Histogram| -> Vec<(String, HistogramSnapshot)> {
            APIS.iter()
                .filter_map(|api| {
                    self.latency(api)
                        .map(|l| (api.to_string(), pick(l).snapshot()))
                })
                .collect()
        };
        render_labelled_histograms(
            &mut out,
            "spindle_request_duration_seconds",
            "From a generating request's arrival to the end of its response (the last streamed event), by API.",
            &by_api(|l| &l.duration),
        );
        render_labelled_histograms(
            &mut out,
            "spindle_api_time_to_first_token_seconds",
            "From a generating request's arrival to its first generated text, by API.",
            &by_api(|l| &l.first_token),
        );
        out
    }
}

/// Histograms of one name, one per `api` label, in the Prometheus text format.
fn render_labelled_histograms(
    out: &mut String,
    name: &str,
    help: &str,
    series: &[(String, HistogramSnapshot)],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (api, h) in series {
        for (bound, n) in h.bounds.iter().zip(&h.cumulative) {
            let _ = writeln!(out, "{name}_bucket{{api=\"{api}\",le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{api=\"{api}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "{name}_sum{{api=\"{api}\"}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{api=\"{api}\"}} {}", h.count);
    }
}

/// A histogram in the Prometheus text format: cumulative `_bucket` lines with `le`, then
/// `_sum` and `_count`.
fn render_histogram(out: &mut String, name: &str, help: &str, h: &HistogramSnapshot) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, n) in h.bounds.iter().zip(&h.cumulative) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum {}", h.sum);
    let _ = writeln!(out, "{name}_count {}", h.count);
}
