//! Sampling on the device (`CudaEngine::sample_rows`, `DeviceSampler`) against a host
//! reference of `spindle_runtime::sampling::Sampler::sample` with the draw given, on random
//! logits at the real vocabulary (248,320) and at small ones, 1 to 128 rows per batch, every
//! row with its own parameters.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test sampling -- --ignored --nocapture`.

use std::time::Instant;

use spindle_cuda::{Device, DeviceSampler, RowSampling};
use spindle_testkit::Rng;

const QWEN_VOCAB: usize = 248_320;

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"))
}

/// The host reference: `Sampler::sample` of crates/runtime/src/sampling.rs, step by step, with
/// `target = uniform · total`. Returns the id and whether the choice is well separated: no cut
/// (top-p mass, min-p ratio, the draw's target) within `EPS` of deciding otherwise.
fn reference(logits: &[f32], row: &RowSampling<'_>) -> (u32, bool) {
    prepare(logits, row).draw(row.uniform)
}

const EPS: f64 = 1e-9;

/// What is left before the draw: the greedy answer, or the survivors in order with their
/// probabilities (and whether the filters' cuts were well separated).
enum Prepared {
    Greedy(u32),
    Survivors(Vec<(u32, f32, f64)>, bool),
}

impl Prepared {
    fn draw(&self, uniform: f64) -> (u32, bool) {
        let (c, mut separated) = match self {
            Prepared::Greedy(id) => return (*id, true),
            Prepared::Survivors(c, s) => (c, *s),
        };
        let total: f64 = c.iter().map(|x| x.2).sum();
        let mut target = uniform * total;
        for x in c {
            if target < x.2 {
                separated &= target > EPS && x.2 - target > EPS;
                return (x.0, separated);
            }
            target -= x.2;
        }
        let last = c.iter().rev().find(|x| x.2 > 0.0).map_or(c[0].0, |x| x.0);
        (last, false)
    }
}

fn prepare(logits: &[f32], row: &RowSampling<'_>) -> Prepared {
    let mut logits = logits.to_vec();
    let p = row;
    if p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        // Repetition on every id of the history; presence and frequency on the ids counted
        // (from `counted_from` on), by how often they occur there.
        let mut ids: Vec<u32> = p.history.to_vec();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let Some(logit) = logits.get_mut(id as usize) else {
                continue;
            };
            if *logit > 0.0 {
                *logit /= p.repetition_penalty;
            } else {
                *logit *= p.repetition_penalty;
            }
            let count = p.history[p.counted_from.min(p.history.len())..]
                .iter()
                .filter(|&&h| h == id)
                .count();
            if count > 0 {
                *logit -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
    }
    let argmax = |v: &[f32]| {
        let mut best: Option<(usize, f32)> = None;
        for (i, &x) in v.iter().enumerate() {
            if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
                best = Some((i, x));
            }
        }
        best.map_or(0, |(i, _)| i) as u32
    };
    if p.temperature == 0.0 || p.top_k == 1 {
        return Prepared::Greedy(argmax(&logits));
    }
    let inv_t = 1.0 / p.temperature;
    let mut c: Vec<(u32, f32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite() || **l == f32::INFINITY)
        .map(|(i, &l)| (i as u32, l * inv_t, 0.0))
        .collect();
    if c.is_empty() {
        return Prepared::Greedy(argmax(&logits));
    }
    let by_logit_desc =
        |a: &(u32, f32, f64), b: &(u32, f32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if p.top_k > 0 && p.top_k < c.len() {
        c.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
        c.truncate(p.top_k);
    }
    c.sort_unstable_by(by_logit_desc);
    let max = c[0].1;
    let mut total = 0.0f64;
    for x in &mut c {
        x.2 = if max == f32::INFINITY {
            f64::from(u8::from(x.1 == f32::INFINITY))
        } else {
            f64::from(x.1 - max).exp()
        };
        total += x.2;
    }
    for x in &mut c {
        x.2 /= total;
    }
    let mut separated = true;
    let top_p = f64::from(p.top_p);
    if top_p < 1.0 {
        let mut mass = 0.0;
        let mut keep = c.len();
        for (i, x) in c.iter().enumerate() {
            mass += x.2;
            separated &= (mass - top_p).abs() > EPS;
            if mass >= top_p {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep);
    }
    let min_p = f64::from(p.min_p);
    if min_p > 0.0 {
        let threshold = min_p * c[0].2;
        separated &= c.iter().all(|x| (x.2 - threshold).abs() > EPS * c[0].2);
        c.retain(|x| x.2 >= threshold);
    }
    Prepared::Survivors(c, separated)
}

/// A uniform draw in [0, 1) with 48 random bits.
fn uniform(rng: &mut Rng) -> f64 {
    (f64::from(rng.unit()) + f64::from(rng.unit()) / (1u64 << 24) as f64).min(1.0 - 1e-16)
}

/// About normal (sum of four uniforms), mean 0, deviation `sd`.
fn normal(rng: &mut Rng, sd: f32) -> f32 {
    let s: f32 = (0..4).map(|_| rng.unit()).sum::<f32>() - 2.0;
    s * sd * 1.732
}

/// One row of logits of a kind: 0 flat-ish (sd 1), 1 wide (sd 3), 2 peaked (a few logits far
/// above the rest, as a language model's), 3 coarse (values on a grid of 0.5: many ties),
/// 4 peaked with NaN, -inf and +inf entries, 5 peaked with NaN and -inf only.
fn logits_row(rng: &mut Rng, vocab: usize, kind: usize) -> Vec<f32> {
    let mut row: Vec<f32> = match kind {
        0 => (0..vocab).map(|_| normal(rng, 1.0)).collect(),
        1 => (0..vocab).map(|_| normal(rng, 3.0)).collect(),
        3 => (0..vocab)
            .map(|_| (normal(rng, 2.0) * 2.0).round() / 2.0)
            .collect(),
        _ => (0..vocab).map(|_| normal(rng, 2.0)).collect(),
    };
    if kind == 2 || kind >= 4 {
        for _ in 0..8 {
            let at = (rng.unit() * vocab as f32) as usize % vocab;
            row[at] = 14.0 + rng.unit() * 4.0;
        }
        // An exact tie at the top half the time.
        if rng.unit() < 0.5 {
            let best = row.iter().cloned().fold(f32::MIN, f32::max);
            let at = (rng.unit() * vocab as f32) as usize % vocab;
            row[at] = best;
        }
    }
    if kind >= 4 {
        for _ in 0..(vocab / 50).max(2) {
            let at = (rng.unit() * vocab as f32) as usize % vocab;
            row[at] = if rng.unit() < 0.5 {
                f32::NAN
            } else {
                f32::NEG_INFINITY
            };
        }
        if kind == 4 && rng.unit() < 0.5 {
            for _ in 0..3 {
                let at = (rng.unit() * vocab as f32) as usize % vocab;
                row[at] = f32::INFINITY;
            }
        }
    }
    row
}

/// Parameters of row case `case` (temperature, top_k, top_p, min_p, repetition, presence,
/// frequency).
fn params(case: usize) -> (f32, usize, f32, f32, f32, f32, f32) {
    const CASES: &[(f32, usize, f32, f32, f32, f32, f32)] = &[
        (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),    // greedy
        (0.8, 1, 1.0, 0.0, 1.0, 0.0, 0.0),    // top-k 1: greedy
        (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),    // temperature alone
        (0.6, 0, 1.0, 0.0, 1.0, 0.0, 0.0),    // colder
        (2.5, 0, 1.0, 0.0, 1.0, 0.0, 0.0),    // hotter
        (1.0, 20, 1.0, 0.0, 1.0, 0.0, 0.0),   // top-k
        (0.7, 20, 0.8, 0.0, 1.0, 0.0, 0.0),   // Qwen's defaults
        (1.0, 0, 0.9, 0.0, 1.0, 0.0, 0.0),    // top-p alone
        (1.0, 0, 1.0, 0.1, 1.0, 0.0, 0.0),    // min-p alone
        (1.0, 50, 0.95, 0.05, 1.0, 0.0, 0.0), // all three
        (1.0, 3000, 1.0, 0.0, 1.0, 0.0, 0.0), // a wide top-k
        (0.0, 0, 1.0, 0.0, 1.3, 0.0, 0.0),    // greedy, repetition penalty
        (1.0, 0, 1.0, 0.0, 1.3, 0.0, 0.0),    // repetition penalty
        (1.0, 40, 1.0, 0.0, 1.0, 1.5, 0.0),   // presence penalty
        (0.9, 0, 0.95, 0.0, 1.0, 0.0, 0.7),   // frequency penalty
        (0.0, 0, 1.0, 0.0, 1.1, 0.5, 0.25),   // greedy, every penalty
        (1.2, 10, 0.9, 0.02, 1.2, 0.4, 0.3),  // everything
        (1.0, 2, 1.0, 0.0, 1.0, 0.0, 0.0),    // top-k 2
        (1.0, 0, 0.3, 0.0, 1.0, 0.0, 0.0),    // narrow top-p
        (1.0, 0, 1.0, 1.0, 1.0, 0.0, 0.0),    // min-p 1: the best (and its ties)
    ];
    CASES[case % CASES.len()]
}

/// One batch: `rows` rows of `vocab` logits, parameters and kinds varied per row; checks every
/// row against the reference and the logits buffer unchanged. Returns (rows, well-separated
/// rows, matches among them, matches among the rest).
fn check_batch(
    dev: &Device,
    sampler: &mut DeviceSampler,
    rng: &mut Rng,
    vocab: usize,
    rows: usize,
    case_base: usize,
) -> (usize, usize, usize, usize) {
    let kinds: Vec<usize> = (0..rows).map(|r| (r + case_base) % 6).collect();
    let mut logits = Vec::with_capacity(rows * vocab);
    for &k in &kinds {
        logits.extend(logits_row(rng, vocab, k));
    }
    let histories: Vec<Vec<u32>> = (0..rows)
        .map(|_| {
            let len = (rng.unit() * 300.0) as usize;
            (0..len)
                .map(|_| {
                    // Repeats (a small range half the time) and out-of-range ids.
                    let range = if rng.unit() < 0.5 { 40 } else { vocab + 10 };
                    (rng.unit() * range as f32) as u32
                })
                .collect()
        })
        .collect();
    let specs: Vec<RowSampling<'_>> = (0..rows)
        .map(|r| {
            let (temperature, top_k, top_p, min_p, rep, pres, freq) = params(r * 7 + case_base);
            RowSampling {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty: rep,
                presence_penalty: pres,
                frequency_penalty: freq,
                uniform: uniform(rng),
                history: &histories[r],
                // All counted, a third counted (a prompt and an answer), none counted.
                counted_from: histories[r].len() * (r % 3) / 2,
            }
        })
        .collect();
    let buf = dev.upload(&logits).unwrap();
    let sampled = sampler
        .sample_rows_checked(dev, buf.ptr(), vocab, &specs)
        .unwrap();
    let got: Vec<u32> = sampled.iter().map(|s| s.id).collect();
    for (r, s) in sampled.iter().enumerate() {
        let finite = logits[r * vocab..(r + 1) * vocab]
            .iter()
            .all(|l| l.is_finite());
        assert_eq!(s.finite, finite, "row {r}: the non-finite flag");
    }
    let after: Vec<f32> = dev.download(&buf, 0, rows * vocab).unwrap();
    assert!(
        after
            .iter()
            .zip(&logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "sample_rows modified the logits"
    );
    let (mut separated, mut matched, mut close_matched) = (0, 0, 0);
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let (want, sep) = reference(row, &specs[r]);
        let greedy = specs[r].temperature == 0.0 || specs[r].top_k == 1;
        if greedy {
            assert_eq!(
                got[r], want,
                "row {r} (greedy, kind {}): {:?}",
                kinds[r], specs[r]
            );
        }
        if sep {
            separated += 1;
            assert_eq!(
                got[r], want,
                "row {r} of {rows}, V {vocab}, kind {}: {:?}",
                kinds[r], specs[r]
            );
            matched += 1;
        } else if got[r] == want {
            close_matched += 1;
        }
    }
    (rows, separated, matched, close_matched)
}

/// Device ids equal the reference's on every well-separated row (greedy rows always), over
/// batches of 1 to 128 rows at V = 248,320 and small vocabularies.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_sampling_matches_the_host_reference() {
    let dev = device();
    let mut sampler = DeviceSampler::new();
    let mut rng = Rng(0x5eed);
    let mut totals = (0, 0, 0, 0);
    let batches: &[(usize, usize)] = &[
        (QWEN_VOCAB, 1),
        (QWEN_VOCAB, 7),
        (QWEN_VOCAB, 40),
        (QWEN_VOCAB, 128),
        (50, 1),
        (50, 128),
        (1000, 33),
        (7, 64),
        (4096, 100),
        (70_000, 16),
    ];
    for (n, &(vocab, rows)) in batches.iter().enumerate() {
        let before = sampler.host_rows();
        let t = check_batch(&dev, &mut sampler, &mut rng, vocab, rows, n * 13);
        println!(
            "V {vocab:>6}, {rows:>3} rows: {} well separated, all equal; {} of the other {} equal; {} rows finished on the host",
            t.1,
            t.3,
            t.0 - t.1,
            sampler.host_rows() - before
        );
        totals = (
            totals.0 + t.0,
            totals.1 + t.1,
            totals.2 + t.2,
            totals.3 + t.3,
        );
    }
    assert!(
        totals.1 * 10 >= totals.0 * 9,
        "too few well-separated rows to mean anything: {totals:?}"
    );
}

/// Many draws from the same rows (a statistical batch): every well-separated draw equals the
/// reference's, and the draws' frequencies follow the reference's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_batch_of_draws_matches_the_reference_draw_for_draw() {
    let dev = device();
    let mut sampler = DeviceSampler::new();
    let mut rng = Rng(99);
    for (vocab, kind, case) in [
        (QWEN_VOCAB, 2, 2),
        (QWEN_VOCAB, 0, 6),
        (QWEN_VOCAB, 1, 9),
        (300, 0, 2),
    ] {
        let row = logits_row(&mut rng, vocab, kind);
        let rows = 128;
        let mut logits = Vec::with_capacity(rows * vocab);
        for _ in 0..rows {
            logits.extend_from_slice(&row);
        }
        let buf = dev.upload(&logits).unwrap();
        let (temperature, top_k, top_p, min_p, rep, pres, freq) = params(case);
        let prepared = prepare(
            &row,
            &RowSampling {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty: rep,
                presence_penalty: pres,
                frequency_penalty: freq,
                uniform: 0.0,
                history: &[],
                counted_from: 0,
            },
        );
        let (mut equal, mut separated, mut draws) = (0, 0, 0);
        let mut distinct = std::collections::BTreeSet::new();
        for _ in 0..4 {
            let specs: Vec<RowSampling<'_>> = (0..rows)
                .map(|_| RowSampling {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repetition_penalty: rep,
                    presence_penalty: pres,
                    frequency_penalty: freq,
                    uniform: uniform(&mut rng),
                    history: &[],
                    counted_from: 0,
                })
                .collect();
            let got = sampler.sample_rows(&dev, buf.ptr(), vocab, &specs).unwrap();
            for (r, spec) in specs.iter().enumerate() {
                let (want, sep) = prepared.draw(spec.uniform);
                draws += 1;
                equal += usize::from(got[r] == want);
                distinct.insert(got[r]);
                if sep {
                    separated += 1;
                    assert_eq!(got[r], want, "draw {r}: u = {}", spec.uniform);
                }
            }
        }
        println!(
            "V {vocab}, kind {kind}, case {case}: {equal} of {draws} draws equal ({separated} well separated), {} distinct ids; {} rows on the host so far",
            distinct.len(),
            sampler.host_rows()
        );
        assert!(equal * 1000 >= draws * 998, "{equal} of {draws}");
    }
}

/// Microseconds of `sample_rows` for 1, 16, 64 and 128 rows at V = 248,320 against reading
/// those logits rows back to the host (what host sampling starts with). A measurement to read,
/// not a bound.
#[test]
#[ignore = "needs a CUDA GPU"]
fn timing_of_device_sampling_against_downloading_the_rows() {
    let dev = device();
    let mut sampler = DeviceSampler::new();
    let mut rng = Rng(5);
    let vocab = QWEN_VOCAB;
    let max_rows = 128;
    let mut logits = Vec::with_capacity(max_rows * vocab);
    for r in 0..max_rows {
        logits.extend(logits_row(&mut rng, vocab, if r % 2 == 0 { 2 } else { 1 }));
    }
    let buf = dev.upload(&logits).unwrap();
    let history: Vec<u32> = (0..2000).map(|i| (i * 7919) % vocab as u32).collect();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("rows | greedy µs | Qwen (t 0.7, top-k 20, top-p 0.8) µs | t 1 alone µs | every penalty + top-p 0.95 µs | download µs | host rows");
    for rows in [1usize, 16, 64, 128] {
        let spec = |t: f32, k: usize, p: f32, pen: bool, rng: &mut Rng| RowSampling {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: 0.0,
            repetition_penalty: if pen { 1.1 } else { 1.0 },
            presence_penalty: if pen { 0.5 } else { 0.0 },
            frequency_penalty: if pen { 0.2 } else { 0.0 },
            uniform: uniform(rng),
            history: &history,
            counted_from: history.len() / 2,
        };
        let before = sampler.host_rows();
        let mut time = |t: f32, k: usize, p: f32, pen: bool, rng: &mut Rng| {
            let mut us = Vec::new();
            for rep in 0..15 {
                let specs: Vec<RowSampling<'_>> =
                    (0..rows).map(|_| spec(t, k, p, pen, rng)).collect();
                dev.sync().unwrap();
                let started = Instant::now();
                let ids = sampler.sample_rows(&dev, buf.ptr(), vocab, &specs).unwrap();
                let el = started.elapsed().as_secs_f64() * 1e6;
                assert_eq!(ids.len(), rows);
                if rep >= 3 {
                    us.push(el);
                }
            }
            median(us)
        };
        let greedy = time(0.0, 0, 1.0, false, &mut rng);
        let qwen = time(0.7, 20, 0.8, false, &mut rng);
        let plain = time(1.0, 0, 1.0, false, &mut rng);
        let penal = time(1.0, 0, 0.95, true, &mut rng);
        let host_rows = sampler.host_rows() - before;
        let mut down = Vec::new();
        for rep in 0..12 {
            dev.sync().unwrap();
            let started = Instant::now();
            let v: Vec<f32> = dev.download(&buf, 0, rows * vocab).unwrap();
            let el = started.elapsed().as_secs_f64() * 1e6;
            assert_eq!(v.len(), rows * vocab);
            if rep >= 2 {
                down.push(el);
            }
        }
        println!(
            "{rows:>4} | {greedy:>9.0} | {qwen:>36.0} | {plain:>12.0} | {penal:>29.0} | {:>11.0} | {host_rows}",
            median(down)
        );
    }
}

/// Token masks (constrained decoding): each row's allowed-token bits go up with its
/// parameters and the kernels read a disallowed logit as -inf. Against the host reference on
/// the masked row (`spindle_cuda::apply_mask`, then the sampler): every greedy row and every
/// well-separated sampled row equal, masks of one token, a few, half the vocabulary and all but
/// the best few, rows without a mask beside them, and the logits buffer unchanged. A mask of
/// one token forces it at any temperature, even the least likely token of the row.
#[test]
#[ignore = "needs a CUDA GPU"]
fn masked_device_sampling_matches_the_host_reference_on_the_masked_row() {
    let dev = device();
    let mut sampler = DeviceSampler::new();
    let mut rng = Rng(0x3a5c);
    for &(vocab, rows) in &[(QWEN_VOCAB, 16), (QWEN_VOCAB, 3), (5000, 64), (70, 9)] {
        let words = vocab.div_ceil(32);
        let kinds: Vec<usize> = (0..rows).map(|r| r % 4).collect();
        let mut logits = Vec::with_capacity(rows * vocab);
        for &k in &kinds {
            logits.extend(logits_row(&mut rng, vocab, k));
        }
        let histories: Vec<Vec<u32>> = (0..rows)
            .map(|_| (0..50).map(|_| (rng.unit() * 40.0) as u32).collect())
            .collect();
        let specs: Vec<RowSampling<'_>> = (0..rows)
            .map(|r| {
                let (temperature, top_k, top_p, min_p, rep, pres, freq) = params(r * 5 + 1);
                RowSampling {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    repetition_penalty: rep,
                    presence_penalty: pres,
                    frequency_penalty: freq,
                    uniform: uniform(&mut rng),
                    history: &histories[r],
                    counted_from: histories[r].len() * (r % 3) / 2,
                }
            })
            .collect();
        // Row r's mask: none, one token (the row's least likely), a few, half, all but the
        // best few.
        let masks: Vec<Option<Vec<u32>>> = (0..rows)
            .map(|r| {
                let row = &logits[r * vocab..(r + 1) * vocab];
                let mut bits = vec![0u32; words];
                let mut allow = |id: usize| bits[id / 32] |= 1 << (id % 32);
                match r % 5 {
                    0 => return None,
                    1 => {
                        let worst = (0..vocab)
                            .filter(|&i| row[i].is_finite())
                            .min_by(|&a, &b| row[a].total_cmp(&row[b]))
                            .unwrap_or(0);
                        allow(worst);
                    }
                    2 => (0..7).for_each(|_| allow((rng.unit() * vocab as f32) as usize % vocab)),
                    3 => (0..vocab).filter(|_| rng.unit() < 0.5).for_each(&mut allow),
                    _ => {
                        let mut order: Vec<usize> = (0..vocab).collect();
                        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                        order[3.min(vocab - 1)..].iter().for_each(|&i| allow(i));
                    }
                }
                Some(bits)
            })
            .collect();
        let refs: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
        let buf = dev.upload(&logits).unwrap();
        let sampled = sampler
            .sample_rows_masked(&dev, buf.ptr(), vocab, &specs, &refs)
            .unwrap();
        let after: Vec<f32> = dev.download(&buf, 0, rows * vocab).unwrap();
        assert!(
            after
                .iter()
                .zip(&logits)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "masked sampling modified the logits"
        );
        let mut separated = 0;
        for r in 0..rows {
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            let finite = row.iter().all(|l| l.is_finite());
            assert_eq!(
                sampled[r].finite, finite,
                "row {r}: the flag reads the raw logits"
            );
            if let Some(bits) = &masks[r] {
                spindle_cuda::apply_mask(&mut row, bits);
            }
            let (want, sep) = reference(&row, &specs[r]);
            let got = sampled[r].id;
            if let Some(bits) = &masks[r] {
                assert!(
                    bits[got as usize / 32] & (1 << (got % 32)) != 0,
                    "row {r} (V {vocab}): token {got} is not allowed by its mask"
                );
            }
            if r % 5 == 1 {
                assert_eq!(got, want, "row {r}: a one-token mask forces its token");
            }
            if specs[r].is_greedy() || sep {
                separated += 1;
                assert_eq!(got, want, "row {r} of {rows}, V {vocab}: {:?}", specs[r]);
            }
        }
        println!(
            "V {vocab:>6}, {rows:>3} masked rows: {separated} greedy or well separated, all equal"
        );
    }
}
