//! `spindle bench --batch 1,16,64`: aggregate decode speed when one forward step carries B
//! sequences ([`Backend::forward_batch`]), for each B asked for. B sessions are prefilled with
//! short prompts of their own, then timed stretches of batched greedy decode steps run, each
//! step feeding every sequence its next token. Reported per B: tokens/s over all sequences
//! and the latency of one step (what each sequence waits between its tokens). Beside it,
//! [`run_scheduled`] runs the same decode through the continuous-batching scheduler, whose
//! rate against this one is the scheduler's overhead.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use spindle_cpu::LogitsFor;
use spindle_kernels::softmax::argmax;

use crate::backend::{Backend, BackendSession, BatchItem, Draw};
use crate::batch::{BatchConfig, Scheduler};
use crate::constraint::Constraint;
use crate::error::Result;
use crate::generate::GenerateOptions;
use crate::measure::{synthetic_prompt, Stat};
use crate::model::Model;
use crate::sampling::{Penalised, SamplingParams};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BatchBenchOptions {
    /// Sequences per step, one measurement each, in this order.
    pub batch_sizes: Vec<usize>,
    /// Prompt tokens each sequence is prefilled with before decode is timed.
    pub prompt_tokens: usize,
    /// Decode steps per timed run.
    pub steps: usize,
    /// Timed runs (after a few warm-up steps).
    pub runs: usize,
}

/// Decode with `batch` sequences per step.
#[derive(Clone, Debug, Serialize)]
pub struct BatchDecode {
    pub batch: usize,
    /// Tokens generated per second over all the sequences.
    pub tokens_per_s: Stat,
    /// Milliseconds of one step (each sequence's time between tokens).
    pub step_ms: Stat,
}

/// Measures batched decode at every size in `options.batch_sizes`.
pub fn run_batch(backend: &Backend, options: &BatchBenchOptions) -> Result<Vec<BatchDecode>> {
    let vocab = backend.config().vocab_size;
    let steps = options.steps.max(1);
    let runs = options.runs.max(1);
    let mut report = Vec::new();
    for &batch in &options.batch_sizes {
        let batch = batch.max(1);
        let capacity = options.prompt_tokens + (runs + 1) * steps + 8;
        let mut sessions = Vec::with_capacity(batch);
        let mut next = Vec::with_capacity(batch);
        for b in 0..batch {
            // Each sequence its own prompt (the synthetic prompt shifted by b).
            let prompt: Vec<u32> = synthetic_prompt(vocab, options.prompt_tokens.max(1))
                .into_iter()
                .map(|id| (id + b as u32) % vocab as u32)
                .collect();
            let mut session = backend.new_session_with_capacity(capacity)?;
            let logits = backend.forward(&mut session, &prompt, LogitsFor::Last)?;
            next.push(argmax(&logits) as u32);
            sessions.push(session);
        }
        let warm_up = steps.min(4);
        for _ in 0..warm_up {
            decode_step(backend, &mut sessions, &mut next)?;
        }
        let mut speeds = Vec::with_capacity(runs);
        let mut step_ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            backend.sync()?;
            let started = Instant::now();
            for _ in 0..steps {
                decode_step(backend, &mut sessions, &mut next)?;
            }
            let seconds = started.elapsed().as_secs_f64();
            speeds.push((batch * steps) as f64 / seconds);
            step_ms.push(seconds * 1e3 / steps as f64);
        }
        let decode = BatchDecode {
            batch,
            tokens_per_s: Stat::of(speeds),
            step_ms: Stat::of(step_ms),
        };
        tracing::info!(
            batch,
            tokens_per_s = decode.tokens_per_s.median,
            "batched decode measured"
        );
        report.push(decode);
    }
    Ok(report)
}

/// One batched greedy step: every session is fed its `next` token, which is replaced by the
/// arg-max of its logits.
fn decode_step(backend: &Backend, sessions: &mut [BackendSession], next: &mut [u32]) -> Result<()> {
    let ids: Vec<[u32; 1]> = next.iter().map(|&id| [id]).collect();
    let mut items: Vec<BatchItem<'_>> = sessions
        .iter_mut()
        .zip(&ids)
        .map(|(session, id)| BatchItem {
            session,
            ids: id,
            want: LogitsFor::Last,
        })
        .collect();
    // Greedy tokens chosen where the logits are (on CUDA only the ids come back), as the
    // scheduler takes them.
    let greedy = SamplingParams::default();
    let draws: Vec<Draw<'_>> = ids
        .iter()
        .map(|_| Draw {
            params: &greedy,
            uniform: 0.0,
            penalised: Penalised::NONE,
        })
        .collect();
    let results = backend.forward_batch_sampled(&mut items, &draws);
    for (slot, id) in next.iter_mut().zip(results) {
        *slot = id?;
    }
    Ok(())
}

/// Decode through the continuous-batching scheduler with `batch` sequences at once.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduledDecode {
    pub batch: usize,
    /// `batch` over the mean time between a sequence's tokens: what the scheduler sustains
    /// with every sequence decoding (sampling, detokenizing and events included).
    pub tokens_per_s: f64,
    /// The mean time between a sequence's tokens, milliseconds.
    pub inter_token_ms: f64,
    /// Tokens generated over all sequences (a sequence ending on EOS generates fewer).
    pub generated: usize,
}

/// Runs `batch` greedy sequences of `steps` tokens each, with prompts of `prompt_tokens`
/// (all prefilled in the first step), through a [`Scheduler`] on `model`, and reports the
/// decode rate the scheduler sustained: the same work as [`run_batch`] plus what the
/// scheduler adds per token, so the two side by side show its overhead.
pub fn run_scheduled(
    model: &Arc<Model>,
    batch: usize,
    prompt_tokens: usize,
    steps: usize,
) -> Result<ScheduledDecode> {
    Ok(run_scheduled_with(model, batch, prompt_tokens, steps, None)?.0)
}

/// Constrained decoding's cost: the same scheduled decode with every sequence under
/// `constraint` (a copy each), and the time one grammar mask takes per token.
#[derive(Clone, Debug, Serialize)]
pub struct ConstrainedDecode {
    pub free: ScheduledDecode,
    pub constrained: ScheduledDecode,
    /// `constrained.tokens_per_s / free.tokens_per_s`.
    pub ratio: f64,
    /// Mean time to compute one token's mask (and advance the grammar), microseconds,
    /// replayed over the first sequence's tokens.
    pub mask_us: f64,
    /// The median of those times (the first token's mask, which builds lexer states, is
    /// the slowest).
    pub mask_median_us: f64,
}

/// [`run_scheduled`] free and under `constraint`, with the mask time per token.
pub fn run_constrained(
    model: &Arc<Model>,
    batch: usize,
    prompt_tokens: usize,
    steps: usize,
    constraint: &Constraint,
) -> Result<ConstrainedDecode> {
    let (free, _) = run_scheduled_with(model, batch, prompt_tokens, steps, None)?;
    let (constrained, ids) =
        run_scheduled_with(model, batch, prompt_tokens, steps, Some(constraint))?;
    let mut replay = constraint.clone();
    let mut spent: Vec<f64> = Vec::with_capacity(ids.len());
    for &id in &ids {
        let started = std::time::Instant::now();
        let _ = replay.mask()?;
        replay.accept(id)?;
        spent.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let mask_us = spent.iter().sum::<f64>() / spent.len().max(1) as f64;
    spent.sort_by(f64::total_cmp);
    Ok(ConstrainedDecode {
        ratio: constrained.tokens_per_s / free.tokens_per_s.max(1e-9),
        mask_us,
        mask_median_us: spent.get(spent.len() / 2).copied().unwrap_or(0.0),
        free,
        constrained,
    })
}

/// [`run_scheduled`], optionally constrained; also returns the first sequence's ids.
fn run_scheduled_with(
    model: &Arc<Model>,
    batch: usize,
    prompt_tokens: usize,
    steps: usize,
    constraint: Option<&Constraint>,
) -> Result<(ScheduledDecode, Vec<u32>)> {
    let batch = batch.max(1);
    let vocab = model.config().vocab_size;
    let scheduler = Scheduler::start(
        Arc::clone(model),
        BatchConfig {
            max_seqs: batch,
            token_budget: (batch * prompt_tokens.max(1)).max(batch),
            state_budget: None,
        },
    )?;
    let options = GenerateOptions {
        sampling: SamplingParams::default(),
        max_tokens: Some(steps.max(2)),
        constraint: constraint.cloned(),
        ..GenerateOptions::default()
    };
    let handles = (0..batch)
        .map(|b| {
            let prompt: Vec<u32> = synthetic_prompt(vocab, prompt_tokens.max(1))
                .into_iter()
                .map(|id| (id + b as u32) % vocab as u32)
                .collect();
            scheduler.submit(prompt, &options)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut generated = 0;
    let mut first = None;
    for handle in handles {
        let ids = handle.wait()?.ids;
        generated += ids.len();
        first.get_or_insert(ids);
    }
    let itl = scheduler.stats().inter_token_latency.snapshot();
    // No gap at all (every sequence ended on its first token) reads as 0, not infinity.
    let mean = itl.sum / itl.count.max(1) as f64;
    Ok((
        ScheduledDecode {
            batch,
            tokens_per_s: if mean > 0.0 { batch as f64 / mean } else { 0.0 },
            inter_token_ms: mean * 1e3,
            generated,
        },
        first.unwrap_or_default(),
    ))
}
