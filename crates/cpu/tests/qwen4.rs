//! qwen4_exp specifics: decoding through EOS tokens (the PLE history and conv states), QSA
//! selection during decode, and dense equivalence below the QSA budget.

mod common;

use common::{fixture, max_abs_diff, Reference};
use spindle_cpu::{Engine, LogitsFor};

#[test]
fn decode_across_eos_in_the_prompt_matches_prefill_rows() {
    // The fixture prompt holds EOS (id 1) at positions 11, 12 and 30: prefill 8 tokens, then
    // feed the rest one at a time; every step's logits must equal the reference prefill row.
    let reference = Reference::load("qwen4_exp");
    let prompt = reference.ids("prompt_ids");
    assert_eq!(
        (prompt[11], prompt[12], prompt[30]),
        (1, 1, 1),
        "fixture layout changed"
    );
    let (shape, expected) = reference.f32("prefill_logits");
    let vocab = shape[1];
    let engine = Engine::load(&fixture("qwen4_exp")).unwrap();
    let mut session = engine.new_session();
    engine
        .forward(&mut session, &prompt[..8], LogitsFor::Last)
        .unwrap();
    for (pos, &id) in prompt.iter().enumerate().skip(8) {
        let logits = engine
            .forward(&mut session, &[id], LogitsFor::Last)
            .unwrap();
        let err = max_abs_diff(&logits, &expected[pos * vocab..(pos + 1) * vocab]);
        assert!(err < 2e-4, "position {pos}: max |Δ| {err}");
    }
}

#[test]
fn chunked_prefill_in_uneven_pieces_matches_reference() {
    // Pieces that straddle QSA block boundaries (blocks of 4) and the EOS resets.
    let reference = Reference::load("qwen4_exp");
    let prompt = reference.ids("prompt_ids");
    let (shape, expected) = reference.f32("prefill_logits");
    let vocab = shape[1];
    let engine = Engine::load(&fixture("qwen4_exp")).unwrap();
    let mut session = engine.new_session();
    let mut pos = 0;
    for len in [3, 7, 2, 13, 5] {
        let piece = &prompt[pos..pos + len];
        let logits = engine.forward(&mut session, piece, LogitsFor::All).unwrap();
        let err = max_abs_diff(&logits, &expected[pos * vocab..(pos + len) * vocab]);
        assert!(err < 2e-4, "piece at {pos}: max |Δ| {err}");
        pos += len;
    }
}

/// A copy of the qwen4_exp fixture whose config is edited by `edit`.
fn fixture_with_config(edit: impl FnOnce(&mut serde_json::Value)) -> tempdir::Dir {
    let src = fixture("qwen4_exp");
    let dir = tempdir::Dir::new("qwen4-edit");
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&config_path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dir
}

#[test]
fn qsa_with_budget_covering_the_prompt_is_dense_attention() {
    // With a budget at least the sequence length no block is ever dropped, so the model must
    // equal the same model with every token attended. Compare against a budget so large the
    // indexer never runs, and check that the fixture's real budget (8) does change the logits.
    let prompt = Reference::load("qwen4_exp").ids("prompt_ids");
    let run = |budget: usize| {
        let dir = fixture_with_config(|c| c["text_config"]["indexer_budget"] = budget.into());
        let engine = Engine::load(dir.path()).unwrap();
        let mut session = engine.new_session();
        engine
            .forward(&mut session, &prompt, LogitsFor::All)
            .unwrap()
    };
    let dense = run(4096);
    // Budget 44 < 47 tokens: the last queries go through block selection, but with 11 of 11
    // complete blocks allowed plus the tail, the selection is every token.
    let all_blocks = run(prompt.len() / 4 * 4);
    assert!(
        max_abs_diff(&dense, &all_blocks) < 1e-6,
        "selecting every block must be dense attention"
    );
    let sparse = run(8);
    assert!(
        max_abs_diff(&dense, &sparse) > 1e-3,
        "budget 8 should select a strict subset"
    );
}

#[test]
fn bad_ngram_buffer_is_refused_by_name() {
    // A different seed gives different multipliers than the checkpoint's int64 buffer.
    let dir = fixture_with_config(|c| c["text_config"]["seed"] = 99.into());
    let err = Engine::load(dir.path()).err().expect("must refuse");
    let msg = err.to_string();
    assert!(msg.contains("layer_multipliers"), "{msg}");
}

/// A minimal self-cleaning temporary directory (no extra dependency).
mod tempdir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(tag: &str) -> Self {
            let unique = format!(
                "spindle-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            );
            let path = std::env::temp_dir().join(unique);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
