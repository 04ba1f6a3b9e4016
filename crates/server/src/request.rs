//! Request bodies: the raw JSON shapes of OpenAI's API (serde structs, unknown fields ignored),
//! parsed once at the edge into typed requests with every field checked. Every error names the
//! field at fault in OpenAI's `param` (`messages[2].role`, `temperature`).

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};
use spindle_runtime::generate::MAX_TOP_LOGPROBS;
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{GenerateOptions, Grammar, ToolSpec};

use crate::error::ApiError;
use crate::images::{self, Content, RequestImage};

/// Fields shared by `/v1/chat/completions` and `/v1/completions`. `model` is not read: one
/// model is served, whatever a request names.
#[derive(Debug, Default, Deserialize)]
pub struct RawCommon {
    pub stream: Option<bool>,
    pub stream_options: Option<RawStreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Value>,
    pub n: Option<i64>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub logit_bias: Option<Map<String, Value>>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub min_tokens: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    /// Not a request field: Ollama's `repeat_last_n` ([`SamplingParams::penalty_window`]).
    #[serde(skip)]
    pub penalty_window: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawStreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct RawChat {
    pub messages: Vec<RawMessage>,
    pub tools: Option<Vec<RawTool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub reasoning_effort: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for a system message.
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Deserialize)]
pub struct RawMessage {
    pub role: Role,
    pub content: Option<Value>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<RawToolCall>>,
    pub tool_call_id: Option<String>,
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct RawToolCall {
    pub id: Option<String>,
    pub function: RawFunctionCall,
}

#[derive(Debug, Deserialize)]
pub struct RawFunctionCall {
    pub name: String,
    /// A JSON string (OpenAI) or an object.
    pub arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct RawTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: RawFunctionDef,
}

#[derive(Debug, Deserialize)]
pub struct RawFunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    /// The arguments follow `parameters` exactly (OpenAI's structured outputs for tools):
    /// enforced by a grammar whether the call is forced or not.
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct RawCompletion {
    pub prompt: Value,
    /// spindle's extension: `false` encodes special-token spellings in a text prompt as plain
    /// text (default `true`: a raw prompt may hold the chat format's markers).
    pub special_tokens: Option<bool>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
}

/// How to generate and how to answer, common to both endpoints.
#[derive(Debug, Clone)]
pub struct Generation {
    pub stream: bool,
    pub include_usage: bool,
    pub options: GenerateOptions,
    /// Choices to generate (`n`), each its own sequence: choice `i` samples with seed
    /// `seed + i` when a seed is given.
    pub n: usize,
    /// The structured output asked for (`response_format`, `guided_*`, ...), to be compiled
    /// against the model, with the field that asked.
    pub grammar: Option<(String, Grammar)>,
    /// `tool_choice` `none`: the model may not call a tool, so the tool-call opener is never
    /// sampled (the template sees no tools, but a conversation holding earlier calls could
    /// lead it to write one).
    pub tools_off: bool,
    /// The most tokens a reasoning block may take (Anthropic's `thinking.budget_tokens`).
    pub reasoning_budget: Option<usize>,
}

impl Generation {
    /// The options of choice `index`: its own seed (`seed + index`, wrapping; vLLM gives each
    /// of `n` sequences its own generator too).
    pub fn choice_options(&self, index: usize) -> GenerateOptions {
        let mut options = self.options.clone();
        options.sampling.seed = options.sampling.seed.map(|s| s.wrapping_add(index as u64));
        options
    }
}

/// A checked chat request: the messages and tools in the shape the chat template reads.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub generation: Generation,
    pub messages: Value,
    pub tools: Option<Value>,
    pub vars: Map<String, Value>,
    /// At most one tool call is returned (`parallel_tool_calls: false`).
    pub single_tool_call: bool,
    /// The images of `image_url` parts, in the order the template writes their placeholders.
    pub images: Vec<RequestImage>,
}

/// A checked completion request.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub generation: Generation,
    pub prompt: PromptInput,
    /// Whether a text prompt's special-token spellings become special tokens.
    pub special_tokens: bool,
    /// The prompt comes back before the answer.
    pub echo: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// Deserializes `value` as `T`; a failure names the path of the field at fault.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let mut param = if path == "." { String::new() } else { path };
        // A missing field is reported at its parent; name the field itself.
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            param = if param.is_empty() {
                field.to_owned()
            } else {
                format!("{param}.{field}")
            };
        }
        let shown = if param.is_empty() { "request" } else { &param };
        ApiError::invalid(param.clone(), format!("{shown}: {message}"))
    })
}

/// Parses a request body, which must be a JSON object.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::malformed(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::malformed(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

impl RawCommon {
    /// Checks every field and fills what is missing from the model's `defaults`.
    pub fn check(&self, defaults: &SamplingParams) -> Result<Generation, ApiError> {
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "n",
                    format!("n is {n} but must be between 1 and {MAX_CHOICES}"),
                ))
            }
        };
        let min_tokens = match self.min_tokens {
            None => 0,
            Some(m) if m >= 0 => usize::try_from(m).unwrap_or(usize::MAX),
            Some(m) => {
                return Err(ApiError::invalid(
                    "min_tokens",
                    format!("min_tokens is {m} but must be 0 or more"),
                ))
            }
        };
        if self.skip_special_tokens == Some(false) {
            return Err(ApiError::invalid(
                "skip_special_tokens",
                "skip_special_tokens false is not supported: control tokens are never shown",
            ));
        }
        if self.include_stop_str_in_output == Some(true) {
            return Err(ApiError::invalid(
                "include_stop_str_in_output",
                "include_stop_str_in_output true is not supported: stop strings are not shown",
            ));
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => Some(("max_completion_tokens", n)),
            (None, Some(n)) => Some(("max_tokens", n)),
            (None, None) => None,
        };
        let max_tokens = match max_tokens {
            Some((field, n)) if n < 1 => {
                return Err(ApiError::invalid(
                    field,
                    format!("{field} is {n} but must be at least 1"),
                ))
            }
            Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        };
        let top_k = match self.top_k {
            None => defaults.top_k,
            Some(k) if k == -1 || k == 0 => 0,
            Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("top_k is {k} but must be -1 or 0 (off) or a positive count"),
                ))
            }
        };
        let f = |v: Option<f64>, default: f32| v.map_or(default, |x| x as f32);
        let sampling = SamplingParams {
            temperature: f(self.temperature, defaults.temperature),
            top_k,
            top_p: f(self.top_p, defaults.top_p),
            min_p: f(self.min_p, defaults.min_p),
            repetition_penalty: f(self.repetition_penalty, defaults.repetition_penalty),
            presence_penalty: f(self.presence_penalty, defaults.presence_penalty),
            frequency_penalty: f(self.frequency_penalty, defaults.frequency_penalty),
            penalty_window: self.penalty_window,
            // A negative seed is as good a seed as any: keep its bits.
            seed: self.seed.map(|s| s as u64).or(defaults.seed),
        };
        sampling
            .validate()
            .map_err(|e| ApiError::invalid(e.field, e.to_string()))?;
        Ok(Generation {
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            options: GenerateOptions {
                sampling,
                max_tokens,
                stop: stop_strings(self.stop.as_ref())?,
                logit_bias: logit_bias(self.logit_bias.as_ref())?,
                stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
                min_tokens,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                constraint: None,
                logprobs: None,
                banned_ids: Vec::new(),
                reasoning_budget: None,
            },
            n,
            grammar: None,
            tools_off: false,
            reasoning_budget: None,
        })
    }
}

/// The most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// `logit_bias`: token ids (as strings, OpenAI's shape) to a bias in [-100, 100].
fn logit_bias(bias: Option<&Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::new();
    for (key, value) in bias.into_iter().flatten() {
        let param = format!("logit_bias.{key}");
        let id: u32 = key.trim().parse().map_err(|_| {
            ApiError::invalid(
                &param,
                format!("logit_bias keys are token ids, not {key:?}"),
            )
        })?;
        let b = value
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| {
                ApiError::invalid(&param, "a logit bias is a number from -100 to 100")
            })?;
        out.push((id, b as f32));
    }
    Ok(out)
}

/// Refuses a field outside `accepted` (implemented) and `ignored` (known not to change the
/// output): a field that would change the output and is not implemented must not be dropped
/// silently. A null field counts as absent (as on every other endpoint), and `modalities:
/// ["text"]`, the default every client may send, asks for what is served.
pub fn check_fields(body: &Value, accepted: &[&str], ignored: &[&str]) -> Result<(), ApiError> {
    let Some(fields) = body.as_object() else {
        return Ok(());
    };
    for (key, value) in fields {
        let default =
            value.is_null() || (key == "modalities" && *value == serde_json::json!(["text"]));
        if !default && !accepted.contains(&key.as_str()) && !ignored.contains(&key.as_str()) {
            return Err(ApiError::invalid(
                key,
                format!("{key} is not supported by this server"),
            ));
        }
    }
    Ok(())
}

/// Every field `/v1/chat/completions` reads.
pub const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
];

/// Every field `/v1/completions` reads.
pub const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "special_tokens",
    "echo",
    "suffix",
    "best_of",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "logprobs",
    "logit_bias",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
];

/// Fields accepted and ignored because they do not change what is generated: who asks
/// (`user`, `metadata`, `safety_identifier`), caching and storage hints, the choice of
/// structured-output engine.
pub const IGNORED_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "prediction",
    "guided_decoding_backend",
    "request_id",
    "priority",
];

impl RawCommon {
    /// Chat's `logprobs` (a boolean) and `top_logprobs` (0 to 20, only with `logprobs`): the
    /// alternatives to report per token, `None` when off.
    pub fn chat_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = match &self.logprobs {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    "logprobs must be true or false",
                ))
            }
        };
        let top = match self.top_logprobs {
            None => 0,
            Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("top_logprobs is {k} but must be between 0 and {MAX_TOP_LOGPROBS}"),
                ))
            }
        };
        if !on && self.top_logprobs.is_some_and(|k| k > 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        Ok(on.then_some(top))
    }

    /// Completions' `logprobs`: the number of alternatives (0 to 20) per token, `None` when
    /// absent.
    pub fn completion_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match &self.logprobs {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_i64() {
                Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => Ok(Some(k as usize)),
                _ => Err(ApiError::invalid(
                    "logprobs",
                    format!(
                        "logprobs must be a number of alternatives from 0 to {MAX_TOP_LOGPROBS}"
                    ),
                )),
            },
        }
    }
}

/// `stop`: a string or a list of non-empty strings.
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |message: &str| ApiError::invalid("stop", message.to_owned());
    let list = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("stop must be a string or a list of strings"))?,
        Some(_) => return Err(bad("stop must be a string or a list of strings")),
    };
    if list.iter().any(String::is_empty) {
        return Err(bad("stop strings must not be empty"));
    }
    if list.len() > 16 {
        return Err(bad("at most 16 stop strings are accepted"));
    }
    // A stream holds back as much text as the longest stop string, and every token is checked
    // against each: a bound keeps both small.
    if let Some(long) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(bad(&format!(
            "a stop string of {} bytes: at most {MAX_STOP_BYTES} are accepted",
            long.len()
        )));
    }
    Ok(list)
}

/// The longest stop string accepted, in bytes.
const MAX_STOP_BYTES: usize = 1024;

impl RawCompletion {
    pub fn check(&self, generation: Generation) -> Result<CompletionRequest, ApiError> {
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "suffix is not supported"));
        }
        if self.best_of.is_some_and(|b| b as usize != generation.n) {
            return Err(ApiError::invalid(
                "best_of",
                "best_of must equal n: choices are not ranked",
            ));
        }
        let bad = || {
            ApiError::invalid(
                "prompt",
                "prompt must be a string, a list holding one string, or a list of token ids",
            )
        };
        let prompt = match &self.prompt {
            Value::String(s) => PromptInput::Text(s.clone()),
            Value::Array(items) => match items.as_slice() {
                [Value::String(s)] => PromptInput::Text(s.clone()),
                [] => return Err(ApiError::invalid("prompt", "prompt must not be empty")),
                _ => PromptInput::Tokens(
                    items
                        .iter()
                        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(bad)?,
                ),
            },
            _ => return Err(bad()),
        };
        if prompt == PromptInput::Text(String::new()) {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"));
        }
        Ok(CompletionRequest {
            generation,
            prompt,
            special_tokens: self.special_tokens.unwrap_or(true),
            echo: self.echo.unwrap_or(false),
        })
    }
}

impl RawChat {
    pub fn check(self, mut generation: Generation) -> Result<ChatRequest, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "messages must hold at least one message",
            ));
        }
        let mut images = Vec::new();
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_template(i, &mut images))
            .collect::<Result<Vec<_>, _>>()?;
        let (tools, tool_grammar) = self.checked_tools()?;
        generation.tools_off = matches!(&self.tool_choice, Some(Value::String(s)) if s == "none");
        if let Some((param, grammar)) = tool_grammar {
            if let Some((field, _)) = &generation.grammar {
                return Err(ApiError::invalid(
                    param,
                    match param {
                        "tool_choice" => format!(
                            "a required or named tool_choice cannot be combined with {field}"
                        ),
                        _ => format!(
                            "strict tools under tool_choice auto cannot be combined with {field}: \
                             one constraint on the answer at most"
                        ),
                    },
                ));
            }
            generation.grammar = Some((param.into(), grammar));
        }
        let vars = reasoning_vars(
            self.chat_template_kwargs.clone().unwrap_or_default(),
            self.reasoning_effort.as_deref(),
        )?;
        Ok(ChatRequest {
            generation,
            messages: Value::Array(messages),
            tools,
            vars,
            single_tool_call: self.parallel_tool_calls == Some(false),
            images,
        })
    }

    /// The tools the template sees, after `tool_choice`, and the grammar a required or named
    /// `tool_choice` puts on the answer, or under `auto` a `strict` tool (with the parameter it
    /// is charged to).
    #[allow(clippy::type_complexity)]
    fn checked_tools(&self) -> Result<(Option<Value>, Option<(&'static str, Grammar)>), ApiError> {
        let tools = self.tools.as_deref().unwrap_or_default();
        for (i, tool) in tools.iter().enumerate() {
            if tool.kind != "function" {
                return Err(ApiError::invalid(
                    format!("tools[{i}].type"),
                    format!(
                        "tool type {:?} is not supported: use \"function\"",
                        tool.kind
                    ),
                ));
            }
            if tool.function.name.is_empty() {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.name"),
                    "a function needs a name",
                ));
            }
            tool_schema(
                tool.function.parameters.as_ref(),
                &format!("tools[{i}].function.parameters"),
            )?;
        }
        let as_json = |tools: &[&RawTool]| {
            Value::Array(tools.iter().map(|t| tool_json(t)).collect::<Vec<_>>())
        };
        let all: Vec<&RawTool> = tools.iter().collect();
        let bad = |message: String| ApiError::invalid("tool_choice", message);
        let parallel = self.parallel_tool_calls != Some(false);
        let forced = |tools: &[&RawTool], parallel: bool| {
            let specs: Vec<ToolSpec> = tools
                .iter()
                .map(|t| ToolSpec {
                    name: t.function.name.clone(),
                    parameters: t.function.parameters.clone(),
                })
                .collect();
            Grammar::tool_calls(&specs, parallel)
                .map_err(|e| ApiError::invalid("tool_choice", e.to_string()))
        };
        let mut grammar = None;
        let optional = |tools: &[&RawTool]| -> Result<Option<Grammar>, ApiError> {
            if !tools.iter().any(|t| t.function.strict == Some(true)) {
                return Ok(None);
            }
            let specs: Vec<(ToolSpec, bool)> = tools
                .iter()
                .map(|t| {
                    let spec = ToolSpec {
                        name: t.function.name.clone(),
                        parameters: t.function.parameters.clone(),
                    };
                    (spec, t.function.strict == Some(true))
                })
                .collect();
            Grammar::optional_tool_calls(&specs, parallel)
                .map(Some)
                .map_err(|e| ApiError::invalid("tools", e.to_string()))
        };
        let chosen = match &self.tool_choice {
            None | Some(Value::Null) => {
                grammar = optional(&all)?.map(|g| ("tools", g));
                all
            }
            Some(Value::String(s)) if s == "auto" => {
                grammar = optional(&all)?.map(|g| ("tools", g));
                all
            }
            Some(Value::String(s)) if s == "none" => Vec::new(),
            Some(Value::String(s)) if s == "required" => {
                if all.is_empty() {
                    return Err(bad("tool_choice is \"required\" but no tools are given".into()));
                }
                grammar = Some(("tool_choice", forced(&all, parallel)?));
                all
            }
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}".into())
                    })?;
                let named: Vec<&RawTool> =
                    all.into_iter().filter(|t| t.function.name == name).collect();
                if named.is_empty() {
                    return Err(bad(format!("tool_choice names {name:?}, which is not in tools")));
                }
                grammar = Some(("tool_choice", forced(&named[..1], false)?));
                named
            }
            Some(other) => {
                return Err(bad(format!(
                    "tool_choice must be \"auto\", \"none\", \"required\" or a named function, not {other}"
                )))
            }
        };
        Ok(((!chosen.is_empty()).then(|| as_json(&chosen)), grammar))
    }
}

/// A tool's parameter schema, which must be a JSON Schema object (absent or null: none);
/// `param` names the field in messages.
pub fn tool_schema<'a>(
    schema: Option<&'a Value>,
    param: &str,
) -> Result<Option<&'a Value>, ApiError> {
    match schema {
        None | Some(Value::Null) => Ok(None),
        Some(s @ Value::Object(_)) => Ok(Some(s)),
        Some(other) => {
            let kind = match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            };
            Err(ApiError::invalid(
                param,
                format!("{param} must be a JSON Schema object, not {kind}"),
            ))
        }
    }
}

fn tool_json(tool: &RawTool) -> Value {
    let f = &tool.function;
    let mut function = Map::new();
    function.insert("name".into(), Value::String(f.name.clone()));
    if let Some(d) = &f.description {
        function.insert("description".into(), Value::String(d.clone()));
    }
    if let Some(p) = &f.parameters {
        function.insert("parameters".into(), p.clone());
    }
    serde_json::json!({"type": "function", "function": function})
}

impl RawMessage {
    /// The message as the chat template reads it: text content (with `{"type": "image"}`
    /// items where a user message has images, whose bytes go to `images`), `developer` as
    /// `system`, tool call arguments as objects.
    fn to_template(&self, index: usize, images: &mut Vec<RequestImage>) -> Result<Value, ApiError> {
        let at = |field: &str| format!("messages[{index}].{field}");
        let before = images.len();
        let content = content_parts(self.content.as_ref(), &at("content"), images)?;
        if images.len() > before && self.role != Role::User {
            return Err(ApiError::invalid(
                images[before].param.clone(),
                "images are only read in user messages",
            ));
        }
        let role = match self.role {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let calls = self.tool_calls.as_deref().unwrap_or_default();
        let calls_only = self.role == Role::Assistant && !calls.is_empty();
        if content.is_none() && !calls_only {
            return Err(ApiError::invalid(
                at("content"),
                format!("a {role} message needs content"),
            ));
        }
        if !calls.is_empty() && self.role != Role::Assistant {
            return Err(ApiError::invalid(
                at("tool_calls"),
                "only assistant messages carry tool_calls",
            ));
        }
        let mut m = Map::new();
        m.insert("role".into(), Value::String(role.into()));
        m.insert(
            "content".into(),
            content.unwrap_or_else(|| Value::String(String::new())),
        );
        if let Some(name) = &self.name {
            m.insert("name".into(), Value::String(name.clone()));
        }
        if let Some(r) = &self.reasoning_content {
            m.insert("reasoning_content".into(), Value::String(r.clone()));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), Value::String(id.clone()));
        }
        if !calls.is_empty() {
            let calls = calls
                .iter()
                .enumerate()
                .map(|(j, call)| {
                    let param = at(&format!("tool_calls[{j}].function.arguments"));
                    let arguments = call_arguments(call.function.arguments.as_ref(), &param)?;
                    let mut c = serde_json::json!({
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": arguments},
                    });
                    if let Some(id) = &call.id {
                        c["id"] = Value::String(id.clone());
                    }
                    Ok(c)
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        Ok(Value::Object(m))
    }
}

/// Message content: a string, or a list of parts: `{"type": "text", "text": ...}` (joined)
/// and `{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}`, whose
/// bytes go to `images` and which the template sees as `{"type": "image"}`. Content without
/// images is the joined text, exactly as before images were read.
fn content_parts(
    content: Option<&Value>,
    param: &str,
    images: &mut Vec<RequestImage>,
) -> Result<Option<Value>, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Value::String(s.clone()))),
        Some(Value::Array(parts)) => {
            let mut content = Content::default();
            for (k, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => content.push_text(t),
                    (Some("image_url"), _) => {
                        images.push(image_url_part(part, &format!("{param}[{k}]"))?);
                        content.push_image();
                    }
                    (Some(kind @ ("image" | "input_audio" | "video" | "file")), _) => {
                        return Err(ApiError::invalid(
                            format!("{param}[{k}]"),
                            format!(
                                "{kind} content is not supported: this server reads text and \
                                 image_url parts (data: URLs)"
                            ),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}[{k}]"),
                            "a content part must be {\"type\": \"text\", \"text\": \"...\"} \
                             or {\"type\": \"image_url\", \"image_url\": {\"url\": \"data:...\"}}",
                        ))
                    }
                }
            }
            Ok(Some(content.into_value()))
        }
        Some(_) => Err(ApiError::invalid(
            param,
            "content must be a string or a list of content parts",
        )),
    }
}

/// An `image_url` part: `{"url": "data:..."}` (or the URL as a bare string, which some
/// clients send). `detail` is accepted and ignored: it changes nothing here, every image is
/// read at the processor's own resolution (`smart_resize`).
fn image_url_part(part: &Value, param: &str) -> Result<RequestImage, ApiError> {
    let field = format!("{param}.image_url");
    let url = match part.get("image_url") {
        Some(Value::String(url)) => url.as_str(),
        Some(Value::Object(o)) => {
            if let Some(detail) = o.get("detail").filter(|d| !d.is_null()) {
                if !matches!(detail.as_str(), Some("auto" | "low" | "high")) {
                    return Err(ApiError::invalid(
                        format!("{field}.detail"),
                        format!(
                            "{field}.detail must be \"auto\", \"low\" or \"high\", not {detail}"
                        ),
                    ));
                }
            }
            o.get("url").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    format!("{field}.url"),
                    format!("{field}.url (a data: URL) is required"),
                )
            })?
        }
        _ => {
            return Err(ApiError::invalid(
                &field,
                format!("{field} must be {{\"url\": \"data:image/png;base64,...\"}}"),
            ))
        }
    };
    let url_param = if part["image_url"].is_string() {
        field
    } else {
        format!("{field}.url")
    };
    images::from_url(url, &url_param)
}

/// Tool call arguments for the template: an object, from a JSON string or an object.
fn call_arguments(arguments: Option<&Value>, param: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::invalid(
            param,
            "arguments must be a JSON object (or a string holding one)",
        )
    };
    match arguments {
        None | Some(Value::Null) => Ok(Value::Object(Map::new())),
        Some(Value::Object(o)) => Ok(Value::Object(o.clone())),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(Value::Object(Map::new())),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// Sets the chat template's reasoning switch: `enable_thinking` (Qwen3, Qwen3.5 templates)
/// and `force_thinking` (Qwen3.6, whose generation prompt opens `<think>` only with it). A
/// variable the request already sets is kept.
pub fn set_thinking(vars: &mut Map<String, Value>, on: bool) {
    vars.entry("enable_thinking").or_insert(Value::Bool(on));
    vars.entry("force_thinking").or_insert(Value::Bool(on));
}

/// Whether a `reasoning_effort` (OpenAI's levels) asks for reasoning: `none` and `minimal`
/// turn it off, `low` to `xhigh` on (the Qwen templates have no levels: `reasoning_effort` is
/// also passed to the template as a variable, as vLLM does, for templates that read it).
pub fn effort_thinks(effort: &str, param: &str) -> Result<bool, ApiError> {
    match effort {
        "none" | "minimal" => Ok(false),
        "low" | "medium" | "high" | "xhigh" => Ok(true),
        other => Err(ApiError::invalid(
            param,
            format!("{param} is {other:?}: use none, minimal, low, medium, high or xhigh"),
        )),
    }
}

/// `value` as JSON, cut to about 60 characters (a message may quote what it refuses).
pub fn brief(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text,
    }
}

/// The template variables of an OpenAI chat request: `chat_template_kwargs`, with
/// `enable_thinking` also setting Qwen3.6's `force_thinking` and `reasoning_effort` setting
/// both (a variable given explicitly wins).
pub fn reasoning_vars(
    mut vars: Map<String, Value>,
    reasoning_effort: Option<&str>,
) -> Result<Map<String, Value>, ApiError> {
    // The reasoning switches: a template reads anything but `false` as on.
    for key in ["enable_thinking", "force_thinking"] {
        if let Some(v) = vars.get(key).filter(|v| !v.is_boolean()) {
            let param = format!("chat_template_kwargs.{key}");
            return Err(ApiError::invalid(
                param.clone(),
                format!("{param} = {}: expected true or false", brief(v)),
            ));
        }
    }
    if let Some(on) = vars.get("enable_thinking").and_then(Value::as_bool) {
        set_thinking(&mut vars, on);
    }
    if let Some(effort) = reasoning_effort {
        let on = effort_thinks(effort, "reasoning_effort")?;
        set_thinking(&mut vars, on);
        vars.entry("reasoning_effort")
            .or_insert_with(|| Value::String(effort.to_owned()));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<ChatRequest, ApiError> {
        let common: RawCommon = from_value(&body)?;
        let generation = common.check(&SamplingParams::default())?;
        from_value::<RawChat>(&body)?.check(generation)
    }

    fn param(body: Value) -> Option<String> {
        chat(body).unwrap_err().param
    }

    #[test]
    fn stop_strings_are_bounded() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let long = "x".repeat(MAX_STOP_BYTES + 1);
        assert_eq!(
            param(json!({"messages": user, "stop": [long]})).as_deref(),
            Some("stop")
        );
        let fits = "x".repeat(MAX_STOP_BYTES);
        assert!(chat(json!({"messages": user, "stop": fits})).is_ok());
    }

    #[test]
    fn tool_choice_none_turns_tool_calls_off() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let off = |choice: Value| {
            chat(json!({"messages": user, "tools": tools, "tool_choice": choice}))
                .unwrap()
                .generation
                .tools_off
        };
        assert!(off(json!("none")));
        assert!(!off(json!("auto")));
        assert!(!off(json!("required")));
    }

    #[test]
    fn unknown_fields_are_refused_unless_unset_or_the_default_modality() {
        let check = |body: Value| check_fields(&body, CHAT_FIELDS, IGNORED_FIELDS);
        assert!(check(json!({"audio": null, "functions": null, "modalities": ["text"]})).is_ok());
        for (body, at) in [
            (json!({"audio": {"voice": "x"}}), "audio"),
            (json!({"modalities": ["text", "audio"]}), "modalities"),
            (json!({"functions": []}), "functions"),
        ] {
            assert_eq!(check(body).unwrap_err().param.as_deref(), Some(at));
        }
    }

    #[test]
    fn errors_name_the_field() {
        let user = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param(json!({})).as_deref(), Some("messages"));
        assert_eq!(param(json!({"messages": []})).as_deref(), Some("messages"));
        assert_eq!(
            param(json!({"messages": [{"role": "robot", "content": "x"}]})).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(json!({"messages": [{"role": "user"}]})).as_deref(),
            Some("messages[0].content")
        );
        assert_eq!(
            param(json!({"messages": user, "temperature": "hot"})).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            param(json!({"messages": user, "temperature": -1})).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            param(json!({"messages": user, "max_tokens": -5})).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            param(json!({"messages": user, "n": 17})).as_deref(),
            Some("n")
        );
        assert_eq!(
            param(json!({"messages": user, "stop": 3})).as_deref(),
            Some("stop")
        );
        assert_eq!(
            param(json!({"messages": user, "tool_choice": "required"})).as_deref(),
            Some("tool_choice")
        );
    }

    #[test]
    fn defaults_fill_missing_fields_and_tool_choice_none_drops_tools() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let r = chat(json!({
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                         {"role": "user", "content": "hi"}],
            "tools": tools, "tool_choice": "none", "stop": "x", "max_completion_tokens": 7,
            "top_k": -1, "seed": 3
        }))
        .unwrap();
        assert!(r.tools.is_none());
        assert_eq!(
            r.messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        let o = &r.generation.options;
        assert_eq!(
            (o.max_tokens, o.stop.clone()),
            (Some(7), vec!["x".to_owned()])
        );
        assert_eq!((o.sampling.top_k, o.sampling.seed), (0, Some(3)));
        let auto = chat(json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools}));
        assert_eq!(auto.unwrap().tools.unwrap()[0]["function"]["name"], "f");
    }

    #[test]
    fn assistant_tool_call_arguments_become_objects() {
        let r = chat(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21"}
        ]}))
        .unwrap();
        assert_eq!(
            r.messages[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        let bad = param(json!({"messages": [
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]}
        ]}));
        assert_eq!(
            bad.as_deref(),
            Some("messages[0].tool_calls[0].function.arguments")
        );
    }
}
