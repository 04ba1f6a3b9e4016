//! spindle's CUDA backend: the model flow of `docs/MODEL_MATH.md` run on one NVIDIA GPU, a peer
//! of the CPU backend (`spindle_cpu`) over `spindle_model`'s weight tree.
//!
//! Weights are uploaded once (bf16, or Q8/Q4 quantized on load; resident in VRAM);
//! activations and sequence state are f32 on the device. Kernels are CUDA C compiled at run time by NVRTC for the device's
//! architecture, so building this crate needs no CUDA toolkit, and a machine without a driver
//! gets a clear error from [`CudaEngine::load`] instead of a crash.
//!
//! Weights can be quantized on load (`--quant q8|q4`) by the CPU engine's own quantizer, so
//! the codes on the GPU are the CPU's. A decode step allocates nothing (a per-session
//! workspace), does no host work, and is captured once as a CUDA graph and replayed per
//! token, for every family. For qwen4_exp that means hyper-connections, PLE and QSA selection
//! all run as kernels: PLE hashes the n-grams on the device and gathers the n-gram table's
//! rows from page-locked host memory mapped into the device (the one weight kept out of
//! VRAM), and the QSA indexer keeps its keys in a device cache beside the KV cache.

// `is_multiple_of` needs Rust 1.87 (the workspace supports 1.85); kernel launchers mirror
// their CUDA signatures, so they take many arguments.
#![allow(clippy::manual_is_multiple_of, clippy::too_many_arguments)]

mod attention;
mod batch;
mod device;
mod error;
mod flow;
mod gdn;
mod gemm;
mod io;
pub mod kernels;
mod linear;
mod matrix;
mod matvec;
mod mlp;
mod moe;
mod norm;
mod paged;
mod prefix;
mod qwen4;
mod reduce;
mod sampling;
mod session;
#[doc(hidden)]
pub mod testing;
pub mod tower;
pub mod vision;
mod weights;

use std::path::Path;
use std::sync::Arc;

use spindle_model::forward::NonFiniteSite;
use spindle_model::forward::{GreedyRun, LogitsFor};
use spindle_model::mrope::ImageFeatures;
use spindle_model::quant::WeightFormat;
use spindle_model::weights::Linear;
use spindle_model::{Checkpoint, ModelConfig};
use spindle_vision::PreparedImage;

#[doc(hidden)]
pub use attention::qsa_pick_on_host;
pub use device::Device;
pub use error::{CudaError, Result};
#[doc(hidden)]
pub use gdn::{delta_rule_on_host, DeltaForm, DeltaInputs};
pub use kernels::ptx_for;
pub use paged::{is_pool_full, DeviceKv, KvPool};
pub use prefix::{DeviceState, HostLayer, HostPle, PrefixLayer, Rows};
pub use sampling::{
    apply_mask, sample_row_on_host, DeviceSampler, RowSampling, Sampled, MAX_SAMPLE_ROWS,
};
pub use session::CudaSession;
pub use vision::{GpuVision, TowerPath, TowerTimes, TowerTrace};

/// Prefill runs in pieces of at most this many tokens (grid-dimension limits of the MoE
/// kernels; the result is the same as one pass).
const MAX_CHUNK: usize = 4096;

/// One sequence's share of a batched step ([`CudaEngine::forward_batch`]).
pub struct CudaBatchItem<'a> {
    pub session: &'a mut CudaSession,
    pub ids: &'a [u32],
    pub want: LogitsFor,
}

/// The logits of a batched step on the device ([`CudaEngine::forward_batch_device`]):
/// `[rows, V]` f32, row-major, the rows of item `n` at [`BatchLogits::item_rows`]`(n)`.
pub struct BatchLogits {
    logits: flow::Logits,
    ranges: Vec<std::ops::Range<usize>>,
    vocab: usize,
}

impl BatchLogits {
    /// The device address of row 0 (f32).
    pub fn ptr(&self) -> u64 {
        self.logits.ptr
    }

    /// Rows in all.
    pub fn rows(&self) -> usize {
        self.logits.rows
    }

    /// The vocabulary size V (the row length).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The rows that belong to item `n` (in the order the items were given).
    pub fn item_rows(&self, n: usize) -> std::ops::Range<usize> {
        self.ranges[n].clone()
    }

    /// The device address of row `row`.
    pub fn row_ptr(&self, row: usize) -> u64 {
        self.logits.ptr + (row * self.vocab * 4) as u64
    }
}

/// A model loaded onto one CUDA device.
pub struct CudaEngine {
    dev: Device,
    config: ModelConfig,
    gpu: weights::GpuModel,
    /// RoPE inverse frequencies (f64) on the device.
    inv_freq: device::DevBuf<f64>,
    /// Decode steps are captured as CUDA graphs (no host work inside a step).
    graphs: bool,
    /// Bytes of a session's workspace.
    workspace_bytes: usize,
    /// Batched steps of more than MATVEC_MAX_TOKENS but at most this many rows (at most
    /// `batch::PROMPT_MATVEC_ROWS` in steps with prompt chunks) run their projections and
    /// MoE blocks as decode matvecs per 8 rows rather than GEMMs
    /// (`SPINDLE_CUDA_BATCH_MATVEC_ROWS`, default 128; 0: always GEMMs).
    batch_matvec_rows: usize,
    /// Batched steps' shared state: scratch arena, decode graphs per bucket, the pad sequence.
    /// Held for the length of a batched step.
    batch: std::sync::Mutex<batch::BatchState>,
    quant: WeightFormat,
    /// Scratch of [`CudaEngine::sample_rows`].
    sampler: sampling::SharedSampler,
    /// Set while [`CudaEngine::locate_non_finite`] replays a sequence: every forward pass
    /// then runs eagerly and checks the residual stream after each sublayer.
    probing: std::sync::atomic::AtomicBool,
    /// Page-locked staging for the prefix cache's copies to and from the host (allocated at
    /// the first one).
    prefix_staging: std::sync::Mutex<Option<device::MappedHost>>,
    /// The vision tower on the device, or why image input is not available.
    vision: std::result::Result<GpuVision, String>,
    /// Every sequence's keys and values, in blocks ([`paged`]).
    kv_pool: Arc<paged::KvPool>,
}

impl CudaEngine {
    /// Opens CUDA device `ordinal`, reads and validates the checkpoint in `dir` and uploads its
    /// weights as stored (bf16; a block-FP8 checkpoint's projections stay FP8).
    pub fn load(dir: &Path, ordinal: usize) -> Result<Self> {
        Self::load_as(dir, ordinal, None, None, true)
    }

    /// As [`CudaEngine::load`], with the large projections quantized on load to `quant` by the
    /// CPU engine's quantizer (the same matrices, the same codes as `Engine::load_with`), and,
    /// when `max_layers` is given, only the first layers kept (benchmarks of a truncated model).
    pub fn load_with(
        dir: &Path,
        ordinal: usize,
        quant: WeightFormat,
        max_layers: Option<usize>,
    ) -> Result<Self> {
        Self::load_with_vision(dir, ordinal, quant, max_layers, true)
    }

    /// As [`CudaEngine::load_with`]; with `vision` false the vision tower is left unloaded
    /// (`--no-vision`: image prompts are then refused).
    pub fn load_with_vision(
        dir: &Path,
        ordinal: usize,
        quant: WeightFormat,
        max_layers: Option<usize>,
        vision: bool,
    ) -> Result<Self> {
        Self::load_as(dir, ordinal, Some(quant), max_layers, vision)
    }

    /// As [`CudaEngine::load_with_vision`], with `quant` `None` keeping the weights as stored:
    /// bf16, a block-FP8 checkpoint's projections in FP8 (e4m3 codes and block scales on the
    /// device), a GGUF file's quantized projections in their blocks (Q4_K, Q5_K, Q6_K as
    /// stored, Q8_0 / Q4_0 as the identical Q8 / Q4; [`matrix::ggml_source`]; the others, and
    /// the embedding, dequantized exactly and rounded to bf16); `Some(format)` re-encodes the
    /// projections in `format` (FP8 and GGUF ones dequantized exactly first; bf16 rounds them).
    pub fn load_as(
        dir: &Path,
        ordinal: usize,
        quant: Option<WeightFormat>,
        max_layers: Option<usize>,
        vision: bool,
    ) -> Result<Self> {
        let keep_stored = quant.is_none();
        let quant = quant.unwrap_or(WeightFormat::Bf16);
        let dev = Device::open(ordinal)?;
        let mut config = ModelConfig::from_dir(dir)?;
        if let Some(n) = max_layers {
            config.layers.truncate(n.max(1));
        }
        check_supported(&config)?;
        let mut checkpoint = Checkpoint::open(dir)?;
        checkpoint.keep_blocks(keep_stored && gguf_blocks_wanted(&dev, &config, dir));
        let mut cpu = spindle_model::weights::load(&checkpoint, &config)?;
        if quant != WeightFormat::Bf16 {
            let started = std::time::Instant::now();
            cpu.quantize(quant, &|_, _| {});
            tracing::info!(
                quant = quant.name(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "quantized on load"
            );
        }
        // Block-FP8 checkpoints dequantize to f32 on the host: the upload reads their stored
        // codes and scales when they stay FP8 (every group of 32 columns in one block), bf16
        // otherwise. GGUF blocks the device reads stay blocks; the others dequantize to bf16.
        cpu.round_wide_to_bf16_keeping(&|linear| {
            keep_stored
                && (linear
                    .fp8()
                    .is_some_and(|f| matrix::fp8_fits(linear.cols(), f.block[1]))
                    || matches!(linear, Linear::Blocks(b) if matrix::ggml_fits(b)))
        });
        let started = std::time::Instant::now();
        let gpu = weights::upload(&dev, &cpu, &config)?;
        tracing::info!(
            device = %dev.describe(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "weights uploaded"
        );
        let vision = load_vision(&dev, &checkpoint, &config, vision)?;
        // The CPU view and the checkpoint's maps are not needed past the upload.
        drop(cpu);
        drop(checkpoint);
        let inv_freq: Vec<f64> = (0..config.rope.rotary_dim / 2)
            .map(|i| {
                1.0 / config
                    .rope
                    .theta
                    .powf(2.0 * i as f64 / config.rope.rotary_dim as f64)
            })
            .collect();
        let inv_freq = dev.upload(&inv_freq)?;
        let graphs = !dev.profiling() && std::env::var_os("SPINDLE_CUDA_NO_GRAPHS").is_none();
        let workspace_bytes = gpu.scratch_bytes(&config, kernels::MATVEC_MAX_TOKENS);
        let free = dev
            .context()
            .mem_get_info()
            .map_err(|source| CudaError::Driver {
                what: "reading the free device memory".into(),
                source,
            })?
            .0;
        let kv_pool = Arc::new(paged::KvPool::new(
            &dev,
            &config,
            paged::KvPool::default_bytes(&config, free.saturating_sub(workspace_bytes)),
        )?);
        Ok(CudaEngine {
            dev,
            config,
            gpu,
            inv_freq,
            graphs,
            workspace_bytes,
            batch: Default::default(),
            batch_matvec_rows: std::env::var("SPINDLE_CUDA_BATCH_MATVEC_ROWS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(batch::DEFAULT_MATVEC_ROWS),
            quant,
            sampler: Default::default(),
            probing: Default::default(),
            prefix_staging: Default::default(),
            vision,
            kv_pool,
        })
    }

    /// The vision tower, or why image input is not available (no `vision_config`, no
    /// `model.visual.*` tensors, `--no-vision`, ...).
    pub fn vision(&self) -> Result<&GpuVision> {
        self.vision
            .as_ref()
            .map_err(|why| CudaError::Image(why.clone()))
    }

    /// Device bytes of the vision tower's weights (0 without one).
    pub fn vision_bytes(&self) -> usize {
        self.vision.as_ref().map_or(0, GpuVision::size_bytes)
    }

    /// `<|image_pad|>` when the tower is loaded: those tokens then take image rows.
    pub(crate) fn image_token(&self) -> Option<u32> {
        self.vision.as_ref().ok().map(|v| v.config().tokens.image)
    }

    /// Runs `images` through the vision tower (shared docs `VISION.md` §3), each on its own:
    /// the features that replace their pads. An image that does not fit the tower is refused
    /// by its index.
    pub fn encode_images(&self, images: &[PreparedImage]) -> Result<Vec<Arc<ImageFeatures>>> {
        let tower = self.vision()?;
        for (k, image) in images.iter().enumerate() {
            tower.check_image(image, k)?;
        }
        images
            .iter()
            .enumerate()
            .map(|(k, image)| match tower.encode(&self.dev, image) {
                Ok(features) => Ok(Arc::new(features)),
                Err(CudaError::Image(why)) => Err(CudaError::Image(format!("image {k}: {why}"))),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// [`CudaEngine::encode_images`] for one image, keeping the tower's intermediates.
    pub fn trace_image(&self, image: &PreparedImage) -> Result<TowerTrace> {
        let tower = self.vision()?;
        tower.check_image(image, 0)?;
        tower.trace(&self.dev, image)
    }

    /// Queues `features` on `session`: the next `<|image_pad|>` tokens fed to it take their
    /// rows, image after image, and the positions after each image follow `VISION.md` §4.2.
    /// The prompt's pads must match (front ends check it: `spindle_runtime`'s prompt check).
    pub fn attach_images(
        &self,
        session: &mut CudaSession,
        features: &[Arc<ImageFeatures>],
    ) -> Result<()> {
        self.vision()?;
        session
            .rope
            .queue_images(features, self.config.hidden_size)
            .map_err(CudaError::Image)
    }

    /// The weight format of the large projections.
    pub fn quant(&self) -> WeightFormat {
        self.quant
    }

    /// Weight bytes one decode step reads (routed experts counted top_k / E).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.gpu.bytes_per_token(&self.config)
    }

    /// Device bytes of the weight matrices by format (`bf16`, `q8`, `q4`, `fp8`).
    pub fn weight_bytes_by_format(&self) -> Vec<(&'static str, usize)> {
        self.gpu.bytes_by_format()
    }

    /// The device this engine runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Whether decode steps replay a captured CUDA graph.
    pub fn uses_graphs(&self) -> bool {
        self.graphs
    }

    /// Sets the largest batched step (in rows) whose projections and MoE blocks run as decode
    /// matvecs per 8 rows instead of GEMMs (0: GEMMs above 8 rows); drops the batched decode
    /// graphs, which were captured with the old setting.
    #[doc(hidden)]
    pub fn set_batch_matvec_rows(&mut self, rows: usize) {
        self.batch_matvec_rows = rows;
        self.batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear_graphs();
    }

    /// Runs decode matvecs of more than 8 rows as one launch (the default) or as a launch per
    /// group of 8 rows (the same bits; for A/B measurements); drops the batched decode graphs.
    #[doc(hidden)]
    pub fn set_decode_group_launch(&mut self, on: bool) {
        self.dev.set_group_launch(on);
        self.batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear_graphs();
    }

    /// Runs Q8/Q4 decode matvecs of at least `rows` rows (raised to 16) on the tensor cores, or
    /// with 0 all of them as the dp4a decode matvecs (the same bits; for A/B measurements; the
    /// default is `device::TC_DECODE_ROWS` on sm_80 and later); drops the batched decode graphs.
    #[doc(hidden)]
    pub fn set_tc_decode_rows(&mut self, rows: usize) {
        self.dev.set_tc_decode_rows(rows);
        self.batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear_graphs();
    }

    /// Launches the decode kernels with programmatic dependent launch (the default on sm_90
    /// and later, unless `SPINDLE_CUDA_PDL=0`) or plainly (the same bits; for A/B
    /// measurements and the tests); drops the batched decode graphs. Sessions' decode graphs
    /// keep the launches they were captured with: make new sessions after a change.
    #[doc(hidden)]
    pub fn set_pdl(&mut self, on: bool) {
        self.dev.set_pdl(on);
        self.batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear_graphs();
    }

    /// The largest batched step (in rows) whose projections run as decode matvecs per 8 rows.
    #[doc(hidden)]
    pub fn batch_matvec_rows(&self) -> usize {
        self.batch_matvec_rows
    }

    /// Turns CUDA graphs on or off for later steps (tests compare both paths; on by default
    /// unless `SPINDLE_CUDA_NO_GRAPHS` is set or the profiler runs).
    #[doc(hidden)]
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on && !self.dev.profiling();
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device, e.g. "NVIDIA H200 (sm_90)".
    pub fn device_name(&self) -> String {
        self.dev.describe()
    }

    pub fn new_session(&self) -> Result<CudaSession> {
        CudaSession::new(&self.dev, &self.config, &self.kv_pool, self.workspace_bytes)
    }

    /// Drops the batched steps' graphs and pad sequence (the pad's block goes back to the
    /// pool; both are made again by the next batched step).
    #[doc(hidden)]
    pub fn drop_batch_state(&self) {
        self.batch.lock().unwrap_or_else(|p| p.into_inner()).reset();
    }

    /// The KV block pool every session's keys and values live in.
    pub fn kv_pool(&self) -> &Arc<paged::KvPool> {
        &self.kv_pool
    }

    /// Replaces the KV block pool by one of `bytes` (`--kv-pool`; by default half the device
    /// memory free after the weights, at most a million tokens' blocks). Sessions made before
    /// keep the old pool's blocks until they are dropped.
    pub fn set_kv_pool_bytes(&mut self, bytes: u64) -> Result<()> {
        // The old pool's memory goes first when nothing else holds it.
        let empty = Arc::new(paged::KvPool::new(&self.dev, &self.config, 0)?);
        self.kv_pool = empty;
        self.kv_pool = Arc::new(paged::KvPool::new(&self.dev, &self.config, bytes)?);
        self.batch.lock().unwrap_or_else(|p| p.into_inner()).reset();
        Ok(())
    }

    /// A session whose KV caches already hold `tokens` tokens (a decode graph stays valid
    /// until the context passes them).
    pub fn new_session_with_capacity(&self, tokens: usize) -> Result<CudaSession> {
        let mut session = self.new_session()?;
        flow::ensure_capacity(self, &mut session, tokens)?;
        Ok(session)
    }

    /// Grows the session's KV caches to hold `tokens` tokens now (a no-op when they do), so a
    /// batched step does not have to, and cannot fail for want of memory part-way.
    pub fn reserve(&self, session: &mut CudaSession, tokens: usize) -> Result<()> {
        flow::ensure_capacity(self, session, tokens)
    }

    /// Admission: an upper bound on the device bytes a new sequence needs outside the KV block
    /// pool to reach `context` tokens (GDN and PLE state, flash-decoding partials, its block
    /// table, its workspace); its keys and values take blocks of [`CudaEngine::kv_pool`].
    pub fn sequence_bytes(&self, context: usize) -> usize {
        session::sequence_state_bytes(&self.config, context) + self.workspace_bytes
    }

    /// Free and total device memory in bytes, as the driver reports them now.
    pub fn free_device_bytes(&self) -> Result<(usize, usize)> {
        self.dev
            .context()
            .mem_get_info()
            .map_err(|source| CudaError::Driver {
                what: "reading the free device memory".into(),
                source,
            })
    }

    /// Feeds one token and returns the greedy next token, chosen on the device (4 bytes come
    /// back instead of the logits row).
    pub fn decode_argmax(&self, session: &mut CudaSession, id: u32) -> Result<u32> {
        let logits = flow::forward_device(self, session, &[id], LogitsFor::Last)?;
        let next = session.step_io.next_token();
        let vocab = self.config.vocab_size;
        reduce::argmax(&self.dev, logits.ptr, vocab, &session.argmax_parts, next)?;
        Ok(self.dev.download_raw::<i32>(next, 1)?[0] as u32)
    }

    /// Waits for the device.
    pub fn sync(&self) -> Result<()> {
        self.dev.sync()
    }

    /// Read bandwidth of device memory in bytes/s: the best of several passes of a read kernel
    /// over a fresh `bytes`-byte buffer.
    pub fn measure_bandwidth(&self, bytes: usize) -> Result<f64> {
        let buf = self.dev.zeros::<u8>(bytes)?;
        let out = self.dev.zeros::<u32>(1)?;
        let words = bytes / 16;
        let mut best = 0.0f64;
        for _ in 0..6 {
            self.dev.sync()?;
            let started = std::time::Instant::now();
            reduce::read_pass(&self.dev, &buf, words, &out)?;
            self.dev.sync()?;
            best = best.max((words * 16) as f64 / started.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// Feeds `ids` to the session and returns logits `[rows, V]` (row-major) for the positions
    /// `want` asks for, as the CPU backend's `Engine::forward` does. `ids` are checked input
    /// (see `spindle_runtime::Backend::forward`, which checks them for every backend).
    /// Replays `ids` in a fresh session, checking the residual stream after the embedding,
    /// every sublayer and the head's input (as the CPU engine does on every step), and
    /// returns where it first held a NaN or an infinity; `None` when the replay stays finite.
    /// For the error path of a step whose logits came back non-finite: the steps themselves
    /// carry no checks (they would cost a copy per sublayer).
    pub fn locate_non_finite(&self, ids: &[u32]) -> Result<Option<NonFiniteSite>> {
        use std::sync::atomic::Ordering;
        self.probing.store(true, Ordering::Relaxed);
        let replay = self
            .new_session_with_capacity(ids.len())
            .and_then(|mut session| self.forward(&mut session, ids, LogitsFor::Last));
        self.probing.store(false, Ordering::Relaxed);
        match replay {
            Ok(_) => Ok(None),
            Err(CudaError::NonFinite { site, .. }) => Ok(Some(site)),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn probing(&self) -> bool {
        self.probing.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn forward(
        &self,
        session: &mut CudaSession,
        ids: &[u32],
        want: LogitsFor,
    ) -> Result<Vec<f32>> {
        let chunks: Vec<&[u32]> = ids.chunks(MAX_CHUNK).collect();
        let mut logits = Vec::new();
        for (n, chunk) in chunks.iter().enumerate() {
            let last = n + 1 == chunks.len();
            match want {
                LogitsFor::All => logits.extend(flow::forward(self, session, chunk, want)?),
                LogitsFor::Last if last => logits = flow::forward(self, session, chunk, want)?,
                LogitsFor::Last => drop(flow::forward_device(self, session, chunk, want)?),
            }
        }
        Ok(logits)
    }

    /// One step over many sequences, as the CPU backend's `Engine::forward_batch`: each item
    /// feeds its own `ids` to its own session and gets back its own logits (host) or error.
    /// One item is [`CudaEngine::forward`]; several run as one batched step
    /// ([`CudaEngine::forward_batch_device`]) unless they hold more than `MAX_CHUNK` tokens
    /// together, when they run one after the other. A failed batched step fails every item
    /// (their sessions are then in an unknown state, as after any failed forward pass).
    pub fn forward_batch(&self, items: &mut [CudaBatchItem<'_>]) -> Vec<Result<Vec<f32>>> {
        let tokens: usize = items.iter().map(|it| it.ids.len()).sum();
        if items.len() == 1 || tokens > MAX_CHUNK || items.iter().any(|it| it.ids.is_empty()) {
            return items
                .iter_mut()
                .map(|item| self.forward(item.session, item.ids, item.want))
                .collect();
        }
        let vocab = self.config.vocab_size;
        let step = self.forward_batch_device(items).and_then(|logits| {
            let all = self.download_logits(&logits)?;
            Ok((0..items.len())
                .map(|n| {
                    all[logits.item_rows(n).start * vocab..logits.item_rows(n).end * vocab].to_vec()
                })
                .collect::<Vec<_>>())
        });
        match step {
            Ok(rows) => rows.into_iter().map(Ok).collect(),
            Err(err) => {
                let msg = err.to_string();
                items
                    .iter()
                    .map(|_| Err(CudaError::BatchStep(msg.clone())))
                    .collect()
            }
        }
    }

    /// One batched step over `items` (none empty, at most `MAX_CHUNK` = 4096 tokens in all),
    /// leaving the logits on the device: one `[rows, V]` f32 buffer holding, item after item,
    /// the rows each item wants (all its tokens, or its last). Token-wise work (embedding,
    /// norms, hyper-connections, projections, MLP/MoE with the routed experts grouped over all
    /// tokens, the LM head over the wanted rows) runs once over the items' concatenated rows;
    /// GDN, attention and PLE run per sequence on its own state. A step that mixes prompt
    /// chunks of more than 8 tokens with shorter items runs as two batches (short, then long),
    /// so every row takes the path it would take alone. A decode step (one token per
    /// item) runs each mixer op as one launch for all items, from device tables of their
    /// states and positions, and, for up to 128 items of a model without PLE or QSA, replays
    /// a CUDA graph captured once per engine for the batch-size bucket (2, 4, ..., 128). The
    /// buffer stays valid until the next forward pass of the engine (batched or not).
    pub fn forward_batch_device(&self, items: &mut [CudaBatchItem<'_>]) -> Result<BatchLogits> {
        let tokens: usize = items.iter().map(|it| it.ids.len()).sum();
        if items.is_empty() || tokens > MAX_CHUNK || items.iter().any(|it| it.ids.is_empty()) {
            return Err(CudaError::BatchStep(format!(
                "a batched step takes 1 to {MAX_CHUNK} tokens in all and none of its {} items empty ({tokens} tokens given)",
                items.len()
            )));
        }
        let mut ranges = Vec::with_capacity(items.len());
        let mut row = 0;
        for it in items.iter() {
            let n = match it.want {
                LogitsFor::All => it.ids.len(),
                LogitsFor::Last => 1,
            };
            ranges.push(row..row + n);
            row += n;
        }
        let short = |it: &CudaBatchItem| it.ids.len() <= kernels::MATVEC_MAX_TOKENS;
        let mixed = items.iter().any(short) && !items.iter().all(short);
        // The batched kernels and graphs rotate at the cache index: a sequence with images
        // (pending, or a rope_delta after one) runs on its own.
        let imaged = |it: &CudaBatchItem| it.session.rope != Default::default();
        let logits = if items.len() > 1 && items.iter().any(imaged) {
            self.step_each(items, &ranges, row)?
        } else if mixed {
            self.step_in_two(items, &ranges, row)?
        } else {
            self.step(items)?
        };
        debug_assert_eq!(logits.rows, row, "the head ran over the wanted rows");
        Ok(BatchLogits {
            logits,
            ranges,
            vocab: self.config.vocab_size,
        })
    }

    /// One step over `items` as one batch (one item: [`CudaEngine::forward`]'s path).
    fn step(&self, items: &mut [CudaBatchItem<'_>]) -> Result<flow::Logits> {
        if items.len() == 1 {
            let it = &mut items[0];
            flow::forward_device(self, it.session, it.ids, it.want)
        } else {
            batch::forward_batch_device(self, items)
        }
    }

    /// A step whose items mix prompt chunks (more than MATVEC_MAX_TOKENS tokens) with
    /// decode-sized ones, as two batches: the short items (decode kernels, as each would
    /// decode alone), then the long ones (GEMMs, as each would prefill alone), their wanted
    /// rows copied into one buffer in item order (`ranges`, `rows` in all). Each weight is
    /// read twice, and no row's arithmetic depends on which kind its neighbours are.
    fn step_in_two(
        &self,
        items: &mut [CudaBatchItem<'_>],
        ranges: &[std::ops::Range<usize>],
        rows: usize,
    ) -> Result<flow::Logits> {
        let vocab = self.config.vocab_size;
        let out = self.dev.zeros::<f32>(rows * vocab)?;
        for long in [false, true] {
            let chosen: Vec<usize> = (0..items.len())
                .filter(|&n| (items[n].ids.len() > kernels::MATVEC_MAX_TOKENS) == long)
                .collect();
            let mut group: Vec<CudaBatchItem> = items
                .iter_mut()
                .enumerate()
                .filter(|(n, _)| chosen.contains(n))
                .map(|(_, it)| CudaBatchItem {
                    session: &mut *it.session,
                    ids: it.ids,
                    want: it.want,
                })
                .collect();
            let logits = self.step(&mut group)?;
            // Copied before the next step reuses the scratch the logits live in.
            let mut row = 0;
            for &n in &chosen {
                let r = &ranges[n];
                self.dev.copy_raw(
                    logits.ptr + (row * vocab * 4) as u64,
                    out.at(r.start * vocab),
                    r.len() * vocab * 4,
                )?;
                row += r.len();
            }
        }
        Ok(flow::Logits {
            ptr: out.ptr(),
            rows,
            _owned: Some(out),
        })
    }

    /// A step whose items run one after the other (each as [`CudaEngine::forward`] would run
    /// it), their wanted rows copied into one buffer in item order (`ranges`, `rows` in all).
    fn step_each(
        &self,
        items: &mut [CudaBatchItem<'_>],
        ranges: &[std::ops::Range<usize>],
        rows: usize,
    ) -> Result<flow::Logits> {
        let vocab = self.config.vocab_size;
        let out = self.dev.zeros::<f32>(rows * vocab)?;
        for (it, r) in items.iter_mut().zip(ranges) {
            let logits = flow::forward_device(self, it.session, it.ids, it.want)?;
            self.dev
                .copy_raw(logits.ptr, out.at(r.start * vocab), r.len() * vocab * 4)?;
        }
        Ok(flow::Logits {
            ptr: out.ptr(),
            rows,
            _owned: Some(out),
        })
    }

    /// Copies a batched step's logits `[rows, V]` to the host (waits for the device).
    pub fn download_logits(&self, logits: &BatchLogits) -> Result<Vec<f32>> {
        self.dev
            .download_raw::<f32>(logits.ptr(), logits.rows() * logits.vocab())
    }

    /// Copies row `row` `[V]` of a batched step's logits to the host (waits for the device).
    pub fn download_logits_row(&self, logits: &BatchLogits, row: usize) -> Result<Vec<f32>> {
        assert!(
            row < logits.rows(),
            "row {row} of {} logits rows",
            logits.rows()
        );
        self.dev
            .download_raw::<f32>(logits.row_ptr(row), logits.vocab())
    }

    /// Prefills `prompt` and decodes `steps` tokens greedily, one at a time with the cache, in
    /// the layout of the CPU backend's `Engine::greedy`.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Result<GreedyRun> {
        let mut session = self.new_session()?;
        GreedyRun::collect(
            self.config.vocab_size,
            prompt,
            steps,
            spindle_kernels::softmax::argmax,
            |ids, want| self.forward(&mut session, ids, want),
        )
    }
}

/// The vision tower of `checkpoint` on the device when the model can take images (and `wanted`),
/// else why not (the reason image prompts are refused with), as the CPU engine decides it. A
/// tower that is present but malformed is an error.
fn load_vision(
    dev: &Device,
    checkpoint: &Checkpoint,
    config: &ModelConfig,
    wanted: bool,
) -> Result<std::result::Result<GpuVision, String>> {
    let Some(vision) = &config.vision else {
        return Ok(Err(
            "this model takes no images: config.json has no vision_config".into(),
        ));
    };
    if !wanted {
        return Ok(Err(
            "the vision tower was not loaded (--no-vision): image input is off".into(),
        ));
    }
    if !spindle_model::weights::vision::has_vision_tower(checkpoint) {
        return Ok(Err(format!(
            "{} holds no vision tower (model.visual.* tensors): image input is off",
            checkpoint.dir().display()
        )));
    }
    if vision.tokens.image as usize >= config.vocab_size {
        return Ok(Err(format!(
            "image_token_id {} is outside the vocabulary (vocab_size {}): image input is off",
            vision.tokens.image, config.vocab_size
        )));
    }
    if config.rope.mrope_section.is_none() {
        return Ok(Err(
            "text_config.rope_parameters has no mrope_section (3-D positions): image input is off"
                .into(),
        ));
    }
    let weights = spindle_model::weights::load_vision(checkpoint, vision)?;
    Ok(Ok(GpuVision::upload(dev, &weights, vision)?))
}

/// Refuses shapes the kernels cannot run, by name.
/// Whether a GGUF file's quantized matrices stay in their blocks on the device (without
/// `--quant`): its decode reads them in place (about the file's size in memory), but its
/// prefill runs the decode kernels per 8 tokens, an eighth of the bf16 tensor-core GEMMs'
/// speed. So they stay blocks only when the model in bf16 would not fit in 85% of the free
/// device memory; `SPINDLE_CUDA_GGUF_BLOCKS=1` keeps them always, `=0` never.
fn gguf_blocks_wanted(dev: &Device, config: &ModelConfig, dir: &Path) -> bool {
    match std::env::var("SPINDLE_CUDA_GGUF_BLOCKS").as_deref() {
        Ok("1") => return true,
        Ok("0") => return false,
        _ => {}
    }
    if !spindle_model::gguf::is_gguf(dir) {
        return false;
    }
    let plan = spindle_model::install::plan::MemoryPlan::new(config, WeightFormat::Bf16, 0);
    let bf16: u64 = plan.classes.iter().map(|(_, bytes, _)| bytes).sum();
    let free = dev
        .context()
        .mem_get_info()
        .map_or(0, |(free, _)| free as u64);
    let blocks = bf16 > free / 100 * 85;
    tracing::info!(
        bf16_gb = bf16 as f64 / 1e9,
        free_gb = free as f64 / 1e9,
        "GGUF quantized matrices {}",
        if blocks {
            "kept in their blocks: the model in bf16 would not fit"
        } else {
            "dequantized to bf16 (faster prefill; SPINDLE_CUDA_GGUF_BLOCKS=1 keeps the blocks)"
        }
    );
    blocks
}

fn check_supported(config: &ModelConfig) -> Result<()> {
    let g = &config.gdn;
    let a = &config.attention;
    if g.key_head_dim > kernels::GDN_MAX_DK {
        return Err(CudaError::Unsupported(format!(
            "linear_key_head_dim {} exceeds the {} the GDN kernel holds in registers",
            g.key_head_dim,
            kernels::GDN_MAX_DK
        )));
    }
    if g.value_head_dim > 1024 || a.head_dim > 256 {
        return Err(CudaError::Unsupported(format!(
            "linear_value_head_dim {} (at most 1024) or head_dim {} (at most 256) is too large",
            g.value_head_dim, a.head_dim
        )));
    }
    if let Some(q) = &config.qsa {
        if q.head_dim > 1024 {
            return Err(CudaError::Unsupported(format!(
                "indexer_head_dim {} exceeds the 1024 dimensions a QSA kernel block holds (a thread each)",
                q.head_dim
            )));
        }
    }
    if config.vocab_size * config.hidden_size > i32::MAX as usize {
        return Err(CudaError::Unsupported(format!(
            "vocab_size {} × hidden_size {} overflows the kernels' 32-bit sizes",
            config.vocab_size, config.hidden_size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver, loading fails with an error that names CUDA and the way out; it does
    /// not panic. (On a GPU machine the fixture tests cover loading.)
    #[test]
    fn a_machine_without_cuda_gets_a_clear_error() {
        // SAFETY: only tries to dlopen the driver library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        let err = CudaEngine::load(Path::new("no-such-model"), 0)
            .err()
            .expect("no driver, so no engine")
            .to_string();
        assert!(
            err.contains("CUDA") && err.contains("--device cpu"),
            "{err}"
        );
    }
}
