//! Chat templates: the checkpoint's Jinja template rendered with `minijinja` configured the way
//! transformers configures Jinja2, so a prompt is byte-identical to `apply_chat_template`.
//!
//! transformers renders with `trim_blocks`, `lstrip_blocks` and loop controls on, adds
//! `raise_exception(msg)` and a `tojson` that keeps non-ASCII characters, and passes the
//! tokenizer's special tokens (`bos_token`, `eos_token`, ...) and any extra keyword
//! arguments (`enable_thinking`, ...) as template variables.

use std::collections::BTreeMap;
use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map as JsonMap, Value as Json};

use crate::json::write_python_json;
use crate::prompt::{PromptText, Shield};
use crate::read::{read_bounded_text, MAX_TEMPLATE_BYTES, MAX_TOKENIZER_CONFIG_BYTES};
use crate::sandbox::{Cancel, RenderArgs, Workers};
use crate::tag_size;
use crate::TextError;

/// Special-token fields of `tokenizer_config.json` that transformers exposes to templates.
const SPECIAL_TOKEN_FIELDS: [&str; 4] = ["bos_token", "eos_token", "pad_token", "unk_token"];

/// A compiled chat template (or several named ones) plus the special-token strings it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names in the order they were given (`"default"` for a single template).
    names: Vec<String>,
    /// `bos_token`, `eos_token`, ... as strings, passed to every render.
    special_tokens: BTreeMap<String, String>,
    /// Child processes that render under a memory and time budget (`crate::sandbox`).
    workers: Workers,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("names", &self.names)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

/// The error `raise_exception` raises, found again in the error chain after rendering.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// One template source, named `"default"`.
    pub fn from_source(source: &str) -> Result<Self, TextError> {
        Self::from_named(vec![("default".to_string(), source.to_string())])
    }

    /// Several named templates (`tokenizer_config.json` may hold a list of `{name, template}`).
    pub fn from_named(templates: Vec<(String, String)>) -> Result<Self, TextError> {
        for (name, source) in &templates {
            if let Some((at, code)) = tag_size::oversized_tag(source, tag_size::MAX_TAG_CODE_BYTES)
            {
                return Err(TextError::TemplateSyntax {
                    name: name.clone(),
                    message: format!(
                        "the tag at byte {at} holds {code} bytes of code, more than the {} a tag \
                         may hold (an expression that deep would overflow the parser's stack)",
                        tag_size::MAX_TAG_CODE_BYTES
                    ),
                });
            }
        }
        let parse = move || {
            let mut env = new_environment();
            let mut names = Vec::with_capacity(templates.len());
            for (name, source) in templates {
                env.add_template_owned(name.clone(), source).map_err(|e| {
                    TextError::TemplateSyntax {
                        name: name.clone(),
                        message: describe(&e),
                    }
                })?;
                names.push(name);
            }
            Ok((env, names))
        };
        let failed = |message: String| TextError::TemplateSyntax {
            name: "(all)".into(),
            message,
        };
        let (env, names) = std::thread::Builder::new()
            .name("template-parse".into())
            .stack_size(tag_size::PARSE_STACK_BYTES)
            .spawn(parse)
            .map_err(|e| failed(format!("cannot start the parsing thread: {e}")))?
            .join()
            .map_err(|_| failed("the template parser panicked".into()))??;
        Ok(Self {
            env,
            names,
            special_tokens: BTreeMap::new(),
            workers: Workers::default(),
        })
    }

    /// Loads a model directory's template where transformers finds it: `chat_template.jinja`,
    /// else `chat_template` in `tokenizer_config.json` (a string or a list of
    /// `{name, template}`), else `chat_template.json`. Special tokens come from
    /// `tokenizer_config.json` when it exists.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, TextError> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        let jinja_path = dir.join("chat_template.jinja");
        let processor_path = dir.join("chat_template.json");
        let mut template = if jinja_path.is_file() {
            Self::from_source(&read_text(&jinja_path)?)?
        } else if let Some(field) = config.as_ref().and_then(|c| c.get("chat_template")) {
            Self::from_config_field(field, &config_path)?
        } else if processor_path.is_file() {
            let json = read_json(&processor_path)?;
            let field = json.get("chat_template").ok_or_else(|| {
                TextError::invalid_file(&processor_path, "no `chat_template` field")
            })?;
            Self::from_config_field(field, &processor_path)?
        } else {
            return Err(TextError::NoChatTemplate {
                dir: dir.to_path_buf(),
            });
        };
        if let Some(config) = &config {
            template.special_tokens = special_tokens(config, &config_path)?;
        }
        Ok(template)
    }

    /// Parses a `chat_template` field: a string, or a list of `{"name", "template"}`.
    fn from_config_field(field: &Json, path: &Path) -> Result<Self, TextError> {
        match field {
            Json::String(source) => Self::from_source(source),
            Json::Array(entries) => {
                let mut templates = Vec::with_capacity(entries.len());
                for (i, entry) in entries.iter().enumerate() {
                    let name = entry.get("name").and_then(Json::as_str);
                    let source = entry.get("template").and_then(Json::as_str);
                    let (Some(name), Some(source)) = (name, source) else {
                        let message =
                            format!("chat_template[{i}] needs string fields `name` and `template`");
                        return Err(TextError::invalid_file(path, message));
                    };
                    templates.push((name.to_string(), source.to_string()));
                }
                Self::from_named(templates)
            }
            _ => Err(TextError::invalid_file(
                path,
                "`chat_template` must be a string or a list of {name, template}",
            )),
        }
    }

    /// Starts a render worker now rather than at the first render (a process that is about
    /// to grow shares less with a worker forked early; see `crate::sandbox`).
    pub fn start_worker(&self) {
        self.workers.prestart(&|args| self.render_in_process(args));
    }

    /// Sets a special-token variable such as `bos_token` (overrides the config's value).
    pub fn set_special_token(&mut self, name: &str, value: &str) {
        self.special_tokens
            .insert(name.to_string(), value.to_string());
    }

    /// The names of the templates held, in the order given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The template transformers would pick: `"tool_use"` when tools are given and it exists,
    /// else `"default"`, else the only template.
    fn pick(&self, has_tools: bool) -> Result<&str, TextError> {
        let has = |name: &str| self.names.iter().any(|n| n == name);
        if has_tools && has("tool_use") {
            return Ok("tool_use");
        }
        if has("default") {
            return Ok("default");
        }
        match self.names.as_slice() {
            [only] => Ok(only),
            _ => Err(TextError::UnknownTemplateName {
                name: "default".to_string(),
                available: self.names.join(", "),
            }),
        }
    }

    /// Renders a conversation. `messages` is the OpenAI-style list of messages, `tools` the
    /// list of tool schemas, and `extra` any further template variables (`enable_thinking`,
    /// ...). A template's `raise_exception(msg)` becomes [`TextError::TemplateException`].
    /// The render runs within [`RENDER_FUEL`], [`MAX_RENDERED_BYTES`] and, in a child
    /// process, [`crate::RENDER_MEMORY_BYTES`] and [`crate::RENDER_TIME_LIMIT`].
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &JsonMap<String, Json>,
    ) -> Result<String, TextError> {
        let name = self.pick(tools.is_some())?;
        let cancel = Cancel::default();
        self.render_named(name, messages, tools, add_generation_prompt, extra, &cancel)
    }

    /// [`ChatTemplate::render`] for a prompt to be tokenized: spellings of the special tokens
    /// in `protect` inside the request's strings (message text, tool-call arguments, tool
    /// schemas, extra variables) are kept out of the template's sight and come back as plain
    /// ranges of the [`PromptText`], so only the template's own markers become special
    /// tokens. Templates see markup tags (`<think>`, `<tool_call>`, ...) as written; see
    /// `TEMPLATE_VISIBLE_TAGS`. Without protected spellings in the request the text is
    /// exactly what [`ChatTemplate::render`] returns.
    pub fn render_prompt(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &JsonMap<String, Json>,
        protect: &[String],
    ) -> Result<PromptText, TextError> {
        let cancel = Cancel::default();
        self.render_prompt_cancellable(
            messages,
            tools,
            add_generation_prompt,
            extra,
            protect,
            &cancel,
        )
    }

    /// [`ChatTemplate::render_prompt`] that stops with [`TextError::Cancelled`] (its render
    /// worker killed) once `cancel` is cancelled.
    pub fn render_prompt_cancellable(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &JsonMap<String, Json>,
        protect: &[String],
        cancel: &Cancel,
    ) -> Result<PromptText, TextError> {
        let name = self.pick(tools.is_some())?;
        let extra_json = Json::Object(extra.clone());
        let mut inputs = vec![messages, &extra_json];
        inputs.extend(tools);
        let Some(shield) = Shield::new(protect, &inputs) else {
            let text =
                self.render_named(name, messages, tools, add_generation_prompt, extra, cancel)?;
            return Ok(PromptText::trusted(text));
        };
        let marker = shield.marker();
        if self
            .env
            .templates()
            .any(|(_, t)| t.source().contains(marker))
        {
            return Err(TextError::TemplateRender {
                name: name.to_string(),
                message: format!(
                    "the template writes U+{:04X}, which spindle reserves to mark message text",
                    marker as u32
                ),
            });
        }
        let messages = shield.cover(messages);
        let tools = tools.map(|t| shield.cover(t));
        let extra = match shield.cover(&extra_json) {
            Json::Object(map) => map,
            _ => JsonMap::new(),
        };
        let rendered = self.render_named(
            name,
            &messages,
            tools.as_ref(),
            add_generation_prompt,
            &extra,
            cancel,
        )?;
        shield.uncover(&rendered, name)
    }

    fn render_named(
        &self,
        name: &str,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &JsonMap<String, Json>,
        cancel: &Cancel,
    ) -> Result<String, TextError> {
        if !messages.is_array() {
            return Err(TextError::InvalidTemplateArgument {
                field: "messages",
                message: format!("expected a list of messages, got {}", json_kind(messages)),
            });
        }
        let args = RenderArgs {
            name: name.to_string(),
            messages: messages.clone(),
            tools: tools.cloned(),
            add_generation_prompt,
            extra: extra.clone(),
        };
        self.workers
            .render(&args, cancel, &|args| self.render_in_process(args))
    }

    /// The render itself, within fuel and the output cap (in a worker, see `crate::sandbox`).
    fn render_in_process(&self, args: &RenderArgs) -> Result<String, TextError> {
        let name = args.name.as_str();
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (key, value) in &self.special_tokens {
            ctx.insert(key.clone(), Value::from(value.as_str()));
        }
        for (key, value) in &args.extra {
            ctx.insert(key.clone(), Value::from_serialize(value));
        }
        ctx.insert("messages".into(), Value::from_serialize(&args.messages));
        let tools = args
            .tools
            .as_ref()
            .map_or(Value::from(()), Value::from_serialize);
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), Value::from(()));
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(args.add_generation_prompt),
        );
        let template = self
            .env
            .get_template(name)
            .map_err(|e| render_error(name, &e))?;
        let mut out = CappedWriter::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.bytes).map_err(|e| TextError::TemplateRender {
                name: name.to_string(),
                message: format!("output is not UTF-8: {e}"),
            }),
            Err(_) if out.overflowed => Err(TextError::TemplateBudget {
                name: name.to_string(),
                budget: format!("{MAX_RENDERED_BYTES} bytes of output"),
            }),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(TextError::TemplateBudget {
                name: name.to_string(),
                budget: format!("{RENDER_FUEL} steps (fuel)"),
            }),
            Err(e) => Err(render_error(name, &e)),
        }
    }
}

/// Jinja instructions one render may run (minijinja fuel), which bounds its CPU time: 8,000
/// messages with tool calls through the Qwen3.6 template take about a million; two nested
/// `range(100000)` loops are stopped after 1-2 s. minijinja cannot be interrupted, so this is
/// also how long a render outlives a cancelled request.
pub const RENDER_FUEL: u64 = 20_000_000;

/// The most bytes a rendered prompt may have (far above any context window's worth of text).
pub const MAX_RENDERED_BYTES: usize = 256 << 20;

/// Collects the rendering and refuses to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct CappedWriter {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered prompt too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A Jinja environment configured as transformers configures Jinja2.
fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_filter("tojson", tojson);
    env
}

/// `raise_exception(msg)`: aborts the render with `msg`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`, so non-ASCII
/// stays as is and separators are `", "` and `": "` (`","` and `": "` with an indent).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "tojson: value is not JSON").with_source(e)
    })?;
    let mut out = String::new();
    write_python_json(&mut out, &json, indent, 0);
    Ok(Value::from_safe_string(out))
}

/// Turns a minijinja error into ours, recovering the message of `raise_exception`.
fn render_error(name: &str, error: &Error) -> TextError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return TextError::TemplateException {
                message: raised.0.clone(),
            };
        }
        source = e.source();
    }
    TextError::TemplateRender {
        name: name.to_string(),
        message: describe(error),
    }
}

/// A one-line description of a minijinja error with its location.
fn describe(error: &Error) -> String {
    match error.line() {
        Some(line) => format!("{error} (line {line})"),
        None => error.to_string(),
    }
}

/// Special-token strings from `tokenizer_config.json`: each a string or `{"content": ...}`.
fn special_tokens(config: &Json, path: &Path) -> Result<BTreeMap<String, String>, TextError> {
    let mut tokens = BTreeMap::new();
    for field in SPECIAL_TOKEN_FIELDS {
        let text = match config.get(field) {
            None | Some(Json::Null) => continue,
            Some(Json::String(s)) => s.clone(),
            Some(Json::Object(o)) => match o.get("content") {
                Some(Json::String(s)) => s.clone(),
                _ => {
                    return Err(TextError::invalid_file(
                        path,
                        format!("`{field}` is an object without a string `content`"),
                    ))
                }
            },
            Some(other) => {
                return Err(TextError::invalid_file(
                    path,
                    format!(
                        "`{field}` must be a string or an object, got {}",
                        json_kind(other)
                    ),
                ))
            }
        };
        tokens.insert(field.to_string(), text);
    }
    Ok(tokens)
}

fn read_text(path: &Path) -> Result<String, TextError> {
    read_bounded_text(path, MAX_TEMPLATE_BYTES)
}

fn read_json(path: &Path) -> Result<Json, TextError> {
    serde_json::from_str(&read_bounded_text(path, MAX_TOKENIZER_CONFIG_BYTES)?)
        .map_err(|e| TextError::invalid_file(path, format!("invalid JSON: {e}")))
}

/// The JSON type name of a value, for messages.
pub(crate) fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}
