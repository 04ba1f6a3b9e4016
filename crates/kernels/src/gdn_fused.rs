//! A fused, allocation-free [`crate::gdn::gdn_step`] (MODEL_MATH §1.5, one token, one v-head).
//!
//! The step is separable by state column j, so it runs over blocks of 32 columns with the
//! temporaries on the stack: one pass reads S for `Sᵀk` and `Sᵀq`, then
//! `e = β(v − α·Sᵀk)`, `o = α·Sᵀq + (k·q)·e` (the read-out of the updated state), and a second
//! pass writes `S ← α·S + k ⊗ e` while the block is still in L1.

use crate::simd::Isa;

const BLOCK: usize = 32;

/// `state` `[d_k, d_v]` f32 updated in place; `q`, `k` `[d_k]` already L2-normalised (q also
/// scaled by d_k^−½); `v`, `out` `[d_v]`; `alpha` = exp(g) the decay, `beta` the write strength.
pub fn gdn_step_fused(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: f32,
    beta: f32,
    out: &mut [f32],
) {
    assert_eq!(q.len(), k.len(), "q and k lengths");
    assert_eq!(out.len(), v.len(), "out and v lengths");
    assert_eq!(state.len(), k.len() * v.len(), "state is [d_k, d_v]");
    match Isa::active() {
        // SAFETY: Isa::active only returns Avx512 when the CPU has AVX-512F (and AVX2/FMA).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { step_avx512(state, q, k, v, alpha, beta, out) },
        // SAFETY: Isa::active only returns Avx2 when the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { step_avx2(state, q, k, v, alpha, beta, out) },
        _ => step(state, q, k, v, alpha, beta, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn step_avx512(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    a: f32,
    b: f32,
    o: &mut [f32],
) {
    step(s, q, k, v, a, b, o)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn step_avx2(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], a: f32, b: f32, o: &mut [f32]) {
    step(s, q, k, v, a, b, o)
}

/// The portable body; inlined into the `target_feature` wrappers so it vectorizes for them.
#[inline(always)]
fn step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: f32,
    beta: f32,
    out: &mut [f32],
) {
    let d_v = v.len();
    let kq: f32 = k.iter().zip(q).map(|(a, b)| a * b).sum();
    for j0 in (0..d_v).step_by(BLOCK) {
        let n = BLOCK.min(d_v - j0);
        let (mut sk, mut sq) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            let row = &state[i * d_v + j0..i * d_v + j0 + n];
            for ((a, c), &s) in sk.iter_mut().zip(sq.iter_mut()).zip(row) {
                *a += s * ki;
                *c += s * qi;
            }
        }
        let mut e = [0.0f32; BLOCK];
        for j in 0..n {
            e[j] = beta * (v[j0 + j] - alpha * sk[j]);
            out[j0 + j] = alpha * sq[j] + kq * e[j];
        }
        for (i, &ki) in k.iter().enumerate() {
            let row = &mut state[i * d_v + j0..i * d_v + j0 + n];
            for (s, &ej) in row.iter_mut().zip(&e) {
                *s = alpha * *s + ki * ej;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gdn::{gdn_step_ref, l2_normalize};
    use crate::testutil::*;

    #[test]
    fn fused_step_matches_reference_over_many_steps() {
        let mut r = rng(21);
        for (d_k, d_v) in [(16, 24), (128, 128), (32, 45)] {
            let mut fast = vec(&mut r, d_k * d_v, 0.5);
            let mut reference = fast.clone();
            for step in 0..30 {
                let mut q = vec(&mut r, d_k, 1.0);
                let mut k = vec(&mut r, d_k, 1.0);
                l2_normalize(&mut q, 1e-6, (d_k as f32).powf(-0.5));
                l2_normalize(&mut k, 1e-6, 1.0);
                let v = vec(&mut r, d_v, 1.0);
                let (alpha, beta) = (0.5 + 0.015 * step as f32, 0.2 + 0.02 * step as f32);
                let (mut o1, mut o2) = (vec![0.0; d_v], vec![0.0; d_v]);
                gdn_step_fused(&mut fast, &q, &k, &v, alpha, beta, &mut o1);
                gdn_step_ref(&mut reference, &q, &k, &v, alpha, beta, &mut o2);
                assert!(max_abs_diff(&o1, &o2) < 1e-5, "{d_k}x{d_v} step {step}");
                assert!(
                    max_abs_diff(&fast, &reference) < 1e-5,
                    "{d_k}x{d_v} step {step}"
                );
            }
        }
    }
}
