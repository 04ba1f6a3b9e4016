//! `spindle bench --device cuda`: prefill and batch-1 decode speed on the GPU, next to the
//! device's read bandwidth measured in the same run, so decode is reported as a fraction of
//! its roofline (weight bytes read per token / bandwidth).

use std::time::Instant;

use spindle_engine::LogitsFor;
use spindle_kernels::softmax::argmax;

use crate::{CudaEngine, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    /// Measured repetitions (after one warm-up).
    pub runs: usize,
    /// Bytes of the buffer the bandwidth probe reads.
    pub probe_bytes: usize,
    /// Context lengths decode is measured after (the first is the headline figure).
    pub contexts: Vec<usize>,
}

pub use spindle_engine::measure::Stat;

/// Decode speed after `context` tokens.
#[derive(Clone, Debug)]
pub struct DecodeAt {
    pub context: usize,
    pub tokens_per_s: Stat,
}

#[derive(Clone, Debug)]
pub struct BenchReport {
    pub device: String,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: usize,
    pub graphs: bool,
    pub prefill: Stat,
    pub decode: Vec<DecodeAt>,
    pub weight_bytes_per_token: usize,
    pub measured_bandwidth_bytes_per_s: f64,
    pub peak_rss_bytes: u64,
}

impl BenchReport {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prefill.median
    }

    /// Decode at the first context measured.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode.first().map_or(0.0, |d| d.tokens_per_s.median)
    }

    /// Tokens/s if every decode step only read its weights at the measured bandwidth.
    pub fn roofline_tokens_per_s(&self) -> f64 {
        self.measured_bandwidth_bytes_per_s / self.weight_bytes_per_token.max(1) as f64
    }

    pub fn decode_roofline_fraction(&self) -> f64 {
        self.decode_tokens_per_s() / self.roofline_tokens_per_s()
    }
}

pub use spindle_engine::measure::peak_rss_bytes;

fn prompt_ids(engine: &CudaEngine, n: usize) -> Vec<u32> {
    spindle_engine::measure::synthetic_prompt(engine.config().vocab_size, n)
}

/// Seconds of one prefill of `prompt` in a fresh session (logits of the last token included).
fn prefill_once(engine: &CudaEngine, prompt: &[u32]) -> Result<f64> {
    let mut session = engine.new_session_with_capacity(prompt.len() + 1)?;
    engine.sync()?;
    let started = Instant::now();
    engine.forward(&mut session, prompt, LogitsFor::Last)?;
    Ok(started.elapsed().as_secs_f64())
}

pub fn run(engine: &CudaEngine, options: &BenchOptions) -> Result<BenchReport> {
    let bandwidth = engine.measure_bandwidth(options.probe_bytes)?;
    let runs = options.runs.max(1);
    let gen = options.gen_tokens.max(1);

    let prompt = prompt_ids(engine, options.prompt_tokens.max(1));
    prefill_once(engine, &prompt)?; // warm-up
    engine.dev.profile_report()?; // drop what the warm-up recorded
    let mut prefill = Vec::new();
    for _ in 0..runs {
        prefill.push(prompt.len() as f64 / prefill_once(engine, &prompt)?);
    }
    print_profile(engine, &format!("prefill of {} tokens", prompt.len()), runs)?;
    tracing::info!(
        tokens_per_s = Stat::of(prefill.clone()).median,
        "prefill measured"
    );

    let mut decode = Vec::new();
    for &context in &options.contexts {
        let context = context.max(1);
        let ids = prompt_ids(engine, context);
        let mut session = engine.new_session_with_capacity(context + (runs + 1) * gen + 8)?;
        let logits = engine.forward(&mut session, &ids, LogitsFor::Last)?;
        let mut next = argmax(&logits) as u32;
        // Warm-up (captures the decode graph).
        for _ in 0..gen.min(8) {
            next = engine.decode_argmax(&mut session, next)?;
        }
        engine.dev.profile_report()?; // drop what the prompt and warm-up recorded
        let mut speeds = Vec::new();
        for _ in 0..runs {
            engine.sync()?;
            let started = Instant::now();
            for _ in 0..gen {
                next = engine.decode_argmax(&mut session, next)?;
            }
            speeds.push(gen as f64 / started.elapsed().as_secs_f64());
        }
        let stat = Stat::of(speeds);
        tracing::info!(context, tokens_per_s = stat.median, "decode measured");
        print_profile(
            engine,
            &format!("decode step at context {context}"),
            runs * gen,
        )?;
        decode.push(DecodeAt {
            context,
            tokens_per_s: stat,
        });
    }
    Ok(BenchReport {
        device: engine.device_name(),
        prompt_tokens: prompt.len(),
        gen_tokens: gen,
        runs,
        graphs: engine.uses_graphs(),
        prefill: Stat::of(prefill),
        decode,
        weight_bytes_per_token: engine.weight_bytes_per_token(),
        measured_bandwidth_bytes_per_s: bandwidth,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// With `SPINDLE_CUDA_PROFILE=1`: the kernel time of one of the `times` timed `what`s (a
/// prefill, a decode step) by kernel and grid, on stderr (the timed work ran without graphs,
/// one event pair per launch).
fn print_profile(engine: &CudaEngine, what: &str, times: usize) -> Result<()> {
    let lines = engine.dev.profile_report()?;
    if lines.is_empty() {
        return Ok(());
    }
    let total: f64 = lines.iter().map(|l| l.total_us).sum();
    let launches: usize = lines.iter().map(|l| l.calls).sum();
    eprintln!(
        "kernel time per {what}: {:.1} us in {} launches",
        total / times as f64,
        launches / times
    );
    for l in &lines {
        eprintln!(
            "  {:>9.1} us {:>5.1}% {:>5}x {:<20} grid {:?}",
            l.total_us / times as f64,
            100.0 * l.total_us / total,
            l.calls / times,
            l.name,
            l.grid
        );
    }
    Ok(())
}
