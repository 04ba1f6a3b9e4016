//! Every SIMD path this CPU runs against the scalar references, per format and batch size.

use super::*;
use crate::testutil::*;
use spindle_model::quant::{QuantizedMatrix, WeightFormat};

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
    if cols.is_multiple_of(GROUP) {
        for (format, name) in [(WeightFormat::Q8, "q8"), (WeightFormat::Q4, "q4")] {
            let quant = Some(QuantizedMatrix::quantize(&wf, rows, cols, format));
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
            for tokens in [1, 2, 3, 4, 5, 8, 9, 16, 33] {
                let x = vec(&mut rng, tokens * cols, 1.0);
                let mut exact = vec![0.0; tokens * rows];
                matmul_ref(&w, &x, tokens, &mut exact);
                let mut int8 = vec![0.0; tokens * rows];
                if quantized {
                    matmul_quantized_ref(&w, &x, tokens, &mut int8);
                }
                let scale = w_scale(&exact);
                for &isa in &isas {
                    // Integer dots and the int8 GEMM see int8 activations; the f32 GEMM sees
                    // them in f32.
                    let reference = if int8_activations(isa, &w, tokens) {
                        &int8
                    } else {
                        &exact
                    };
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

/// `matmul_groups` gives every group's rows exactly what `matmul` gives that group alone (the
/// batched step's guarantee that a sequence's result does not depend on its neighbours),
/// whether the groups share one path (decoding sequences) or not (a prompt chunk among them).
#[test]
fn grouped_matmul_gives_each_group_its_solo_bits() {
    let mut rng = rng(11);
    // 544 columns: 16 groups through the SIMD dots' main loop and one through their tail.
    let (rows, cols) = (70, 544);
    let layouts: &[&[usize]] = &[
        &[1, 1, 1, 1],
        &[1, 1, 1, 1, 1, 1, 1, 1, 1],
        &[1, 2, 3],
        &[1, 5, 1, 40, 2],
        &[7, 33],
        &[4],
    ];
    for owned in formats(&mut rng, rows, cols) {
        let w = owned.mat(rows, cols);
        for &isa in &Isa::all_available() {
            for groups in layouts {
                let tokens: usize = groups.iter().sum();
                let x = vec(&mut rng, tokens * cols, 1.0);
                let mut y = vec![f32::NAN; tokens * rows];
                matmul_groups_with(isa, &w, &x, groups, &mut y);
                let mut first = 0;
                for &n in groups.iter() {
                    let mut solo = vec![0.0; n * rows];
                    matmul_with(isa, &w, &x[first * cols..(first + n) * cols], n, &mut solo);
                    let got = &y[first * rows..(first + n) * rows];
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(got),
                        bits(&solo),
                        "{isa:?} {} groups {groups:?}: the group of {n} at row {first}",
                        owned.name
                    );
                    first += n;
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
            let w = MatRef::new(Weights::Bf16(&buf[shift..]), 1, cols);
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
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            let q4 = format == WeightFormat::Q4;
            let q = QuantizedMatrix::quantize(&values, 1, 256, format);
            let mut reference = None;
            for shift in 0..64 {
                let mut buf = vec![0u8; shift + q.qs.len()];
                buf[shift..].copy_from_slice(&q.qs);
                let weights = if q4 {
                    Weights::Q4 {
                        qs: &buf[shift..],
                        scales: &q.scales,
                    }
                } else {
                    Weights::Q8 {
                        qs: bytemuck::cast_slice(&buf[shift..]),
                        scales: &q.scales,
                    }
                };
                let mut y = [0.0f32];
                matvec_with(isa, &MatRef::new(weights, 1, 256), &x, &mut y);
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

#[test]
fn fast_activation_quantizer_matches_the_reference_bit_for_bit() {
    let mut r = rng(31);
    let cols = 96;
    let mut x = vec(&mut r, 5 * cols, 3.0);
    // Exact ties (k + 0.5 after scaling by 127/amax = 1 for the group with amax 127), zeros,
    // and an all-zero group.
    for (i, v) in x[..GROUP].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
    }
    x[GROUP..2 * GROUP].iter_mut().for_each(|v| *v = 0.0);
    x[2 * GROUP] = -0.0;
    let reference = QuantizedActs::quantize(&x, cols);
    for isa in Isa::all_available() {
        let fast = quantize_acts(isa, &x, cols);
        assert_eq!(fast.qs, reference.qs, "{isa:?}");
        assert_eq!(fast.sums, reference.sums, "{isa:?}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast.d), bits(&reference.d), "{isa:?}");
        assert_eq!(bits(&fast.sd), bits(&reference.sd), "{isa:?}");
    }
}

#[test]
fn gemm_results_do_not_depend_on_where_the_weights_sit_or_on_the_batch() {
    // Every path and format at several token counts: shifting the weights by any byte offset
    // gives the same bits, and a token's outputs do not depend on the other tokens.
    let mut r = rng(41);
    let (rows, cols) = (37, 160);
    let values = vec(&mut r, rows * cols, 1.0);
    let x = vec(&mut r, 40 * cols, 1.0);
    for format in [WeightFormat::Q8, WeightFormat::Q4] {
        let q4 = format == WeightFormat::Q4;
        let q = QuantizedMatrix::quantize(&values, rows, cols, format);
        for isa in Isa::all_available() {
            for tokens in [2, 4, 9, 17, 40] {
                let x = &x[..tokens * cols];
                let mut reference: Option<Vec<u32>> = None;
                for shift in [0, 1, 3, 17, 63] {
                    let mut buf = vec![0u8; shift + q.qs.len()];
                    buf[shift..].copy_from_slice(&q.qs);
                    let weights = if q4 {
                        Weights::Q4 {
                            qs: &buf[shift..],
                            scales: &q.scales,
                        }
                    } else {
                        Weights::Q8 {
                            qs: bytemuck::cast_slice(&buf[shift..]),
                            scales: &q.scales,
                        }
                    };
                    let w = MatRef::new(weights, rows, cols);
                    let mut y = vec![0.0f32; tokens * rows];
                    matmul_with(isa, &w, x, tokens, &mut y);
                    let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    let want = reference.get_or_insert_with(|| bits.clone());
                    assert_eq!(
                        *want, bits,
                        "{isa:?} q4={q4} tokens={tokens} offset {shift}"
                    );
                }
                // The last token alone, through the same path, gives the same bits when the
                // path sees it in the same form (the int8 GEMM quantizes per token).
                if int8_gemm(isa) && tokens >= gemm_min_tokens_with(isa, &q.mat()) {
                    let last = &x[(tokens - 1) * cols..];
                    let mut batch = vec![0.0f32; tokens * rows];
                    matmul_with(isa, &q.mat(), x, tokens, &mut batch);
                    let mut pad = last.to_vec();
                    pad.extend_from_slice(&x[..(gemm_min_tokens_with(isa, &q.mat()) - 1) * cols]);
                    let n = pad.len() / cols;
                    let mut alone = vec![0.0f32; n * rows];
                    matmul_with(isa, &q.mat(), &pad, n, &mut alone);
                    assert_eq!(
                        &batch[(tokens - 1) * rows..],
                        &alone[..rows],
                        "{isa:?} q4={q4} tokens={tokens}"
                    );
                }
            }
        }
    }
}

#[test]
fn float_gemm_results_do_not_depend_on_where_the_weights_sit() {
    let mut r = rng(43);
    let (rows, cols) = (21, 200);
    let row_bits = bf16_vec(&mut r, rows * cols);
    let x = vec(&mut r, 40 * cols, 1.0);
    for isa in Isa::all_available() {
        for tokens in [2, 5, 31, 32, 40] {
            let x = &x[..tokens * cols];
            let mut reference: Option<Vec<u32>> = None;
            for shift in [0, 1, 7, 31] {
                let mut buf = vec![0u16; shift + row_bits.len()];
                buf[shift..].copy_from_slice(&row_bits);
                let w = MatRef::new(Weights::Bf16(&buf[shift..]), rows, cols);
                let mut y = vec![0.0f32; tokens * rows];
                matmul_with(isa, &w, x, tokens, &mut y);
                let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                let want = reference.get_or_insert_with(|| bits.clone());
                assert_eq!(*want, bits, "{isa:?} tokens={tokens} offset {shift}");
            }
        }
    }
}

/// `dot` on every path this CPU runs: within rounding of an f64 sum, and the same bits
/// whatever the slices' alignment (a copy at another address gives the same result).
#[test]
fn dot_matches_f64_on_every_path_and_alignment() {
    let mut r = rng(71);
    for n in [1, 7, 16, 33, 256, 1000] {
        let a = vec(&mut r, n, 1.0);
        let b = vec(&mut r, n, 1.0);
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        for isa in Isa::all_available() {
            let got = dot_with(isa, &a, &b);
            let tol = 1e-5 * (n as f64).sqrt() * 4.0;
            assert!(
                (got as f64 - want).abs() <= tol,
                "{isa:?} n={n}: {got} vs {want}"
            );
            let mut shifted = vec![0.0f32; n + 1];
            shifted[1..].copy_from_slice(&a);
            assert_eq!(
                dot_with(isa, &shifted[1..], &b).to_bits(),
                got.to_bits(),
                "{isa:?} n={n}: result depends on alignment"
            );
        }
    }
}

/// `axpy` on every path this CPU runs against the plain loop, at several alignments.
#[test]
fn axpy_matches_scalar_on_every_path() {
    let mut r = rng(72);
    for n in [1, 15, 16, 17, 64, 257] {
        let x = vec(&mut r, n + 1, 1.0);
        let y0 = vec(&mut r, n + 1, 1.0);
        let s = 0.37f32;
        for off in [0, 1] {
            let want: Vec<f32> = y0[off..off + n]
                .iter()
                .zip(&x[1 - off..1 - off + n])
                .map(|(y, x)| y + s * x)
                .collect();
            for isa in Isa::all_available() {
                let mut y = y0[off..off + n].to_vec();
                axpy_with(isa, &mut y, s, &x[1 - off..1 - off + n]);
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                        "{isa:?} n={n} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// On aarch64 the NEON path exists and is among the paths every test above runs.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_runs_on_aarch64() {
    assert!(Isa::Neon.available());
    assert!(Isa::all_available().contains(&Isa::Neon));
    assert_eq!(Isa::best(), Isa::Neon);
}

/// The int8 GEMM (every Q8/Q4 token count on AVX-512 VNNI, from one token on) gives exactly
/// the bits of its scalar reference, through both of its kernels (weights read in place for
/// up to 8 tokens, packed panels beyond) and on partial panels (rows not a multiple of 16).
#[test]
fn int8_gemm_matches_its_exact_reference_bit_for_bit() {
    let mut rng = rng(51);
    let mut tested = false;
    for &(rows, cols) in &[(16, 32), (37, 160), (70, 544), (33, 2048)] {
        let values = vec(&mut rng, rows * cols, 1.0);
        for format in [WeightFormat::Q8, WeightFormat::Q4] {
            let q = QuantizedMatrix::quantize(&values, rows, cols, format);
            let w = q.mat();
            for isa in Isa::all_available() {
                if path_for(isa, &w, 1) != Path::Int8Gemm {
                    continue;
                }
                tested = true;
                for tokens in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17] {
                    let x = vec(&mut rng, tokens * cols, 1.0);
                    let mut want = vec![0.0f32; tokens * rows];
                    matmul_int8_exact_ref(&w, &x, tokens, &mut want);
                    let mut got = vec![f32::NAN; tokens * rows];
                    matmul_with(isa, &w, &x, tokens, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{isa:?} {format:?} {rows}x{cols} tokens={tokens}"
                    );
                    if tokens == 1 {
                        let mut mv = vec![f32::NAN; rows];
                        matvec_with(isa, &w, &x, &mut mv);
                        assert_eq!(bits(&mv), bits(&want), "{isa:?} {format:?} matvec");
                    }
                }
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx512.available() && panel_gemms(Isa::Avx512) {
        assert!(
            tested,
            "AVX-512 VNNI is here but no Q8/Q4 matmul took the int8 GEMM"
        );
    }
    let _ = tested;
}

/// A token's outputs are the same bits whether it is multiplied alone or among up to 15
/// others, for Q8/Q4 at every batch size a decode step sees, on every path this CPU runs:
/// a decoding sequence's logits never depend on its neighbours.
#[test]
fn quantized_rows_get_the_same_bits_alone_and_in_a_batch() {
    let mut rng = rng(53);
    let (rows, cols) = (45, 320);
    let values = vec(&mut rng, rows * cols, 1.0);
    for format in [WeightFormat::Q8, WeightFormat::Q4] {
        let q = QuantizedMatrix::quantize(&values, rows, cols, format);
        let w = q.mat();
        for isa in Isa::all_available() {
            // Every path except the f32 GEMM of paths without the int8 one keeps rows apart.
            let most = 16.min(gemm_min_tokens_with(isa, &w).max(2) - 1);
            let most = if path_for(isa, &w, 1) == Path::Int8Gemm {
                16
            } else {
                most
            };
            for tokens in 2..=most {
                let x = vec(&mut rng, tokens * cols, 1.0);
                let mut batch = vec![0.0f32; tokens * rows];
                matmul_with(isa, &w, &x, tokens, &mut batch);
                for t in 0..tokens {
                    let mut alone = vec![0.0f32; rows];
                    matvec_with(isa, &w, &x[t * cols..(t + 1) * cols], &mut alone);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&batch[t * rows..(t + 1) * rows]),
                        bits(&alone),
                        "{isa:?} {format:?} token {t} of {tokens}"
                    );
                }
            }
        }
    }
}
