//! `spindle bench`: prefill and decode speed, peak memory, and decode as a fraction of the
//! memory-bandwidth roofline measured in the same run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use spindle_engine::Engine;
use spindle_runtime::bench::{self, BenchOptions};
use spindle_runtime::Device;

use crate::load_args::LoadArgs;
use crate::model_dir;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model directory. Default: the embedded demo.
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

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(ordinal) = args.device {
        return cuda::run(args, ordinal);
    }
    if !args.context.is_empty() || args.layers.is_some() {
        anyhow::bail!("--context and --layers are options of the CUDA bench (--device cuda)");
    }
    let dir = model_dir::resolve(args.model.as_ref())?;
    let engine = Engine::load_with(&dir, &args.load.options())
        .with_context(|| format!("loading {}", dir.display()))?;
    let report = bench::run(
        &engine,
        &BenchOptions {
            prompt_tokens: args.prompt,
            gen_tokens: args.gen,
            runs: args.runs,
            probe_bytes: args.probe_mib << 20,
        },
    )?;
    // Expert counters cover the warm-up and the measured runs.
    let experts = engine.expert_stats();
    // An install carries its own format; a checkpoint is quantized as asked.
    let quant = engine
        .install()
        .map_or(args.load.quant, |i| i.manifest().quant_format());
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["model"] = dir.display().to_string().into();
        value["quant"] = quant.name().into();
        value["experts"] = format!("{:?}", engine.expert_placement()).into();
        value["expert_hit_rate"] = experts.hit_rate().into();
        value["expert_bytes_read"] = experts.bytes_read.into();
        value["expert_stall_s"] = experts.stall_s.into();
        println!("{value}");
        return Ok(ExitCode::SUCCESS);
    }
    let gb = |b: f64| b / 1e9;
    println!(
        "model        {} ({}, {} threads)",
        dir.display(),
        quant.name(),
        report.threads
    );
    println!(
        "prefill      {:>10.1} tok/s  (median of {}, min {:.1}, max {:.1}; {} tokens)",
        report.prefill_tokens_per_s,
        report.runs,
        report.prefill.min,
        report.prefill.max,
        report.prompt_tokens
    );
    println!(
        "decode       {:>10.2} tok/s  (median of {}, min {:.2}, max {:.2}; {} tokens)",
        report.decode_tokens_per_s,
        report.runs,
        report.decode.min,
        report.decode.max,
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
        report.measured_bandwidth_bytes_per_s / report.weight_bytes_per_token as f64,
        report.decode_roofline_fraction * 100.0
    );
    println!(
        "prefill/decode ratio {:.1}x",
        report.prefill_tokens_per_s / report.decode_tokens_per_s
    );
    println!("peak RSS     {:>10.2} GB", gb(report.peak_rss_bytes as f64));
    if experts.hits + experts.misses > 0 {
        println!(
            "experts      {:?}: hit rate {:.1}%, read {:.2} GB, stalled {:.2} s",
            engine.expert_placement(),
            experts.hit_rate() * 100.0,
            gb(experts.bytes_read as f64),
            experts.stall_s
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `spindle bench --device cuda[:N]`: the same measurements on a GPU (decode after each
/// `--context`), with the same JSON keys as the CPU bench.
#[cfg(feature = "cuda")]
mod cuda {
    use std::process::ExitCode;

    use anyhow::{Context, Result};
    use spindle_cuda::bench::{self, BenchOptions};
    use spindle_cuda::CudaEngine;

    use super::BenchArgs;
    use crate::model_dir;

    fn stat(s: &bench::Stat) -> serde_json::Value {
        serde_json::json!({ "median": s.median, "min": s.min, "max": s.max })
    }

    pub fn run(args: &BenchArgs, ordinal: usize) -> Result<ExitCode> {
        let dir = model_dir::resolve(args.model.as_ref())?;
        if let Some(reason) = spindle_runtime::backend::cuda_refusal(&dir, &args.load.options()) {
            anyhow::bail!(reason);
        }
        let started = std::time::Instant::now();
        let engine = CudaEngine::load_with(&dir, ordinal, args.load.quant, args.layers)
            .with_context(|| format!("loading {} onto CUDA device {ordinal}", dir.display()))?;
        let load_s = started.elapsed().as_secs_f64();
        let contexts = if args.context.is_empty() {
            vec![args.prompt]
        } else {
            args.context.clone()
        };
        let report = bench::run(
            &engine,
            &BenchOptions {
                prompt_tokens: args.prompt,
                gen_tokens: args.gen,
                runs: args.runs,
                probe_bytes: args.probe_mib << 20,
                contexts,
            },
        )?;
        let layers = engine.config().num_layers();
        if args.json {
            let decode: Vec<serde_json::Value> = report
                .decode
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "context": d.context,
                        "tokens_per_s": d.tokens_per_s.median,
                        "decode": stat(&d.tokens_per_s),
                        "roofline_fraction": d.tokens_per_s.median / report.roofline_tokens_per_s(),
                    })
                })
                .collect();
            let value = serde_json::json!({
                "model": dir.display().to_string(),
                "device": report.device,
                "quant": args.load.quant.name(),
                "layers": layers,
                "cuda_graphs": report.graphs,
                "load_s": load_s,
                "prompt_tokens": report.prompt_tokens,
                "gen_tokens": report.gen_tokens,
                "runs": report.runs,
                "prefill_tokens_per_s": report.prefill_tokens_per_s(),
                "prefill": stat(&report.prefill),
                "decode_tokens_per_s": report.decode_tokens_per_s(),
                "decode_by_context": decode,
                "weight_bytes_per_token": report.weight_bytes_per_token,
                "measured_bandwidth_bytes_per_s": report.measured_bandwidth_bytes_per_s,
                "decode_roofline_fraction": report.decode_roofline_fraction(),
                "peak_rss_bytes": report.peak_rss_bytes,
            });
            println!("{value}");
            return Ok(ExitCode::SUCCESS);
        }
        let gb = |b: f64| b / 1e9;
        println!(
            "model        {} ({}, {} layers) on {}{}",
            dir.display(),
            args.load.quant.name(),
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
                d.tokens_per_s.median / report.roofline_tokens_per_s() * 100.0
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
        println!(
            "roofline     {:>10.2} tok/s",
            report.roofline_tokens_per_s()
        );
        println!(
            "peak RSS     {:>10.2} GB (host)",
            gb(report.peak_rss_bytes as f64)
        );
        Ok(ExitCode::SUCCESS)
    }
}
