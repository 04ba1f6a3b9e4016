//! `spindle bench`: prefill and decode speed, peak memory, and decode as a fraction of the
//! memory-bandwidth roofline measured in the same run, on any backend (the measurements are
//! `spindle_runtime::bench`'s; this prints them).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};
use spindle_cpu::Engine;
use spindle_runtime::bench::{self, BatchBenchOptions, BenchOptions, BenchReport};
use spindle_runtime::{Backend, Device, Model};

use crate::load_args::LoadArgs;
use crate::loadgen::{self, LoadOptions};
use crate::model_dir;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model directory, or a GGUF file. Default: the embedded demo.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    #[command(flatten)]
    pub load: LoadArgs,

    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,

    /// Tokens decoded for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen: usize,

    /// Measured runs (after one warm-up); medians are reported with min and max.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,

    /// Size of the buffer the bandwidth probe reads, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub probe_mib: usize,

    /// Backend to run on: cpu, or (in a build with the `cuda` feature) cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: Device,

    /// CUDA: context lengths decode is measured after, comma-separated (default: --prompt).
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub context: Vec<usize>,

    /// CUDA: run only the first N layers of the model (per-layer costs of a truncated model).
    #[arg(long, value_name = "N")]
    pub layers: Option<usize>,

    /// Batched decode: aggregate decode tok/s with B sequences per forward step, for each B
    /// (comma-separated; B=1 is always measured, as the baseline of the ratios). Replaces
    /// the prefill/decode report.
    #[arg(long, value_delimiter = ',', value_name = "B,...")]
    pub batch: Vec<usize>,

    /// With --batch: also decode every sequence under this JSON Schema (structured output)
    /// through the scheduler, reporting constrained over free tok/s and the grammar mask's
    /// time per token.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,

    /// Load-generate against a running server at this URL (http://HOST:PORT) instead of
    /// loading a model: streamed chat requests, reporting aggregate tok/s, time to first
    /// token and inter-token latency per --clients count.
    #[arg(long, value_name = "URL")]
    pub serve: Option<String>,

    /// With --serve: concurrent clients, one measurement per count (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "N,...", default_value = "1")]
    pub clients: Vec<usize>,

    /// With --serve: words in each request's prompt.
    #[arg(long, default_value_t = 200)]
    pub prompt_words: usize,

    /// With --serve: max_tokens of each request (temperature 0).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,

    /// With --serve: requests each client sends, one after another.
    #[arg(long, default_value_t = 2)]
    pub requests: usize,

    /// With --serve: the server's API key (else SPINDLE_API_KEY when set).
    #[arg(long)]
    pub api_key: Option<String>,

    /// With --serve: an image (PNG, JPEG, WebP, GIF) sent before each request's text, so the
    /// time to first token includes the vision tower (the served model must have one).
    #[arg(long, value_name = "FILE", requires = "serve")]
    pub image: Option<std::path::PathBuf>,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    if let Some(url) = &args.serve {
        return run_load(args, url);
    }
    let cpu = args.device == Device::Cpu;
    if cpu && (!args.context.is_empty() || args.layers.is_some()) {
        anyhow::bail!("--context and --layers are options of the CUDA bench (--device cuda)");
    }
    let dir = model_dir::resolve(args.model.as_ref())?;
    let name = model_dir::name(args.model.as_ref());
    if !args.batch.is_empty() {
        return run_batch(args, &dir, &name);
    }
    let started = Instant::now();
    let backend = Backend::load_layers(&dir, args.device, &args.load.options(), args.layers)
        .with_context(|| {
            if cpu {
                format!("loading {name}")
            } else {
                format!("loading {name} onto {}", args.device)
            }
        })?;
    let load_s = started.elapsed().as_secs_f64();
    let report = bench::run(
        &backend,
        &BenchOptions {
            prompt_tokens: args.prompt,
            gen_tokens: args.gen,
            runs: args.runs,
            probe_bytes: args.probe_mib << 20,
            contexts: args.context.clone(),
        },
    )?;
    print_profiles(&report);
    match backend.cpu() {
        Some(engine) => print_cpu(args, &name, engine, &report),
        None => print_gpu(
            args,
            &name,
            gpu_format(args, &dir),
            &backend,
            &report,
            load_s,
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// With `SPINDLE_CUDA_PROFILE=1`: the kernel time of one prefill and of one decode step by
/// kernel and grid, on stderr (the timed work ran without graphs, one event pair per launch).
fn print_profiles(report: &BenchReport) {
    for profile in &report.profiles {
        let times = profile.times.max(1);
        let total: f64 = profile.lines.iter().map(|l| l.total_us).sum();
        let launches: usize = profile.lines.iter().map(|l| l.calls).sum();
        eprintln!(
            "kernel time per {}: {:.1} us in {} launches",
            profile.what,
            total / times as f64,
            launches / times
        );
        for l in &profile.lines {
            eprintln!(
                "  {:>9.1} us {:>5.1}% {:>5}x {:<20} grid {:?}",
                l.total_us / times as f64,
                100.0 * l.total_us / total,
                l.calls / times,
                l.name,
                l.grid
            );
        }
    }
}

/// The weight format the CUDA engine runs: `--quant`, else as stored (`fp8` for a block-FP8
/// checkpoint).
fn gpu_format(args: &BenchArgs, dir: &Path) -> &'static str {
    match args.load.quant {
        Some(q) => q.name(),
        None if spindle_model::fp8::BlockFp8::from_dir(dir).is_ok_and(|f| f.is_some()) => "fp8",
        None => "bf16",
    }
}

fn gb(bytes: f64) -> f64 {
    bytes / 1e9
}

/// The CPU report: one decode figure (after the prompt), the engine's threads and its expert
/// counters (which cover the warm-up and the measured runs).
fn print_cpu(args: &BenchArgs, name: &str, engine: &Engine, report: &BenchReport) {
    let experts = engine.expert_stats();
    // An install carries its own format; a checkpoint is quantized as asked.
    // A GGUF file without --quant runs its quantized tensors in their blocks.
    let gguf = args
        .model
        .as_deref()
        .is_some_and(spindle_model::gguf::is_gguf);
    let quant: &str = match engine.install() {
        Some(i) => i.manifest().quant_format().name(),
        None if gguf && args.load.quant.is_none() => "gguf blocks",
        None => args.load.quant().name(),
    };
    let decode = report.decode[0].tokens_per_s;
    if args.json {
        let value = json!({
            "prompt_tokens": report.prompt_tokens,
            "gen_tokens": report.gen_tokens,
            "runs": report.runs,
            "threads": report.threads,
            "prefill_tokens_per_s": report.prefill_tokens_per_s(),
            "prefill": report.prefill,
            "decode_tokens_per_s": report.decode_tokens_per_s(),
            "decode": decode,
            "weight_bytes_per_token": report.weight_bytes_per_token,
            "measured_bandwidth_bytes_per_s": report.measured_bandwidth_bytes_per_s,
            "decode_roofline_fraction": report.decode_roofline_fraction(),
            "peak_rss_bytes": report.peak_rss_bytes,
            "model": name,
            "quant": quant,
            "weight_bytes": engine.weight_bytes(),
            "experts": format!("{:?}", engine.expert_placement()),
            "expert_hit_rate": experts.hit_rate(),
            "expert_bytes_read": experts.bytes_read,
            "expert_stall_s": experts.stall_s,
        });
        println!("{value}");
        return;
    }
    println!(
        "model        {} ({}, {} threads, weights {:.2} GB)",
        name,
        quant,
        report.threads,
        engine.weight_bytes() as f64 / 1e9
    );
    println!(
        "prefill      {:>10.1} tok/s  (median of {}, min {:.1}, max {:.1}; {} tokens)",
        report.prefill_tokens_per_s(),
        report.runs,
        report.prefill.min,
        report.prefill.max,
        report.prompt_tokens
    );
    println!(
        "decode       {:>10.2} tok/s  (median of {}, min {:.2}, max {:.2}; {} tokens)",
        report.decode_tokens_per_s(),
        report.runs,
        decode.min,
        decode.max,
        report.gen_tokens
    );
    println!(
        "weights/tok  {:>10.3} GB",
        gb(report.weight_bytes_per_token as f64)
    );
    println!(
        "bandwidth    {:>10.2} GB/s (read probe, same run)",
        gb(report.measured_bandwidth_bytes_per_s)
    );
    println!(
        "roofline     {:>10.2} tok/s  → decode at {:.1}% of it",
        report.roofline_tokens_per_s(),
        report.decode_roofline_fraction() * 100.0
    );
    println!(
        "prefill/decode ratio {:.1}x",
        report.prefill_tokens_per_s() / report.decode_tokens_per_s()
    );
    println!(
        "peak RSS     {:>10.2} GB (before the bandwidth probe)",
        gb(report.peak_rss_bytes as f64)
    );
    if experts.hits + experts.misses > 0 {
        println!(
            "experts      {:?}: hit rate {:.1}%, read {:.2} GB, stalled {:.2} s",
            engine.expert_placement(),
            experts.hit_rate() * 100.0,
            gb(experts.bytes_read as f64),
            experts.stall_s
        );
    }
}

/// The GPU report: decode after each `--context`, the device, CUDA graphs and the load time
/// (the JSON keys the CPU report shares have the same meaning).
fn print_gpu(
    args: &BenchArgs,
    name: &str,
    quant: &str,
    backend: &Backend,
    report: &BenchReport,
    load_s: f64,
) {
    let layers = backend.config().num_layers();
    let roofline = report.roofline_tokens_per_s();
    if args.json {
        let decode: Vec<Value> = report
            .decode
            .iter()
            .map(|d| {
                json!({
                    "context": d.context,
                    "tokens_per_s": d.tokens_per_s.median,
                    "decode": d.tokens_per_s,
                    "roofline_fraction": d.tokens_per_s.median / roofline,
                })
            })
            .collect();
        let value = json!({
            "model": name,
            "device": report.device,
            "quant": quant,
            "layers": layers,
            "cuda_graphs": report.graphs,
            "load_s": load_s,
            "prompt_tokens": report.prompt_tokens,
            "gen_tokens": report.gen_tokens,
            "runs": report.runs,
            "prefill_tokens_per_s": report.prefill_tokens_per_s(),
            "prefill": report.prefill,
            "decode_tokens_per_s": report.decode_tokens_per_s(),
            "decode_by_context": decode,
            "weight_bytes_per_token": report.weight_bytes_per_token,
            "measured_bandwidth_bytes_per_s": report.measured_bandwidth_bytes_per_s,
            "decode_roofline_fraction": report.decode_roofline_fraction(),
            "peak_rss_bytes": report.peak_rss_bytes,
        });
        println!("{value}");
        return;
    }
    println!(
        "model        {} ({}, {} layers) on {}{}",
        name,
        quant,
        layers,
        report.device,
        if report.graphs { ", CUDA graphs" } else { "" }
    );
    println!(
        "prefill      {:>10.1} tok/s  (median of {}, min {:.1}, max {:.1}; {} tokens)",
        report.prefill.median,
        report.runs,
        report.prefill.min,
        report.prefill.max,
        report.prompt_tokens
    );
    for d in &report.decode {
        println!(
            "decode       {:>10.2} tok/s  after {} tokens (median of {}, min {:.2}, max {:.2}; {} tokens each) = {:.1}% of the roofline",
            d.tokens_per_s.median,
            d.context,
            report.runs,
            d.tokens_per_s.min,
            d.tokens_per_s.max,
            report.gen_tokens,
            d.tokens_per_s.median / roofline * 100.0
        );
    }
    println!(
        "weights/tok  {:>10.3} GB",
        gb(report.weight_bytes_per_token as f64)
    );
    println!(
        "bandwidth    {:>10.2} GB/s (device read kernel, same run)",
        gb(report.measured_bandwidth_bytes_per_s)
    );
    println!("roofline     {:>10.2} tok/s", roofline);
    println!(
        "peak RSS     {:>10.2} GB (host)",
        gb(report.peak_rss_bytes as f64)
    );
}

/// `--batch`: batched decode at each B, with B=1 first as the baseline of the ratios; and,
/// when the model has a tokenizer (and runs whole), the same decode through the scheduler.
fn run_batch(args: &BenchArgs, dir: &Path, name: &str) -> Result<ExitCode> {
    let mut sizes = vec![1];
    sizes.extend(args.batch.iter().copied().filter(|&b| b != 1));
    anyhow::ensure!(
        sizes.iter().all(|&b| b > 0),
        "--batch sizes must be positive"
    );
    let options = args.load.options();
    let quant = gpu_format(args, dir);
    let model = if args.layers.is_none() && dir.join("tokenizer.json").is_file() {
        let model = Model::load_on(dir, args.device, &options)
            .with_context(|| format!("loading {name}"))?;
        Some(Arc::new(model))
    } else {
        None
    };
    let loaded;
    let backend = match &model {
        Some(model) => &model.backend,
        None => {
            loaded = Backend::load_layers(dir, args.device, &options, args.layers)
                .with_context(|| format!("loading {name}"))?;
            &loaded
        }
    };
    // Each size through the scheduler, then at the engine, before the next size: a machine
    // whose load drifts (other processes) shifts both figures of a row alike.
    let prompt_tokens = args.prompt.min(64);
    let mut scheduled = Vec::new();
    let mut report = Vec::new();
    for &b in &sizes {
        if let Some(model) = &model {
            // As many tokens as the engine-level run feeds (warm-up and timed runs), so both
            // time the same positions of the same greedy sequences.
            let tokens = args.gen.min(4) + args.runs.max(1) * args.gen.max(1);
            scheduled.push(bench::run_scheduled(model, b, prompt_tokens, tokens)?);
        }
        report.extend(bench::run_batch(
            backend,
            &BatchBenchOptions {
                batch_sizes: vec![b],
                prompt_tokens,
                steps: args.gen,
                runs: args.runs,
            },
        )?);
    }
    let constrained = match (&args.json_schema, &model) {
        (None, _) => Vec::new(),
        (Some(_), None) => anyhow::bail!("--json-schema needs the model's tokenizer.json"),
        (Some(path), Some(model)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let schema: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            let constraint = model
                .constraint(&spindle_runtime::Grammar::JsonSchema(schema))
                .with_context(|| format!("compiling {}", path.display()))?;
            let tokens = args.gen.min(4) + args.runs.max(1) * args.gen.max(1);
            sizes
                .iter()
                .map(|&b| bench::run_constrained(model, b, prompt_tokens, tokens, &constraint))
                .collect::<spindle_runtime::Result<Vec<_>>>()?
        }
    };
    let base = report[0].tokens_per_s.median;
    if args.json {
        let rows: Vec<Value> = report
            .iter()
            .map(|r| {
                json!({
                    "batch": r.batch,
                    "tokens_per_s": r.tokens_per_s.median,
                    "decode": r.tokens_per_s,
                    "vs_batch_1": r.tokens_per_s.median / base,
                    "step_ms": r.step_ms.median,
                    "step": r.step_ms,
                })
            })
            .collect();
        let scheduled: Vec<Value> = scheduled
            .iter()
            .map(|s| {
                json!({
                    "batch": s.batch,
                    "tokens_per_s": s.tokens_per_s,
                    "inter_token_ms": s.inter_token_ms,
                    "generated": s.generated,
                })
            })
            .collect();
        let value = json!({
            "model": name,
            "device": backend.device_name(),
            "quant": quant,
            "prompt_tokens": args.prompt.min(64),
            "steps": args.gen,
            "runs": args.runs,
            "batched_decode": rows,
            "scheduler_decode": scheduled,
            "constrained_decode": constrained,
        });
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "model        {} ({}) on {}; {} prompt tokens per sequence, {} steps x {} runs",
        name,
        quant,
        backend.device_name(),
        args.prompt.min(64),
        args.gen,
        args.runs
    );
    println!(
        "{:>6} {:>14} {:>10} {:>12}   {:>16} {:>12}",
        "batch", "decode tok/s", "vs B=1", "step ms", "scheduler tok/s", "vs engine"
    );
    for (n, r) in report.iter().enumerate() {
        let through_scheduler = scheduled.get(n).map_or_else(
            || format!("{:>16} {:>12}", "-", "-"),
            |s| {
                format!(
                    "{:>16.2} {:>11.1}%",
                    s.tokens_per_s,
                    100.0 * s.tokens_per_s / r.tokens_per_s.median
                )
            },
        );
        println!(
            "{:>6} {:>14.2} {:>9.2}x {:>12.2}   {}",
            r.batch,
            r.tokens_per_s.median,
            r.tokens_per_s.median / base,
            r.step_ms.median,
            through_scheduler
        );
    }
    if model.is_none() {
        println!("(no tokenizer.json beside the weights: the scheduler's rate is not measured)");
    }
    if !constrained.is_empty() {
        println!(
            "{:>6} {:>14} {:>18} {:>10} {:>22} {:>18}",
            "batch",
            "free tok/s",
            "constrained tok/s",
            "ratio",
            "mask us/tok mean/p50",
            "tokens free/json"
        );
        for c in &constrained {
            println!(
                "{:>6} {:>14.2} {:>18.2} {:>9.1}% {:>22} {:>18}",
                c.free.batch,
                c.free.tokens_per_s,
                c.constrained.tokens_per_s,
                100.0 * c.ratio,
                format!("{:.1}/{:.1}", c.mask_us, c.mask_median_us),
                format!("{}/{}", c.free.generated, c.constrained.generated)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--serve URL`: the load generator against a running server.
fn run_load(args: &BenchArgs, url: &str) -> Result<ExitCode> {
    anyhow::ensure!(
        args.clients.iter().all(|&c| c > 0) && !args.clients.is_empty(),
        "--clients must be positive counts"
    );
    anyhow::ensure!(args.requests > 0, "--requests must be positive");
    let api_key = args.api_key.clone().or_else(|| {
        std::env::var("SPINDLE_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
    });
    let reports = loadgen::run(&LoadOptions {
        url: url.to_owned(),
        clients: args.clients.clone(),
        prompt_words: args.prompt_words,
        max_tokens: args.max_tokens,
        requests_per_client: args.requests,
        api_key,
        image_url: args
            .image
            .as_deref()
            .map(loadgen::image_data_url)
            .transpose()?,
    })?;
    if args.json {
        println!(
            "{}",
            json!({ "url": url, "prompt_words": args.prompt_words,
            "max_tokens": args.max_tokens, "results": reports })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "server       {url}; {} prompt words, max_tokens {}, temperature 0, {} requests per client",
        args.prompt_words, args.max_tokens, args.requests
    );
    println!(
        "{:>7} {:>8} {:>7} {:>10} {:>7} {:>9} {:>9} {:>8} {:>8} {:>10} {:>12}",
        "clients",
        "requests",
        "failed",
        "tok/s",
        "vs 1st",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "latency",
        "stream tok/s"
    );
    let base = reports[0].tokens_per_s;
    for r in &reports {
        println!(
            "{:>7} {:>8} {:>7} {:>10.2} {:>6.2}x {:>7.0}ms {:>7.0}ms {:>6.1}ms {:>6.1}ms {:>9.2}s {:>12.1}",
            r.clients,
            r.requests,
            r.failed,
            r.tokens_per_s,
            r.tokens_per_s / base,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.itl_p50_ms,
            r.itl_p99_ms,
            r.latency_p50_s,
            r.stream_decode_tok_s_p50
        );
    }
    let failed: usize = reports.iter().map(|r| r.failed).sum();
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
