//! `spindle run`: one completion, or an interactive chat when no prompt is given on a
//! terminal. Text streams to stdout; timings go to stderr.

use spindle_runtime::images::TokenPrompt;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use spindle_runtime::{Completion, Conversation, Device, Flow, GenerateOptions, Model, Prompt};

use crate::images;
use crate::model_dir;
use crate::sampling_args::SamplingArgs;
use crate::terminal;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory (Hugging Face checkpoint with tokenizer), or a GGUF file carrying its
    /// tokenizer. Default: the embedded demo.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// The prompt (an empty one is refused). Omit it on a terminal for an interactive chat;
    /// omit it with piped input to read the prompt from stdin. On a terminal, control
    /// characters in the model's text other than newline and tab are shown as visible
    /// stand-ins (ESC as ␛); piped output is the exact text.
    pub prompt: Option<String>,

    /// Send the prompt as plain text, without the chat template. Spellings of special
    /// tokens in it (`<|im_start|>`) become those tokens unless --no-special is given.
    #[arg(long)]
    pub raw: bool,

    /// With --raw: encode special-token spellings as plain text, as chat messages always are.
    #[arg(long, requires = "raw")]
    pub no_special: bool,

    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,

    /// An image file (PNG, JPEG, WebP, GIF) for the prompt (repeatable; in order, before the
    /// prompt's text). Needs a model with a vision tower and a prompt (not --raw, not the
    /// interactive chat).
    #[arg(long, value_name = "FILE", conflicts_with = "raw")]
    pub image: Vec<PathBuf>,

    /// Ask the model to think first (sets the template's enable_thinking / force_thinking).
    #[arg(long, conflicts_with = "no_think")]
    pub think: bool,

    /// Ask the model to answer without thinking.
    #[arg(long)]
    pub no_think: bool,

    /// The most tokens to generate per answer.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,

    /// Stop when this text appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub load: crate::load_args::LoadArgs,

    /// Backend to run on: cpu, or (in a build with the `cuda` feature) cuda or cuda:N (CUDA GPU
    /// N; Hugging Face checkpoints only, every expert in GPU memory).
    #[arg(long, default_value = "cpu")]
    pub device: Device,

    /// Print prompt and generation statistics to stderr after each answer (always on in
    /// one-shot mode as one line).
    #[arg(long)]
    pub stats: bool,
}

impl RunArgs {
    fn template_vars(&self) -> Map<String, Value> {
        let mut vars = Map::new();
        if self.think || self.no_think {
            vars.insert("enable_thinking".into(), json!(self.think));
            vars.insert("force_thinking".into(), json!(self.think));
        }
        vars
    }

    fn options(&self, model: &Model) -> GenerateOptions {
        GenerateOptions {
            sampling: self.sampling.apply(&model.defaults),
            max_tokens: Some(self.max_tokens),
            stop: self.stop.clone(),
            ..GenerateOptions::default()
        }
    }
}

fn load(args: &RunArgs) -> Result<Model> {
    let dir = model_dir::resolve(args.model.as_ref())?;
    let name = model_dir::name(args.model.as_ref());
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_message(format!("loading {name}"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let model = Model::load_on(&dir, args.device, &args.load.options())
        .with_context(|| format!("loading {name} on {}", args.device));
    spinner.finish_and_clear();
    model
}

fn print_stats(model: &Model, c: &Completion) {
    eprintln!(
        "\n[prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | stop: {}]",
        c.prompt_tokens,
        c.prefill_tokens_per_s(),
        c.completion_tokens(),
        c.decode_tokens_per_s(),
        c.finish
    );
    let (Some(experts), Some(placement)) = (
        model.backend.expert_stats(),
        model.backend.expert_placement(),
    ) else {
        return;
    };
    if experts.hits + experts.misses > 0 {
        eprintln!(
            "[experts: {:?} | hit rate {:.1}% ({} hits, {} misses) | read {:.1} MB | stalled {:.3} s]",
            placement,
            experts.hit_rate() * 100.0,
            experts.hits,
            experts.misses,
            experts.bytes_read as f64 / 1e6,
            experts.stall_s
        );
    }
}

/// Streams deltas to stdout as they come; on a terminal with control characters made
/// visible ([`terminal::printable`]), elsewhere byte for byte.
fn stdout_sink(stop: Option<Arc<AtomicBool>>) -> impl FnMut(&str) -> Flow {
    let tty = std::io::stdout().is_terminal();
    move |text: &str| {
        let mut out = std::io::stdout().lock();
        let text = if tty {
            terminal::printable(text)
        } else {
            text.into()
        };
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        match &stop {
            Some(flag) if flag.swap(false, Ordering::SeqCst) => Flow::Stop,
            _ => Flow::Continue,
        }
    }
}

pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let prompt = match &args.prompt {
        Some(p) => Some(p.clone()),
        None if !std::io::stdin().is_terminal() => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the prompt from stdin")?;
            Some(text)
        }
        None => None,
    };
    if prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
        anyhow::bail!(
            "the prompt is empty: give it as an argument (spindle run \"...\"), pipe it on \
             stdin, or leave it out on a terminal for an interactive chat"
        );
    }
    if prompt.is_none() && !args.image.is_empty() {
        anyhow::bail!(
            "--image needs a prompt (spindle run --image FILE \"...\"): the interactive chat \
             takes no images"
        );
    }
    let model = load(args)?;
    match prompt {
        Some(text) => one_shot(args, &model, text),
        None => chat(args, &model),
    }
}

fn one_shot(args: &RunArgs, model: &Model, text: String) -> Result<ExitCode> {
    let prompt = if args.raw {
        Prompt::Text {
            text,
            special_tokens: !args.no_special,
        }
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        let content = images::user_content(&text, args.image.len());
        messages.push(json!({"role": "user", "content": content}));
        Prompt::Chat {
            messages: Value::Array(messages),
            tools: None,
            vars: args.template_vars(),
            add_generation_prompt: true,
        }
    };
    let prepared = model.prepare(&prompt)?;
    let prompt = engine_prompt(args, model, prepared.ids)?;
    let mut session = model.new_session()?;
    let completion = model.generate_prompt(
        &mut session,
        &prompt,
        &args.options(model),
        &mut stdout_sink(None),
    )?;
    println!();
    print_stats(model, &completion);
    Ok(ExitCode::SUCCESS)
}

/// The prompt as the engine takes it: with `--image`, each image prepared and its
/// `<|image_pad|>` expanded, then handed to [`spindle_server::engine_prompt`] (the one place
/// prompts with images go to the engine). A vision model's prompt without images is checked
/// to hold no image placeholder.
fn engine_prompt(args: &RunArgs, model: &Model, ids: Vec<u32>) -> Result<TokenPrompt> {
    let dir = &model.dir;
    if args.image.is_empty() {
        if let Some(input) = spindle_vision::ImageInput::from_model_dir(dir)? {
            let ids = spindle_vision::expand_image_pads(
                &ids,
                input.image_token_id,
                &[],
                input.geometry.merge,
            )?;
            return Ok(ids.into());
        }
        return Ok(ids.into());
    }
    let context = model.config().max_position_embeddings;
    let (input, prepared) = images::load(&args.image, dir, context)?;
    let ids = spindle_vision::expand_image_pads(
        &ids,
        input.image_token_id,
        &prepared,
        input.geometry.merge,
    )?;
    let pads = ids.iter().filter(|&&id| id == input.image_token_id).count();
    model
        .backend
        .check_images(&ids, &prepared)
        .with_context(|| format!("the prompt's {pads} image tokens were placed"))?;
    Ok(spindle_server::engine_prompt(ids, prepared))
}

fn chat(args: &RunArgs, model: &Model) -> Result<ExitCode> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = interrupted.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    let mut conversation = Conversation::new(model, args.system.as_deref(), args.template_vars());
    eprintln!(
        "spindle chat with {} on {} (Ctrl-C stops an answer, Ctrl-D quits)",
        model_dir::name(args.model.as_ref()),
        model.backend.describe()
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(ExitCode::SUCCESS);
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // A Ctrl-C pressed at the prompt must not cancel the answer to come.
        interrupted.store(false, Ordering::SeqCst);
        let turn = conversation.turn(
            model,
            line,
            &args.options(model),
            &mut stdout_sink(Some(interrupted.clone())),
        )?;
        println!();
        if args.stats {
            print_stats(model, &turn.completion);
            eprintln!("[context: {} tokens]", conversation.context_tokens());
        }
    }
}
