//! Prompts with images through the runtime on the tiny vision fixture
//! (`qwen3_5_dense_vision`): `Model::generate_prompt` and the batch scheduler give the greedy
//! tokens transformers gave, with the prompt prefilled in chunks that cut through the images,
//! with sequences preempted and recomputed, and with a prefix cache that never hands one
//! image's state to a request with another image. Pads that do not match the images are
//! refused by name.

use std::sync::Arc;

use spindle_runtime::batch::{BatchConfig, Scheduler};
use spindle_runtime::prefix::PrefixCacheConfig;
use spindle_runtime::{Flow, GenerateOptions, Model, RuntimeError, TokenPrompt};
use spindle_testkit::{copy_fixture, Reference};
use spindle_vision::{patchify, Geometry, PreparedImage, Rgb8};
use tempfile::TempDir;

const NAME: &str = "qwen3_5_dense_vision";

/// The fixture with a word-level tokenizer of its 512 ids (the runtime needs one; the tests
/// feed ids).
fn model() -> (Arc<Model>, TempDir) {
    let dir = copy_fixture(NAME);
    let vocab: serde_json::Map<String, serde_json::Value> = (0..512)
        .map(|i| (format!("t{i}"), serde_json::Value::from(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let model = Model::load(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (Arc::new(model), dir)
}

fn image(reference: &Reference, key: &str) -> Rgb8 {
    let (shape, data) = reference.u8(key);
    Rgb8 {
        height: shape[0],
        width: shape[1],
        data,
    }
}

fn prepared(image: &Rgb8) -> PreparedImage {
    patchify(image, &Geometry::default()).unwrap()
}

/// The fixture's prompt with its two images, and the greedy tokens transformers gave.
fn fixture_prompt() -> (TokenPrompt, Vec<u32>) {
    let reference = Reference::load(NAME);
    let images = vec![
        prepared(&image(&reference, "image_0")),
        prepared(&image(&reference, "image_1")),
    ];
    (
        TokenPrompt::new(reference.ids("prompt_ids"), images),
        reference.ids("gen_ids"),
    )
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: Some(n),
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

#[test]
fn generate_prompt_gives_transformers_greedy_tokens() {
    let (model, _dir) = model();
    let (prompt, expected) = fixture_prompt();
    let mut session = model.new_session().unwrap();
    let completion = model
        .generate_prompt(&mut session, &prompt, &greedy(expected.len()), &mut |_| {
            Flow::Continue
        })
        .unwrap();
    assert_eq!(completion.ids, expected);
    // The same ids without their images are refused, not run as ordinary tokens.
    let mut session = model.new_session().unwrap();
    let err = model
        .generate(&mut session, &prompt.ids, &greedy(2), &mut |_| {
            Flow::Continue
        })
        .unwrap_err();
    assert!(matches!(err, RuntimeError::Image(_)), "{err}");
    assert!(err.to_string().contains("no image was given"), "{err}");
}

#[test]
fn the_scheduler_runs_image_prompts_in_chunks_and_through_preemption() {
    let (model, _dir) = model();
    let (prompt, expected) = fixture_prompt();
    // Chunks of 4 tokens cut through both images' pads; two sequences over a state budget
    // that holds one preempt and recompute (the features are fed again).
    // Both prompts' state fits (so both are admitted), but not once both decode.
    let state = |tokens| spindle_model::install::plan::state_bytes(model.config(), tokens);
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 2,
            token_budget: 4,
            state_budget: Some(2 * state(prompt.ids.len()) + state(41) - state(40)),
        },
    )
    .unwrap();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            scheduler
                .submit(prompt.clone(), &greedy(expected.len()))
                .unwrap()
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.wait().unwrap().ids, expected);
    }
    assert!(
        scheduler.stats().preemptions() > 0,
        "no sequence was preempted"
    );
}

#[test]
fn the_prefix_cache_never_restores_another_images_state() {
    let (model, _dir) = model();
    let (prompt, expected) = fixture_prompt();
    // The same ids with the second image changed (its pixels inverted): another answer.
    let reference = Reference::load(NAME);
    let mut other = image(&reference, "image_1");
    other.data.iter_mut().for_each(|v| *v = 255 - *v);
    let mut changed = prompt.clone();
    changed.images[1] = prepared(&other);
    let cold = {
        let mut session = model.new_session().unwrap();
        model
            .generate_prompt(&mut session, &changed, &greedy(expected.len()), &mut |_| {
                Flow::Continue
            })
            .unwrap()
            .ids
    };
    assert_ne!(
        cold, expected,
        "the changed image must change the answer for this test"
    );

    let scheduler = Scheduler::start_with_prefix_cache(
        Arc::clone(&model),
        BatchConfig::default(),
        Some(PrefixCacheConfig {
            capacity_bytes: 1 << 26,
            interval: 2,
            markers: vec![],
        }),
    )
    .unwrap();
    let first = scheduler
        .submit(prompt.clone(), &greedy(expected.len()))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(first.ids, expected);
    let second = scheduler
        .submit(changed, &greedy(expected.len()))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        second.ids, cold,
        "a cached prefix past an image pad was restored"
    );
    // Only the text before the first pad (position 6) could come from the cache.
    let first_pad = prompt.ids.iter().position(|&id| id == 5).unwrap();
    assert!(
        second.cached_tokens > 0 && second.cached_tokens <= first_pad,
        "{}",
        second.cached_tokens
    );
    // A text-only prompt sharing the prefix still hits it.
    let text: Vec<u32> = prompt.ids[..first_pad]
        .iter()
        .copied()
        .chain([7, 8])
        .collect();
    let third = scheduler.submit(text, &greedy(2)).unwrap().wait().unwrap();
    assert!(third.cached_tokens > 0);
}

#[test]
fn the_scheduler_refuses_pads_that_do_not_match_the_images() {
    let (model, _dir) = model();
    let scheduler = Scheduler::start(Arc::clone(&model), BatchConfig::default()).unwrap();
    let (prompt, _) = fixture_prompt();
    let refused = |p: TokenPrompt| match scheduler.submit(p, &greedy(2)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    let m = refused(TokenPrompt::from(prompt.ids.clone()));
    assert!(
        m.contains("19 <|image_pad|>") && m.contains("no image was given"),
        "{m}"
    );
    let m = refused(TokenPrompt::new(vec![1, 2, 3], prompt.images.clone()));
    assert!(
        m.contains("0 <|image_pad|>") && m.contains("image 0: 15"),
        "{m}"
    );
    let m = refused(TokenPrompt::new(
        prompt.ids.clone(),
        vec![prompt.images[0].clone()],
    ));
    assert!(
        m.contains("19 <|image_pad|>") && m.contains("take 15"),
        "{m}"
    );
}
