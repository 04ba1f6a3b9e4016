//! Scalar activations.

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// softplus(x) = ln(1 + eˣ), with PyTorch's threshold of 20 for large x.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The tanh approximation of GELU (`gelu_pytorch_tanh`, the vision blocks' MLP):
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// [`gelu_tanh`] over a slice, written as x·σ(2u) = x / (1 + e^(−2u)) with [`exp_arith`], so
/// the loop vectorizes (no libm call): within 2e-6 relative of the formula in f64.
pub fn gelu_tanh_in_place(xs: &mut [f32]) {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769_1;
    for x in xs {
        let u = TWO_SQRT_2_OVER_PI * (*x + 0.044715 * *x * *x * *x);
        *x /= 1.0 + exp_arith(-u);
    }
}

/// eˣ in plain arithmetic (so that loops over it vectorize): x = n·ln2 + r with |r| ≤ ln2/2
/// (n rounded by the 1.5·2²³ trick), a degree-6 Taylor polynomial for eʳ, and 2ⁿ from the
/// exponent bits. x is clamped to [−87, 88] (the normal f32 range): relative error < 3e-7.
#[inline]
pub fn exp_arith(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Exact GELU (`nn.GELU()`, the vision merger): 0.5·x·(1 + erf(x/√2)).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `gate[i] = silu(gate[i]) * up[i]`: the SwiGLU of the MLPs and experts.
pub fn swiglu_in_place(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_arith_and_the_sliced_gelu_match_f64() {
        let mut worst = (0.0f64, 0.0f64);
        let xs: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 / 1000.0).collect();
        for &x in &xs {
            let want = (x as f64).exp();
            worst.0 = worst.0.max((exp_arith(x) as f64 - want).abs() / want);
        }
        let mut gelu = xs.clone();
        gelu_tanh_in_place(&mut gelu);
        for (&x, &g) in xs.iter().zip(&gelu) {
            let x = x as f64;
            let want = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            worst.1 = worst.1.max((g as f64 - want).abs() / want.abs().max(1e-3));
        }
        assert!(worst.0 < 3e-7, "exp relative error {}", worst.0);
        assert!(worst.1 < 2e-6, "gelu relative error {}", worst.1);
        // Far out: no overflow, no NaN.
        let mut far = vec![-1e4f32, -100.0, 100.0, 1e4];
        gelu_tanh_in_place(&mut far);
        assert!(far[0].abs() < 1e-30 && far[1].abs() < 1e-30, "{far:?}");
        assert_eq!(far[2..], [100.0, 1e4]);
    }

    #[test]
    fn gelus_match_their_formulas_in_f64() {
        for i in -60..=60 {
            let x = i as f64 / 10.0;
            let tanh = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
            let erf = 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            assert!(
                (gelu_tanh(x as f32) as f64 - tanh).abs() < 1e-5,
                "tanh gelu at {x}"
            );
            assert!(
                (gelu_erf(x as f32) as f64 - erf).abs() < 1e-5,
                "erf gelu at {x}"
            );
        }
        // The two differ visibly, so mixing them up shows.
        assert!((gelu_tanh(-3.0) - gelu_erf(-3.0)).abs() > 3e-4);
    }
}
