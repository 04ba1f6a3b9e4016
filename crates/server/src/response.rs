//! Response bodies in OpenAI's exact shapes, and the mapping from a finished generation
//! (text, finish) to them: reasoning to `reasoning_content`, `<tool_call>` blocks to
//! `tool_calls`, the engine's finish to `finish_reason`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use spindle_runtime::{Completion, Finish, TokenLogprob};
use spindle_text::{ParsedOutput, ToolCall};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens restored from the prefix cache instead of prefilled.
    pub cached_tokens: usize,
}

impl Usage {
    #[allow(dead_code)] // for endpoints of one choice
    pub fn of(completion: &Completion) -> Self {
        Self {
            prompt_tokens: completion.prompt_tokens,
            completion_tokens: completion.ids.len(),
            total_tokens: completion.prompt_tokens + completion.ids.len(),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: completion.cached_tokens,
            },
        }
    }

    /// The usage of `n` choices of one prompt: the prompt counted once, every choice's tokens;
    /// the cached prompt tokens are the most any choice restored.
    pub fn of_all<'a>(completions: impl IntoIterator<Item = &'a Completion>) -> Self {
        let mut usage = Self {
            prompt_tokens: 0,
            completion_tokens: 0,
            total_tokens: 0,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        };
        for c in completions {
            usage.prompt_tokens = c.prompt_tokens;
            usage.completion_tokens += c.ids.len();
            let cached = &mut usage.prompt_tokens_details.cached_tokens;
            *cached = (*cached).max(c.cached_tokens);
        }
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
        usage
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

/// One alternative in a token's `top_logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token's log-probability in a chat choice's `logprobs.content`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
    pub refusal: Option<Vec<ChatTokenLogprob>>,
}

/// A `-inf` log-probability as vLLM writes it (JSON has no infinity).
fn finite(logprob: f32) -> f32 {
    logprob.max(-9999.0)
}

/// Token ids to their text and bytes.
pub trait TokenText {
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

impl TokenText for spindle_runtime::Model {
    /// A control token the answer's text hides (special tokens but the markup the parser
    /// reads, `<think>`, `<tool_call>`, ...) is empty here too, so the tokens of a
    /// log-probability report join into the text.
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        if self.tokenizer.control_ids().contains(&id) {
            return Vec::new();
        }
        match self.grammars() {
            Ok(g) => g.token_bytes(id),
            Err(_) => self
                .tokenizer
                .decode(&[id], false)
                .unwrap_or_default()
                .into_bytes(),
        }
    }
}

impl ChatLogprobs {
    /// `top` alternatives per token (OpenAI's `top_logprobs`; the engine may have more).
    pub fn of(tokens: &[TokenLogprob], top: usize, text: &dyn TokenText) -> Self {
        let entry = |id: u32, logprob: f32| {
            let bytes = text.token_bytes(id);
            (
                String::from_utf8_lossy(&bytes).into_owned(),
                finite(logprob),
                bytes,
            )
        };
        let content = tokens
            .iter()
            .map(|t| {
                let (token, logprob, bytes) = entry(t.id, t.logprob);
                ChatTokenLogprob {
                    token,
                    logprob,
                    bytes,
                    top_logprobs: t
                        .top
                        .iter()
                        .take(top)
                        .map(|&(id, lp)| {
                            let (token, logprob, bytes) = entry(id, lp);
                            TopLogprob {
                                token,
                                logprob,
                                bytes,
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        Self {
            content,
            refusal: None,
        }
    }
}

/// A `/v1/completions` choice's `logprobs` (the legacy shape): the tokens, theirs, the top
/// alternatives as token-to-logprob maps and each token's offset in the text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    pub text_offset: Vec<usize>,
}

impl TextLogprobs {
    /// For `tokens` starting at byte `offset` of the choice's text.
    pub fn of(tokens: &[TokenLogprob], top: usize, offset: usize, text: &dyn TokenText) -> Self {
        let mut out = Self {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        };
        let mut at = offset;
        let token = |id: u32| String::from_utf8_lossy(&text.token_bytes(id)).into_owned();
        for t in tokens {
            let s = token(t.id);
            out.text_offset.push(at);
            at += s.len();
            out.tokens.push(s);
            out.token_logprobs.push(Some(finite(t.logprob)));
            let mut map = serde_json::Map::new();
            for &(id, lp) in t.top.iter().take(top) {
                map.entry(token(id))
                    .or_insert(serde_json::json!(finite(lp)));
            }
            out.top_logprobs.push(Some(map));
        }
        out
    }

    /// Puts the prompt's first token (which has no log-probability) before the rest of the
    /// prompt's (`echo`), shifting every offset past it.
    pub fn prepend_first(&mut self, first: u32, text: &dyn TokenText) {
        let s = String::from_utf8_lossy(&text.token_bytes(first)).into_owned();
        for offset in &mut self.text_offset {
            *offset += s.len();
        }
        self.text_offset.insert(0, 0);
        self.tokens.insert(0, s);
        self.token_logprobs.insert(0, None);
        self.top_logprobs.insert(0, None);
    }

    /// `other`'s tokens after these.
    pub fn append(&mut self, mut other: TextLogprobs) {
        self.tokens.append(&mut other.tokens);
        self.token_logprobs.append(&mut other.token_logprobs);
        self.top_logprobs.append(&mut other.top_logprobs);
        self.text_offset.append(&mut other.text_offset);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
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
    pub logprobs: Option<ChatLogprobs>,
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
    pub logprobs: Option<TextLogprobs>,
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
            cached_tokens: 2,
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
                total_tokens: 8,
                prompt_tokens_details: PromptTokensDetails { cached_tokens: 2 },
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

#[cfg(test)]
mod token_text_tests {
    use super::TokenText;
    use spindle_runtime::{demo_dir, Model};

    #[test]
    fn hidden_control_tokens_have_no_text_and_markup_keeps_its_own() {
        let model = Model::load(&demo_dir().unwrap()).unwrap();
        let id = |t: &str| model.tokenizer.token_to_id(t).unwrap();
        assert!(model.token_bytes(id("<|repo_name|>")).is_empty());
        assert_eq!(model.token_bytes(id("<tool_call>")), b"<tool_call>");
        let word = model.tokenizer.encode("cat", false).unwrap()[0];
        assert!(!model.token_bytes(word).is_empty());
    }
}
