//! Partial NeoX (rotate-half) rotary embedding (MODEL_MATH §1.3).

/// Inverse frequencies θ^(−2i/r) for i < r/2.
#[derive(Clone, Debug)]
pub struct RopeFreqs {
    inv_freq: Vec<f64>,
}

impl RopeFreqs {
    pub fn new(theta: f64, rotary_dim: usize) -> Self {
        let half = rotary_dim / 2;
        let inv_freq = (0..half)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / rotary_dim as f64))
            .collect();
        RopeFreqs { inv_freq }
    }

    pub fn rotary_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// cos and sin of pos·inv_freq, each of length r/2.
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|&f| {
                let a = pos as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip()
    }
}

impl RopeFreqs {
    /// cos and sin for a 3-D (T, H, W) position with the interleaved mRoPE slot map
    /// (shared docs `VISION.md` §4.3): slot j takes the H row when j % 3 == 1 and
    /// j < 3·section[1], the W row when j % 3 == 2 and j < 3·section[2], else T. With equal
    /// rows this is [`RopeFreqs::cos_sin`] at that position.
    pub fn cos_sin_mrope(&self, pos: [usize; 3], section: &[usize]) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .enumerate()
            .map(|(j, &f)| {
                let row = spindle_model::mrope::mrope_row(j, section);
                let a = pos[row] as f64 * f;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip()
    }
}

/// Rotates the first `2·cos.len()` dims of one head vector; the rest pass through.
/// `x_r' = x_r·cos + rotate_half(x_r)·sin`, rotate_half(u) = [−u₂, u₁].
pub fn apply_partial_rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_leaves_tail() {
        let freqs = RopeFreqs::new(10000.0, 4);
        let (c, s) = freqs.cos_sin(3);
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        apply_partial_rope(&mut x, &c, &s);
        let norm: f32 = x[..4].iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-4);
        assert_eq!(&x[4..], &[5.0, 6.0]);
        // First pair rotates by angle 3 (inv_freq 1): (1, 3) → (cos3 − 3 sin3, 3 cos3 + sin3).
        assert!((x[0] - (3f32.cos() - 3.0 * 3f32.sin())).abs() < 1e-5);
        assert!((x[2] - (3.0 * 3f32.cos() + 3f32.sin())).abs() < 1e-5);
    }

    #[test]
    fn mrope_with_equal_rows_is_plain_rope() {
        let freqs = RopeFreqs::new(1e7, 64);
        let section = [11, 11, 10];
        assert_eq!(freqs.cos_sin_mrope([17; 3], &section), freqs.cos_sin(17));
        let (c, _) = freqs.cos_sin_mrope([3, 5, 7], &section);
        let at = |p: usize, j: usize| freqs.cos_sin(p).0[j];
        assert_eq!(
            (c[0], c[1], c[2], c[31]),
            (at(3, 0), at(5, 1), at(7, 2), at(5, 31))
        );
    }

    #[test]
    fn position_zero_is_identity() {
        let freqs = RopeFreqs::new(1e7, 8);
        let (c, s) = freqs.cos_sin(0);
        let mut x = [0.3f32, -1.0, 2.0, 0.1, 9.0, 8.0, 7.0, 6.0];
        let before = x;
        apply_partial_rope(&mut x, &c, &s);
        assert_eq!(x, before);
    }
}
