//! Ollama's API (`/api/chat`, `/api/generate`): messages and `options` to the chat template
//! and sampling, `think` to the template's reasoning switch, `format` to a constraint,
//! `images` (base64) to the template's image items, placed before the message's text.

use serde_json::{json, Map, Value};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::Prompt;

use super::{
    apply_constraint, arguments_object, generation, optional, refuse_prefill, set_thinking,
    template_tool, template_tool_call, tool_schema, Constraint, Fields,
};
use crate::error::ApiError;
use crate::images::{self, Content, RequestImage};
use crate::request::{Generation, RawCommon};

/// The fields `POST /api/chat` accepts.
pub const CHAT_FIELDS: Fields = Fields {
    endpoint: "/api/chat",
    read: &[
        "model", "messages", "tools", "stream", "format", "options", "think",
    ],
    ignored: &["keep_alive"],
};

/// The fields `POST /api/generate` accepts.
pub const GENERATE_FIELDS: Fields = Fields {
    endpoint: "/api/generate",
    read: &[
        "model", "prompt", "system", "stream", "raw", "format", "options", "think", "images",
    ],
    ignored: &["keep_alive"],
};

/// The fields of `options` accepted: sampling is read; resource settings (context size,
/// threads, GPU layers, memory mapping) do not change the answer here and are ignored.
pub const OPTION_FIELDS: Fields = Fields {
    endpoint: "Ollama's options",
    read: &[
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "num_predict",
        "stop",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
    ],
    ignored: &[
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "num_thread",
        "num_keep",
        "use_mmap",
        "use_mlock",
        "numa",
        "low_vram",
        "vocab_only",
    ],
};

/// Ollama's default `repeat_last_n`: the penalties read the last 64 tokens.
pub const OLLAMA_REPEAT_LAST_N: usize = 64;

/// A checked Ollama request.
#[derive(Debug, Clone)]
pub struct OllamaRequest {
    pub generation: Generation,
    pub prompt: Prompt,
    /// The messages' (or the prompt's) `images`, in order.
    pub images: Vec<RequestImage>,
}

/// Sampling from `options` (Ollama's names), `stream` (default true), `format` and `think`
/// (to `vars`).
fn common(
    body: &Value,
    defaults: &SamplingParams,
    vars: &mut Map<String, Value>,
) -> Result<Generation, ApiError> {
    let options = body
        .get("options")
        .filter(|o| !o.is_null())
        .cloned()
        .unwrap_or(json!({}));
    if !options.is_object() {
        return Err(ApiError::invalid("options", "options must be an object"));
    }
    OPTION_FIELDS.check(&options, "options.")?;
    let at = "options.";
    // -1 (infinite) and -2 (fill the context) both run to the end of the turn or context.
    let num_predict = optional::<i64>(&options, "num_predict", at)?.filter(|&n| n >= 0);
    // The penalties read the last repeat_last_n tokens, prompt included, as Ollama's
    // llama.cpp sampler does: 64 unless given, -1 the whole context, 0 none.
    let penalty_window = match optional::<i64>(&options, "repeat_last_n", at)? {
        None => Some(OLLAMA_REPEAT_LAST_N),
        Some(-1) => Some(usize::MAX),
        Some(n) if n >= 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::invalid(
                "options.repeat_last_n",
                format!("options.repeat_last_n is {n} but must be -1 (the whole context), 0 (off) or a count"),
            ))
        }
    };
    let raw = RawCommon {
        stream: Some(optional(body, "stream", "")?.unwrap_or(true)),
        max_tokens: num_predict,
        temperature: optional(&options, "temperature", at)?,
        top_p: optional(&options, "top_p", at)?,
        top_k: optional(&options, "top_k", at)?,
        min_p: optional(&options, "min_p", at)?,
        // Ollama's default seed, -1, and any negative one draw at random.
        seed: optional::<i64>(&options, "seed", at)?.filter(|&s| s >= 0),
        stop: options.get("stop").cloned(),
        repetition_penalty: optional(&options, "repeat_penalty", at)?,
        presence_penalty: optional(&options, "presence_penalty", at)?,
        frequency_penalty: optional(&options, "frequency_penalty", at)?,
        penalty_window,
        ..RawCommon::default()
    };
    let rename = [
        ("max_tokens", "options.num_predict"),
        ("temperature", "options.temperature"),
        ("top_p", "options.top_p"),
        ("top_k", "options.top_k"),
        ("min_p", "options.min_p"),
        ("stop", "options.stop"),
        ("repetition_penalty", "options.repeat_penalty"),
        ("presence_penalty", "options.presence_penalty"),
        ("frequency_penalty", "options.frequency_penalty"),
    ];
    let mut generation = generation(raw, defaults, &rename)?;
    let constraint = match body.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(Constraint::Json),
        Some(schema @ Value::Object(_)) => Some(Constraint::JsonSchema(schema.clone())),
        Some(_) => {
            return Err(ApiError::invalid(
                "format",
                "format must be \"json\" or a JSON schema object",
            ))
        }
    };
    if let Some(constraint) = constraint {
        apply_constraint(&mut generation, "format", constraint, None)?;
    }
    match body.get("think") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(on)) => set_thinking(vars, *on),
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            set_thinking(vars, true);
            vars.insert("reasoning_effort".into(), Value::String(level.clone()));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "think",
                "think must be true, false, \"low\", \"medium\" or \"high\"",
            ))
        }
    }
    Ok(generation)
}

/// Parses an `/api/chat` body.
pub fn parse_chat(body: &Value, defaults: &SamplingParams) -> Result<OllamaRequest, ApiError> {
    CHAT_FIELDS.check(body, "")?;
    let mut vars = Map::new();
    let generation = common(body, defaults, &mut vars)?;
    let raw = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::invalid("messages", "messages must be a non-empty list"))?;
    let mut images = Vec::new();
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(m, i, &mut images))
        .collect::<Result<Vec<_>, _>>()?;
    refuse_prefill(&messages, &format!("messages[{}].role", raw.len() - 1))?;
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if list.is_empty() => None,
        Some(Value::Array(list)) => Some(Value::Array(
            list.iter()
                .enumerate()
                .map(|(i, t)| {
                    let f = &t["function"];
                    let name = f["name"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| {
                            ApiError::invalid(
                                format!("tools[{i}].function.name"),
                                "a tool needs a function name",
                            )
                        })?;
                    let schema = tool_schema(
                        f.get("parameters"),
                        &format!("tools[{i}].function.parameters"),
                    )?;
                    Ok(template_tool(name, f["description"].as_str(), schema))
                })
                .collect::<Result<Vec<_>, ApiError>>()?,
        )),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list")),
    };
    Ok(OllamaRequest {
        generation,
        prompt: Prompt::Chat {
            messages: Value::Array(messages),
            tools,
            vars,
            add_generation_prompt: true,
        },
        images,
    })
}

/// `images`: a list of base64 strings, decoded into `out` (errors name `images[k]` under
/// `param`). Returns how many there were.
fn base64_images(
    value: Option<&Value>,
    param: &str,
    out: &mut Vec<RequestImage>,
) -> Result<usize, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(0),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(ApiError::invalid(
                param,
                format!("{param} must be a list of base64-encoded images"),
            ))
        }
    };
    for (k, item) in list.iter().enumerate() {
        let at = format!("{param}[{k}]");
        let data = item.as_str().ok_or_else(|| {
            ApiError::invalid(&at, format!("{at} must be a base64-encoded image"))
        })?;
        out.push(images::from_base64(data, &at)?);
    }
    Ok(list.len())
}

/// An Ollama message as the template reads it; its `images` (user messages only) go to
/// `images` and before its text in the content.
fn template_message(
    message: &Value,
    i: usize,
    images: &mut Vec<RequestImage>,
) -> Result<Value, ApiError> {
    let at = |field: &str| format!("messages[{i}].{field}");
    let role = match message.get("role").and_then(Value::as_str) {
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
        _ => {
            return Err(ApiError::invalid(
                at("role"),
                "role must be system, user, assistant or tool",
            ))
        }
    };
    let mut content = Content::default();
    let count = base64_images(message.get("images"), &at("images"), images)?;
    if count > 0 && role != "user" {
        return Err(ApiError::invalid(
            at("images"),
            "images are only read in user messages",
        ));
    }
    for _ in 0..count {
        content.push_image();
    }
    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => content.push_text(s),
        Some(_) => return Err(ApiError::invalid(at("content"), "content must be a string")),
    };
    let mut m = json!({"role": role, "content": content.into_value()});
    if let Some(thinking) = message.get("thinking").and_then(Value::as_str) {
        m["reasoning_content"] = Value::String(thinking.to_owned());
    }
    if let Some(name) = message.get("tool_name").and_then(Value::as_str) {
        m["name"] = Value::String(name.to_owned());
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        let calls = calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let f = &c["function"];
                let name = f["name"].as_str().ok_or_else(|| {
                    ApiError::invalid(
                        at(&format!("tool_calls[{j}].function.name")),
                        "a tool call needs a name",
                    )
                })?;
                let arguments = arguments_object(
                    &f["arguments"],
                    &at(&format!("tool_calls[{j}].function.arguments")),
                )?;
                Ok(template_tool_call(c["id"].as_str(), name, arguments))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        m["tool_calls"] = Value::Array(calls);
    }
    Ok(m)
}

/// Parses an `/api/generate` body; `None` for an empty prompt (Ollama's "load the model"
/// request, answered without generating).
pub fn parse_generate(
    body: &Value,
    defaults: &SamplingParams,
) -> Result<Option<OllamaRequest>, ApiError> {
    GENERATE_FIELDS.check(body, "")?;
    let mut vars = Map::new();
    let generation = common(body, defaults, &mut vars)?;
    let prompt: String = optional(body, "prompt", "")?.unwrap_or_default();
    if prompt.is_empty() {
        return Ok(None);
    }
    // An empty system prompt is no system prompt, as Ollama reads it.
    let system: Option<String> = optional::<String>(body, "system", "")?.filter(|s| !s.is_empty());
    let mut images = Vec::new();
    let count = base64_images(body.get("images"), "images", &mut images)?;
    let prompt = if optional(body, "raw", "")?.unwrap_or(false) {
        if count > 0 {
            return Err(ApiError::invalid(
                "images",
                "images need the chat template to place them: not with raw",
            ));
        }
        if system.is_some() {
            return Err(ApiError::invalid(
                "system",
                "system has no place in a raw prompt",
            ));
        }
        if !vars.is_empty() {
            return Err(ApiError::invalid(
                "think",
                "think has no effect on a raw prompt (no chat template renders it)",
            ));
        }
        Prompt::Text {
            text: prompt,
            special_tokens: true,
        }
    } else {
        let mut messages: Vec<Value> = system
            .into_iter()
            .map(|s| json!({"role": "system", "content": s}))
            .collect();
        let mut content = Content::default();
        for _ in 0..count {
            content.push_image();
        }
        content.push_text(&prompt);
        messages.push(json!({"role": "user", "content": content.into_value()}));
        Prompt::Chat {
            messages: Value::Array(messages),
            tools: None,
            vars,
            add_generation_prompt: true,
        }
    };
    Ok(Some(OllamaRequest {
        generation,
        prompt,
        images,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_chat(body: Value) -> String {
        parse_chat(&body, &SamplingParams::default())
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn options_map_to_sampling_and_think_to_the_switch() {
        let r = parse_chat(
            &json!({"model": "x", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "thinking": "t",
                 "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                {"role": "tool", "content": "ok", "tool_name": "f"}],
                "options": {"temperature": 0.3, "top_k": 7, "num_predict": 11, "stop": ["x"], "seed": 5,
                            "repeat_penalty": 1.1, "num_ctx": 8192},
                "think": false, "keep_alive": "5m"}),
            &SamplingParams::default(),
        )
        .unwrap();
        let o = &r.generation.options;
        assert!(r.generation.stream, "Ollama streams by default");
        assert_eq!(
            (o.max_tokens, o.sampling.top_k, o.sampling.seed),
            (Some(11), 7, Some(5))
        );
        assert!((o.sampling.repetition_penalty - 1.1).abs() < 1e-6);
        let Prompt::Chat { messages, vars, .. } = r.prompt else {
            panic!("a chat prompt")
        };
        assert_eq!(vars["force_thinking"], json!(false));
        assert_eq!(messages[1]["reasoning_content"], "t");
        assert_eq!(
            messages[1]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
    }

    #[test]
    fn penalties_read_the_last_repeat_last_n_tokens_and_negative_seeds_draw_at_random() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let window = |options: Value| {
            parse_chat(
                &json!({"messages": user, "options": options}),
                &SamplingParams::default(),
            )
            .unwrap()
            .generation
            .options
            .sampling
        };
        assert_eq!(window(json!({})).penalty_window, Some(OLLAMA_REPEAT_LAST_N));
        assert_eq!(window(json!({"repeat_last_n": 8})).penalty_window, Some(8));
        assert_eq!(window(json!({"repeat_last_n": 0})).penalty_window, Some(0));
        assert_eq!(
            window(json!({"repeat_last_n": -1})).penalty_window,
            Some(usize::MAX)
        );
        assert_eq!(
            param_chat(json!({"messages": user, "options": {"repeat_last_n": -2}})),
            "options.repeat_last_n"
        );
        assert_eq!(window(json!({"seed": -1})).seed, None);
        assert_eq!(window(json!({"seed": 3})).seed, Some(3));
        // Empty strings and lists are unset, as Ollama's Go clients send them.
        let r = parse_generate(
            &json!({"prompt": "hi", "system": "", "suffix": "", "template": "", "context": []}),
            &SamplingParams::default(),
        )
        .unwrap()
        .unwrap();
        let Prompt::Chat { messages, .. } = r.prompt else {
            panic!("a chat prompt")
        };
        assert_eq!(
            messages.as_array().unwrap().len(),
            1,
            "no empty system turn"
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let user = json!([{"role": "user", "content": "hi"}]);
        let r = parse_chat(
            &json!({"messages": user, "format": "json"}),
            &SamplingParams::default(),
        )
        .unwrap();
        assert!(matches!(&r.generation.grammar, Some((f, _)) if f == "format"));
        assert_eq!(
            param_chat(json!({"messages": user, "options": {"mirostat": 2}})),
            "options.mirostat"
        );
        assert_eq!(
            param_chat(json!({"messages": user, "options": {"num_predict": 0}})),
            "options.num_predict"
        );
        assert_eq!(
            param_chat(json!({"messages": user, "options": {"temperature": "hot"}})),
            "options.temperature"
        );
        assert_eq!(
            param_chat(json!({"messages": user, "think": "max"})),
            "think"
        );
        assert_eq!(
            param_chat(json!({"messages": [{"role": "user", "content": "x", "images": ["a!a"]}]})),
            "messages[0].images[0]"
        );
        assert_eq!(
            param_chat(
                json!({"messages": [{"role": "system", "content": "x", "images": ["aGk="]}]})
            ),
            "messages[0].images"
        );
        let r = parse_chat(
            &json!({"messages": [{"role": "user", "content": "what?", "images": ["aGk="]}]}),
            &SamplingParams::default(),
        )
        .unwrap();
        assert_eq!(r.images[0].bytes, b"hi");
        match &r.prompt {
            Prompt::Chat { messages, .. } => assert_eq!(
                messages[0]["content"],
                json!([{"type": "image"}, {"type": "text", "text": "what?"}])
            ),
            other => panic!("{other:?}"),
        }
        let e = parse_generate(
            &json!({"prompt": "x", "raw": true, "images": ["aGk="]}),
            &SamplingParams::default(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("images"));
        let e = parse_generate(
            &json!({"prompt": "x", "suffix": "y"}),
            &SamplingParams::default(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("suffix"));
        assert!(
            parse_generate(&json!({"model": "x"}), &SamplingParams::default())
                .unwrap()
                .is_none()
        );
    }
}
