//! `spindle bench`: prefill and decode speed, peak memory, and decode as a fraction of the
//! memory-bandwidth roofline measured in the same run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use spindle_engine::Engine;
use spindle_runtime::bench::{self, BenchOptions};

use crate::device::Device;
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

    /// Backend to run on.
    #[arg(long, default_value = "cpu")]
    pub device: Device,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    let Device::Cpu = args.device;
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
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["model"] = dir.display().to_string().into();
        value["quant"] = args.load.quant.name().into();
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
        args.load.quant.name(),
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
