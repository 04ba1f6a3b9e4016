//! The engine thread: admission (FIFO, at most `max_seqs` with a session), the step loop,
//! cancellation, and the handles callers hold.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use spindle_cpu::LogitsFor;

use super::plan::{plan_step, Work};
use super::stats::SchedulerStats;
use crate::backend::{Backend, BackendSession, BatchItem, Pick, Picked, StepMasks};
use crate::error::{Result, RuntimeError};
use crate::generate::{
    Completion, Flow, GenerateOptions, SequenceDecoder, SequenceMask, TokenLogprob,
};
use crate::images::TokenPrompt;
use crate::model::Model;
use crate::prefix::{snapshot_points, PrefixCache, PrefixCacheConfig};
use spindle_model::mrope::ImageFeatures;
use spindle_vision::PreparedImage;

/// How the scheduler batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Sequences with a session at once; more submitted ones wait, first come first served.
    pub max_seqs: usize,
    /// Tokens one step feeds at most (decode tokens plus prompt chunks); at least `max_seqs`,
    /// so every decoding sequence gets its token each step.
    pub token_budget: usize,
    /// Bytes of sequence state (KV caches, GDN and PLE state, as
    /// `spindle_model::install::plan::state_bytes` counts them) the running sequences may
    /// hold at once. A sequence is admitted only when its prompt's state fits beside the
    /// others'; when the running sequences grow past it, the one admitted last is preempted
    /// (its state freed, it waits at the front of the queue and later recomputes its prompt
    /// and what it generated) until the rest fit. A sequence alone always runs. `None`: no
    /// limit beyond the backend's own memory.
    pub state_budget: Option<u64>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_seqs: 16,
            token_budget: 1024,
            state_budget: None,
        }
    }
}

impl BatchConfig {
    fn validate(&self) -> Result<()> {
        if self.max_seqs == 0 {
            return Err(RuntimeError::Request(
                "max_seqs is 0 but at least one sequence must be able to run".into(),
            ));
        }
        if self.token_budget < self.max_seqs {
            return Err(RuntimeError::Request(format!(
                "token_budget {} is below max_seqs {}: every running sequence needs a token per step",
                self.token_budget, self.max_seqs
            )));
        }
        Ok(())
    }
}

/// What a sequence reports, in order: visible text deltas, then exactly one `Done`.
#[derive(Debug)]
pub enum SeqEvent {
    Text(String),
    /// The log-probabilities of the tokens generated since the last `Text`, sent just before
    /// it (only for a sequence that asked for them: [`GenerateOptions::logprobs`]).
    Logprobs(Vec<TokenLogprob>),
    /// The completion (with `Finish::Cancelled` when it was cancelled), or why it failed.
    Done(Result<Completion>),
}

/// Receives a sequence's events on the engine thread. Answering [`Flow::Stop`] to a text
/// event cancels the sequence.
pub type EventSink = Box<dyn FnMut(SeqEvent) -> Flow + Send>;

enum Command {
    Submit(Box<Request>),
    /// Something changed (a cancel flag): look before sleeping again.
    Wake,
    CancelAll,
    /// Empties the prefix cache, then answers.
    ClearPrefixCache(Sender<()>),
    Shutdown,
}

/// A submitted sequence without a session yet.
struct Request {
    /// The ids to prefill: the prompt, and after a preemption also what was generated.
    prompt: Vec<u32>,
    /// The images of the prompt's pads, as submitted (encoded at the first admission).
    images: Vec<PreparedImage>,
    /// Their features, kept until the sequence ends (a recompute after a preemption feeds
    /// them again).
    features: Option<Vec<Arc<ImageFeatures>>>,
    /// The index of the first image pad: a prefix cache keyed by ids never restores or
    /// captures state past it (every image's pads have the same id).
    first_image_pad: Option<usize>,
    /// When its last token was sampled, kept across a preemption (so the first token after
    /// it counts as an inter-token gap, not a second first token).
    last_token: Option<Instant>,
    decoder: SequenceDecoder,
    sink: EventSink,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
    /// Prompt tokens restored from the prefix cache at its first admission (what its usage
    /// reports; a recompute after a preemption does not change it).
    cached: Option<usize>,
}

impl Request {
    /// The most prompt tokens a cached prefix may cover for this request: all of them, or for a
    /// prompt with images only those before the first image pad.
    fn cache_limit(&self) -> usize {
        self.first_image_pad.unwrap_or(usize::MAX)
    }

    /// Whether a session holding this request's first `tokens` tokens may be cached.
    fn cacheable(&self, tokens: usize) -> bool {
        tokens <= self.cache_limit()
    }
}

/// Answer tokens whose state a new sequence is given room for at admission when its request
/// sets no `max_tokens` (past it, its state grows as it decodes).
const RESERVED_ANSWER_TOKENS: usize = 1024;

/// A sequence with a session, being prefilled or decoded.
struct Sequence {
    request: Request,
    session: BackendSession,
    /// Prompt tokens fed so far.
    fed: usize,
    /// The token to feed next once the prompt is in.
    next: [u32; 1],
    prefill_started: Option<Instant>,
    prefill_time: Duration,
    /// When the last token was sampled (the first marks the end of the prefill).
    last_token: Option<Instant>,
    /// Prompt positions still ahead where the prefill stops for a prefix-cache snapshot,
    /// ascending (empty without a cache).
    snapshots: VecDeque<usize>,
    /// Tokens fed after the prompt (the session holds the prompt, then these).
    decoded: Vec<u32>,
}

impl Sequence {
    /// What the next step may feed: a prefill stops at the next snapshot point.
    fn work_until_snapshot(&self) -> Work {
        match (self.work(), self.snapshots.front()) {
            (Work::Prefill { remaining }, Some(&stop)) => Work::Prefill {
                remaining: remaining.min(stop - self.fed),
            },
            (work, _) => work,
        }
    }

    /// Tokens in the sequence's state after its next step (a prefilling sequence counted with
    /// its whole prompt).
    fn tokens_after_step(&self) -> usize {
        match self.work() {
            Work::Decode => self.session.position() + 1,
            Work::Prefill { .. } => self.request.prompt.len(),
        }
    }

    fn work(&self) -> Work {
        match self.request.prompt.len() - self.fed {
            0 => Work::Decode,
            remaining => Work::Prefill { remaining },
        }
    }
}

/// Cancels its sequence when dropped (or on [`SequenceGuard::cancel`]): the engine frees the
/// sequence's session before its next step.
pub struct SequenceGuard {
    cancel: Arc<AtomicBool>,
    wake: Sender<Command>,
}

impl SequenceGuard {
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
        let _ = self.wake.send(Command::Wake);
    }
}

impl Drop for SequenceGuard {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// A submitted sequence's events on a channel; dropping it cancels the sequence.
pub struct SequenceHandle {
    events: Receiver<SeqEvent>,
    guard: SequenceGuard,
}

impl SequenceHandle {
    /// The next event, blocking; `None` after `Done` was received.
    pub fn recv(&self) -> Option<SeqEvent> {
        self.events.recv().ok()
    }

    pub fn cancel(&self) {
        self.guard.cancel();
    }

    /// Waits for the end, collecting nothing but the completion.
    pub fn wait(self) -> Result<Completion> {
        while let Some(event) = self.recv() {
            if let SeqEvent::Done(result) = event {
                return result;
            }
        }
        Err(RuntimeError::Request(
            "the scheduler stopped without finishing the sequence".into(),
        ))
    }
}

/// The continuous-batching scheduler over one model: [`Scheduler::submit`] queues a sequence
/// and returns at once; the engine thread runs it with the others. Dropping the scheduler
/// cancels what is left and stops the thread.
pub struct Scheduler {
    commands: Sender<Command>,
    stats: Arc<SchedulerStats>,
    model: Arc<Model>,
    thread: Option<JoinHandle<()>>,
}

impl Scheduler {
    pub fn start(model: Arc<Model>, config: BatchConfig) -> Result<Self> {
        Self::start_with_prefix_cache(model, config, None)
    }

    /// [`Scheduler::start`] with a prefix cache shared by every sequence ([`crate::prefix`]).
    pub fn start_with_prefix_cache(
        model: Arc<Model>,
        config: BatchConfig,
        prefix: Option<PrefixCacheConfig>,
    ) -> Result<Self> {
        config.validate()?;
        let prefix = prefix.map(PrefixCacheState::new);
        let stats = Arc::new(SchedulerStats::new(config.max_seqs, config.token_budget));
        stats.prefix.set_enabled(prefix.is_some());
        if let Some(blocks) = model.backend.kv_blocks() {
            stats.set_kv_blocks(blocks);
        }
        let (commands, received) = channel();
        let (engine_model, engine_stats) = (Arc::clone(&model), Arc::clone(&stats));
        // The loop is built on its thread: sessions are created, used and dropped there and
        // never cross threads (a backend's session need not be `Send`).
        let thread = std::thread::Builder::new()
            .name("spindle-batch".into())
            .spawn(move || {
                EngineLoop {
                    model: engine_model,
                    config,
                    stats: engine_stats,
                    commands: received,
                    waiting: VecDeque::new(),
                    running: Vec::new(),
                    stopping: false,
                    prefix,
                }
                .run()
            })
            .map_err(|e| RuntimeError::Request(format!("cannot start the engine thread: {e}")))?;
        Ok(Self {
            commands,
            stats,
            model,
            thread: Some(thread),
        })
    }

    pub fn stats(&self) -> &Arc<SchedulerStats> {
        &self.stats
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Queues `prompt` (its ids fed to a fresh session, its images on their pads) to generate
    /// with `options`; events go to `sink` on the engine thread. Refused at once: an empty
    /// prompt, one that leaves no room to generate, invalid sampling parameters, image pads
    /// that do not match the images (or images the backend cannot take). The images run
    /// through the vision tower when the sequence is admitted.
    pub fn submit_with(
        &self,
        prompt: impl Into<TokenPrompt>,
        options: &GenerateOptions,
        sink: EventSink,
    ) -> Result<SequenceGuard> {
        let prompt = prompt.into();
        if prompt.ids.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        self.model
            .backend
            .check_images(&prompt.ids, &prompt.images)?;
        let first_image_pad = prompt.first_image_pad(self.model.config());
        let TokenPrompt {
            ids: prompt_ids,
            images,
        } = prompt;
        let decoder = SequenceDecoder::new(&self.model, 0, &prompt_ids, options)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let request = Request {
            prompt: prompt_ids,
            images,
            features: None,
            first_image_pad,
            last_token: None,
            decoder,
            sink,
            cancel: Arc::clone(&cancel),
            submitted: Instant::now(),
            cached: None,
        };
        self.commands
            .send(Command::Submit(Box::new(request)))
            .map_err(|_| RuntimeError::Request("the scheduler has stopped".into()))?;
        Ok(SequenceGuard {
            cancel,
            wake: self.commands.clone(),
        })
    }

    /// [`Scheduler::submit_with`] with the events on a channel.
    pub fn submit(
        &self,
        prompt: impl Into<TokenPrompt>,
        options: &GenerateOptions,
    ) -> Result<SequenceHandle> {
        let (tx, events) = channel();
        let sink: EventSink = Box::new(move |event| match tx.send(event) {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Stop,
        });
        let guard = self.submit_with(prompt, options, sink)?;
        Ok(SequenceHandle { events, guard })
    }

    /// Cancels every sequence submitted so far (running or waiting).
    pub fn cancel_all(&self) {
        let _ = self.commands.send(Command::CancelAll);
    }

    /// Empties the prefix cache (its references to KV blocks are dropped: a block no running
    /// sequence holds goes back to the pool) and returns once it is done.
    pub fn clear_prefix_cache(&self) {
        let (done, wait) = channel();
        if self.commands.send(Command::ClearPrefixCache(done)).is_ok() {
            let _ = wait.recv();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            // The last owner may be a sink running on the engine thread itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// The prefix cache and where it snapshots.
struct PrefixCacheState {
    cache: PrefixCache,
    config: PrefixCacheConfig,
}

impl PrefixCacheState {
    fn new(config: PrefixCacheConfig) -> Self {
        Self {
            cache: PrefixCache::new(config.capacity_bytes),
            config,
        }
    }

    /// Caches the state of `session`, which holds `tokens`, as a prefix later sequences may
    /// resume from (unless it is cached already). Evicts down to the cache's capacity.
    fn remember(
        &mut self,
        backend: &Backend,
        stats: &SchedulerStats,
        session: &BackendSession,
        tokens: &[u32],
    ) {
        if tokens.is_empty() || tokens.len() != session.position() {
            return;
        }
        let Some(from) = self.cache.missing_from(tokens) else {
            return;
        };
        let captured = backend
            .capture_kv(session, from)
            .and_then(|kv| Ok((kv, backend.capture_state(session)?)));
        match captured {
            Ok((kv, state)) => {
                let before = self.cache.evictions();
                self.cache.insert(tokens, kv, state);
                let stats = &stats.prefix;
                stats.record_evictions(self.cache.evictions() - before);
                stats.set_size(self.cache.bytes(), self.cache.entries());
            }
            Err(e) => tracing::warn!("a prefix could not be cached: {e}"),
        }
    }
}

/// The engine thread's state.
struct EngineLoop {
    model: Arc<Model>,
    config: BatchConfig,
    stats: Arc<SchedulerStats>,
    commands: Receiver<Command>,
    waiting: VecDeque<Request>,
    running: Vec<Sequence>,
    stopping: bool,
    prefix: Option<PrefixCacheState>,
}

impl EngineLoop {
    fn run(mut self) {
        loop {
            self.take_commands();
            self.reap_cancelled();
            if self.stopping {
                self.cancel_everything();
                return;
            }
            // The running sequences take the blocks their next step needs before anyone is
            // admitted, so a newcomer never takes them and is preempted at once (a waste of
            // its admission, and of the prefix cache entries evicted for it).
            self.reserve_for_step();
            self.admit();
            self.preempt_over_budget();
            self.reserve_for_step();
            self.publish();
            if !self.running.is_empty() {
                self.step();
                self.publish();
            }
        }
    }

    /// Takes every queued command; sleeps for one when there is nothing to run.
    fn take_commands(&mut self) {
        if self.running.is_empty() && self.waiting.is_empty() {
            match self.commands.recv() {
                Ok(command) => self.apply(command),
                Err(_) => self.stopping = true,
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(command) => self.apply(command),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.stopping = true;
                    return;
                }
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Submit(request) => self.waiting.push_back(*request),
            Command::Wake => {}
            Command::CancelAll => {
                let flags = self.waiting.iter().map(|r| &r.cancel);
                for flag in flags.chain(self.running.iter().map(|s| &s.request.cancel)) {
                    flag.store(true, Ordering::Release);
                }
            }
            Command::ClearPrefixCache(done) => {
                while self.evict_prefix_entry() {}
                self.publish();
                let _ = done.send(());
            }
            Command::Shutdown => self.stopping = true,
        }
    }

    fn cancel_everything(&mut self) {
        for request in std::mem::take(&mut self.waiting) {
            finish_request(request, Duration::ZERO, Duration::ZERO);
        }
        for sequence in std::mem::take(&mut self.running) {
            self.end(sequence, None);
        }
        self.publish();
    }

    /// Ends every cancelled sequence, freeing its session, before the next step.
    fn reap_cancelled(&mut self) {
        let cancelled = |flag: &Arc<AtomicBool>| flag.load(Ordering::Acquire);
        let (gone, kept): (VecDeque<Request>, VecDeque<Request>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|r| cancelled(&r.cancel));
        self.waiting = kept;
        if !gone.is_empty() {
            self.publish();
        }
        for request in gone {
            finish_request(request, Duration::ZERO, Duration::ZERO);
        }
        let mut n = 0;
        while n < self.running.len() {
            if cancelled(&self.running[n].request.cancel) {
                let sequence = self.running.remove(n);
                self.end(sequence, None);
            } else {
                n += 1;
            }
        }
    }

    /// State bytes of a sequence holding `tokens` tokens.
    fn state_at(&self, tokens: usize) -> u64 {
        spindle_model::install::plan::state_bytes(self.model.config(), tokens)
    }

    /// State bytes the running sequences hold after their next step.
    fn running_state(&self) -> u64 {
        self.running
            .iter()
            .map(|s| self.state_at(s.tokens_after_step()))
            .sum()
    }

    /// Preempts the sequences admitted last while the running ones would outgrow
    /// [`BatchConfig::state_budget`] in the next step (one always stays).
    fn preempt_over_budget(&mut self) {
        let Some(budget) = self.config.state_budget else {
            return;
        };
        while self.running.len() > 1 && self.running_state() > budget {
            let last = self.running.len() - 1;
            self.preempt(last);
        }
    }

    /// Makes room in every running sequence's state for its next step (the KV pool's blocks its
    /// tokens go into, taken now, not inside the shared step). When the KV pool is short, the
    /// prefix cache gives back entries first, then the
    /// sequence admitted last is preempted; when the device has no memory, the sequence itself
    /// is preempted while others run (their finishing frees memory). A sequence alone that
    /// cannot grow fails. A sequence never writes into memory another holds.
    fn reserve_for_step(&mut self) {
        let mut n = 0;
        while n < self.running.len() {
            let tokens = self.running[n].tokens_after_step();
            let sequence = &mut self.running[n];
            match self.model.backend.reserve(&mut sequence.session, tokens) {
                Ok(()) => n += 1,
                // The prefix cache gives back the blocks it alone holds first (then this is
                // retried).
                Err(e) if kv_pool_full(&e) && self.evict_prefix_entry() => {}
                Err(e) if self.running.len() > 1 => {
                    tracing::debug!("no memory to grow a sequence's state: {e}");
                    // Out of KV blocks, the sequence admitted last makes room (first come,
                    // first served, as for the state budget), and this one is tried again;
                    // out of device memory, this one waits.
                    let victim = if kv_pool_full(&e) {
                        self.running.len() - 1
                    } else {
                        n
                    };
                    self.preempt(victim);
                }
                Err(e) => {
                    let sequence = self.running.remove(n);
                    self.end(sequence, Some(e));
                }
            }
        }
    }

    /// Frees running sequence `n`'s state and puts it at the front of the queue, to be
    /// recomputed from its prompt and every token it generated: the last row of that prefill
    /// gives the token after the last one generated, as its next decode step would have.
    fn preempt(&mut self, n: usize) {
        let Sequence {
            mut request,
            session,
            last_token,
            fed,
            decoded,
            ..
        } = self.running.remove(n);
        // Its state so far is cached, so the recompute resumes from it (unless it is past an
        // image's pads, which ids alone do not key).
        if let Some(prefix) = self.prefix.as_mut() {
            let tokens = [&request.prompt[..fed], &decoded].concat();
            if request.cacheable(tokens.len()) {
                prefix.remember(&self.model.backend, &self.stats, &session, &tokens);
            }
        }
        drop(session);
        // The prompt as submitted, then everything generated (after an earlier preemption the
        // prompt already holds what was generated before it).
        request.prompt.truncate(request.decoder.prompt_tokens());
        request.prompt.extend_from_slice(request.decoder.ids());
        request.last_token = last_token;
        self.stats.record_preemption();
        tracing::debug!(
            tokens = request.prompt.len(),
            "a sequence is preempted for state memory"
        );
        self.waiting.push_front(request);
    }

    /// Gives sessions to waiting sequences, first come first served, up to `max_seqs` and
    /// within [`BatchConfig::state_budget`]. A session that cannot be created (memory) leaves
    /// its sequence waiting for a running one to finish; with none running there is nothing to
    /// wait for and it fails.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_seqs {
            let Some(request) = self.waiting.pop_front() else {
                return;
            };
            if let Some(budget) = self.config.state_budget {
                let after = self.running_state() + self.state_at(request.prompt.len());
                if !self.running.is_empty() && after > budget {
                    self.waiting.push_front(request);
                    return;
                }
            }
            // The prompt's blocks and the answer's first are taken now, so running out of
            // memory keeps this sequence waiting instead of failing a step that others share.
            let room = request.decoder.room(RESERVED_ANSWER_TOKENS);
            let mut request = request;
            if let Err(e) = self.encode_images(&mut request) {
                (request.sink)(SeqEvent::Done(Err(e)));
                continue;
            }
            let limit = request.cache_limit();
            let opened = Instant::now();
            let capacity = self
                .model
                .backend
                .admission_tokens(request.prompt.len(), room);
            let session = self.open_session(&request.prompt, limit, capacity);
            match session {
                Ok((mut session, cached)) => {
                    tracing::debug!(
                        prompt = request.prompt.len(),
                        cached,
                        "admitted: session opened in {:?}",
                        opened.elapsed()
                    );
                    let features = request.features.as_deref().unwrap_or_default();
                    if let Err(e) = self.model.backend.attach_images(&mut session, features) {
                        (request.sink)(SeqEvent::Done(Err(e)));
                        continue;
                    }
                    let snapshots = match &self.prefix {
                        Some(p) => snapshot_points(
                            &request.prompt,
                            cached,
                            p.config.interval,
                            &p.config.markers,
                        )
                        .into_iter()
                        .filter(|&point| point <= limit)
                        .collect(),
                        None => VecDeque::new(),
                    };
                    request.cached.get_or_insert(cached);
                    // A recompute after a preemption counts too: its hits save prefill work.
                    self.stats
                        .prefix
                        .record_lookup(cached, request.prompt.len() - cached);
                    self.running.push(Sequence {
                        last_token: request.last_token,
                        request,
                        session,
                        fed: cached,
                        next: [0],
                        prefill_started: None,
                        prefill_time: Duration::ZERO,
                        snapshots,
                        decoded: Vec::new(),
                    })
                }
                Err(e) if self.running.is_empty() => {
                    (request.sink)(SeqEvent::Done(Err(e)));
                }
                Err(e) => {
                    tracing::debug!("a sequence waits for memory: {e}");
                    self.waiting.push_front(request);
                    return;
                }
            }
        }
    }

    /// A session holding the longest cached prefix of `prompt` that leaves at least its last
    /// token to prefill (its logits give the first token), and that prefix's length; `None`
    /// without a cache, on a miss, or when restoring fails (logged: the prompt is prefilled
    /// from nothing, which gives the same answer).
    /// Runs a request's images through the vision tower at its first admission (the
    /// features stay with it, across preemptions, until it ends).
    fn encode_images(&self, request: &mut Request) -> Result<()> {
        if request.images.is_empty() || request.features.is_some() {
            return Ok(());
        }
        let features = self.model.backend.encode_images(&request.images)?;
        request.features = Some(features);
        Ok(())
    }

    /// A session for `prompt` with room for `capacity` tokens, and how many of its tokens it
    /// holds already: the longest cached prefix ([`EngineLoop::restore_prefix`]), else a fresh
    /// session. When the CPU's KV pool has no blocks for it, prefix cache entries are evicted,
    /// least recently used first, and it is tried again; the error is returned once the cache
    /// has nothing left to give (or at once for any other error, as on CUDA).
    fn open_session(
        &mut self,
        prompt: &[u32],
        limit: usize,
        capacity: usize,
    ) -> Result<(BackendSession, usize)> {
        loop {
            let opened = match self.restore_prefix(prompt, limit, capacity) {
                Some(Ok(restored)) => Ok(restored),
                Some(Err(_)) | None => self
                    .model
                    .backend
                    .new_session_with_capacity(capacity)
                    .map(|session| (session, 0)),
            };
            match opened {
                Err(e) if kv_pool_full(&e) && self.evict_prefix_entry() => {
                    tracing::debug!("no memory for a new sequence ({e}): a prefix entry evicted");
                }
                opened => return opened,
            }
        }
    }

    /// Evicts the prefix cache's least recently used entry (its blocks go back to the KV pool
    /// unless a running sequence references them too); false without a cache or an entry.
    fn evict_prefix_entry(&mut self) -> bool {
        let Some(prefix) = self.prefix.as_mut() else {
            return false;
        };
        if !prefix.cache.evict_one() {
            return false;
        }
        self.stats.prefix.record_evictions(1);
        self.stats
            .prefix
            .set_size(prefix.cache.bytes(), prefix.cache.entries());
        true
    }

    /// A session holding the longest cached prefix of `prompt` of at most `limit` tokens
    /// (and never the whole prompt: its last token is fed to get logits); `None` without a
    /// cache or on a miss, `Some(Err)` when restoring failed (memory; anything else is logged,
    /// and the prompt is prefilled from nothing, which gives the same answer).
    fn restore_prefix(
        &mut self,
        prompt: &[u32],
        limit: usize,
        capacity: usize,
    ) -> Option<Result<(BackendSession, usize)>> {
        let prefix = self.prefix.as_mut()?;
        let hit = prefix.cache.lookup(prompt, limit.min(prompt.len() - 1))?;
        let ids = &prompt[..hit.tokens];
        match self
            .model
            .backend
            .restore_prefix(&hit.segments, hit.state, ids, capacity)
        {
            Ok(session) => Some(Ok((session, hit.tokens))),
            Err(e) if kv_pool_full(&e) => {
                tracing::debug!("no KV blocks to restore a cached prefix: {e}");
                Some(Err(e))
            }
            Err(e) => {
                tracing::warn!("a cached prefix could not be restored: {e}");
                Some(Err(e))
            }
        }
    }

    fn publish(&self) {
        let bytes = self.running.iter().map(|s| s.session.state_bytes()).sum();
        self.stats
            .set_occupancy(self.running.len(), self.waiting.len(), bytes);
        if let Some(blocks) = self.model.backend.kv_blocks() {
            self.stats.set_kv_blocks(blocks);
        }
    }

    /// One batched forward step over the running sequences, then each one's token: every fed
    /// sequence is in ONE forward batch. A sequence samples where the logits are (on CUDA
    /// only its token comes back) with its token mask (a grammar, bans before `min_tokens`);
    /// the masks are computed by worker threads while the forward pass runs on the device
    /// (on the CPU, whose forward pass takes every core, after it). A sequence that needs its
    /// whole row (log-probabilities, a `logit_bias`) gets the row back from the same batch and
    /// samples on the host.
    fn step(&mut self) {
        let work: Vec<Work> = self
            .running
            .iter()
            .map(Sequence::work_until_snapshot)
            .collect();
        let take = plan_step(&work, self.config.token_budget);
        let started = Instant::now();
        // Each fed sequence's index.
        let mut order: Vec<usize> = Vec::with_capacity(take.len());
        let mut items = Vec::with_capacity(take.len());
        let mut picks = Vec::with_capacity(take.len());
        // The masks to compute during the step, with their item's index.
        let mut to_mask: Vec<(usize, SequenceMask<'_>)> = Vec::new();
        // Host-sampled sequences whose grammar mask is computed during the step too.
        let mut to_prepare: Vec<&mut SequenceDecoder> = Vec::new();
        for (n, sequence) in self.running.iter_mut().enumerate() {
            if take[n] == 0 {
                continue;
            }
            let Sequence {
                request: Request {
                    prompt, decoder, ..
                },
                session,
                fed,
                next,
                prefill_started,
                ..
            } = sequence;
            // Whether this step's row gives the sequence its next token.
            let samples = match work[n] {
                Work::Decode => true,
                Work::Prefill { .. } => *fed + take[n] == prompt.len(),
            };
            let ids: &[u32] = match work[n] {
                Work::Decode => &next[..],
                Work::Prefill { .. } => {
                    prefill_started.get_or_insert(started);
                    &prompt[*fed..*fed + take[n]]
                }
            };
            order.push(n);
            items.push(BatchItem {
                session,
                ids,
                want: LogitsFor::Last,
            });
            let pick = if !samples {
                Pick::Nothing
            } else if decoder.needs_logits() {
                if decoder.has_constraint() {
                    to_prepare.push(decoder);
                }
                Pick::Logits
            } else {
                match decoder.draw_masked() {
                    Some((draw, mask)) => {
                        if mask.is_needed() {
                            to_mask.push((picks.len(), mask));
                        }
                        Pick::Sample(draw)
                    }
                    // An ended sequence's row is dropped.
                    None => Pick::Nothing,
                }
            };
            picks.push(pick);
        }
        let fed = items.len();
        let masks = move || -> StepMasks {
            let mut masks: StepMasks = vec![None; fed];
            if to_mask.is_empty() && to_prepare.is_empty() {
                return masks;
            }
            let computed: Vec<(usize, Option<Vec<u32>>)> = to_mask
                .into_par_iter()
                .map(|(n, mask)| (n, mask.compute()))
                .collect();
            // A failure is met again, and reported, when the sequence samples.
            to_prepare.into_par_iter().for_each(|d| {
                let _ = d.prepare();
            });
            for (n, mask) in computed {
                masks[n] = mask;
            }
            masks
        };
        let results = self
            .model
            .backend
            .forward_batch_step(&mut items, &picks, masks);
        drop(picks);
        drop(items);
        self.stats
            .record_step(order.len(), take.iter().sum::<usize>());
        let now = Instant::now();
        tracing::debug!(
            sequences = order.len(),
            tokens = take.iter().sum::<usize>(),
            "step: forward in {:?}",
            now - started
        );
        let mut ended: Vec<(usize, Option<RuntimeError>)> = Vec::new();
        // Sequences whose prefill reached a snapshot point this step.
        let mut snapshots = Vec::new();
        for (n, result) in order.into_iter().zip(results) {
            let sequence = &mut self.running[n];
            let picked = match result {
                Ok(picked) => picked,
                Err(e) => {
                    ended.push((n, Some(e)));
                    continue;
                }
            };
            match work[n] {
                Work::Prefill { .. } => {
                    sequence.fed += take[n];
                    if sequence.snapshots.front() == Some(&sequence.fed) {
                        sequence.snapshots.pop_front();
                        snapshots.push(n);
                    }
                    if sequence.fed < sequence.request.prompt.len() {
                        continue;
                    }
                    sequence.prefill_time = now - sequence.prefill_started.unwrap_or(started);
                }
                Work::Decode => sequence.decoded.push(sequence.next[0]),
            }
            match self.token(n, picked, now) {
                Ok(true) => {}
                Ok(false) => ended.push((n, None)),
                Err(e) => ended.push((n, Some(e))),
            }
        }
        // Before the sampled tokens are fed: the sessions are exactly at the snapshot points.
        if let Some(prefix) = self.prefix.as_mut() {
            let taken = Instant::now();
            let count = snapshots.len();
            for n in snapshots {
                let sequence = &self.running[n];
                let tokens = &sequence.request.prompt[..sequence.fed];
                prefix.remember(&self.model.backend, &self.stats, &sequence.session, tokens);
            }
            if count > 0 {
                tracing::debug!("step: {count} snapshots taken in {:?}", taken.elapsed());
            }
        }
        // Highest index first, so the others keep theirs; the rest keep their order.
        ended.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
        for (n, error) in ended {
            let sequence = self.running.remove(n);
            self.end(sequence, error);
        }
    }

    /// Takes sequence `n`'s next token (sampled here from its logits, or already chosen on
    /// the device) and sends its text. False when the sequence ended (a stop condition, or its
    /// sink stopped it).
    fn token(&mut self, n: usize, picked: Picked, now: Instant) -> Result<bool> {
        let sequence = &mut self.running[n];
        let position = sequence.session.position();
        let decoder = &mut sequence.request.decoder;
        let step = match picked {
            Picked::Logits(mut logits) => decoder.step(&mut logits, position)?,
            Picked::Token(id) => decoder.accept(id, position)?,
            // A sequence that samples no more (`max_tokens` 0): `accept` ends it without
            // reading the id.
            Picked::Nothing => decoder.accept(0, position)?,
        };
        if sequence.request.decoder.generated() > 0 {
            match sequence.last_token {
                None => self
                    .stats
                    .time_to_first_token
                    .observe((now - sequence.request.submitted).as_secs_f64()),
                Some(last) => self
                    .stats
                    .inter_token_latency
                    .observe((now - last).as_secs_f64()),
            }
        }
        sequence.last_token = Some(now);
        let flow = if step.text.is_empty() {
            Flow::Continue
        } else {
            let logprobs = sequence.request.decoder.take_logprobs();
            if !logprobs.is_empty() {
                (sequence.request.sink)(SeqEvent::Logprobs(logprobs));
            }
            (sequence.request.sink)(SeqEvent::Text(step.text))
        };
        let Some(next) = step.next else {
            return Ok(false);
        };
        sequence.next = [next];
        if flow == Flow::Stop {
            sequence.request.cancel.store(true, Ordering::Release);
            return Ok(false);
        }
        Ok(true)
    }

    /// Frees a sequence's session, then sends its end: the error, or the completion
    /// (cancelled if it had not ended).
    /// A sequence that ran without error is cached first (prompt and answer: the next turn of
    /// a chat extends it).
    fn end(&mut self, sequence: Sequence, error: Option<RuntimeError>) {
        let Sequence {
            request,
            session,
            prefill_time,
            last_token,
            prefill_started,
            fed,
            decoded,
            ..
        } = sequence;
        if let Some(prefix) = self.prefix.as_mut() {
            if error.is_none() && !self.stopping && fed == request.prompt.len() {
                let tokens = [&request.prompt[..], &decoded].concat();
                if request.cacheable(tokens.len()) {
                    prefix.remember(&self.model.backend, &self.stats, &session, &tokens);
                }
            }
        }
        drop(session);
        // Counted free before the caller hears of the end.
        self.publish();
        let decode_time = match (last_token, prefill_started) {
            (Some(last), Some(start)) => last.saturating_duration_since(start + prefill_time),
            _ => Duration::ZERO,
        };
        match error {
            Some(e) => {
                let mut request = request;
                (request.sink)(SeqEvent::Done(Err(e)));
            }
            None => finish_request(request, prefill_time, decode_time),
        }
    }
}

/// Whether `error` is the KV block pool running short (which the prefix cache can relieve by
/// dropping its references to blocks).
fn kv_pool_full(error: &RuntimeError) -> bool {
    match error {
        RuntimeError::Engine(spindle_cpu::EngineError::KvPoolFull(_)) => true,
        #[cfg(feature = "cuda")]
        RuntimeError::Cuda(e) => spindle_cuda::is_pool_full(e).is_some(),
        _ => false,
    }
}

/// Sends a request's end: what it generated (cancelled unless it had finished).
fn finish_request(request: Request, prefill_time: Duration, decode_time: Duration) {
    let Request {
        mut decoder,
        mut sink,
        cached,
        ..
    } = request;
    match decoder.cancel() {
        Ok(rest) => {
            if !rest.is_empty() {
                sink(SeqEvent::Text(rest));
            }
            let mut completion = decoder.into_completion(prefill_time, decode_time);
            completion.cached_tokens = cached.unwrap_or(0);
            sink(SeqEvent::Done(Ok(completion)));
        }
        Err(e) => {
            sink(SeqEvent::Done(Err(e)));
        }
    }
}
