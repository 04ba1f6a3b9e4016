//! The prefix cache's capture and restore on CUDA: a session read out to the host at a cut
//! (key and value rows in two segments, the GDN state at the cut) and rebuilt in a new session
//! continues exactly as the original: the same logits, bit for bit, over a prompt chunk and
//! greedy decode steps, on every fixture (qwen4_exp with its QSA indexer keys, whose block keys
//! the restore recomputes, and its PLE state). The same pieces kept in device buffers (the
//! server's default; qwen4_exp's go through the host) restore alike. Needs a CUDA GPU:
//! `cargo test --release -p spindle-cuda --test prefix -- --ignored`.

use spindle_cuda::{CudaEngine, HostLayer, PrefixLayer, Rows};
use spindle_model::forward::LogitsFor;

fn pseudo_random(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Feeds `prompt[..cut]`, captures (rows `[0, split)` and `[split, cut)`, the state at
/// `cut`), restores into a new session, then feeds the rest of the prompt and 4 greedy
/// tokens to both sessions: every step's logits must be identical.
fn check(name: &str, cut: usize, split: usize) {
    let dir = spindle_testkit::fixture(name);
    let engine = CudaEngine::load(&dir, 0).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = engine.config().vocab_size;
    let prompt = pseudo_random(40, vocab, 11);
    let mut original = engine.new_session().unwrap();
    engine
        .forward(&mut original, &prompt[..cut], LogitsFor::Last)
        .unwrap();

    // Rows [0, split) and [split, cut): the first segment cut from a whole read-out.
    let width = engine.config().attention.num_kv_heads * engine.config().attention.head_dim;
    let d_i = engine.config().qsa.as_ref().map_or(0, |q| q.head_dim);
    let first: Vec<Option<HostLayer>> = engine
        .read_kv_rows(&original, 0)
        .unwrap()
        .into_iter()
        .map(|layer| {
            layer.map(|l| match l {
                HostLayer::Attention {
                    mut keys,
                    mut values,
                    mut indexer,
                } => {
                    keys.truncate(split * width);
                    values.truncate(split * width);
                    indexer.truncate(split * d_i);
                    HostLayer::Attention {
                        keys,
                        values,
                        indexer,
                    }
                }
                gdn => gdn,
            })
        })
        .collect();
    let second = engine.read_kv_rows(&original, split).unwrap();
    let state = engine.read_recurrent(&original).unwrap();
    let ple = engine.read_ple(&original).unwrap();
    assert_eq!(
        ple.is_some(),
        engine.config().ple.is_some(),
        "{name}: PLE state read out exactly for a model with PLE layers"
    );
    let layers: Vec<PrefixLayer> = first
        .iter()
        .zip(&second)
        .zip(&state)
        .map(|((a, b), s)| match (a, b, s) {
            (
                Some(HostLayer::Attention {
                    keys,
                    values,
                    indexer,
                }),
                Some(HostLayer::Attention {
                    keys: k2,
                    values: v2,
                    indexer: i2,
                }),
                None,
            ) => {
                assert_eq!(
                    indexer.len() + i2.len(),
                    cut * d_i,
                    "{name}: indexer keys of every position read out"
                );
                PrefixLayer::Attention {
                    keys: vec![Rows::Host(keys), Rows::Host(k2)],
                    values: vec![Rows::Host(values), Rows::Host(v2)],
                    indexer: vec![Rows::Host(indexer), Rows::Host(i2)],
                }
            }
            (None, None, Some(HostLayer::Gdn { conv, recurrent })) => PrefixLayer::Gdn {
                conv: Rows::Host(conv),
                recurrent: Rows::Host(recurrent),
            },
            _ => panic!("{name}: layer kinds differ between the captures"),
        })
        .collect();
    let mut restored = engine.session_from_prefix(cut, &layers, 64).unwrap();
    assert_eq!(restored.position, cut);
    if let Some(ple) = &ple {
        engine.write_ple(&mut restored, ple).unwrap();
    }
    if engine.device_pieces_refusal().is_some() {
        // qwen4_exp: device pieces are refused by name (the server caches it on the host).
        let err = engine.stash_kv_rows(&original, 0).err().expect("refused");
        assert!(err.to_string().contains("qwen4_exp"), "{err}");
        let rest = &prompt[cut..];
        let a = engine.forward(&mut original, rest, LogitsFor::All).unwrap();
        let b = engine.forward(&mut restored, rest, LogitsFor::All).unwrap();
        assert_eq!(
            a, b,
            "{name}: the rest of the prompt after a restored prefix differs"
        );
        let mut next = spindle_kernels::softmax::argmax(&a[a.len() - vocab..]) as u32;
        for step in 0..4 {
            let a = engine
                .forward(&mut original, &[next], LogitsFor::Last)
                .unwrap();
            let b = engine
                .forward(&mut restored, &[next], LogitsFor::Last)
                .unwrap();
            assert_eq!(
                a, b,
                "{name}: decode step {step} after a restored prefix differs"
            );
            next = spindle_kernels::softmax::argmax(&a) as u32;
        }
        eprintln!("{name}: cut {cut} (segments split at {split}): restored session identical");
        return;
    }

    // The same pieces kept on the device: the rows split in two halves sharing their buffers.
    let (head, tail) = engine.stash_kv_rows(&original, 0).unwrap().split_at(split);
    let stashed = engine.stash_recurrent(&original).unwrap();
    let device_layers: Vec<PrefixLayer> = (0..stashed.layer_count())
        .map(|n| match stashed.layer(n) {
            Some([conv, recurrent]) => PrefixLayer::Gdn { conv, recurrent },
            None => {
                let rows: Vec<[Rows; 2]> =
                    [&head, &tail].iter().filter_map(|s| s.rows(n)).collect();
                PrefixLayer::Attention {
                    keys: rows.iter().map(|[k, _]| *k).collect(),
                    values: rows.iter().map(|[_, v]| *v).collect(),
                    indexer: Vec::new(),
                }
            }
        })
        .collect();
    let mut on_device = engine.session_from_prefix(cut, &device_layers, 64).unwrap();
    drop((head, tail, stashed));

    let rest = &prompt[cut..];
    let a = engine.forward(&mut original, rest, LogitsFor::All).unwrap();
    let b = engine.forward(&mut restored, rest, LogitsFor::All).unwrap();
    assert_eq!(
        a, b,
        "{name}: the rest of the prompt after a restored prefix differs"
    );
    let c = engine
        .forward(&mut on_device, rest, LogitsFor::All)
        .unwrap();
    assert_eq!(
        a, c,
        "{name}: the rest of the prompt after a prefix restored on the device differs"
    );
    let mut next = spindle_kernels::softmax::argmax(&a[a.len() - vocab..]) as u32;
    for step in 0..4 {
        let a = engine
            .forward(&mut original, &[next], LogitsFor::Last)
            .unwrap();
        let b = engine
            .forward(&mut restored, &[next], LogitsFor::Last)
            .unwrap();
        assert_eq!(
            a, b,
            "{name}: decode step {step} after a restored prefix differs"
        );
        let c = engine
            .forward(&mut on_device, &[next], LogitsFor::Last)
            .unwrap();
        assert_eq!(
            a, c,
            "{name}: decode step {step} after a prefix restored on the device differs"
        );
        next = spindle_kernels::softmax::argmax(&a) as u32;
    }
    eprintln!("{name}: cut {cut} (segments split at {split}): restored session identical");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn restored_sessions_continue_identically() {
    for name in [
        "qwen3_next_moe",
        "qwen3_5_dense",
        "qwen3_5_moe",
        "qwen3_5_moe_fused",
    ] {
        check(name, 17, 9);
        check(name, 32, 0);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn qwen4_exp_restores_its_indexer_and_ple_state() {
    // Cuts past several complete indexer blocks and mid-block, segments split mid-way.
    let cr = {
        let dir = spindle_testkit::fixture("qwen4_exp");
        let config = spindle_model::ModelConfig::from_dir(&dir).unwrap();
        config
            .qsa
            .as_ref()
            .expect("qwen4_exp has QSA")
            .compress_ratio
    };
    check("qwen4_exp", 3 * cr + 1, cr + 2);
    check("qwen4_exp", 4 * cr, 0);
}
