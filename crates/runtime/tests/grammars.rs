//! The grammar engine's token trie comes from the tokenizer itself, never from a file at the
//! tokenizer's path: a GGUF model's tokenizer is rebuilt from metadata and its path is the
//! `.gguf` file (reading it as JSON read the whole model into memory and failed).

use std::sync::Arc;

use serde_json::Value;
use spindle_runtime::{demo_dir, Grammars};
use spindle_text::Tokenizer;

#[test]
fn a_tokenizer_at_a_gguf_path_gets_the_token_bytes_of_its_json() {
    let json_path = demo_dir().unwrap().join("tokenizer.json");
    let bytes = std::fs::read(&json_path).unwrap();
    // A tokenizer whose path is a GGUF file, as a GGUF model's is.
    let gguf = spindle_testkit::fixtures().join("gguf/qwen3_5_moe_fused.q8_0.gguf");
    let tokenizer = Arc::new(Tokenizer::from_json_bytes(&bytes, &gguf).unwrap());
    let vocab = tokenizer.id_limit();
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let grammars = Grammars::new(Arc::clone(&tokenizer), vocab, &[eos]).unwrap();
    // What the grammar engine reads from the tokenizer.json file itself.
    let file: Value = serde_json::from_slice(&bytes).unwrap();
    let want = llguidance::token_bytes_from_tokenizer_json(&file).unwrap();
    assert_eq!(want.len(), vocab);
    let mut plain = 0;
    for (id, want) in want.iter().enumerate() {
        let mut want = want.clone();
        // Special tokens carry a marker byte in the trie; token_bytes drops it.
        if want.first() == Some(&0xff) {
            want.remove(0);
        }
        assert_eq!(grammars.token_bytes(id as u32), want, "token {id}");
        plain += usize::from(!want.is_empty());
    }
    assert!(plain > vocab / 2, "{plain} of {vocab} tokens have bytes");
}
