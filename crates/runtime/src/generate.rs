//! The decode loop: prefill the prompt, then sample, detokenize and check stop conditions one
//! token at a time, streaming text to the caller, who may stop it at any step. The per-token
//! half of it is [`SequenceDecoder`], which the continuous-batching scheduler runs for each of
//! its sequences: one code path for a token, alone or in a batch.

use std::time::{Duration, Instant};

use spindle_cpu::LogitsFor;
use spindle_text::{FinishReason, StopConditions, TextStream};

use crate::backend::{BackendSession, Draw};
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
    /// Prompt tokens restored from the prefix cache instead of prefilled.
    pub cached_tokens: usize,
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

/// One sequence's side of the decode loop, between forward passes: its own [`Sampler`], the
/// history its penalties see, the streaming detokenizer with the stop conditions, and the
/// text and ids so far. Whoever runs the forward pass (one session in [`Model::generate`], a
/// batched step of the batch scheduler) hands it each row of logits; it answers with the visible
/// text and either the token to feed next or why the sequence ended.
pub struct SequenceDecoder {
    sampler: Sampler,
    stream: TextStream,
    /// Prompt and generated ids (what the penalties count).
    history: Vec<u32>,
    text: String,
    ids: Vec<u32>,
    prompt_tokens: usize,
    max_tokens: Option<usize>,
    /// The model's context (`max_position_embeddings`).
    limit: usize,
    finish: Option<Finish>,
}

/// What one row of logits produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenStep {
    /// Visible text to show now (may be empty).
    pub text: String,
    /// The token to feed next, or `None` when the sequence ended ([`SequenceDecoder::finish`]).
    pub next: Option<u32>,
}

impl SequenceDecoder {
    /// A decoder for `prompt_ids` fed to a session already holding `start` tokens. Refuses a
    /// prompt that leaves no room to generate and invalid sampling parameters.
    pub fn new(
        model: &Model,
        start: usize,
        prompt_ids: &[u32],
        options: &GenerateOptions,
    ) -> Result<Self> {
        let limit = model.config().max_position_embeddings;
        if start + prompt_ids.len() >= limit {
            return Err(RuntimeError::PromptTooLong {
                prompt: start + prompt_ids.len(),
                limit,
            });
        }
        let sampler = Sampler::new(options.sampling.clone())?;
        let conditions = StopConditions {
            eos_ids: model.eos_ids.clone(),
            stop_strings: options.stop.clone(),
            max_tokens: options.max_tokens,
        };
        Ok(Self {
            sampler,
            stream: TextStream::new(model.tokenizer.clone(), &conditions),
            history: prompt_ids.to_vec(),
            text: String::new(),
            ids: Vec::new(),
            prompt_tokens: prompt_ids.len(),
            max_tokens: options.max_tokens,
            limit,
            finish: None,
        })
    }

    /// Takes the logits `[V]` of the last token fed (the prompt's last token, then each token
    /// [`TokenStep::next`] named) to a session now at `position`: samples, detokenizes and
    /// checks EOS, stop strings, `max_tokens` and the context. `logits` is changed in place
    /// (penalties). After the sequence ended it returns empty steps.
    pub fn step(&mut self, logits: &mut [f32], position: usize) -> Result<TokenStep> {
        if !self.wants_token() {
            return Ok(self.ended());
        }
        let id = self.sampler.sample(logits, &self.history);
        self.accept(id, position)
    }

    /// The empty step of a sequence that does not sample (ended, or `max_tokens` 0, which
    /// ends it here).
    fn ended(&mut self) -> TokenStep {
        if self.finish.is_none() {
            self.finish = Some(Finish::Length);
        }
        TokenStep {
            text: String::new(),
            next: None,
        }
    }

    /// Whether the next row of logits will be sampled (the sequence has not ended and may
    /// generate): when it will not, [`SequenceDecoder::step`] and
    /// [`SequenceDecoder::accept`] return empty steps.
    pub fn wants_token(&self) -> bool {
        self.finish.is_none() && self.max_tokens != Some(0)
    }

    /// The next draw for a sampler that runs where the logits are
    /// ([`crate::Backend::forward_batch_sampled`]): the parameters, this step's uniform draw
    /// (taken from this sequence's random stream exactly as [`SequenceDecoder::step`] would
    /// take it) and the ids the penalties count. Pass the chosen token to
    /// [`SequenceDecoder::accept`]. `None` when the sequence will not sample
    /// ([`SequenceDecoder::wants_token`]).
    pub fn draw(&mut self) -> Option<Draw<'_>> {
        if !self.wants_token() {
            return None;
        }
        let uniform = self.sampler.next_uniform().unwrap_or(0.0);
        Some(Draw {
            params: self.sampler.params(),
            uniform,
            history: &self.history,
        })
    }

    /// [`SequenceDecoder::step`] for a token already chosen (by a device sampler given
    /// [`SequenceDecoder::draw`]): detokenizes it and checks the stop conditions.
    pub fn accept(&mut self, id: u32, position: usize) -> Result<TokenStep> {
        if !self.wants_token() {
            return Ok(self.ended());
        }
        self.ids.push(id);
        self.history.push(id);
        let delta = self.stream.push(id)?;
        let mut text = delta.text;
        if let Some(reason) = delta.finished {
            self.finish = Some(match reason {
                FinishReason::Eos(id) => Finish::Eos(id),
                FinishReason::StopString(s) => Finish::Stop(s),
                FinishReason::MaxTokens => Finish::Length,
            });
        } else if position + 1 >= self.limit {
            text.push_str(&self.end(Finish::ContextFull)?);
        }
        self.text.push_str(&text);
        let next = self.finish.is_none().then_some(id);
        Ok(TokenStep { text, next })
    }

    /// Ends the sequence from outside (the caller stopped it): returns the text held back
    /// (part of a character or of a possible stop string), now visible. A no-op once ended.
    pub fn cancel(&mut self) -> Result<String> {
        if self.finish.is_some() {
            return Ok(String::new());
        }
        let rest = self.end(Finish::Cancelled)?;
        self.text.push_str(&rest);
        Ok(rest)
    }

    fn end(&mut self, finish: Finish) -> Result<String> {
        self.finish = Some(finish);
        Ok(self.stream.finish(FinishReason::MaxTokens)?.text)
    }

    /// Why the sequence ended, once it has.
    pub fn finish(&self) -> Option<&Finish> {
        self.finish.as_ref()
    }

    /// The tokens this sequence may still generate: `max_tokens` (or `default` when unset)
    /// less what it has generated, within the context.
    pub fn room(&self, default: usize) -> usize {
        let wanted = self
            .max_tokens
            .unwrap_or(default)
            .saturating_sub(self.ids.len());
        wanted.min(self.limit.saturating_sub(self.prompt_tokens))
    }

    /// The ids generated so far (EOS included when generated).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.ids.len()
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// The result, with the timings the caller measured (a sequence not ended counts as
    /// cancelled).
    pub fn into_completion(self, prefill_time: Duration, decode_time: Duration) -> Completion {
        Completion {
            text: self.text,
            ids: self.ids,
            finish: self.finish.unwrap_or(Finish::Cancelled),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: 0,
            prefill_time,
            decode_time,
        }
    }
}

impl Model {
    /// Feeds `prompt_ids` to `session` and generates until a stop condition, calling
    /// `on_text` with every visible delta (possibly empty strings are skipped). The same loop
    /// runs on every backend: only the forward pass is the backend's; each token goes through
    /// [`SequenceDecoder`], as in a batched step.
    pub fn generate(
        &self,
        session: &mut BackendSession,
        prompt_ids: &[u32],
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Completion> {
        let mut decoder = SequenceDecoder::new(self, session.position(), prompt_ids, options)?;
        let started = Instant::now();
        let mut logits = self.backend.forward(session, prompt_ids, LogitsFor::Last)?;
        let prefill_time = started.elapsed();
        let decode_started = Instant::now();
        loop {
            let step = decoder.step(&mut logits, session.position())?;
            let flow = if step.text.is_empty() {
                Flow::Continue
            } else {
                on_text(&step.text)
            };
            let Some(next) = step.next else { break };
            if flow == Flow::Stop {
                let rest = decoder.cancel()?;
                if !rest.is_empty() {
                    on_text(&rest);
                }
                break;
            }
            logits = self.backend.forward(session, &[next], LogitsFor::Last)?;
        }
        Ok(decoder.into_completion(prefill_time, decode_started.elapsed()))
    }
}
