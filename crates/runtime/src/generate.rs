//! The decode loop: prefill the prompt, then sample, detokenize and check stop conditions one
//! token at a time, streaming text to the caller, who may stop it at any step. The per-token
//! half of it is [`SequenceDecoder`], which the continuous-batching scheduler runs for each of
//! its sequences: one code path for a token, alone or in a batch.

use std::time::{Duration, Instant};

use spindle_cpu::LogitsFor;
use spindle_text::{FinishReason, StopConditions, TextStream};

use crate::backend::{BackendSession, Draw};
use crate::constraint::{Constraint, TokenMask};
use crate::error::{Result, RuntimeError};
use crate::images::TokenPrompt;
use crate::model::Model;
use crate::sampling::{Penalised, Sampler, SamplingParams};

/// How to generate. Everything past `stop` is the logits-processing step between the forward
/// pass and the sampler ([`SequenceDecoder::step`]). The grammar and the bans before
/// `min_tokens` become a token mask the sampler applies where the logits are
/// ([`SequenceDecoder::draw_masked`]); `logit_bias` and `logprobs` need the whole row on the
/// host ([`SequenceDecoder::needs_logits`]).
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    /// The most tokens to generate; `None` runs to EOS or the end of the context.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Added to the logits of these ids before sampling (OpenAI's `logit_bias`; -100 bans a
    /// token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Ids that end generation like EOS (not shown in the text; the finish is [`Finish::Eos`]).
    pub stop_token_ids: Vec<u32>,
    /// EOS and `stop_token_ids` are banned, and stop strings not matched, until this many
    /// tokens are generated (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// The model's EOS ids do not end generation (they are generated as ordinary tokens).
    pub ignore_eos: bool,
    /// Structured output: only tokens the grammar allows are sampled
    /// ([`crate::Model::constraint`] compiles one).
    pub constraint: Option<Constraint>,
    /// Record each generated token's log-probability, with this many of the most likely
    /// alternatives (0 to 20), in [`Completion::logprobs`].
    pub logprobs: Option<usize>,
    /// Ids never sampled (a mask on every step, where the logits are): e.g. the tool-call
    /// opener when the request's `tool_choice` is `none`.
    pub banned_ids: Vec<u32>,
    /// A cap on the tokens of each reasoning block.
    pub reasoning_budget: Option<ReasoningBudget>,
}

/// A cap on the tokens of a reasoning block (`<think>` ... `</think>`): once a block holds
/// `tokens` tokens, its closing token is the only one allowed (Anthropic's `budget_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningBudget {
    pub tokens: usize,
    pub open: u32,
    pub close: u32,
    /// The prompt ends inside a reasoning block (the chat template opened it).
    pub starts_inside: bool,
}

/// The log-probability of one generated token under the model (log-softmax of its raw logits,
/// before penalties, temperature, biases and masks, as vLLM and OpenAI report them), with the
/// most likely ids at that step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The most likely ids with theirs, most likely first (ties to the lower id).
    pub top: Vec<(u32, f32)>,
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
    /// One entry per generated id when [`GenerateOptions::logprobs`] asked for them.
    pub logprobs: Vec<TokenLogprob>,
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
    /// The logits-processing step: bias, bans until `min_tokens`, the grammar.
    logit_bias: Vec<(u32, f32)>,
    /// Ids banned before `min_tokens` (EOS and stop token ids).
    enders: Vec<u32>,
    /// [`GenerateOptions::banned_ids`].
    banned: Vec<u32>,
    budget: Option<ReasoningBudget>,
    /// Tokens of the reasoning block the sequence is in (`None` outside one).
    reasoning: Option<usize>,
    min_tokens: usize,
    constraint: Option<Constraint>,
    /// The mask for the next token, computed ahead ([`SequenceDecoder::prepare`]).
    mask: Option<TokenMask>,
    /// Why the grammar could not give the mask of the token sampled last on the device
    /// ([`SequenceMask::compute`]): reported by the next [`SequenceDecoder::accept`].
    mask_failed: Option<RuntimeError>,
    /// Logits per row (`vocab_size`): the length of a mask.
    vocab: usize,
    logprobs: Option<usize>,
    token_logprobs: Vec<TokenLogprob>,
    /// Logprobs of tokens not yet reported by [`SequenceDecoder::take_logprobs`].
    reported: usize,
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
        let vocab = model.config().vocab_size;
        let ids_in_vocab =
            |field: &str, ids: Vec<u32>| match ids.into_iter().find(|&id| id as usize >= vocab) {
                Some(id) => Err(RuntimeError::Request(format!(
                    "{field}: token id {id} is outside the vocabulary of {vocab}"
                ))),
                None => Ok(()),
            };
        ids_in_vocab(
            "logit_bias",
            options.logit_bias.iter().map(|b| b.0).collect(),
        )?;
        ids_in_vocab("stop_token_ids", options.stop_token_ids.clone())?;
        if options.logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
            return Err(RuntimeError::Request(format!(
                "top_logprobs: at most {MAX_TOP_LOGPROBS} alternatives are reported"
            )));
        }
        let mut eos_ids = if options.ignore_eos {
            Vec::new()
        } else {
            model.eos_ids.clone()
        };
        for &id in &options.stop_token_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let conditions = StopConditions {
            eos_ids: eos_ids.clone(),
            stop_strings: options.stop.clone(),
            max_tokens: options.max_tokens,
        };
        Ok(Self {
            sampler,
            stream: TextStream::new(model.tokenizer.clone(), &conditions)
                .with_min_tokens(options.min_tokens),
            history: prompt_ids.to_vec(),
            text: String::new(),
            ids: Vec::new(),
            prompt_tokens: prompt_ids.len(),
            max_tokens: options.max_tokens,
            limit,
            finish: None,
            logit_bias: options.logit_bias.clone(),
            enders: eos_ids,
            banned: options.banned_ids.clone(),
            budget: options.reasoning_budget,
            reasoning: options
                .reasoning_budget
                .filter(|b| b.starts_inside)
                .map(|_| 0),
            min_tokens: options.min_tokens,
            constraint: options.constraint.clone(),
            mask: None,
            mask_failed: None,
            vocab,
            logprobs: options.logprobs,
            token_logprobs: Vec::new(),
            reported: 0,
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
        let logprobs = self.logprobs.map(|k| Logprobs::of(logits, k));
        self.process(logits)?;
        let penalised = Penalised::within(
            self.sampler.params().penalty_window,
            &self.history,
            self.prompt_tokens,
        );
        let id = self.sampler.sample(logits, penalised);
        if let Some(lp) = logprobs {
            self.token_logprobs.push(lp.entry(id));
        }
        self.accept(id, position)
    }

    /// Whether this sequence's tokens must be sampled from its logits row on the host
    /// ([`SequenceDecoder::step`]): it has a `logit_bias` or reports log-probabilities. Every
    /// other sequence, grammar and `min_tokens` included, samples where the logits are
    /// ([`SequenceDecoder::draw_masked`]).
    pub fn needs_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.logprobs.is_some()
    }

    /// Computes the grammar's mask for the next token now, so that it can run while the
    /// forward pass does (the batch scheduler calls it on a worker thread during the step);
    /// [`SequenceDecoder::step`] computes it itself otherwise.
    pub fn prepare(&mut self) -> Result<()> {
        if self.mask.is_none() && self.wants_token() {
            if let Some(constraint) = &mut self.constraint {
                self.mask = constraint.mask()?;
            }
        }
        Ok(())
    }

    /// Whether [`SequenceDecoder::prepare`] has work to do (a grammar to advance).
    pub fn has_constraint(&self) -> bool {
        self.constraint.is_some()
    }

    /// The logits-processing step, in vLLM's order: the grammar's mask, then the bans before
    /// `min_tokens`, then `logit_bias` (the sampler's penalties and filters follow).
    fn process(&mut self, logits: &mut [f32]) -> Result<()> {
        self.prepare()?;
        let mask = self.mask.take();
        if let Some(mask) = &mask {
            mask.apply(logits);
        }
        // A complete grammar may only end: the bans must not leave nothing to sample.
        let grammar_done = mask.as_ref().is_some_and(TokenMask::only_eos);
        let enders = if self.ids.len() < self.min_tokens && !grammar_done {
            &self.enders[..]
        } else {
            &[]
        };
        for &id in enders.iter().chain(&self.banned) {
            if let Some(logit) = logits.get_mut(id as usize) {
                *logit = f32::NEG_INFINITY;
            }
        }
        if let Some(close) = self.forced_close() {
            for (id, logit) in logits.iter_mut().enumerate() {
                if id != close as usize {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        for &(id, bias) in &self.logit_bias {
            if let Some(logit) = logits.get_mut(id as usize) {
                // A banned token stays banned.
                if mask.as_ref().is_none_or(|m| m.allows(id)) {
                    *logit += bias;
                }
            }
        }
        Ok(())
    }

    /// The log-probabilities of tokens generated since the last call (streaming reports them
    /// with the text they produced).
    pub fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        let fresh = self.token_logprobs[self.reported..].to_vec();
        self.reported = self.token_logprobs.len();
        fresh
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
        let params = self.sampler.params();
        Some(Draw {
            params,
            uniform,
            penalised: Penalised::of(params, &self.history, self.prompt_tokens),
        })
    }

    /// [`SequenceDecoder::draw`] with the token mask of this step: the draw, and what computes
    /// the mask (the grammar's allowed tokens, less EOS and the stop token ids before
    /// `min_tokens`), which the caller runs while the forward pass does (a grammar mask takes
    /// tens of microseconds to milliseconds). The sampler applies it before everything else
    /// ([`apply_mask_words`]); with it, the draw and [`SequenceDecoder::accept`] pick what
    /// [`SequenceDecoder::step`] picks for a sequence without `logit_bias` and `logprobs`
    /// ([`SequenceDecoder::needs_logits`]). `None` when the sequence will not sample.
    pub fn draw_masked(&mut self) -> Option<(Draw<'_>, SequenceMask<'_>)> {
        if !self.wants_token() {
            return None;
        }
        let uniform = self.sampler.next_uniform().unwrap_or(0.0);
        let only = self.forced_close();
        let mask = SequenceMask {
            constraint: self.constraint.as_mut(),
            ready: self.mask.take(),
            enders: if self.ids.len() < self.min_tokens {
                &self.enders
            } else {
                &[]
            },
            banned: &self.banned,
            only,
            vocab: self.vocab,
            failed: &mut self.mask_failed,
        };
        let params = self.sampler.params();
        let draw = Draw {
            params,
            uniform,
            penalised: Penalised::of(params, &self.history, self.prompt_tokens),
        };
        Some((draw, mask))
    }

    /// [`SequenceDecoder::step`] for a token already chosen (by a device sampler given
    /// [`SequenceDecoder::draw`] or [`SequenceDecoder::draw_masked`]): detokenizes it and
    /// checks the stop conditions. When the grammar failed to give that step's mask, the
    /// failure is the error here.
    pub fn accept(&mut self, id: u32, position: usize) -> Result<TokenStep> {
        if let Some(e) = self.mask_failed.take() {
            return Err(e);
        }
        if !self.wants_token() {
            return Ok(self.ended());
        }
        if let Some(constraint) = &mut self.constraint {
            constraint.accept(id)?;
            // The next mask is computed for the state after this token.
            self.mask = None;
        }
        self.ids.push(id);
        self.history.push(id);
        if let Some(budget) = self.budget {
            self.reasoning = if id == budget.close {
                None
            } else if id == budget.open {
                Some(0)
            } else {
                self.reasoning.map(|n| n + 1)
            };
        }
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

    /// The closing token of a reasoning block that has spent its budget: the only token the
    /// next step may take.
    fn forced_close(&self) -> Option<u32> {
        let budget = self.budget?;
        (self.reasoning? >= budget.tokens).then_some(budget.close)
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
            logprobs: self.token_logprobs,
        }
    }
}

/// One step's token mask of one sequence, computed when the caller is ready
/// ([`SequenceDecoder::draw_masked`]): while the forward pass runs, on another thread.
pub struct SequenceMask<'a> {
    constraint: Option<&'a mut Constraint>,
    /// The grammar's mask when it was computed ahead ([`SequenceDecoder::prepare`]).
    ready: Option<TokenMask>,
    /// Ids banned at this step (EOS and stop token ids before `min_tokens`).
    enders: &'a [u32],
    /// Ids banned at every step ([`GenerateOptions::banned_ids`]).
    banned: &'a [u32],
    /// The one id allowed at this step (a reasoning block's close, its budget spent).
    only: Option<u32>,
    vocab: usize,
    failed: &'a mut Option<RuntimeError>,
}

impl SequenceMask<'_> {
    /// Whether the step has a mask at all (a grammar, or bans before `min_tokens`); one that
    /// has none costs nothing.
    pub fn is_needed(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.active())
            || !self.enders.is_empty()
            || !self.banned.is_empty()
            || self.only.is_some()
    }

    /// The allowed ids as bits (`vocab.div_ceil(32)` words, bit `id % 32` of word `id / 32`),
    /// or `None` when every id is allowed. The grammar's mask comes first; EOS and the stop
    /// token ids are then banned before `min_tokens`, unless the grammar is complete (it may
    /// only end). A grammar that fails gives an empty mask, and the sequence's next
    /// [`SequenceDecoder::accept`] reports the failure.
    pub fn compute(self) -> Option<Vec<u32>> {
        let words = self.vocab.div_ceil(32);
        if let Some(id) = self.only {
            let mut bits = vec![0u32; words];
            if let Some(word) = bits.get_mut(id as usize / 32) {
                *word |= 1 << (id % 32);
            }
            return Some(bits);
        }
        let grammar = match self.ready {
            Some(mask) => Some(mask),
            None => match self.constraint {
                Some(constraint) => match constraint.mask() {
                    Ok(mask) => mask,
                    Err(e) => {
                        *self.failed = Some(e);
                        return Some(vec![0; words]);
                    }
                },
                None => None,
            },
        };
        let grammar_done = grammar.as_ref().is_some_and(TokenMask::only_eos);
        let enders = if grammar_done { &[][..] } else { self.enders };
        if grammar.is_none() && enders.is_empty() && self.banned.is_empty() {
            return None;
        }
        let mut bits = match &grammar {
            Some(mask) => mask.words(words),
            None => vec![u32::MAX; words],
        };
        for &id in enders.iter().chain(self.banned) {
            if let Some(word) = bits.get_mut(id as usize / 32) {
                *word &= !(1u32 << (id % 32));
            }
        }
        Some(bits)
    }
}

pub use crate::constraint::apply_mask_words;

/// The most alternatives a token's log-probability is reported with (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One step's log-softmax over the raw logits, enough to report any id's log-probability and
/// the `k` most likely.
struct Logprobs {
    /// `max + ln(sum(exp(l - max)))`: an id's log-probability is its logit less this.
    log_total: f32,
    top: Vec<(u32, f32)>,
    /// The raw logits of every id (kept to look up the chosen one).
    chosen_from: Vec<f32>,
}

impl Logprobs {
    fn of(logits: &[f32], k: usize) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| f64::from(l - max).exp())
            .sum();
        let log_total = max + total.ln() as f32;
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
        if k > 0 {
            let mut order: Vec<u32> = (0..logits.len() as u32)
                .filter(|&i| !logits[i as usize].is_nan())
                .collect();
            let by_logit = |a: &u32, b: &u32| {
                logits[*b as usize]
                    .total_cmp(&logits[*a as usize])
                    .then(a.cmp(b))
            };
            if k < order.len() {
                order.select_nth_unstable_by(k - 1, by_logit);
                order.truncate(k);
            }
            order.sort_unstable_by(by_logit);
            top = order
                .into_iter()
                .map(|i| (i, logits[i as usize] - log_total))
                .collect();
        }
        Self {
            log_total,
            top,
            chosen_from: logits.to_vec(),
        }
    }

    fn entry(self, id: u32) -> TokenLogprob {
        let logit = self
            .chosen_from
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        TokenLogprob {
            id,
            logprob: logit - self.log_total,
            top: self.top,
        }
    }
}

impl Model {
    /// The log-probability of every prompt token after the first under the model (what
    /// `echo` with `logprobs` reports), with `k` alternatives each, from a fresh session fed
    /// the prompt in chunks (so at most a chunk's rows of logits are held at once).
    pub fn prompt_logprobs(&self, prompt_ids: &[u32], k: usize) -> Result<Vec<TokenLogprob>> {
        const CHUNK: usize = 32;
        let vocab = self.config().vocab_size;
        let mut session = self.new_session()?;
        let mut out = Vec::with_capacity(prompt_ids.len().saturating_sub(1));
        for (c, chunk) in prompt_ids.chunks(CHUNK).enumerate() {
            let rows = self.backend.forward(&mut session, chunk, LogitsFor::All)?;
            for (r, row) in rows.chunks(vocab).enumerate() {
                let next = c * CHUNK + r + 1;
                if let Some(&id) = prompt_ids.get(next) {
                    out.push(Logprobs::of(row, k).entry(id));
                }
            }
        }
        Ok(out)
    }

    /// Checks `prompt`'s image pads against its images, runs the images through the vision
    /// tower and queues their features on `session`, so that feeding `prompt.ids` next places
    /// them (a no-op for a prompt without images). Refused by name: pads without images or
    /// the reverse, a model or backend without a vision tower.
    pub fn attach_images(&self, session: &mut BackendSession, prompt: &TokenPrompt) -> Result<()> {
        self.backend.check_images(&prompt.ids, &prompt.images)?;
        if prompt.images.is_empty() {
            return Ok(());
        }
        let features = self.backend.encode_images(&prompt.images)?;
        self.backend.attach_images(session, &features)
    }

    /// [`Model::generate`] for a prompt that may hold images: [`Model::attach_images`], then
    /// the ids are fed and generation runs as for any prompt.
    pub fn generate_prompt(
        &self,
        session: &mut BackendSession,
        prompt: &TokenPrompt,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str) -> Flow,
    ) -> Result<Completion> {
        self.attach_images(session, prompt)?;
        self.generate(session, &prompt.ids, options, on_text)
    }

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
        if session.pending_images() == 0 {
            // Pads with no image queued ([`Model::attach_images`]) are refused by name.
            self.backend.check_images(prompt_ids, &[])?;
        }
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
