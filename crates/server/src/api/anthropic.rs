//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): content
//! blocks (`text`, `image` with a base64 source, `thinking`, `tool_use`, `tool_result`) to the
//! chat template's messages,
//! `thinking` to the template's reasoning switch, and a parsed answer back to blocks.

use serde_json::{json, Map, Value};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::Finish;
use spindle_text::ParsedOutput;

use super::{
    apply_constraint, generation, optional, refuse_prefill, set_thinking, template_tool,
    template_tool_call, text_of, tool_schema, Constraint, Fields,
};
use crate::error::ApiError;
use crate::images::{self, Content, RequestImage};
use crate::request::{Generation, RawCommon};
use crate::response::unique_id;

/// The fields `POST /v1/messages` accepts.
pub const MESSAGE_FIELDS: Fields = Fields {
    endpoint: "/v1/messages",
    read: &[
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    ],
    ignored: &IGNORED,
};

/// Fields that do not change the answer: metadata, caching, routing and speed hints.
const IGNORED: [&str; 8] = [
    "metadata",
    "service_tier",
    "cache_control",
    "inference_geo",
    "speed",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
];

/// The fields `POST /v1/messages/count_tokens` accepts.
pub const COUNT_FIELDS: Fields = Fields {
    endpoint: "/v1/messages/count_tokens",
    read: &[
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    ],
    ignored: &IGNORED,
};

/// A checked Messages request.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    pub generation: Generation,
    pub messages: Value,
    pub tools: Option<Value>,
    pub vars: Map<String, Value>,
    /// The `image` blocks' images, in order.
    pub images: Vec<RequestImage>,
}

/// Parses a `/v1/messages` body (`count_only`: a `count_tokens` body, which has no
/// `max_tokens` and generates nothing).
pub fn parse(
    body: &Value,
    defaults: &SamplingParams,
    count_only: bool,
) -> Result<MessagesRequest, ApiError> {
    let fields = if count_only {
        &COUNT_FIELDS
    } else {
        &MESSAGE_FIELDS
    };
    fields.check(body, "")?;
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    let max_tokens = if count_only {
        Some(1)
    } else {
        Some(
            field("max_tokens")
                .ok_or_else(|| ApiError::invalid("max_tokens", "max_tokens is required"))?
                .as_i64()
                .ok_or_else(|| ApiError::invalid("max_tokens", "max_tokens must be an integer"))?,
        )
    };
    let common = RawCommon {
        stream: optional(body, "stream", "")?,
        max_tokens,
        temperature: optional(body, "temperature", "")?,
        top_p: optional(body, "top_p", "")?,
        top_k: optional(body, "top_k", "")?,
        stop: field("stop_sequences").cloned(),
        ..RawCommon::default()
    };
    let mut generation = generation(common, defaults, &[("stop", "stop_sequences")])?;
    let mut messages = Vec::new();
    if let Some(system) = field("system") {
        let text = text_of(system, &["text"], "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let raw = field("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::invalid("messages", "messages must be a list of messages"))?;
    if raw.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let mut images = Vec::new();
    for (i, message) in raw.iter().enumerate() {
        messages.extend(template_messages(message, i, &mut images)?);
    }
    refuse_prefill(&messages, &format!("messages[{}].role", raw.len() - 1))?;
    let (tools, constraint) = tools(field("tools"), field("tool_choice"))?;
    generation.tools_off = field("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
        == Some("none");
    if let Some(constraint) = constraint {
        apply_constraint(&mut generation, "tool_choice", constraint, tools.as_ref())?;
    }
    let mut vars = Map::new();
    let budget_limit = max_tokens.filter(|_| !count_only);
    let (think, budget) = thinking(field("thinking"), budget_limit)?;
    set_thinking(&mut vars, think);
    generation.reasoning_budget = budget;
    if let Some(config) = field("output_config") {
        output_config(config, &mut generation, &mut vars)?;
    }
    Ok(MessagesRequest {
        generation,
        messages: Value::Array(messages),
        tools,
        vars,
        images,
    })
}

/// `output_config`: `effort` is passed to the template as `reasoning_effort` (the Qwen
/// templates have no levels; thinking itself is switched by `thinking`); `format` (structured
/// output) is a constraint.
fn output_config(
    config: &Value,
    generation: &mut Generation,
    vars: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    const KEYS: Fields = Fields {
        endpoint: "/v1/messages",
        read: &["effort", "format"],
        ignored: &[],
    };
    KEYS.check(config, "output_config.")?;
    if let Some(effort) = optional::<String>(config, "effort", "output_config.")? {
        if !["low", "medium", "high", "xhigh", "max"].contains(&effort.as_str()) {
            return Err(ApiError::invalid(
                "output_config.effort",
                format!("output_config.effort is {effort:?}: use low, medium, high, xhigh or max"),
            ));
        }
        vars.insert("reasoning_effort".into(), Value::String(effort));
    }
    if let Some(format) = config.get("format").filter(|f| !f.is_null()) {
        if format.get("type").and_then(Value::as_str) != Some("json_schema") {
            return Err(ApiError::invalid(
                "output_config.format.type",
                "output_config.format.type must be \"json_schema\"",
            ));
        }
        let Some(schema) = format.get("schema").filter(|s| s.is_object()).cloned() else {
            return Err(ApiError::invalid(
                "output_config.format.schema",
                "output_config.format needs its schema (an object)",
            ));
        };
        apply_constraint(
            generation,
            "output_config.format",
            Constraint::JsonSchema(schema),
            None,
        )?;
    }
    Ok(())
}

/// `thinking`: `{"type": "enabled", "budget_tokens": n}` (below `max_tokens`), `adaptive`
/// or `between_tools` (on: a Qwen template cannot leave it to the model) or
/// `{"type": "disabled"}`; absent means disabled, as on Anthropic's API. Whether thinking is
/// on, and its budget: a thinking block of `budget_tokens` tokens is closed there (its
/// closing token forced), and `max_tokens` bounds thinking and answer together.
/// `display: "omitted"` (thinking hidden from the answer) is refused; `summarized` returns
/// the whole thinking. `max_tokens` is `None` for count_tokens, which has none.
fn thinking(
    value: Option<&Value>,
    max_tokens: Option<i64>,
) -> Result<(bool, Option<usize>), ApiError> {
    let Some(value) = value else {
        return Ok((false, None));
    };
    if optional::<String>(value, "display", "thinking.")?.as_deref() == Some("omitted") {
        return Err(ApiError::invalid(
            "thinking.display",
            "thinking.display \"omitted\" is not supported: thinking is always returned",
        ));
    }
    match value.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok((false, None)),
        Some("adaptive" | "between_tools") => Ok((true, None)),
        Some("enabled") => {
            let budget = value
                .get("budget_tokens")
                .and_then(Value::as_i64)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "thinking.budget_tokens",
                        "thinking.budget_tokens must be a positive integer",
                    )
                })?;
            if budget < 1 || max_tokens.is_some_and(|m| budget >= m) {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens",
                    format!("thinking.budget_tokens is {budget} but must be at least 1 and below max_tokens"),
                ));
            }
            Ok((true, usize::try_from(budget).ok()))
        }
        _ => Err(ApiError::invalid(
            "thinking.type",
            "thinking.type must be enabled, adaptive, between_tools or disabled",
        )),
    }
}

/// One Anthropic message as template messages: a user message's `tool_result` blocks become
/// `tool` messages (in order, before its text), an assistant's `thinking` its
/// `reasoning_content` and its `tool_use` blocks its `tool_calls`; a user's `image` blocks
/// become the template's image items, their bytes going to `images`.
fn template_messages(
    message: &Value,
    i: usize,
    images: &mut Vec<RequestImage>,
) -> Result<Vec<Value>, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let role = match message.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(ApiError::invalid(
                at("role"),
                "role must be \"user\" or \"assistant\"",
            ))
        }
    };
    let content = message
        .get("content")
        .ok_or_else(|| ApiError::invalid(at("content"), "a message needs content"))?;
    let blocks = match content {
        Value::String(s) => return Ok(vec![json!({"role": role, "content": s})]),
        Value::Array(blocks) => blocks,
        _ => {
            return Err(ApiError::invalid(
                at("content"),
                "content must be a string or a list of blocks",
            ))
        }
    };
    let (mut out, mut text, mut reasoning, mut calls) =
        (Vec::new(), Content::default(), String::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let param = at(&format!("content[{j}]"));
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let string = |name: &str| {
            block.get(name).and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    format!("{param}.{name}"),
                    format!("a {kind} block needs {name}"),
                )
            })
        };
        match (role, kind) {
            (_, "text") => text.push_text(string("text")?),
            ("user", "image") => {
                images.push(image_block(block, &param)?);
                text.push_image();
            }
            ("assistant", "thinking") => reasoning.push_str(string("thinking")?),
            ("assistant", "tool_use") => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(ApiError::invalid(
                        format!("{param}.input"),
                        "tool_use input must be an object",
                    ));
                }
                calls.push(template_tool_call(
                    Some(string("id")?),
                    string("name")?,
                    input,
                ));
            }
            ("user", "tool_result") => {
                let id = string("tool_use_id")?;
                let mut result = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &["text"], &format!("{param}.content"))?,
                };
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("Error: {result}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("{param}.type"),
                    format!(
                    "a {role} message's {kind:?} block is not supported: this server reads text, \
                         image (user), thinking, tool_use (assistant) and tool_result (user) blocks"
                ),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut m = json!({"role": "assistant", "content": text.into_value()});
        if !reasoning.is_empty() {
            m["reasoning_content"] = Value::String(reasoning);
        }
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    } else if !text.is_empty() || out.is_empty() {
        out.push(json!({"role": "user", "content": text.into_value()}));
    }
    Ok(out)
}

/// An `image` block: `{"source": {"type": "base64", "media_type": "image/png", "data": ...}}`.
/// URL and file sources are refused: the server fetches nothing.
fn image_block(block: &Value, param: &str) -> Result<RequestImage, ApiError> {
    let source = block.get("source").filter(|s| s.is_object()).ok_or_else(|| {
        ApiError::invalid(
            format!("{param}.source"),
            "an image block needs a source: {\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"...\"}",
        )
    })?;
    let at = |field: &str| format!("{param}.source.{field}");
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {}
        Some("url") => {
            return Err(ApiError::invalid(
                at("type"),
                "remote image URLs are not fetched: send a base64 source",
            ))
        }
        other => {
            return Err(ApiError::invalid(
                at("type"),
                format!(
                    "image source type {} is not supported: send a base64 source",
                    other.map_or("(missing)".to_owned(), |t| format!("{t:?}"))
                ),
            ))
        }
    }
    if let Some(media_type) = source.get("media_type").and_then(Value::as_str) {
        images::check_media_type(media_type, &at("media_type"))?;
    }
    let data = source
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(at("data"), "a base64 image source needs data"))?;
    images::from_base64(data, &at("data"))
}

/// The tools the template sees after `tool_choice`, and the constraint a forcing choice asks
/// (or, unforced, `disable_parallel_tool_use` and tools marked `strict`).
fn tools(
    tools: Option<&Value>,
    choice: Option<&Value>,
) -> Result<(Option<Value>, Option<Constraint>), ApiError> {
    let mut strict = Vec::new();
    let list = match tools {
        None => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    let mut out = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        if let Some(kind) = tool
            .get("type")
            .and_then(Value::as_str)
            .filter(|k| *k != "custom")
        {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!("tool type {kind:?} is a server tool, which this server does not run; give client tools"),
            ));
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let name = name
            .ok_or_else(|| ApiError::invalid(format!("tools[{i}].name"), "a tool needs a name"))?;
        let description = tool.get("description").and_then(Value::as_str);
        let schema = tool_schema(
            tool.get("input_schema"),
            &format!("tools[{i}].input_schema"),
        )?;
        out.push(template_tool(name, description, schema));
        if optional::<bool>(tool, "strict", &format!("tools[{i}]."))? == Some(true) {
            strict.push(name.to_owned());
        }
    }
    // Unforced: calls held to at most one and to the strict tools' schemas when asked.
    let single = match choice {
        Some(choice) => {
            optional::<bool>(choice, "disable_parallel_tool_use", "tool_choice.")? == Some(true)
        }
        None => false,
    };
    let mut constraint = (single || !strict.is_empty()).then(|| Constraint::OptionalTools {
        strict: strict.clone(),
        parallel: !single,
    });
    if let Some(choice) = choice {
        match choice.get("type").and_then(Value::as_str) {
            Some("auto") => {}
            Some("none") => {
                out.clear();
                constraint = None;
            }
            Some("any") => constraint = Some(Constraint::AnyTool { parallel: !single }),
            Some("tool") => {
                let name = choice.get("name").and_then(Value::as_str).unwrap_or("");
                if !list
                    .iter()
                    .any(|t| t.get("name").and_then(Value::as_str) == Some(name))
                {
                    return Err(ApiError::invalid(
                        "tool_choice.name",
                        format!("tool_choice names {name:?}, which is not in tools"),
                    ));
                }
                constraint = Some(Constraint::Tool(name.to_owned()));
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "tool_choice.type must be auto, any, tool or none",
                ))
            }
        }
    }
    Ok(((!out.is_empty()).then_some(Value::Array(out)), constraint))
}

/// Anthropic's `stop_reason` and `stop_sequence` for how generation ended.
pub fn stop_reason(finish: &Finish, has_tool_calls: bool) -> (&'static str, Option<String>) {
    match finish {
        Finish::Eos(_) | Finish::Stop(_) if has_tool_calls => ("tool_use", None),
        Finish::Eos(_) => ("end_turn", None),
        Finish::Stop(s) => ("stop_sequence", Some(s.clone())),
        Finish::Length | Finish::ContextFull => ("max_tokens", None),
        // A shutdown cancelled it (OpenAI endpoints say "abort").
        Finish::Cancelled => ("abort", None),
    }
}

/// A parsed answer as Anthropic content blocks: thinking, text, tool uses.
pub fn content_blocks(parsed: &ParsedOutput) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !parsed.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": parsed.reasoning, "signature": ""}));
    }
    if !parsed.content.is_empty() || parsed.tool_calls.is_empty() && blocks.is_empty() {
        blocks.push(json!({"type": "text", "text": parsed.content}));
    }
    for call in &parsed.tool_calls {
        blocks.push(
            json!({"type": "tool_use", "id": unique_id("toolu_"), "name": call.name,
                           "input": Value::Object(call.arguments.clone())}),
        );
    }
    blocks
}

/// Anthropic's `usage` object: `input_tokens` are the prompt tokens not read from the prefix
/// cache (`cache_read_input_tokens`), as Anthropic counts them.
pub fn usage(prompt_tokens: usize, output_tokens: usize, cached: usize) -> Value {
    json!({"input_tokens": prompt_tokens - cached.min(prompt_tokens), "output_tokens": output_tokens,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached})
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_runtime::Grammar;

    fn parse_ok(body: Value) -> MessagesRequest {
        parse(&body, &SamplingParams::default(), false).unwrap()
    }

    fn param(body: Value) -> String {
        parse(&body, &SamplingParams::default(), false)
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn tool_round_trip_becomes_template_messages() {
        let r = parse_ok(json!({
            "max_tokens": 50, "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}]},
                    {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "thinking": {"type": "enabled", "budget_tokens": 20},
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u"}
        }));
        let m = r.messages.as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[2]["reasoning_content"], "use the tool");
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": {"city": "Paris"}})
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(
            r.tools.unwrap()[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(
            (
                r.vars["enable_thinking"].clone(),
                r.vars["force_thinking"].clone()
            ),
            (json!(true), json!(true))
        );
        let o = &r.generation.options;
        assert_eq!(
            (o.max_tokens, o.stop.clone(), o.sampling.top_k),
            (Some(50), vec!["END".to_owned()], 5)
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let user = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param(json!({"messages": user})), "max_tokens");
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]})
            ),
            "messages[1].role"
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "stop_sequences": [""]})),
            "stop_sequences"
        );
        // A structured output becomes the generation's grammar; forcing a tool needs a tool.
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "output_format": {}})),
            "output_format"
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "tool_choice": {"type": "any"}})),
            "tool_choice"
        );
        let tools = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        let r = parse_ok(
            json!({"max_tokens": 5, "messages": user, "tools": tools, "tool_choice": {"type": "tool", "name": "f"}}),
        );
        assert!(matches!(&r.generation.grammar, Some((f, _)) if f == "tool_choice"));
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})
            ),
            "messages[0].content[0].source.type"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]})
            ),
            "messages[0].content[0].source.type"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%"}}]}]})
            ),
            "messages[0].content[0].source.data"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "image", "source": {"type": "base64", "data": "aGk="}}]}]})
            ),
            "messages[0].content[0].type"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 9}})
            ),
            "thinking.budget_tokens"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "w"}]})
            ),
            "tools[0].type"
        );
        let r = parse_ok(
            json!({"max_tokens": 5, "messages": user, "output_config": {"format": {"type": "json_schema", "schema": {}}}}),
        );
        assert!(matches!(&r.generation.grammar, Some((f, _)) if f == "output_config.format"));
        for format in [
            json!({"type": "xyz", "schema": {}}),
            json!({"type": "json_schema"}),
        ] {
            let at = param(
                json!({"max_tokens": 5, "messages": user, "output_config": {"format": format}}),
            );
            assert!(at.starts_with("output_config.format."), "{at}");
        }
        // `any` without parallel calls: one call, and only one, is forced.
        let grammar = |choice: Value| match parse_ok(
            json!({"max_tokens": 5, "messages": user, "tools": tools, "tool_choice": choice}),
        )
        .generation
        .grammar
        {
            Some((_, Grammar::Lark(g))) => g,
            other => panic!("a tool-call grammar, not {other:?}"),
        };
        assert!(grammar(json!({"type": "any"})).contains("(\"\\n\" call)*"));
        assert!(
            grammar(json!({"type": "any", "disable_parallel_tool_use": true}))
                .starts_with("start: call\n")
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "tools": tools,
                "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}})),
            "tool_choice.disable_parallel_tool_use"
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "output_config": {"effort": "huge"}})),
            "output_config.effort"
        );
        assert_eq!(
            param(
                json!({"max_tokens": 5, "messages": user, "thinking": {"type": "adaptive", "display": "omitted"}})
            ),
            "thinking.display"
        );
        let off = parse_ok(json!({"max_tokens": 5, "messages": user}));
        assert_eq!(off.vars["force_thinking"], json!(false));
        let adaptive = parse_ok(
            json!({"max_tokens": 5, "messages": user, "thinking": {"type": "adaptive"},
                                       "output_config": {"effort": "high"}, "speed": "fast"}),
        );
        assert_eq!(adaptive.vars["force_thinking"], json!(true));
        assert_eq!(adaptive.vars["reasoning_effort"], json!("high"));
    }

    #[test]
    fn answers_map_to_blocks_and_stop_reasons() {
        let parsed = spindle_text::parse_output(
            "<think>\nhm\n</think>\n\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
            false,
        );
        let blocks = content_blocks(&parsed);
        assert_eq!(blocks[0]["type"], "thinking");
        assert_eq!(blocks[1]["type"], "tool_use");
        assert_eq!(blocks[1]["input"], json!({"x": 1}));
        assert_eq!(stop_reason(&Finish::Eos(1), true).0, "tool_use");
        assert_eq!(
            stop_reason(&Finish::Stop("Z".into()), false),
            ("stop_sequence", Some("Z".into()))
        );
        assert_eq!(stop_reason(&Finish::Length, false).0, "max_tokens");
    }
}
