//! `spindle`: the command-line front end. Each subcommand lives in its own module; this file
//! only parses arguments, sets up logging and reports errors.

mod bench;
mod compare;
mod convert;
mod images;
mod inspect;
mod load_args;
mod loadgen;
mod logits;
mod model_dir;
mod run;
mod sampling_args;
mod serve;
mod synth;
mod template;
mod tensor_file;
mod terminal;
mod tokenize;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// spindle: an inference engine for the Qwen hybrid models (Qwen3-Next, Qwen3.5, Qwen3.6).
#[derive(Debug, Parser)]
#[command(name = "spindle", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compute the logits of a prompt (and a greedy continuation) and write them to a
    /// safetensors file laid out like the fixtures' `reference.safetensors`.
    Logits(logits::LogitsArgs),
    /// Describe a model from its config.json alone: family, layer kinds, shapes and parameter
    /// counts per class (total and active per token).
    Inspect(inspect::InspectArgs),
    /// Generate text: one completion, or an interactive chat when no prompt is given.
    Run(run::RunArgs),
    /// Print the token ids (and pieces) of a text.
    Tokenize(tokenize::TokenizeArgs),
    /// Print the prompt a chat template renders for a conversation.
    Template(template::TemplateArgs),
    /// Measure prefill and decode speed against the memory-bandwidth roofline.
    Bench(bench::BenchArgs),
    /// Convert a Hugging Face checkpoint into an install: quantized weights, routed experts
    /// packed per layer for streaming, and a manifest with every file's size and SHA-256.
    Convert(convert::ConvertArgs),
    /// Write a random-weight checkpoint with the shapes of a released model.
    Synth(synth::SynthArgs),
    /// Serve one model over an OpenAI-compatible HTTP API (/v1/chat/completions,
    /// /v1/completions, /v1/models, /health, /metrics).
    Serve(serve::ServeArgs),
}

/// Keeps large buffers in the allocator between forward passes. glibc returns any allocation
/// above 128 KiB to the kernel on free, so every decode step paid page faults and zeroing for
/// its activation and logits buffers; with the thresholds raised they are reused.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc malloc tunables; it is called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() -> ExitCode {
    tune_allocator();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Logits(args) => logits::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
        Command::Template(args) => template::run(&args),
        Command::Synth(args) => synth::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Serve(args) => serve::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
