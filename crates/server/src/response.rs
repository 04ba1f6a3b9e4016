//! Response bodies in OpenAI's exact shapes, and the mapping from a finished generation
//! (text, finish) to them: reasoning to `reasoning_content`, `<tool_call>` blocks to
//! `tool_calls`, the engine's finish to `finish_reason`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use spindle_runtime::{Completion, Finish};
use spindle_text::{ParsedOutput, ToolCall};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn of(completion: &Completion) -> Self {
        Self {
            prompt_tokens: completion.prompt_tokens,
            completion_tokens: completion.ids.len(),
            total_tokens: completion.prompt_tokens + completion.ids.len(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionOut {
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    /// Position in the message's list; only in streamed deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionOut,
}

impl ToolCallOut {
    pub fn new(call: &ToolCall, index: Option<usize>) -> Self {
        Self {
            index,
            id: unique_id("call_"),
            kind: "function",
            function: FunctionOut {
                name: call.name.clone(),
                arguments: call.arguments_json(),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

impl AssistantMessage {
    pub fn from_parsed(parsed: ParsedOutput) -> Self {
        let tool_calls: Vec<ToolCallOut> = parsed
            .tool_calls
            .iter()
            .map(|c| ToolCallOut::new(c, None))
            .collect();
        let only_calls = parsed.content.is_empty() && !tool_calls.is_empty();
        let content = (!only_calls).then_some(parsed.content);
        Self {
            role: "assistant",
            content,
            reasoning_content: (!parsed.reasoning.is_empty()).then_some(parsed.reasoning),
            tool_calls,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: Option<String>,
}

/// The changes one streamed chunk carries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<ChunkChoice>,
    /// Absent unless `stream_options.include_usage`; then null on every chunk but the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<()>,
    pub finish_reason: Option<&'static str>,
}

/// A `/v1/completions` answer, and (with `finish_reason` null until the end) its chunks.
#[derive(Debug, Clone, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// OpenAI's `finish_reason` for how generation ended.
pub fn finish_reason(finish: &Finish, has_tool_calls: bool) -> &'static str {
    match finish {
        Finish::Eos(_) | Finish::Stop(_) if has_tool_calls => "tool_calls",
        Finish::Eos(_) | Finish::Stop(_) => "stop",
        Finish::Length | Finish::ContextFull => "length",
        // Only a client that went away or a server shutting down sees this (vLLM's name).
        Finish::Cancelled => "abort",
    }
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A process-unique id such as `chatcmpl-18c2f0a1b2c3d4e5000007`.
pub fn unique_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}{nanos:016x}{n:06x}")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use spindle_text::parse_output;

    use super::*;

    fn completion(text: &str, finish: Finish) -> Completion {
        Completion {
            text: text.into(),
            ids: vec![1, 2, 3],
            finish,
            prompt_tokens: 5,
            prefill_time: Duration::from_millis(1),
            decode_time: Duration::from_millis(1),
            logprobs: Vec::new(),
        }
    }

    #[test]
    fn tool_call_text_maps_to_openai_tool_calls() {
        let text =
            "<think>\nthe user wants weather\n</think>\n\n<tool_call>\n<function=get_weather>\n\
                    <parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n\
                    </function>\n</tool_call>";
        let c = completion(text, Finish::Eos(7));
        let parsed = parse_output(&c.text, false);
        let has_calls = !parsed.tool_calls.is_empty();
        let message = AssistantMessage::from_parsed(parsed);
        let v = serde_json::to_value(&message).unwrap();
        assert_eq!(v["role"], "assistant");
        assert_eq!(v["content"], json!(null));
        assert_eq!(v["reasoning_content"], "the user wants weather");
        let call = &v["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3}));
        assert!(call.get("index").is_none());
        assert_eq!(finish_reason(&c.finish, has_calls), "tool_calls");
        assert_eq!(
            Usage::of(&c),
            Usage {
                prompt_tokens: 5,
                completion_tokens: 3,
                total_tokens: 8
            }
        );
    }

    #[test]
    fn plain_text_keeps_content_and_omits_tool_fields() {
        let parsed = parse_output("Hello there", false);
        let v = serde_json::to_value(AssistantMessage::from_parsed(parsed)).unwrap();
        assert_eq!(v, json!({"role": "assistant", "content": "Hello there"}));
        assert_eq!(finish_reason(&Finish::Length, false), "length");
        assert_eq!(finish_reason(&Finish::Stop("x".into()), false), "stop");
    }
}
