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

/// A deterministic mix of what the pre-tokenizer treats differently: words, runs of spaces,
/// tabs and newlines (`\n`, `\r\n`, blank lines), digits, punctuation, contractions,
/// accented and combining letters, CJK, emoji and special-token spellings.
fn varied_text(bytes: usize, seed: u64) -> String {
    const PARTS: [&str; 32] = [
        "word",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\r\n",
        "\t",
        " \n",
        "\n ",
        "2024",
        "3.14",
        "it's",
        "I'LL",
        "don't",
        ",",
        "...",
        "!?",
        "(x)",
        "é",
        "e\u{301}",
        "naïve",
        "中文字",
        "日本語。",
        "🙂",
        "👩‍👩‍👧",
        "<|im_end|>",
        "<|im_start|>",
        "<think>",
        "—",
        "\u{a0}",
        "ǅ",
    ];
    let mut state = seed;
    let mut text = String::new();
    while text.len() < bytes {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(PARTS[(state >> 33) as usize % PARTS.len()]);
    }
    text
}

#[test]
fn long_text_encodes_in_pieces_exactly_as_whole() {
    let path = common::fixture("tokenizer/tokenizer.json");
    let tokenizer = qwen_tokenizer();
    let mut whole = tokenizers::Tokenizer::from_file(&path).unwrap();
    for seed in 0..6 {
        let text = varied_text(300_000, seed);
        for special in [true, false] {
            whole.set_encode_special_tokens(!special);
            let want = whole
                .encode(text.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            let got = tokenizer.encode(&text, special).unwrap();
            assert_eq!(got.len(), want.len(), "seed {seed}, special {special}");
            assert!(got == want, "seed {seed}, special {special}: ids differ");
        }
    }
    // Prose with long lines and no line breaks at all.
    let prose = "The quick brown fox, it's said, jumps over 13 lazy dogs. ".repeat(4000);
    whole.set_encode_special_tokens(false);
    let want = whole
        .encode(prose.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(tokenizer.encode(&prose, true).unwrap(), want);
}

#[test]
fn encoding_stops_soon_after_the_limit() {
    let tokenizer = qwen_tokenizer();
    let text = "a ".repeat(2_000_000);
    let start = std::time::Instant::now();
    match tokenizer.encode_within(&text, false, 1000) {
        Err(spindle_text::TextError::TooManyTokens { counted, limit }) => {
            assert_eq!(limit, 1000);
            assert!(counted > 1000 && counted < 1000 + 40_000, "{counted}");
        }
        other => panic!(
            "expected TooManyTokens, got {:?}",
            other.map(|ids| ids.len())
        ),
    }
    eprintln!("refused a 4 MB text after {:?}", start.elapsed());
    assert_eq!(tokenizer.encode_within("a b c", false, 3).unwrap().len(), 3);
}
