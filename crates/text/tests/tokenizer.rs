//! The tokenizer against the ids tiktoken gives for the fixture texts.

mod common;

use common::{qwen_tokenizer, read_json};

#[test]
fn fixture_texts_encode_to_reference_ids_and_decode_back() {
    let tokenizer = qwen_tokenizer();
    let cases = read_json("tokenizer/encodings.json");
    let cases = cases.as_array().expect("encodings.json is a list");
    assert!(
        cases.len() >= 10,
        "expected the full fixture, got {} cases",
        cases.len()
    );
    for case in cases {
        let text = case["text"].as_str().expect("case has a text");
        let want: Vec<u32> = case["ids"]
            .as_array()
            .expect("case has ids")
            .iter()
            .map(|id| id.as_u64().expect("id is an integer") as u32)
            .collect();
        let got = tokenizer.encode(text, true).unwrap();
        assert_eq!(got, want, "encoding of {text:?}");
        assert_eq!(
            tokenizer.decode(&got, false).unwrap(),
            text,
            "decoding of {text:?}"
        );
    }
}

#[test]
fn special_tokens_are_recognised_only_when_allowed() {
    let tokenizer = qwen_tokenizer();
    let im_end = tokenizer
        .token_to_id("<|im_end|>")
        .expect("<|im_end|> exists");
    assert_eq!(im_end, 248046);
    assert_eq!(tokenizer.encode("<|im_end|>", true).unwrap(), vec![im_end]);
    let plain = tokenizer.encode("<|im_end|>", false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&im_end), "{plain:?}");
    assert_eq!(tokenizer.decode(&plain, false).unwrap(), "<|im_end|>");
}

#[test]
fn pieces_specials_and_skipping() {
    let tokenizer = qwen_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 248_077);
    assert_eq!(tokenizer.special_ids().len(), 33);
    assert_eq!(tokenizer.id_to_piece(220).as_deref(), Some("Ġ"));
    assert_eq!(tokenizer.id_to_piece(248068).as_deref(), Some("<think>"));
    assert!(tokenizer.is_special(248045) && !tokenizer.is_special(220));
    let ids = tokenizer
        .encode("<|im_start|>user\nhi<|im_end|>", true)
        .unwrap();
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "user\nhi");
    let control = tokenizer.control_ids();
    assert!(control.contains(&248046), "<|im_end|> is a control token");
    for tag in ["<think>", "</think>", "<tool_call>", "</tool_call>"] {
        let id = tokenizer.token_to_id(tag).unwrap();
        assert!(
            !control.contains(&id),
            "{tag} must stay visible to the parser"
        );
    }
}

#[test]
fn missing_tokenizer_names_the_path() {
    let err = spindle_text::Tokenizer::from_dir("/nonexistent/model").unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/model/tokenizer.json"),
        "{err}"
    );
}
