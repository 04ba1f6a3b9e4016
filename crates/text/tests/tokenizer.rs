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

/// A text that starts like a recently encoded one resumes after their shared beginning
/// (`Tokenizer::memo_skipped_bytes` grows) and still encodes exactly as the whole text does:
/// varied texts cut at every kind of place (inside white-space runs, before and after
/// newlines, inside multi-byte characters' neighbours, next to special tokens' spellings) and
/// continued differently, with and without special tokens.
#[test]
fn texts_sharing_a_beginning_encode_exactly_as_whole() {
    let path = common::fixture("tokenizer/tokenizer.json");
    let mut whole = tokenizers::Tokenizer::from_file(&path).unwrap();
    for seed in 0..4u64 {
        let tokenizer = spindle_text::Tokenizer::from_file(&path).unwrap();
        let base = varied_text(20_000, seed);
        for special in [true, false] {
            whole.set_encode_special_tokens(!special);
            let want = |text: &str| whole.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(tokenizer.encode(&base, special).unwrap(), want(&base));
            // Every place around the first recorded cuts (pieces of about 1 KB), where a text
            // that diverges just before, at or just after a cut must not take its ids; then
            // places anywhere.
            let mut state = seed * 7919 + special as u64;
            let near = (1000..1100).chain(2030..2130);
            let anywhere: Vec<usize> = (0..40)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 33) as usize % base.len()
                })
                .collect();
            for (round, mut cut) in near.chain(anywhere).enumerate() {
                while !base.is_char_boundary(cut) {
                    cut -= 1;
                }
                let tail = varied_text(50 + round % 7 * 37, round as u64 + 11 * seed);
                let text = format!("{}{}", &base[..cut], tail);
                let before = tokenizer.memo_skipped_bytes();
                let got = tokenizer.encode(&text, special).unwrap();
                assert!(
                    got == want(&text),
                    "seed {seed}, special {special}, round {round}: cut at {cut} of {}: ids differ",
                    base.len()
                );
                if cut > 4_000 {
                    assert!(
                        tokenizer.memo_skipped_bytes() > before,
                        "seed {seed}, round {round}: a text sharing {cut} bytes encoded whole"
                    );
                }
            }
        }
    }
}

/// Texts that share a recorded cut's bytes (a newline, then the first bytes of a multi-byte
/// character) but differ in the character there, white space in the new text (U+2003 against
/// U+2014): the place is no exact cut of the new text (the newline and the white space can be
/// one pre-token), so the memo must not resume there; the ids equal the whole text's either way
/// in these cases (no BPE merge spans them), which the test checks.
#[test]
fn a_cut_is_taken_only_where_the_new_text_cuts_too() {
    let path = common::fixture("tokenizer/tokenizer.json");
    let tokenizer = spindle_text::Tokenizer::from_file(&path).unwrap();
    let whole = tokenizers::Tokenizer::from_file(&path).unwrap();
    let rest = " and more words".repeat(200);
    // (white space, a non-space character with the same leading bytes)
    let pairs = [
        ('\u{a0}', '\u{a9}'),
        ('\u{85}', '\u{80}'),
        ('\u{2003}', '\u{2014}'),
        ('\u{2028}', '\u{2026}'),
        ('\u{202f}', '\u{2030}'),
        ('\u{3000}', '\u{3001}'),
    ];
    for head in ["x".repeat(1023) + "\n", "x".repeat(1022) + "\n\n"] {
        for (space, other) in pairs {
            for after in ["\n", "\n\n", " ", "y", "\t\n"] {
                let old = format!("{head}{other}{rest}");
                let new = format!("{head}{space}{after}{rest}");
                tokenizer.encode(&old, true).unwrap();
                let want = whole
                    .encode(new.as_str(), false)
                    .unwrap()
                    .get_ids()
                    .to_vec();
                assert_eq!(
                    tokenizer.encode(&new, true).unwrap(),
                    want,
                    "{space:?} then {after:?} after {other:?} was cut"
                );
            }
        }
    }
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
