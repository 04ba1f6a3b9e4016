//! Flags that choose how a model is loaded, shared by every command that runs one.

use std::sync::Arc;

use clap::Args;
use spindle_cpu::experts::{CachePolicy, ExpertResidency};
use spindle_cpu::LoadOptions;
use spindle_model::install::Verify;
use spindle_model::quant::WeightFormat;

#[derive(Debug, Args, Clone)]
pub struct LoadArgs {
    /// Weight format of the large projections: bf16 (as stored), or q8 / q4 quantized on load
    /// (int8 / int4, one f16 scale per 32 weights). An install keeps the format it was
    /// converted to. Not given: as stored; a block-FP8 checkpoint then runs in FP8 on CUDA
    /// (bf16 on the CPU, dequantized exactly), and a GGUF file's quantized tensors (Q8_0, Q4_0,
    /// Q4_K, Q5_K, Q6_K) run in their own blocks on the CPU, memory-mapped (about the file's
    /// size in memory). Given: an FP8 checkpoint's projections are re-encoded; with a GGUF
    /// file, bf16 dequantizes its blocks exactly to f32 on load (several times the file's
    /// size) and q8 / q4 re-encode them (a second quantization).
    #[arg(long, value_parser = parse_quant)]
    pub quant: Option<WeightFormat>,

    /// Where the routed experts live: resident (in RAM), mapped (memory-mapped from an
    /// install; the page cache decides), streamed (a few slots per layer, misses read from an
    /// install), or auto (resident when the memory plan fits the memory available, else
    /// streamed).
    #[arg(long, default_value = "auto", value_parser = parse_residency)]
    pub experts: ExpertResidency,

    /// Expert slots per MoE layer when streamed (default: as many as memory allows).
    #[arg(long, value_name = "N")]
    pub expert_slots: Option<usize>,

    /// Which expert a full slot cache evicts: lru or lfu.
    #[arg(long, default_value = "lru", value_parser = parse_policy)]
    pub expert_policy: CachePolicy,

    /// Read streamed experts through the page cache instead of with O_DIRECT. O_DIRECT is the
    /// default: on the A3B shape under a 2 GiB memory cap it decoded 12.7 tok/s against 5.5
    /// buffered (the page cache competes with the slots for the capped memory).
    #[arg(long)]
    pub buffered_io: bool,

    /// Check the SHA-256 of every file of an install before running it (sizes are always
    /// checked); a success is recorded in the install's verified.json.
    #[arg(long)]
    pub verify: bool,

    /// Scan every stored weight for NaN and infinity before running, and refuse the first
    /// tensor holding one by name (reads the whole model once). Without it a forward pass
    /// that goes non-finite still fails, naming the layer (on the CPU).
    #[arg(long)]
    pub check_weights: bool,

    /// Leave the vision tower (`model.visual.*`) unloaded: saves its memory (about 0.9 GB on
    /// the released Qwen3.5/3.6 checkpoints); image prompts are then refused.
    #[arg(long)]
    pub no_vision: bool,

    /// Bytes the KV block pool may hold: every sequence's keys and values in blocks of 16
    /// tokens, shared by the prefix cache and the sequences that resume from it (default on the
    /// CPU: half the memory available once the weights are loaded, blocks allocated as first
    /// used; on CUDA: half the device memory free after the weights, at most a million tokens,
    /// allocated at load). When it is full a new request waits and a running one is preempted
    /// and recomputed later.
    #[arg(long, value_name = "BYTES")]
    pub kv_pool: Option<u64>,
}

fn parse_quant(s: &str) -> Result<WeightFormat, String> {
    s.parse::<WeightFormat>().map_err(|e| e.to_string())
}

fn parse_residency(s: &str) -> Result<ExpertResidency, String> {
    s.parse()
}

fn parse_policy(s: &str) -> Result<CachePolicy, String> {
    s.parse()
}

impl LoadArgs {
    /// The format `--quant` asks for (bf16 when not given).
    pub fn quant(&self) -> WeightFormat {
        self.quant.unwrap_or_default()
    }

    /// Engine options, with a progress bar while weights are quantized.
    pub fn options(&self) -> LoadOptions {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "quantizing to {msg} [{bar:30}] {pos}/{len} matrices",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message(self.quant().name());
        let progress = move |done: usize, total: usize| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            if done == total {
                bar.finish_and_clear();
            }
        };
        LoadOptions {
            quant: self.quant(),
            quant_given: self.quant.is_some(),
            gguf_blocks: self.quant.is_none(),
            progress: (self.quant() != WeightFormat::Bf16)
                .then(|| Arc::new(progress) as Arc<dyn Fn(usize, usize) + Send + Sync>),
            experts: self.experts,
            expert_slots: self.expert_slots,
            expert_policy: self.expert_policy,
            direct_io: !self.buffered_io,
            verify: if self.verify {
                Verify::Full
            } else {
                Verify::Sizes
            },
            check_weights: self.check_weights,
            no_vision: self.no_vision,
            kv_pool_bytes: self.kv_pool,
            ..LoadOptions::default()
        }
    }
}
