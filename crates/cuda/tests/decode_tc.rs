//! The tensor-core decode matvec (`matvec_tc.cu`, Q8/Q4 steps of at least TCD_TOKENS rows)
//! against the decode matvec it stands in for (`decode_matvec_*_t8`, one launch for all rows)
//! on random weights and inputs: every output the same bits, for each epilogue (store, fused
//! norm, SwiGLU, gated accumulate), row counts that are not multiples of 16, token counts that
//! are not multiples of 8, and every lanes-per-row value the host picks (1 to 32, including
//! rows whose groups are not a multiple of it); and rows of the batch against the same rows
//! decoded alone (`_t1`).
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test decode_tc -- --ignored`.

use spindle_cuda::kernels::TCD_TOKENS;
use spindle_cuda::{testing, Device};
use spindle_model::quant::WeightFormat;
use spindle_model::weights::Linear;
use spindle_testkit::Rng;

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"))
}

/// Panics unless `got` and `want` hold the same bits, naming the first output that differs.
fn assert_same_bits(what: &str, got: &[f32], want: &[f32], width: usize) {
    assert_eq!(got.len(), want.len(), "{what}: output lengths");
    assert!(
        want.iter().any(|v| *v != 0.0),
        "{what}: the reference is all zeros"
    );
    for (n, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits(),
            "{what}: token {}, output {}: tensor cores {a:e}, decode matvec {b:e}",
            n / width,
            n % width
        );
    }
}

/// The decode linear path of `w` with the tensor-core decode matvec on, then off.
fn both(
    dev: &Device,
    w: &Linear,
    x: &[f32],
    tokens: usize,
    norm: Option<(&[f32], f32)>,
    epilogue: testing::Epilogue,
) -> (Vec<f32>, Vec<f32>) {
    dev.set_tc_decode_rows(TCD_TOKENS);
    let tc = testing::decode_linear_of(dev, w, x, tokens, norm, epilogue).unwrap();
    dev.set_tc_decode_rows(0);
    let reference = testing::decode_linear_of(dev, w, x, tokens, norm, epilogue).unwrap();
    dev.set_tc_decode_rows(TCD_TOKENS);
    (tc, reference)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tensor_core_decode_matvec_keeps_every_rows_bits() {
    let dev = device();
    // From the fewest rows the kernel takes (the engine's default starts higher).
    dev.set_tc_decode_rows(TCD_TOKENS);
    assert!(
        dev.tc_decode_rows() == TCD_TOKENS && dev.group_launch(),
        "needs int8 tensor cores (sm_80+) and SPINDLE_CUDA_DECODE_GROUP_LAUNCH unset"
    );
    let mut rng = Rng(0x7cdec);
    // (cols, rows, tokens): cols of 1-2 groups per lane and lanes per row 1 (32, 64, 128), 2
    // (256), 4 (512), 8 (1024), 16 (2048; 3072: 96 groups), 32 (4096; 4160: 130 groups).
    let shapes = [
        (32, 37, 16),
        (64, 129, 17),
        (128, 16, 24),
        (256, 200, 31),
        (512, 77, 40),
        (1024, 300, 16),
        (2048, 514, 64),
        (3072, 45, 23),
        (4096, 259, 33),
        (4160, 18, 18),
    ];
    for (cols, rows, tokens) in shapes {
        let x = rng.signed_vec(tokens * cols, 2.0);
        let nw = rng.signed_vec(cols, 0.5);
        let norm = Some((nw.as_slice(), 1e-6f32));
        let init = rng.signed_vec(tokens * rows, 1.0);
        let gate = rng.signed_vec(tokens, 3.0);
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            assert!(
                testing::tc_decode_applies(&dev, format, cols, tokens),
                "{format:?} [{rows}, {cols}] × {tokens}: the tensor-core path does not apply"
            );
            let w = Linear::from_f32(format, &rng.signed_vec(rows * cols, 0.1), rows, cols);
            let shape = format!("{format:?} [{rows}, {cols}] × {tokens}");

            let (tc, reference) = both(&dev, &w, &x, tokens, None, testing::Epilogue::Store);
            assert_same_bits(&format!("store {shape}"), &tc, &reference, rows);
            // The first and last tokens decoded alone (`_t1`, one token per launch).
            for t in [0, tokens - 1] {
                let row = &x[t * cols..(t + 1) * cols];
                let alone =
                    testing::decode_linear_of(&dev, &w, row, 1, None, testing::Epilogue::Store)
                        .unwrap();
                assert_same_bits(
                    &format!("store {shape}, token {t} alone"),
                    &tc[t * rows..(t + 1) * rows],
                    &alone,
                    rows,
                );
            }

            let (tc, reference) = both(&dev, &w, &x, tokens, norm, testing::Epilogue::Store);
            assert_same_bits(&format!("norm, store {shape}"), &tc, &reference, rows);

            if rows % 2 == 0 {
                let (tc, reference) = both(&dev, &w, &x, tokens, norm, testing::Epilogue::SwiGlu);
                assert_same_bits(&format!("norm, swiglu {shape}"), &tc, &reference, rows / 2);
            }

            let epilogue = testing::Epilogue::Accumulate {
                init: &init,
                gate: Some(&gate),
            };
            let (tc, reference) = both(&dev, &w, &x, tokens, None, epilogue);
            assert_same_bits(&format!("gated accumulate {shape}"), &tc, &reference, rows);
            println!("{shape}: every output the decode matvec's bits");
        }
    }
}
