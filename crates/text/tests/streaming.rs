//! Streaming detokenization and stop conditions with the real Qwen tokenizer.

mod common;

use common::qwen_tokenizer;
use spindle_text::{
    Detokenizer, FinishReason, OutputParser, ParsedOutput, StopConditions, TextStream,
};

const IM_END: u32 = 248046;

/// Streams `ids` through a detokenizer that hides nothing; returns the deltas.
fn stream_deltas(ids: &[u32]) -> Vec<String> {
    let mut detok = Detokenizer::new(qwen_tokenizer(), &[]);
    let mut deltas: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    deltas.push(detok.flush().unwrap());
    deltas
}

#[test]
fn multibyte_text_streams_to_the_full_decode_without_broken_characters() {
    let tokenizer = qwen_tokenizer();
    for text in [
        "emoji 🤖🚀👩‍👩‍👧‍👦 and combining é ä",
        "你好，世界！東京都 Привет мир, مرحبا 🎉",
        "<think>\n思考中…\n</think>\n\n答案是 42。",
    ] {
        let ids = tokenizer.encode(text, true).unwrap();
        let deltas = stream_deltas(&ids);
        for delta in &deltas {
            assert!(
                !delta.contains('\u{FFFD}'),
                "broken character in {delta:?} of {text:?}"
            );
        }
        assert_eq!(deltas.concat(), tokenizer.decode(&ids, false).unwrap());
        assert_eq!(deltas.concat(), text);
    }
    // The robot emoji is split over two tokens: the first alone yields nothing.
    let ids = tokenizer.encode("🤖", true).unwrap();
    assert!(ids.len() >= 2, "{ids:?}");
    assert_eq!(stream_deltas(&ids)[0], "");
}

#[test]
fn an_incomplete_character_is_flushed_as_replacement() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode("a🤖", true).unwrap();
    let mut detok = Detokenizer::new(tokenizer, &[]);
    let mut out = String::new();
    for &id in &ids[..ids.len() - 1] {
        out.push_str(&detok.push(id).unwrap());
    }
    assert_eq!(out, "a");
    assert_eq!(detok.flush().unwrap(), "\u{FFFD}");
}

fn run_stream(ids: &[u32], conditions: &StopConditions) -> (String, Option<FinishReason>, usize) {
    let mut stream = TextStream::new(qwen_tokenizer(), conditions);
    let mut text = String::new();
    for &id in ids {
        let step = stream.push(id).unwrap();
        text.push_str(&step.text);
        if let Some(reason) = step.finished {
            return (text, Some(reason), stream.generated());
        }
    }
    let last = stream.finish(FinishReason::MaxTokens).unwrap();
    text.push_str(&last.text);
    (text, None, stream.generated())
}

#[test]
fn stop_string_spanning_tokens_ends_generation_without_being_emitted() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer
        .encode("The answer is 42. Done here, thanks.", true)
        .unwrap();
    let stop = "42. Done";
    // The stop string really spans several tokens.
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| tokenizer.decode(&[id], false).unwrap())
        .collect();
    assert!(!pieces.iter().any(|p| p.contains(stop)), "{pieces:?}");
    let conditions = StopConditions {
        stop_strings: vec![stop.to_string()],
        ..Default::default()
    };
    let (text, reason, _) = run_stream(&ids, &conditions);
    assert_eq!(text, "The answer is ");
    assert_eq!(reason, Some(FinishReason::StopString(stop.to_string())));
}

#[test]
fn held_back_text_is_released_when_the_stop_string_fails() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode("hello wor hello world", true).unwrap();
    let conditions = StopConditions {
        stop_strings: vec!["world!".to_string()],
        ..Default::default()
    };
    let mut stream = TextStream::new(tokenizer, &conditions);
    let mut deltas = Vec::new();
    for &id in &ids {
        deltas.push(stream.push(id).unwrap().text);
    }
    let last = stream.finish(FinishReason::MaxTokens).unwrap();
    // "world" could still become "world!", so it is only released at the end.
    assert_eq!(last.text, "world");
    assert_eq!(deltas.concat() + &last.text, "hello wor hello world");
}

#[test]
fn eos_ends_generation_and_later_tokens_are_ignored() {
    let tokenizer = qwen_tokenizer();
    let mut ids = tokenizer.encode("Short answer.", true).unwrap();
    ids.push(IM_END);
    ids.extend(tokenizer.encode(" ignored", true).unwrap());
    let conditions = StopConditions {
        eos_ids: vec![IM_END, 248044],
        ..Default::default()
    };
    let (text, reason, generated) = run_stream(&ids, &conditions);
    assert_eq!(text, "Short answer.");
    assert_eq!(reason, Some(FinishReason::Eos(IM_END)));
    assert_eq!(
        generated,
        ids.iter().position(|&id| id == IM_END).unwrap() + 1
    );
}

#[test]
fn max_tokens_flushes_held_text() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode("one two three four five", true).unwrap();
    let conditions = StopConditions {
        stop_strings: vec![" three!".to_string()],
        max_tokens: Some(3),
        ..Default::default()
    };
    let (text, reason, generated) = run_stream(&ids, &conditions);
    assert_eq!(reason, Some(FinishReason::MaxTokens));
    assert_eq!(generated, 3);
    assert_eq!(text, tokenizer.decode(&ids[..3], false).unwrap());
}

#[test]
fn control_tokens_are_hidden_and_markup_reaches_the_parser() {
    let tokenizer = qwen_tokenizer();
    let generated = "Let me check.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|><|endoftext|>";
    let ids = tokenizer.encode(generated, true).unwrap();
    let mut stream = TextStream::new(tokenizer, &StopConditions::default());
    let mut parser = OutputParser::new(true);
    let mut parsed = ParsedOutput::default();
    let mut text = String::new();
    for &id in &ids {
        let delta = stream.push(id).unwrap().text;
        text.push_str(&delta);
        parser
            .push(&delta)
            .into_iter()
            .for_each(|e| parsed.apply(e));
    }
    parser.finish().into_iter().for_each(|e| parsed.apply(e));
    assert!(
        !text.contains("<|im_end|>") && text.contains("</tool_call>"),
        "{text:?}"
    );
    assert_eq!(parsed.reasoning, "Let me check.");
    assert_eq!(parsed.content, "Checking.");
    assert_eq!(parsed.tool_calls.len(), 1);
    assert_eq!(parsed.tool_calls[0].name, "get_weather");
    assert_eq!(
        parsed.tool_calls[0].arguments_json(),
        r#"{"city":"東京","days":3}"#
    );
}

/// `min_tokens` (as vLLM's): a stop string in the text of the first `min_tokens` tokens does
/// not end the stream and stays in the text; one after them does.
#[test]
fn stop_strings_are_not_matched_within_min_tokens() {
    let tokenizer = qwen_tokenizer();
    let ids = tokenizer.encode("one cat, two cat, three", true).unwrap();
    let conditions = StopConditions {
        stop_strings: vec!["cat".to_string()],
        ..Default::default()
    };
    // Without min_tokens the first "cat" stops it.
    let (text, reason, _) = run_stream(&ids, &conditions);
    assert_eq!(text, "one ");
    assert_eq!(reason, Some(FinishReason::StopString("cat".into())));
    // The first "cat" ends within the first min_tokens tokens: the second stops it.
    let first_cat = (1..=ids.len())
        .find(|&n| tokenizer.decode(&ids[..n], false).unwrap().contains("cat"))
        .unwrap();
    let mut stream = TextStream::new(tokenizer.clone(), &conditions).with_min_tokens(first_cat);
    let mut text = String::new();
    let mut reason = None;
    for &id in &ids {
        let delta = stream.push(id).unwrap();
        text.push_str(&delta.text);
        if delta.finished.is_some() {
            reason = delta.finished;
            break;
        }
    }
    assert_eq!(text, "one cat, two ");
    assert_eq!(reason, Some(FinishReason::StopString("cat".into())));
}
