//! Every SIMD path this CPU runs against the scalar references, per format and batch size.

use super::*;
use crate::quant::QuantizedMatrix;
use crate::testutil::*;

/// Owned test weights in one format.
struct Owned {
    f32s: Vec<f32>,
    u16s: Vec<u16>,
    quant: Option<QuantizedMatrix>,
    name: &'static str,
}

fn formats(rng: &mut rand::rngs::StdRng, rows: usize, cols: usize) -> Vec<Owned> {
    let wf = vec(rng, rows * cols, 1.0);
    let mut out = vec![
        Owned {
            f32s: wf.clone(),
            u16s: vec![],
            quant: None,
            name: "f32",
        },
        Owned {
            f32s: vec![],
            u16s: bf16_vec(rng, rows * cols),
            quant: None,
            name: "bf16",
        },
        Owned {
            f32s: vec![],
            u16s: wf
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect(),
            quant: None,
            name: "f16",
        },
    ];
    if cols % GROUP == 0 {
        for (q4, name) in [(false, "q8"), (true, "q4")] {
            let quant = Some(QuantizedMatrix::quantize(&wf, rows, cols, q4));
            out.push(Owned {
                f32s: vec![],
                u16s: vec![],
                quant,
                name,
            });
        }
    }
    out
}

impl Owned {
    fn mat(&self, rows: usize, cols: usize) -> MatRef<'_> {
        match (self.name, &self.quant) {
            (_, Some(q)) => q.mat(),
            ("f32", _) => MatRef::new(Weights::F32(&self.f32s), rows, cols),
            ("bf16", _) => MatRef::new(Weights::Bf16(&self.u16s), rows, cols),
            _ => MatRef::new(Weights::F16(&self.u16s), rows, cols),
        }
    }
}

#[test]
fn every_path_matches_the_reference_for_every_format_and_batch() {
    let mut rng = rng(7);
    let isas = Isa::all_available();
    assert!(isas.contains(&Isa::Scalar));
    for &(rows, cols) in &[
        (3, 64),
        (67, 96),
        (131, 544),
        (257, 1056),
        (5, 67),
        (130, 200),
    ] {
        for owned in formats(&mut rng, rows, cols) {
            let w = owned.mat(rows, cols);
            let quantized = owned.quant.is_some();
            for tokens in [1, 2, 5, 16, 33] {
                let x = vec(&mut rng, tokens * cols, 1.0);
                let mut exact = vec![0.0; tokens * rows];
                matmul_ref(&w, &x, tokens, &mut exact);
                let mut int8 = vec![0.0; tokens * rows];
                if quantized {
                    matmul_quantized_ref(&w, &x, tokens, &mut int8);
                }
                // Integer dots see int8 activations; the GEMM sees them in f32.
                let reference = if quantized && tokens < gemm_min_tokens(&w) {
                    &int8
                } else {
                    &exact
                };
                let scale = w_scale(&exact);
                for &isa in &isas {
                    let mut y = vec![f32::NAN; tokens * rows];
                    matmul_with(isa, &w, &x, tokens, &mut y);
                    let err = max_abs_diff(&y, reference);
                    let what = format!("{isa:?} {} {rows}x{cols} tokens={tokens}", owned.name);
                    assert!(
                        err <= 2e-6 * cols as f32 * scale.max(1.0),
                        "{what}: err {err}"
                    );
                    // And close to the exact product: int8 activations add rounding noise of
                    // std ≈ 0.0013·√cols for inputs in [-1, 1]; allow about 8σ.
                    let loose = max_abs_diff(&y, &exact);
                    assert!(
                        loose <= 0.01 * (cols as f32).sqrt(),
                        "{what}: vs exact {loose}"
                    );
                }
            }
        }
    }
}

/// Largest |y| in a result: the scale errors are measured against.
fn w_scale(y: &[f32]) -> f32 {
    y.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

#[test]
fn matvec_equals_matmul_of_one_token() {
    let mut rng = rng(3);
    let (rows, cols) = (77, 256);
    for owned in formats(&mut rng, rows, cols) {
        let w = owned.mat(rows, cols);
        let x = vec(&mut rng, cols, 1.0);
        let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
        matvec(&w, &x, &mut a);
        matmul(&w, &x, 1, &mut b);
        assert_eq!(a, b, "{}", owned.name);
    }
}

#[test]
fn large_matvec_uses_threads_and_still_matches() {
    let mut rng = rng(4);
    let (rows, cols) = (1001, 512);
    for owned in formats(&mut rng, rows, cols) {
        let w = owned.mat(rows, cols);
        let x = vec(&mut rng, cols, 1.0);
        let (mut fast, mut exact) = (vec![0.0; rows], vec![0.0; rows]);
        matvec(&w, &x, &mut fast);
        matmul_ref(&w, &x, 1, &mut exact);
        assert!(
            max_abs_diff(&fast, &exact) <= 0.01 * (cols as f32).sqrt(),
            "{}",
            owned.name
        );
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn both_x86_paths_are_tested_where_the_cpu_has_them() {
    let isas = Isa::all_available();
    if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw") {
        assert!(
            isas.contains(&Isa::Avx512) && isas.contains(&Isa::Avx2),
            "{isas:?}"
        );
    }
}

#[test]
fn results_do_not_depend_on_where_the_weights_sit() {
    // The same bf16 row at every offset within a cache line must give the same bits: outputs
    // are bit-identical across checkpoint layouts and expert residencies only if the
    // summation order ignores alignment.
    let mut r = crate::testutil::rng(21);
    let cols = 200;
    let row = crate::testutil::bf16_vec(&mut r, cols);
    let x = crate::testutil::vec(&mut r, cols, 1.0);
    for isa in crate::simd::Isa::all_available() {
        let mut reference = None;
        for shift in 0..32 {
            let mut buf = vec![0u16; shift + cols];
            buf[shift..].copy_from_slice(&row);
            let w = crate::MatRef::new(crate::Weights::Bf16(&buf[shift..]), 1, cols);
            let mut y = [0.0f32];
            matvec_with(isa, &w, &x, &mut y);
            let bits = y[0].to_bits();
            assert_eq!(
                *reference.get_or_insert(bits),
                bits,
                "{isa:?} at offset {shift}"
            );
        }
        // The same for q8 and q4 codes at every byte offset.
        let values = crate::testutil::vec(&mut r, 256, 1.0);
        let x = crate::testutil::vec(&mut r, 256, 1.0);
        for q4 in [false, true] {
            let q = QuantizedMatrix::quantize(&values, 1, 256, q4);
            let mut reference = None;
            for shift in 0..64 {
                let mut buf = vec![0u8; shift + q.qs.len()];
                buf[shift..].copy_from_slice(&q.qs);
                let weights = if q4 {
                    crate::Weights::Q4 {
                        qs: &buf[shift..],
                        scales: &q.scales,
                    }
                } else {
                    crate::Weights::Q8 {
                        qs: bytemuck::cast_slice(&buf[shift..]),
                        scales: &q.scales,
                    }
                };
                let mut y = [0.0f32];
                matvec_with(isa, &crate::MatRef::new(weights, 1, 256), &x, &mut y);
                let bits = y[0].to_bits();
                assert_eq!(
                    *reference.get_or_insert(bits),
                    bits,
                    "{isa:?} q4={q4} at offset {shift}"
                );
            }
        }
    }
}
