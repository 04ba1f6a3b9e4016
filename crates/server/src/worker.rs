//! Running one generation in the slot its request holds, on a blocking thread, never on the
//! async executor. Text deltas and the final
//! result flow back over a channel; when the receiver is dropped (the client disconnected or
//! the handler was dropped) the next delta stops generation and frees the slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use spindle_runtime::{Completion, Finish, Flow, GenerateOptions, RuntimeError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

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

/// Starts a generation of `prompt_ids` in `slot` and returns the channel its events arrive on.
pub fn spawn_generation(
    state: &Arc<AppState>,
    slot: Slot,
    prompt_ids: Vec<u32>,
    options: GenerateOptions,
) -> UnboundedReceiver<GenEvent> {
    let (tx, rx) = unbounded_channel();
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let worker = tokio::task::spawn_blocking(move || {
            let cancel_all = &state.cancel_all;
            let result = if cancel_all.load(Ordering::Acquire) {
                Ok(cancelled(prompt_ids.len()))
            } else {
                state.model.new_session().and_then(|mut session| {
                    state
                        .model
                        .generate(&mut session, &prompt_ids, &options, &mut |delta| {
                            let gone = tx.send(GenEvent::Text(delta.to_owned())).is_err();
                            if gone || cancel_all.load(Ordering::Acquire) {
                                Flow::Stop
                            } else {
                                Flow::Continue
                            }
                        })
                })
            };
            // Free the slot before answering, so a client that reads the answer and then
            // the metrics sees it free.
            drop(slot);
            if let Ok(completion) = &result {
                state.metrics.record_generation(completion);
            }
            let _ = tx.send(GenEvent::Done(result));
        });
        if let Err(e) = worker.await {
            tracing::error!("a generation thread failed: {e}");
        }
    });
    rx
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
    }
}

/// Waits for the end of a generation, ignoring the streamed text (non-streaming answers).
pub async fn wait_for_completion(
    mut events: UnboundedReceiver<GenEvent>,
) -> Result<Completion, RuntimeError> {
    while let Some(event) = events.recv().await {
        if let GenEvent::Done(result) = event {
            return result;
        }
    }
    Err(RuntimeError::Request(
        "the generation thread ended without a result".into(),
    ))
}
