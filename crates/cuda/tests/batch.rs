//! Batched forward steps (`CudaEngine::forward_batch`, `forward_batch_device`) against each
//! sequence run alone: on every fixture, at bf16, q8 and q4, batches of sequences that differ
//! (prompt chunks mixed with decodes, a sequence joining mid-way, one finishing early, steps
//! of more than `MATVEC_MAX_TOKENS` decoding sequences) give every sequence the logits of its
//! solo run within 1e-4 and the same greedy tokens; steps of decoding sequences only (24
//! and 40 of them at the default setting: the projections and the LM head as decode matvecs,
//! one launch for all rows; the MoE blocks' experts grouped) give the solo run's logits bit
//! for bit. (With the projections of steps above 32 rows on the tensor-core GEMM, the
//! default before 2026-12-02, 40 decoding sequences moved q8 logits by up to 0.055 and q4 by
//! up to 0.067 on these fixtures, H200 2026-12-02: that route is no longer taken by steps of
//! up to 128 rows, see docs/benchmarks/cuda-h200.md.)
//! Decode-only steps replay the engine's
//! bucket graphs (padded to 4, 16, 32 and 64 rows here) where the model allows, and run eagerly from
//! the device tables with graphs off.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test batch -- --ignored`.

use spindle_cuda::{CudaBatchItem, CudaEngine};
use spindle_model::forward::LogitsFor;
use spindle_model::quant::WeightFormat;

/// Bound on max |Δlogit| between a sequence in a batch and the same sequence alone.
const TOLERANCE: f32 = 1e-4;

const FAMILIES: [&str; 5] = [
    "qwen3_next_moe",
    "qwen3_5_dense",
    "qwen3_5_moe",
    "qwen3_5_moe_fused",
    "qwen4_exp",
];

fn device_ordinal() -> usize {
    std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One sequence of a scenario: joins at step `join`, feeds its prompt in `chunks` (one per
/// step, asking for every row's logits where `all` says so, else the last), then decodes its
/// greedy token one per step until step `leave` (exclusive).
struct Plan {
    prompt: Vec<u32>,
    chunks: Vec<usize>,
    all: Vec<bool>,
    join: usize,
    leave: usize,
}

/// Per sequence, per step it took part in: the logits it got.
type Trace = Vec<Vec<Vec<f32>>>;

fn pseudo_random(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    spindle_kernels::softmax::argmax(row) as u32
}

/// The ids and `want` of sequence `plan` at step `step`, given its greedy tokens so far, or
/// None when it does not take part.
fn step_input(plan: &Plan, step: usize, last_token: Option<u32>) -> Option<(Vec<u32>, LogitsFor)> {
    if step < plan.join || step >= plan.leave {
        return None;
    }
    let k = step - plan.join;
    if k < plan.chunks.len() {
        let from: usize = plan.chunks[..k].iter().sum();
        let ids = plan.prompt[from..from + plan.chunks[k]].to_vec();
        let want = if plan.all[k] {
            LogitsFor::All
        } else {
            LogitsFor::Last
        };
        return Some((ids, want));
    }
    Some((
        vec![last_token.expect("a decode follows the prompt")],
        LogitsFor::Last,
    ))
}

/// Runs the scenario with every step batched (`batched`) or each sequence alone, returning
/// each sequence's logits per step and its greedy tokens.
fn run(engine: &CudaEngine, plans: &[Plan], batched: bool) -> (Trace, Vec<Vec<u32>>) {
    let vocab = engine.config().vocab_size;
    let steps = plans.iter().map(|p| p.leave).max().unwrap();
    let mut sessions: Vec<_> = plans
        .iter()
        .map(|_| engine.new_session().unwrap())
        .collect();
    let mut trace: Trace = plans.iter().map(|_| Vec::new()).collect();
    let mut tokens: Vec<Vec<u32>> = plans.iter().map(|_| Vec::new()).collect();
    for step in 0..steps {
        let inputs: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(n, p)| step_input(p, step, tokens[n].last().copied()))
            .collect();
        let active: Vec<usize> = (0..plans.len()).filter(|&n| inputs[n].is_some()).collect();
        let results: Vec<Vec<f32>> = if batched {
            let mut items: Vec<CudaBatchItem> = Vec::new();
            for (n, session) in sessions.iter_mut().enumerate() {
                if let Some((ids, want)) = &inputs[n] {
                    items.push(CudaBatchItem {
                        session,
                        ids,
                        want: *want,
                    });
                }
            }
            engine
                .forward_batch(&mut items)
                .into_iter()
                .map(|r| r.unwrap())
                .collect()
        } else {
            active
                .iter()
                .map(|&n| {
                    let (ids, want) = inputs[n].as_ref().unwrap();
                    engine.forward(&mut sessions[n], ids, *want).unwrap()
                })
                .collect()
        };
        for (&n, logits) in active.iter().zip(results) {
            let (ids, want) = inputs[n].as_ref().unwrap();
            let rows = match want {
                LogitsFor::All => ids.len(),
                LogitsFor::Last => 1,
            };
            assert_eq!(logits.len(), rows * vocab, "sequence {n} step {step}: rows");
            let k = step - plans[n].join;
            if k + 1 >= plans[n].chunks.len() {
                // The prompt is in: the last row gives the next token.
                tokens[n].push(argmax(&logits[(rows - 1) * vocab..]));
            }
            trace[n].push(logits);
        }
    }
    (trace, tokens)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).fold(0.0, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

/// Mixed prefill and decode: A prefills at once and asks for every row, B prefills in two
/// chunks beside A's prefill and decodes, D decodes and finishes early, C joins at step 3.
fn mixed(prompt: &[u32], vocab: usize) -> Vec<Plan> {
    let b = pseudo_random(70, vocab, 7);
    let c: Vec<u32> = prompt[..5]
        .iter()
        .map(|&t| (t + 1) % vocab as u32)
        .collect();
    let d = pseudo_random(12, vocab, 11);
    vec![
        Plan {
            chunks: vec![prompt.len()],
            all: vec![true],
            prompt: prompt.to_vec(),
            join: 0,
            leave: 9,
        },
        Plan {
            chunks: vec![20, 50],
            all: vec![false, true],
            prompt: b,
            join: 0,
            leave: 9,
        },
        Plan {
            chunks: vec![5],
            all: vec![false],
            prompt: c,
            join: 3,
            leave: 9,
        },
        Plan {
            chunks: vec![7, 5],
            all: vec![false, false],
            prompt: d,
            join: 0,
            leave: 5,
        },
    ]
}

/// Twelve sequences prefilled together, then decoding together (decode steps of more than
/// MATVEC_MAX_TOKENS rows), a thirteenth joining at step 2.
fn wide(vocab: usize) -> Vec<Plan> {
    (0..13)
        .map(|n| {
            let len = 3 + 2 * n;
            Plan {
                prompt: pseudo_random(len, vocab, 100 + n as u64),
                chunks: vec![len],
                all: vec![false],
                join: if n == 12 { 2 } else { 0 },
                leave: 6,
            }
        })
        .collect()
}

/// `n` sequences of one-token prompts decoding together, every step decode-only: half of them
/// leave after step 3, so the steps hold `n`, then about `n / 2` rows.
fn decoding(n: usize, vocab: usize) -> Vec<Plan> {
    (0..n)
        .map(|s| Plan {
            prompt: pseudo_random(1, vocab, 500 + s as u64),
            chunks: vec![1],
            all: vec![false],
            join: 0,
            leave: if s % 2 == 0 { 3 } else { 5 },
        })
        .collect()
}

/// As [`check`], but every logit of every step the same bits as the solo run's: decode-only
/// steps whose projections run as decode matvecs (up to the engine's batch matvec rows)
/// compute each row as a row alone.
fn check_exact(
    name: &str,
    quant: WeightFormat,
    scenario: &str,
    engine: &CudaEngine,
    plans: &[Plan],
) {
    let (solo, _) = run(engine, plans, false);
    let (batch, _) = run(engine, plans, true);
    for n in 0..plans.len() {
        for (step, (a, b)) in solo[n].iter().zip(&batch[n]).enumerate() {
            let err = max_abs_diff(a, b);
            assert!(
                err == 0.0,
                "{name} {} {scenario}: sequence {n}, its step {step}: batched logits differ from solo by {err}",
                quant.name()
            );
        }
    }
    println!(
        "{name} {} {scenario}: {} sequences, batched logits bit for bit the solo ones",
        quant.name(),
        plans.len()
    );
}

fn check(name: &str, quant: WeightFormat, scenario: &str, engine: &CudaEngine, plans: &[Plan]) {
    let (solo, solo_tokens) = run(engine, plans, false);
    let (batch, batch_tokens) = run(engine, plans, true);
    let mut worst = 0.0f32;
    for n in 0..plans.len() {
        assert_eq!(solo[n].len(), batch[n].len());
        for (step, (a, b)) in solo[n].iter().zip(&batch[n]).enumerate() {
            let err = max_abs_diff(a, b);
            assert!(
                err < TOLERANCE,
                "{name} {} {scenario}: sequence {n}, its step {step}: batched logits differ from solo by {err}",
                quant.name()
            );
            worst = worst.max(err);
        }
        assert_eq!(
            solo_tokens[n],
            batch_tokens[n],
            "{name} {} {scenario}: sequence {n}: greedy tokens",
            quant.name()
        );
    }
    println!(
        "{name} {} {scenario}: {} sequences, batched vs solo max|Δ| {worst:.2e}; greedy tokens identical",
        quant.name(),
        plans.len()
    );
}

fn check_family(name: &str) {
    let dir = spindle_testkit::fixture(name);
    for quant in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
        let mut engine = CudaEngine::load_with(&dir, device_ordinal(), quant, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let vocab = engine.config().vocab_size;
        let prompt = pseudo_random(30, vocab, 3);
        check(name, quant, "mixed", &engine, &mixed(&prompt, vocab));
        check(name, quant, "wide", &engine, &wide(vocab));
        check_exact(name, quant, "decoding 24", &engine, &decoding(24, vocab));
        // Steps of 33-128 rows: their projections as decode matvecs too (the default).
        check_exact(name, quant, "decoding 40", &engine, &decoding(40, vocab));
        // Batched decode without graphs (the eager table path) against solo runs without.
        engine.set_graphs(false);
        check(name, quant, "wide, no graphs", &engine, &wide(vocab));
        check_exact(
            name,
            quant,
            "decoding 24, no graphs",
            &engine,
            &decoding(24, vocab),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_next_moe_batched_equals_solo() {
    check_family(FAMILIES[0]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_dense_batched_equals_solo() {
    check_family(FAMILIES[1]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_moe_batched_equals_solo() {
    check_family(FAMILIES[2]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen3_5_moe_fused_batched_equals_solo() {
    check_family(FAMILIES[3]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen4_exp_batched_equals_solo() {
    check_family(FAMILIES[4]);
}

/// The device logits of a batched step hold each item's wanted rows where `item_rows` says.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_logits_rows_follow_the_items() {
    let dir = spindle_testkit::fixture("qwen3_5_moe");
    let engine = CudaEngine::load(&dir, device_ordinal()).unwrap();
    let vocab = engine.config().vocab_size;
    let a = pseudo_random(9, vocab, 1);
    let b = pseudo_random(3, vocab, 2);
    let mut solo_a = engine.new_session().unwrap();
    let mut solo_b = engine.new_session().unwrap();
    let want_a = engine.forward(&mut solo_a, &a, LogitsFor::Last).unwrap();
    let want_b = engine.forward(&mut solo_b, &b, LogitsFor::All).unwrap();
    let mut sa = engine.new_session().unwrap();
    let mut sb = engine.new_session().unwrap();
    let mut items = [
        CudaBatchItem {
            session: &mut sa,
            ids: &a,
            want: LogitsFor::Last,
        },
        CudaBatchItem {
            session: &mut sb,
            ids: &b,
            want: LogitsFor::All,
        },
    ];
    let logits = engine.forward_batch_device(&mut items).unwrap();
    assert_eq!(logits.rows(), 4);
    assert_eq!(logits.item_rows(0), 0..1);
    assert_eq!(logits.item_rows(1), 1..4);
    let got = engine.download_logits(&logits).unwrap();
    assert!(max_abs_diff(&got[..vocab], &want_a) < TOLERANCE);
    assert!(max_abs_diff(&got[vocab..], &want_b) < TOLERANCE);
}

/// The admission bound covers what a session holds after prompts of several lengths, and the
/// driver's free memory reads.
#[test]
#[ignore = "needs a CUDA GPU"]
fn admission_bound_covers_a_session() {
    for name in FAMILIES {
        let engine = CudaEngine::load(&spindle_testkit::fixture(name), device_ordinal()).unwrap();
        let vocab = engine.config().vocab_size;
        for n in [1, 300, 700] {
            let mut session = engine.new_session().unwrap();
            let prompt = pseudo_random(n, vocab, n as u64);
            engine
                .forward(&mut session, &prompt, LogitsFor::Last)
                .unwrap();
            // Outside the pool, plus the blocks its keys and values take.
            let bound = engine.sequence_bytes(n)
                + spindle_model::paged::blocks_for(n) * engine.kv_pool().block_bytes();
            assert!(
                bound >= session.state_bytes(),
                "{name} at {n}: bound {bound} below {}",
                session.state_bytes()
            );
        }
        let (free, total) = engine.free_device_bytes().unwrap();
        assert!(free <= total && total > 0, "{free} of {total}");
    }
}
