//! The CPU's paged KV cache (`spindle_model::paged`, `spindle_cpu::paged`): a cached prefix is
//! shared by the sequences restored from it (its blocks referenced, not copied; a block it ends
//! in mid-way copied on the first write), each sequence giving the logits of the same request
//! run cold; a pool too small for every request at once makes requests wait or be preempted,
//! never changes an answer; every block goes back to the pool when the sequences end, are
//! cancelled, and the prefix cache is cleared.

use std::sync::Arc;

use spindle_cpu::{LoadOptions, LogitsFor};
use spindle_kernels::softmax::argmax;
use spindle_model::paged::{blocks_for, BLOCK_TOKENS};
use spindle_runtime::backend::BatchItem;
use spindle_runtime::batch::{BatchConfig, Scheduler, SeqEvent};
use spindle_runtime::prefix::PrefixCacheConfig;
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{
    demo_dir, Backend, BackendSession, Completion, Device, Flow, GenerateOptions, Model, Prompt,
};
use spindle_testkit::{fixture, max_abs_diff, Reference};

/// Greedy steps decoded after the prompt.
const STEPS: usize = 5;

fn used(backend: &Backend) -> usize {
    backend
        .kv_blocks()
        .expect("the CPU pages its KV cache")
        .used
}

fn shared(backend: &Backend) -> usize {
    backend
        .kv_blocks()
        .expect("the CPU pages its KV cache")
        .shared
}

/// Feeds each session its tail (all rows' logits), then `STEPS` greedy tokens, every session
/// in the same batched steps: each one's logits and greedy ids.
fn run_together(
    backend: &Backend,
    sessions: &mut [BackendSession],
    tails: &[&[u32]],
) -> Vec<(Vec<f32>, Vec<u32>)> {
    let vocab = backend.config().vocab_size;
    let mut out: Vec<(Vec<f32>, Vec<u32>)> = vec![(Vec::new(), Vec::new()); sessions.len()];
    let mut feed: Vec<Vec<u32>> = tails.iter().map(|t| t.to_vec()).collect();
    for step in 0..=STEPS {
        let mut items: Vec<BatchItem> = sessions
            .iter_mut()
            .zip(&feed)
            .map(|(session, ids)| BatchItem {
                session,
                ids,
                want: if step == 0 {
                    LogitsFor::All
                } else {
                    LogitsFor::Last
                },
            })
            .collect();
        let results = backend.forward_batch(&mut items);
        for (n, logits) in results.into_iter().enumerate() {
            let logits = logits.unwrap();
            let next = argmax(&logits[logits.len() - vocab..]) as u32;
            out[n].0.extend(logits);
            if step < STEPS {
                out[n].1.push(next);
            }
            feed[n] = vec![next];
        }
    }
    out
}

/// The same request cold in one session: `prompt` in one pass, then `STEPS` greedy tokens;
/// the logits from position `from` on.
fn cold(backend: &Backend, prompt: &[u32], from: usize) -> (Vec<f32>, Vec<u32>) {
    let mut sessions = [backend.new_session().unwrap()];
    let (logits, ids) = run_together(backend, &mut sessions, &[prompt]).remove(0);
    let vocab = backend.config().vocab_size;
    (logits[from * vocab..].to_vec(), ids)
}

fn assert_close(label: &str, got: &(Vec<f32>, Vec<u32>), cold: &(Vec<f32>, Vec<u32>)) {
    let diff = max_abs_diff(&got.0, &cold.0);
    let scale = cold.0.iter().fold(1f32, |m, v| m.max(v.abs()));
    assert!(
        diff <= 1e-5 * scale,
        "{label}: logits differ by {diff} (scale {scale})"
    );
    assert_eq!(got.1, cold.1, "{label}: greedy ids differ");
}

#[test]
fn sequences_diverging_after_a_cached_prefix_share_its_blocks_and_give_the_cold_logits() {
    for name in ["qwen3_5_moe", "qwen4_exp", "qwen3_next_moe"] {
        let backend = Backend::load(&fixture(name), Device::Cpu, &LoadOptions::default()).unwrap();
        let reference = Reference::load(name);
        let once = [reference.ids("prompt_ids"), reference.ids("gen_ids")].concat();
        let prompt = [once.clone(), once.clone(), once].concat();
        assert!(
            prompt.len() > 2 * BLOCK_TOKENS + 8,
            "{name}: a longer prompt"
        );
        // On a block edge, mid-block, one token past an edge.
        for cut in [2 * BLOCK_TOKENS, BLOCK_TOKENS + 5, BLOCK_TOKENS + 1] {
            let label = format!("{name}, prefix of {cut}");
            assert_eq!(used(&backend), 0, "{label}: blocks left from before");
            let a: Vec<u32> = prompt[..cut + 8].to_vec();
            let mut b: Vec<u32> = prompt[..cut].to_vec();
            b.extend([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]);
            let (cold_a, cold_b) = (cold(&backend, &a, cut), cold(&backend, &b, cut));

            // The prefix, captured as the prefix cache does, then its session gone.
            let mut warm = backend.new_session().unwrap();
            backend
                .forward(&mut warm, &prompt[..cut], LogitsFor::Last)
                .unwrap();
            let kv = backend.capture_kv(&warm, 0).unwrap();
            let state = backend.capture_state(&warm).unwrap();
            drop(warm);
            let prefix_blocks = blocks_for(cut);
            assert_eq!(
                used(&backend),
                prefix_blocks,
                "{label}: the piece holds its blocks"
            );

            // Two sequences restored from it: the blocks are referenced, not copied.
            let restore = || {
                backend
                    .restore_prefix(&[&kv], &state, &prompt[..cut], cut)
                    .unwrap()
            };
            let mut sessions = [restore(), restore()];
            assert_eq!(
                used(&backend),
                prefix_blocks,
                "{label}: restoring copied blocks"
            );
            assert_eq!(shared(&backend), prefix_blocks, "{label}");

            let runs = run_together(&backend, &mut sessions, &[&a[cut..], &b[cut..]]);
            assert_close(&format!("{label}, a"), &runs[0], &cold_a);
            assert_close(&format!("{label}, b"), &runs[1], &cold_b);
            // The full blocks are still shared, counted once; the block the prefix ends in
            // mid-way was copied by each sequence before it wrote into it.
            let full = cut / BLOCK_TOKENS;
            let own = |len: usize| blocks_for(len) - full;
            let expect = prefix_blocks + own(a.len() + STEPS) + own(b.len() + STEPS);
            assert_eq!(used(&backend), expect, "{label}: blocks in use");
            assert_eq!(shared(&backend), full, "{label}: blocks shared");

            // The cached piece is untouched by their writes: a third sequence restored from it
            // now runs as the first did in its own session.
            let mut third = [restore()];
            let again = run_together(&backend, &mut third, &[&a[cut..]]);
            assert_close(&format!("{label}, a again"), &again[0], &cold_a);

            drop(sessions);
            drop(third);
            assert_eq!(
                used(&backend),
                prefix_blocks,
                "{label}: only the piece's blocks left"
            );
            drop(kv);
            assert_eq!(used(&backend), 0, "{label}: every block back in the pool");
            assert_eq!(shared(&backend), 0);
        }
    }
}

fn demo_with(kv_pool_bytes: Option<u64>) -> Arc<Model> {
    let options = LoadOptions {
        kv_pool_bytes,
        ..LoadOptions::default()
    };
    Arc::new(Model::load_with(&demo_dir().expect("the demo unpacks"), &options).unwrap())
}

fn text_ids(model: &Model, text: &str) -> Vec<u32> {
    model
        .prepare(&Prompt::Text {
            text: text.into(),
            special_tokens: true,
        })
        .unwrap()
        .ids
}

/// Greedy, and never ending on EOS (the tokens already seen win), so a sequence runs to
/// `max_tokens` or until cancelled.
fn endless(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams {
            presence_penalty: -100.0,
            ..SamplingParams::default()
        },
        max_tokens: Some(max_tokens),
        ..GenerateOptions::default()
    }
}

fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> Completion {
    let mut session = model.new_session().unwrap();
    model
        .generate(&mut session, prompt, options, &mut |_| Flow::Continue)
        .unwrap()
}

fn scheduler(model: &Arc<Model>, cache: bool) -> Scheduler {
    let prefix = cache.then(|| PrefixCacheConfig {
        capacity_bytes: u64::MAX,
        interval: BLOCK_TOKENS,
        markers: Vec::new(),
    });
    Scheduler::start_with_prefix_cache(
        Arc::clone(model),
        BatchConfig {
            max_seqs: 4,
            token_budget: 64,
            state_budget: None,
        },
        prefix,
    )
    .unwrap()
}

#[test]
fn a_pool_too_small_for_every_request_changes_no_answer_and_frees_every_block() {
    let roomy = demo_with(None);
    let block_bytes = roomy.backend.kv_blocks().unwrap().block_bytes as u64;
    let prompts: Vec<Vec<u32>> = [
        "The first prompt is the longest one of them all, by a few words",
        "A second prompt",
        "Third",
        "And the fourth prompt of this test",
    ]
    .iter()
    .map(|text| text_ids(&roomy, text))
    .collect();
    let generate = 40;
    let longest = prompts.iter().map(Vec::len).max().unwrap() + generate;
    let expected: Vec<Completion> = prompts
        .iter()
        .map(|p| solo(&roomy, p, &endless(generate)))
        .collect();
    // Room for the longest sequence alone and a bit: the four cannot all run at once.
    let blocks = blocks_for(longest) + 1;
    let tight = demo_with(Some(blocks as u64 * block_bytes));
    assert_eq!(tight.backend.kv_blocks().unwrap().capacity, blocks);
    for cache in [false, true] {
        let scheduler = scheduler(&tight, cache);
        for round in 0..2 {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| scheduler.submit(p.clone(), &endless(generate)).unwrap())
                .collect();
            for (n, handle) in handles.into_iter().enumerate() {
                let got = handle.wait().unwrap();
                assert_eq!(
                    got.ids, expected[n].ids,
                    "prompt {n}, cache {cache}, round {round}"
                );
            }
        }
        let stats = scheduler.stats();
        assert!(
            stats.preemptions() > 0,
            "cache {cache}: a pool of {blocks} blocks should have forced a preemption"
        );
        if cache {
            assert!(
                stats.prefix.snapshot().evictions > 0,
                "the cache gave blocks back"
            );
            scheduler.clear_prefix_cache();
        }
        let kv = stats.kv_blocks().expect("published");
        assert_eq!(
            (kv.used, kv.shared),
            (0, 0),
            "cache {cache}: blocks left in use"
        );
        assert_eq!(tight.backend.kv_blocks().unwrap().used, 0);
    }

    // A request the pool cannot hold even alone fails with the pool named, and nothing else.
    let scheduler = scheduler(&tight, false);
    let huge: Vec<u32> = prompts[0]
        .iter()
        .cycle()
        .take((blocks + 1) * BLOCK_TOKENS)
        .copied()
        .collect();
    assert!(blocks_for(huge.len()) > blocks);
    let err = scheduler
        .submit(huge, &endless(4))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(err.to_string().contains("KV block pool is full"), "{err}");
    let fine = scheduler
        .submit(prompts[1].clone(), &endless(generate))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(fine.ids, expected[1].ids);
}

#[test]
fn a_cancelled_request_frees_its_blocks_at_once() {
    let model = demo_with(None);
    for cache in [false, true] {
        let scheduler = scheduler(&model, cache);
        let prompt = text_ids(&model, "Once upon a time, in a workshop full of tools,");
        let handle = scheduler.submit(prompt.clone(), &endless(100_000)).unwrap();
        // Several texts: it has run a few steps, past its first blocks.
        for _ in 0..(2 * BLOCK_TOKENS) {
            assert!(matches!(handle.recv(), Some(SeqEvent::Text(_))));
        }
        assert!(scheduler.stats().kv_blocks().unwrap().used >= 2);
        handle.cancel();
        loop {
            match handle.recv() {
                Some(SeqEvent::Done(result)) => {
                    result.unwrap();
                    break;
                }
                Some(_) => {}
                None => panic!("no Done event"),
            }
        }
        // Counted before the end was sent: without a cache no block is left in use; with one,
        // the cache alone holds the blocks of what the sequence ran.
        let kv = scheduler.stats().kv_blocks().unwrap();
        if !cache {
            assert_eq!(kv.used, 0, "the cancelled sequence's blocks are free");
        }
        scheduler.clear_prefix_cache();
        assert_eq!(
            scheduler.stats().kv_blocks().unwrap().used,
            0,
            "cache {cache}"
        );
        assert_eq!(model.backend.kv_blocks().unwrap().used, 0);
    }
}

/// A chat whose system prompt is `words` words long, then `question`.
fn chat(model: &Model, words: usize, question: &str) -> Vec<u32> {
    let system: Vec<String> = (0..words)
        .map(|n| ["tools", "paint", "aisle", "garden", "screws"][n % 5].to_string())
        .collect();
    let messages = serde_json::json!([
        {"role": "system", "content": system.join(" ")},
        {"role": "user", "content": question},
    ]);
    model
        .prepare(&Prompt::Chat {
            messages,
            tools: None,
            vars: Default::default(),
            add_generation_prompt: true,
        })
        .unwrap()
        .ids
}

#[test]
fn eight_requests_in_flight_after_a_long_shared_prompt_hold_its_blocks_once() {
    let model = demo_with(None);
    let marker = model.tokenizer.token_to_id("<|im_start|>").unwrap();
    let scheduler = Scheduler::start_with_prefix_cache(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 8,
            token_budget: 1024,
            state_budget: None,
        },
        Some(PrefixCacheConfig {
            capacity_bytes: u64::MAX,
            interval: 1024,
            markers: vec![marker],
        }),
    )
    .unwrap();
    // The system prompt's blocks go into the cache with the first request.
    let first = chat(&model, 720, "Where are the screws?");
    scheduler
        .submit(first.clone(), &endless(4))
        .unwrap()
        .wait()
        .unwrap();
    let questions = [
        "Do you sell paint?",
        "Is the garden aisle open?",
        "Where are the ladders?",
        "Can I return tools?",
        "Do you cut keys?",
        "Are there nails?",
        "Who mixes paint?",
        "Is there parking?",
    ];
    let prompts: Vec<Vec<u32>> = questions.iter().map(|q| chat(&model, 720, q)).collect();
    let shared_tokens = first
        .iter()
        .zip(&prompts[0])
        .take_while(|(a, b)| a == b)
        .count();
    assert!(shared_tokens > 1900, "{shared_tokens} shared tokens");
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| scheduler.submit(p.clone(), &endless(64)).unwrap())
        .collect();
    // Every one past its prompt and decoding (none ends before 64 tokens).
    for handle in &handles {
        assert!(matches!(handle.recv(), Some(SeqEvent::Text(_))));
    }
    assert_eq!(scheduler.stats().running(), 8);
    let kv = model.backend.kv_blocks().unwrap();
    let prompt_blocks = blocks_for(prompts.iter().map(Vec::len).max().unwrap() + 64);
    // Copies would take 8 prompts' blocks; shared, the system prompt's are held once.
    let unshared = 8 * prompt_blocks;
    assert!(
        kv.used * 4 < unshared,
        "{} blocks in use, {} shared; per-sequence copies would take {unshared}",
        kv.used,
        kv.shared
    );
    assert!(
        kv.shared >= shared_tokens / BLOCK_TOKENS - 1,
        "{} shared",
        kv.shared
    );
    eprintln!(
        "8 requests after a {shared_tokens}-token shared prompt: {} blocks in use ({} shared) of \
         {} bytes each; per-sequence copies: {unshared}",
        kv.used, kv.shared, kv.block_bytes
    );
    for (prompt, handle) in prompts.iter().zip(handles) {
        let got = handle.wait().unwrap();
        assert_eq!(got.ids, solo(&model, prompt, &endless(64)).ids);
    }
    scheduler.clear_prefix_cache();
    assert_eq!(model.backend.kv_blocks().unwrap().used, 0);
}
