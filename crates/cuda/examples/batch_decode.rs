//! Engine-level aggregate decode throughput of batched steps on one GPU: B sequences, each
//! prefilled with `--context` pseudo-random tokens, then decoding together, one token each
//! per step (`CudaEngine::forward_batch_device`; the logits stay on the device, token ids
//! come from a fixed pseudo-random stream, so no host sampling is timed). Prints per B the
//! median of `--runs` timings of `--steps` steps.
//!
//! ```sh
//! cargo build --release -p spindle-cuda --example batch_decode
//! batch_decode MODEL_DIR [--quant bf16|q8|q4] [--batch 1,16,64] [--context 512] [--steps 32]
//!              [--runs 3] [--layers N] [--matvec-rows 128,32] [--group-launch 1,0]
//!              [--tc-decode-rows 64,16,0]
//! ```
//!
//! `--matvec-rows`, `--group-launch` and `--tc-decode-rows` measure each combination of their
//! values in one process (the batched-step matvec limit, one launch for all row groups or one
//! each, and the fewest rows of a Q8/Q4 decode matvec on the tensor cores, 0: none).

use std::path::PathBuf;
use std::time::Instant;

use spindle_cuda::{CudaBatchItem, CudaEngine};
use spindle_model::forward::LogitsFor;
use spindle_model::quant::WeightFormat;

struct Args {
    model: PathBuf,
    quant: WeightFormat,
    batches: Vec<usize>,
    context: usize,
    steps: usize,
    runs: usize,
    layers: Option<usize>,
    /// Values of `CudaEngine::set_batch_matvec_rows` to measure (None: the engine's default).
    matvec_rows: Option<Vec<usize>>,
    /// Values of `CudaEngine::set_decode_group_launch` to measure (None: the engine's default).
    group_launch: Option<Vec<bool>>,
    /// Values of `CudaEngine::set_tc_decode_rows` to measure (None: the engine's default).
    tc_decode_rows: Option<Vec<usize>>,
}

/// `1,0`-style list of switches for option `name`.
fn switches(name: &str, list: &str) -> Result<Vec<bool>, String> {
    list.split(',')
        .map(|b| match b {
            "1" => Ok(true),
            "0" => Ok(false),
            _ => Err(format!("{name} {b}: 1 or 0")),
        })
        .collect()
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        model: PathBuf::new(),
        quant: WeightFormat::Q4,
        batches: vec![1, 16, 64],
        context: 512,
        steps: 32,
        runs: 3,
        layers: None,
        matvec_rows: None,
        group_launch: None,
        tc_decode_rows: None,
    };
    let mut model = None;
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--quant" => {
                args.quant = match value()?.as_str() {
                    "bf16" => WeightFormat::Bf16,
                    "q8" => WeightFormat::Q8,
                    "q4" => WeightFormat::Q4,
                    q => return Err(format!("--quant {q}: bf16, q8 or q4")),
                }
            }
            "--batch" => {
                args.batches = value()?
                    .split(',')
                    .map(|b| b.parse().map_err(|e| format!("--batch {b}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--context" => args.context = value()?.parse().map_err(|e| format!("{e}"))?,
            "--steps" => args.steps = value()?.parse().map_err(|e| format!("{e}"))?,
            "--runs" => args.runs = value()?.parse().map_err(|e| format!("{e}"))?,
            "--matvec-rows" => {
                args.matvec_rows = Some(
                    value()?
                        .split(',')
                        .map(|b| b.parse().map_err(|e| format!("--matvec-rows {b}: {e}")))
                        .collect::<Result<_, _>>()?,
                )
            }
            "--group-launch" => args.group_launch = Some(switches(&a, &value()?)?),
            "--tc-decode-rows" => {
                args.tc_decode_rows = Some(
                    value()?
                        .split(',')
                        .map(|b| b.parse().map_err(|e| format!("--tc-decode-rows {b}: {e}")))
                        .collect::<Result<_, _>>()?,
                )
            }
            "--layers" => args.layers = Some(value()?.parse().map_err(|e| format!("{e}"))?),
            _ if model.is_none() && !a.starts_with('-') => model = Some(PathBuf::from(&a)),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    args.model = model.ok_or("usage: batch_decode MODEL_DIR [--quant q4] [--batch 1,16,64] ...")?;
    Ok(args)
}

fn next_id(state: &mut u64, vocab: usize) -> u32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 33) % vocab as u64) as u32
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let mut engine = CudaEngine::load_with(&args.model, 0, args.quant, args.layers)
        .unwrap_or_else(|e| panic!("{}: {e}", args.model.display()));
    println!(
        "{} on {}: {} layers, {}, loaded in {:.1} s; context {} per sequence, {} steps x {} runs",
        args.model.display(),
        engine.device_name(),
        engine.config().layers.len(),
        args.quant.name(),
        started.elapsed().as_secs_f64(),
        args.context,
        args.steps,
        args.runs
    );
    let settings: Vec<Option<usize>> = match &args.matvec_rows {
        Some(v) => v.iter().map(|&r| Some(r)).collect(),
        None => vec![None],
    };
    let launches: Vec<Option<bool>> = match &args.group_launch {
        Some(v) => v.iter().map(|&g| Some(g)).collect(),
        None => vec![None],
    };
    let tensor: Vec<Option<usize>> = match &args.tc_decode_rows {
        Some(v) => v.iter().map(|&g| Some(g)).collect(),
        None => vec![None],
    };
    for setting in settings {
        for &launch in &launches {
            for &tc in &tensor {
                if let Some(rows) = setting {
                    engine.set_batch_matvec_rows(rows);
                    println!("-- batched steps of up to {rows} rows as matvecs per 8 rows");
                }
                if let Some(on) = launch {
                    engine.set_decode_group_launch(on);
                    let how = if on {
                        "one launch"
                    } else {
                        "a launch per group"
                    };
                    println!("-- decode matvecs of more than 8 rows: {how}");
                }
                if let Some(rows) = tc {
                    engine.set_tc_decode_rows(rows);
                    match rows {
                        0 => println!("-- Q8/Q4 decode matvecs: dp4a"),
                        n => println!(
                            "-- Q8/Q4 decode matvecs of {} rows or more: tensor cores",
                            n.max(16)
                        ),
                    }
                }
                run_batches(&engine, &args);
            }
        }
    }
}

fn run_batches(engine: &CudaEngine, args: &Args) {
    let vocab = engine.config().vocab_size;
    let mut rng = 0x5EED_u64;
    for &b in &args.batches {
        let capacity = args.context + (args.runs + 1) * (args.steps + 4) + 8;
        let mut sessions: Vec<_> = (0..b)
            .map(|_| engine.new_session_with_capacity(capacity).unwrap())
            .collect();
        let prefill = Instant::now();
        for s in sessions.iter_mut() {
            let prompt: Vec<u32> = (0..args.context)
                .map(|_| next_id(&mut rng, vocab))
                .collect();
            engine.forward(s, &prompt, LogitsFor::Last).unwrap();
        }
        let prefill_s = prefill.elapsed().as_secs_f64();
        let mut ids: Vec<u32> = (0..b).map(|_| next_id(&mut rng, vocab)).collect();
        let mut step = |sessions: &mut [spindle_cuda::CudaSession], ids: &mut [u32]| {
            let mut items: Vec<CudaBatchItem> = sessions
                .iter_mut()
                .zip(ids.iter())
                .map(|(session, id)| CudaBatchItem {
                    session,
                    ids: std::slice::from_ref(id),
                    want: LogitsFor::Last,
                })
                .collect();
            let logits = engine.forward_batch_device(&mut items).unwrap();
            assert_eq!(logits.rows(), items.len());
            drop(logits);
            for id in ids.iter_mut() {
                *id = next_id(&mut rng, vocab);
            }
        };
        for _ in 0..4 {
            step(&mut sessions, &mut ids);
        }
        engine.sync().unwrap();
        // SPINDLE_CUDA_PROFILE=1: forget the prefill's launches, report the timed steps'.
        let _ = engine.device().profile_report();
        let mut times = Vec::new();
        for _ in 0..args.runs {
            let t = Instant::now();
            for _ in 0..args.steps {
                step(&mut sessions, &mut ids);
            }
            engine.sync().unwrap();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = times[times.len() / 2];
        let per_step_ms = 1e3 * median / args.steps as f64;
        let aggregate = (b * args.steps) as f64 / median;
        println!(
            "B={b:<4} step {per_step_ms:8.3} ms  aggregate {aggregate:9.1} tok/s  per sequence {:7.1} tok/s  (runs {:?} s; prefill of {b}x{} took {prefill_s:.2} s)",
            aggregate / b as f64,
            times.iter().map(|t| (t * 1e3).round() / 1e3).collect::<Vec<_>>(),
            args.context
        );
        if engine.device().profiling() {
            let mut by_name: std::collections::BTreeMap<&str, (usize, f64)> = Default::default();
            for k in engine.device().profile_report().unwrap() {
                let e = by_name.entry(k.name).or_default();
                e.0 += k.calls;
                e.1 += k.total_us;
            }
            let steps = (args.runs * args.steps) as f64;
            let mut lines: Vec<_> = by_name.into_iter().collect();
            lines.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            let total: f64 = lines.iter().map(|l| l.1 .1).sum::<f64>() / steps;
            println!("  profile B={b}: {total:.1} us of kernels per step");
            for (name, (calls, us)) in lines.iter().take(14) {
                println!(
                    "    {name:<36} {:7.1} us/step  {:5.1} launches/step",
                    us / steps,
                    *calls as f64 / steps
                );
            }
        }
        if b == 1 {
            // The path `spindle bench` times: a greedy step with the argmax on the device.
            let mut id = ids[0];
            let t = Instant::now();
            for _ in 0..args.steps {
                id = engine.decode_argmax(&mut sessions[0], id).unwrap();
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "B=1 decode_argmax (bench's path): {:.1} tok/s",
                args.steps as f64 / s
            );
        }
    }
}
