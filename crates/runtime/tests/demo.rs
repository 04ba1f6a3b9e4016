//! Generation on the embedded demo checkpoint.

use serde_json::{json, Map};
use spindle_runtime::sampling::SamplingParams;
use spindle_runtime::{demo_dir, Conversation, Finish, Flow, GenerateOptions, Model, Prompt};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        sampling: SamplingParams::default(),
        max_tokens: Some(max_tokens),
        ..GenerateOptions::default()
    }
}

#[test]
fn streamed_text_equals_decoded_greedy_tokens() {
    let model = Model::load(&demo_dir().unwrap()).unwrap();
    let prompt = model
        .prepare(&Prompt::Chat {
            messages: json!([{"role": "user", "content": "Tell me a story about a robot."}]),
            tools: None,
            vars: Map::new(),
            add_generation_prompt: true,
        })
        .unwrap();
    assert!(
        prompt
            .text
            .ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{:?}",
        prompt.text
    );
    let mut session = model.new_session().unwrap();
    let mut streamed = String::new();
    let completion = model
        .generate(&mut session, &prompt.ids, &greedy(40), &mut |t| {
            streamed.push_str(t);
            Flow::Continue
        })
        .unwrap();
    assert_eq!(streamed, completion.text);
    let shown: Vec<u32> = completion
        .ids
        .iter()
        .copied()
        .filter(|id| !model.eos_ids.contains(id))
        .collect();
    let decoded = model.tokenizer.decode(&shown, false).unwrap();
    let control: Vec<String> = model
        .tokenizer
        .control_ids()
        .iter()
        .filter_map(|&id| model.tokenizer.id_to_piece(id))
        .collect();
    let visible = control
        .iter()
        .fold(decoded, |s, c| s.replace(c.as_str(), ""));
    assert_eq!(completion.text, visible);
    assert!(matches!(completion.finish, Finish::Length | Finish::Eos(_)));
    // Greedy decoding is deterministic.
    let mut again = model.new_session().unwrap();
    let second = model
        .generate(&mut again, &prompt.ids, &greedy(40), &mut |_| {
            Flow::Continue
        })
        .unwrap();
    assert_eq!(second.ids, completion.ids);
}

#[test]
fn stopping_from_the_callback_cancels() {
    let model = Model::load(&demo_dir().unwrap()).unwrap();
    let prompt = model
        .prepare(&Prompt::Text {
            text: "Once upon a time".into(),
            special_tokens: true,
        })
        .unwrap();
    let mut session = model.new_session().unwrap();
    let mut calls = 0;
    let completion = model
        .generate(&mut session, &prompt.ids, &greedy(100), &mut |_| {
            calls += 1;
            if calls == 3 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    assert_eq!(completion.finish, Finish::Cancelled);
    assert!(completion.ids.len() < 100);
}

#[test]
fn second_turn_feeds_only_new_tokens() {
    let model = Model::load(&demo_dir().unwrap()).unwrap();
    let mut chat = Conversation::new(&model, Some("You are terse."), Map::new());
    let first = chat
        .turn(&model, "Hello!", &greedy(12), &mut |_| Flow::Continue)
        .unwrap();
    let after_first = chat.context_tokens();
    assert_eq!(
        after_first,
        chat.last_feed_tokens + first.completion.ids.len() - 1
    );
    chat.turn(&model, "And again?", &greedy(12), &mut |_| Flow::Continue)
        .unwrap();
    let full = model
        .prepare(&Prompt::Chat {
            messages: serde_json::Value::Array(chat.messages[..4].to_vec()),
            tools: None,
            vars: Map::new(),
            add_generation_prompt: true,
        })
        .unwrap();
    assert!(
        chat.last_feed_tokens < full.ids.len() / 2,
        "turn 2 fed {} tokens; the full prompt has {}",
        chat.last_feed_tokens,
        full.ids.len()
    );
    assert_eq!(chat.messages.len(), 5);
}

/// A turn that fails (a streamed expert cannot be read) is forgotten: the chat goes on, and
/// the next turn answers exactly as in a chat where the failure never happened.
#[test]
fn a_failed_turn_leaves_the_conversation_usable() {
    use spindle_cpu::experts::ExpertResidency;
    use spindle_cpu::LoadOptions;
    use spindle_model::quant::WeightFormat;
    let dir = std::env::temp_dir().join(format!("spindle-chat-failure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    spindle_model::install::convert(&demo_dir().unwrap(), &dir, WeightFormat::Bf16, &mut |_| {
        true
    })
    .unwrap();
    let options = LoadOptions {
        experts: ExpertResidency::Streamed,
        expert_slots: Some(1),
        ..Default::default()
    };
    let model = Model::load_with(&dir, &options).unwrap();
    let mut chat = Conversation::new(&model, None, Map::new());
    let mut reference = Conversation::new(&model, None, Map::new());
    let go = &mut |_: &str| Flow::Continue;
    chat.turn(&model, "Hello there.", &greedy(8), go).unwrap();
    reference
        .turn(&model, "Hello there.", &greedy(8), go)
        .unwrap();

    let path = dir.join("experts/layer-000.bin");
    let whole = std::fs::read(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let Err(err) = chat.turn(&model, "Tell me more.", &greedy(8), go) else {
        panic!("layer 0's experts cannot be read, yet the turn succeeded");
    };
    assert!(err.to_string().contains("layer-000.bin"), "{err}");
    std::fs::write(&path, &whole).unwrap();

    let retried = chat.turn(&model, "Tell me more.", &greedy(8), go).unwrap();
    let wanted = reference
        .turn(&model, "Tell me more.", &greedy(8), go)
        .unwrap();
    assert_eq!(retried.completion.ids, wanted.completion.ids);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_prompt_is_refused_by_name() {
    let dir = spindle_runtime::demo_dir().unwrap();
    let model = spindle_runtime::Model::load(&dir).unwrap();
    for prompt in [
        spindle_runtime::Prompt::Text {
            text: String::new(),
            special_tokens: true,
        },
        spindle_runtime::Prompt::Tokens(Vec::new()),
    ] {
        let err = model.prepare(&prompt).unwrap_err();
        assert!(
            matches!(err, spindle_runtime::RuntimeError::EmptyPrompt),
            "{err}"
        );
        assert!(err.to_string().contains("the prompt is empty"), "{err}");
    }
}

#[test]
fn finish_reads_as_words() {
    use spindle_runtime::Finish;
    assert_eq!(
        Finish::Eos(4065).to_string(),
        "end of sequence (token 4065)"
    );
    assert_eq!(Finish::Length.to_string(), "token limit reached");
    assert_eq!(
        Finish::Stop("\n\n".into()).to_string(),
        "stop string \"\\n\\n\""
    );
}
