//! `spindle bench` on any backend: prefill speed, batch-1 greedy decode speed after each
//! context length asked for, next to the memory bandwidth measured in the same run, so decode
//! is reported as a fraction of its roofline (weight bytes read per token / bandwidth), and
//! the process's peak memory. Everything runs through [`Backend`]: the probe, the decode step
//! (a device argmax on CUDA) and the kernel profile are the backend's.

mod batch;

use std::time::Instant;

pub use crate::measure::{
    measure_read_bandwidth, peak_rss_bytes, synthetic_prompt, KernelTime, Stat,
};
pub use batch::{
    run_batch, run_constrained, run_scheduled, BatchBenchOptions, BatchDecode, ConstrainedDecode,
    ScheduledDecode,
};
use serde::Serialize;
use spindle_cpu::LogitsFor;
use spindle_kernels::softmax::argmax;

use crate::backend::Backend;
use crate::error::Result;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    /// Measured repetitions (after one warm-up).
    pub runs: usize,
    /// Bytes of the buffer the bandwidth probe reads (far larger than the caches).
    pub probe_bytes: usize,
    /// Context lengths decode is measured after (the first is the headline figure); empty
    /// means after `prompt_tokens`.
    pub contexts: Vec<usize>,
}

/// Decode speed after `context` tokens.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeAt {
    pub context: usize,
    pub tokens_per_s: Stat,
}

/// The kernel time of one kind of work (a prefill, a decode step), by kernel and grid: CUDA
/// with `SPINDLE_CUDA_PROFILE=1` only.
#[derive(Clone, Debug)]
pub struct KernelProfile {
    /// What was timed, e.g. `prefill of 512 tokens`.
    pub what: String,
    /// How many of `what` the lines add up (the figures per one are the totals / `times`).
    pub times: usize,
    pub lines: Vec<KernelTime>,
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    /// The processor by name (`cpu`, or the GPU's).
    pub device: String,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: usize,
    /// Threads of the CPU engine's pool.
    pub threads: usize,
    /// Decode steps replayed a CUDA graph.
    pub graphs: bool,
    pub prefill: Stat,
    /// One entry per context, in the order asked.
    pub decode: Vec<DecodeAt>,
    pub weight_bytes_per_token: usize,
    pub measured_bandwidth_bytes_per_s: f64,
    /// The process's peak resident memory before the bandwidth probe (which runs last).
    pub peak_rss_bytes: u64,
    /// Empty unless the backend profiles its kernels.
    pub profiles: Vec<KernelProfile>,
}

impl BenchReport {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prefill.median
    }

    /// Decode after the first context measured.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode.first().map_or(0.0, |d| d.tokens_per_s.median)
    }

    /// Tokens/s if every decode step only read its weights at the measured bandwidth.
    pub fn roofline_tokens_per_s(&self) -> f64 {
        self.measured_bandwidth_bytes_per_s / self.weight_bytes_per_token.max(1) as f64
    }

    /// Decode after the first context as a fraction of the roofline.
    pub fn decode_roofline_fraction(&self) -> f64 {
        self.decode_tokens_per_s() / self.roofline_tokens_per_s()
    }
}

/// Seconds of one prefill of `prompt` in a fresh session (logits of the last token included).
fn prefill_once(backend: &Backend, prompt: &[u32]) -> Result<f64> {
    let mut session = backend.new_session_with_capacity(prompt.len() + 1)?;
    backend.sync()?;
    let started = Instant::now();
    backend.forward(&mut session, prompt, LogitsFor::Last)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Measures `backend` as `options` asks. Prefill: one warm-up, then `runs` prefills of the
/// prompt, each in a fresh session. Decode, for each context: a fresh session prefilled with
/// `context` tokens, a few warm-up steps (on CUDA they capture the decode graph), then `runs`
/// timed stretches of `gen_tokens` greedy steps continuing that sequence.
///
/// The peak RSS is read before the bandwidth probe runs (last), so it is the model's and its
/// runs' memory, not the probe's buffer (1 GiB by default).
pub fn run(backend: &Backend, options: &BenchOptions) -> Result<BenchReport> {
    let runs = options.runs.max(1);
    let gen = options.gen_tokens.max(1);
    let vocab = backend.config().vocab_size;
    let mut profiles = Vec::new();
    let mut profile = |what: String, times: usize| -> Result<()> {
        let lines = backend.kernel_profile()?;
        if !lines.is_empty() {
            profiles.push(KernelProfile { what, times, lines });
        }
        Ok(())
    };

    let prompt = synthetic_prompt(vocab, options.prompt_tokens.max(1));
    prefill_once(backend, &prompt)?; // warm-up
    backend.kernel_profile()?; // drop what the warm-up recorded
    let mut prefill = Vec::new();
    for _ in 0..runs {
        prefill.push(prompt.len() as f64 / prefill_once(backend, &prompt)?);
    }
    profile(format!("prefill of {} tokens", prompt.len()), runs)?;
    let prefill = Stat::of(prefill);
    tracing::info!(tokens_per_s = prefill.median, "prefill measured");

    let contexts = if options.contexts.is_empty() {
        vec![options.prompt_tokens]
    } else {
        options.contexts.clone()
    };
    let mut decode = Vec::new();
    for context in contexts {
        let context = context.max(1);
        let ids = synthetic_prompt(vocab, context);
        let mut session = backend.new_session_with_capacity(context + (runs + 1) * gen + 8)?;
        let logits = backend.forward(&mut session, &ids, LogitsFor::Last)?;
        let mut next = argmax(&logits) as u32;
        // Warm-up (captures the decode graph).
        for _ in 0..gen.min(8) {
            next = backend.decode_greedy(&mut session, next)?;
        }
        backend.kernel_profile()?; // drop what the prompt and warm-up recorded
        let mut speeds = Vec::new();
        for _ in 0..runs {
            backend.sync()?;
            let started = Instant::now();
            for _ in 0..gen {
                next = backend.decode_greedy(&mut session, next)?;
            }
            speeds.push(gen as f64 / started.elapsed().as_secs_f64());
        }
        let tokens_per_s = Stat::of(speeds);
        tracing::info!(
            context,
            tokens_per_s = tokens_per_s.median,
            "decode measured"
        );
        profile(format!("decode step at context {context}"), runs * gen)?;
        decode.push(DecodeAt {
            context,
            tokens_per_s,
        });
    }
    let peak_rss = peak_rss_bytes();
    let bandwidth = backend.measure_bandwidth(options.probe_bytes)?;
    Ok(BenchReport {
        device: backend.device_name(),
        prompt_tokens: prompt.len(),
        gen_tokens: gen,
        runs,
        threads: rayon::current_num_threads(),
        graphs: backend.uses_graphs(),
        prefill,
        decode,
        weight_bytes_per_token: backend.weight_bytes_per_token(),
        measured_bandwidth_bytes_per_s: bandwidth,
        peak_rss_bytes: peak_rss,
        profiles,
    })
}
