//! Scaled dot-product attention of one query head over cached keys and values
//! (MODEL_MATH §1.4): softmax in f32, then the weighted sum of values.

/// Cached keys or values laid out `[tokens, heads, head_dim]`.
#[derive(Clone, Copy)]
pub struct HeadCache<'a> {
    pub data: &'a [f32],
    pub heads: usize,
    pub head_dim: usize,
}

impl HeadCache<'_> {
    #[inline]
    fn vector(&self, token: usize, head: usize) -> &[f32] {
        let start = (token * self.heads + head) * self.head_dim;
        &self.data[start..start + self.head_dim]
    }
}

/// `out = softmax(q·Kᵀ·scale) · V` over the cached `tokens` of kv head `head`.
/// `scores` is scratch space (resized as needed).
pub fn attend(
    q: &[f32],
    keys: HeadCache,
    values: HeadCache,
    head: usize,
    tokens: impl Iterator<Item = usize> + Clone,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for t in tokens.clone() {
        let k = keys.vector(t, head);
        let s = crate::linear::dot(q, k) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        // Below e^-80 (1.8e-35) a weight is lost next to the largest (1.0) in f32 anyway;
        // exp's underflow path is slow, so such weights are zero outright.
        let z = *s - max;
        *s = if z < -80.0 { 0.0 } else { z.exp() };
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (t, &p) in tokens.zip(scores.iter()) {
        if p != 0.0 {
            crate::linear::axpy(out, p * inv, values.vector(t, head));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    /// The same attention written in f64 with an explicit softmax.
    fn attend_ref(q: &[f32], k: &[f32], v: &[f32], d: usize, n: usize, scale: f32) -> Vec<f32> {
        let s: Vec<f64> = (0..n)
            .map(|t| {
                (0..d)
                    .map(|i| q[i] as f64 * k[t * d + i] as f64)
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..d)
            .map(|i| (0..n).map(|t| e[t] / z * v[t * d + i] as f64).sum::<f64>() as f32)
            .collect()
    }

    #[test]
    fn attend_matches_reference_on_random_inputs() {
        let mut r = rng(11);
        let (heads, d, n) = (3, 16, 9);
        let k = vec(&mut r, n * heads * d, 1.0);
        let v = vec(&mut r, n * heads * d, 1.0);
        let q = vec(&mut r, d, 2.0);
        let keys = HeadCache {
            data: &k,
            heads,
            head_dim: d,
        };
        let values = HeadCache {
            data: &v,
            heads,
            head_dim: d,
        };
        let mut scores = Vec::new();
        let mut out = vec![0.0; d];
        for head in 0..heads {
            attend(&q, keys, values, head, 0..n, 0.25, &mut scores, &mut out);
            let pick = |x: &[f32]| -> Vec<f32> {
                (0..n)
                    .flat_map(|t| x[(t * heads + head) * d..][..d].to_vec())
                    .collect()
            };
            let expect = attend_ref(&q, &pick(&k), &pick(&v), d, n, 0.25);
            assert!(max_abs_diff(&out, &expect) < 1e-5);
        }
    }
}
