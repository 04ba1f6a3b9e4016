//! A generation in the continuous-batching scheduler ([`spindle_runtime::batch`]): the
//! request's prompt is submitted with the slot its request holds, and the scheduler's engine
//! thread runs it with every other request in the same batched steps. Text deltas and the
//! final result flow back over a channel. Dropping the [`Generation`] (the client
//! disconnected, or the handler was dropped) cancels the sequence: the engine frees its state
//! before its next step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_runtime::batch::{SeqEvent, SequenceGuard};
use spindle_runtime::images::TokenPrompt;
use spindle_runtime::{Completion, Finish, Flow, GenerateOptions, RuntimeError, TokenLogprob};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::latency::{current_origin, RequestOrigin};
use crate::metrics::Metrics;
use crate::queue::Slot;
use crate::state::AppState;

/// What a running generation reports.
#[derive(Debug)]
pub enum GenEvent {
    /// Visible text, in order.
    Text(String),
    /// The log-probabilities of the tokens behind the next `Text` (only when asked for).
    Logprobs(Vec<TokenLogprob>),
    /// The end: the completion, or why generation failed.
    Done(Result<Completion, RuntimeError>),
}

/// A generation's events, of one choice or of `n` (each event tagged with its choice);
/// dropping it cancels every choice.
pub struct Generation {
    events: UnboundedReceiver<(usize, GenEvent)>,
    choices: usize,
    _guards: Vec<SequenceGuard>,
}

impl Generation {
    /// The next event of any choice; `None` once every choice has ended and every event was
    /// read.
    #[allow(dead_code)] // for endpoints of one choice
    pub async fn recv(&mut self) -> Option<GenEvent> {
        self.events.recv().await.map(|(_, event)| event)
    }

    /// [`Generation::recv`] with the choice the event belongs to.
    pub async fn recv_choice(&mut self) -> Option<(usize, GenEvent)> {
        self.events.recv().await
    }

    /// How many choices run.
    pub fn choices(&self) -> usize {
        self.choices
    }
}

/// Submits `prompt_ids` to the scheduler with `slot` (released when the generation ends,
/// before its end is reported) and returns its events.
#[allow(dead_code)] // for endpoints of one choice
pub fn spawn_generation(
    state: &Arc<AppState>,
    slot: Slot,
    prompt: TokenPrompt,
    options: GenerateOptions,
) -> Generation {
    spawn_choices(state, slot, prompt, vec![options])
}

/// Submits one sequence per entry of `choices` (`n` > 1), all at once so the scheduler runs
/// them in the same steps; `slot` is released when the last one ends.
pub fn spawn_choices(
    state: &Arc<AppState>,
    slot: Slot,
    prompt: TokenPrompt,
    choices: Vec<GenerateOptions>,
) -> Generation {
    let (tx, events) = unbounded_channel();
    let n = choices.len();
    if state.cancel_all.load(Ordering::Acquire) {
        drop(slot);
        for index in 0..n {
            let _ = tx.send((index, GenEvent::Done(Ok(cancelled(prompt.ids.len())))));
        }
        return Generation {
            events,
            choices: n,
            _guards: Vec::new(),
        };
    }
    tracing::debug!(
        prompt = prompt.ids.len(),
        choices = n,
        "submitting a request"
    );
    let slot = Arc::new(Mutex::new((Some(slot), n)));
    // The request's API and arrival, taken by the first choice to generate text.
    let origin = Arc::new(Mutex::new(current_origin()));
    let mut guards = Vec::with_capacity(n);
    for (index, options) in choices.into_iter().enumerate() {
        let sink = forward_events(
            index,
            tx.clone(),
            Arc::clone(&slot),
            Arc::clone(&state.metrics),
            Arc::clone(&state.cancel_all),
            Arc::clone(&origin),
        );
        match state.engine.submit_with(prompt.clone(), &options, sink) {
            Ok(guard) => guards.push(guard),
            Err(e) => {
                release(&slot);
                let _ = tx.send((index, GenEvent::Done(Err(e))));
            }
        }
    }
    Generation {
        events,
        choices: n,
        _guards: guards,
    }
}

/// Counts one choice ended; the last frees the slot.
fn release(slot: &Mutex<(Option<Slot>, usize)>) {
    let mut shared = slot.lock().unwrap_or_else(|e| e.into_inner());
    shared.1 = shared.1.saturating_sub(1);
    if shared.1 == 0 {
        drop(shared.0.take());
    }
}

/// The sink the engine thread calls with one choice's events: text goes to the client
/// (stopping the sequence when the client is gone or the server stops); at the end the slot
/// is freed (after the request's last choice) and the generation counted before the client
/// hears of it, so a client that reads the answer and then the metrics sees the slot free.
/// The request's first text (of any choice) records its time to first token by API.
fn forward_events(
    index: usize,
    tx: UnboundedSender<(usize, GenEvent)>,
    slot: Arc<Mutex<(Option<Slot>, usize)>>,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
    origin: Arc<Mutex<Option<RequestOrigin>>>,
) -> Box<dyn FnMut(SeqEvent) -> Flow + Send> {
    let mut ended = false;
    Box::new(move |event| match event {
        SeqEvent::Text(text) => {
            let first = origin.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(origin) = first {
                metrics.record_first_token(origin.api, origin.arrived.elapsed());
            }
            let gone = tx.send((index, GenEvent::Text(text))).is_err();
            if gone || cancel_all.load(Ordering::Acquire) {
                Flow::Stop
            } else {
                Flow::Continue
            }
        }
        SeqEvent::Logprobs(logprobs) => {
            let _ = tx.send((index, GenEvent::Logprobs(logprobs)));
            Flow::Continue
        }
        SeqEvent::Done(result) => {
            if !std::mem::replace(&mut ended, true) {
                release(&slot);
            }
            if let Ok(completion) = &result {
                metrics.record_generation(completion);
            }
            let _ = tx.send((index, GenEvent::Done(result)));
            Flow::Stop
        }
    })
}

/// The completion of a generation cancelled before it started.
fn cancelled(prompt_tokens: usize) -> Completion {
    Completion {
        text: String::new(),
        ids: Vec::new(),
        finish: Finish::Cancelled,
        prompt_tokens,
        cached_tokens: 0,
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
        logprobs: Vec::new(),
    }
}

/// Waits for the end of a generation, ignoring the streamed text (non-streaming answers).
#[allow(dead_code)] // for endpoints of one choice
pub async fn wait_for_completion(generation: Generation) -> Result<Completion, RuntimeError> {
    let mut all = wait_for_choices(generation).await?;
    Ok(all.swap_remove(0))
}

/// Waits for every choice's end, in choice order; the first failure fails the whole.
pub async fn wait_for_choices(mut generation: Generation) -> Result<Vec<Completion>, RuntimeError> {
    let mut done: Vec<Option<Completion>> = (0..generation.choices).map(|_| None).collect();
    while let Some((index, event)) = generation.recv_choice().await {
        if let GenEvent::Done(result) = event {
            done[index] = Some(result?);
            if done.iter().all(Option::is_some) {
                return Ok(done.into_iter().flatten().collect());
            }
        }
    }
    Err(RuntimeError::Request(
        "the generation ended without a result".into(),
    ))
}
