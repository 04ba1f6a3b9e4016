//! Aggregate decode throughput of `Engine::forward_batch` at several batch sizes (a scratch
//! measurement until `spindle bench --batch` exists).
//!
//! `cargo run --release -p spindle-cpu --example batch_decode -- MODEL [--quant q4]
//!  [--batch 1,2,4,8] [--prompt 16] [--gen 32] [--runs 3]`
//!
//! Each batch size prefills B sequences (different prompts of `--prompt` tokens, one at a
//! time), then times `--gen` greedy decode steps of all B at once; the median over `--runs`
//! is reported as B·gen / seconds. Batch 1 is also timed through `Engine::forward`. On a
//! shared machine the fastest single step (B / its seconds) is printed too: it is the
//! figure least disturbed by other processes taking the cores.

use std::path::PathBuf;
use std::time::Instant;

use spindle_cpu::{BatchItem, Engine, LoadOptions, LogitsFor, Session};
use spindle_kernels::softmax::argmax;
use spindle_model::quant::WeightFormat;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().ok().expect("a valid value"))
        .unwrap_or(default)
}

/// CPU seconds this process has used (all threads; /proc/self/stat, 10 ms ticks), so that a
/// run on a busy machine can be read as work per token as well as wall time.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = PathBuf::from(args.get(1).expect("usage: batch_decode MODEL [flags]"));
    let quant = match arg(&args, "--quant", String::from("bf16")).as_str() {
        "q4" => WeightFormat::Q4,
        "q8" => WeightFormat::Q8,
        _ => WeightFormat::Bf16,
    };
    let batches: Vec<usize> = arg(&args, "--batch", String::from("1,2,4,8"))
        .split(',')
        .map(|b| b.parse().expect("a batch size"))
        .collect();
    let prompt_len: usize = arg(&args, "--prompt", 16);
    let gen: usize = arg(&args, "--gen", 32);
    let runs: usize = arg(&args, "--runs", 3);
    let solo_runs = if args.iter().any(|a| a == "--no-solo") {
        0
    } else {
        runs
    };

    let engine = Engine::load_with(
        &model,
        &LoadOptions {
            quant,
            ..Default::default()
        },
    )
    .expect("load");
    let vocab = engine.config().vocab_size as u32;
    let prompt = |seq: usize| -> Vec<u32> {
        (0..prompt_len)
            .map(|i| ((seq * 7919 + i * 104_729 + 13) as u32) % vocab)
            .collect()
    };
    println!(
        "threads {}, prompt {prompt_len}, gen {gen}, runs {runs}",
        rayon::current_num_threads()
    );

    // Batch 1 through Engine::forward (the single-sequence entry point).
    let mut solo = Vec::new();
    let mut solo_cpu = Vec::new();
    let mut solo_best = f64::INFINITY;
    for _ in 0..solo_runs {
        let mut session = engine.new_session();
        let logits = engine
            .forward(&mut session, &prompt(0), LogitsFor::Last)
            .unwrap();
        let mut next = argmax(&logits) as u32;
        let (t, c) = (Instant::now(), cpu_seconds());
        for _ in 0..gen {
            let step = Instant::now();
            let logits = engine
                .forward(&mut session, &[next], LogitsFor::Last)
                .unwrap();
            next = argmax(&logits) as u32;
            solo_best = solo_best.min(step.elapsed().as_secs_f64());
        }
        solo.push(gen as f64 / t.elapsed().as_secs_f64());
        solo_cpu.push(gen as f64 / (cpu_seconds() - c));
    }
    if solo_runs > 0 {
        println!(
            "forward  B=1: {:.2} tok/s, fastest step {:.2} tok/s ({:.2} tok per CPU-second)",
            median(solo),
            1.0 / solo_best,
            median(solo_cpu)
        );
        // Prefill of a prompt of 8·prompt tokens through Engine::forward: the fastest of the runs.
        let long: Vec<u32> = (0..8).flat_map(prompt).collect();
        let best = (0..solo_runs)
            .map(|_| {
                let mut session = engine.new_session();
                let t = Instant::now();
                engine
                    .forward(&mut session, &long, LogitsFor::Last)
                    .unwrap();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "forward  prefill {}: fastest {:.1} tok/s",
            long.len(),
            long.len() as f64 / best
        );
    }

    let mut base = None;
    for &b in &batches {
        let mut rates = Vec::new();
        let mut per_cpu = Vec::new();
        let mut best_step = f64::INFINITY;
        for _ in 0..runs {
            let mut sessions: Vec<Session> = (0..b).map(|_| engine.new_session()).collect();
            let mut next: Vec<[u32; 1]> = sessions
                .iter_mut()
                .enumerate()
                .map(|(k, s)| {
                    let logits = engine.forward(s, &prompt(k), LogitsFor::Last).unwrap();
                    [argmax(&logits) as u32]
                })
                .collect();
            let (t, c) = (Instant::now(), cpu_seconds());
            for _ in 0..gen {
                let step = Instant::now();
                let mut items: Vec<BatchItem> = sessions
                    .iter_mut()
                    .zip(&next)
                    .map(|(session, ids)| BatchItem {
                        session,
                        ids,
                        want: LogitsFor::Last,
                    })
                    .collect();
                let results = engine.forward_batch(&mut items);
                drop(items);
                for (n, r) in next.iter_mut().zip(results) {
                    *n = [argmax(&r.unwrap()) as u32];
                }
                best_step = best_step.min(step.elapsed().as_secs_f64());
            }
            rates.push((b * gen) as f64 / t.elapsed().as_secs_f64());
            per_cpu.push((b * gen) as f64 / (cpu_seconds() - c));
        }
        let (rate, cpu) = (median(rates), median(per_cpu));
        let best = b as f64 / best_step;
        let (base, base_best) = *base.get_or_insert((rate, best));
        println!(
            "batch    B={b}: {rate:.2} tok/s aggregate ({:.2} per sequence, {:.2}x B=1); \
             fastest step {best:.2} tok/s ({:.2}x B=1's); {cpu:.2} tok per CPU-second",
            rate / b as f64,
            rate / base,
            best / base_best
        );
    }
}
