//! The request and response shapes of the APIs spoken besides OpenAI's Chat Completions:
//! Anthropic's Messages, OpenAI's Responses and Ollama's. Each module turns its raw JSON into
//! what the chat template reads (messages and tools in OpenAI's shape), a [`Generation`] and
//! the reasoning switch, checking every field at the edge; and turns a finished or streamed
//! generation back into its API's shapes.
//!
//! What is shared: the table of fields each endpoint reads ([`Fields`], so a field that would
//! change the answer and is not implemented is refused by name instead of ignored), the
//! sampling fields mapped through [`RawCommon`], the reasoning switch, and the constraints
//! (forced tool calls, JSON output) handed to constrained decoding ([`apply_constraint`]).

pub mod anthropic;
pub mod ollama;
pub mod responses;

use serde_json::{json, Map, Value};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{Grammar, ToolSpec};

use crate::error::ApiError;
pub use crate::request::{effort_thinks, set_thinking, tool_schema};
use crate::request::{Generation, RawCommon};

/// The top-level fields an endpoint accepts. Anything else is refused by name (400): a field
/// a client sends expecting an effect must never be dropped silently.
pub struct Fields {
    /// The endpoint, for messages (`/v1/messages`).
    pub endpoint: &'static str,
    /// Fields read and honoured.
    pub read: &'static [&'static str],
    /// Fields accepted and ignored because they do not change the answer (metadata, caching
    /// hints, resource settings).
    pub ignored: &'static [&'static str],
}

impl Fields {
    /// Refuses the first field of `object` that is neither read nor ignored; `at` is the path
    /// of `object` in the request (`""` at the top, `options.` inside Ollama's options). A
    /// null, empty string or empty list counts as absent (clients such as ollama-python send
    /// `"suffix": ""` or `"context": []` for "not set").
    pub fn check(&self, object: &Value, at: &str) -> Result<(), ApiError> {
        let Some(object) = object.as_object() else {
            // A nested object of fields given as something else would be ignored.
            if at.is_empty() || object.is_null() {
                return Ok(());
            }
            let param = at.trim_end_matches('.');
            return Err(ApiError::invalid(
                param,
                format!("{param} must be an object of fields"),
            ));
        };
        for (name, value) in object {
            let known = self.read.contains(&name.as_str()) || self.ignored.contains(&name.as_str());
            let unset = match value {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => false,
            };
            if !known && !unset {
                return Err(ApiError::invalid(
                    format!("{at}{name}"),
                    format!(
                        "{at}{name} is not supported by {}: this server does not implement it, \
                         and would rather refuse it than ignore it (accepted: {})",
                        self.endpoint,
                        self.read.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The field `name` of `object` as a `T` (absent or null: `None`); an error names `{at}{name}`.
pub fn optional<T: serde::de::DeserializeOwned>(
    object: &Value,
    name: &str,
    at: &str,
) -> Result<Option<T>, ApiError> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|e| ApiError::invalid(format!("{at}{name}"), format!("{at}{name}: {e}"))),
    }
}

/// A constraint on what the model may write, which needs constrained decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Some tool must be called (`tool_choice` `required` / `any`); more than one call only
    /// when `parallel` (not with `parallel_tool_calls: false`, Anthropic's
    /// `disable_parallel_tool_use`).
    AnyTool { parallel: bool },
    /// This tool must be called.
    Tool(String),
    /// No call is forced, but an answer's calls are held to the grammar: at most one unless
    /// `parallel` (`parallel_tool_calls: false`, `disable_parallel_tool_use`), and the
    /// arguments of the tools named in `strict` valid against their schemas.
    OptionalTools { strict: Vec<String>, parallel: bool },
    /// Valid JSON.
    Json,
    /// JSON valid against this schema.
    JsonSchema(Value),
}

/// Puts a constraint named by `param` on `generation` as a grammar, compiled against the model
/// when the generation starts (a bad schema is then a 400 naming `param`). `tools` are the
/// tools the template sees (a forced call is one of them, its arguments valid against its
/// schema). A second constraint is refused by name.
pub fn apply_constraint(
    generation: &mut Generation,
    param: &str,
    constraint: Constraint,
    tools: Option<&Value>,
) -> Result<(), ApiError> {
    if let Some((field, _)) = &generation.grammar {
        return Err(ApiError::invalid(
            param,
            format!(
                "{param} cannot be combined with {field}: one constraint on the answer at most"
            ),
        ));
    }
    let specs = |only: Option<&str>| -> Vec<ToolSpec> {
        tools
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.get("function"))
            .filter_map(|f| {
                let name = f.get("name")?.as_str()?;
                (only.is_none() || only == Some(name)).then(|| ToolSpec {
                    name: name.to_owned(),
                    parameters: f.get("parameters").cloned(),
                })
            })
            .collect()
    };
    let grammar = match constraint {
        Constraint::Json => Grammar::JsonObject,
        Constraint::JsonSchema(Value::Null) => Grammar::JsonObject,
        Constraint::JsonSchema(schema) => Grammar::JsonSchema(schema),
        Constraint::AnyTool { .. } | Constraint::Tool(_) => {
            let (specs, parallel) = match &constraint {
                Constraint::Tool(name) => (specs(Some(name)), false),
                Constraint::AnyTool { parallel } => (specs(None), *parallel),
                _ => unreachable!("matched above"),
            };
            if specs.is_empty() {
                return Err(ApiError::invalid(
                    param,
                    format!("{param} forces a tool call but names no tool the request defines"),
                ));
            }
            Grammar::tool_calls(&specs, parallel)
                .map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?
        }
        Constraint::OptionalTools { strict, parallel } => {
            let specs: Vec<(ToolSpec, bool)> = specs(None)
                .into_iter()
                .map(|spec| {
                    let strict = strict.contains(&spec.name);
                    (spec, strict)
                })
                .collect();
            if specs.is_empty() {
                return Ok(());
            }
            Grammar::optional_tool_calls(&specs, parallel)
                .map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?
        }
    };
    generation.grammar = Some((param.to_owned(), grammar));
    Ok(())
}

/// Refuses a conversation whose last message (at `param`) is the assistant's: Anthropic and
/// Ollama continue such a turn (a prefill), which the chat template cannot render (it
/// closes every assistant turn and opens a new one).
pub fn refuse_prefill(messages: &[Value], param: &str) -> Result<(), ApiError> {
    if messages.last().is_some_and(|m| m["role"] == "assistant") {
        return Err(ApiError::invalid(
            param,
            format!(
                "{param}: the last message is the assistant's; continuing (prefilling) an \
                 assistant turn is not supported: end with a user or tool message"
            ),
        ));
    }
    Ok(())
}

/// A tool in the shape the chat template reads.
pub fn template_tool(name: &str, description: Option<&str>, parameters: Option<&Value>) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name.to_owned()));
    if let Some(d) = description {
        function.insert("description".into(), Value::String(d.to_owned()));
    }
    if let Some(p) = parameters {
        function.insert("parameters".into(), p.clone());
    }
    json!({"type": "function", "function": function})
}

/// An assistant tool call in the shape the chat template reads (`arguments` an object).
pub fn template_tool_call(id: Option<&str>, name: &str, arguments: Value) -> Value {
    let mut call = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
    if let Some(id) = id {
        call["id"] = Value::String(id.to_owned());
    }
    call
}

/// Tool-call arguments given as a JSON string (OpenAI, Responses) as the object the template
/// reads.
pub fn arguments_object(arguments: &Value, param: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::invalid(
            param,
            format!("{param} must be a JSON object or a string holding one"),
        )
    };
    match arguments {
        Value::Null => Ok(json!({})),
        Value::Object(_) => Ok(arguments.clone()),
        Value::String(s) if s.trim().is_empty() => Ok(json!({})),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// Checks the sampling fields an API maps onto OpenAI's (`common`), filling what is missing
/// from the model's `defaults`; an error names the API's own field (`rename` maps OpenAI's
/// name to it).
pub fn generation(
    common: RawCommon,
    defaults: &SamplingParams,
    rename: &[(&str, &str)],
) -> Result<Generation, ApiError> {
    common.check(defaults).map_err(|mut e| {
        if let Some(param) = &e.param {
            if let Some((from, to)) = rename.iter().find(|(from, _)| param == from) {
                e.message = e.message.replace(from, to);
                e.param = Some((*to).to_owned());
            }
        }
        e
    })
}

/// A string or a list of `{"type": <kind>, "text": ...}` blocks (one of `kinds`), joined;
/// `param` names the field in errors.
pub fn text_of(value: &Value, kinds: &[&str], param: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
                match block.get("text").and_then(Value::as_str) {
                    Some(t) if kinds.contains(&kind) => text.push_str(t),
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{param}[{i}]"),
                            format!(
                                "{param}[{i}] is a {kind:?} block; only text is read here ({})",
                                kinds.join(", ")
                            ),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            param,
            format!("{param} must be a string or a list of text blocks"),
        )),
    }
}

/// An RFC 3339 UTC time (`2026-12-01T21:43:36Z`) of Unix seconds, as Ollama writes times.
pub fn rfc3339(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_161_416), "2026-12-01T21:43:36Z");
    }

    #[test]
    fn unknown_fields_are_refused_by_name_and_nulls_pass() {
        let fields = Fields {
            endpoint: "/x",
            read: &["a"],
            ignored: &["b"],
        };
        assert!(fields
            .check(&json!({"a": 1, "b": 2, "c": null}), "")
            .is_ok());
        let e = fields
            .check(&json!({"a": 1, "grammar": "x"}), "opts.")
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("opts.grammar"));
        assert!(e.message.contains("/x"), "{}", e.message);
    }

    #[test]
    fn thinking_switch_sets_both_template_variables_and_keeps_given_ones() {
        let mut vars = Map::new();
        vars.insert("force_thinking".into(), json!(false));
        set_thinking(&mut vars, true);
        assert_eq!(vars["enable_thinking"], json!(true));
        assert_eq!(vars["force_thinking"], json!(false));
    }

    #[test]
    fn renamed_sampling_errors_name_the_api_field() {
        let common = RawCommon {
            max_tokens: Some(0),
            ..RawCommon::default()
        };
        let e = generation(
            common,
            &SamplingParams::default(),
            &[("max_tokens", "options.num_predict")],
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("options.num_predict"));
    }
}
