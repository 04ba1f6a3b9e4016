//! The prefix cache's capture and restore on CUDA: a session read out to the host at a cut
//! (key and value rows in two segments, the GDN state at the cut) and rebuilt in a new session
//! continues exactly as the original: the same logits, bit for bit, over a prompt chunk and
//! greedy decode steps, on every fixture (qwen4_exp with its QSA indexer keys, whose block keys
//! the restore recomputes, and its PLE state; its pieces go through the host, device pieces
//! are refused by name). The same prefix kept as references to the KV pool's blocks (the
//! server's default) restores alike, its blocks mapped into the new session's table. Two
//! sequences diverging after a shared prefix run concurrently on the shared blocks (counted
//! once by the pool), each as its cold run; a pool too small for both makes the second wait,
//! not differ; every reference goes back. Needs a CUDA GPU: `cargo test --release -p
//! spindle-cuda --test prefix -- --ignored`.

use spindle_cuda::{CudaBatchItem, CudaEngine, HostLayer, PrefixLayer, Rows};
use spindle_model::forward::LogitsFor;
use spindle_model::paged::{blocks_for, BLOCK_TOKENS};

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

    // The same prefix kept in the pool: references to the session's blocks, split in two
    // pieces (a block holding the split mid-way is referenced by both), mapped into a new table.
    let used_before = engine.kv_pool().counts().used;
    let (head, tail) = engine.stash_kv_rows(&original, 0).unwrap().split_at(split);
    assert_eq!(
        engine.kv_pool().counts().used,
        used_before,
        "{name}: a capture takes no block"
    );
    let stashed = engine.stash_recurrent(&original).unwrap();
    let gdn: Vec<Option<[Rows; 2]>> = (0..stashed.layer_count())
        .map(|n| stashed.layer(n))
        .collect();
    let mut on_device = engine
        .session_from_blocks(cut, &[&head, &tail], &gdn, 64)
        .unwrap();
    assert_eq!(on_device.position, cut);
    // The restored session's full blocks are the original's (mapped, not copied); a block the
    // prefix ends in mid-way was copied when room was made to write into it.
    let full = cut / BLOCK_TOKENS;
    assert_eq!(
        &on_device.kv.blocks()[..full],
        &original.kv.blocks()[..full],
        "{name}: the full blocks of the prefix are shared"
    );
    let partial = cut % BLOCK_TOKENS;
    if partial > 0 {
        assert_ne!(
            on_device.kv.blocks()[full],
            original.kv.blocks()[full],
            "{name}: the partial block is copied before the restored session writes into it"
        );
    }
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
    // The rest as a chunk of its own against the whole prompt at once: the last row within the
    // prefix cache's bound.
    let mut cold = engine.new_session().unwrap();
    let whole = engine.forward(&mut cold, &prompt, LogitsFor::Last).unwrap();
    let diff = spindle_testkit::max_abs_diff(&whole, &a[a.len() - vocab..]);
    assert!(
        diff <= 1e-4,
        "{name}: the prompt's last {} tokens after its first {cut} differ from the cold run by {diff}",
        rest.len()
    );
    drop(cold);
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

/// Two requests diverging after a shared prefix of `shared` tokens, on one engine: the second is
/// restored from the first's blocks and both then run concurrently (batched prompt chunks, then
/// batched decode steps); each must match its cold run (logits within 1e-4, the same greedy
/// tokens). The shared full blocks are counted once by the pool, and every reference goes back
/// when the sessions and pieces are dropped.
fn diverging(name: &str, shared: usize) {
    let dir = spindle_testkit::fixture(name);
    let engine = CudaEngine::load(&dir, 0).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = engine.config().vocab_size;
    let prefix = pseudo_random(shared, vocab, 5);
    let tails = [pseudo_random(11, vocab, 6), pseudo_random(7, vocab, 7)];
    let prompts: Vec<Vec<u32>> = tails
        .iter()
        .map(|t| prefix.iter().chain(t).copied().collect())
        .collect();
    let steps = 5;

    // Cold runs, one at a time.
    let cold: Vec<(Vec<f32>, Vec<u32>)> = prompts
        .iter()
        .map(|p| {
            let mut s = engine.new_session().unwrap();
            let last = engine.forward(&mut s, p, LogitsFor::Last).unwrap();
            let mut tokens = vec![spindle_kernels::softmax::argmax(&last) as u32];
            for _ in 1..steps {
                let l = engine
                    .forward(&mut s, &[*tokens.last().unwrap()], LogitsFor::Last)
                    .unwrap();
                tokens.push(spindle_kernels::softmax::argmax(&l) as u32);
            }
            (last, tokens)
        })
        .collect();
    assert_eq!(
        engine.kv_pool().counts().used,
        0,
        "{name}: cold runs gave their blocks back"
    );

    // The first request's prefix captured, the second restored from it.
    let mut first = engine.new_session().unwrap();
    engine
        .forward(&mut first, &prefix, LogitsFor::Last)
        .unwrap();
    let piece = engine.stash_kv_rows(&first, 0).unwrap();
    let state = engine.stash_recurrent(&first).unwrap();
    let gdn: Vec<Option<[Rows; 2]>> = (0..state.layer_count()).map(|n| state.layer(n)).collect();
    let second = engine
        .session_from_blocks(shared, &[&piece], &gdn, shared + tails[1].len())
        .unwrap();
    let full = shared / BLOCK_TOKENS;
    let counts = engine.kv_pool().counts();
    assert!(
        counts.shared >= full,
        "{name}: {} shared blocks, {full} expected",
        counts.shared
    );
    // Each sequence's own blocks plus the shared ones once.
    let own = blocks_for(shared) + 1 + (blocks_for(shared) - full);
    assert!(
        counts.used <= own,
        "{name}: {} blocks used, at most {own} expected",
        counts.used
    );

    // The tails as one batched step, then decode steps of both at once.
    let mut sessions = [first, second];
    let mut last: Vec<Vec<f32>> = {
        let [a, b] = &mut sessions;
        let mut items = [
            CudaBatchItem {
                session: a,
                ids: &tails[0],
                want: LogitsFor::Last,
            },
            CudaBatchItem {
                session: b,
                ids: &tails[1],
                want: LogitsFor::Last,
            },
        ];
        engine
            .forward_batch(&mut items)
            .into_iter()
            .map(|r| r.unwrap())
            .collect()
    };
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(), Vec::new()];
    for (n, (cold_last, _)) in cold.iter().enumerate() {
        let diff = spindle_testkit::max_abs_diff(&last[n], cold_last);
        assert!(
            diff <= 1e-4,
            "{name}: request {n} after the shared prefix differs by {diff}"
        );
    }
    for step in 0..steps {
        for n in 0..2 {
            tokens[n].push(spindle_kernels::softmax::argmax(&last[n]) as u32);
        }
        if step + 1 == steps {
            break;
        }
        let next = [tokens[0][step], tokens[1][step]];
        let [a, b] = &mut sessions;
        let mut items = [
            CudaBatchItem {
                session: a,
                ids: &next[..1],
                want: LogitsFor::Last,
            },
            CudaBatchItem {
                session: b,
                ids: &next[1..],
                want: LogitsFor::Last,
            },
        ];
        last = engine
            .forward_batch(&mut items)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
    }
    for n in 0..2 {
        assert_eq!(
            tokens[n], cold[n].1,
            "{name}: request {n}'s greedy tokens differ"
        );
    }
    // The pieces still hold the prefix's blocks; the sequences wrote only their own.
    assert!(engine.kv_pool().counts().shared >= full);
    drop(sessions);
    drop((piece, state));
    // The batched steps' pad sequence holds a block of its own.
    engine.drop_batch_state();
    assert_eq!(
        engine.kv_pool().counts(),
        spindle_model::paged::BlockCounts {
            used: 0,
            shared: 0,
            ..engine.kv_pool().counts()
        },
        "{name}: every reference went back"
    );
    eprintln!(
        "{name}: two requests after a shared prefix of {shared} tokens match their cold runs"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn requests_diverging_after_a_shared_prefix_run_concurrently() {
    for name in ["qwen3_5_moe", "qwen3_5_dense", "qwen3_next_moe"] {
        // Mid-block and on a block edge.
        diverging(name, 37);
        diverging(name, 48);
    }
}

/// A pool too small for two sequences refuses the second one's blocks by name (the pool is
/// unchanged, the first sequence unharmed); once the first is gone the second runs and gives
/// the same logits as with room to spare.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_full_pool_makes_a_sequence_wait_not_differ() {
    let dir = spindle_testkit::fixture("qwen3_5_moe");
    let mut engine = CudaEngine::load(&dir, 0).unwrap();
    let vocab = engine.config().vocab_size;
    let prompt = pseudo_random(40, vocab, 9);
    let mut roomy = engine.new_session().unwrap();
    let want = engine.forward(&mut roomy, &prompt, LogitsFor::All).unwrap();
    drop(roomy);

    // Room for 4 blocks (64 tokens): one 40-token sequence (3 blocks) fits, two do not.
    let block = engine.kv_pool().block_bytes() as u64;
    engine.set_kv_pool_bytes(4 * block).unwrap();
    assert_eq!(engine.kv_pool().counts().capacity, 4);
    let mut a = engine.new_session().unwrap();
    let got = engine.forward(&mut a, &prompt, LogitsFor::All).unwrap();
    assert_eq!(got, want, "the same sequence in a small pool");
    let mut b = engine.new_session().unwrap();
    let err = engine
        .forward(&mut b, &prompt, LogitsFor::All)
        .expect_err("no blocks for a second sequence");
    assert!(
        spindle_cuda::is_pool_full(&err).is_some() && err.to_string().contains("KV block pool"),
        "{err}"
    );
    assert_eq!(b.position, 0, "the refused step changed nothing");
    assert_eq!(engine.kv_pool().counts().used, 3);
    drop(a);
    let got = engine.forward(&mut b, &prompt, LogitsFor::All).unwrap();
    assert_eq!(got, want, "the waiting sequence, run once room was made");
    drop(b);
    assert_eq!(engine.kv_pool().counts().used, 0);
}
