//! The backend interface: which engine runs the model, the CPU [`Engine`] or (with the `cuda`
//! feature) the CUDA engine on one GPU. Every front end goes through here: `load`, a new
//! session, `forward` (token ids in, logits on the host out, the input checked once here for
//! every backend), the state a session holds, and what the bench measures beside them (a
//! greedy decode step, the memory-bandwidth probe, the CUDA kernel profile). Above this the
//! decode loop, sampling, stop strings, chat templates and tool parsing are one code path.

mod cuda;

use std::path::Path;
use std::sync::Arc;

use spindle_cpu::experts::load::Placement;
use spindle_cpu::experts::{ExpertCounters, ExpertStats};
use spindle_cpu::{Engine, GreedyRun, LoadOptions, LogitsFor, Session};
use spindle_kernels::softmax::argmax;
use spindle_model::mrope::ImageFeatures;
use spindle_model::ModelConfig;
use spindle_vision::PreparedImage;

pub use crate::device::Device;
use crate::error::{Result, RuntimeError};
use crate::input::check_input;
use crate::measure::{measure_read_bandwidth, KernelTime};
use crate::prefix::{PrefixKv, PrefixState};
use crate::sampling::{Penalised, Sampler, SamplingParams};
pub use cuda::cuda_refusal;

/// Whether CUDA keeps prefix-cache pieces in device memory (the default) rather than on the
/// host: `SPINDLE_PREFIX_ON_HOST=1` keeps them on the host (for A/B measurements, or a GPU whose
/// memory is needed elsewhere). A piece the device has no room for goes to the host anyway.
#[cfg(feature = "cuda")]
fn prefix_on_device() -> bool {
    std::env::var("SPINDLE_PREFIX_ON_HOST").map_or(true, |v| v != "1")
}

#[cfg(feature = "cuda")]
pub use cuda::{CudaBackend, CudaSessionGuard};

/// A loaded model on one backend.
// One per loaded model: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Cpu(Engine),
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
}

/// One sequence's state on the backend that created it.
pub enum BackendSession {
    Cpu(Session),
    #[cfg(feature = "cuda")]
    Cuda(Box<CudaSessionGuard>),
}

impl From<Session> for BackendSession {
    fn from(session: Session) -> Self {
        BackendSession::Cpu(session)
    }
}

impl BackendSession {
    /// Tokens already processed (the next token's position).
    pub fn position(&self) -> usize {
        match self {
            BackendSession::Cpu(s) => s.position,
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(s) => s.session().position,
        }
    }

    /// Bytes held by the session's caches and states (KV caches, GDN and PLE states), on the
    /// device that runs it.
    pub fn state_bytes(&self) -> usize {
        match self {
            BackendSession::Cpu(s) => s.state_bytes(),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(s) => s.session().state_bytes(),
        }
    }

    /// Every id fed to a CUDA session (replayed to locate a non-finite value); empty on the CPU,
    /// whose engine checks every step itself.
    #[cfg(feature = "cuda")]
    fn fed(&self) -> &[u32] {
        match self {
            BackendSession::Cpu(_) => &[],
            BackendSession::Cuda(s) => s.replay_ids(),
        }
    }

    /// Images queued on the session whose pads have not all been fed yet.
    pub fn pending_images(&self) -> usize {
        match self {
            BackendSession::Cpu(s) => s.rope.pending.len(),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(s) => s.session().rope.pending.len(),
        }
    }

    /// The CPU session, when this is one.
    pub fn cpu(&self) -> Option<&Session> {
        match self {
            BackendSession::Cpu(s) => Some(s),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(_) => None,
        }
    }
}

/// How one item's next token is chosen in [`Backend::forward_batch_sampled`].
pub struct Draw<'a> {
    pub params: &'a SamplingParams,
    /// The uniform draw in [0, 1) from the sequence's own sampler
    /// ([`crate::sampling::Sampler::next_uniform`]; any value when greedy).
    pub uniform: f64,
    /// The ids the penalties read ([`Penalised::of`]).
    pub penalised: Penalised<'a>,
}

/// What one item of [`Backend::forward_batch_step`] wants from its last logits row.
pub enum Pick<'a> {
    /// Its next token, chosen where the logits are with this draw, after the item's mask (if
    /// the step's masks give it one).
    Sample(Draw<'a>),
    /// The row itself on the host (a sequence that needs the whole distribution: its
    /// log-probabilities, a `logit_bias`).
    Logits,
    /// Nothing (a prompt chunk before the last: its row gives no token).
    Nothing,
}

/// What one item of [`Backend::forward_batch_step`] got, as its [`Pick`] asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Picked {
    Token(u32),
    Logits(Vec<f32>),
    Nothing,
}

/// Each item's allowed-token bits for [`Backend::forward_batch_step`] (`None`: every token
/// allowed; bit `id % 32` of word `id / 32`, `vocab_size.div_ceil(32)` words), in item order.
pub type StepMasks = Vec<Option<Vec<u32>>>;

/// One sequence's share of a batched step ([`Backend::forward_batch`]).
pub struct BatchItem<'a> {
    pub session: &'a mut BackendSession,
    pub ids: &'a [u32],
    pub want: LogitsFor,
}

impl Backend {
    /// Loads the model in `dir` onto `device` with `options`. On CUDA only `options.quant` is
    /// used; options only the CPU engine has are refused by name (see [`cuda_refusal`]), and a
    /// machine without CUDA gets the CUDA engine's "CUDA is not available" error before any
    /// weight is read.
    pub fn load(dir: &Path, device: Device, options: &LoadOptions) -> Result<Self> {
        Self::load_layers(dir, device, options, None)
    }

    /// [`Backend::load`], keeping only the first `layers` layers when given (the per-layer
    /// costs of a truncated model, for the bench). The CPU engine runs whole models only.
    pub fn load_layers(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
        layers: Option<usize>,
    ) -> Result<Self> {
        match device {
            Device::Cpu => {
                if let Some(n) = layers {
                    return Err(RuntimeError::Unsupported(format!(
                        "--layers {n} is not available with --device cpu: the CPU engine runs whole models (use --device cuda)"
                    )));
                }
                Ok(Backend::Cpu(Engine::load_with(dir, options)?))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => Ok(Backend::Cuda(CudaBackend::load(
                dir, ordinal, options, layers,
            )?)),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Backend::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Device::Cuda(c.ordinal()),
        }
    }

    /// The processor by name: `cpu`, or the GPU's, e.g. `NVIDIA H200 (sm_90)`.
    pub fn device_name(&self) -> String {
        match self {
            Backend::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine().device_name(),
        }
    }

    /// The device in words: `cpu`, or e.g. `cuda:0 (NVIDIA H200 (sm_90))`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => format!("cuda:{} ({})", c.ordinal(), c.engine().device_name()),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Backend::Cpu(e) => e.config(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine().config(),
        }
    }

    /// The CPU engine, when the model runs on the CPU.
    pub fn cpu(&self) -> Option<&Engine> {
        match self {
            Backend::Cpu(e) => Some(e),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => None,
        }
    }

    /// A fresh session (empty caches). On CUDA this allocates device memory and may fail.
    pub fn new_session(&self) -> Result<BackendSession> {
        self.new_session_with_capacity(0)
    }

    /// A fresh session with room for `tokens` tokens: blocks of the model's KV pool for them
    /// (an error when the pool is short, [`crate::RuntimeError`] from `EngineError::KvPoolFull`
    /// or `CudaError::KvPoolFull`).
    pub fn new_session_with_capacity(&self, tokens: usize) -> Result<BackendSession> {
        match self {
            Backend::Cpu(e) => {
                let mut session = e.new_session();
                e.reserve(&mut session, tokens)?;
                Ok(BackendSession::Cpu(session))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Ok(BackendSession::Cuda(Box::new(c.new_session(tokens)?))),
        }
    }

    /// The tokens a new sequence with a `prompt`-token prompt is given room for at admission,
    /// `answer` being the room its answer may take: the prompt and one block of answer, on
    /// both backends (the KV pool hands out further blocks as it decodes, so one long answer
    /// does not hold blocks others could use).
    pub fn admission_tokens(&self, prompt: usize, answer: usize) -> usize {
        prompt + answer.min(spindle_model::paged::BLOCK_TOKENS)
    }

    /// Makes room in `session` for `tokens` tokens: the blocks of the KV pool its next tokens go
    /// into (copying a block it shares before writing into it), and on CUDA the scratch that
    /// follows the context, so a batched step never has to. An error means there is no memory
    /// for it (the pool, or the device): the session is unchanged.
    pub fn reserve(&self, session: &mut BackendSession, tokens: usize) -> Result<()> {
        match (self, session) {
            (Backend::Cpu(e), BackendSession::Cpu(s)) => Ok(e.reserve(s, tokens)?),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => c.reserve(s, tokens),
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// The KV block pool's occupancy (blocks used, shared, free).
    pub fn kv_blocks(&self) -> Option<spindle_model::paged::BlockCounts> {
        match self {
            Backend::Cpu(e) => Some(e.kv_pool().counts()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Some(c.engine().kv_pool().counts()),
        }
    }

    /// Feeds `ids` to `session` and returns logits `[rows, V]` on the host for the positions
    /// `want` asks for (the same values on every backend, within float rounding). The input is
    /// checked here, once, before any backend runs: an empty input, a token outside the
    /// vocabulary or a sequence past the context is refused by name.
    pub fn forward(
        &self,
        session: &mut BackendSession,
        ids: &[u32],
        want: LogitsFor,
    ) -> Result<Vec<f32>> {
        check_input(self.config(), session.position(), ids)?;
        match (self, session) {
            // The CPU engine checks the residual stream after every sublayer and the logits.
            (Backend::Cpu(e), BackendSession::Cpu(s)) => Ok(e.forward(s, ids, want)?),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => {
                let start = s.session().position;
                let logits = c.forward(s, ids, want)?;
                self.check_logits(&logits, ids.len(), start, s.replay_ids())?;
                Ok(logits)
            }
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// One step over many sequences: each item feeds its own `ids` to its own session and gets
    /// back its own logits (as [`Backend::forward`] would return them) or its own error. Each
    /// item's input is checked here; an item refused (or failing) leaves the others running.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Vec<Result<Vec<f32>>> {
        let mut results = self.check_batch(items);
        match self {
            Backend::Cpu(e) => {
                let (order, mut batch) = self.cpu_items(items, &mut results);
                for (n, r) in order.into_iter().zip(e.forward_batch(&mut batch)) {
                    results[n] = Some(r.map_err(Into::into));
                }
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                let (order, mut batch) = self.cuda_items(items, &mut results);
                let logits = c.forward_batch(&mut batch);
                drop(batch);
                for (n, r) in order.into_iter().zip(logits) {
                    let tokens = items[n].ids.len();
                    results[n] = Some(r.and_then(|logits| {
                        // The step succeeded, so the session is past the item's tokens.
                        let start = items[n].session.position() - tokens;
                        self.check_logits(&logits, tokens, start, items[n].session.fed())
                            .map(|()| logits)
                    }));
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }

    /// Whether [`Backend::forward_batch_sampled`] chooses tokens on the device (CUDA), so
    /// only token ids cross to the host; on the CPU it samples the host logits.
    pub fn samples_on_device(&self) -> bool {
        !matches!(self, Backend::Cpu(_))
    }

    /// One batched step whose next tokens are chosen where the logits are: item `n`'s last
    /// logits row is sampled with `draws[n]` (its parameters, the uniform draw its own
    /// [`crate::sampling::Sampler`] took, and the ids its penalties count), and only the token
    /// comes back. The choice is [`crate::sampling::Sampler::sample_with`]'s on every backend
    /// (on CUDA the device sampler reproduces it). Every item must want [`LogitsFor::Last`].
    /// This is [`Backend::forward_batch_step`] with every item sampled and no masks.
    pub fn forward_batch_sampled(
        &self,
        items: &mut [BatchItem<'_>],
        draws: &[Draw<'_>],
    ) -> Vec<Result<u32>> {
        let picks: Vec<Pick<'_>> = draws
            .iter()
            .map(|d| {
                Pick::Sample(Draw {
                    params: d.params,
                    uniform: d.uniform,
                    penalised: d.penalised,
                })
            })
            .collect();
        self.forward_batch_step(items, &picks, Vec::new)
            .into_iter()
            .map(|picked| match picked? {
                Picked::Token(id) => Ok(id),
                other => Err(RuntimeError::Request(format!(
                    "a sampled step gave {other:?} instead of a token"
                ))),
            })
            .collect()
    }

    /// One forward batch over every item of a step, each item's last row used as `picks[n]`
    /// asks: sampled where the logits are (on CUDA only the id comes back), returned whole, or
    /// dropped. `masks` gives each item's allowed tokens ([`StepMasks`]; applied to the
    /// items that sample, before penalties, temperature and the filters, greedy included: a
    /// disallowed token's logit is -inf) and is called once the forward pass is under way: on
    /// CUDA after the step is launched, so the host computes grammar masks while the GPU runs
    /// the step, then the masks are uploaded and the sampling kernels read them; on the CPU
    /// after the forward pass. The choice is [`crate::sampling::Sampler::sample_with`]'s after
    /// [`crate::constraint::apply_mask_words`] on every backend. Every item must want
    /// [`LogitsFor::Last`]. An item refused (or failing) leaves the others running.
    pub fn forward_batch_step(
        &self,
        items: &mut [BatchItem<'_>],
        picks: &[Pick<'_>],
        masks: impl FnOnce() -> StepMasks,
    ) -> Vec<Result<Picked>> {
        assert_eq!(items.len(), picks.len(), "one pick per item");
        assert!(
            items.iter().all(|item| item.want == LogitsFor::Last),
            "a sampled step takes each item's last row"
        );
        match self {
            Backend::Cpu(_) => {
                let rows = self.forward_batch(items);
                let masks = masks();
                rows.into_iter()
                    .zip(picks)
                    .enumerate()
                    .map(|(n, (logits, pick))| {
                        let mut logits = logits?;
                        Ok(match pick {
                            Pick::Nothing => Picked::Nothing,
                            Pick::Logits => Picked::Logits(logits),
                            Pick::Sample(draw) => {
                                if let Some(Some(bits)) = masks.get(n) {
                                    crate::constraint::apply_mask_words(&mut logits, bits);
                                }
                                let mut sampler = Sampler::new(SamplingParams {
                                    seed: Some(0),
                                    ..draw.params.clone()
                                })?;
                                Picked::Token(sampler.sample_with(
                                    &mut logits,
                                    draw.penalised,
                                    Some(draw.uniform),
                                ))
                            }
                        })
                    })
                    .collect()
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                let mut results = self.check_batch(items);
                let (order, mut batch) = self.cuda_items(items, &mut results);
                let greedy = SamplingParams::default();
                let rows: Vec<spindle_cuda::RowSampling> = order
                    .iter()
                    .map(|&n| {
                        // A row whose token is not wanted is sampled greedily (the cheapest
                        // path) and dropped.
                        let (d, uniform, penalised) = match &picks[n] {
                            Pick::Sample(d) => (d.params, d.uniform, d.penalised),
                            Pick::Logits | Pick::Nothing => (&greedy, 0.0, Penalised::NONE),
                        };
                        spindle_cuda::RowSampling {
                            temperature: d.temperature,
                            top_k: d.top_k,
                            top_p: d.top_p,
                            min_p: d.min_p,
                            repetition_penalty: d.repetition_penalty,
                            presence_penalty: d.presence_penalty,
                            frequency_penalty: d.frequency_penalty,
                            uniform,
                            history: penalised.ids,
                            counted_from: penalised.counted_from,
                        }
                    })
                    .collect();
                let whole: Vec<bool> = order
                    .iter()
                    .map(|&n| matches!(picks[n], Pick::Logits))
                    .collect();
                let step = if batch.is_empty() {
                    Ok(Vec::new())
                } else {
                    let order = &order;
                    c.forward_batch_step(&mut batch, &rows, &whole, move || {
                        let mut all = masks();
                        all.resize(order.iter().max().map_or(0, |&n| n + 1), None);
                        // Only sampled rows read a mask.
                        order
                            .iter()
                            .map(|&n| match picks[n] {
                                Pick::Sample(_) => all[n].take(),
                                Pick::Logits | Pick::Nothing => None,
                            })
                            .collect()
                    })
                };
                drop(batch);
                match step {
                    Ok(rows) => {
                        for (n, row) in order.into_iter().zip(rows) {
                            results[n] = Some(if row.sampled.finite {
                                Ok(match (&picks[n], row.logits) {
                                    (Pick::Sample(_), _) => Picked::Token(row.sampled.id),
                                    (Pick::Logits, Some(logits)) => Picked::Logits(logits),
                                    (Pick::Logits, None) | (Pick::Nothing, _) => Picked::Nothing,
                                })
                            } else {
                                // The step succeeded: the session is past the item's tokens,
                                // and the row sampled is its last.
                                let token = items[n].ids.len() - 1;
                                let position = items[n].session.position() - 1;
                                Err(self.non_finite(token, position, items[n].session.fed()))
                            });
                        }
                    }
                    Err(e) => {
                        let why = e.to_string();
                        for n in order {
                            results[n] = Some(Err(RuntimeError::Request(format!(
                                "the batched step failed: {why}"
                            ))));
                        }
                    }
                }
                results
                    .into_iter()
                    .map(|r| r.expect("every item has a result"))
                    .collect()
            }
        }
    }

    /// Each item's input checked: `Some(error)` for an item refused, `None` for one to run.
    fn check_batch<T>(&self, items: &[BatchItem<'_>]) -> Vec<Option<Result<T>>> {
        let config = self.config();
        items
            .iter()
            .map(|item| {
                check_input(config, item.session.position(), item.ids)
                    .err()
                    .map(|e| Err(e.into()))
            })
            .collect()
    }

    /// The runnable entries of `items` (those without a result yet) as one engine's items,
    /// with their indices: `engine_session` gives the engine's session of a backend session
    /// (`None` for another backend's, which gets its error).
    fn engine_items<'a, S, T>(
        &self,
        items: &'a mut [BatchItem<'_>],
        results: &mut [Option<Result<T>>],
        engine_session: impl Fn(&'a mut BackendSession) -> Option<S>,
    ) -> (Vec<usize>, Vec<(S, &'a [u32], LogitsFor)>) {
        let mut order = Vec::new();
        let mut batch = Vec::new();
        for (n, item) in items.iter_mut().enumerate() {
            if results[n].is_some() {
                continue;
            }
            match engine_session(&mut *item.session) {
                Some(session) => {
                    order.push(n);
                    batch.push((session, item.ids, item.want));
                }
                None => results[n] = Some(Err(self.foreign_session())),
            }
        }
        (order, batch)
    }

    /// [`Backend::engine_items`] for the CPU engine.
    fn cpu_items<'a, T>(
        &self,
        items: &'a mut [BatchItem<'_>],
        results: &mut [Option<Result<T>>],
    ) -> (Vec<usize>, Vec<spindle_cpu::BatchItem<'a>>) {
        let (order, batch) = self.engine_items(items, results, |s| match s {
            BackendSession::Cpu(s) => Some(s),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(_) => None,
        });
        let batch = batch
            .into_iter()
            .map(|(session, ids, want)| spindle_cpu::BatchItem { session, ids, want })
            .collect();
        (order, batch)
    }

    /// [`Backend::engine_items`] for the CUDA engine.
    #[cfg(feature = "cuda")]
    fn cuda_items<'a, T>(
        &self,
        items: &'a mut [BatchItem<'_>],
        results: &mut [Option<Result<T>>],
    ) -> (Vec<usize>, Vec<spindle_cuda::CudaBatchItem<'a>>) {
        for (n, item) in items.iter_mut().enumerate() {
            if let (None, BackendSession::Cuda(s)) = (&results[n], &mut *item.session) {
                s.feed(item.ids);
            }
        }
        let (order, batch) = self.engine_items(items, results, |s| match s {
            BackendSession::Cuda(s) => Some(s.session_mut()),
            BackendSession::Cpu(_) => None,
        });
        let batch = batch
            .into_iter()
            .map(|(session, ids, want)| spindle_cuda::CudaBatchItem { session, ids, want })
            .collect();
        (order, batch)
    }

    /// Feeds one token and returns the greedy next token ([`argmax`] of its logits): on the
    /// CPU from the logits row, on CUDA chosen on the device (4 bytes come back instead of the
    /// row; the device argmax keeps the lowest index on ties, as [`argmax`] does).
    pub fn decode_greedy(&self, session: &mut BackendSession, id: u32) -> Result<u32> {
        check_input(self.config(), session.position(), &[id])?;
        match (self, session) {
            (Backend::Cpu(e), BackendSession::Cpu(s)) => {
                Ok(argmax(&e.forward(s, &[id], LogitsFor::Last)?) as u32)
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => c.decode_greedy(s, id),
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// Checks that `ids` and `images` can run together here: every `<|image_pad|>` has its
    /// image and the reverse ([`crate::images::check_image_pads`]), and, with images, that this
    /// backend has a vision tower loaded. Refused by name, before anything runs.
    pub fn check_images(&self, ids: &[u32], images: &[PreparedImage]) -> Result<()> {
        crate::images::check_image_pads(self.config(), ids, images)?;
        if images.is_empty() {
            return Ok(());
        }
        match self {
            Backend::Cpu(e) => e
                .vision()
                .map(|_| ())
                .map_err(|e| RuntimeError::Image(e.to_string())),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c
                .engine()
                .vision()
                .map(|_| ())
                .map_err(|e| RuntimeError::Image(e.to_string())),
        }
    }

    /// Runs `images` through the vision tower: the features that replace their pads (shared
    /// docs `VISION.md` §3). An image that does not fit the tower is refused by its index.
    pub fn encode_images(&self, images: &[PreparedImage]) -> Result<Vec<Arc<ImageFeatures>>> {
        match self {
            Backend::Cpu(e) => e
                .encode_images(images)
                .map_err(|e| RuntimeError::Image(e.to_string())),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.encode_images(images),
        }
    }

    /// Queues image `features` on `session`: the next `<|image_pad|>` tokens fed to it take
    /// their rows, and the rotary positions after each image follow `VISION.md` §4.
    pub fn attach_images(
        &self,
        session: &mut BackendSession,
        features: &[Arc<ImageFeatures>],
    ) -> Result<()> {
        if features.is_empty() {
            return Ok(());
        }
        match (self, session) {
            (Backend::Cpu(e), BackendSession::Cpu(s)) => e
                .attach_images(s, features)
                .map_err(|e| RuntimeError::Image(e.to_string())),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => c.attach_images(s, features),
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// The prefix cache's size when none is given: a quarter of the host memory this process
    /// may use ([`crate::prefix::PrefixCacheConfig::default_capacity`]), and on CUDA, whose
    /// cache lives in device memory, at most a quarter of the device memory free now (the
    /// sequences' own state needs the rest). Call it once the model is loaded.
    pub fn prefix_cache_default_bytes(&self) -> u64 {
        let host = crate::prefix::PrefixCacheConfig::default_capacity();
        match self {
            Backend::Cpu(_) => host,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => match c.engine().free_device_bytes() {
                Ok((free, _)) if prefix_on_device() => host.min(free as u64 / 4),
                _ => host,
            },
        }
    }

    /// Bytes of the vision tower's weights as loaded (0 without one).
    pub fn vision_bytes(&self) -> usize {
        match self {
            Backend::Cpu(e) => e.vision_bytes(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine().vision_bytes(),
        }
    }

    /// The attention layers' KV rows of `session`'s tokens `[from, position)`, for the prefix
    /// cache: references to the session's blocks of the KV pool (no copy), or on CUDA with
    /// `SPINDLE_PREFIX_ON_HOST=1` copies on the host.
    pub fn capture_kv(&self, session: &BackendSession, from: usize) -> Result<PrefixKv> {
        match (self, session) {
            (Backend::Cpu(_), BackendSession::Cpu(s)) => s
                .capture_kv(from)
                .map(PrefixKv::Paged)
                .map_err(RuntimeError::Request),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => {
                c.capture_kv(s, from, prefix_on_device())
            }
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// The state valid only at `session`'s position (GDN conv and recurrent state, PLE
    /// state), for the prefix cache (on the host: CUDA copies it out).
    pub fn capture_state(&self, session: &BackendSession) -> Result<PrefixState> {
        match (self, session) {
            (Backend::Cpu(_), BackendSession::Cpu(s)) => s
                .capture_boundary()
                .map(PrefixState::Host)
                .map_err(RuntimeError::Request),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => c.capture_state(s, prefix_on_device()),
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// A new session holding a cached prefix: the KV rows of `segments` (from position 0, in
    /// order, without a gap) and the state at their end; `ids` are the prefix's tokens and
    /// `capacity` the tokens the session is given room for ([`Backend::reserve`]). The prefix's
    /// blocks are mapped into the session's block table, not copied; only a block the prefix
    /// ends in mid-way is copied, when the session first writes into it (on CUDA, pieces held
    /// on the host are written into new blocks).
    /// Its next step continues exactly as the session the pieces were captured from would have.
    pub fn restore_prefix(
        &self,
        segments: &[&PrefixKv],
        state: &PrefixState,
        ids: &[u32],
        capacity: usize,
    ) -> Result<BackendSession> {
        if ids.len() != state.position() {
            return Err(RuntimeError::Request(format!(
                "a cached prefix of {} tokens was given {} ids",
                state.position(),
                ids.len()
            )));
        }
        match self {
            Backend::Cpu(e) => {
                let foreign = || {
                    RuntimeError::Request(
                        "a cached prefix held on a GPU or in host rows was given to the CPU backend (its prefixes are blocks of its KV pool)".into(),
                    )
                };
                #[allow(irrefutable_let_patterns)]
                let PrefixState::Host(state) = state
                else {
                    return Err(foreign());
                };
                let segments = segments
                    .iter()
                    .map(|s| match s {
                        PrefixKv::Paged(s) => Ok(s),
                        PrefixKv::Host(_) => Err(foreign()),
                        #[cfg(feature = "cuda")]
                        PrefixKv::Device(_) => Err(foreign()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mut session = Session::restore(e.config(), e.kv_pool(), &segments, state)
                    .map_err(RuntimeError::Request)?;
                e.reserve(&mut session, capacity)?;
                Ok(BackendSession::Cpu(session))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c
                .restore(segments, state, ids, capacity)
                .map(|s| BackendSession::Cuda(Box::new(s))),
        }
    }

    /// Refuses logits `[rows, V]` of a forward pass over `tokens` tokens from `start` that hold
    /// a NaN or an infinity (the rows are the last `rows` of the input).
    #[cfg(feature = "cuda")]
    fn check_logits(
        &self,
        logits: &[f32],
        tokens: usize,
        start: usize,
        history: &[u32],
    ) -> Result<()> {
        let vocab = self.config().vocab_size;
        match spindle_cpu::first_non_finite_row(logits, vocab) {
            None => Ok(()),
            Some(row) => {
                let token = tokens - logits.len() / vocab + row;
                Err(self.non_finite(token, start + token, history))
            }
        }
    }

    /// The error of a step whose logits at input `token` (`position`) are not finite, naming
    /// where the hidden state first went non-finite: the CUDA steps carry no checks, so the
    /// session's ids are replayed with a check after every sublayer (the error path only).
    #[cfg(feature = "cuda")]
    fn non_finite(&self, token: usize, position: usize, history: &[u32]) -> RuntimeError {
        let located = match self {
            Backend::Cuda(c) => c.locate_non_finite(history),
            Backend::Cpu(_) => None,
        };
        let damaged = "the weights may be damaged: load with --check-weights to scan them";
        let diagnosis = match located {
            Some(site) => format!("the hidden state first went non-finite {site}; {damaged}"),
            None => format!(
                "{damaged}, or run the same input with --device cpu, which names the layer where \
                 the hidden state first went non-finite"
            ),
        };
        RuntimeError::NonFiniteLogits {
            device: self.describe(),
            token,
            position,
            diagnosis,
        }
    }

    fn foreign_session(&self) -> RuntimeError {
        RuntimeError::Request(format!(
            "a session of another backend was given to the model on {}",
            self.device()
        ))
    }

    /// Prefills `prompt` in a fresh session and decodes `steps` tokens greedily, one at a time
    /// with the cache, in the layout of the fixtures' `reference.safetensors`.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Result<GreedyRun> {
        let mut session = self.new_session()?;
        GreedyRun::collect(
            self.config().vocab_size,
            prompt,
            steps,
            spindle_kernels::softmax::argmax,
            |ids, want| self.forward(&mut session, ids, want),
        )
    }

    /// Average bytes of weights one decode step reads (routed experts counted top_k / E).
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            Backend::Cpu(e) => e.weight_bytes_per_token(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine().weight_bytes_per_token(),
        }
    }

    /// Waits until the work queued on the device is done (a no-op on the CPU, whose forward
    /// pass returns when it is done).
    pub fn sync(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.sync(),
        }
    }

    /// Read bandwidth of the memory the weights live in, bytes/s, measured now over a fresh
    /// `bytes`-byte buffer: on the CPU the median of parallel passes summing host memory
    /// ([`measure_read_bandwidth`]), on CUDA the best pass of a read kernel over device memory.
    pub fn measure_bandwidth(&self, bytes: usize) -> Result<f64> {
        match self {
            Backend::Cpu(_) => Ok(measure_read_bandwidth(bytes)),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.measure_bandwidth(bytes),
        }
    }

    /// Whether decode steps replay a captured CUDA graph (never on the CPU).
    pub fn uses_graphs(&self) -> bool {
        match self {
            Backend::Cpu(_) => false,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine().uses_graphs(),
        }
    }

    /// The kernel time recorded since the last call, by kernel and grid, largest first: CUDA
    /// with `SPINDLE_CUDA_PROFILE=1` (every launch timed, no graphs); empty otherwise.
    pub fn kernel_profile(&self) -> Result<Vec<KernelTime>> {
        match self {
            Backend::Cpu(_) => Ok(Vec::new()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.kernel_profile(),
        }
    }

    /// The CPU engine's expert counters (slot-cache hits and misses); `None` on CUDA, where
    /// every expert is resident in GPU memory.
    pub fn expert_counters(&self) -> Option<Arc<ExpertCounters>> {
        self.cpu().map(Engine::expert_counters)
    }

    /// Expert lookups since load; `None` on CUDA.
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        self.cpu().map(Engine::expert_stats)
    }

    /// Where the routed experts live on the CPU; `None` on CUDA.
    pub fn expert_placement(&self) -> Option<Placement> {
        self.cpu().map(Engine::expert_placement)
    }
}
