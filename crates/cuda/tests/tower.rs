//! The vision tower's tensor-core kernels (`spindle_cuda::tower`) against f64 references on
//! random data, with sizes that are not whole tiles: the GEMM and its epilogues, LayerNorm into
//! planes, the rotary split and flash attention, and the fp16 range flag.
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test tower -- --ignored`.

use spindle_cuda::tower::{
    attention, half_gemm, layer_norm_planes, rope_split, split_planes, Act, AttentionPlanes,
    AttentionShape, GemmOut, HalfMatrix,
};
use spindle_cuda::Device;
use spindle_model::quant::WeightFormat;
use spindle_model::weights::Linear;
use spindle_testkit::Rng;

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let dev = Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        dev.tensor_cores(),
        "these kernels need tensor cores (sm_80+)"
    );
    dev
}

fn bf16_round(v: f32) -> f32 {
    let bits = v.to_bits();
    f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

fn f16_value(h: u16) -> f32 {
    let (s, e, m) = (h >> 15, ((h >> 10) & 0x1f) as i32, (h & 0x3ff) as f32);
    let mag = match e {
        0 => m * 2f32.powi(-24),
        31 => f32::INFINITY,
        _ => 2f32.powi(e - 15) * (1.0 + m / 1024.0),
    };
    if s == 1 {
        -mag
    } else {
        mag
    }
}

/// Rows `[rows][planes][cols]` of fp16 planes back to f32 (hi + lo).
fn from_planes(p: &[u16], rows: usize, planes: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let mut v = 0.0f32;
            for pl in 0..planes {
                v += f16_value(p[(r * planes + pl) * cols + c]);
            }
            out[r * cols + c] = v;
        }
    }
    out
}

/// max |got − want| / max |want|.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b).abs()));
    assert!(err.is_finite(), "non-finite output");
    err / scale
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.7978846 * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_erf(x: f64) -> f64 {
    // erf by its Maclaurin series (within 1e-11 for |z| < 4), ±1 past it (erfc(4) ≈ 1.5e-8).
    let z = x / std::f64::consts::SQRT_2;
    let erf = if z.abs() >= 4.0 {
        z.signum()
    } else {
        let (mut term, mut sum) = (z, z);
        for n in 1..200 {
            term *= -z * z / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    };
    0.5 * x * (1.0 + erf)
}

/// The GEMM on shapes with partial tiles in every dimension (K not a multiple of 32), with
/// each epilogue: bias into f32 rows, added to rows, GELU (tanh) into planes, GELU (erf).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_matches_f64_reference() {
    let dev = device();
    let mut rng = Rng(11);
    for (m, n, k) in [
        (150, 200, 136),
        (77, 96, 1536),
        (300, 130, 72),
        (129, 257, 4304),
    ] {
        let w: Vec<f32> = rng
            .signed_vec(n * k, 1.0 / (k as f32).sqrt())
            .into_iter()
            .map(bf16_round)
            .collect();
        let x = rng.signed_vec(m * k, 1.0);
        let bias = rng.signed_vec(n, 0.1);
        let prior = rng.signed_vec(m * n, 1.0);
        let matrix = HalfMatrix::upload(&dev, &Linear::from_f32(WeightFormat::Bf16, &w, n, k))
            .unwrap()
            .unwrap_or_else(|why| panic!("{why}"));
        let mut reference = vec![0.0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|j| x[r * k + j] as f64 * w[c * k + j] as f64)
                    .sum();
                reference[r * n + c] = dot + bias[c] as f64;
            }
        }
        let xd = dev.upload(&x).unwrap();
        let b = dev.upload(&bias).unwrap();
        let flag = dev.zeros::<i32>(1).unwrap();
        let mut errors = Vec::new();
        for planes in [2, 1] {
            let a = dev.zeros::<u16>(m * planes * k).unwrap();
            split_planes(&dev, xd.arg(), k, m, k, planes, a.arg(), flag.arg()).unwrap();
            // Stored.
            let y = dev.zeros::<f32>(m * n).unwrap();
            let out = GemmOut::Rows {
                y: y.arg(),
                ldy: n,
                accumulate: false,
            };
            half_gemm(
                &dev,
                &matrix,
                a.arg(),
                planes,
                Some(b.arg()),
                Act::None,
                out,
                m,
                flag.arg(),
            )
            .unwrap();
            let got = dev.download(&y, 0, m * n).unwrap();
            let stored = relative_error(&got, &reference);
            // Added to rows.
            let y = dev.upload(&prior).unwrap();
            let out = GemmOut::Rows {
                y: y.arg(),
                ldy: n,
                accumulate: true,
            };
            half_gemm(
                &dev,
                &matrix,
                a.arg(),
                planes,
                Some(b.arg()),
                Act::None,
                out,
                m,
                flag.arg(),
            )
            .unwrap();
            let got = dev.download(&y, 0, m * n).unwrap();
            let want: Vec<f64> = reference
                .iter()
                .zip(&prior)
                .map(|(r, &p)| r + p as f64)
                .collect();
            let added = relative_error(&got, &want);
            // GELU (tanh) into planes.
            let p = dev.zeros::<u16>(m * planes * n).unwrap();
            half_gemm(
                &dev,
                &matrix,
                a.arg(),
                planes,
                Some(b.arg()),
                Act::GeluTanh,
                GemmOut::Planes(p.arg()),
                m,
                flag.arg(),
            )
            .unwrap();
            let got = from_planes(&dev.download(&p, 0, m * planes * n).unwrap(), m, planes, n);
            let want: Vec<f64> = reference.iter().map(|&v| gelu_tanh(v)).collect();
            let tanh = relative_error(&got, &want);
            // GELU (erf) into rows.
            let y = dev.zeros::<f32>(m * n).unwrap();
            let out = GemmOut::Rows {
                y: y.arg(),
                ldy: n,
                accumulate: false,
            };
            half_gemm(
                &dev,
                &matrix,
                a.arg(),
                planes,
                Some(b.arg()),
                Act::GeluErf,
                out,
                m,
                flag.arg(),
            )
            .unwrap();
            let got = dev.download(&y, 0, m * n).unwrap();
            let want: Vec<f64> = reference.iter().map(|&v| gelu_erf(v)).collect();
            let erf = relative_error(&got, &want);
            println!(
                "GEMM [{m}, {k}]·[{n}, {k}]ᵀ, {planes} plane(s): stored {stored:.2e}, added {added:.2e}, gelu-tanh planes {tanh:.2e}, gelu-erf {erf:.2e}"
            );
            let bound = if planes == 2 { 2e-6 } else { 2e-3 };
            for (what, e) in [
                ("stored", stored),
                ("added", added),
                ("tanh", tanh),
                ("erf", erf),
            ] {
                assert!(e < bound, "[{m}, {n}, {k}] {planes} planes {what}: {e}");
            }
            errors.push(stored);
        }
        assert!(
            errors[0] < errors[1] / 10.0,
            "the lo plane counts: {errors:?}"
        );
        assert_eq!(
            dev.download(&flag, 0, 1).unwrap()[0],
            0,
            "no value left fp16's range"
        );
    }
}

/// LayerNorm into planes against f64, and the range flag.
#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_norm_planes_and_the_range_flag() {
    let dev = device();
    let mut rng = Rng(5);
    let (rows, cols) = (37, 1152);
    let x: Vec<f32> = rng
        .signed_vec(rows * cols, 3.0)
        .iter()
        .map(|v| v + 0.5)
        .collect();
    let w: Vec<f32> = rng.signed_vec(cols, 0.2).iter().map(|v| v + 1.0).collect();
    let b = rng.signed_vec(cols, 0.1);
    let mut want = vec![0.0f64; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            want[r * cols + c] =
                (row[c] as f64 - mean) / (var + 1e-6).sqrt() * w[c] as f64 + b[c] as f64;
        }
    }
    let flag = dev.zeros::<i32>(1).unwrap();
    let (xd, wd, bd) = (
        dev.upload(&x).unwrap(),
        dev.upload(&w).unwrap(),
        dev.upload(&b).unwrap(),
    );
    let out = dev.zeros::<u16>(rows * 2 * cols).unwrap();
    layer_norm_planes(
        &dev,
        xd.arg(),
        wd.arg(),
        bd.arg(),
        1e-6,
        rows,
        cols,
        2,
        out.arg(),
        flag.arg(),
    )
    .unwrap();
    let got = from_planes(
        &dev.download(&out, 0, rows * 2 * cols).unwrap(),
        rows,
        2,
        cols,
    );
    let err = relative_error(&got, &want);
    println!("LayerNorm into 2 planes: {err:.2e}");
    assert!(err < 1e-6, "{err}");
    assert_eq!(dev.download(&flag, 0, 1).unwrap()[0], 0);
    // A value past fp16's range sets the flag.
    let big = dev.upload(&[1.0f32, -7.0e4, 2.0]).unwrap();
    let p = dev.zeros::<u16>(6).unwrap();
    split_planes(&dev, big.arg(), 3, 1, 3, 2, p.arg(), flag.arg()).unwrap();
    assert_eq!(
        dev.download(&flag, 0, 1).unwrap()[0],
        1,
        "-7e4 is past fp16's range"
    );
}

/// Rotary split and flash attention against f64 softmax attention, for row counts that are
/// and are not whole tiles and the head sizes the kernels take.
#[test]
#[ignore = "needs a CUDA GPU"]
fn attention_matches_f64_reference() {
    let dev = device();
    let mut rng = Rng(3);
    for (n, heads, hd) in [
        (100, 3, 24),
        (64, 2, 72),
        (130, 2, 72),
        (70, 2, 16),
        (257, 1, 72),
    ] {
        let width = heads * hd;
        let half = hd / 2;
        let qkv = rng.signed_vec(n * 3 * width, 2.0);
        let angles = rng.signed_vec(n * half, 3.0);
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        // Reference: rotate q and k (rotate_half, in f32 as the kernel does), attention in f64.
        let rot = |r: usize, off: usize, h: usize, j: usize| -> f32 {
            let row = &qkv[r * 3 * width + off + h * hd..];
            let i = j % half;
            let (c, s) = (cos[r * half + i], sin[r * half + i]);
            if j < half {
                row[j] * c - row[j + half] * s
            } else {
                row[j] * c + row[j - half] * s
            }
        };
        let mut want = vec![0.0f64; n * width];
        for h in 0..heads {
            let q: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..hd).map(|j| rot(r, 0, h, j) as f64).collect())
                .collect();
            let k: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..hd).map(|j| rot(r, width, h, j) as f64).collect())
                .collect();
            for r in 0..n {
                let s: Vec<f64> = (0..n)
                    .map(|c| {
                        q[r].iter().zip(&k[c]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let l: f64 = p.iter().sum();
                for j in 0..hd {
                    let v: f64 = (0..n)
                        .map(|c| p[c] * qkv[c * 3 * width + 2 * width + h * hd + j] as f64)
                        .sum();
                    want[r * width + h * hd + j] = v / l;
                }
            }
        }
        let shape = AttentionShape { n, heads, hd };
        let flag = dev.zeros::<i32>(1).unwrap();
        let qkv_d = dev.upload(&qkv).unwrap();
        let (cos_d, sin_d) = (dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
        let q = dev.zeros::<u16>(shape.qkv_len()).unwrap();
        let k = dev.zeros::<u16>(shape.qkv_len()).unwrap();
        let vt = dev.zeros::<u16>(shape.qkv_len()).unwrap();
        rope_split(
            &dev,
            shape,
            qkv_d.arg(),
            cos_d.arg(),
            sin_d.arg(),
            q.arg(),
            k.arg(),
            vt.arg(),
            flag.arg(),
        )
        .unwrap();
        let mut split_err = None;
        for planes in [
            AttentionPlanes::Split,
            AttentionPlanes::QkSplit,
            AttentionPlanes::Single,
        ] {
            if shape.kernel(planes).is_err() {
                continue;
            }
            for out_planes in [2, 1] {
                let o = dev.zeros::<u16>(n * out_planes * width).unwrap();
                attention(
                    &dev,
                    shape,
                    planes,
                    q.arg(),
                    k.arg(),
                    vt.arg(),
                    o.arg(),
                    out_planes,
                    flag.arg(),
                )
                .unwrap();
                let got = from_planes(
                    &dev.download(&o, 0, n * out_planes * width).unwrap(),
                    n,
                    out_planes,
                    width,
                );
                let err = relative_error(&got, &want);
                println!("attention n {n}, {heads} heads of {hd}, {planes:?}, out planes {out_planes}: {err:.2e}");
                let bound = match (planes, out_planes) {
                    (AttentionPlanes::Split, 2) => 3e-6,
                    _ => 3e-3,
                };
                assert!(
                    err < bound,
                    "n {n} hd {hd} {planes:?} out {out_planes}: {err}"
                );
                if planes == AttentionPlanes::Split && out_planes == 2 {
                    split_err = Some(err);
                } else if planes == AttentionPlanes::Single {
                    assert!(err > split_err.unwrap() * 10.0, "single planes are coarser");
                }
            }
        }
        assert_eq!(dev.download(&flag, 0, 1).unwrap()[0], 0);
    }
}

/// Values far below a matrix's largest are rounded onto fp16's subnormal grid and counted; a
/// matrix that is not bf16 is refused by name.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_weights_are_rounded_and_q8_refused() {
    let dev = device();
    let mut w = vec![0.5f32; 64];
    w[3] = 2f32.powi(-40);
    let m = HalfMatrix::upload(&dev, &Linear::from_f32(WeightFormat::Bf16, &w, 8, 8))
        .unwrap()
        .unwrap();
    assert_eq!((m.rounded, m.scale), (1, 2f32.powi(-15)));
    let q8 = Linear::from_f32(WeightFormat::Q8, &[0.5f32; 64], 2, 32);
    let why = HalfMatrix::upload(&dev, &q8).unwrap().err().unwrap();
    assert!(why.contains("not bf16"), "{why}");
}
