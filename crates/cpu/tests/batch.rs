//! Batched steps (`Engine::forward_batch`, issue 14): on every fixture family, in bf16, q8 and
//! q4, sequences that differ (prompt lengths, a prompt prefilled in chunks while others decode,
//! one finishing while others continue, one joining mid-way) each give what they give alone,
//! and a sequence whose state went non-finite (or a step whose experts cannot be read) fails
//! without touching its neighbours.

mod common;

use std::path::PathBuf;

use common::{fixture, Reference};
use spindle_cpu::batch::{RopeSpan, Span};
use spindle_cpu::session::LayerState;
use spindle_cpu::{BatchItem, Engine, EngineError, LoadOptions, LogitsFor, NonFiniteSite, Session};
use spindle_kernels::softmax::argmax;
use spindle_model::experts::ExpertResidency;
use spindle_model::quant::WeightFormat;

const FIXTURES: &[&str] = &[
    "qwen3_5_dense",
    "qwen3_5_moe",
    "qwen3_5_moe_fused",
    "qwen3_next_moe",
    "qwen4_exp",
];

/// The tolerance is zero: a batched sequence's logits are bit-identical to its solo run's. The
/// step gives each sequence's rows the arithmetic they get alone (the same matmul path for its
/// number of rows, `matmul_groups`; its own state for GDN, attention and PLE), so nothing
/// depends on the neighbours. (The issue asks for 1e-4; without the per-sequence kernel paths
/// q4 differed by 1e-2 on qwen3_5_dense: an int8 activation rounding flipped.)
fn assert_same_logits(label: &str, got: &[f32], solo: &[f32], vocab: usize) {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(got) == bits(solo),
        "{label}: logits differ from the solo run by up to {:e} (relative to max(1, |row|))",
        max_rel_diff(got, solo, vocab)
    );
}

fn engine(name: &str, quant: WeightFormat) -> Engine {
    Engine::load_with(
        &fixture(name),
        &LoadOptions {
            quant,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{name} {quant}: {e}"))
}

/// One sequence of a scenario: its prompt, fed in chunks of at most `chunk` tokens, then
/// `decode` greedy tokens, joining the batch at step `join`.
#[derive(Clone)]
struct Plan {
    prompt: Vec<u32>,
    chunk: usize,
    decode: usize,
    join: usize,
    /// Logits for every prompt row (else the last row of each chunk).
    all_rows: bool,
}

/// What one sequence fed and got back, call by call.
#[derive(Default, Debug)]
struct Trace {
    calls: Vec<(Vec<u32>, LogitsFor, Vec<f32>)>,
}

/// A sequence's next input: a prompt chunk, or the greedy token of its last logits.
fn next_input(plan: &Plan, trace: &Trace, vocab: usize) -> Option<(Vec<u32>, LogitsFor)> {
    let fed: usize = trace.calls.iter().map(|(ids, _, _)| ids.len()).sum();
    if fed < plan.prompt.len() {
        let end = (fed + plan.chunk).min(plan.prompt.len());
        let want = if plan.all_rows {
            LogitsFor::All
        } else {
            LogitsFor::Last
        };
        return Some((plan.prompt[fed..end].to_vec(), want));
    }
    if fed >= plan.prompt.len() + plan.decode {
        return None;
    }
    let (_, _, logits) = trace.calls.last().expect("a prompt is fed first");
    let last = &logits[logits.len() - vocab..];
    Some((vec![argmax(last) as u32], LogitsFor::Last))
}

/// Runs the plans as a continuously batched schedule: every step carries each sequence that
/// has joined and not finished. Returns each sequence's trace and the largest step (tokens).
fn run_batched(engine: &Engine, plans: &[Plan]) -> (Vec<Trace>, usize) {
    let vocab = engine.config().vocab_size;
    let mut sessions: Vec<Session> = plans.iter().map(|_| engine.new_session()).collect();
    let mut traces: Vec<Trace> = plans.iter().map(|_| Trace::default()).collect();
    let mut widest = 0;
    for step in 0.. {
        let inputs: Vec<Option<(Vec<u32>, LogitsFor)>> = plans
            .iter()
            .zip(&traces)
            .map(|(plan, trace)| {
                (step >= plan.join)
                    .then(|| next_input(plan, trace, vocab))
                    .flatten()
            })
            .collect();
        let done = plans
            .iter()
            .zip(&traces)
            .all(|(p, t)| step >= p.join && next_input(p, t, vocab).is_none());
        if done {
            break;
        }
        let mut items = Vec::new();
        let mut owners = Vec::new();
        for (k, (session, input)) in sessions.iter_mut().zip(&inputs).enumerate() {
            if let Some((ids, want)) = input {
                items.push(BatchItem {
                    session,
                    ids,
                    want: *want,
                });
                owners.push(k);
            }
        }
        widest = widest.max(items.iter().map(|i| i.ids.len()).sum());
        let results = engine.forward_batch(&mut items);
        drop(items);
        for (k, result) in owners.into_iter().zip(results) {
            let (ids, want) = inputs[k].clone().unwrap();
            let logits = result.unwrap_or_else(|e| panic!("sequence {k} at step {step}: {e}"));
            traces[k].calls.push((ids, want, logits));
        }
    }
    (traces, widest)
}

/// The same plan alone, call by call through `Engine::forward`, choosing its own greedy tokens.
fn run_solo(engine: &Engine, plan: &Plan) -> Trace {
    let vocab = engine.config().vocab_size;
    let mut session = engine.new_session();
    let mut trace = Trace::default();
    while let Some((ids, want)) = next_input(plan, &trace, vocab) {
        let logits = engine.forward(&mut session, &ids, want).unwrap();
        trace.calls.push((ids, want, logits));
    }
    trace
}

/// Largest |a − b| over rows of `vocab`, each relative to max(1, the row's largest |b|).
fn max_rel_diff(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    assert_eq!(a.len(), b.len(), "logit counts");
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(ra, rb)| {
            let scale = rb.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            ra.iter()
                .zip(rb)
                .map(|(x, y)| (x - y).abs() / scale)
                .fold(0.0f32, f32::max)
        })
        .fold(0.0, f32::max)
}

/// Checks every sequence of a batched run against its solo run: the same tokens fed (so the
/// same greedy tokens) and the same logits. Returns the number of logits compared.
fn check_against_solo(label: &str, engine: &Engine, plans: &[Plan], batched: &[Trace]) -> usize {
    let vocab = engine.config().vocab_size;
    let mut compared = 0;
    for (k, (plan, got)) in plans.iter().zip(batched).enumerate() {
        let solo = run_solo(engine, plan);
        let ids = |t: &Trace| -> Vec<Vec<u32>> { t.calls.iter().map(|c| c.0.clone()).collect() };
        assert_eq!(ids(got), ids(&solo), "{label}: sequence {k}'s tokens");
        for (call, (b, s)) in got.calls.iter().zip(&solo.calls).enumerate() {
            let what = format!("{label}: sequence {k}, call {call} ({} tokens)", b.0.len());
            assert_same_logits(&what, &b.2, &s.2, vocab);
            compared += b.2.len();
        }
    }
    compared
}

/// Different sequences from the fixture's prompt: lengths 1 to 40, one prefilled in chunks of
/// 4 while the others decode, a chunk of 36 beside decoding sequences, one wanting every prompt row, one joining at step 3 (and one at
/// step 6), one finishing after 2 tokens while the others continue.
fn plans(prompt: &[u32]) -> Vec<Plan> {
    let take = |from: usize, len: usize| -> Vec<u32> {
        (0..len)
            .map(|i| prompt[(from + i) % prompt.len()])
            .collect()
    };
    vec![
        // Long prompt in chunks of 4: prefills while the others decode.
        Plan {
            prompt: take(0, 21),
            chunk: 4,
            decode: 5,
            join: 0,
            all_rows: false,
        },
        // One token, two decode steps: finishes first.
        Plan {
            prompt: take(5, 1),
            chunk: 8,
            decode: 2,
            join: 0,
            all_rows: false,
        },
        // Short prompt at once, long decode.
        Plan {
            prompt: take(3, 6),
            chunk: 16,
            decode: 12,
            join: 0,
            all_rows: false,
        },
        // Joins mid-way with a prompt in two chunks, wanting every row's logits.
        Plan {
            prompt: take(9, 11),
            chunk: 7,
            decode: 4,
            join: 3,
            all_rows: true,
        },
        // A 36-token chunk (the f32 panel GEMM in bf16) while others decode, joining at step 2.
        Plan {
            prompt: take(2, 40),
            chunk: 36,
            decode: 3,
            join: 2,
            all_rows: false,
        },
        // Joins later still, the same tokens as the first sequence (other positions in the batch).
        Plan {
            prompt: take(0, 9),
            chunk: 9,
            decode: 3,
            join: 6,
            all_rows: false,
        },
    ]
}

fn check_family(name: &str) {
    let prompt = Reference::load(name).ids("prompt_ids");
    let plans = plans(&prompt);
    for quant in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
        let engine = engine(name, quant);
        let (batched, widest) = run_batched(&engine, &plans);
        assert!(widest >= 40, "the schedule should have steps of many rows");
        let label = format!("{name} {quant}");
        let compared = check_against_solo(&label, &engine, &plans, &batched);
        println!(
            "{label}: {compared} logits bit-identical to the solo runs (widest step {widest} rows)"
        );
    }
}

#[test]
fn qwen3_5_dense_batches_match_solo_runs() {
    check_family("qwen3_5_dense");
}

#[test]
fn qwen3_5_moe_batches_match_solo_runs() {
    check_family("qwen3_5_moe");
}

#[test]
fn qwen3_5_moe_fused_batches_match_solo_runs() {
    check_family("qwen3_5_moe_fused");
}

#[test]
fn qwen3_next_moe_batches_match_solo_runs() {
    check_family("qwen3_next_moe");
}

#[test]
fn qwen4_exp_batches_match_solo_runs() {
    check_family("qwen4_exp");
}

/// Index of the first GDN layer.
fn first_gdn(session: &Session) -> usize {
    session
        .layers
        .iter()
        .position(|l| matches!(l, LayerState::Gdn(_)))
        .expect("every fixture has GDN layers")
}

/// A sequence whose GDN state holds a NaN fails alone, with the site of its first GDN layer,
/// in the middle of a batch (one neighbour decoding, one prefilling a chunk); its session is
/// broken and refused on the next step, and the neighbours' logits match their solo runs on
/// both steps.
#[test]
fn a_non_finite_sequence_fails_alone() {
    for &name in FIXTURES {
        let prompt = Reference::load(name).ids("prompt_ids");
        let engine = engine(name, WeightFormat::Bf16);
        let vocab = engine.config().vocab_size;

        // The poisoned sequence: a healthy prefill, then a NaN in its first GDN layer's state.
        let mut poisoned = engine.new_session();
        engine
            .forward(&mut poisoned, &prompt[..5], LogitsFor::Last)
            .unwrap();
        let layer = first_gdn(&poisoned);
        match &mut poisoned.layers[layer] {
            LayerState::Gdn(state) => state.recurrent[7] = f32::NAN,
            LayerState::Attention(_) => unreachable!(),
        }

        // Neighbours: one decoding (prefilled alone first), one prefilling a chunk.
        let decoder_prompt = &prompt[2..9];
        let mut decoder = engine.new_session();
        let first = engine
            .forward(&mut decoder, decoder_prompt, LogitsFor::Last)
            .unwrap();
        let decoder_solo_state = decoder.clone();
        let next = [argmax(&first) as u32];
        let chunk = &prompt[4..10];
        let mut prefiller = engine.new_session();

        let mut items = vec![
            BatchItem {
                session: &mut decoder,
                ids: &next,
                want: LogitsFor::Last,
            },
            BatchItem {
                session: &mut poisoned,
                ids: &prompt[5..8],
                want: LogitsFor::All,
            },
            BatchItem {
                session: &mut prefiller,
                ids: chunk,
                want: LogitsFor::All,
            },
        ];
        let mut results = engine.forward_batch(&mut items).into_iter();
        drop(items);
        let (a, bad, c) = (
            results.next().unwrap().unwrap(),
            results.next().unwrap(),
            results.next().unwrap().unwrap(),
        );
        match bad {
            Err(EngineError::NonFinite {
                site,
                token,
                position,
            }) => {
                assert_eq!(site, NonFiniteSite::Mixer { layer }, "{name}");
                assert_eq!((token, position), (0, 5), "{name}");
            }
            other => panic!("{name}: the poisoned sequence gave {other:?}"),
        }
        assert!(poisoned.broken.is_some(), "{name}: poisoned session kept");

        let mut solo_decoder = decoder_solo_state;
        let a_solo = engine
            .forward(&mut solo_decoder, &next, LogitsFor::Last)
            .unwrap();
        let mut solo_prefiller = engine.new_session();
        let c_solo = engine
            .forward(&mut solo_prefiller, chunk, LogitsFor::All)
            .unwrap();
        assert_same_logits(&format!("{name}: decoder"), &a, &a_solo, vocab);
        assert_same_logits(&format!("{name}: prefiller"), &c, &c_solo, vocab);

        // Next step: the broken session is refused at once, the others go on exactly.
        let (n1, n2) = ([argmax(&a) as u32], [argmax(&c[c.len() - vocab..]) as u32]);
        let mut items = vec![
            BatchItem {
                session: &mut poisoned,
                ids: &n1,
                want: LogitsFor::Last,
            },
            BatchItem {
                session: &mut decoder,
                ids: &n1,
                want: LogitsFor::Last,
            },
            BatchItem {
                session: &mut prefiller,
                ids: &n2,
                want: LogitsFor::Last,
            },
        ];
        let results = engine.forward_batch(&mut items);
        drop(items);
        assert!(
            matches!(results[0], Err(EngineError::BrokenSession { .. })),
            "{name}: {:?}",
            results[0]
        );
        let b2 = engine
            .forward(&mut solo_decoder, &n1, LogitsFor::Last)
            .unwrap();
        let c2 = engine
            .forward(&mut solo_prefiller, &n2, LogitsFor::Last)
            .unwrap();
        let (r1, r2) = (results[1].as_ref().unwrap(), results[2].as_ref().unwrap());
        assert_same_logits(&format!("{name}: decoder, step 2"), r1, &b2, vocab);
        assert_same_logits(&format!("{name}: prefiller, step 2"), r2, &c2, vocab);
        assert_eq!(decoder.position, decoder_prompt.len() + 2, "{name}");
        assert_eq!(prefiller.position, chunk.len() + 1, "{name}");
    }
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A streamed expert that cannot be read is not local to any sequence: every sequence of the
/// step fails with the read error and is broken; a session already broken gets its own error.
#[test]
fn a_failed_expert_read_fails_every_sequence_of_the_step() {
    let tmp = TempDir(std::env::temp_dir().join(format!("spindle-batch-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&tmp.0);
    let dst = tmp.0.join("install");
    spindle_model::install::convert(&fixture("qwen3_5_moe"), &dst, WeightFormat::Q8, &mut |_| {
        true
    })
    .unwrap();
    let engine = Engine::load_with(
        &dst,
        &LoadOptions {
            experts: ExpertResidency::Streamed,
            expert_slots: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let prompt = Reference::load("qwen3_5_moe").ids("prompt_ids");
    let mut broken = engine.new_session();
    broken.broken = Some("an earlier failure".into());
    let (mut s1, mut s2) = (engine.new_session(), engine.new_session());
    std::fs::OpenOptions::new()
        .write(true)
        .open(dst.join("experts/layer-000.bin"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut items = vec![
        BatchItem {
            session: &mut s1,
            ids: &prompt[..4],
            want: LogitsFor::Last,
        },
        BatchItem {
            session: &mut broken,
            ids: &prompt[..1],
            want: LogitsFor::Last,
        },
        BatchItem {
            session: &mut s2,
            ids: &prompt[3..4],
            want: LogitsFor::Last,
        },
    ];
    let results = engine.forward_batch(&mut items);
    drop(items);
    for k in [0, 2] {
        match &results[k] {
            Err(EngineError::ExpertRead { message }) => {
                assert!(message.contains("layer-000.bin"), "{message}")
            }
            other => panic!("item {k}: {other:?}"),
        }
    }
    match &results[1] {
        Err(EngineError::BrokenSession { cause }) => assert_eq!(cause, "an earlier failure"),
        other => panic!("the broken session: {other:?}"),
    }
    assert!(s1.broken.is_some() && s2.broken.is_some());
}

/// The spans a step lays out are consecutive, in the callers' order, at each session's position.
#[test]
fn spans_follow_the_items() {
    let engine = engine("qwen3_5_dense", WeightFormat::Bf16);
    let mut a = engine.new_session();
    a.position = 7;
    let mut b = engine.new_session();
    let mut items = [
        BatchItem {
            session: &mut a,
            ids: &[1, 2, 3],
            want: LogitsFor::Last,
        },
        BatchItem {
            session: &mut b,
            ids: &[4],
            want: LogitsFor::Last,
        },
    ];
    let step = spindle_cpu::batch::Step::new(&mut items);
    assert_eq!(
        step.spans(),
        vec![
            Span {
                rows: 0..3,
                start: 7,
                rope: RopeSpan::Text(7),
            },
            Span {
                rows: 3..4,
                start: 0,
                rope: RopeSpan::Text(0),
            }
        ]
    );
}

/// Input the engine cannot take is an error for that sequence, never a panic: no tokens, or a
/// token id outside the vocabulary; the other sequences of the step run as they would alone.
#[test]
fn bad_input_fails_its_own_sequence_only() {
    let e = engine("qwen3_5_moe", WeightFormat::Bf16);
    let vocab = e.config().vocab_size as u32;
    let mut s = e.new_session();
    match e.forward(&mut s, &[1, vocab], LogitsFor::Last) {
        Err(EngineError::Input(why)) => assert!(why.contains(&vocab.to_string()), "{why}"),
        other => panic!("an out-of-vocabulary id: {:?}", other.map(|l| l.len())),
    }
    assert!(matches!(
        e.forward(&mut s, &[], LogitsFor::Last),
        Err(EngineError::Input(_))
    ));
    assert_eq!(s.position, 0, "a refused step feeds nothing");
    let good = [3u32, 5, 7];
    let solo = e
        .forward(&mut e.new_session(), &good, LogitsFor::Last)
        .unwrap();
    let (mut a, mut b) = (e.new_session(), e.new_session());
    let bad = [vocab + 5];
    let mut items = [
        BatchItem {
            session: &mut a,
            ids: &bad,
            want: LogitsFor::Last,
        },
        BatchItem {
            session: &mut b,
            ids: &good,
            want: LogitsFor::Last,
        },
    ];
    let results = e.forward_batch(&mut items);
    assert!(matches!(results[0], Err(EngineError::Input(_))));
    assert_eq!(results[1].as_ref().unwrap(), &solo);
}

/// A KV pool too small for one block is refused at load, naming the option.
#[test]
fn a_kv_pool_below_one_block_is_refused() {
    let options = LoadOptions {
        kv_pool_bytes: Some(1000),
        ..Default::default()
    };
    match Engine::load_with(&fixture("qwen3_5_moe"), &options) {
        Err(e) => assert!(e.to_string().contains("--kv-pool"), "{e}"),
        Ok(_) => panic!("a 1000-byte pool was accepted"),
    }
}
