//! spindle's CPU backend: loads a checkpoint or install onto the host, keeps per-sequence
//! [`Session`] state and runs the model flow with `spindle_kernels`. It is the reference
//! backend and a peer of `spindle_cuda`: both build on `spindle_model`'s weight tree and
//! forward-pass types, and the front ends reach either through `spindle_runtime::Backend`.

mod attention;
pub mod batch;
pub mod error;
pub mod ffn;
mod flow;
mod gdn;
pub mod linear;
pub mod paged;
pub mod qwen4;
pub mod session;
pub mod vision;

use std::path::Path;
use std::sync::Arc;

use spindle_kernels::rope::RopeFreqs;
use spindle_kernels::softmax::argmax;
use spindle_model::install::plan::{MemoryPlan, Residency};
use spindle_model::install::{self, Install, Verify};
use spindle_model::quant::WeightFormat;
use spindle_model::{Checkpoint, ModelConfig, ModelError};

use spindle_model::experts::load::{ExpertSetup, Placement};
use spindle_model::experts::pool::ReadPool;
use spindle_model::experts::{
    CachePolicy, ExpertCounters, ExpertResidency, ExpertStats, StreamOptions,
};
use spindle_model::mrope::ImageFeatures;
use spindle_model::weights::{self, ModelWeights, VisionWeights};
use spindle_vision::PreparedImage;

pub use error::{first_non_finite_row, EngineError, NonFiniteSite, Result};
pub use linear::LinearExt;
pub use paged::KvPool;
pub use session::Session;
/// The expert provider's types live in `spindle_model::experts`; re-exported for the front ends.
pub use spindle_model::experts;
/// Backend-neutral forward-pass types (`spindle_model::forward`), re-exported for the front ends.
pub use spindle_model::forward::{GreedyRun, LogitsFor};

/// How to load a model.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Weight format of the large projections: as stored (bf16), or quantized on load.
    pub quant: WeightFormat,
    /// Run a GGUF file's quantized tensors (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K) in their ggml
    /// blocks, memory-mapped, rather than dequantized to f32 on load (then re-encoded when
    /// `quant` is q8/q4): what the CLI does when `--quant` is not given. Tensors the converter
    /// reordered are converted on load either way.
    pub gguf_blocks: bool,
    /// Called as projections are re-encoded: (done, total).
    pub progress: Option<std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>>,
    /// Where the routed experts live (streamed needs an install).
    pub experts: ExpertResidency,
    /// Expert slots per MoE layer when streamed (default: as many as memory allows).
    pub expert_slots: Option<usize>,
    /// Which expert a full slot cache evicts.
    pub expert_policy: CachePolicy,
    /// Read streamed experts with O_DIRECT (bypassing the page cache).
    pub direct_io: bool,
    /// Reader threads for streamed experts (0: the default, 4).
    pub io_threads: usize,
    /// How much of an install to check when opening it.
    pub verify: Verify,
    /// Context length the memory plan provisions for (`auto`); 0 means 4096.
    pub context: usize,
    /// Scan every stored weight for NaN and infinity before running (`--check-weights`).
    pub check_weights: bool,
    /// Leave the vision tower unloaded (`--no-vision`): image prompts are then refused.
    pub no_vision: bool,
    /// `quant` was asked for (`--quant`): a backend that runs block FP8 as stored (CUDA) then
    /// re-encodes an FP8 checkpoint's projections in `quant` instead.
    pub quant_given: bool,
    /// Bytes the KV block pool may hold (every session's keys and values, the prefix cache's
    /// blocks included). `None`: half the memory available once the weights are loaded
    /// ([`default_kv_pool_bytes`]). Blocks are allocated as first used, so a large pool costs
    /// nothing until sequences fill it. CUDA sizes its device pool by it (allocated at load;
    /// `None` there: half the device memory free after the weights, at most a million tokens).
    pub kv_pool_bytes: Option<u64>,
}

/// The KV pool's size when none is given: half the memory this process may use now
/// (MemAvailable, or the cgroup limit when lower; 4 GiB when neither can be read). Call it
/// once the weights are loaded.
pub fn default_kv_pool_bytes() -> u64 {
    spindle_model::install::plan::memory_budget().unwrap_or(4 << 30) / 2
}

/// One sequence's share of a batched step ([`Engine::forward_batch`]).
pub struct BatchItem<'a> {
    pub session: &'a mut Session,
    pub ids: &'a [u32],
    pub want: LogitsFor,
}

/// The engine's KV block pool: `options.kv_pool_bytes` (default [`default_kv_pool_bytes`]),
/// refused when it cannot hold one block.
fn kv_pool_for(config: &ModelConfig, options: &LoadOptions) -> Result<Arc<KvPool>> {
    let bytes = options.kv_pool_bytes.unwrap_or_else(default_kv_pool_bytes);
    let pool = KvPool::new(config, bytes);
    let block = pool.block_bytes() as u64;
    if options.kv_pool_bytes.is_some() && bytes < block {
        return Err(EngineError::Input(format!(
            "a KV pool of {bytes} bytes (--kv-pool) cannot hold one block of {block} bytes \
             (16 tokens of every attention layer's keys and values)"
        )));
    }
    Ok(pool)
}

/// Fraction of the available memory `auto` lets a model plan to use.
const AUTO_BUDGET_FRACTION: f64 = 0.85;

/// A loaded model, ready to run sessions.
pub struct Engine {
    config: ModelConfig,
    weights: ModelWeights,
    rope: RopeFreqs,
    /// Kept alive for the memory maps the weights point into.
    _checkpoint: Checkpoint,
    /// The install the model was opened from, if any.
    install: Option<Install>,
    placement: Placement,
    expert_counters: Arc<ExpertCounters>,
    /// The vision tower, or why image input is not available.
    vision: std::result::Result<VisionWeights, String>,
    /// Every session's keys and values, in blocks.
    kv_pool: Arc<KvPool>,
}

impl Engine {
    /// Opens a Hugging Face checkpoint directory: validates `config.json`, maps the
    /// safetensors files and checks every tensor's shape.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// [`Engine::load`] with options (weight format, expert residency). `dir` is a Hugging
    /// Face checkpoint or an install (a directory with `manifest.json`).
    pub fn load_with(dir: &Path, options: &LoadOptions) -> Result<Self> {
        if install::is_install(dir) {
            return Self::load_install(dir, options);
        }
        if options.experts == ExpertResidency::Streamed {
            return Err(ModelError::Unsupported {
                path: dir.to_owned(),
                message: "--experts streamed reads experts from an install; run `spindle convert` on this checkpoint first".into(),
            }
            .into());
        }
        let config = ModelConfig::from_dir(dir)?;
        let mut checkpoint = Checkpoint::open(dir)?;
        checkpoint.keep_blocks(options.gguf_blocks);
        if options.check_weights {
            checkpoint.check_finite()?;
        }
        let mut weights = weights::load(&checkpoint, &config)?;
        weights.quantize(options.quant, &|done, total| {
            if let Some(progress) = &options.progress {
                progress(done, total)
            }
        });
        let rope = RopeFreqs::new(config.rope.theta, config.rope.rotary_dim);
        let source = weights::Source {
            ck: &checkpoint,
            install: None,
        };
        let vision = load_vision(&source, &config, options)?;
        // A checkpoint's experts are memory-mapped (bf16) or quantized into the heap.
        let placement = match (options.experts, options.quant) {
            (ExpertResidency::Mapped, WeightFormat::Bf16) => Placement::Mapped,
            _ => Placement::Resident,
        };
        let kv_pool = kv_pool_for(&config, options)?;
        Ok(Engine {
            config,
            weights,
            rope,
            _checkpoint: checkpoint,
            install: None,
            placement,
            expert_counters: Arc::new(ExpertCounters::default()),
            vision,
            kv_pool,
        })
    }

    fn load_install(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let install = Install::open(dir, options.verify).map_err(ModelError::from)?;
        let config = install.config().clone();
        let quant = install.manifest().quant_format();
        if options.quant != WeightFormat::Bf16 && options.quant != quant {
            return Err(ModelError::Unsupported {
                path: dir.to_owned(),
                message: format!(
                    "this install holds {quant} weights; --quant {} applies to Hugging Face checkpoints (convert again to change it)",
                    options.quant
                ),
            }
            .into());
        }
        let checkpoint =
            Checkpoint::open_file(dir, &install.path_of(&install.manifest().resident.file))?;
        if options.check_weights {
            checkpoint.check_finite()?;
            spindle_model::install::scan::check_install_experts(&install)?;
        }
        let context = if options.context == 0 {
            4096
        } else {
            options.context
        };
        let plan = MemoryPlan::new(&config, quant, context)
            .with_vision_format(&config, install.manifest().vision_format());
        let placement = choose_placement(options, &plan);
        tracing::info!("{}: experts {placement:?}", dir.display());
        let counters = Arc::new(ExpertCounters::default());
        let pool = matches!(placement, Placement::Streamed(_)).then(|| {
            Arc::new(ReadPool::new(if options.io_threads == 0 {
                4
            } else {
                options.io_threads
            }))
        });
        let setup = ExpertSetup {
            placement,
            pool,
            counters: counters.clone(),
        };
        let source = weights::Source {
            ck: &checkpoint,
            install: Some((&install, &setup)),
        };
        let weights = weights::load_from(&source, &config)?;
        let rope = RopeFreqs::new(config.rope.theta, config.rope.rotary_dim);
        let vision = load_vision(&source, &config, options)?;
        let kv_pool = kv_pool_for(&config, options)?;
        Ok(Engine {
            config,
            weights,
            rope,
            _checkpoint: checkpoint,
            install: Some(install),
            placement,
            expert_counters: counters,
            vision,
            kv_pool,
        })
    }

    /// The install the model runs from, if it was opened from one.
    pub fn install(&self) -> Option<&Install> {
        self.install.as_ref()
    }

    /// Where the routed experts live (with `auto` resolved).
    pub fn expert_placement(&self) -> Placement {
        self.placement
    }

    /// Expert lookups, misses, bytes read and stall time since load or the last reset.
    pub fn expert_stats(&self) -> ExpertStats {
        self.expert_counters.snapshot()
    }

    pub fn reset_expert_stats(&self) {
        self.expert_counters.reset()
    }

    /// The live counters (for a metrics endpoint's hit-rate probe).
    pub fn expert_counters(&self) -> Arc<ExpertCounters> {
        self.expert_counters.clone()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Average bytes of weights one decode step reads (see [`ModelWeights::bytes_per_token`]).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.weights
            .bytes_per_token(self.config.moe.as_ref().map_or(0, |m| m.top_k))
    }

    /// Bytes of weights the engine holds: every tensor of [`Engine::weight_bytes_per_token`]
    /// with all routed experts and the whole embedding (for a GGUF file run in its blocks,
    /// about the file's size; dequantized, several times it).
    pub fn weight_bytes(&self) -> usize {
        let experts = self.config.moe.as_ref().map_or(0, |m| m.num_experts);
        let embed = &self.weights.embed;
        self.weights.bytes_per_token(experts) + embed.size_bytes()
            - embed.size_bytes() / embed.rows()
    }

    /// An empty session, its KV blocks to come from the engine's pool.
    pub fn new_session(&self) -> Session {
        Session::new(&self.config, &self.kv_pool)
    }

    /// The pool every session's keys and values live in.
    pub fn kv_pool(&self) -> &Arc<KvPool> {
        &self.kv_pool
    }

    /// Makes room in `session`'s block table for its tokens up to `tokens` (new blocks, and a
    /// private copy of a shared block it would write into), so the steps that feed them need
    /// no block from the pool. All or nothing: when the pool is short, the session is unchanged.
    pub fn reserve(&self, session: &mut Session, tokens: usize) -> Result<()> {
        if !Arc::ptr_eq(session.kv.pool(), &self.kv_pool) {
            return Err(EngineError::ForeignSession);
        }
        Ok(session.kv.prepare_write(session.position, tokens)?)
    }

    /// Feeds `ids` to the session and returns logits `[rows, V]` (row-major) for the positions
    /// `want` asks for. A prompt is one call (prefill); decoding is one call per token.
    ///
    /// `ids` must hold at least one token, every id below `vocab_size` (else
    /// [`EngineError::Input`]), and `session.position + ids.len()` must be within
    /// `max_position_embeddings`. Front ends run the model through
    /// `spindle_runtime::Backend::forward`, which checks all of it once for every backend.
    pub fn forward(&self, session: &mut Session, ids: &[u32], want: LogitsFor) -> Result<Vec<f32>> {
        let mut items = [BatchItem { session, ids, want }];
        let mut results = self.forward_batch(&mut items);
        results.pop().expect("one result per item")
    }

    /// One step over many sequences: each item feeds its own `ids` (one token for a decoding
    /// sequence, a prompt chunk for a prefilling one) to its own session, and gets back its own
    /// result: the logits `want` asks for, or why that sequence failed. Input is checked as
    /// for [`Engine::forward`] (which is this with one item).
    ///
    /// Token-wise work runs once over all the items' tokens (each weight is read once per step;
    /// the routed experts are grouped over the step's tokens), per-sequence work (GDN, attention,
    /// PLE) on each session's own state. A sequence whose hidden state goes non-finite fails
    /// alone; a streamed expert that cannot be read fails every item of the step. A failed
    /// step leaves a session's state part-way through, so its session is marked broken and
    /// refuses further steps; a session already broken gets its error and takes no part.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Vec<Result<Vec<f32>>> {
        let vocab = self.config.vocab_size;
        let refusal = |ids: &[u32]| match ids.iter().find(|&&id| id as usize >= vocab) {
            _ if ids.is_empty() => Some("a forward step was given no tokens".to_owned()),
            Some(id) => Some(format!(
                "token id {id} is outside the vocabulary (vocab_size {vocab})"
            )),
            None => None,
        };
        if items.iter().any(|item| refusal(item.ids).is_some()) {
            // The others run as a step of their own; the refused ones get their error.
            let mut results: Vec<Option<Result<Vec<f32>>>> = items
                .iter()
                .map(|item| refusal(item.ids).map(|why| Err(EngineError::Input(why))))
                .collect();
            let mut valid: Vec<BatchItem<'_>> = items
                .iter_mut()
                .filter(|item| refusal(item.ids).is_none())
                .map(|item| BatchItem {
                    session: &mut *item.session,
                    ids: item.ids,
                    want: item.want,
                })
                .collect();
            let mut ran = if valid.is_empty() {
                Vec::new()
            } else {
                self.forward_batch(&mut valid)
            }
            .into_iter();
            return results
                .iter_mut()
                .map(|r| {
                    r.take()
                        .unwrap_or_else(|| ran.next().expect("one result per valid item"))
                })
                .collect();
        }
        let image_token = self
            .vision
            .as_ref()
            .ok()
            .and_then(|_| self.config.vision.as_ref())
            .map(|v| v.tokens.image);
        flow::forward(
            &self.config,
            &self.weights,
            &self.rope,
            &self.kv_pool,
            image_token,
            items,
        )
    }

    /// The vision tower's weights, or why image input is not available (no `vision_config`,
    /// no `model.visual.*` tensors, `--no-vision`, ...).
    pub fn vision(&self) -> Result<(&VisionWeights, &spindle_model::VisionConfig)> {
        match (&self.vision, &self.config.vision) {
            (Ok(w), Some(c)) => Ok((w, c)),
            (Err(why), _) => Err(EngineError::Image(why.clone())),
            (Ok(_), None) => unreachable!("a tower is loaded only with a vision_config"),
        }
    }

    /// Bytes of the vision tower's weights as loaded (0 without one).
    pub fn vision_bytes(&self) -> usize {
        self.vision.as_ref().map_or(0, VisionWeights::size_bytes)
    }

    /// Runs `images` through the vision tower (shared docs `VISION.md` §3), each on its own:
    /// the features that replace their pads. An image that does not fit the tower is refused
    /// by its index.
    pub fn encode_images(&self, images: &[PreparedImage]) -> Result<Vec<Arc<ImageFeatures>>> {
        let (w, config) = self.vision()?;
        for (k, image) in images.iter().enumerate() {
            vision::check_image(config, image, k)?;
        }
        Ok(images
            .iter()
            .map(|image| Arc::new(vision::encode(w, config, image)))
            .collect())
    }

    /// [`Engine::encode_images`] for one image, keeping the tower's intermediates.
    pub fn trace_image(&self, image: &PreparedImage) -> Result<vision::TowerTrace> {
        let (w, config) = self.vision()?;
        vision::check_image(config, image, 0)?;
        Ok(vision::trace(w, config, image))
    }

    /// Queues `features` on `session`: the next `<|image_pad|>` tokens fed to it take their
    /// rows, image after image, and the positions after each image follow `VISION.md` §4.2.
    /// The prompt's pads must match (front ends check it: `spindle_runtime`'s prompt check).
    pub fn attach_images(
        &self,
        session: &mut Session,
        features: &[Arc<ImageFeatures>],
    ) -> Result<()> {
        self.vision()?;
        session
            .rope
            .queue_images(features, self.config.hidden_size)
            .map_err(EngineError::Image)
    }

    /// Prefills `prompt` and decodes `steps` tokens greedily, one at a time with the cache.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Result<GreedyRun> {
        let mut session = self.new_session();
        GreedyRun::collect(
            self.config.vocab_size,
            prompt,
            steps,
            argmax,
            |ids, want| self.forward(&mut session, ids, want),
        )
    }
}

/// The vision tower of `source` when the model can take images, else why not (the reason
/// image prompts are refused with). A tower that is present but malformed is an error.
fn load_vision(
    source: &weights::Source,
    config: &ModelConfig,
    options: &LoadOptions,
) -> Result<std::result::Result<VisionWeights, String>> {
    let Some(vision) = &config.vision else {
        return Ok(Err(
            "this model takes no images: config.json has no vision_config".into(),
        ));
    };
    if options.no_vision {
        return Ok(Err(
            "the vision tower was not loaded (--no-vision): image input is off".into(),
        ));
    }
    if !weights::vision::has_vision_tower(source.ck) {
        return Ok(Err(format!(
            "{} holds no vision tower (model.visual.* tensors): image input is off",
            source.ck.dir().display()
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
    Ok(Ok(weights::vision::load_vision_from(source, vision)?))
}

/// Resolves `--experts` for an install: `auto` keeps every expert resident when the plan fits
/// the memory available, else streams with as many slots as fit.
fn choose_placement(options: &LoadOptions, plan: &MemoryPlan) -> Placement {
    let budget = spindle_model::install::plan::memory_budget()
        .map(|b| (b as f64 * AUTO_BUDGET_FRACTION) as u64);
    let streamed = |slots: Option<usize>| {
        let slots = slots
            .or_else(|| budget.and_then(|b| plan.slots_within(b)))
            .unwrap_or(plan.top_k.max(1))
            .clamp(1, plan.experts_per_layer.max(1));
        Placement::Streamed(StreamOptions {
            slots,
            policy: options.expert_policy,
            direct_io: options.direct_io,
        })
    };
    match options.experts {
        ExpertResidency::Resident => Placement::Resident,
        ExpertResidency::Mapped => Placement::Mapped,
        ExpertResidency::Streamed => streamed(options.expert_slots),
        ExpertResidency::Auto => match budget {
            Some(b) if plan.moe_layers > 0 && plan.peak_rss(Residency::Resident) > b => {
                streamed(options.expert_slots)
            }
            _ => Placement::Resident,
        },
    }
}
