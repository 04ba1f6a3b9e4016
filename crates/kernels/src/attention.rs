//! Scaled dot-product attention of one query head over cached keys and values
//! (MODEL_MATH §1.4): softmax in f32, then the weighted sum of values. The cache is one
//! contiguous array ([`HeadCache`]) or fixed-size blocks reached through a block table
//! ([`PagedHeads`], `spindle_model::paged`); both give the same rows in the same order, so
//! the result is bit for bit the same.

use spindle_model::paged::BLOCK_TOKENS;

/// Cached keys or values of each token, by token position and kv head.
pub trait HeadRows: Copy {
    /// The `head_dim` floats of `head` at token `token`.
    fn vector(&self, token: usize, head: usize) -> &[f32];
}

/// Cached keys or values laid out `[tokens, heads, head_dim]`.
#[derive(Clone, Copy)]
pub struct HeadCache<'a> {
    pub data: &'a [f32],
    pub heads: usize,
    pub head_dim: usize,
}

impl HeadRows for HeadCache<'_> {
    #[inline]
    fn vector(&self, token: usize, head: usize) -> &[f32] {
        let start = (token * self.heads + head) * self.head_dim;
        &self.data[start..start + self.head_dim]
    }
}

/// Cached keys or values in blocks of [`BLOCK_TOKENS`] tokens: `blocks[i]` holds tokens
/// `[i·B, (i+1)·B)` laid out `[B, heads, head_dim]` (a block table already resolved to the
/// slices of one layer's keys or values).
#[derive(Clone, Copy)]
pub struct PagedHeads<'a> {
    pub blocks: &'a [&'a [f32]],
    pub heads: usize,
    pub head_dim: usize,
}

impl HeadRows for PagedHeads<'_> {
    #[inline]
    fn vector(&self, token: usize, head: usize) -> &[f32] {
        let block = self.blocks[token / BLOCK_TOKENS];
        let start = ((token % BLOCK_TOKENS) * self.heads + head) * self.head_dim;
        &block[start..start + self.head_dim]
    }
}

/// `out = softmax(q·Kᵀ·scale) · V` over the cached `tokens` of kv head `head`.
/// `scores` is scratch space (resized as needed).
#[allow(clippy::too_many_arguments)]
pub fn attend<R: HeadRows>(
    q: &[f32],
    keys: R,
    values: R,
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

    /// `rows` (`[n, heads, d]`) cut into blocks of `BLOCK_TOKENS` tokens, each block in its
    /// own allocation with garbage after the last token (as a partly filled block has).
    fn into_blocks(rows: &[f32], width: usize, r: &mut rand::rngs::StdRng) -> Vec<Vec<f32>> {
        rows.chunks(BLOCK_TOKENS * width)
            .map(|chunk| {
                let mut block = vec(r, BLOCK_TOKENS * width, 9.0);
                block[..chunk.len()].copy_from_slice(chunk);
                block
            })
            .collect()
    }

    #[test]
    fn paged_attention_is_bit_identical_to_contiguous() {
        let mut r = rng(12);
        let (heads, d) = (2, 8);
        let width = heads * d;
        // One token, part of one block, one full block, across edges, many blocks.
        for n in [
            1,
            5,
            BLOCK_TOKENS,
            BLOCK_TOKENS + 1,
            3 * BLOCK_TOKENS - 1,
            100,
        ] {
            let k = vec(&mut r, n * width, 1.0);
            let v = vec(&mut r, n * width, 1.0);
            let q = vec(&mut r, d, 2.0);
            let (kb, vb) = (
                into_blocks(&k, width, &mut r),
                into_blocks(&v, width, &mut r),
            );
            let kb: Vec<&[f32]> = kb.iter().map(Vec::as_slice).collect();
            let vb: Vec<&[f32]> = vb.iter().map(Vec::as_slice).collect();
            let contiguous = |data| HeadCache {
                data,
                heads,
                head_dim: d,
            };
            let paged = |blocks| PagedHeads {
                blocks,
                heads,
                head_dim: d,
            };
            let mut scores = Vec::new();
            let (mut a, mut b) = (vec![0.0; d], vec![0.0; d]);
            for head in 0..heads {
                // Every prefix and a sparse selection (QSA's case).
                let picks: Vec<usize> = (0..n).filter(|t| t % 3 != 1).collect();
                for tokens in [(0..n).collect::<Vec<_>>(), picks] {
                    let it = tokens.iter().copied();
                    attend(
                        &q,
                        contiguous(&k),
                        contiguous(&v),
                        head,
                        it.clone(),
                        0.3,
                        &mut scores,
                        &mut a,
                    );
                    attend(
                        &q,
                        paged(&kb),
                        paged(&vb),
                        head,
                        it,
                        0.3,
                        &mut scores,
                        &mut b,
                    );
                    assert_eq!(
                        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{n} tokens, head {head}"
                    );
                }
            }
        }
    }
}
