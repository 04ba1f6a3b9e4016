//! Prefix caching: a sequence resumed from cached pieces (KV rows of the attention layers,
//! the GDN/PLE state at a boundary) gives the logits of the same sequence run cold, within
//! 1e-5, and the same greedy tokens, on every fixture family; cut mid-block, on a block edge
//! (qwen4_exp's QSA blocks of 4 tokens) and through the radix tree's split edges. Then the
//! scheduler with a cache on the demo model: answers equal the cold ones, hits are counted,
//! concurrent requests diverging after a shared prefix, eviction under a tiny cache.

use std::sync::Arc;

use spindle_cpu::{LoadOptions, LogitsFor};
use spindle_kernels::softmax::argmax;
use spindle_runtime::batch::{BatchConfig, Scheduler};
use spindle_runtime::prefix::{PrefixCache, PrefixCacheConfig};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{
    demo_dir, Backend, BackendSession, Completion, Device, Flow, GenerateOptions, Model, Prompt,
};
use spindle_testkit::{fixture, max_abs_diff, Reference};

const FAMILIES: [&str; 4] = [
    "qwen3_next_moe",
    "qwen3_5_dense",
    "qwen3_5_moe",
    "qwen4_exp",
];

/// Greedy steps compared after the prompt.
const STEPS: usize = 6;

/// The logits of the prompt's rows from `from` on, then of `STEPS` greedy steps, and the
/// greedy ids, from `session` (which holds the prompt's first `from` tokens).
fn finish(
    backend: &Backend,
    session: &mut BackendSession,
    prompt: &[u32],
    from: usize,
) -> (Vec<f32>, Vec<u32>) {
    let mut logits = backend
        .forward(session, &prompt[from..], LogitsFor::All)
        .unwrap();
    let vocab = backend.config().vocab_size;
    let mut ids = Vec::new();
    for _ in 0..STEPS {
        let next = argmax(&logits[logits.len() - vocab..]) as u32;
        ids.push(next);
        logits.extend(backend.forward(session, &[next], LogitsFor::Last).unwrap());
    }
    (logits, ids)
}

/// The fixture's prompt and greedy answer, twice over: long enough to cross GDN chunks and
/// QSA's budget, with ids the model has.
fn long_prompt(name: &str) -> Vec<u32> {
    let reference = Reference::load(name);
    let once = [reference.ids("prompt_ids"), reference.ids("gen_ids")].concat();
    [once.clone(), once].concat()
}

#[test]
fn a_restored_prefix_gives_the_cold_logits_on_every_family() {
    for name in FAMILIES {
        restores_as_cold(name, Device::Cpu, 1e-5);
    }
}

/// The same on CUDA, through the runtime's capture and restore (device pieces, and host ones
/// for qwen4_exp's indexer keys and PLE state), against the cold run on the GPU within 1e-4.
/// Needs a CUDA GPU: `cargo test --release -p spindle-runtime --features cuda --test prefix
/// -- --ignored cuda`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_a_restored_prefix_gives_the_cold_logits_on_every_family() {
    for name in FAMILIES {
        restores_as_cold(name, Device::Cuda(0), 1e-4);
    }
}

/// Restores `name`'s long prompt cut at block edges and mid-block (two segments each) on
/// `device`: bit for bit the session fed the same chunks uncached, within `bound` of the
/// logits' scale of the one-pass run, the same greedy ids.
fn restores_as_cold(name: &str, device: Device, bound: f32) {
    let backend = Backend::load(&fixture(name), device, &LoadOptions::default()).unwrap();
    let vocab = backend.config().vocab_size;
    let prompt = long_prompt(name);
    let t = prompt.len();
    let mut cold = backend.new_session().unwrap();
    let (cold_logits, cold_ids) = finish(&backend, &mut cold, &prompt, 0);
    // 1: the first token only; 4, 8, 16: QSA block edges; 7, 13: mid-block; t - 1: all
    // but the last prompt token.
    for cut in [1, 4, 7, 8, 13, 16, t / 2 + 1, t - 1] {
        // Two segments, as the tree stores a prefix taken at two snapshot points.
        let q = cut / 2;
        let mut warm = backend.new_session().unwrap();
        let mut segments = Vec::new();
        if q > 0 {
            backend
                .forward(&mut warm, &prompt[..q], LogitsFor::Last)
                .unwrap();
            segments.push(backend.capture_kv(&warm, 0).unwrap());
        }
        backend
            .forward(&mut warm, &prompt[q..cut], LogitsFor::Last)
            .unwrap();
        segments.push(backend.capture_kv(&warm, q).unwrap());
        let state = backend.capture_state(&warm).unwrap();
        drop(warm);
        let refs: Vec<_> = segments.iter().collect();
        let mut restored = backend
            .restore_prefix(&refs, &state, &prompt[..cut], t)
            .unwrap();
        assert_eq!(restored.position(), cut);
        let (logits, ids) = finish(&backend, &mut restored, &prompt, cut);
        // The same chunks in one session, never cached: restoring adds nothing, bit for bit.
        let mut split = backend.new_session().unwrap();
        for chunk in [&prompt[..q], &prompt[q..cut]] {
            if !chunk.is_empty() {
                backend.forward(&mut split, chunk, LogitsFor::Last).unwrap();
            }
        }
        let (split_logits, _) = finish(&backend, &mut split, &prompt, cut);
        assert!(
            logits == split_logits,
            "{name} on {device:?}, cut at {cut}: the restored session differs from its uncached run"
        );
        // Against one pass over the whole prompt: prefilling in pieces rounds differently
        // (GDN's chunked form starts its chunks elsewhere), by at most `bound` of the
        // logits' scale on these fixtures.
        let diff = max_abs_diff(&logits, &cold_logits[cut * vocab..]);
        let scale = cold_logits.iter().fold(1f32, |m, v| m.max(v.abs()));
        assert!(
            diff <= bound * scale,
            "{name}, cut at {cut} of {t}: logits differ by {diff} (scale {scale})"
        );
        assert_eq!(
            ids, cold_ids,
            "{name}, cut at {cut} of {t}: greedy ids differ"
        );
    }
}

#[test]
fn the_tree_splits_edges_and_restores_the_longest_snapshot() {
    for name in ["qwen3_5_moe", "qwen4_exp"] {
        let backend = Backend::load(&fixture(name), Device::Cpu, &LoadOptions::default()).unwrap();
        let vocab = backend.config().vocab_size;
        let prompt = long_prompt(name);
        let t = prompt.len();
        let mut cache = PrefixCache::new(u64::MAX);
        // A first sequence snapshotted at its end: one edge of t - 2 tokens.
        let first = &prompt[..t - 2];
        let mut session = backend.new_session().unwrap();
        backend
            .forward(&mut session, first, LogitsFor::Last)
            .unwrap();
        let from = cache.missing_from(first).unwrap();
        assert_eq!(from, 0);
        cache.insert(
            first,
            backend.capture_kv(&session, from).unwrap(),
            backend.capture_state(&session).unwrap(),
        );
        assert_eq!(cache.missing_from(first), None, "already cached");
        // A second that diverges at position 10: the edge splits there, a new leaf below.
        let mut second = prompt[..10].to_vec();
        second.extend([3, 1, 4, 1, 5, 9]);
        assert!(
            cache.lookup(&second, second.len()).is_none(),
            "no snapshot on its path yet"
        );
        let mut session = backend.new_session().unwrap();
        backend
            .forward(&mut session, &second, LogitsFor::Last)
            .unwrap();
        let from = cache.missing_from(&second).unwrap();
        assert_eq!(from, 10, "the shared rows are not captured again");
        cache.insert(
            &second,
            backend.capture_kv(&session, from).unwrap(),
            backend.capture_state(&session).unwrap(),
        );
        // A snapshot in the middle of the first edge (an earlier boundary of a third request).
        let mut session = backend.new_session().unwrap();
        backend
            .forward(&mut session, &prompt[..7], LogitsFor::Last)
            .unwrap();
        assert_eq!(cache.missing_from(&prompt[..7]), Some(7));
        cache.insert(
            &prompt[..7],
            backend.capture_kv(&session, 7).unwrap(),
            backend.capture_state(&session).unwrap(),
        );
        assert_eq!(cache.entries(), 3);

        let mut cold = backend.new_session().unwrap();
        let (cold_logits, cold_ids) = finish(&backend, &mut cold, &prompt, 0);
        for (limit, expect) in [(t - 1, t - 2), (t - 2, t - 2), (t - 3, 7), (7, 7), (6, 0)] {
            let hit = cache.lookup(&prompt, limit);
            let Some(hit) = hit else {
                assert_eq!(expect, 0, "{name}: no hit within {limit}");
                continue;
            };
            assert_eq!(hit.tokens, expect, "{name}: the hit within {limit}");
            let mut restored = backend
                .restore_prefix(&hit.segments, hit.state, &prompt[..expect], t)
                .unwrap();
            let (logits, ids) = finish(&backend, &mut restored, &prompt, expect);
            let diff = max_abs_diff(&logits, &cold_logits[expect * vocab..]);
            let scale = cold_logits.iter().fold(1f32, |m, v| m.max(v.abs()));
            assert!(
                diff <= 1e-5 * scale,
                "{name}, hit of {expect}: logits differ by {diff}"
            );
            assert_eq!(ids, cold_ids);
        }
        // The diverging one resumes from its own leaf, through the split edge.
        let hit = cache
            .lookup(&[second.clone(), vec![2]].concat(), second.len())
            .unwrap();
        assert_eq!((hit.tokens, hit.segments.len()), (second.len(), 3));
    }
}

#[test]
fn eviction_keeps_within_capacity_and_prunes_what_cannot_be_resumed() {
    let backend = Backend::load(
        &fixture("qwen3_5_dense"),
        Device::Cpu,
        &LoadOptions::default(),
    )
    .unwrap();
    let prompt = long_prompt("qwen3_5_dense");
    let snapshot = |tokens: &[u32], from: usize| {
        let mut session = backend.new_session().unwrap();
        backend
            .forward(&mut session, tokens, LogitsFor::Last)
            .unwrap();
        (
            backend.capture_kv(&session, from).unwrap(),
            backend.capture_state(&session).unwrap(),
        )
    };
    let (kv, state) = snapshot(&prompt[..20], 0);
    let one = kv.bytes() + state.bytes();
    // Room for about two snapshots of this size.
    let mut cache = PrefixCache::new(one * 2 + one / 2);
    cache.insert(&prompt[..20], kv, state);
    let (kv, state) = snapshot(&prompt[..30], 20);
    cache.insert(&prompt[..30], kv, state);
    assert_eq!((cache.entries(), cache.evictions()), (2, 0));
    // Touch the first: the second (a leaf, used less recently) is evicted next.
    assert_eq!(cache.lookup(&prompt, 25).unwrap().tokens, 20);
    let mut other = prompt[..20].to_vec();
    other.extend(prompt[..20].iter().rev());
    let (kv, state) = snapshot(&other, 20);
    cache.insert(&other, kv, state);
    assert!(
        cache.bytes() <= one * 2 + one / 2,
        "{} bytes",
        cache.bytes()
    );
    assert!(cache.evictions() >= 1);
    assert_eq!(
        cache.lookup(&prompt, 35).unwrap().tokens,
        20,
        "the longer one is gone"
    );
    assert_eq!(
        cache.lookup(&other, other.len()).unwrap().tokens,
        other.len()
    );
    // Down to nothing: every node goes, the empty tree holds no bytes.
    cache.evict_to(0);
    assert_eq!((cache.bytes(), cache.entries()), (0, 0));
    assert!(cache.lookup(&prompt, 35).is_none());
}

fn demo() -> Arc<Model> {
    Arc::new(Model::load(&demo_dir().expect("the demo unpacks")).expect("the demo loads"))
}

fn chat_ids(model: &Model, system: &str, turns: &[(&str, &str)], user: &str) -> Vec<u32> {
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for (q, a) in turns {
        messages.push(serde_json::json!({"role": "user", "content": q}));
        messages.push(serde_json::json!({"role": "assistant", "content": a}));
    }
    messages.push(serde_json::json!({"role": "user", "content": user}));
    model
        .prepare(&Prompt::Chat {
            messages: serde_json::Value::Array(messages),
            tools: None,
            vars: Default::default(),
            add_generation_prompt: true,
        })
        .unwrap()
        .ids
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            presence_penalty: -100.0,
            ..SamplingParams::default()
        },
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        ..GenerateOptions::default()
    }
}

fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> Completion {
    let mut session = model.new_session().unwrap();
    model
        .generate(&mut session, prompt, options, &mut |_| Flow::Continue)
        .unwrap()
}

fn with_cache(model: &Arc<Model>, capacity: u64, interval: usize, max_seqs: usize) -> Scheduler {
    let markers = vec![model
        .tokenizer
        .token_to_id("<|im_start|>")
        .expect("a turn marker")];
    Scheduler::start_with_prefix_cache(
        Arc::clone(model),
        BatchConfig {
            max_seqs,
            token_budget: 64,
            state_budget: None,
        },
        Some(PrefixCacheConfig {
            capacity_bytes: capacity,
            interval,
            markers,
        }),
    )
    .unwrap()
}

const SYSTEM: &str = "You are a careful assistant for a hardware store. Answer questions about \
tools, fasteners, paint and garden supplies. Be brief, name the aisle, and never invent a product \
that the store does not stock. When a customer asks about prices, say that prices change weekly \
and point them to the shelf label. When a question is about safety, such as ladders, power tools \
or chemicals, give the safe way first and suggest asking staff. Keep a friendly tone and do not \
use lists unless asked for one.";

#[test]
fn the_scheduler_serves_shared_prefixes_from_the_cache_with_the_cold_answers() {
    let model = demo();
    let scheduler = with_cache(&model, u64::MAX, 32, 4);
    let first = chat_ids(&model, SYSTEM, &[], "Where are the wood screws?");
    let cold_first = solo(&model, &first, &greedy(12));
    let run = scheduler
        .submit(first.clone(), &greedy(12))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(run.ids, cold_first.ids);
    assert_eq!(run.cached_tokens, 0, "nothing was cached before");

    // Same system prompt, another question: everything before the user turn is restored.
    let second = chat_ids(&model, SYSTEM, &[], "Do you sell deck stain?");
    let system_turn = first
        .iter()
        .zip(&second)
        .take_while(|(a, b)| a == b)
        .count();
    let run = scheduler
        .submit(second.clone(), &greedy(12))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(run.ids, solo(&model, &second, &greedy(12)).ids);
    assert!(
        run.cached_tokens + 4 >= system_turn && run.cached_tokens <= system_turn,
        "{} cached of a shared {system_turn}",
        run.cached_tokens
    );

    // The next turn of the first chat: its whole history is restored.
    let answer = model.tokenizer.decode(&cold_first.ids, true).unwrap();
    let third = chat_ids(
        &model,
        SYSTEM,
        &[("Where are the wood screws?", &answer)],
        "And nails?",
    );
    let run = scheduler
        .submit(third.clone(), &greedy(12))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(run.ids, solo(&model, &third, &greedy(12)).ids);
    // At least up to the first chat's last turn marker (its answer is re-rendered by the
    // template, so what follows may tokenize differently).
    let marker = model.tokenizer.token_to_id("<|im_start|>").unwrap();
    let last_turn = first.iter().rposition(|&t| t == marker).unwrap();
    assert!(
        run.cached_tokens >= last_turn,
        "{} cached of {}, the first chat's last turn starts at {last_turn}",
        run.cached_tokens,
        third.len()
    );

    // Two requests that diverge after a shared prefix, at once: each gets its cold answer.
    let a = chat_ids(
        &model,
        SYSTEM,
        &[],
        "Which aisle has ladders, and how tall do they go?",
    );
    let b = chat_ids(
        &model,
        SYSTEM,
        &[],
        "Is there a paint mixing service on weekends?",
    );
    let handles = [
        scheduler.submit(a.clone(), &greedy(16)).unwrap(),
        scheduler.submit(b.clone(), &greedy(16)).unwrap(),
    ];
    let runs: Vec<_> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    assert_eq!(runs[0].ids, solo(&model, &a, &greedy(16)).ids);
    assert_eq!(runs[1].ids, solo(&model, &b, &greedy(16)).ids);
    assert!(runs.iter().all(|r| r.cached_tokens > 0));

    let stats = scheduler.stats().prefix.snapshot();
    assert!(stats.enabled && stats.hit_tokens > 0 && stats.entries > 0 && stats.bytes > 0);
    assert_eq!(
        stats.hit_tokens + stats.miss_tokens,
        (first.len() + second.len() + third.len() + a.len() + b.len()) as u64
    );
}

#[test]
fn eviction_under_a_tiny_cache_never_changes_an_answer() {
    let model = demo();
    let prompts: Vec<Vec<u32>> = [
        "Where are the wood screws?",
        "Do you sell deck stain?",
        "Where are the wood screws? I need them for a fence.",
        "Which aisle has ladders?",
    ]
    .iter()
    .map(|q| chat_ids(&model, SYSTEM, &[], q))
    .collect();
    // One snapshot of the demo model, to size the cache at a few of them.
    let mut session = model.new_session().unwrap();
    model
        .backend
        .forward(&mut session, &prompts[0][..40], LogitsFor::Last)
        .unwrap();
    let one = model.backend.capture_state(&session).unwrap().bytes()
        + model.backend.capture_kv(&session, 0).unwrap().bytes();
    for capacity in [0, one, 12 * one] {
        let scheduler = with_cache(&model, capacity, 16, 2);
        for round in 0..2 {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| scheduler.submit(p.clone(), &greedy(10)).unwrap())
                .collect();
            for (prompt, handle) in prompts.iter().zip(handles) {
                let run = handle.wait().unwrap();
                assert_eq!(
                    run.ids,
                    solo(&model, prompt, &greedy(10)).ids,
                    "capacity {capacity}, round {round}"
                );
            }
        }
        let stats = scheduler.stats().prefix.snapshot();
        assert!(
            stats.bytes <= capacity,
            "{} bytes in a cache of {capacity}",
            stats.bytes
        );
        assert!(
            stats.evictions > 0,
            "capacity {capacity}: nothing was evicted"
        );
        if capacity == 0 {
            assert_eq!(stats.hit_tokens, 0);
        }
        if capacity >= 12 * one {
            assert!(stats.hit_tokens > 0, "capacity {capacity}: no hit");
        }
    }
}

/// Preempted sequences give their solo answers, without a cache and with one (where the
/// preempted state is cached and the recompute resumes from it). Three prompts fit the state
/// budget but not three answers: the third is preempted as they grow, rejoins when the short
/// first one ends, and is preempted again as the second and it grow (a second preemption must
/// not repeat what it generated before the first).
#[test]
fn preempted_sequences_resume_from_the_cache_with_their_answers() {
    let model = demo();
    let config = model.config().clone();
    let state = |tokens: usize| spindle_model::install::plan::state_bytes(&config, tokens);
    // Plain text without EOS in it, so the penalty keeps the answers going.
    let text = |t: &str| {
        model
            .prepare(&Prompt::Text {
                text: t.into(),
                special_tokens: true,
            })
            .unwrap()
            .ids
    };
    let plan: Vec<(Vec<u32>, usize)> = [
        ("The wood screws are in aisle four, next to", 12),
        ("Deck stain comes in three colours, and", 200),
        ("Ladders of every height stand by the", 200),
    ]
    .iter()
    .map(|(t, n)| (text(t), *n))
    .collect();
    let longest = plan.iter().map(|(p, _)| p.len()).max().unwrap();
    let batch = BatchConfig {
        max_seqs: 3,
        token_budget: 64,
        state_budget: Some(state(longest + 4) * 3),
    };
    for cache in [false, true] {
        let prefix = cache.then(|| PrefixCacheConfig::for_model(&model, u64::MAX, 32));
        let scheduler =
            Scheduler::start_with_prefix_cache(Arc::clone(&model), batch, prefix).unwrap();
        let handles: Vec<_> = plan
            .iter()
            .map(|(p, n)| scheduler.submit(p.clone(), &greedy(*n)).unwrap())
            .collect();
        for ((prompt, n), handle) in plan.iter().zip(handles) {
            let run = handle.wait().unwrap();
            assert_eq!(
                run.ids,
                solo(&model, prompt, &greedy(*n)).ids,
                "cache {cache}"
            );
            assert_eq!(run.ids.len(), *n);
            assert!(
                run.cached_tokens < prompt.len(),
                "{} cached of {}",
                run.cached_tokens,
                prompt.len()
            );
        }
        let stats = scheduler.stats();
        assert!(
            stats.preemptions() >= 2,
            "{} preemptions",
            stats.preemptions()
        );
        if cache {
            assert!(stats.prefix.snapshot().hit_tokens > 0);
        }
    }
}

/// A model with no full-attention layer (its KV pool has no blocks) captures and restores
/// its prefixes too: the GDN state alone, the KV pieces empty.
#[test]
fn a_model_without_attention_layers_restores_its_prefix() {
    // The qwen3_5_moe fixture cut to its first three layers, all linear attention.
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("qwen3_5_moe")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let text = if config.get("text_config").is_some() {
        &mut config["text_config"]
    } else {
        &mut config
    };
    text["num_hidden_layers"] = 3.into();
    let types = text["layer_types"].as_array().unwrap()[..3].to_vec();
    assert!(types.iter().all(|t| t == "linear_attention"));
    text["layer_types"] = types.into();
    std::fs::write(&config_path, config.to_string()).unwrap();

    let backend = Backend::load(dir.path(), Device::Cpu, &LoadOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 200).collect();
    let cut = 21;
    let mut warm = backend.new_session().unwrap();
    backend
        .forward(&mut warm, &prompt[..cut], LogitsFor::Last)
        .unwrap();
    let kv = backend.capture_kv(&warm, 0).unwrap();
    let state = backend.capture_state(&warm).unwrap();
    let (head, tail) = kv.split_at(9);
    let mut restored = backend
        .restore_prefix(&[&head, &tail], &state, &prompt[..cut], prompt.len())
        .unwrap();
    let (logits, ids) = finish(&backend, &mut restored, &prompt, cut);
    let (want, want_ids) = finish(&backend, &mut warm, &prompt, cut);
    assert!(
        logits == want,
        "the restored session differs from the original"
    );
    assert_eq!(ids, want_ids);
}
