//! The continuous-batching scheduler on the embedded demo model (CPU): every sequence of a
//! batch that differs in every way (prompt lengths, prompts chunked over steps, one finishing
//! early, one cancelled mid-way, one joining mid-way, more than fit at once) gives the tokens
//! it gives alone through `Model::generate`; a seed gives the same text whatever else runs;
//! cancelling frees the sequence.

use std::sync::Arc;

use spindle_runtime::batch::{BatchConfig, Scheduler, SeqEvent};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{demo_dir, Completion, Finish, Flow, GenerateOptions, Model, Prompt};

fn demo() -> Arc<Model> {
    Arc::new(Model::load(&demo_dir().expect("the demo unpacks")).expect("the demo loads"))
}

fn ids(model: &Model, text: &str) -> Vec<u32> {
    model
        .prepare(&Prompt::Text {
            text: text.into(),
            special_tokens: true,
        })
        .unwrap()
        .ids
}

fn options(max_tokens: usize, sampling: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        sampling,
        max_tokens: Some(max_tokens),
        ..GenerateOptions::default()
    }
}

/// Greedy, and never ending on EOS: a large negative presence penalty makes the tokens
/// already seen win, so the sequence runs to `max_tokens` (or is cancelled).
fn endless(max_tokens: usize) -> GenerateOptions {
    options(
        max_tokens,
        SamplingParams {
            presence_penalty: -100.0,
            ..SamplingParams::default()
        },
    )
}

fn solo(model: &Model, prompt: &[u32], options: &GenerateOptions) -> Completion {
    let mut session = model.new_session().unwrap();
    model
        .generate(&mut session, prompt, options, &mut |_| Flow::Continue)
        .unwrap()
}

/// Collects a handle's text until `Done`; returns the text and the completion.
fn collect(handle: spindle_runtime::batch::SequenceHandle) -> (String, Completion) {
    let mut text = String::new();
    while let Some(event) = handle.recv() {
        match event {
            SeqEvent::Text(t) => text.push_str(&t),
            SeqEvent::Done(result) => return (text, result.expect("the sequence runs")),
            SeqEvent::Logprobs(_) => panic!("logprobs were not asked for"),
        }
    }
    panic!("no Done event");
}

#[test]
fn every_sequence_of_a_mixed_batch_matches_its_solo_run() {
    let model = demo();
    let short = ids(&model, "Hi");
    let medium = ids(&model, "Tell me a story about a robot who learns to paint.");
    let long = ids(
        &model,
        &"The quick brown fox jumps over the lazy dog near the river bank. ".repeat(6),
    );
    let budget = 24;
    assert!(long.len() > 2 * budget, "{} tokens", long.len());
    // (prompt, options): one short, one chunked over several steps, one that ends early,
    // one cancelled mid-way, and two more than fit at once (max_seqs 4).
    let plan: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (medium.clone(), endless(40)),
        (long.clone(), endless(24)),
        (short.clone(), endless(3)),
        (medium[3..].to_vec(), endless(1000)),
        (long[5..].to_vec(), options(30, SamplingParams::default())),
        (short.clone(), endless(12)),
    ];
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 4,
            token_budget: budget,
            state_budget: None,
        },
    )
    .unwrap();
    // A companion that runs until cancelled: every step of the others carries it too.
    let companion = scheduler.submit(short.clone(), &endless(100_000)).unwrap();
    assert!(matches!(companion.recv(), Some(SeqEvent::Text(_))));
    let mut handles: Vec<_> = plan
        .iter()
        .map(|(p, o)| scheduler.submit(p.clone(), o).unwrap())
        .collect();
    // Cancel the fourth after its first text.
    let cancelled = handles.remove(3);
    let mut seen = String::new();
    while seen.len() < 4 {
        match cancelled.recv().unwrap() {
            SeqEvent::Text(t) => seen.push_str(&t),
            SeqEvent::Done(r) => panic!("ended before it was cancelled: {r:?}"),
            SeqEvent::Logprobs(_) => panic!("logprobs were not asked for"),
        }
    }
    // One joins mid-way, while the others decode.
    let late_prompt = ids(&model, "A late request joins the batch.");
    let late = scheduler.submit(late_prompt.clone(), &endless(20)).unwrap();
    cancelled.cancel();
    let (cancelled_text, cancelled_run) = collect(cancelled);
    assert_eq!(cancelled_run.finish, Finish::Cancelled);
    assert_eq!(seen + &cancelled_text, cancelled_run.text);
    let alone = solo(&model, &plan[3].0, &endless(1000));
    assert!(
        cancelled_run.ids.len() < 1000 && alone.ids.starts_with(&cancelled_run.ids),
        "cancelled after {} tokens",
        cancelled_run.ids.len()
    );

    let mut order = vec![0, 1, 2, 4, 5];
    order.push(usize::MAX);
    let mut handles: Vec<_> = handles.into_iter().map(Some).collect();
    let mut late = Some(late);
    for n in order {
        let (prompt, opts, handle) = if n == usize::MAX {
            (&late_prompt, endless(20), late.take().unwrap())
        } else {
            let k = if n > 3 { n - 1 } else { n };
            (&plan[n].0, plan[n].1.clone(), handles[k].take().unwrap())
        };
        let (text, batched) = collect(handle);
        let alone = solo(&model, prompt, &opts);
        assert_eq!(batched.ids, alone.ids, "sequence {n}: tokens differ");
        assert_eq!(batched.text, alone.text, "sequence {n}");
        assert_eq!(text, alone.text, "sequence {n}: streamed text");
        assert_eq!(batched.finish, alone.finish, "sequence {n}");
        assert_eq!(batched.prompt_tokens, prompt.len());
    }
    companion.cancel();
    assert_eq!(companion.wait().unwrap().finish, Finish::Cancelled);
    assert_eq!(scheduler.stats().running(), 0);
    assert_eq!(scheduler.stats().state_bytes(), 0);
    // Steps carried several sequences, and no step fed more than the budget.
    let sizes = scheduler.stats().batch_size.snapshot();
    assert!(sizes.cumulative[0] < sizes.count, "{sizes:?}");
    let tokens = scheduler.stats().step_tokens.snapshot();
    assert_eq!(
        *tokens.cumulative.last().unwrap(),
        tokens.count,
        "a step fed more than the budget: {tokens:?}"
    );
}

#[test]
fn a_seed_gives_the_same_text_at_batch_1_and_batch_8() {
    let model = demo();
    let sampled = |seed| {
        options(
            32,
            SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed: Some(seed),
                ..SamplingParams::default()
            },
        )
    };
    let prompt = ids(&model, "Write a poem about the sea.");
    let alone = solo(&model, &prompt, &sampled(11));
    // A different seed gives a different text: the check below can fail.
    assert_ne!(solo(&model, &prompt, &sampled(12)).ids, alone.ids);

    let one = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 1,
            token_budget: 8,
            state_budget: None,
        },
    )
    .unwrap();
    let (_, at_1) = collect(one.submit(prompt.clone(), &sampled(11)).unwrap());
    assert_eq!(at_1.ids, alone.ids);

    let eight = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 8,
            token_budget: 16,
            state_budget: None,
        },
    )
    .unwrap();
    let others: Vec<Vec<u32>> = [
        "Hello there.",
        "Count to ten please.",
        "Why is the sky blue?",
    ]
    .iter()
    .map(|t| ids(&model, t))
    .collect();
    // A companion that runs until cancelled: the sequence below never runs alone.
    let companion = eight.submit(others[0].clone(), &endless(100_000)).unwrap();
    assert!(matches!(companion.recv(), Some(SeqEvent::Text(_))));
    let mut handles = Vec::new();
    for n in 0..6 {
        let p = others[n % others.len()].clone();
        handles.push(eight.submit(p, &sampled(100 + n as u64)).unwrap());
        if n == 2 {
            handles.push(eight.submit(prompt.clone(), &sampled(11)).unwrap());
        }
    }
    let results: Vec<Completion> = handles.into_iter().map(|h| collect(h).1).collect();
    assert_eq!(results[3].ids, alone.ids);
    assert_eq!(results[3].text, alone.text);
    companion.cancel();
    let sizes = eight.stats().batch_size.snapshot();
    assert!(sizes.cumulative[0] < sizes.count, "{sizes:?}");
}

#[test]
fn cancelling_frees_the_sequence_and_dropping_the_handle_cancels() {
    let model = demo();
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 2,
            token_budget: 64,
            state_budget: None,
        },
    )
    .unwrap();
    let prompt = ids(&model, "Once upon a time");
    let first = scheduler.submit(prompt.clone(), &endless(100_000)).unwrap();
    let second = scheduler.submit(prompt.clone(), &endless(100_000)).unwrap();
    let third = scheduler.submit(prompt.clone(), &endless(5)).unwrap();
    // Two texts each: at least one whole step has run (and been counted) since they started.
    for h in [&first, &second, &first, &second] {
        assert!(matches!(h.recv(), Some(SeqEvent::Text(_))));
    }
    // Both places are taken: the third waits.
    assert_eq!(scheduler.stats().running(), 2);
    assert!(scheduler.stats().state_bytes() > 0);
    drop(second);
    // The dropped one frees its place: the third runs and ends.
    let (_, done) = collect(third);
    assert_eq!(done.finish, Finish::Length);
    first.cancel();
    let (_, cancelled) = collect(first);
    assert_eq!(cancelled.finish, Finish::Cancelled);
    assert_eq!(scheduler.stats().running(), 0);
    assert_eq!(scheduler.stats().waiting(), 0);
    assert_eq!(scheduler.stats().state_bytes(), 0);
}

#[test]
fn bad_requests_are_refused_at_submission() {
    let model = demo();
    let scheduler = Scheduler::start(Arc::clone(&model), BatchConfig::default()).unwrap();
    assert!(scheduler.submit(Vec::new(), &endless(4)).is_err());
    let limit = model.config().max_position_embeddings;
    assert!(scheduler.submit(vec![1; limit], &endless(4)).is_err());
    let bad = options(
        4,
        SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        },
    );
    assert!(scheduler.submit(vec![1, 2], &bad).is_err());
    assert!(Scheduler::start(
        model,
        BatchConfig {
            max_seqs: 8,
            token_budget: 4,
            state_budget: None,
        }
    )
    .is_err());
}

/// The path a device sampler takes (each sequence's `SequenceDecoder::draw`, a batched
/// `Backend::forward_batch_sampled`, then `accept`) picks every token the host path
/// (`Model::generate`, sampling each logits row) picks: the draw consumes each sequence's
/// random stream exactly as host sampling does, with every filter and penalty.
#[test]
fn the_draw_and_accept_path_picks_what_host_sampling_picks() {
    use spindle_cpu::LogitsFor;
    use spindle_runtime::backend::BatchItem;
    use spindle_runtime::SequenceDecoder;

    let model = demo();
    let settings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            seed: Some(11),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.3,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.02,
            seed: Some(5),
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.7,
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.4,
            seed: Some(9),
            ..SamplingParams::default()
        },
    ];
    let prompts = [
        "Once upon a time",
        "The capital of France is",
        "1, 2, 3,",
        "Hello",
    ];
    let runs: Vec<(Vec<u32>, GenerateOptions)> = prompts
        .iter()
        .zip(&settings)
        .map(|(text, sampling)| (ids(&model, text), options(12, sampling.clone())))
        .collect();
    let mut sessions: Vec<_> = runs.iter().map(|_| model.new_session().unwrap()).collect();
    let mut decoders: Vec<SequenceDecoder> = runs
        .iter()
        .map(|(prompt, opts)| SequenceDecoder::new(&model, 0, prompt, opts).unwrap())
        .collect();
    let mut feed: Vec<Vec<u32>> = runs.iter().map(|(prompt, _)| prompt.clone()).collect();
    let mut live: Vec<bool> = vec![true; runs.len()];
    while live.iter().any(|&l| l) {
        let active: Vec<usize> = (0..runs.len()).filter(|&n| live[n]).collect();
        let mut items = Vec::new();
        let mut draws = Vec::new();
        for (n, (session, decoder)) in sessions.iter_mut().zip(decoders.iter_mut()).enumerate() {
            if !live[n] {
                continue;
            }
            items.push(BatchItem {
                session,
                ids: &feed[n],
                want: LogitsFor::Last,
            });
            draws.push(decoder.draw().expect("a live sequence samples"));
        }
        let picked = model.backend.forward_batch_sampled(&mut items, &draws);
        drop(draws);
        drop(items);
        for (n, id) in active.into_iter().zip(picked) {
            let position = sessions[n].position();
            let step = decoders[n].accept(id.unwrap(), position).unwrap();
            match step.next {
                Some(next) => feed[n] = vec![next],
                None => live[n] = false,
            }
        }
    }
    for ((prompt, opts), decoder) in runs.iter().zip(decoders) {
        let expected = solo(&model, prompt, opts);
        let got = decoder.into_completion(Default::default(), Default::default());
        assert_eq!(got.ids, expected.ids, "{:?}", opts.sampling);
        assert_eq!(got.text, expected.text);
    }
}

/// With a state budget that fits only some of the sequences as they grow, the scheduler
/// admits what fits, preempts the sequence admitted last when the others outgrow the budget
/// and recomputes it later from its prompt and what it generated: every sequence still gives
/// its solo run's tokens, and the state held never passes the budget with more than one
/// sequence running.
#[test]
fn a_state_budget_preempts_and_recomputes_without_changing_any_answer() {
    let model = demo();
    let config = model.config().clone();
    let state = |tokens: usize| spindle_model::install::plan::state_bytes(&config, tokens);
    let prompts: Vec<Vec<u32>> = [
        "The first prompt is the longest one of them all, by a few words",
        "A second prompt",
        "Third",
        "And the fourth prompt of this test",
    ]
    .iter()
    .map(|text| ids(&model, text))
    .collect();
    let generate = 24;
    // Room for about two and a half sequences at their full length.
    let longest = prompts.iter().map(Vec::len).max().unwrap() + generate;
    let budget = state(longest) * 5 / 2;
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        BatchConfig {
            max_seqs: 4,
            token_budget: 64,
            state_budget: Some(budget),
        },
    )
    .unwrap();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| scheduler.submit(p.clone(), &endless(generate)).unwrap())
        .collect();
    for (prompt, handle) in prompts.iter().zip(handles) {
        let (_, got) = collect(handle);
        let expected = solo(&model, prompt, &endless(generate));
        assert_eq!(got.ids, expected.ids);
        assert_eq!(got.text, expected.text);
        assert_eq!(got.finish, Finish::Length);
    }
    let stats = scheduler.stats();
    assert!(
        stats.preemptions() > 0,
        "the budget ({budget} bytes) should have forced a preemption"
    );
    assert_eq!(
        (stats.running(), stats.waiting(), stats.state_bytes()),
        (0, 0, 0)
    );
}

/// Banned ids are never sampled, in the scheduler (a mask where the logits are) as in
/// `Model::generate` (on the host), and both give the same answer.
#[test]
fn banned_ids_are_never_sampled_on_either_path() {
    let model = demo();
    let prompt = ids(&model, "Tell me a story about a robot who learns to paint.");
    let free = solo(&model, &prompt, &options(12, SamplingParams::default()));
    // Ban the free answer's first two tokens: the answer changes and holds neither.
    let banned: Vec<u32> = free.ids[..2].to_vec();
    let options = GenerateOptions {
        banned_ids: banned.clone(),
        ..options(12, SamplingParams::default())
    };
    let alone = solo(&model, &prompt, &options);
    assert!(
        alone.ids.iter().all(|id| !banned.contains(id)),
        "{:?} holds a banned id of {banned:?}",
        alone.ids
    );
    assert_ne!(alone.ids, free.ids);
    let scheduler = Scheduler::start(Arc::clone(&model), BatchConfig::default()).unwrap();
    let (_, batched) = collect(scheduler.submit(prompt, &options).unwrap());
    assert_eq!(
        batched.ids, alone.ids,
        "the masked scheduler path differs from the host's"
    );
}

/// A reasoning budget closes the block at its last token: within `tokens` tokens of the
/// prompt's open block the closing token comes, forced if the model does not write it, the
/// same in the scheduler and in `Model::generate`.
#[test]
fn a_reasoning_budget_forces_the_block_closed() {
    let model = demo();
    let id = |t: &str| {
        model
            .tokenizer
            .token_to_id(t)
            .expect("a Qwen reasoning token")
    };
    let (open, close) = (id("<think>"), id("</think>"));
    let prompt = ids(
        &model,
        "Tell me a story about a robot who learns to paint.<think>\n",
    );
    // Left alone, the model does not close it that soon.
    let free = solo(&model, &prompt, &options(8, SamplingParams::default()));
    assert!(!free.ids[..4].contains(&close), "{:?}", free.ids);
    for tokens in [1, 3] {
        let options = GenerateOptions {
            reasoning_budget: Some(spindle_runtime::ReasoningBudget {
                tokens,
                open,
                close,
                starts_inside: true,
            }),
            ..options(8, SamplingParams::default())
        };
        let alone = solo(&model, &prompt, &options);
        let at = alone.ids.iter().position(|&t| t == close);
        assert!(
            at.is_some_and(|at| at <= tokens),
            "budget {tokens}: {:?} does not close the block in time",
            alone.ids
        );
        let scheduler = Scheduler::start(Arc::clone(&model), BatchConfig::default()).unwrap();
        let (_, batched) = collect(scheduler.submit(prompt.clone(), &options).unwrap());
        assert_eq!(
            batched.ids, alone.ids,
            "budget {tokens}: the scheduler differs"
        );
    }
}
