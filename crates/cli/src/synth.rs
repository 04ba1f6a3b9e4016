//! `spindle synth`: a random-weight checkpoint with the exact shapes of a released model, for
//! benchmarks on machines without the real weights.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_model::synth::{
    checkpoint_specs, shape_config, truncate_layers, without_vision, write_checkpoint_with, SHAPES,
};
use spindle_model::ModelConfig;

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The released model whose shapes to copy: qwen3.6-35b-a3b, qwen3.6-27b,
    /// qwen3.8-flash-next or demo.
    #[arg(long)]
    pub shape: String,

    /// Keep only the first N layers (the layer pattern is kept), to fit a small disk.
    #[arg(long)]
    pub layers: Option<usize>,

    /// qwen3.8-flash-next only: a smaller n-gram table base (the real one is 102 GB).
    #[arg(long)]
    pub ngram_vocab_base: Option<u64>,

    /// Output directory (must not exist; written under a temporary name, then renamed).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Seed of the random weights.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,

    /// Write the routed experts as zeros in sparse files (no disk space): a full-size
    /// checkpoint on a small disk, to `spindle convert` into an install for streaming
    /// benchmarks (the install stores and reads every expert byte; outputs are meaningless).
    #[arg(long)]
    pub zero_experts: bool,

    /// Leave out the vision tower (`model.visual.*`, `vision_config` and the image token ids)
    /// that the Qwen3.6 shapes and the demo otherwise get.
    #[arg(long)]
    pub no_vision: bool,

    /// Largest safetensors shard, in GiB.
    #[arg(long, default_value_t = 4.0)]
    pub shard_gib: f64,
}

pub fn run(args: &SynthArgs) -> Result<ExitCode> {
    let Some(mut config) = shape_config(&args.shape) else {
        bail!(
            "unknown shape {:?} (known: {})",
            args.shape,
            SHAPES.join(", ")
        );
    };
    if let Some(layers) = args.layers {
        truncate_layers(&mut config, layers);
    }
    if args.no_vision {
        without_vision(&mut config);
    }
    if let Some(base) = args.ngram_vocab_base {
        config["ngram_vocab_size_base"] = base.into();
    }
    if args.out.exists() {
        bail!(
            "{} already exists; choose a new directory",
            args.out.display()
        );
    }
    spindle_model::fs::check_output(&args.out, &[], true)
        .with_context(|| format!("--out {}", args.out.display()))?;
    let parsed = ModelConfig::from_json_str(&config.to_string(), &args.out.join("config.json"))?;
    let total: u64 = checkpoint_specs(&parsed)
        .iter()
        .map(|t| t.elements() as u64 * 2)
        .sum();
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("writing {}", args.shape));
    let tmp = args.out.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    let shard_bytes = (args.shard_gib * (1u64 << 30) as f64) as usize;
    write_checkpoint_with(
        &tmp,
        &config,
        args.seed,
        shard_bytes,
        args.zero_experts,
        &mut |done| bar.set_position(done),
    )?;
    std::fs::rename(&tmp, &args.out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), args.out.display()))?;
    bar.finish_and_clear();
    let tower = match &parsed.vision {
        Some(v) => format!(", a {}-block vision tower", v.depth),
        None => String::new(),
    };
    eprintln!(
        "wrote {} ({:.2} GB, {} layers{tower}) to {}",
        args.shape,
        total as f64 / 1e9,
        parsed.num_layers(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
