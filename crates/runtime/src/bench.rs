//! Measurements for `spindle bench`: prefill and decode speed of the engine, next to the
//! machine's memory bandwidth measured in the same run, so decode is reported as a fraction of
//! its roofline (weight bytes read per token / bandwidth).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;
use spindle_engine::{Engine, LogitsFor};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    /// Measured repetitions (after one warm-up).
    pub runs: usize,
    /// Bytes of the buffer the bandwidth probe reads (far larger than the caches).
    pub probe_bytes: usize,
}

pub use spindle_engine::measure::Stat;

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub runs: usize,
    pub threads: usize,
    pub prefill_tokens_per_s: f64,
    pub prefill: Stat,
    pub decode_tokens_per_s: f64,
    pub decode: Stat,
    pub weight_bytes_per_token: usize,
    pub measured_bandwidth_bytes_per_s: f64,
    /// Decode speed as a fraction of weight_bytes_per_token / measured bandwidth.
    pub decode_roofline_fraction: f64,
    pub peak_rss_bytes: u64,
}

/// Read bandwidth: the median of several parallel passes summing a buffer, bytes per second.
/// (Median, not best: on a shared virtual machine a single pass now and then reads 40% faster
/// than the rest, which no decode step sees.)
pub fn measure_read_bandwidth(bytes: usize) -> f64 {
    let words = bytes / 8;
    let buffer: Vec<u64> = (0..words as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9E37_79B9))
        .collect();
    let chunk = (words / (rayon::current_num_threads() * 8)).max(1 << 12);
    let mut passes = Vec::new();
    for _ in 0..7 {
        let start = Instant::now();
        let sum: u64 = buffer
            .par_chunks(chunk)
            .map(|c| {
                // Eight independent accumulators so the loop is bound by loads, not adds.
                let mut acc = [0u64; 8];
                for block in c.chunks_exact(8) {
                    for i in 0..8 {
                        acc[i] = acc[i].wrapping_add(block[i]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, u64::wrapping_add);
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        passes.push((words * 8) as f64 / secs);
    }
    passes.sort_by(f64::total_cmp);
    passes[passes.len() / 2]
}

pub use spindle_engine::measure::peak_rss_bytes;

fn prompt_ids(engine: &Engine, n: usize) -> Vec<u32> {
    spindle_engine::measure::synthetic_prompt(engine.config().vocab_size, n)
}

/// One prefill of `prompt` and `gen` greedy decode steps; returns (prefill s, decode s).
fn one_run(engine: &Engine, prompt: &[u32], gen: usize) -> spindle_engine::Result<(f64, f64)> {
    let mut session = engine.new_session();
    let start = Instant::now();
    let logits = engine.forward(&mut session, prompt, LogitsFor::Last)?;
    let prefill = start.elapsed().as_secs_f64();
    let mut next = spindle_kernels_argmax(&logits);
    let start = Instant::now();
    for _ in 0..gen {
        let logits = engine.forward(&mut session, &[next], LogitsFor::Last)?;
        next = spindle_kernels_argmax(&logits);
    }
    Ok((prefill, start.elapsed().as_secs_f64()))
}

fn spindle_kernels_argmax(logits: &[f32]) -> u32 {
    spindle_kernels::softmax::argmax(logits) as u32
}

pub fn run(engine: &Engine, options: &BenchOptions) -> spindle_engine::Result<BenchReport> {
    let bandwidth = measure_read_bandwidth(options.probe_bytes);
    let prompt = prompt_ids(engine, options.prompt_tokens);
    one_run(engine, &prompt, options.gen_tokens.min(4))?;
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for _ in 0..options.runs.max(1) {
        let (p, d) = one_run(engine, &prompt, options.gen_tokens)?;
        prefill.push(options.prompt_tokens as f64 / p);
        decode.push(options.gen_tokens as f64 / d.max(1e-12));
    }
    let prefill = Stat::of(prefill);
    let decode = Stat::of(decode);
    let bytes = engine.weight_bytes_per_token();
    let roofline_tokens_per_s = bandwidth / bytes as f64;
    Ok(BenchReport {
        prompt_tokens: options.prompt_tokens,
        gen_tokens: options.gen_tokens,
        runs: options.runs.max(1),
        threads: rayon::current_num_threads(),
        prefill_tokens_per_s: prefill.median,
        prefill,
        decode_tokens_per_s: decode.median,
        decode_roofline_fraction: decode.median / roofline_tokens_per_s,
        decode,
        weight_bytes_per_token: bytes,
        measured_bandwidth_bytes_per_s: bandwidth,
        peak_rss_bytes: peak_rss_bytes(),
    })
}
