//! The CUDA KV block pool under the shared scheduler (the embedded demo model on the GPU): a
//! pool too small for every request at once makes requests wait or be preempted (the prefix
//! cache giving its blocks back first), never changes an answer, and every block goes back
//! when the requests end and the prefix cache is cleared; a request the pool cannot hold even
//! alone fails with the pool named. Needs a CUDA GPU: `cargo test --release -p spindle-runtime
//! --features cuda --test paged_cuda -- --ignored --test-threads=1`.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use spindle_cpu::LoadOptions;
use spindle_model::paged::{blocks_for, BLOCK_TOKENS};
use spindle_runtime::batch::{BatchConfig, Scheduler};
use spindle_runtime::prefix::PrefixCacheConfig;
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{demo_dir, Completion, Device, Flow, GenerateOptions, Model, Prompt};

fn gpu_demo(kv_pool_bytes: Option<u64>) -> Arc<Model> {
    let dir = demo_dir().expect("the demo unpacks");
    let options = LoadOptions {
        kv_pool_bytes,
        ..LoadOptions::default()
    };
    Arc::new(
        Model::load_on(&dir, Device::Cuda(0), &options)
            .unwrap_or_else(|e| panic!("the demo loads on cuda:0: {e}")),
    )
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
/// `max_tokens`.
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
#[ignore = "needs a CUDA GPU"]
fn a_pool_too_small_for_every_request_changes_no_answer_and_frees_every_block() {
    let roomy = gpu_demo(None);
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
    drop(roomy);
    // Room for the longest sequence alone and a bit: the four cannot all run at once.
    let blocks = blocks_for(longest) + 1;
    let tight = gpu_demo(Some(blocks as u64 * block_bytes));
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
        let stats = Arc::clone(scheduler.stats());
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
        drop(scheduler);
        // The batched steps' pad sequence keeps one block of its own.
        let kv = tight.backend.kv_blocks().unwrap();
        assert!(
            kv.used <= 1 && kv.shared == 0,
            "cache {cache}: {kv:?} left in use"
        );
        eprintln!("cache {cache}: 4 requests x 2 rounds in a pool of {blocks} blocks, answers unchanged, {} preemptions", stats.preemptions());
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
