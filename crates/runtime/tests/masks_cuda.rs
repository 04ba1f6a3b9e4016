//! Constrained decoding on CUDA (the embedded demo model on the GPU): token masks applied by
//! the device sampler, every sequence of a step in one forward batch. Device-masked greedy
//! (the scheduler: `forward_batch_step`, masks computed while the step runs) equals
//! host-masked greedy (`Model::generate`: the row on the host, masked there); a mask of one
//! token forces it; mixed batches (constrained, free, log-probabilities, bans before
//! `min_tokens`) give every sequence what it gets alone, and a seed what it gives alone.
//! Needs a CUDA GPU: `cargo test --release -p spindle-runtime --features cuda --test masks_cuda
//! -- --ignored --test-threads=1`.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use serde_json::{json, Map, Value};
use spindle_cpu::{LoadOptions, LogitsFor};
use spindle_runtime::backend::{BatchItem, Draw, Pick, Picked};
use spindle_runtime::batch::{BatchConfig, Scheduler};
use spindle_runtime::sampling::{Penalised, SamplingParams};
use spindle_runtime::{
    demo_dir, Completion, Device, Flow, GenerateOptions, Grammar, Model, Prompt,
};

fn gpu_demo() -> Arc<Model> {
    let dir = demo_dir().expect("the demo unpacks");
    Arc::new(
        Model::load_on(&dir, Device::Cuda(0), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("the demo loads on cuda:0: {e}")),
    )
}

fn chat_ids(model: &Model, text: &str) -> Vec<u32> {
    model
        .prepare(&Prompt::Chat {
            messages: json!([{"role": "user", "content": text}]),
            tools: None,
            vars: Map::new(),
            add_generation_prompt: true,
        })
        .unwrap()
        .ids
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(max_tokens),
        ..GenerateOptions::default()
    }
}

fn constrained(model: &Model, grammar: &Grammar, options: GenerateOptions) -> GenerateOptions {
    GenerateOptions {
        constraint: Some(model.constraint(grammar).unwrap()),
        ..options
    }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

/// `Model::generate`: every row comes to the host and is masked and sampled there.
fn host_path(model: &Model, prompt: &[u32], options: &GenerateOptions) -> Completion {
    let mut session = model.new_session().unwrap();
    model
        .generate(&mut session, prompt, options, &mut |_| Flow::Continue)
        .unwrap()
}

/// Every request at once through the scheduler: masks applied on the device.
fn scheduled(model: &Arc<Model>, runs: &[(Vec<u32>, GenerateOptions)]) -> Vec<Completion> {
    let scheduler = Scheduler::start(Arc::clone(model), BatchConfig::default()).unwrap();
    let handles: Vec<_> = runs
        .iter()
        .map(|(prompt, options)| scheduler.submit(prompt.clone(), options).unwrap())
        .collect();
    handles.into_iter().map(|h| h.wait().unwrap()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_masked_greedy_equals_host_masked_greedy() {
    let model = gpu_demo();
    assert!(model.backend.samples_on_device());
    let runs: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (
            chat_ids(&model, "A person as JSON."),
            constrained(&model, &Grammar::JsonSchema(person_schema()), greedy(120)),
        ),
        (
            chat_ids(&model, "A code."),
            constrained(
                &model,
                &Grammar::Regex(r"[a-z]{2,6}-[0-9]{1,3}".into()),
                greedy(20),
            ),
        ),
        (
            chat_ids(&model, "Any object."),
            constrained(&model, &Grammar::JsonObject, greedy(40)),
        ),
    ];
    for ((prompt, options), got) in runs.iter().zip(scheduled(&model, &runs)) {
        let want = host_path(&model, prompt, options);
        assert_eq!((&got.ids, &got.text), (&want.ids, &want.text));
    }
    let person: Value = serde_json::from_str(&host_path(&model, &runs[0].0, &runs[0].1).text)
        .expect("the schema's output is JSON");
    assert_eq!(person.as_object().unwrap().len(), 3, "{person}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_mask_allowing_one_token_forces_it_on_the_device() {
    let model = gpu_demo();
    let vocab = model.config().vocab_size;
    let prompt = chat_ids(&model, "Pick one.");
    let logits = model
        .backend
        .forward(&mut model.new_session().unwrap(), &prompt, LogitsFor::Last)
        .unwrap();
    let worst = (0..vocab as u32)
        .min_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
        .unwrap();
    let best = spindle_kernels::softmax::argmax(&logits) as u32;
    let mut bits = vec![0u32; vocab.div_ceil(32)];
    bits[worst as usize / 32] |= 1 << (worst % 32);
    let hot = SamplingParams {
        temperature: 2.0,
        ..SamplingParams::default()
    };
    let cold = SamplingParams::default();
    let mut sessions: Vec<_> = (0..3).map(|_| model.new_session().unwrap()).collect();
    let mut items: Vec<BatchItem> = sessions
        .iter_mut()
        .map(|session| BatchItem {
            session,
            ids: &prompt,
            want: LogitsFor::Last,
        })
        .collect();
    let picks = [
        Pick::Sample(Draw {
            params: &hot,
            uniform: 0.999,
            penalised: Penalised::NONE,
        }),
        Pick::Sample(Draw {
            params: &cold,
            uniform: 0.0,
            penalised: Penalised::NONE,
        }),
        Pick::Sample(Draw {
            params: &cold,
            uniform: 0.0,
            penalised: Penalised::NONE,
        }),
    ];
    let picked: Vec<Picked> = model
        .backend
        .forward_batch_step(&mut items, &picks, || {
            vec![Some(bits.clone()), Some(bits.clone()), None]
        })
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(picked[0], Picked::Token(worst));
    assert_eq!(picked[1], Picked::Token(worst));
    assert_eq!(picked[2], Picked::Token(best));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn mixed_batches_equal_solo_runs() {
    let model = gpu_demo();
    let seeded = |seed| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let base = host_path(&model, &chat_ids(&model, "e"), &greedy(8));
    let runs: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (
            chat_ids(&model, "a"),
            constrained(&model, &Grammar::JsonSchema(person_schema()), greedy(100)),
        ),
        (
            chat_ids(&model, "b"),
            GenerateOptions {
                logprobs: Some(2),
                ..greedy(12)
            },
        ),
        (
            chat_ids(&model, "c"),
            constrained(
                &model,
                &Grammar::JsonObject,
                GenerateOptions {
                    sampling: seeded(9),
                    ..greedy(40)
                },
            ),
        ),
        (
            chat_ids(&model, "e"),
            GenerateOptions {
                stop_token_ids: vec![base.ids[1]],
                min_tokens: 4,
                ..greedy(8)
            },
        ),
        (chat_ids(&model, "f f f"), greedy(16)),
        (
            chat_ids(&model, "g"),
            GenerateOptions {
                sampling: seeded(5),
                ..greedy(16)
            },
        ),
    ];
    let together = scheduled(&model, &runs);
    for (n, run) in runs.iter().enumerate() {
        let alone = scheduled(&model, std::slice::from_ref(run));
        assert_eq!(
            (&together[n].ids, &together[n].text),
            (&alone[0].ids, &alone[0].text),
            "sequence {n}"
        );
        if run.1.sampling.seed.is_none() {
            // Greedy: the host path picks the same tokens.
            let host = host_path(&model, &run.0, &run.1);
            assert_eq!(
                together[n].ids, host.ids,
                "sequence {n} against the host path"
            );
        }
    }
    assert!(together[3].ids.len() >= 4, "{:?}", together[3].ids);
}
