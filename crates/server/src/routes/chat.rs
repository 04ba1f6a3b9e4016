//! `POST /v1/chat/completions`: messages through the chat template, reasoning and tool calls
//! parsed out of the answer, whole or streamed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_runtime::{Completion, Prompt, TokenLogprob};
use spindle_text::{parse_output, OutputParser, ParseEvent};

use super::{admit_and_read, check_message_count, check_prompt_fits, choice_options, prepare};
use crate::error::ApiError;
use crate::images::request_engine_prompt;
use crate::request::{check_fields, from_value, RawChat, RawCommon, CHAT_FIELDS, IGNORED_FIELDS};
use crate::response::{
    finish_reason, now_s, unique_id, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion,
    ChatLogprobs, ChunkChoice, Delta, TokenText, ToolCallOut, Usage,
};
use crate::sse::{sse_response, ChunkFormatter};
use crate::state::AppState;
use crate::structured::structured_output;
use crate::worker::{spawn_choices, wait_for_choices};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (ticket, body, body_bytes) = admit_and_read(&state, &headers, body).await?;
    check_fields(&body, CHAT_FIELDS, IGNORED_FIELDS)?;
    let common = from_value::<RawCommon>(&body)?;
    let mut generation = common.check(&state.model.defaults)?;
    generation.options.logprobs = common.chat_logprobs()?;
    generation.grammar = structured_output(&body)?;
    let messages = body
        .get("messages")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len);
    check_message_count(&state, messages, "messages")?;
    let request = from_value::<RawChat>(&body)?.check(generation)?;
    drop(body);
    let prompt = Prompt::Chat {
        messages: request.messages,
        tools: request.tools,
        vars: request.vars,
        add_generation_prompt: true,
    };
    let slot = ticket.start().await;
    let prepared = prepare(&state, prompt, request.images, body_bytes, "messages").await?;
    check_prompt_fits(&state, prepared.ids.len(), "messages")?;
    let generation = request.generation;
    let options = choice_options(&state, &generation, prepared.starts_in_reasoning).await?;
    let top_logprobs = generation.options.logprobs;
    let ids = request_engine_prompt(&state, prepared.ids, prepared.images, "messages")?;
    let events = spawn_choices(&state, slot, ids, options);
    let (id, created) = (unique_id("chatcmpl-"), now_s());
    if generation.stream {
        let formatter = ChatChunks {
            id,
            created,
            model: state.model_id.clone(),
            include_usage: generation.include_usage,
            choices: (0..generation.n)
                .map(|_| ChoiceStream {
                    parser: OutputParser::new(prepared.starts_in_reasoning),
                    tool_calls: 0,
                    logprobs_sent: 0,
                })
                .collect(),
            single_tool_call: request.single_tool_call,
            top_logprobs,
            token_text: Arc::clone(&state.model) as Arc<dyn TokenText + Send + Sync>,
            done: Vec::new(),
        };
        return Ok(sse_response(events, formatter));
    }
    let completions = wait_for_choices(events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let choices = completions
        .iter()
        .enumerate()
        .map(|(index, completion)| {
            let mut parsed = parse_output(&completion.text, prepared.starts_in_reasoning);
            if request.single_tool_call {
                parsed.tool_calls.truncate(1);
            }
            let reason = finish_reason(&completion.finish, !parsed.tool_calls.is_empty());
            ChatChoice {
                index: index as u32,
                message: AssistantMessage::from_parsed(parsed),
                logprobs: top_logprobs
                    .map(|k| ChatLogprobs::of(&completion.logprobs, k, state.model.as_ref())),
                finish_reason: reason,
            }
        })
        .collect();
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: state.model_id.clone(),
        choices,
        usage: Usage::of_all(&completions),
        system_fingerprint: None,
    })
    .into_response())
}

/// One streamed choice's parser state.
struct ChoiceStream {
    parser: OutputParser,
    /// Tool calls sent so far (the next call's `index`).
    tool_calls: usize,
    /// Tokens whose log-probabilities were sent.
    logprobs_sent: usize,
}

/// Streams a chat answer (`n` choices) as `chat.completion.chunk` objects.
struct ChatChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    choices: Vec<ChoiceStream>,
    /// `parallel_tool_calls: false`: calls after the first are not sent.
    single_tool_call: bool,
    /// Alternatives per token when logprobs were asked for.
    top_logprobs: Option<usize>,
    token_text: Arc<dyn TokenText + Send + Sync>,
    /// The finished choices (for the usage of them all).
    done: Vec<Completion>,
}

impl ChatChunks {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
        let chunk = ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: self.include_usage.then_some(usage),
        };
        serde_json::to_string(&chunk).expect("chunks serialize")
    }

    fn delta(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish_reason: Option<&'static str>,
    ) -> String {
        let choice = ChunkChoice {
            index: index as u32,
            delta,
            logprobs,
            finish_reason,
        };
        self.chunk(vec![choice], None)
    }

    /// Chunks for parse events of choice `index`; `logprobs` go with the first chunk (or
    /// alone in an empty delta when the parser held the text back).
    fn events(
        &mut self,
        index: usize,
        events: Vec<ParseEvent>,
        logprobs: Vec<TokenLogprob>,
    ) -> Vec<String> {
        let mut logprobs = self
            .top_logprobs
            .filter(|_| !logprobs.is_empty())
            .map(|k| ChatLogprobs::of(&logprobs, k, self.token_text.as_ref()));
        let mut chunks = Vec::new();
        for event in events {
            let delta = match event {
                ParseEvent::Content(text) => Delta {
                    content: Some(text),
                    ..Delta::default()
                },
                ParseEvent::Reasoning(text) => Delta {
                    reasoning_content: Some(text),
                    ..Delta::default()
                },
                ParseEvent::ToolCall(call) => {
                    let stream = &mut self.choices[index];
                    if self.single_tool_call && stream.tool_calls > 0 {
                        continue;
                    }
                    stream.tool_calls += 1;
                    Delta {
                        tool_calls: Some(vec![ToolCallOut::new(
                            &call,
                            Some(stream.tool_calls - 1),
                        )]),
                        ..Delta::default()
                    }
                }
            };
            chunks.push(self.delta(index, delta, logprobs.take(), None));
        }
        if let Some(logprobs) = logprobs {
            chunks.push(self.delta(index, Delta::default(), Some(logprobs), None));
        }
        chunks
    }
}

impl ChunkFormatter for ChatChunks {
    fn start(&mut self) -> Vec<String> {
        (0..self.choices.len())
            .map(|index| {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                self.delta(index, delta, None, None)
            })
            .collect()
    }

    fn text(&mut self, delta: &str) -> Vec<String> {
        self.choice_text(0, delta, Vec::new())
    }

    fn finish(&mut self, completion: &Completion) -> Vec<String> {
        let mut chunks = self.choice_finish(0, completion);
        chunks.extend(self.after_choices());
        chunks
    }

    fn choice_text(
        &mut self,
        index: usize,
        delta: &str,
        logprobs: Vec<TokenLogprob>,
    ) -> Vec<String> {
        let stream = &mut self.choices[index];
        stream.logprobs_sent += logprobs.len();
        let events = stream.parser.push(delta);
        self.events(index, events, logprobs)
    }

    fn choice_finish(&mut self, index: usize, completion: &Completion) -> Vec<String> {
        let held = self.choices[index].parser.finish();
        // Log-probabilities of tokens whose text was held back to the end.
        let sent = self.choices[index]
            .logprobs_sent
            .min(completion.logprobs.len());
        let tail = completion.logprobs[sent..].to_vec();
        let mut chunks = self.events(index, held, tail);
        let reason = finish_reason(&completion.finish, self.choices[index].tool_calls > 0);
        chunks.push(self.delta(index, Delta::default(), None, Some(reason)));
        self.done.push(completion.clone());
        chunks
    }

    fn after_choices(&mut self) -> Vec<String> {
        if !self.include_usage {
            return Vec::new();
        }
        vec![self.chunk(Vec::new(), Some(Usage::of_all(&self.done)))]
    }
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use spindle_runtime::Finish;

    use super::*;

    fn formatter(include_usage: bool) -> ChatChunks {
        ChatChunks {
            id: "chatcmpl-test".into(),
            created: 1,
            model: "m".into(),
            include_usage,
            choices: vec![ChoiceStream {
                parser: OutputParser::new(false),
                tool_calls: 0,
                logprobs_sent: 0,
            }],
            single_tool_call: false,
            top_logprobs: None,
            token_text: Arc::new(Bytes),
            done: Vec::new(),
        }
    }

    /// Token `id`'s text is its number.
    struct Bytes;

    impl TokenText for Bytes {
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            id.to_string().into_bytes()
        }
    }

    #[test]
    fn streamed_tool_calls_have_openai_delta_shape() {
        let mut f = formatter(true);
        let mut chunks = f.start();
        let text =
            "<think>\nplan\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n\
                    <parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        // Fed in small pieces, as a decode loop would.
        for piece in text.as_bytes().chunks(5) {
            chunks.extend(f.text(std::str::from_utf8(piece).unwrap()));
        }
        let completion = Completion {
            text: text.into(),
            ids: vec![1; 9],
            finish: Finish::Eos(0),
            prompt_tokens: 4,
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            logprobs: Vec::new(),
            cached_tokens: 0,
        };
        chunks.extend(f.finish(&completion));
        let chunks: Vec<Value> = chunks
            .iter()
            .map(|c| serde_json::from_str(c).unwrap())
            .collect();
        assert_eq!(
            chunks[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert!(chunks[0]["usage"].is_null() && chunks[0].get("usage").is_some());
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["delta"])
            .collect();
        let field =
            |name: &str| -> String { deltas.iter().filter_map(|d| d[name].as_str()).collect() };
        assert_eq!(field("reasoning_content"), "plan");
        assert_eq!(field("content"), "Let me check.");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 1);
        let call = &calls[0][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[n - 2]["choices"][0]["delta"], json!({}));
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(chunks[n - 1]["usage"]["total_tokens"], 13);
    }
}
