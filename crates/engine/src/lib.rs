//! spindle's engine: loads a checkpoint, keeps per-sequence [`Session`] state and runs the
//! model flow. Every front end (CLI, server, benchmarks) drives this one API.

mod attention;
pub mod error;
pub mod ffn;
mod flow;
mod gdn;
pub mod qwen4;
pub mod sampling;
pub mod session;
pub mod weights;

use std::path::Path;

use spindle_kernels::rope::RopeFreqs;
use spindle_kernels::softmax::argmax;
use spindle_model::quant::QuantFormat;
use spindle_model::{Checkpoint, ModelConfig};

pub use error::{EngineError, Result};
pub use flow::LogitsFor;
pub use session::Session;

/// How to load a model.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Weight format of the large projections: as stored (bf16), or quantized on load.
    pub quant: QuantFormat,
    /// Called as projections are re-encoded: (done, total).
    pub progress: Option<std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>>,
}

/// A loaded model, ready to run sessions.
pub struct Engine {
    config: ModelConfig,
    weights: weights::ModelWeights,
    rope: RopeFreqs,
    /// Kept alive for the memory maps the weights point into.
    _checkpoint: Checkpoint,
}

impl Engine {
    /// Opens a Hugging Face checkpoint directory: validates `config.json`, maps the
    /// safetensors files and checks every tensor's shape.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, &LoadOptions::default())
    }

    /// [`Engine::load`] with options (weight format).
    pub fn load_with(dir: &Path, options: &LoadOptions) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        let mut weights = weights::load(&checkpoint, &config)?;
        weights.quantize(options.quant, &|done, total| {
            if let Some(progress) = &options.progress {
                progress(done, total)
            }
        });
        let rope = RopeFreqs::new(config.rope.theta, config.rope.rotary_dim);
        Ok(Engine {
            config,
            weights,
            rope,
            _checkpoint: checkpoint,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Average bytes of weights one decode step reads (see [`weights::ModelWeights::bytes_per_token`]).
    pub fn weight_bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token(self.config.moe.as_ref().map_or(0, |m| m.top_k))
    }

    pub fn new_session(&self) -> Session {
        Session::new(&self.config)
    }

    /// Feeds `ids` to the session and returns logits `[rows, V]` (row-major) for the positions
    /// `want` asks for. A prompt is one call (prefill); decoding is one call per token.
    pub fn forward(&self, session: &mut Session, ids: &[u32], want: LogitsFor) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        let vocab_size = self.config.vocab_size;
        if let Some((i, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab_size)
        {
            return Err(EngineError::InvalidToken {
                id,
                position: session.position + i,
                vocab_size,
            });
        }
        let requested = session.position + ids.len();
        if requested > self.config.max_position_embeddings {
            return Err(EngineError::ContextOverflow {
                requested,
                limit: self.config.max_position_embeddings,
            });
        }
        Ok(flow::forward(
            &self.config,
            &self.weights,
            &self.rope,
            session,
            ids,
            want,
        ))
    }

    /// Prefills `prompt` and decodes `steps` tokens greedily, one at a time with the cache.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Result<GreedyRun> {
        let vocab = self.config.vocab_size;
        let mut session = self.new_session();
        let prefill_logits = self.forward(&mut session, prompt, LogitsFor::All)?;
        let mut decode_logits = Vec::with_capacity(steps * vocab);
        let mut gen_ids = Vec::with_capacity(steps);
        let mut last = prefill_logits[prefill_logits.len() - vocab..].to_vec();
        for step in 0..steps {
            let next = argmax(&last) as u32;
            gen_ids.push(next);
            decode_logits.extend_from_slice(&last);
            if step + 1 < steps {
                last = self.forward(&mut session, &[next], LogitsFor::Last)?;
            }
        }
        Ok(GreedyRun {
            prefill_logits,
            gen_ids,
            decode_logits,
        })
    }
}

/// The result of [`Engine::greedy`], in the layout of the fixtures' `reference.safetensors`.
pub struct GreedyRun {
    /// `[T, V]`.
    pub prefill_logits: Vec<f32>,
    /// `[G]`.
    pub gen_ids: Vec<u32>,
    /// `[G, V]`: row g holds the logits `gen_ids[g]` was picked from.
    pub decode_logits: Vec<f32>,
}
