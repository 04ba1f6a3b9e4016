//! `spindle convert`: a Hugging Face checkpoint to a spindle install (quantized weights, experts
//! packed for streaming, checksums). The work is `spindle_model::install::convert`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use spindle_model::install;
use spindle_model::quant::WeightFormat;

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The checkpoint directory (config.json + safetensors, bf16/f16/f32 or block FP8), or a GGUF file (the first part of a split set).
    #[arg(value_name = "SRC")]
    pub src: PathBuf,

    /// The install directory to create (must not exist; written as DST.partial, then renamed).
    #[arg(value_name = "DST")]
    pub dst: PathBuf,

    /// Format of the large projections and routed experts: bf16, q8 or q4.
    #[arg(long, default_value = "q8", value_parser = parse_quant)]
    pub quant: WeightFormat,

    /// Format of the vision tower's matrices (`model.visual.*`): bf16 (as released) or q8.
    #[arg(long, default_value = "bf16", value_parser = parse_quant)]
    pub vision_quant: WeightFormat,
}

fn parse_quant(s: &str) -> Result<WeightFormat, String> {
    s.parse::<WeightFormat>().map_err(|e| e.to_string())
}

pub fn run(args: &ConvertArgs) -> Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "converting [{bar:40}] {binary_bytes}/{binary_total_bytes} {msg} ({eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let manifest = install::convert_with(
        &args.src,
        &args.dst,
        args.quant,
        args.vision_quant,
        &mut |p| {
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_message(format!("{}/{} tensors", p.tensors_done, p.tensors_total));
            true
        },
    )
    .with_context(|| {
        format!(
            "converting {} to {}",
            args.src.display(),
            args.dst.display()
        )
    })?;
    bar.finish_and_clear();
    let bytes: u64 = manifest.files.iter().map(|f| f.size).sum();
    eprintln!(
        "wrote {} ({}, {} files, {:.2} GB; {} MoE layers with expert files)",
        args.dst.display(),
        args.quant,
        manifest.files.len() + 1,
        bytes as f64 / 1e9,
        manifest.experts.len()
    );
    Ok(ExitCode::SUCCESS)
}
