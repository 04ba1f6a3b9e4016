//! OpenAI's Responses API (`POST /v1/responses`), stateless: `input` items (messages,
//! `function_call`, `function_call_output`, `reasoning`) and `instructions` to the chat
//! template's messages, `reasoning.effort` to its reasoning switch, and an answer back to
//! output items. Nothing is stored: `store: true`, `previous_response_id` and `conversation`
//! are refused.

use serde_json::{json, Map, Value};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::Finish;
use spindle_text::{ParsedOutput, ToolCall};

use super::{
    apply_constraint, arguments_object, effort_thinks, generation, optional, set_thinking,
    template_tool, template_tool_call, text_of, tool_schema, Constraint, Fields,
};
use crate::error::ApiError;
use crate::images::{self, Content, RequestImage};
use crate::request::{brief, Generation, RawCommon};
use crate::response::unique_id;
use crate::structured::close_if_strict;

/// The fields `POST /v1/responses` accepts.
pub const FIELDS: Fields = Fields {
    endpoint: "/v1/responses",
    read: &[
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "store",
        "truncation",
        "background",
        "include",
    ],
    ignored: &[
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "stream_options",
    ],
};

/// Text parts of input messages.
const TEXT_PARTS: &[&str] = &["input_text", "output_text", "text"];

/// A checked Responses request, and what the answer echoes of it.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    pub generation: Generation,
    pub messages: Value,
    pub tools: Option<Value>,
    pub vars: Map<String, Value>,
    /// The request's settings as the response object repeats them.
    pub echo: Map<String, Value>,
    /// The user messages' `input_image` parts, in order.
    pub images: Vec<RequestImage>,
}

pub fn parse(body: &Value, defaults: &SamplingParams) -> Result<ResponsesRequest, ApiError> {
    FIELDS.check(body, "")?;
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let refuse =
        |param: &str, message: &str| Err(ApiError::invalid(param, format!("{param}: {message}")));
    if optional::<bool>(body, "store", "")? == Some(true) {
        return refuse(
            "store",
            "this server is stateless and stores no responses; send store: false",
        );
    }
    if optional::<bool>(body, "background", "")? == Some(true) {
        return refuse(
            "background",
            "background responses need stored state, which this server does not keep",
        );
    }
    // Nothing extra is included in answers yet (log-probabilities, encrypted reasoning).
    if let Some(item) = optional::<Vec<String>>(body, "include", "")?
        .unwrap_or_default()
        .first()
    {
        return refuse(
            "include",
            &format!("{item:?} is not supported: this server includes nothing extra in responses"),
        );
    }
    if let Some(t) = optional::<String>(body, "truncation", "")?.filter(|t| t != "disabled") {
        return refuse(
            "truncation",
            &format!("{t:?} is not supported: only \"disabled\" (too long an input is refused)"),
        );
    }
    let common = RawCommon {
        stream: optional(body, "stream", "")?,
        max_tokens: optional(body, "max_output_tokens", "")?,
        temperature: optional(body, "temperature", "")?,
        top_p: optional(body, "top_p", "")?,
        ..RawCommon::default()
    };
    let mut generation = generation(common, defaults, &[("max_tokens", "max_output_tokens")])?;
    let mut messages = Vec::new();
    if let Some(instructions) = field("instructions") {
        let text = instructions
            .as_str()
            .ok_or_else(|| ApiError::invalid("instructions", "instructions must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let mut images = Vec::new();
    match field("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => input_items(items, &mut messages, &mut images)?,
        _ => return refuse("input", "input must be a string or a list of items"),
    }
    let parallel = optional::<bool>(body, "parallel_tool_calls", "")? != Some(false);
    let (tools, constraint, strict) = tools(field("tools"), field("tool_choice"), parallel)?;
    generation.tools_off = field("tool_choice").and_then(Value::as_str) == Some("none");
    let forced = constraint.is_some();
    if let Some(constraint) = constraint {
        apply_constraint(&mut generation, "tool_choice", constraint, tools.as_ref())?;
    }
    // A forced choice already holds the answer to one call (or to parallel_tool_calls); with
    // no tools there is nothing to limit; an unforced answer is held to one call, and to the
    // strict tools' schemas, by a grammar that leaves its text free.
    let has_tools = tools
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if (!parallel || !strict.is_empty()) && !forced && has_tools {
        let param = if strict.is_empty() {
            "parallel_tool_calls"
        } else {
            "tools"
        };
        apply_constraint(
            &mut generation,
            param,
            Constraint::OptionalTools { strict, parallel },
            tools.as_ref(),
        )?;
    }
    if let Some(format) = field("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
    {
        let constraint = match format.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Constraint::Json),
            Some("json_schema") => match format.get("schema").filter(|s| s.is_object()) {
                Some(schema) => Some(Constraint::JsonSchema(close_if_strict(
                    schema.clone(),
                    format.get("strict"),
                    "text.format.strict",
                )?)),
                None => {
                    return refuse(
                        "text.format.schema",
                        "a json_schema format needs its schema (an object)",
                    )
                }
            },
            _ => {
                return refuse(
                    "text.format.type",
                    "must be text, json_object or json_schema",
                )
            }
        };
        if let Some(constraint) = constraint {
            apply_constraint(&mut generation, "text.format", constraint, None)?;
        }
    }
    if let Some(text) = field("text") {
        let Some(text) = text.as_object() else {
            return refuse("text", "text must be an object");
        };
        if let Some(key) = text
            .keys()
            .find(|k| *k != "format" && !text[k.as_str()].is_null())
        {
            return refuse(&format!("text.{key}"), "is not supported by this server");
        }
    }
    let mut vars = Map::new();
    if let Some(reasoning) = field("reasoning") {
        if !reasoning.is_object() {
            return refuse("reasoning", "reasoning must be an object");
        }
        // The reasoning comes back whole (reasoning_text content); this server has no
        // summariser, which "auto" (what Codex and the Agents SDK send) leaves to it; a
        // summary asked for by kind is refused.
        if let Some(summary) =
            optional::<String>(reasoning, "summary", "reasoning.")?.filter(|s| s != "auto")
        {
            return refuse(
                "reasoning.summary",
                &format!(
                    "{summary:?} is not supported: the reasoning is returned whole, not summarised"
                ),
            );
        }
    }
    let effort = field("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null());
    if let Some(effort) = effort {
        let effort = effort.as_str().ok_or_else(|| {
            ApiError::invalid("reasoning.effort", "reasoning.effort must be a string")
        })?;
        set_thinking(&mut vars, effort_thinks(effort, "reasoning.effort")?);
        vars.insert("reasoning_effort".into(), Value::String(effort.to_owned()));
    }
    let mut echo = Map::new();
    for (name, default) in [
        ("instructions", Value::Null),
        ("max_output_tokens", Value::Null),
        (
            "temperature",
            json!(generation.options.sampling.temperature),
        ),
        ("top_p", json!(generation.options.sampling.top_p)),
        ("tool_choice", json!("auto")),
        ("tools", json!([])),
        ("parallel_tool_calls", json!(true)),
        ("reasoning", json!({"effort": null, "summary": null})),
        ("text", json!({"format": {"type": "text"}})),
        ("metadata", json!({})),
    ] {
        echo.insert(name.into(), field(name).cloned().unwrap_or(default));
    }
    Ok(ResponsesRequest {
        generation,
        messages: Value::Array(messages),
        tools,
        vars,
        echo,
        images,
    })
}

/// A user message's content: text parts and `input_image` parts (`image_url` a data: URL;
/// `detail` changes nothing here, `file_id` is refused), as the template's items.
fn user_content(
    content: &Value,
    param: &str,
    images: &mut Vec<RequestImage>,
) -> Result<Value, ApiError> {
    let Value::Array(parts) = content else {
        return Ok(Value::String(text_of(content, TEXT_PARTS, param)?));
    };
    let mut out = Content::default();
    for (k, part) in parts.iter().enumerate() {
        let at = format!("{param}[{k}]");
        match part.get("type").and_then(Value::as_str) {
            Some("input_image") => {
                if part.get("file_id").is_some_and(|f| !f.is_null()) {
                    return Err(ApiError::invalid(
                        format!("{at}.file_id"),
                        "file ids are not supported (this server stores no files): send image_url as a data: URL",
                    ));
                }
                let url = part
                    .get("image_url")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("{at}.image_url"),
                            "an input_image part needs image_url (a data: URL)",
                        )
                    })?;
                images.push(images::from_url(url, &format!("{at}.image_url"))?);
                out.push_image();
            }
            _ => out.push_text(
                &text_of(&Value::Array(vec![part.clone()]), TEXT_PARTS, param).map_err(|e| {
                    ApiError {
                        param: Some(at.clone()),
                        ..e
                    }
                })?,
            ),
        }
    }
    Ok(out.into_value())
}

/// Input items as template messages: consecutive `reasoning` and `function_call` items join
/// the assistant message they belong to; `function_call_output` items become `tool` messages.
fn input_items(
    items: &[Value],
    messages: &mut Vec<Value>,
    images: &mut Vec<RequestImage>,
) -> Result<(), ApiError> {
    // The assistant turn being built from reasoning, message and function_call items.
    let mut turn: Option<Value> = None;
    let flush = |turn: &mut Option<Value>, messages: &mut Vec<Value>| messages.extend(turn.take());
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("input[{i}].{field}");
        let kind = item.get("type").and_then(Value::as_str);
        let role = item.get("role").and_then(Value::as_str);
        let string = |name: &str| {
            item.get(name).and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    at(name),
                    format!("a {} item needs {name}", kind.unwrap_or("message")),
                )
            })
        };
        let assistant = |turn: &mut Option<Value>| -> Value {
            turn.take()
                .unwrap_or_else(|| json!({"role": "assistant", "content": ""}))
        };
        match (kind, role) {
            (None | Some("message"), Some(role @ ("user" | "system" | "developer" | "assistant"))) => {
                let content = item
                    .get("content")
                    .ok_or_else(|| ApiError::invalid(at("content"), "a message needs content"))?;
                if role == "user" {
                    flush(&mut turn, messages);
                    let content = user_content(content, &at("content"), images)?;
                    messages.push(json!({"role": "user", "content": content}));
                    continue;
                }
                let text = text_of(content, TEXT_PARTS, &at("content"))?;
                if role == "assistant" {
                    let mut m = assistant(&mut turn);
                    let before = m["content"].as_str().unwrap_or("").to_owned();
                    m["content"] = Value::String(before + &text);
                    turn = Some(m);
                } else {
                    flush(&mut turn, messages);
                    let role = if role == "developer" { "system" } else { role };
                    messages.push(json!({"role": role, "content": text}));
                }
            }
            (Some("reasoning"), _) => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(parts) = item.get(key).filter(|p| p.as_array().is_some_and(|a| !a.is_empty())) {
                        text = text_of(parts, &["reasoning_text", "summary_text"], &at(key))?;
                        break;
                    }
                }
                flush(&mut turn, messages);
                turn = Some(json!({"role": "assistant", "content": "", "reasoning_content": text}));
            }
            (Some("function_call"), _) => {
                let arguments = arguments_object(item.get("arguments").unwrap_or(&Value::Null), &at("arguments"))?;
                let call = template_tool_call(Some(string("call_id")?), string("name")?, arguments);
                let mut m = assistant(&mut turn);
                match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(calls) => calls.push(call),
                    None => m["tool_calls"] = json!([call]),
                }
                turn = Some(m);
            }
            (Some("function_call_output"), _) => {
                flush(&mut turn, messages);
                let output = match item.get("output") {
                    Some(o) => text_of(o, TEXT_PARTS, &at("output"))?,
                    None => return Err(ApiError::invalid(at("output"), "a function_call_output item needs output")),
                };
                messages.push(json!({"role": "tool", "tool_call_id": string("call_id")?, "content": output}));
            }
            (None | Some("message"), _) if item.get("role").is_some() => {
                return Err(ApiError::invalid(
                    at("role"),
                    format!(
                        "{} = {}: a message's role is user, system, developer or assistant",
                        at("role"),
                        brief(&item["role"])
                    ),
                ))
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    at("type"),
                    format!(
                        "input item type {} is not supported: this server reads messages (user, system, \
                         developer, assistant), reasoning, function_call and function_call_output items",
                        brief(&Value::String(kind.unwrap_or("").to_owned()))
                    ),
                ))
            }
        }
    }
    flush(&mut turn, messages);
    if messages.iter().all(|m| m["role"] == "system") {
        return Err(ApiError::invalid(
            "input",
            "input holds no message to answer",
        ));
    }
    Ok(())
}

/// The template's tools after `tool_choice`, and a forcing choice's constraint.
#[allow(clippy::type_complexity)]
fn tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: bool,
) -> Result<(Option<Value>, Option<Constraint>, Vec<String>), ApiError> {
    let mut strict = Vec::new();
    let list = match tools {
        None => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    let mut out = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("tool type {kind:?} is not supported: this server runs no hosted tools; use \"function\""),
            ));
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| {
            ApiError::invalid(format!("tools[{i}].name"), "a function needs a name")
        })?;
        let schema = tool_schema(tool.get("parameters"), &format!("tools[{i}].parameters"))?;
        out.push(template_tool(
            name,
            tool.get("description").and_then(Value::as_str),
            schema,
        ));
        match tool.get("strict") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => strict.push(name.to_owned()),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}].strict"),
                    "strict must be a boolean",
                ))
            }
        }
    }
    let constraint = match choice {
        None => None,
        Some(Value::String(s)) if s == "auto" => None,
        Some(Value::String(s)) if s == "none" => {
            out.clear();
            None
        }
        Some(Value::String(s)) if s == "required" => Some(Constraint::AnyTool { parallel }),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").and_then(Value::as_str).unwrap_or("");
            if !list.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(name)) {
                return Err(ApiError::invalid("tool_choice.name", format!("tool_choice names {name:?}, which is not in tools")));
            }
            Some(Constraint::Tool(name.to_owned()))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
            ))
        }
    };
    Ok((
        (!out.is_empty()).then_some(Value::Array(out)),
        constraint,
        strict,
    ))
}

/// A reasoning output item.
pub fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

/// An assistant message output item (`status` `in_progress` while streaming).
pub fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content = match text {
        Some(text) => json!([output_text(text)]),
        None => json!([]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

pub fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A function call output item.
pub fn function_call_item(
    id: &str,
    call_id: &str,
    call: &ToolCall,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": call.name,
           "arguments": arguments, "status": status})
}

/// A parsed answer as output items: reasoning, the message, function calls.
pub fn output_items(parsed: &ParsedOutput) -> Vec<Value> {
    let mut items = Vec::new();
    if !parsed.reasoning.is_empty() {
        items.push(reasoning_item(&unique_id("rs_"), &parsed.reasoning));
    }
    if !parsed.content.is_empty() || parsed.tool_calls.is_empty() {
        items.push(message_item(
            &unique_id("msg_"),
            Some(&parsed.content),
            "completed",
        ));
    }
    for call in &parsed.tool_calls {
        items.push(function_call_item(
            &unique_id("fc_"),
            &unique_id("call_"),
            call,
            &call.arguments_json(),
            "completed",
        ));
    }
    items
}

/// The response object: `status` `in_progress`, `completed` or `incomplete` (with why).
pub fn response_object(
    id: &str,
    created_at: u64,
    model: &str,
    echo: &Map<String, Value>,
    output: Vec<Value>,
    finish: Option<&Finish>,
    usage: Option<(usize, usize, usize)>,
) -> Value {
    let (status, incomplete) = match finish {
        None => ("in_progress", Value::Null),
        Some(Finish::Length | Finish::ContextFull) => {
            ("incomplete", json!({"reason": "max_output_tokens"}))
        }
        Some(Finish::Cancelled) => ("incomplete", json!({"reason": "cancelled"})),
        Some(_) => ("completed", Value::Null),
    };
    let usage = usage.map_or(Value::Null, |(input, output, cached)| {
        json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
               "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": input + output})
    });
    let mut object = json!({
        "id": id, "object": "response", "created_at": created_at, "status": status,
        "error": null, "incomplete_details": incomplete, "model": model, "output": output,
        "usage": usage, "store": false, "previous_response_id": null, "truncation": "disabled",
    });
    for (k, v) in echo {
        object[k.as_str()] = v.clone();
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(body: Value) -> ResponsesRequest {
        parse(&body, &SamplingParams::default()).unwrap()
    }

    fn param(body: Value) -> String {
        parse(&body, &SamplingParams::default())
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn options_not_implemented_are_refused_by_name_and_types_checked() {
        let tools = json!([{"type": "function", "name": "f", "parameters": {"type": "object"}}]);
        for (body, at) in [
            (
                json!({"input": "hi", "include": ["message.output_text.logprobs"]}),
                "include",
            ),
            (
                json!({"input": "hi", "reasoning": {"summary": "detailed"}}),
                "reasoning.summary",
            ),
            (json!({"input": "hi", "reasoning": "high"}), "reasoning"),
            (json!({"input": "hi", "store": "true"}), "store"),
            (json!({"input": "hi", "truncation": 1}), "truncation"),
            (
                json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}),
                "text.format.schema",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "function", "name": "f", "strict": "yes"}]}),
                "tools[0].strict",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "function", "name": "f", "strict": true}],
                       "text": {"format": {"type": "json_object"}}}),
                "text.format",
            ),
        ] {
            assert_eq!(param(body.clone()), at, "{body}");
        }
        // Unset values are accepted: an empty include, a null summary.
        parse_ok(json!({"input": "hi", "include": [], "reasoning": {"summary": null}}));
        parse_ok(json!({"input": "hi", "reasoning": {"summary": "auto"}}));
        // One call at most is what a forced choice or no tools give anyway.
        parse_ok(json!({"input": "hi", "parallel_tool_calls": false}));
        let r = parse_ok(
            json!({"input": "hi", "tools": tools, "tool_choice": "required", "parallel_tool_calls": false}),
        );
        match r.generation.grammar {
            Some((_, spindle_runtime::Grammar::Lark(g))) => assert!(g.starts_with("start: call\n")),
            other => panic!("a tool-call grammar, not {other:?}"),
        }
        // Unforced with tools: one call at most, and strict tools' arguments, by a grammar that
        // leaves text free before the calls.
        for (body, at, start) in [
            (
                json!({"input": "hi", "tools": tools, "parallel_tool_calls": false}),
                "parallel_tool_calls",
                "start: TOOL_FREE_TEXT? calls?\ncalls: call\n",
            ),
            (
                json!({"input": "hi", "tools": [{"type": "function", "name": "f", "strict": true,
                       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]}),
                "tools",
                "start: TOOL_FREE_TEXT? calls?\ncalls: call (",
            ),
        ] {
            match parse_ok(body).generation.grammar {
                Some((param, spindle_runtime::Grammar::Lark(g))) => {
                    assert_eq!(param, at);
                    assert!(g.starts_with(start), "{g}");
                    assert_eq!(g.contains("%json"), at == "tools", "{g}");
                }
                other => panic!("an optional tool-call grammar, not {other:?}"),
            }
        }
        // A strict schema closes its objects.
        let r = parse_ok(
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
            "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
        );
        match r.generation.grammar {
            Some((_, spindle_runtime::Grammar::JsonSchema(s))) => {
                assert_eq!(s["additionalProperties"], false)
            }
            other => panic!("a schema, not {other:?}"),
        }
    }

    #[test]
    fn input_items_become_template_messages() {
        let r = parse_ok(json!({
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "use f"}]},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
                {"type": "message", "role": "developer", "content": "again"}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "reasoning": {"effort": "low"}, "max_output_tokens": 9, "store": false
        }));
        let m = r.messages.as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(m[2]["reasoning_content"], "use f");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "21C"})
        );
        assert_eq!(m[4], json!({"role": "system", "content": "again"}));
        assert_eq!(r.vars["force_thinking"], json!(true));
        assert_eq!(r.generation.options.max_tokens, Some(9));
        assert_eq!(r.echo["max_output_tokens"], 9);
    }

    #[test]
    fn state_and_constraints_are_refused_by_name() {
        assert_eq!(param(json!({"input": "hi", "store": true})), "store");
        assert_eq!(
            param(json!({"input": "hi", "previous_response_id": "resp_1"})),
            "previous_response_id"
        );
        let r = parse_ok(json!({"input": "hi", "text": {"format": {"type": "json_object"}}}));
        assert!(matches!(&r.generation.grammar, Some((f, _)) if f == "text.format"));
        assert_eq!(
            param(json!({"input": "hi", "tools": [{"type": "web_search"}]})),
            "tools[0].type"
        );
        assert_eq!(
            param(json!({"input": "hi", "max_output_tokens": 0})),
            "max_output_tokens"
        );
        assert_eq!(
            param(json!({"input": "hi", "reasoning": {"effort": "huge"}})),
            "reasoning.effort"
        );
        assert_eq!(
            param(json!({"input": [{"type": "input_image"}]})),
            "input[0].type"
        );
        let image = |part: Value| json!({"input": [{"role": "user", "content": [part]}]});
        assert_eq!(
            param(image(
                json!({"type": "input_image", "image_url": "https://x/y.png"})
            )),
            "input[0].content[0].image_url"
        );
        assert_eq!(
            param(image(json!({"type": "input_image", "file_id": "file_1"}))),
            "input[0].content[0].file_id"
        );
        let r = parse_ok(json!({"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is "},
            {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "low"}]}]}));
        assert_eq!(r.images[0].bytes, b"hi");
        assert_eq!(
            r.messages[0]["content"],
            json!([{"type": "text", "text": "what is "}, {"type": "image"}])
        );
        assert_eq!(
            param(json!({"input": "hi", "top_logprobs": 2})),
            "top_logprobs"
        );
    }
}
