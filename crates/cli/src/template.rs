//! `spindle template`: the prompt a model's chat template renders for a conversation, printed
//! exactly (no newline added). Needs only the template files, not the weights.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{Map, Value};
use spindle_text::read_bounded_text;

use crate::model_dir;

#[derive(Debug, Args)]
pub struct TemplateArgs {
    /// Model directory holding chat_template.jinja or tokenizer_config.json, or a GGUF file
    /// carrying tokenizer.chat_template. Default: the
    /// embedded demo.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// JSON file with the messages: a list, or an object with a `messages` list (and
    /// optionally `tools`).
    #[arg(long, value_name = "FILE")]
    pub messages: PathBuf,

    /// JSON file with the tool definitions (a list).
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,

    /// Set a template variable to a JSON value, e.g. `--var add_generation_prompt=true`
    /// or `--var force_thinking=true` (repeatable).
    #[arg(long = "var", value_name = "NAME=JSON", value_parser = parse_var)]
    pub vars: Vec<(String, Value)>,
}

fn parse_var(s: &str) -> Result<(String, Value), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=JSON"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the variable name is empty"));
    }
    // A bare word that is not JSON is taken as a string, as users type it.
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
    Ok((name.to_string(), value))
}

/// The largest `--messages` or `--tools` file read (a conversation filling a long context is a
/// few MB of JSON).
const MAX_MESSAGES_BYTES: u64 = 64 << 20;

fn read_json(path: &Path) -> Result<Value> {
    // A regular file of bounded size only: a FIFO or /dev/zero is refused, never read.
    let text = read_bounded_text(path, MAX_MESSAGES_BYTES)?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

pub fn run(args: &TemplateArgs) -> Result<ExitCode> {
    let dir = model_dir::resolve(args.model.as_ref())?;
    let template = spindle_runtime::model::load_chat_template(&dir)?;
    let (messages, mut tools) = match read_json(&args.messages)? {
        list @ Value::Array(_) => (list, None),
        Value::Object(mut obj) => match obj.remove("messages") {
            Some(list @ Value::Array(_)) => (list, obj.remove("tools")),
            _ => bail!("{}: expected a `messages` list", args.messages.display()),
        },
        _ => bail!(
            "{}: expected a list of messages or an object with `messages`",
            args.messages.display()
        ),
    };
    if let Some(path) = &args.tools {
        tools = Some(read_json(path)?);
    }
    let mut vars = Map::new();
    let mut add_generation_prompt = false;
    for (name, value) in &args.vars {
        if name == "add_generation_prompt" {
            add_generation_prompt = value.as_bool().with_context(|| {
                format!("--var add_generation_prompt={value}: expected true or false")
            })?;
        } else {
            vars.insert(name.clone(), value.clone());
        }
    }
    let text = template.render(&messages, tools.as_ref(), add_generation_prompt, &vars)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
