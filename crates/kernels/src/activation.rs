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
