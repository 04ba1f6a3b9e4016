//! A generation in the continuous-batching scheduler ([`spindle_runtime::batch`]): the
//! request's prompt is submitted with the slot its request holds, and the scheduler's engine
//! thread runs it with every other request in the same batched steps. Text deltas and the
//! final result flow back over a channel. Dropping the [`Generation`] (the client
//! disconnected, or the handler was dropped) cancels the sequence: the engine frees its state
//! before its next step.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spindle_runtime::batch::{SeqEvent, SequenceGuard};
use spindle_runtime::{Completion, Finish, Flow, GenerateOptions, RuntimeError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::metrics::Metrics;
use crate::queue::Slot;
use crate::state::AppState;

/// What a running generation reports.
#[derive(Debug)]
pub enum GenEvent {
    /// Visible text, in order.
    Text(String),
    /// The end: the completion, or why generation failed.
    Done(Result<Completion, RuntimeError>),
}

/// A generation's events; dropping it cancels the generation.
pub struct Generation {
    events: UnboundedReceiver<GenEvent>,
    _guard: Option<SequenceGuard>,
}

impl Generation {
    /// The next event; `None` once the generation has ended and every event was read.
    pub async fn recv(&mut self) -> Option<GenEvent> {
        self.events.recv().await
    }
}

/// Submits `prompt_ids` to the scheduler with `slot` (released when the generation ends,
/// before its end is reported) and returns its events.
pub fn spawn_generation(
    state: &Arc<AppState>,
    slot: Slot,
    prompt_ids: Vec<u32>,
    options: GenerateOptions,
) -> Generation {
    let (tx, events) = unbounded_channel();
    if state.cancel_all.load(Ordering::Acquire) {
        drop(slot);
        let _ = tx.send(GenEvent::Done(Ok(cancelled(prompt_ids.len()))));
        return Generation {
            events,
            _guard: None,
        };
    }
    let sink = forward_events(
        tx.clone(),
        slot,
        Arc::clone(&state.metrics),
        Arc::clone(&state.cancel_all),
    );
    match state.engine.submit_with(prompt_ids, &options, sink) {
        Ok(guard) => Generation {
            events,
            _guard: Some(guard),
        },
        Err(e) => {
            let _ = tx.send(GenEvent::Done(Err(e)));
            Generation {
                events,
                _guard: None,
            }
        }
    }
}

/// The sink the engine thread calls with the sequence's events: text goes to the client
/// (stopping the sequence when the client is gone or the server stops); at the end the slot
/// is freed and the generation counted before the client hears of it, so a client that reads
/// the answer and then the metrics sees the slot free.
fn forward_events(
    tx: UnboundedSender<GenEvent>,
    slot: Slot,
    metrics: Arc<Metrics>,
    cancel_all: Arc<AtomicBool>,
) -> Box<dyn FnMut(SeqEvent) -> Flow + Send> {
    let mut slot = Some(slot);
    Box::new(move |event| match event {
        SeqEvent::Text(text) => {
            let gone = tx.send(GenEvent::Text(text)).is_err();
            if gone || cancel_all.load(Ordering::Acquire) {
                Flow::Stop
            } else {
                Flow::Continue
            }
        }
        SeqEvent::Done(result) => {
            drop(slot.take());
            if let Ok(completion) = &result {
                metrics.record_generation(completion);
            }
            let _ = tx.send(GenEvent::Done(result));
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
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
        logprobs: Vec::new(),
    }
}

/// Waits for the end of a generation, ignoring the streamed text (non-streaming answers).
pub async fn wait_for_completion(mut generation: Generation) -> Result<Completion, RuntimeError> {
    while let Some(event) = generation.recv().await {
        if let GenEvent::Done(result) = event {
            return result;
        }
    }
    Err(RuntimeError::Request(
        "the generation ended without a result".into(),
    ))
}
