//! The memory plan: bytes per tensor class in the formats a model is run with, the session
//! state at a context length, and the peak resident memory each expert residency needs.
//! `spindle inspect` prints it and `--experts auto` chooses from it.

use crate::config::{MixerKind, ModelConfig};
use crate::layout::{checkpoint_tensors, ExpertKeys, TensorClass};
use crate::quant::WeightFormat;

/// Process memory beyond weights and state: the binary, thread stacks, allocator slack and
/// the forward pass's work buffers (measured with `spindle bench`: about 20 MB on the CPU backend).
pub const BASE_OVERHEAD_BYTES: u64 = 20 << 20;

/// Where the routed experts live while the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    Resident,
    Mapped,
    Streamed { slots: usize },
}

#[derive(Clone, Debug)]
pub struct MemoryPlan {
    /// `(class, bytes, format)` in the formats the model runs with.
    pub classes: Vec<(TensorClass, u64, String)>,
    /// Bytes a decode step keeps touching besides the routed experts (all weights but the
    /// embedding and n-gram table, which are read a few rows per token).
    pub dense_bytes: u64,
    pub expert_bytes: u64,
    /// Bytes of one expert (gate, up, down) as stored, and its page-aligned record.
    pub bytes_per_expert: u64,
    pub record_bytes: u64,
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    pub top_k: usize,
    /// KV cache and GDN/PLE state of one session at `context` tokens.
    pub state_bytes: u64,
    pub context: usize,
    /// Largest decode-time work buffers (the logits row, the hidden rows): small next to the rest.
    pub work_bytes: u64,
    /// The vision tower (`vision_config`) as the CPU engine loads it (installs keep it bf16),
    /// read only when an image is encoded. Counted whenever config.json has a tower:
    /// `--no-vision` needs this much less.
    pub vision_bytes: u64,
}

impl MemoryPlan {
    /// The plan for `config` with the large projections in `quant` (the routed experts too),
    /// one session of `context` tokens.
    pub fn new(config: &ModelConfig, quant: WeightFormat, context: usize) -> Self {
        let mut classes: std::collections::BTreeMap<TensorClass, (u64, String)> =
            Default::default();
        for t in checkpoint_tensors(config, ExpertKeys::Fused) {
            let cols = *t.shape.last().unwrap_or(&1);
            let rows = t.elements() / cols.max(1);
            let quantized = quant != WeightFormat::Bf16 && quant.fits(cols) && t.quantizable;
            let element = match t.dtype {
                crate::layout::SpecDtype::F32 => 4,
                crate::layout::SpecDtype::I64 => 8,
                crate::layout::SpecDtype::Bf16 => 2,
            };
            let (bytes, format) = if quantized {
                (
                    quant.matrix_bytes(rows, cols).unwrap_or(0) as u64,
                    quant.name(),
                )
            } else {
                ((t.elements() * element) as u64, "bf16")
            };
            let entry = classes.entry(t.class).or_insert((0, String::new()));
            entry.0 += bytes;
            if !entry.1.split('+').any(|f| f == format) {
                if !entry.1.is_empty() {
                    entry.1.push('+');
                }
                entry.1.push_str(format);
            }
        }
        if config.tie_word_embeddings && quant != WeightFormat::Bf16 {
            // The tied head is quantized apart from the embedding.
            let head = quant
                .matrix_bytes(config.vocab_size, config.hidden_size)
                .unwrap_or(0) as u64;
            classes.insert(TensorClass::LmHead, (head, quant.name().into()));
        }
        let bytes_of = |c: TensorClass| classes.get(&c).map_or(0, |e| e.0);
        let total: u64 = classes.values().map(|e| e.0).sum();
        let mut dense_bytes =
            total - bytes_of(TensorClass::RoutedExperts) - bytes_of(TensorClass::NgramTable);
        if !(config.tie_word_embeddings && quant == WeightFormat::Bf16) {
            dense_bytes -= bytes_of(TensorClass::Embedding);
        }

        let (moe_layers, experts_per_layer, top_k, bytes_per_expert, record_bytes) =
            match &config.moe {
                Some(m) => {
                    let layers = config
                        .layers
                        .iter()
                        .filter(|l| l.ffn == crate::FfnKind::Moe)
                        .count();
                    let (i, h) = (m.expert_intermediate, config.hidden_size);
                    let part = |rows: usize, cols: usize| {
                        let f = if quant.fits(cols) {
                            quant
                        } else {
                            WeightFormat::Bf16
                        };
                        (
                            f.code_bytes(rows, cols) as u64,
                            f.scale_bytes(rows, cols) as u64,
                        )
                    };
                    let parts = [part(i, h), part(i, h), part(h, i)];
                    let raw: u64 = parts.iter().map(|(c, s)| c + s).sum();
                    let align = |x: u64| x.div_ceil(64) * 64;
                    let record: u64 = parts.iter().map(|(c, s)| align(*c) + align(*s)).sum();
                    (
                        layers,
                        m.num_experts,
                        m.top_k,
                        raw,
                        record.div_ceil(super::PAGE) * super::PAGE,
                    )
                }
                None => (0, 0, 0, 0, 0),
            };
        let expert_bytes = bytes_of(TensorClass::RoutedExperts);
        MemoryPlan {
            classes: classes.into_iter().map(|(c, (b, f))| (c, b, f)).collect(),
            dense_bytes,
            expert_bytes,
            bytes_per_expert,
            record_bytes,
            moe_layers,
            experts_per_layer,
            top_k,
            state_bytes: state_bytes(config, context),
            context,
            work_bytes: (config.vocab_size * 4 * 2 + config.hidden_size * 64 * 4) as u64,
            vision_bytes: config
                .vision
                .as_ref()
                .map_or(0, |v| v.loaded_bytes() as u64),
        }
    }

    /// This plan with the vision tower counted as an install holds it: its block and merger
    /// matrices in `format` ([`super::Manifest::vision_format`]).
    pub fn with_vision_format(mut self, config: &ModelConfig, format: WeightFormat) -> Self {
        self.vision_bytes = config
            .vision
            .as_ref()
            .map_or(0, |v| v.loaded_bytes_as(format) as u64);
        self
    }

    /// Peak resident memory (bytes) one session needs with the experts in `residency`. For
    /// `Mapped` this is the upper bound, every expert page cached; the kernel may keep fewer.
    pub fn peak_rss(&self, residency: Residency) -> u64 {
        let base = BASE_OVERHEAD_BYTES
            + self.dense_bytes
            + self.state_bytes
            + self.work_bytes
            + self.vision_bytes;
        base + match residency {
            Residency::Resident | Residency::Mapped => self.expert_bytes,
            Residency::Streamed { slots } => self.streamed_bytes(slots),
        }
    }

    /// Memory of `slots` expert slots in every MoE layer.
    pub fn streamed_bytes(&self, slots: usize) -> u64 {
        self.record_bytes * (slots.min(self.experts_per_layer) * self.moe_layers) as u64
    }

    /// The most slots per layer that fit in `budget` bytes (at least top-k), or None when not
    /// even that many fit.
    pub fn slots_within(&self, budget: u64) -> Option<usize> {
        let fixed = self.peak_rss(Residency::Streamed { slots: 0 });
        let per_slot = self.record_bytes * self.moe_layers as u64;
        if per_slot == 0 || budget < fixed {
            return None;
        }
        let slots = (((budget - fixed) / per_slot) as usize).min(self.experts_per_layer);
        (slots >= self.top_k.max(1)).then_some(slots)
    }
}

/// KV cache (f32 keys and values of the full-attention layers, plus QSA's indexer keys) and
/// the GDN conv and recurrent state, at `context` tokens.
pub fn state_bytes(config: &ModelConfig, context: usize) -> u64 {
    let a = &config.attention;
    let g = &config.gdn;
    let mut total = 0u64;
    for layer in &config.layers {
        total += match layer.mixer {
            MixerKind::FullAttention => {
                let indexer = config.qsa.as_ref().map_or(0, |q| q.head_dim);
                ((2 * a.num_kv_heads * a.head_dim + indexer) * context * 4) as u64
            }
            MixerKind::LinearAttention => {
                (((g.conv_kernel - 1) * g.conv_channels()
                    + g.num_value_heads * g.key_head_dim * g.value_head_dim)
                    * 4) as u64
            }
        };
    }
    if let Some(ple) = &config.ple {
        let streams = config.hyper.as_ref().map_or(1, |h| h.streams);
        total += (ple.layers.len() * ple.conv_kernel * streams * config.hidden_size * 4) as u64;
    }
    total
}

/// MemAvailable from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The memory limit of this process's cgroup: v2 `memory.max`, or v1
/// `memory.limit_in_bytes`, when one is set.
pub fn cgroup_limit() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let limit = |file: String| {
        std::fs::read_to_string(file)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    let v1 = cgroup.lines().find_map(|l| {
        let (_, rest) = l.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.trim().to_owned())
    });
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned());
    v1.and_then(|p| limit(format!("/sys/fs/cgroup/memory{p}/memory.limit_in_bytes")))
        .or_else(|| v2.and_then(|p| limit(format!("/sys/fs/cgroup{p}/memory.max"))))
        // An unlimited v1 group reports a number near 2^63.
        .filter(|&l| l < 1 << 60)
}

/// Memory this process may use: MemAvailable, or the cgroup limit when lower.
pub fn memory_budget() -> Option<u64> {
    match (mem_available(), cgroup_limit()) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

impl MemoryPlan {
    /// [`MemoryPlan::new`] with its arithmetic checked: `None` when the state at `context`
    /// tokens, or a peak RSS of the plan, would not fit in 64 bits of bytes (a `--context`
    /// far beyond any machine, e.g. 2^60, which wrapped around before this check).
    pub fn checked(config: &ModelConfig, quant: WeightFormat, context: usize) -> Option<Self> {
        checked_state_bytes(config, context)?;
        let plan = Self::new(config, quant, context);
        let all_slots = plan
            .record_bytes
            .checked_mul(plan.experts_per_layer.checked_mul(plan.moe_layers)? as u64)?;
        BASE_OVERHEAD_BYTES
            .checked_add(plan.dense_bytes)?
            .checked_add(plan.state_bytes)?
            .checked_add(plan.work_bytes)?
            .checked_add(plan.vision_bytes)?
            .checked_add(plan.expert_bytes.max(all_slots))?;
        Some(plan)
    }
}

/// [`state_bytes`] with checked arithmetic: `None` on overflow.
pub fn checked_state_bytes(config: &ModelConfig, context: usize) -> Option<u64> {
    let a = &config.attention;
    let indexer = config.qsa.as_ref().map_or(0, |q| q.head_dim);
    let per_token = (2 * a.num_kv_heads * a.head_dim + indexer) as u64 * 4;
    let mut total = 0u64;
    for layer in &config.layers {
        if layer.mixer == MixerKind::FullAttention {
            total = total.checked_add(per_token.checked_mul(context as u64)?)?;
        }
    }
    // The rest does not depend on the context: add it as state_bytes at one token does.
    let fixed = state_bytes(config, 0);
    total.checked_add(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_q8_tower_is_counted_at_q8() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/configs/qwen3_6_35b_a3b.config.json"
        ));
        let config =
            ModelConfig::from_json_str(&std::fs::read_to_string(path).unwrap(), path).unwrap();
        let v = config.vision.as_ref().unwrap();
        let bf16 = MemoryPlan::new(&config, WeightFormat::Bf16, 4096);
        let q8 = MemoryPlan::new(&config, WeightFormat::Bf16, 4096)
            .with_vision_format(&config, WeightFormat::Q8);
        // q8 stores 1 + 2/32 bytes per weight where rows are whole groups of 32: every block
        // matrix but fc2 (4304 columns) and both merger matrices; the patch embedding stays.
        let (d, i) = (v.hidden, v.intermediate);
        let wide = 4 * d;
        let q8_weights = v.depth * (3 * d * d + d * d + i * d) + wide * wide + v.out_hidden * wide;
        let saved = q8_weights as f64 * (2.0 - 1.0625);
        assert_eq!((bf16.vision_bytes - q8.vision_bytes) as f64, saved);
        assert_eq!(
            MemoryPlan::new(&config, WeightFormat::Bf16, 4096)
                .with_vision_format(&config, WeightFormat::Bf16)
                .vision_bytes,
            bf16.vision_bytes
        );
    }

    #[test]
    fn the_plan_counts_the_released_vision_tower() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/configs/qwen3_6_35b_a3b.config.json"
        ));
        let config = ModelConfig::from_file(path).unwrap();
        let vision = config.vision.as_ref().unwrap();
        // VISION.md §1.4: 15,239,504 per block, 446.6 M in all with out_hidden 2048.
        assert_eq!(vision.parameters(), 446_571_248);
        let plan = MemoryPlan::new(&config, WeightFormat::Bf16, 4096);
        // Mostly bf16 matrices (2 bytes), a few f32 vectors: 0.89-0.91 GB.
        assert!(
            (890_000_000..910_000_000).contains(&plan.vision_bytes),
            "{}",
            plan.vision_bytes
        );
        let mut text_only = config.clone();
        text_only.vision = None;
        let without = MemoryPlan::new(&text_only, WeightFormat::Bf16, 4096);
        assert_eq!(
            plan.peak_rss(Residency::Resident) - without.peak_rss(Residency::Resident),
            plan.vision_bytes
        );
    }
}
