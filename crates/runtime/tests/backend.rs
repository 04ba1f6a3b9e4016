//! The backend interface on the CPU, with the embedded demo checkpoint: input checked once
//! before the forward pass, greedy steps, session state, and the bench driving it.

use spindle_cpu::{LoadOptions, LogitsFor};
use spindle_kernels::softmax::argmax;
use spindle_runtime::bench::{self, BenchOptions};
use spindle_runtime::{demo_dir, Backend, Device, InputError, RuntimeError};

fn demo() -> Backend {
    Backend::load(&demo_dir().unwrap(), Device::Cpu, &LoadOptions::default()).unwrap()
}

#[test]
fn bad_input_is_refused_by_name_and_leaves_the_session_usable() {
    let backend = demo();
    let vocab = backend.config().vocab_size;
    let limit = backend.config().max_position_embeddings;
    let mut session = backend.new_session().unwrap();
    let mut reference = backend.new_session().unwrap();

    let refused = |r: spindle_runtime::Result<Vec<f32>>| match r {
        Err(RuntimeError::Input(e)) => e,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("bad input was run"),
    };
    let err = refused(backend.forward(&mut session, &[], LogitsFor::Last));
    assert_eq!(err, InputError::EmptyInput);
    let err = refused(backend.forward(&mut session, &[1, vocab as u32, 2], LogitsFor::Last));
    assert_eq!(
        err,
        InputError::InvalidToken {
            id: vocab as u32,
            position: 1,
            vocab_size: vocab
        }
    );
    assert!(err.to_string().contains("vocab"), "{err}");
    let too_long = vec![1u32; limit + 1];
    let err = refused(backend.forward(&mut session, &too_long, LogitsFor::Last));
    assert!(matches!(err, InputError::ContextOverflow { .. }), "{err}");
    let Err(RuntimeError::Input(InputError::InvalidToken { .. })) =
        backend.decode_greedy(&mut session, u32::MAX)
    else {
        panic!("decode_greedy ran a token outside the vocabulary");
    };

    // Nothing was fed: the session answers as a fresh one.
    assert_eq!(session.position(), 0);
    let prompt = [1, 2, 3];
    assert_eq!(
        backend
            .forward(&mut session, &prompt, LogitsFor::Last)
            .unwrap(),
        backend
            .forward(&mut reference, &prompt, LogitsFor::Last)
            .unwrap()
    );
}

#[test]
fn a_greedy_step_is_the_argmax_of_the_forward_pass() {
    let backend = demo();
    let mut stepped = backend.new_session().unwrap();
    let mut forwarded = backend.new_session().unwrap();
    let prompt = [5, 6, 7, 8];
    let logits = backend
        .forward(&mut stepped, &prompt, LogitsFor::Last)
        .unwrap();
    backend
        .forward(&mut forwarded, &prompt, LogitsFor::Last)
        .unwrap();
    let empty = backend.new_session().unwrap().state_bytes();
    let before = stepped.state_bytes();
    assert!(before > empty, "{before} after a prompt, {empty} before");

    let mut next = argmax(&logits) as u32;
    // Past the first KV block (16 tokens): the CPU's state grows a block at a time.
    let steps = spindle_model::paged::BLOCK_TOKENS;
    for _ in 0..steps {
        let want = argmax(
            &backend
                .forward(&mut forwarded, &[next], LogitsFor::Last)
                .unwrap(),
        );
        next = backend.decode_greedy(&mut stepped, next).unwrap();
        assert_eq!(next as usize, want);
    }
    assert_eq!(stepped.position(), prompt.len() + steps);
    assert!(stepped.state_bytes() > before);

    // The greedy run of the fixtures' layout picks the same tokens.
    let run = backend.greedy(&prompt, 5).unwrap();
    let mut session = backend.new_session().unwrap();
    let mut next = argmax(
        &backend
            .forward(&mut session, &prompt, LogitsFor::Last)
            .unwrap(),
    ) as u32;
    let mut ids = vec![next];
    for _ in 0..4 {
        next = backend.decode_greedy(&mut session, next).unwrap();
        ids.push(next);
    }
    assert_eq!(run.gen_ids, ids);
}

#[test]
fn the_bench_measures_each_context_on_the_cpu() {
    let backend = demo();
    let report = bench::run(
        &backend,
        &BenchOptions {
            prompt_tokens: 8,
            gen_tokens: 2,
            runs: 2,
            probe_bytes: 1 << 20,
            contexts: vec![4, 16],
        },
    )
    .unwrap();
    assert_eq!(report.device, "cpu");
    assert_eq!(
        (report.prompt_tokens, report.gen_tokens, report.runs),
        (8, 2, 2)
    );
    let contexts: Vec<usize> = report.decode.iter().map(|d| d.context).collect();
    assert_eq!(contexts, [4, 16]);
    assert!(report.prefill.min > 0.0 && report.prefill.min <= report.prefill.max);
    assert!(report.decode.iter().all(|d| d.tokens_per_s.median > 0.0));
    assert_eq!(
        report.weight_bytes_per_token,
        backend.weight_bytes_per_token()
    );
    assert!(report.measured_bandwidth_bytes_per_s > 0.0);
    assert!(report.decode_roofline_fraction() > 0.0);
    assert!(!report.graphs && report.profiles.is_empty());
}
