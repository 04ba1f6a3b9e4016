//! A small byte-level BPE `tokenizer.json` (the Qwen layout: a Split regex, ByteLevel, BPE,
//! added special tokens) damaged field by field, cut short and with bytes replaced: loading
//! either fails naming the file or gives a tokenizer that encodes and decodes without a panic,
//! a hang or an absurd allocation (`spindle_testkit::mutate`).

use serde_json::{json, Value};
use spindle_testkit::mutate::{self, flips, run_cases, truncations, Case, XorShift};
use spindle_text::Tokenizer;

#[global_allocator]
static ALLOC: mutate::Bounded = mutate::Bounded;

const NAME: &str = "fuzzed/tokenizer.json";

/// GPT-2's byte-to-character table, by which byte-level BPE spells every byte.
fn byte_chars() -> Vec<char> {
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars = bytes.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in bytes.iter().zip(&chars) {
        table[*b as usize] = char::from_u32(*c).unwrap();
    }
    table
}

/// 256 byte tokens, three merges ("he", "ll", "hell"... ) and two special tokens.
fn small_tokenizer() -> Value {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (id, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    for (i, piece) in ["he", "ll", "hell", "Ġw"].iter().enumerate() {
        vocab.insert(piece.to_string(), json!(256 + i));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 260, "content": "<|im_start|>", "single_word": false, "lstrip": false,
             "rstrip": false, "normalized": false, "special": true},
            {"id": 261, "content": "<|im_end|>", "single_word": false, "lstrip": false,
             "rstrip": false, "normalized": false, "special": true},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": [["h", "e"], ["l", "l"], ["he", "ll"], ["Ġ", "w"]]},
    })
}

/// Loads `bytes` and uses the tokenizer as spindle does: encode with and without special
/// tokens, decode, the id bounds.
fn use_tokenizer(bytes: &[u8]) -> Result<(), String> {
    let t = Tokenizer::from_json_bytes(bytes, NAME).map_err(|e| e.to_string())?;
    let text = "hello <|im_start|>world\n\n  12 é 😀<|im_end|>";
    let ids = t.encode(text, true).map_err(|e| e.to_string())?;
    t.encode(text, false).map_err(|e| e.to_string())?;
    t.decode(&ids, false).map_err(|e| e.to_string())?;
    t.decode(&[0, 259, 261, 4_000_000_000], true).ok();
    let _ = (
        t.id_limit(),
        t.vocab_size(),
        t.special_spellings(),
        t.control_ids(),
    );
    Ok(())
}

/// The JSON pointer of every value of `v` but the 256 byte entries of the vocabulary.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if at == "/model/vocab" && k.chars().count() == 1 && k != "h" {
                    continue;
                }
                pointers(
                    child,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    if !at.is_empty() {
        out.push(at);
    }
}

#[test]
fn damaged_tokenizer_json_is_refused_or_harmless() {
    let pristine = small_tokenizer();
    use_tokenizer(pristine.to_string().as_bytes()).expect("the pristine tokenizer works");
    let mut all = Vec::new();
    pointers(&pristine, String::new(), &mut all);
    let hostile = [
        json!("x"),
        json!(-1),
        json!(u32::MAX),
        json!(u64::MAX),
        json!(1.5),
        json!(null),
        json!([]),
        json!({}),
        json!(true),
    ];
    let mut cases = Vec::new();
    for pointer in &all {
        for value in &hostile {
            let mut d = pristine.clone();
            *d.pointer_mut(pointer).unwrap() = value.clone();
            cases.push(Case::either(
                format!("{pointer} = {value}"),
                d.to_string().into_bytes(),
            ));
        }
    }
    let mut with = |label: &str, edit: &dyn Fn(&mut Value)| {
        let mut d = pristine.clone();
        edit(&mut d);
        cases.push(Case::either(label, d.to_string().into_bytes()));
    };
    with("an added token at id u32::MAX", &|d| {
        d["added_tokens"][0]["id"] = json!(u32::MAX)
    });
    with("a merge of tokens not in the vocabulary", &|d| {
        d["model"]["merges"][0] = json!(["q", "zz"])
    });
    with("a merge of one token", &|d| {
        d["model"]["merges"][0] = json!(["h"])
    });
    with("a pre-tokenizer regex that does not compile", &|d| {
        d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!("(((")
    });
    with("a catastrophically backtracking regex", &|d| {
        d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!("(a|a?)+$")
    });
    with("100000 merges", &|d| {
        d["model"]["merges"] = json!(vec![json!(["h", "e"]); 100_000])
    });
    with("two added tokens of one id", &|d| {
        d["added_tokens"][1]["id"] = json!(260)
    });
    let text = pristine.to_string().into_bytes();
    let mut rng = XorShift(0x5eed_0000_0000_0004);
    cases.extend(truncations("tokenizer.json", &text, 0..text.len(), 40));
    cases.extend(flips("tokenizer.json", &text, 0..text.len(), 80, &mut rng));
    run_cases(
        "tokenizer.json",
        cases,
        &[NAME, "tokenizer failed to"],
        use_tokenizer,
    );
}

/// The fixture chat template cut at many lengths and with bytes replaced, and templates built
/// to exhaust the parser (deep nesting) or the renderer (unbounded recursion): each is refused
/// (a syntax error, a render error naming the budget) or renders; none panics or overflows the
/// stack.
#[test]
fn damaged_and_hostile_chat_templates_are_refused_or_harmless() {
    use spindle_text::ChatTemplate;
    let path = spindle_testkit::fixtures().join("chat/qwen3_6_chat_template.jinja");
    let source = std::fs::read(&path).unwrap();
    let mut rng = XorShift(0x5eed_0000_0000_0005);
    let mut cases = truncations("template", &source, 0..source.len(), 60);
    // Cut inside the final newline or a closing tag, a template may still be whole.
    for case in &mut cases {
        case.expect = mutate::Expect::Either;
    }
    cases.extend(flips("template", &source, 0..source.len(), 60, &mut rng));
    // 20000 levels parse (on the parser's own stack); 100000 are refused by the tag's size.
    let deep = 20_000;
    for n in [deep, 100_000] {
        let expect = match n {
            20_000 => mutate::Expect::Either,
            _ => mutate::Expect::Refused,
        };
        for (label, text) in [
            ("unary minus", format!("{{{{ {}1 }}}}", "- ".repeat(n))),
            (
                "not",
                format!("{{% if {}x %}}y{{% endif %}}", "not ".repeat(n)),
            ),
            ("additions", format!("{{{{ 1{} }}}}", " + 1".repeat(n))),
            (
                "attributes",
                format!("{{{{ messages{} }}}}", ".a".repeat(n)),
            ),
            ("filters", format!("{{{{ 'a'{} }}}}", "|upper".repeat(n))),
            (
                "inline ifs",
                format!("{{{{ 1{} }}}}", " if x else 1".repeat(n)),
            ),
        ] {
            cases.push(Case {
                label: format!("{label} {n} deep"),
                bytes: text.into_bytes(),
                expect,
            });
        }
    }
    for (label, text) in [
        (
            "ifs 20000 deep",
            "{% if true %}".repeat(deep) + &"{% endif %}".repeat(deep),
        ),
        (
            "parentheses 20000 deep",
            format!("{{{{ {}1{} }}}}", "(".repeat(deep), ")".repeat(deep)),
        ),
        (
            "a list 20000 deep",
            format!("{{{{ {}{} }}}}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            "a macro calling itself",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string(),
        ),
        (
            "a recursive loop over the messages",
            "{% for m in messages recursive %}{{ loop([m]) }}{% endfor %}".to_string(),
        ),
        ("an unclosed block", "{% for m in messages %}".to_string()),
        ("bytes that are not UTF-8", "\u{fffd}".to_string()),
    ] {
        cases.push(Case::either(label, text.into_bytes()));
    }
    cases.push(Case::either(
        "not UTF-8",
        vec![b'{', b'{', 0xff, b'}', b'}'],
    ));
    let messages = json!([{"role": "user", "content": "hi"}]);
    run_cases(
        "chat templates",
        cases,
        &["template", "default", "budget", "UTF-8", "bytes of code"],
        |bytes| {
            let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
            let template = ChatTemplate::from_source(text).map_err(|e| e.to_string())?;
            template
                .render(&messages, None, true, &serde_json::Map::new())
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    );
}
