//! The decode loop: prefill the prompt, then sample, detokenize and check stop conditions one
//! token at a time, streaming text to the caller, who may stop it at any step.

use std::time::{Duration, Instant};

use spindle_cpu::LogitsFor;
use spindle_text::{FinishReason, StopConditions, TextStream};

use crate::backend::BackendSession;
use crate::error::{Result, RuntimeError};
use crate::model::Model;
use crate::sampling::{Sampler, SamplingParams};

/// How to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    /// The most tokens to generate; `None` runs to EOS or the end of the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token (not shown in the text).
    Eos(u32),
    /// A stop string (not shown in the text).
    Stop(String),
    /// `max_tokens` reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// The caller asked to stop.
    Cancelled,
}

/// How generation ended, in words for people (the stats line of `spindle run`):
/// `end of sequence (token 4065)`, `stop string "\n\n"`, `--max-tokens reached`, ...
impl std::fmt::Display for Finish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finish::Eos(id) => write!(f, "end of sequence (token {id})"),
            Finish::Stop(s) => write!(f, "stop string {s:?}"),
            Finish::Length => write!(f, "token limit reached"),
            Finish::ContextFull => write!(f, "context window full"),
            Finish::Cancelled => write!(f, "cancelled"),
        }
    }
}

/// The caller's answer to each streamed delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// What one generation produced, with its timings. The session holds the prompt and every
/// generated token except the last, which was sampled but never fed back.
#[derive(Clone, Debug)]
pub struct Completion {
    /// All visible text (control tokens and the stop string removed).
    pub text: String,
    /// Generated token ids, EOS included when generated.
    pub ids: Vec<u32>,
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl Completion {
    pub fn completion_tokens(&self) -> usize {
        self.ids.len()
    }

    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Decode speed over the tokens after the first (the first comes from the prefill).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.ids.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

impl Model {
    /// Feeds `prompt_ids` to `session` and generates until a stop condition, calling
    /// `on_text` with every visible delta (possibly empty strings are skipped). The same loop
    /// runs on every backend: only the forward pass is the backend's.
    pub fn generate(
        &self,
        session: &mut BackendSession,
        prompt_ids: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Completion> {
        let limit = self.config().max_position_embeddings;
        if session.position() + prompt_ids.len() >= limit {
            return Err(RuntimeError::PromptTooLong {
                prompt: session.position() + prompt_ids.len(),
                limit,
            });
        }
        let mut sampler = Sampler::new(options.sampling.clone())?;
        let conditions = StopConditions {
            eos_ids: self.eos_ids.clone(),
            stop_strings: options.stop.clone(),
            max_tokens: options.max_tokens,
        };
        let mut stream = TextStream::new(self.tokenizer.clone(), &conditions);
        let mut history: Vec<u32> = prompt_ids.to_vec();
        let mut text = String::new();
        let mut ids = Vec::new();

        let started = Instant::now();
        let mut logits = self.backend.forward(session, prompt_ids, LogitsFor::Last)?;
        let prefill_time = started.elapsed();
        let decode_started = Instant::now();

        let finish = loop {
            if options.max_tokens == Some(0) {
                break Finish::Length;
            }
            let id = sampler.sample(&mut logits, &history);
            ids.push(id);
            history.push(id);
            let delta = stream.push(id)?;
            text.push_str(&delta.text);
            let flow = if delta.text.is_empty() {
                Flow::Continue
            } else {
                on_text(&delta.text)
            };
            if let Some(reason) = delta.finished {
                break match reason {
                    FinishReason::Eos(id) => Finish::Eos(id),
                    FinishReason::StopString(s) => Finish::Stop(s),
                    FinishReason::MaxTokens => Finish::Length,
                };
            }
            if flow == Flow::Stop {
                break self.flush(&mut stream, &mut text, on_text, Finish::Cancelled)?;
            }
            if session.position() + 1 >= limit {
                break self.flush(&mut stream, &mut text, on_text, Finish::ContextFull)?;
            }
            logits = self.backend.forward(session, &[id], LogitsFor::Last)?;
        };
        Ok(Completion {
            text,
            ids,
            finish,
            prompt_tokens: prompt_ids.len(),
            prefill_time,
            decode_time: decode_started.elapsed(),
        })
    }

    fn flush(
        &self,
        stream: &mut TextStream,
        text: &mut String,
        on_text: &mut dyn FnMut(&str) -> Flow,
        finish: Finish,
    ) -> Result<Finish> {
        let rest = stream.finish(FinishReason::MaxTokens)?;
        if !rest.text.is_empty() {
            text.push_str(&rest.text);
            on_text(&rest.text);
        }
        Ok(finish)
    }
}
