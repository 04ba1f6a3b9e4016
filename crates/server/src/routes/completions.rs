//! `POST /v1/completions`: a raw prompt continued, whole or streamed.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use spindle_runtime::{Completion, Prompt, TokenLogprob};

use super::{admit_and_read, check_prompt_fits, choice_options, prepare};
use crate::error::ApiError;
use crate::request::{
    check_fields, from_value, PromptInput, RawCommon, RawCompletion, COMPLETION_FIELDS,
    IGNORED_FIELDS,
};
use crate::response::{
    finish_reason, now_s, unique_id, TextChoice, TextCompletion, TextLogprobs, TokenText, Usage,
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
    check_fields(&body, COMPLETION_FIELDS, IGNORED_FIELDS)?;
    let common = from_value::<RawCommon>(&body)?;
    let mut generation = common.check(&state.model.defaults)?;
    generation.options.logprobs = common.completion_logprobs()?;
    generation.grammar = structured_output(&body)?;
    let request = from_value::<RawCompletion>(&body)?.check(generation)?;
    drop(body);
    let echoed_text = match &request.prompt {
        PromptInput::Text(text) if request.echo => Some(text.clone()),
        _ => None,
    };
    let prompt = match request.prompt {
        PromptInput::Text(text) => Prompt::Text {
            text,
            special_tokens: request.special_tokens,
        },
        PromptInput::Tokens(ids) => {
            let vocab = state.model.config().vocab_size;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            Prompt::Tokens(ids)
        }
    };
    let slot = ticket.start().await;
    let prepared = prepare(&state, prompt, Vec::new(), body_bytes, "prompt").await?;
    if prepared.ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
    }
    check_prompt_fits(&state, prepared.ids.len(), "prompt")?;
    let generation = request.generation;
    let top = generation.options.logprobs;
    // `echo`: the prompt as given (a token prompt decoded), and with `logprobs` the prompt
    // tokens' own (the first has none).
    let echo = if request.echo {
        let text = match echoed_text {
            Some(text) => text,
            None => state
                .model
                .tokenizer
                .decode(&prepared.ids, false)
                .map_err(|e| ApiError::internal(e.to_string()))?,
        };
        let logprobs = match top {
            Some(k) => {
                let model = Arc::clone(&state.model);
                let ids = prepared.ids.clone();
                let logprobs = tokio::task::spawn_blocking(move || model.prompt_logprobs(&ids, k))
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                let mut lp = TextLogprobs::of(&logprobs, k, 0, state.model.as_ref());
                lp.prepend_first(prepared.ids[0], state.model.as_ref());
                Some(lp)
            }
            None => None,
        };
        Some((text, logprobs))
    } else {
        None
    };
    let options = choice_options(&state, &generation, false).await?;
    let events = spawn_choices(&state, slot, prepared.ids.into(), options);
    let mut chunks = TextChunks {
        id: unique_id("cmpl-"),
        created: now_s(),
        model: state.model_id.clone(),
        include_usage: generation.include_usage,
        top,
        token_text: Arc::clone(&state.model) as Arc<dyn TokenText + Send + Sync>,
        echo,
        choices: vec![ChoiceStream::default(); generation.n],
        done: Vec::new(),
    };
    if generation.stream {
        return Ok(sse_response(events, chunks));
    }
    let completions = wait_for_choices(events)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let choices = completions
        .iter()
        .enumerate()
        .map(|(index, completion)| {
            let (mut text, mut logprobs) = (String::new(), None);
            chunks.echo_into(&mut text, &mut logprobs);
            let offset = text.len();
            text.push_str(&completion.text);
            if let Some(k) = top {
                let answer =
                    TextLogprobs::of(&completion.logprobs, k, offset, state.model.as_ref());
                match &mut logprobs {
                    Some(lp) => lp.append(answer),
                    None => logprobs = Some(answer),
                }
            }
            TextChoice {
                index: index as u32,
                text,
                logprobs,
                finish_reason: Some(finish_reason(&completion.finish, false)),
            }
        })
        .collect();
    chunks.include_usage = true;
    let mut body = chunks.body(Vec::new(), Some(Usage::of_all(&completions)));
    body.choices = choices;
    Ok(Json(body).into_response())
}

/// One streamed choice's progress.
#[derive(Clone, Default)]
struct ChoiceStream {
    /// Bytes of text sent (the next token's offset).
    sent: usize,
    /// Tokens whose log-probabilities were sent.
    logprobs_sent: usize,
}

/// Builds `text_completion` objects: the whole answer or its streamed chunks.
struct TextChunks {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Alternatives per token when logprobs were asked for.
    top: Option<usize>,
    token_text: Arc<dyn TokenText + Send + Sync>,
    /// The prompt's text (and its logprobs) when echoed.
    echo: Option<(String, Option<TextLogprobs>)>,
    choices: Vec<ChoiceStream>,
    done: Vec<Completion>,
}

impl TextChunks {
    fn body(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: None,
            choices,
            usage: self.include_usage.then_some(usage),
        }
    }

    /// The echoed prompt, when asked for, at the start of a choice.
    fn echo_into(&self, text: &mut String, logprobs: &mut Option<TextLogprobs>) {
        if let Some((prompt, lp)) = &self.echo {
            text.push_str(prompt);
            *logprobs = lp.clone();
        }
    }

    fn json(body: &TextCompletion) -> String {
        serde_json::to_string(body).expect("chunks serialize")
    }

    fn choice_chunk(
        &mut self,
        index: usize,
        delta: &str,
        tokens: &[TokenLogprob],
        reason: Option<&'static str>,
    ) -> String {
        let stream = &mut self.choices[index];
        let logprobs = self
            .top
            .map(|k| TextLogprobs::of(tokens, k, stream.sent, self.token_text.as_ref()));
        stream.sent += delta.len();
        stream.logprobs_sent += tokens.len();
        let choice = TextChoice {
            index: index as u32,
            text: delta.to_owned(),
            logprobs,
            finish_reason: reason,
        };
        Self::json(&self.body(vec![choice], None))
    }
}

impl ChunkFormatter for TextChunks {
    fn start(&mut self) -> Vec<String> {
        let Some((prompt, lp)) = self.echo.clone() else {
            return Vec::new();
        };
        (0..self.choices.len())
            .map(|index| {
                self.choices[index].sent = prompt.len();
                let choice = TextChoice {
                    index: index as u32,
                    text: prompt.clone(),
                    logprobs: lp.clone(),
                    finish_reason: None,
                };
                Self::json(&self.body(vec![choice], None))
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
        vec![self.choice_chunk(index, delta, &logprobs, None)]
    }

    fn choice_finish(&mut self, index: usize, completion: &Completion) -> Vec<String> {
        let reason = finish_reason(&completion.finish, false);
        let sent = self.choices[index]
            .logprobs_sent
            .min(completion.logprobs.len());
        let tail = completion.logprobs[sent..].to_vec();
        self.done.push(completion.clone());
        vec![self.choice_chunk(index, "", &tail, Some(reason))]
    }

    fn after_choices(&mut self) -> Vec<String> {
        if !self.include_usage {
            return Vec::new();
        }
        vec![Self::json(
            &self.body(Vec::new(), Some(Usage::of_all(&self.done))),
        )]
    }
}
