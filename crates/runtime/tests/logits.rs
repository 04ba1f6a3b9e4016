//! The logits-processing step on the embedded demo model (random weights): structured outputs
//! (a grammar's greedy token is the model's argmax among the allowed ones, and the text is
//! valid), `logit_bias`, `stop_token_ids`, `min_tokens`, `ignore_eos`, log-probabilities
//! against a log-softmax of the logits, and constrained sequences in the batch scheduler.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use spindle_cpu::LogitsFor;
use spindle_kernels::softmax::argmax;
use spindle_runtime::batch::{BatchConfig, Scheduler};
use spindle_runtime::sampling::{Penalised, SamplingParams};
use spindle_runtime::{
    demo_dir, Completion, Finish, Flow, GenerateOptions, Grammar, Model, Prompt, RuntimeError,
    SequenceDecoder,
};

fn demo() -> Arc<Model> {
    Arc::new(Model::load(&demo_dir().expect("the demo unpacks")).expect("the demo loads"))
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

fn generate(model: &Model, ids: &[u32], options: &GenerateOptions) -> Completion {
    let mut session = model.new_session().unwrap();
    model
        .generate(&mut session, ids, options, &mut |_| Flow::Continue)
        .unwrap()
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "tags", "address"],
        "additionalProperties": false
    })
}

fn constrained(model: &Model, grammar: &Grammar, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        constraint: Some(model.constraint(grammar).unwrap()),
        ..greedy(max_tokens)
    }
}

#[test]
fn unconstrained_text_is_not_json_and_a_schema_makes_it_valid() {
    let model = demo();
    let ids = chat_ids(&model, "Give me a person as JSON.");
    let free = generate(&model, &ids, &greedy(60));
    assert!(
        serde_json::from_str::<Value>(&free.text).is_err(),
        "{:?}",
        free.text
    );

    let out = generate(
        &model,
        &ids,
        &constrained(&model, &Grammar::JsonSchema(person_schema()), 200),
    );
    assert!(
        matches!(out.finish, Finish::Eos(_)),
        "{:?}: {:?}",
        out.finish,
        out.text
    );
    let v: Value = serde_json::from_str(&out.text).expect("valid JSON");
    assert!(v["name"].as_str().unwrap().chars().count() <= 12, "{v}");
    let age = v["age"].as_i64().unwrap();
    assert!((0..=120).contains(&age), "{v}");
    assert!(v["tags"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())));
    assert!(v["address"]["city"].is_string(), "{v}");
    assert_eq!(v.as_object().unwrap().len(), 4);

    // Any object: free keys and strings need not end on random weights, but the text is a
    // JSON object's beginning, and a string cut short completes it.
    let object = generate(&model, &ids, &constrained(&model, &Grammar::JsonObject, 40));
    assert!(object.text.starts_with('{'), "{:?}", object.text);
    let closed = ["", "\"", "\":1}", "\"}", "}", ":1}"].iter().any(|end| {
        serde_json::from_str::<Value>(&format!("{}{end}", object.text)).is_ok_and(|v| v.is_object())
    });
    assert!(
        closed || object.text.ends_with(',') || object.text.ends_with(':'),
        "{:?}",
        object.text
    );
}

#[test]
fn regex_and_choice_hold() {
    let model = demo();
    let ids = chat_ids(&model, "Pick one.");
    let choices = vec!["red".to_owned(), "green".to_owned(), "blue sky".to_owned()];
    let out = generate(
        &model,
        &ids,
        &constrained(&model, &Grammar::Choice(choices.clone()), 20),
    );
    assert!(choices.contains(&out.text), "{:?}", out.text);
    let out = generate(
        &model,
        &ids,
        &constrained(&model, &Grammar::Regex(r"[0-9]{3}-[a-z]{2}".into()), 20),
    );
    assert_eq!(out.text.len(), 6, "{:?}", out.text);
    assert!(
        out.text.as_bytes()[..3].iter().all(u8::is_ascii_digit),
        "{:?}",
        out.text
    );
    assert_eq!(&out.text[3..4], "-");
}

#[test]
fn constrained_greedy_token_is_the_argmax_among_allowed_tokens() {
    let model = demo();
    let ids = chat_ids(&model, "JSON please");
    let options = constrained(&model, &Grammar::JsonSchema(person_schema()), 40);
    let mut shadow = options.constraint.clone().unwrap();
    let mut decoder = SequenceDecoder::new(&model, 0, &ids, &options).unwrap();
    let mut session = model.new_session().unwrap();
    let mut logits = model
        .backend
        .forward(&mut session, &ids, LogitsFor::Last)
        .unwrap();
    let mut steps = 0;
    loop {
        let mut masked = logits.clone();
        let mask = shadow.mask().unwrap().expect("active");
        mask.apply(&mut masked);
        let expected = argmax(&masked) as u32;
        assert!(mask.allows(expected));
        // The unmasked argmax is (almost always) not allowed: the mask does something.
        let step = decoder.step(&mut logits, session.position()).unwrap();
        assert_eq!(decoder.ids().last(), Some(&expected), "step {steps}");
        shadow.accept(expected).unwrap();
        steps += 1;
        let Some(next) = step.next else { break };
        logits = model
            .backend
            .forward(&mut session, &[next], LogitsFor::Last)
            .unwrap();
    }
    assert!(steps > 5);
}

#[test]
fn logit_bias_stop_token_ids_min_tokens_and_ignore_eos() {
    let model = demo();
    let ids = chat_ids(&model, "Tell me a story.");
    let base = generate(&model, &ids, &greedy(12));
    assert_eq!(base.ids.len(), 12, "{:?}", base.finish);
    let first = base.ids[0];

    // -100 on the greedy token changes the greedy output.
    let banned = generate(
        &model,
        &ids,
        &GenerateOptions {
            logit_bias: vec![(first, -100.0)],
            ..greedy(12)
        },
    );
    assert_ne!(banned.ids[0], first);
    assert!(!banned.ids.contains(&first));

    // A stop token id ends generation there, not shown.
    let k = base.ids.iter().position(|&id| id == base.ids[4]).unwrap();
    let stopped = generate(
        &model,
        &ids,
        &GenerateOptions {
            stop_token_ids: vec![base.ids[4]],
            ..greedy(12)
        },
    );
    assert_eq!(stopped.finish, Finish::Eos(base.ids[4]));
    assert_eq!(stopped.ids, base.ids[..=k]);

    // +100 on an EOS id ends at once; min_tokens holds it back.
    let eos = model.eos_ids[0];
    let forced = GenerateOptions {
        logit_bias: vec![(eos, 100.0)],
        ..greedy(12)
    };
    let ended = generate(&model, &ids, &forced);
    assert_eq!(
        (ended.ids.clone(), ended.finish),
        (vec![eos], Finish::Eos(eos))
    );
    let held = generate(
        &model,
        &ids,
        &GenerateOptions {
            min_tokens: 5,
            ..forced.clone()
        },
    );
    assert_eq!(held.ids.len(), 6, "{:?}", held.ids);
    assert_eq!(held.finish, Finish::Eos(eos));
    assert!(!held.ids[..5].iter().any(|id| model.eos_ids.contains(id)));
    // ignore_eos: the EOS is generated and generation goes on to max_tokens.
    let ignored = generate(
        &model,
        &ids,
        &GenerateOptions {
            ignore_eos: true,
            ..forced
        },
    );
    assert_eq!(ignored.finish, Finish::Length);
    assert_eq!(ignored.ids, vec![eos; 12]);
}

#[test]
fn logprobs_are_the_log_softmax_of_the_logits() {
    let model = demo();
    let ids = chat_ids(&model, "Hello");
    let out = generate(
        &model,
        &ids,
        &GenerateOptions {
            logprobs: Some(5),
            ..greedy(6)
        },
    );
    assert_eq!(out.logprobs.len(), out.ids.len());
    // The reference: the same forward passes, log-softmax in f64.
    let mut session = model.new_session().unwrap();
    let mut logits = model
        .backend
        .forward(&mut session, &ids, LogitsFor::Last)
        .unwrap();
    for (step, lp) in out.logprobs.iter().enumerate() {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let total: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_softmax = |id: u32| (logits[id as usize] as f64 - max - total.ln()) as f32;
        assert_eq!(lp.id, out.ids[step]);
        assert!(
            (lp.logprob - log_softmax(lp.id)).abs() < 1e-4,
            "{} vs {}",
            lp.logprob,
            log_softmax(lp.id)
        );
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|a, b| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        });
        let top: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(top, order[..5]);
        for (id, l) in &lp.top {
            assert!((l - log_softmax(*id)).abs() < 1e-4);
        }
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.id, order[0]);
        logits = model
            .backend
            .forward(&mut session, &[lp.id], LogitsFor::Last)
            .unwrap();
    }
}

#[test]
fn bad_grammars_are_refused_by_name() {
    let model = demo();
    let bad = [
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "nonsense"}}})),
        Grammar::JsonSchema(json!([1, 2])),
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::Choice(Vec::new()),
    ];
    for grammar in bad {
        match model.constraint(&grammar) {
            Err(RuntimeError::Grammar(message)) => assert!(!message.is_empty()),
            other => panic!("{grammar:?}: {other:?}"),
        }
    }
}

#[test]
fn constrained_and_free_sequences_batch_as_they_run_alone() {
    let model = demo();
    let scheduler = Scheduler::start(Arc::clone(&model), BatchConfig::default()).unwrap();
    let seeded = |seed| SamplingParams {
        temperature: 0.9,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let prompts = [
        "one",
        "a longer prompt here",
        "three",
        "three",
        "four",
        "five",
    ];
    let base = generate(&model, &chat_ids(&model, "four"), &greedy(8));
    let options: Vec<GenerateOptions> = vec![
        constrained(&model, &Grammar::JsonSchema(person_schema()), 200),
        GenerateOptions {
            logprobs: Some(2),
            sampling: seeded(4),
            ..greedy(10)
        },
        GenerateOptions {
            sampling: seeded(9),
            ..constrained(&model, &Grammar::JsonObject, 60)
        },
        // The same seed twice in one batch gives the same text twice.
        GenerateOptions {
            sampling: seeded(9),
            ..constrained(&model, &Grammar::JsonObject, 60)
        },
        // Bans before min_tokens (a mask without a grammar): the stop token id that would
        // end it at its second token cannot until the fifth.
        GenerateOptions {
            stop_token_ids: vec![base.ids[1]],
            min_tokens: 5,
            ..greedy(8)
        },
        GenerateOptions {
            sampling: seeded(3),
            ..greedy(12)
        },
    ];
    let alone: Vec<Completion> = prompts
        .iter()
        .zip(&options)
        .map(|(p, o)| generate(&model, &chat_ids(&model, p), o))
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .zip(&options)
        .map(|(p, o)| scheduler.submit(chat_ids(&model, p), o).unwrap())
        .collect();
    let got: Vec<Completion> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    for (got, want) in got.iter().zip(&alone) {
        assert_eq!(
            (&got.ids, &got.text, &got.logprobs),
            (&want.ids, &want.text, &want.logprobs)
        );
    }
    // The constrained output parses against its schema.
    let person: Value = serde_json::from_str(&got[0].text).expect("valid JSON");
    assert_eq!(person.as_object().unwrap().len(), 4, "{person}");
    assert_eq!(got[2].ids, got[3].ids);
    assert!(got[4].ids.len() >= 5, "{:?}", got[4].ids);
    assert!(!got[4].ids[..4].contains(&base.ids[1]), "{:?}", got[4].ids);
    assert!(!got[5].text.is_empty());
}

/// The path every sequence without log-probabilities or a `logit_bias` takes in the batch
/// scheduler: `SequenceDecoder::draw_masked`, one `Backend::forward_batch_step` for the whole
/// step (the masks computed by the closure it calls once the forward pass is under way), then
/// `accept`; sequences that need their row get it from the same batch. Every sequence picks
/// the tokens the host path (`Model::generate`: the row on the host, masked and sampled
/// there) picks, grammar, bans before `min_tokens` and seeds included.
#[test]
fn masks_applied_where_the_logits_are_pick_what_host_masking_picks() {
    use spindle_runtime::backend::{BatchItem, Pick, Picked, StepMasks};

    let model = demo();
    let seeded = |seed, t| SamplingParams {
        temperature: t,
        top_k: 40,
        top_p: 0.95,
        repetition_penalty: 1.1,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let base = generate(&model, &chat_ids(&model, "e"), &greedy(8));
    let runs: Vec<(Vec<u32>, GenerateOptions)> = vec![
        (
            chat_ids(&model, "a"),
            constrained(&model, &Grammar::JsonSchema(person_schema()), 120),
        ),
        (
            chat_ids(&model, "b b"),
            GenerateOptions {
                sampling: seeded(7, 1.2),
                ..constrained(&model, &Grammar::JsonSchema(person_schema()), 120)
            },
        ),
        (
            chat_ids(&model, "c"),
            GenerateOptions {
                sampling: seeded(8, 0.8),
                ..constrained(&model, &Grammar::Regex(r"[a-z]{2,6}-[0-9]{1,3}".into()), 20)
            },
        ),
        (
            chat_ids(&model, "d"),
            GenerateOptions {
                logprobs: Some(3),
                sampling: seeded(2, 0.9),
                ..constrained(&model, &Grammar::JsonObject, 16)
            },
        ),
        (
            chat_ids(&model, "e"),
            GenerateOptions {
                stop_token_ids: vec![base.ids[1]],
                min_tokens: 4,
                ..greedy(8)
            },
        ),
        (chat_ids(&model, "f"), greedy(10)),
    ];
    let mut sessions: Vec<_> = runs.iter().map(|_| model.new_session().unwrap()).collect();
    let mut decoders: Vec<SequenceDecoder> = runs
        .iter()
        .map(|(prompt, opts)| SequenceDecoder::new(&model, 0, prompt, opts).unwrap())
        .collect();
    let mut feed: Vec<Vec<u32>> = runs.iter().map(|(prompt, _)| prompt.clone()).collect();
    let mut live = vec![true; runs.len()];
    let mut masked_rows = 0;
    while live.iter().any(|&l| l) {
        let active: Vec<usize> = (0..runs.len()).filter(|&n| live[n]).collect();
        let mut items = Vec::new();
        let mut picks = Vec::new();
        let mut masks = Vec::new();
        for (n, (session, decoder)) in sessions.iter_mut().zip(decoders.iter_mut()).enumerate() {
            if !live[n] {
                continue;
            }
            items.push(BatchItem {
                session,
                ids: &feed[n],
                want: LogitsFor::Last,
            });
            if decoder.needs_logits() {
                picks.push(Pick::Logits);
                continue;
            }
            let (draw, mask) = decoder.draw_masked().expect("a live sequence samples");
            masks.push((picks.len(), mask));
            picks.push(Pick::Sample(draw));
        }
        let rows = items.len();
        let mut called = false;
        let picked = model.backend.forward_batch_step(&mut items, &picks, || {
            called = true;
            let mut out: StepMasks = vec![None; rows];
            for (n, mask) in masks {
                out[n] = mask.compute();
            }
            masked_rows += out.iter().filter(|m| m.is_some()).count();
            out
        });
        assert!(called, "the masks are asked for once per step");
        drop(picks);
        drop(items);
        for (n, picked) in active.into_iter().zip(picked) {
            let position = sessions[n].position();
            let step = match picked.unwrap() {
                Picked::Token(id) => decoders[n].accept(id, position),
                Picked::Logits(mut row) => decoders[n].step(&mut row, position),
                Picked::Nothing => panic!("every item sampled"),
            }
            .unwrap();
            match step.next {
                Some(next) => feed[n] = vec![next],
                None => live[n] = false,
            }
        }
    }
    assert!(masked_rows > 20, "only {masked_rows} rows were masked");
    for ((prompt, opts), decoder) in runs.iter().zip(decoders) {
        let want = generate(&model, prompt, opts);
        let got = decoder.into_completion(Default::default(), Default::default());
        assert_eq!(
            (&got.ids, &got.text, &got.logprobs),
            (&want.ids, &want.text, &want.logprobs),
            "{:?}",
            opts.sampling
        );
    }
}

/// A mask that allows one token forces it, even the least likely one at a high temperature;
/// a mask of two tokens gives the greedy row the likelier; an unmasked row beside them keeps
/// its arg-max; a row that wants its logits gets them whole.
#[test]
fn a_mask_allowing_one_token_forces_it() {
    use spindle_runtime::backend::{BatchItem, Draw, Pick, Picked};

    let model = demo();
    let vocab = model.config().vocab_size;
    let prompt = chat_ids(&model, "Pick one.");
    let logits = model
        .backend
        .forward(&mut model.new_session().unwrap(), &prompt, LogitsFor::Last)
        .unwrap();
    let best = argmax(&logits) as u32;
    let worst = (0..vocab as u32)
        .min_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
        .unwrap();
    let second = (0..vocab as u32)
        .filter(|&id| id != best)
        .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
        .unwrap();
    let bits = |ids: &[u32]| {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for &id in ids {
            words[id as usize / 32] |= 1 << (id % 32);
        }
        words
    };
    let hot = SamplingParams {
        temperature: 2.0,
        seed: Some(1),
        ..SamplingParams::default()
    };
    let greedy_params = SamplingParams::default();
    let mut sessions: Vec<_> = (0..4).map(|_| model.new_session().unwrap()).collect();
    let mut items: Vec<BatchItem> = sessions
        .iter_mut()
        .map(|session| BatchItem {
            session,
            ids: &prompt,
            want: LogitsFor::Last,
        })
        .collect();
    fn draw(params: &SamplingParams) -> Draw<'_> {
        Draw {
            params,
            uniform: 0.999,
            penalised: Penalised::NONE,
        }
    }
    let picks = [
        Pick::Sample(draw(&hot)),
        Pick::Sample(draw(&greedy_params)),
        Pick::Sample(draw(&greedy_params)),
        Pick::Logits,
    ];
    let picked = model.backend.forward_batch_step(&mut items, &picks, || {
        vec![
            Some(bits(&[worst])),
            Some(bits(&[worst, second])),
            None,
            None,
        ]
    });
    let picked: Vec<Picked> = picked.into_iter().map(Result::unwrap).collect();
    assert_eq!(picked[0], Picked::Token(worst));
    assert_eq!(picked[1], Picked::Token(second));
    assert_eq!(picked[2], Picked::Token(best));
    match &picked[3] {
        Picked::Logits(row) => {
            assert_eq!(row.len(), vocab);
            let diff = row
                .iter()
                .zip(&logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                diff < 1e-3,
                "the batched row differs from the solo one by {diff}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A stop string in the text of the first `min_tokens` tokens does not end generation (as
/// vLLM): the first tokens are those of the run without a stop string.
#[test]
fn min_tokens_holds_back_stop_strings() {
    let model = demo();
    let ids = chat_ids(&model, "Tell me a story.");
    let base = generate(&model, &ids, &greedy(12));
    assert_eq!(base.ids.len(), 12, "{:?}", base.finish);
    // The text of the second token, as a stop string.
    let early = model.tokenizer.decode(&base.ids[1..2], false).unwrap();
    assert!(!early.trim().is_empty(), "{early:?}");
    let stop = GenerateOptions {
        stop: vec![early.clone()],
        ..greedy(12)
    };
    let stopped = generate(&model, &ids, &stop);
    assert_eq!(stopped.finish, Finish::Stop(early.clone()));
    assert!(stopped.ids.len() <= 2, "{:?}", stopped.ids);
    let held = generate(
        &model,
        &ids,
        &GenerateOptions {
            min_tokens: 6,
            ..stop
        },
    );
    assert!(held.ids.len() >= 6, "{:?} {:?}", held.ids, held.finish);
    assert_eq!(held.ids[..6], base.ids[..6]);
    assert!(held.text.contains(&early), "{:?}", held.text);
}

#[test]
fn grammar_compiling_is_bounded() {
    let model = demo();
    // Too large: refused before any work.
    let huge = Grammar::Choice((0..20_000).map(|i| format!("choice number {i}")).collect());
    let started = std::time::Instant::now();
    match model.constraint(&huge) {
        Err(RuntimeError::Grammar(m)) => assert!(m.contains("at most"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Far below what compiling 20,000 choices takes (a generous bound: other work may share
    // the machine).
    assert!(started.elapsed().as_secs() < 5);
    // Deeply nested grammars compile on the compiler's own stack (this thread's 2 MiB would
    // overflow on the 1000-rule chain) and are masked from here.
    let chain = (0..1000)
        .map(|i| format!("r{i}: \"a{i}\" r{}?", i + 1))
        .chain(std::iter::once("r1000: \"end\"".to_owned()))
        .collect::<Vec<_>>()
        .join("\n");
    let mut deep = json!({"type": "integer"});
    for _ in 0..300 {
        deep = json!({"type": "array", "items": deep, "maxItems": 1});
    }
    for grammar in [
        Grammar::Lark(format!("start: r0\n{chain}")),
        Grammar::JsonSchema(deep),
    ] {
        let started = std::time::Instant::now();
        let mut constraint = model.constraint(&grammar).unwrap();
        assert!(started.elapsed().as_secs() < 5);
        let mask = constraint.mask().unwrap().unwrap();
        let id = (0..model.config().vocab_size as u32)
            .find(|&i| mask.allows(i))
            .unwrap();
        constraint.accept(id).unwrap();
    }
}

/// Arguments the get_weather schemas of the tool-call tests allow: a city of at most 10
/// characters, 1 to 5 days, a unit c or f if any.
fn check_weather_args(args: &serde_json::Map<String, Value>) {
    assert!(
        args.get("city")
            .and_then(Value::as_str)
            .is_some_and(|c| c.chars().count() <= 10),
        "{args:?}"
    );
    assert!(
        args.get("days")
            .and_then(Value::as_i64)
            .is_some_and(|d| (1..=5).contains(&d)),
        "{args:?}"
    );
    assert!(
        args.get("unit").is_none_or(|u| u == "c" || u == "f"),
        "{args:?}"
    );
}

#[test]
fn forced_tool_calls_parse_back_with_valid_arguments() {
    use spindle_runtime::ToolSpec;
    let model = demo();
    let ids = chat_ids(&model, "What is the weather?");
    let tools = [
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "days": {"type": "integer", "minimum": 1, "maximum": 5},
                    "unit": {"enum": ["c", "f"]}
                },
                "required": ["city", "days"]
            })),
        },
        ToolSpec {
            name: "noop".into(),
            parameters: None,
        },
    ];
    for (tools, parallel) in [
        (&tools[..1], false),
        (&tools[..], true),
        (&tools[1..], false),
    ] {
        let grammar = Grammar::tool_calls(tools, parallel).unwrap();
        // The call opens with the tokenizer's `<tool_call>` special token, the one the model
        // writes, not with that text spelt in ordinary tokens.
        let open = model.tokenizer.token_to_id("<tool_call>").unwrap();
        let mut first = model.constraint(&grammar).unwrap();
        let allowed: Vec<u32> = {
            let mask = first.mask().unwrap().expect("a call is forced");
            (0..model.config().vocab_size as u32)
                .filter(|&i| mask.allows(i))
                .collect()
        };
        assert_eq!(allowed, [open], "the first token of a forced call");
        let out = generate(&model, &ids, &constrained(&model, &grammar, 200));
        assert_eq!(out.ids[0], open);
        assert!(out
            .ids
            .contains(&model.tokenizer.token_to_id("</tool_call>").unwrap()));
        let parsed = spindle_text::parse_output(&out.text, false);
        assert!(!parsed.tool_calls.is_empty(), "{:?}", out.text);
        assert!(parallel || parsed.tool_calls.len() == 1, "{:?}", out.text);
        assert!(parsed.content.is_empty(), "{:?}", out.text);
        for call in &parsed.tool_calls {
            let args = &call.arguments;
            match call.name.as_str() {
                "get_weather" => check_weather_args(args),
                "noop" => assert!(args.is_empty()),
                other => panic!("{other}"),
            }
        }
    }
    assert!(Grammar::tool_calls(&[], true).is_err());
}

/// `tool_choice` "auto" with strict tools: the answer may be text, or text and then calls; a
/// call a strict tool's name opens holds arguments its schema allows, a non-strict tool's
/// call any text. The demo model is pushed into a call with a logit bias on `<tool_call>` (and
/// kept out of one by banning it), then its output is parsed back.
#[test]
fn optional_calls_of_strict_tools_follow_their_schemas() {
    use spindle_runtime::ToolSpec;
    let model = demo();
    let ids = chat_ids(&model, "What is the weather?");
    let weather = ToolSpec {
        name: "get_weather".into(),
        parameters: Some(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "days": {"type": "integer", "minimum": 1, "maximum": 5}
            },
            "required": ["city", "days"]
        })),
    };
    let free = ToolSpec {
        name: "note".into(),
        parameters: Some(json!({"type": "object"})),
    };
    let open = model.tokenizer.token_to_id("<tool_call>").unwrap();
    let close = model.tokenizer.token_to_id("</tool_call>").unwrap();
    let grammar =
        Grammar::optional_tool_calls(&[(weather.clone(), true), (free.clone(), false)], true)
            .unwrap();
    // At the start: text or a call.
    let mut start = model.constraint(&grammar).unwrap();
    let mask = start.mask().unwrap().expect("constrained");
    let text_id = model.tokenizer.encode("Sure", false).unwrap()[0];
    assert!(mask.allows(open) && mask.allows(text_id));
    assert!(!mask.allows(close), "a call cannot close before it opens");
    // Once open, the call names a tool: no free text, no close.
    start.accept(open).unwrap();
    let mask = start.mask().unwrap().expect("constrained");
    assert!(!mask.allows(text_id) && !mask.allows(close));

    // Pushed into a call at once: get_weather's arguments follow its schema.
    let only_weather = Grammar::optional_tool_calls(&[(weather, true)], false).unwrap();
    let mut options = constrained(&model, &only_weather, 200);
    options.logit_bias = vec![(open, 100.0)];
    let out = generate(&model, &ids, &options);
    assert_eq!(out.ids[0], open, "{:?}", out.text);
    let parsed = spindle_text::parse_output(&out.text, false);
    assert_eq!(parsed.tool_calls.len(), 1, "{:?}", out.text);
    assert_eq!(parsed.tool_calls[0].name, "get_weather");
    check_weather_args(&parsed.tool_calls[0].arguments);
    // Kept out of calls: plain text, which the grammar leaves free.
    let mut options = constrained(&model, &only_weather, 30);
    options.banned_ids = vec![open];
    let text = generate(&model, &ids, &options);
    let unconstrained = generate(
        &model,
        &ids,
        &GenerateOptions {
            banned_ids: vec![open],
            ..greedy(30)
        },
    );
    assert_eq!(text.ids, unconstrained.ids, "free text is not constrained");
    assert!(Grammar::optional_tool_calls(&[], true).is_err());
}

/// The free text of a tool-call grammar for a tokenizer whose `<tool_call>` is ordinary text
/// (`TOOL_FREE_TEXT` then excludes its spelling): the lexeme syntax compiles and refuses the
/// spelling while taking other text.
#[test]
fn free_text_that_must_not_spell_a_call_marker() {
    let model = demo();
    let grammar =
        Grammar::Lark("start: T\nT: /(.|\\n)+/ & ~/(.|\\n)*<tool_call>(.|\\n)*/".to_owned());
    let spelled = model.tokenizer.encode("a <tool_call> b", false).unwrap();
    let mut c = model.constraint(&grammar).unwrap();
    let mut refused = false;
    for id in spelled {
        if !c.mask().unwrap().is_none_or(|m| m.allows(id)) {
            refused = true;
            break;
        }
        c.accept(id).unwrap();
    }
    assert!(refused, "the spelling of <tool_call> went through");
    let mut c = model.constraint(&grammar).unwrap();
    for id in model.tokenizer.encode("a <tool b", false).unwrap() {
        assert!(c.mask().unwrap().is_none_or(|m| m.allows(id)));
        c.accept(id).unwrap();
    }
}
