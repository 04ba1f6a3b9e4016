//! `spindle logits`: the logits the engine computes for a prompt and its greedy continuation,
//! written in the layout of the fixtures' `reference.safetensors`, optionally compared with one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use spindle_cpu::{GreedyRun, LogitsFor};
use spindle_model::ModelConfig;
use spindle_runtime::{Backend, Device};
use spindle_vision::{PreparedImage, Rgb8};

use crate::compare::compare;
use crate::tensor_file::{self, Tensor, Values};

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 on success; 1 on an error or when --compare finds \
    different gen_ids, different prompt_ids or a logits difference above --tolerance; \
    2 on invalid arguments."
)]
pub struct LogitsArgs {
    /// Hugging Face checkpoint directory (config.json + *.safetensors, bf16/f16/f32 or block
    /// FP8), or a GGUF file (the first part of a split set).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,

    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_name = "IDS", value_parser = parse_tokens, required_unless_present = "tokens_from", conflicts_with = "tokens_from")]
    pub tokens: Option<TokenIds>,

    /// Take the prompt from the `prompt_ids` tensor of a safetensors file (e.g. a fixture's
    /// reference.safetensors). When the file also holds images `image_0`, `image_1`, ... (u8
    /// [h, w, 3], sides multiples of 32), they are patchified and placed on the prompt's
    /// `<|image_pad|>` tokens in order, and `vision_embeds` (the tower's merged features) is
    /// written too.
    #[arg(long, value_name = "FILE")]
    pub tokens_from: Option<PathBuf>,

    /// Greedily decode N tokens after the prompt and also write `gen_ids` [N] and
    /// `decode_logits` [N, V].
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub decode: usize,

    /// Output safetensors file (written atomically).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Backend to run on: `cpu`, or `cuda[:N]` (CUDA GPU N, default 0) in a build with the
    /// `cuda` feature.
    #[arg(long, default_value = "cpu")]
    pub device: Device,

    #[command(flatten)]
    pub load: crate::load_args::LoadArgs,

    /// Compare with a reference safetensors file: prints the max abs diff of each tensor
    /// present in both and fails when they disagree.
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,

    /// Largest max-abs-diff of logits that --compare accepts.
    #[arg(long, default_value_t = 1e-3, requires = "compare")]
    pub tolerance: f32,
}

/// Prompt token ids from `--tokens` (a newtype so clap takes the list as one value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

/// Parses `1,2,3` (spaces allowed around entries); an error names the bad entry.
pub fn parse_tokens(text: &str) -> Result<TokenIds, String> {
    if text.trim().is_empty() {
        return Err("no token ids given (expected e.g. 1,2,3)".into());
    }
    text.split(',')
        .enumerate()
        .map(|(i, entry)| {
            let entry = entry.trim();
            entry.parse::<u32>().map_err(|_| {
                format!(
                    "entry {} ({entry:?}) is not a token id: expected a non-negative integer below 2^32",
                    i + 1
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(TokenIds)
}

pub fn run(args: &LogitsArgs) -> Result<ExitCode> {
    let prompt = match (&args.tokens, &args.tokens_from) {
        (Some(TokenIds(ids)), _) => ids.clone(),
        (None, Some(path)) => prompt_ids_from(path)?,
        (None, None) => bail!("give the prompt with --tokens or --tokens-from"),
    };
    let images = match &args.tokens_from {
        Some(path) => images_from(path)?,
        None => Vec::new(),
    };
    // Read the reference before the (possibly long) run so a bad path fails fast.
    let reference = match &args.compare {
        Some(path) => Some(tensor_file::read(path)?),
        None => None,
    };

    if spindle_model::gguf::is_gguf(&args.model) {
        if !args.model.is_file() {
            bail!("GGUF file {} does not exist", args.model.display());
        }
    } else if !args.model.is_dir() {
        bail!(
            "model directory {} does not exist or is not a directory",
            args.model.display()
        );
    }
    // Before the (possibly long) run, so a bad --out fails fast.
    spindle_model::fs::check_output(&args.out, &[&args.model], false)
        .with_context(|| format!("--out {}", args.out.display()))?;
    let (config, run, embeds) = run_on_device(args, &prompt, &images)?;
    let config = &config;

    let (t, v, g) = (prompt.len(), config.vocab_size, run.gen_ids.len());
    let mut tensors = vec![
        (
            "prompt_ids",
            Tensor::i64(vec![t], prompt.iter().map(|&id| id as i64).collect()),
        ),
        (
            "prefill_logits",
            Tensor::f32(vec![t, v], run.prefill_logits),
        ),
    ];
    if g > 0 {
        tensors.push((
            "gen_ids",
            Tensor::i64(vec![g], run.gen_ids.iter().map(|&id| id as i64).collect()),
        ));
        tensors.push(("decode_logits", Tensor::f32(vec![g, v], run.decode_logits)));
    }
    if let Some(embeds) = embeds {
        let rows = embeds.len() / config.hidden_size;
        tensors.push((
            "vision_embeds",
            Tensor::f32(vec![rows, config.hidden_size], embeds),
        ));
    }
    tensor_file::write_atomic(&args.out, &tensors)?;
    println!("wrote {}", args.out.display());
    for (name, tensor) in &tensors {
        println!("  {name:<16} {:?}", tensor.shape);
    }
    if g > 0 {
        println!("gen_ids: {:?}", run.gen_ids);
    }

    let (Some(reference), Some(path)) = (reference, &args.compare) else {
        return Ok(ExitCode::SUCCESS);
    };
    println!(
        "compared with {} (tolerance {:e}):",
        path.display(),
        args.tolerance
    );
    let results = compare(&tensors, &reference, args.tolerance);
    for line in &results {
        println!("  {line}");
    }
    for name in reference
        .keys()
        .filter(|n| !tensors.iter().any(|(ours, _)| ours == n))
    {
        tracing::debug!(tensor = %name, "only in the reference; not compared");
    }
    if results.is_empty() {
        eprintln!(
            "error: {} holds none of the tensors spindle logits writes",
            path.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.as_str())
        .collect();
    if failed.is_empty() {
        println!("match");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: differs from {}: {}",
            path.display(),
            failed.join(", ")
        );
        Ok(ExitCode::FAILURE)
    }
}

/// Loads the model on `--device` and runs the prompt (its pads taking `images`) and its
/// greedy continuation; with images also returns their merged features `[tokens, H]`.
fn run_on_device(
    args: &LogitsArgs,
    prompt: &[u32],
    images: &[Rgb8],
) -> Result<(ModelConfig, GreedyRun, Option<Vec<f32>>)> {
    let (onto, on) = if args.device == Device::Cpu {
        (String::new(), String::new())
    } else {
        (
            format!(" onto {}", args.device),
            format!(" on {}", args.device),
        )
    };
    let started = Instant::now();
    let backend = Backend::load(&args.model, args.device, &args.load.options())
        .with_context(|| format!("cannot load the model at {}{onto}", args.model.display()))?;
    log_loaded(args, backend.config(), started, &backend.device_name());
    let started = Instant::now();
    let cannot_run = || format!("cannot run the model at {}{on}", args.model.display());
    if images.is_empty() {
        let run = backend
            .greedy(prompt, args.decode)
            .with_context(cannot_run)?;
        log_done(args, prompt, started);
        return Ok((backend.config().clone(), run, None));
    }
    let prepared = prepare_images(&backend, &args.model, images)?;
    backend
        .check_images(prompt, &prepared)
        .with_context(cannot_run)?;
    let features = backend.encode_images(&prepared).with_context(cannot_run)?;
    let mut session = backend.new_session().with_context(cannot_run)?;
    backend
        .attach_images(&mut session, &features)
        .with_context(cannot_run)?;
    let run = GreedyRun::collect(
        backend.config().vocab_size,
        prompt,
        args.decode,
        spindle_kernels::softmax::argmax,
        |ids, want: LogitsFor| backend.forward(&mut session, ids, want),
    )
    .with_context(cannot_run)?;
    log_done(args, prompt, started);
    let embeds = features
        .iter()
        .flat_map(|f| f.rows.iter().copied())
        .collect();
    Ok((backend.config().clone(), run, Some(embeds)))
}

/// `images` normalised and cut into patch rows for the model's tower (`vision_config`, and
/// `preprocessor_config.json` when the model directory has one).
fn prepare_images(backend: &Backend, dir: &Path, images: &[Rgb8]) -> Result<Vec<PreparedImage>> {
    let vision = backend.config().vision.as_ref().with_context(|| {
        format!(
            "the reference holds images but the model at {} takes none (no vision_config)",
            dir.display()
        )
    })?;
    let geometry = vision.geometry(dir)?;
    images
        .iter()
        .enumerate()
        .map(|(k, image)| {
            spindle_vision::patchify(image, &geometry).with_context(|| format!("image_{k}"))
        })
        .collect()
}

/// The images `image_0`, `image_1`, ... (u8 [h, w, 3]) of a safetensors file, in order.
fn images_from(path: &Path) -> Result<Vec<Rgb8>> {
    let tensors = tensor_file::read(path)?;
    let mut images = Vec::new();
    while let Some(tensor) = tensors.get(&format!("image_{}", images.len())) {
        let k = images.len();
        let (Values::U8(data), [height, width, 3]) = (&tensor.values, tensor.shape.as_slice())
        else {
            bail!(
                "--tokens-from {}: `image_{k}` must be a u8 tensor [h, w, 3], found shape {:?}",
                path.display(),
                tensor.shape
            );
        };
        images.push(Rgb8 {
            width: *width,
            height: *height,
            data: data.clone(),
        });
    }
    Ok(images)
}

fn log_loaded(args: &LogitsArgs, config: &ModelConfig, started: Instant, device: &str) {
    tracing::info!(
        model = %args.model.display(),
        family = config.family.model_type(),
        layers = config.num_layers(),
        device,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "model loaded"
    );
}

fn log_done(args: &LogitsArgs, prompt: &[u32], started: Instant) {
    tracing::info!(
        prompt_tokens = prompt.len(),
        decode_steps = args.decode,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "forward done"
    );
}

/// The `prompt_ids` tensor (i64, 1-D) of a safetensors file, as token ids.
fn prompt_ids_from(path: &Path) -> Result<Vec<u32>> {
    let tensors = tensor_file::read(path)?;
    let tensor = tensors.get("prompt_ids").with_context(|| {
        format!(
            "--tokens-from {}: no `prompt_ids` tensor in this file",
            path.display()
        )
    })?;
    let Values::I64(ids) = &tensor.values else {
        bail!(
            "--tokens-from {}: `prompt_ids` must be an i64 tensor",
            path.display()
        );
    };
    if tensor.shape.len() != 1 {
        bail!(
            "--tokens-from {}: `prompt_ids` has shape {:?}, expected [T]",
            path.display(),
            tensor.shape
        );
    }
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            u32::try_from(id).with_context(|| {
                format!(
                    "--tokens-from {}: prompt_ids[{i}] = {id} is not a token id",
                    path.display()
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{parse_tokens, TokenIds};

    #[test]
    fn tokens_parse_and_errors_name_the_entry() {
        assert_eq!(parse_tokens("1,2,3"), Ok(TokenIds(vec![1, 2, 3])));
        assert_eq!(parse_tokens(" 7 , 8 "), Ok(TokenIds(vec![7, 8])));
        let err = parse_tokens("1,x2,3").unwrap_err();
        assert!(err.contains("entry 2") && err.contains("\"x2\""), "{err}");
        let err = parse_tokens("1,,3").unwrap_err();
        assert!(err.contains("entry 2") && err.contains("\"\""), "{err}");
        let err = parse_tokens("-4").unwrap_err();
        assert!(err.contains("\"-4\""), "{err}");
        assert!(parse_tokens("").is_err());
    }
}
