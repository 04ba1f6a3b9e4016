//! The Qwen3.5/3.6 vision tower on the CPU (shared docs `VISION.md` §3): patch embedding,
//! the learned position table interpolated per image, 27 pre-norm ViT blocks with 2-D rotary
//! attention bidirectional within the image, and the 2x2 patch merger. Each image runs on
//! its own (attention never crosses images); rows stay in the 2x2-block-major order of
//! [`PreparedImage`] throughout, so 4 consecutive rows are one merged token.

use rayon::prelude::*;
use spindle_kernels::activation::{exp_arith, gelu_erf, gelu_tanh_in_place};
use spindle_kernels::linear::matmul;
use spindle_kernels::norm::layer_norm;
use spindle_kernels::rope::apply_partial_rope;
use spindle_model::mrope::ImageFeatures;
use spindle_model::quant::view::{MatRef, Weights};
use spindle_model::weights::vision::{BiasedLinear, LayerNormWeights, VisionBlock};
use spindle_model::{VisionConfig, VisionWeights};
use spindle_vision::{interpolation, patch_coords, rope_tables, PreparedImage};

use crate::error::{EngineError, Result};
use crate::linear::LinearExt;

/// LayerNorm eps of the tower (hard-coded 1e-6 in transformers, §1.1).
const EPS: f32 = 1e-6;

/// One image through the tower with its intermediates (for the fixture tests and
/// `spindle logits`): `[N, D]` after patch + position embedding, `[N, D]` after the last block,
/// and the merged features.
pub struct TowerTrace {
    pub patch_embed: Vec<f32>,
    pub blocks_out: Vec<f32>,
    pub features: ImageFeatures,
}

/// Checks that `image` fits the tower: row width, a grid divisible by the merge size, and as
/// many pixel values as the grid says.
pub fn check_image(config: &VisionConfig, image: &PreparedImage, index: usize) -> Result<()> {
    config
        .fits(image)
        .map_err(|why| EngineError::Image(format!("image {index}: {why}")))
}

/// The tower's output for `image`: its merged features `[tokens, out_hidden]`.
pub fn encode(w: &VisionWeights, config: &VisionConfig, image: &PreparedImage) -> ImageFeatures {
    trace(w, config, image).features
}

/// [`encode`] keeping the intermediates. `image` must have passed [`check_image`].
pub fn trace(w: &VisionWeights, config: &VisionConfig, image: &PreparedImage) -> TowerTrace {
    let (t, gh, gw) = (image.grid.t, image.grid.h, image.grid.w);
    let n = t * gh * gw;
    let d = config.hidden;
    let coords = patch_coords(gh, gw, config.merge, t);

    // §3.1-3.2: patch embedding, plus the interpolated position table.
    let mut h = forward_biased(&w.patch_embed, &image.pixels, n);
    let pe = interpolated_positions(&w.pos_embed, config.pos_side, d, gh, gw, &coords);
    h.iter_mut().zip(&pe).for_each(|(a, b)| *a += b);
    let patch_embed = h.clone();

    // §3.3: the 2-D rotary angles of every row, [r·inv, c·inv].
    let rope = VisionRope::new(config.head_dim(), config.rope_theta, &coords);
    for block in &w.blocks {
        run_block(block, config, &rope, &mut h, n);
    }
    let blocks_out = h.clone();

    // §3.5: LayerNorm over D, 4 consecutive rows grouped, fc1, erf-GELU, fc2.
    let z = layer_norm_rows(&h, &w.merger_norm);
    let m2 = config.merge * config.merge;
    let mut y = forward_biased(&w.merger_fc1, &z, n / m2);
    y.iter_mut().for_each(|v| *v = gelu_erf(*v));
    let rows = forward_biased(&w.merger_fc2, &y, n / m2);
    TowerTrace {
        patch_embed,
        blocks_out,
        features: ImageFeatures::merged(rows, config.out_hidden, image.grid, config.merge),
    }
}

/// §3.2: the S x S table bilinearly interpolated (align_corners=True) to the image's
/// gh x gw patch grid, one row per entry of `coords`: each row the f64 sum of its four
/// corners' rows ([`spindle_vision::interpolation`]) in corner order, rounded to f32.
fn interpolated_positions(
    table: &[f32],
    side: usize,
    d: usize,
    gh: usize,
    gw: usize,
    coords: &[(usize, usize)],
) -> Vec<f32> {
    let (index, weights) = interpolation(side, gh, gw, coords);
    let mut out = vec![0.0f32; coords.len() * d];
    out.par_chunks_mut(d).enumerate().for_each(|(r, row)| {
        let corners = &index[4 * r..4 * r + 4];
        let weights = &weights[4 * r..4 * r + 4];
        for (k, o) in row.iter_mut().enumerate() {
            let v: f64 = corners
                .iter()
                .zip(weights)
                .map(|(&at, &weight)| weight * table[at as usize * d + k] as f64)
                .sum();
            *o = v as f32;
        }
    });
    out
}

/// cos and sin of every row's 2-D rotary angles: `[N, d/2]` each, the first d/4 from the
/// patch row, the next d/4 from its column (θ_v^(−2j/(d/2)), j < d/4). Applied as rotate_half
/// over the whole head, which is [`apply_partial_rope`] with d/2 angles.
struct VisionRope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl VisionRope {
    fn new(head_dim: usize, theta: f64, coords: &[(usize, usize)]) -> Self {
        let (cos, sin) = rope_tables(head_dim, theta, coords);
        VisionRope {
            cos,
            sin,
            half: head_dim / 2,
        }
    }

    fn apply(&self, row: usize, head: &mut [f32]) {
        let at = row * self.half..(row + 1) * self.half;
        apply_partial_rope(head, &self.cos[at.clone()], &self.sin[at]);
    }
}

/// §3.4: `h += proj(attn(LN1(h)))`, `h += fc2(gelu_tanh(fc1(LN2(h))))` over the image's rows.
fn run_block(
    block: &VisionBlock,
    config: &VisionConfig,
    rope: &VisionRope,
    h: &mut [f32],
    n: usize,
) {
    let (d, heads) = (config.hidden, config.heads);
    let hd = config.head_dim();
    let a = layer_norm_rows(h, &block.norm1);
    let qkv = forward_biased(&block.qkv, &a, n);
    // [N, 3, heads, hd] → q, k, v each [N, heads, hd]; q and k rotated.
    let mut q = vec![0.0f32; n * d];
    let mut k = vec![0.0f32; n * d];
    let mut v = vec![0.0f32; n * d];
    q.par_chunks_mut(d)
        .zip(k.par_chunks_mut(d))
        .zip(v.par_chunks_mut(d))
        .enumerate()
        .for_each(|(row, ((qr, kr), vr))| {
            let src = &qkv[row * 3 * d..(row + 1) * 3 * d];
            qr.copy_from_slice(&src[..d]);
            kr.copy_from_slice(&src[d..2 * d]);
            vr.copy_from_slice(&src[2 * d..]);
            for head in 0..heads {
                rope.apply(row, &mut qr[head * hd..(head + 1) * hd]);
                rope.apply(row, &mut kr[head * hd..(head + 1) * hd]);
            }
        });
    let o = attention(&q, &k, &v, n, heads, hd);
    let attn = forward_biased(&block.proj, &o, n);
    h.iter_mut().zip(&attn).for_each(|(x, y)| *x += y);

    let m = layer_norm_rows(h, &block.norm2);
    let mut up = forward_biased(&block.fc1, &m, n);
    up.par_chunks_mut(4096).for_each(gelu_tanh_in_place);
    let down = forward_biased(&block.fc2, &up, n);
    h.iter_mut().zip(&down).for_each(|(x, y)| *x += y);
}

/// Query rows per attention task: a task holds a `[QUERY_BLOCK, n]` score block (8 MB at the
/// 16384 patches of a 4096x4096 image).
const QUERY_BLOCK: usize = 128;

/// Bidirectional attention over the image's `n` rows (`[n, heads·hd]` each, q and k rotated):
/// `softmax(q·kᵀ/√hd)·v` per head, by the f32 GEMMs. Each task takes one head and a block of
/// query rows: `S = Q_b·K_hᵀ` (K_h as a `[n, hd]` matrix), a row softmax in f32, then
/// `O_b = P·V_h` (V_h transposed to `[hd, n]`).
fn attention(q: &[f32], k: &[f32], v: &[f32], n: usize, heads: usize, hd: usize) -> Vec<f32> {
    let d = heads * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let head_rows = |x: &[f32], head: usize| -> Vec<f32> {
        x.chunks(d)
            .flat_map(|row| row[head * hd..(head + 1) * hd].iter().copied())
            .collect()
    };
    let keys: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|h| head_rows(k, h))
        .collect();
    let values_t: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|head| {
            let mut t = vec![0.0f32; hd * n];
            for (r, row) in v.chunks(d).enumerate() {
                for (c, &x) in row[head * hd..(head + 1) * hd].iter().enumerate() {
                    t[c * n + r] = x;
                }
            }
            t
        })
        .collect();
    let blocks = n.div_ceil(QUERY_BLOCK);
    let outputs: Vec<Vec<f32>> = (0..heads * blocks)
        .into_par_iter()
        .map(|task| {
            let (head, block) = (task / blocks, task % blocks);
            let rows = block * QUERY_BLOCK..((block + 1) * QUERY_BLOCK).min(n);
            let b = rows.len();
            let qb: Vec<f32> = q[rows.start * d..rows.end * d]
                .chunks(d)
                .flat_map(|row| row[head * hd..(head + 1) * hd].iter().copied())
                .collect();
            let mut scores = vec![0.0f32; b * n];
            matmul(
                &MatRef::new(Weights::F32(&keys[head]), n, hd),
                &qb,
                b,
                &mut scores,
            );
            for row in scores.chunks_mut(n) {
                softmax_scaled(row, scale);
            }
            let mut out = vec![0.0f32; b * hd];
            matmul(
                &MatRef::new(Weights::F32(&values_t[head]), hd, n),
                &scores,
                b,
                &mut out,
            );
            out
        })
        .collect();
    let mut o = vec![0.0f32; n * d];
    for (task, out) in outputs.iter().enumerate() {
        let (head, block) = (task / blocks, task % blocks);
        for (i, row) in out.chunks(hd).enumerate() {
            let r = block * QUERY_BLOCK + i;
            o[r * d + head * hd..][..hd].copy_from_slice(row);
        }
    }
    o
}

/// `row = softmax(row · scale)` in f32 (as the eager attention), e^z by [`exp_arith`] so the
/// loop vectorizes.
fn softmax_scaled(row: &mut [f32], scale: f32) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s * scale));
    let mut sum = 0.0f32;
    for s in row.iter_mut() {
        *s = exp_arith(*s * scale - max);
        sum += *s;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|s| *s *= inv);
}

fn layer_norm_rows(x: &[f32], w: &LayerNormWeights) -> Vec<f32> {
    let d = w.weight.len();
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, row)| layer_norm(row, &w.weight, &w.bias, EPS, o));
    out
}

/// `x [tokens, in] · Wᵀ + b`.
fn forward_biased(layer: &BiasedLinear, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut y = layer.weight.forward(x, tokens);
    add_bias(&mut y, &layer.bias);
    y
}

fn add_bias(y: &mut [f32], bias: &[f32]) {
    y.par_chunks_mut(bias.len())
        .for_each(|row| row.iter_mut().zip(bias).for_each(|(a, b)| *a += b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_attention_matches_per_row_attention() {
        use spindle_kernels::attention::{attend, HeadCache};
        // 300 rows: two full query blocks and a partial one; scores large enough that the
        // softmax is far from uniform.
        let (n, heads, hd) = (300, 3, 24);
        let d = heads * hd;
        let mut rng = spindle_testkit::Rng(11);
        let (q, k, v) = (
            rng.signed_vec(n * d, 2.0),
            rng.signed_vec(n * d, 2.0),
            rng.signed_vec(n * d, 1.0),
        );
        let ours = attention(&q, &k, &v, n, heads, hd);
        let cache = |data| HeadCache {
            data,
            heads,
            head_dim: hd,
        };
        let (mut scores, mut want) = (Vec::new(), vec![0.0f32; n * d]);
        for (at, out) in want.chunks_mut(hd).enumerate() {
            let (row, head) = (at / heads, at % heads);
            let qh = &q[row * d + head * hd..][..hd];
            let scale = 1.0 / (hd as f32).sqrt();
            attend(
                qh,
                cache(&k),
                cache(&v),
                head,
                0..n,
                scale,
                &mut scores,
                out,
            );
        }
        let err = ours
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-5, "blocked attention differs by {err}");
        // Rows really attend differently (not a uniform average).
        assert!(want[..d] != want[d..2 * d]);
    }

    #[test]
    fn interpolation_hits_the_table_corners_and_midpoints() {
        // A 2x2 table with one channel: values 0, 1, 2, 3; a 3x3 grid samples midpoints.
        let table = [0.0f32, 1.0, 2.0, 3.0];
        let coords: Vec<(usize, usize)> =
            (0..3).flat_map(|r| (0..3).map(move |c| (r, c))).collect();
        let pe = interpolated_positions(&table, 2, 1, 3, 3, &coords);
        assert_eq!(pe, vec![0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 2.5, 3.0]);
    }
}
