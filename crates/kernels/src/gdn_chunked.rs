//! The chunked delta rule (MODEL_MATH §1.5, "Chunked prefill form"), one v-head at a time:
//! equal to running [`crate::gdn::gdn_step`] token by token, but shaped as small matrix
//! products over chunks of [`CHUNK`] tokens.
//!
//! Within a chunk of L tokens, with `c_i = Σ_{s≤i} g_s` and `D_ij = exp(c_i − c_j)` (j ≤ i):
//! ```text
//! A  = strict_lower((β⊙K) Kᵀ ⊙ D)
//! [U | W] = (I + A)⁻¹ [β⊙V | β⊙K⊙exp(c)]        (forward substitution, no inverse)
//! V' = U − W S
//! O  = (Q ⊙ exp(c)) S + (Q Kᵀ ⊙ D) V'            (D including the diagonal)
//! S  ← exp(c_L) S + (K ⊙ exp(c_L − c))ᵀ V'
//! ```
//! Every exponent is ≤ 0, so nothing overflows; a long chunk of strong decay underflows terms
//! that are below f32 resolution anyway. The last chunk may be shorter (no padding needed).

use crate::simd::Isa;

/// Tokens per chunk.
pub const CHUNK: usize = 64;

/// Reusable per-call buffers (one per thread when heads run in parallel).
#[derive(Default)]
pub struct ChunkScratch {
    c: Vec<f32>,
    /// A (strictly lower) and Q Kᵀ ⊙ D (lower), both `[CHUNK, CHUNK]`.
    a: Vec<f32>,
    p: Vec<f32>,
    /// U then V' `[CHUNK, d_v]`; W `[CHUNK, d_k]`.
    u: Vec<f32>,
    w: Vec<f32>,
}

/// Runs `T` tokens of one v-head. `q` (l2-normalised, scaled by d_k^−½) and `k`
/// (l2-normalised) are `[T, d_k]`, `v` is `[T, d_v]`, `g` (log-decay ln α, ≤ 0) and `beta`
/// are `[T]`, `state` is `[d_k, d_v]` f32 updated in place, `out` is `[T, d_v]`.
#[allow(clippy::too_many_arguments)]
pub fn gdn_chunked(
    scratch: &mut ChunkScratch,
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    out: &mut [f32],
) {
    let tokens = g.len();
    assert_eq!(beta.len(), tokens, "beta length");
    assert!(
        tokens > 0 && q.len() == k.len() && k.len() % tokens == 0,
        "q/k are [T, d_k]"
    );
    assert_eq!(v.len() % tokens, 0, "v is [T, d_v]");
    assert_eq!(out.len(), v.len(), "out is [T, d_v]");
    let (d_k, d_v) = (k.len() / tokens, v.len() / tokens);
    assert_eq!(state.len(), d_k * d_v, "state is [d_k, d_v]");
    scratch.c.resize(CHUNK, 0.0);
    scratch.a.resize(CHUNK * CHUNK, 0.0);
    scratch.p.resize(CHUNK * CHUNK, 0.0);
    scratch.u.resize(CHUNK * d_v, 0.0);
    scratch.w.resize(CHUNK * d_k, 0.0);
    for t0 in (0..tokens).step_by(CHUNK) {
        let t1 = (t0 + CHUNK).min(tokens);
        let chunk = Chunk {
            q: &q[t0 * d_k..t1 * d_k],
            k: &k[t0 * d_k..t1 * d_k],
            v: &v[t0 * d_v..t1 * d_v],
            g: &g[t0..t1],
            beta: &beta[t0..t1],
            d_k,
            d_v,
        };
        let o = &mut out[t0 * d_v..t1 * d_v];
        match Isa::active() {
            // SAFETY: Isa::active only returns Avx512 when the CPU has AVX-512F (and AVX2/FMA).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { chunk_avx512(scratch, state, &chunk, o) },
            // SAFETY: Isa::active only returns Avx2 when the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { chunk_avx2(scratch, state, &chunk, o) },
            _ => run_chunk(scratch, state, &chunk, o),
        }
    }
}

/// One chunk's inputs, `L = g.len()` tokens.
struct Chunk<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    d_k: usize,
    d_v: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn chunk_avx512(s: &mut ChunkScratch, state: &mut [f32], c: &Chunk, out: &mut [f32]) {
    run_chunk(s, state, c, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_avx2(s: &mut ChunkScratch, state: &mut [f32], c: &Chunk, out: &mut [f32]) {
    run_chunk(s, state, c, out)
}

/// Σ a·b with 16 independent partial sums, so it vectorizes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, ar) = a.split_at(a.len() / 16 * 16);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(16).zip(bc.chunks_exact(16)) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + ar.iter().zip(br).map(|(x, y)| x * y).sum::<f32>()
}

/// e^x for the (non-positive) log-decays of a chunk: 0 below e^-87, where f32 leaves the
/// normal range (exp's underflow path is slow, and such factors change nothing).
#[inline(always)]
fn decay_exp(x: f32) -> f32 {
    if x < -87.0 {
        0.0
    } else {
        x.exp()
    }
}

/// `y += s·x`.
#[inline(always)]
fn axpy(y: &mut [f32], s: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y += s * x);
}

/// The chunk body (portable; inlined into the `target_feature` wrappers).
#[inline(always)]
fn run_chunk(scratch: &mut ChunkScratch, state: &mut [f32], ch: &Chunk, out: &mut [f32]) {
    let (d_k, d_v, len) = (ch.d_k, ch.d_v, ch.g.len());
    let (kr, qr, vr) = (
        |i: usize| &ch.k[i * d_k..(i + 1) * d_k],
        |i: usize| &ch.q[i * d_k..(i + 1) * d_k],
        |i: usize| &ch.v[i * d_v..(i + 1) * d_v],
    );
    let c = &mut scratch.c[..len];
    let mut acc = 0.0f32;
    for (ci, &gi) in c.iter_mut().zip(ch.g) {
        acc += gi;
        *ci = acc;
    }
    // A (strictly lower) and P = Q Kᵀ ⊙ D (lower, with the diagonal).
    let (a, p) = (&mut scratch.a, &mut scratch.p);
    for i in 0..len {
        for j in 0..=i {
            let d = decay_exp(c[i] - c[j]);
            a[i * CHUNK + j] = if j < i {
                ch.beta[i] * dot(kr(i), kr(j)) * d
            } else {
                0.0
            };
            p[i * CHUNK + j] = dot(qr(i), kr(j)) * d;
        }
    }
    // Forward substitution: row i of [U | W] = rhs_i − Σ_{j<i} A_ij·row j.
    let (u, w) = (&mut scratch.u, &mut scratch.w);
    for i in 0..len {
        let (done_u, rest_u) = u.split_at_mut(i * d_v);
        let ui = &mut rest_u[..d_v];
        ui.iter_mut()
            .zip(vr(i))
            .for_each(|(o, &x)| *o = ch.beta[i] * x);
        let (done_w, rest_w) = w.split_at_mut(i * d_k);
        let wi = &mut rest_w[..d_k];
        let bk = ch.beta[i] * decay_exp(c[i]);
        wi.iter_mut().zip(kr(i)).for_each(|(o, &x)| *o = bk * x);
        for j in 0..i {
            let aij = a[i * CHUNK + j];
            axpy(ui, -aij, &done_u[j * d_v..(j + 1) * d_v]);
            axpy(wi, -aij, &done_w[j * d_k..(j + 1) * d_k]);
        }
    }
    // V' = U − W S (in place in u), and O = (Q⊙exp(c)) S + P V'.
    for i in 0..len {
        let ui = &mut u[i * d_v..(i + 1) * d_v];
        let oi = &mut out[i * d_v..(i + 1) * d_v];
        oi.fill(0.0);
        let (wi, qi, eci) = (&w[i * d_k..(i + 1) * d_k], qr(i), decay_exp(c[i]));
        for r in 0..d_k {
            let srow = &state[r * d_v..(r + 1) * d_v];
            axpy(ui, -wi[r], srow);
            axpy(oi, eci * qi[r], srow);
        }
    }
    for i in 0..len {
        let oi = &mut out[i * d_v..(i + 1) * d_v];
        for j in 0..=i {
            axpy(oi, p[i * CHUNK + j], &u[j * d_v..(j + 1) * d_v]);
        }
    }
    // S ← exp(c_L)·S + Σ_j (k_j·exp(c_L − c_j)) ⊗ v'_j.
    let c_last = c[len - 1];
    let decay = decay_exp(c_last);
    for r in 0..d_k {
        let srow = &mut state[r * d_v..(r + 1) * d_v];
        srow.iter_mut().for_each(|s| *s *= decay);
        for j in 0..len {
            let kj = ch.k[j * d_k + r] * decay_exp(c_last - c[j]);
            axpy(srow, kj, &u[j * d_v..(j + 1) * d_v]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gdn::{gdn_step_ref, l2_normalize};
    use crate::testutil::*;
    use rand::Rng;

    #[test]
    fn chunked_equals_token_by_token() {
        let mut r = rng(33);
        let (d_k, d_v) = (32, 48);
        let mut scratch = ChunkScratch::default();
        for tokens in [1, 5, 64, 65, 200] {
            let mut q = vec(&mut r, tokens * d_k, 1.0);
            let mut k = vec(&mut r, tokens * d_k, 1.0);
            for t in 0..tokens {
                l2_normalize(
                    &mut q[t * d_k..(t + 1) * d_k],
                    1e-6,
                    (d_k as f32).powf(-0.5),
                );
                l2_normalize(&mut k[t * d_k..(t + 1) * d_k], 1e-6, 1.0);
            }
            let v = vec(&mut r, tokens * d_v, 1.0);
            let g: Vec<f32> = (0..tokens)
                .map(|_| r.random_range(-3.0..-0.001f32))
                .collect();
            let beta: Vec<f32> = (0..tokens).map(|_| r.random_range(0.01..0.99f32)).collect();
            let initial = vec(&mut r, d_k * d_v, 0.5);

            let mut reference = initial.clone();
            let mut expect = vec![0.0; tokens * d_v];
            for t in 0..tokens {
                let (qt, kt) = (&q[t * d_k..(t + 1) * d_k], &k[t * d_k..(t + 1) * d_k]);
                let o = &mut expect[t * d_v..(t + 1) * d_v];
                gdn_step_ref(
                    &mut reference,
                    qt,
                    kt,
                    &v[t * d_v..(t + 1) * d_v],
                    g[t].exp(),
                    beta[t],
                    o,
                );
            }
            let mut state = initial.clone();
            let mut out = vec![f32::NAN; tokens * d_v];
            gdn_chunked(&mut scratch, &mut state, &q, &k, &v, &g, &beta, &mut out);
            let (eo, es) = (
                max_abs_diff(&out, &expect),
                max_abs_diff(&state, &reference),
            );
            assert!(
                eo < 2e-5 && es < 2e-5,
                "T={tokens}: out err {eo}, state err {es}"
            );
        }
    }

    #[test]
    fn weak_decay_over_long_runs_still_matches() {
        // g near 0 keeps the whole history alive: the hardest case for error growth.
        let mut r = rng(34);
        let (d_k, d_v, tokens) = (16, 16, 300);
        let mut k = vec(&mut r, tokens * d_k, 1.0);
        let mut q = vec(&mut r, tokens * d_k, 1.0);
        for t in 0..tokens {
            l2_normalize(&mut k[t * d_k..(t + 1) * d_k], 1e-6, 1.0);
            l2_normalize(&mut q[t * d_k..(t + 1) * d_k], 1e-6, 0.25);
        }
        let v = vec(&mut r, tokens * d_v, 1.0);
        let g = vec![-1e-3f32; tokens];
        let beta: Vec<f32> = (0..tokens).map(|_| r.random_range(0.5..0.99f32)).collect();
        let mut reference = vec(&mut r, d_k * d_v, 0.5);
        let mut state = reference.clone();
        let mut expect = vec![0.0; tokens * d_v];
        for t in 0..tokens {
            let o = &mut expect[t * d_v..(t + 1) * d_v];
            let (qt, kt, vt) = (
                &q[t * d_k..(t + 1) * d_k],
                &k[t * d_k..(t + 1) * d_k],
                &v[t * d_v..(t + 1) * d_v],
            );
            gdn_step_ref(&mut reference, qt, kt, vt, g[t].exp(), beta[t], o);
        }
        let mut out = vec![0.0; tokens * d_v];
        gdn_chunked(
            &mut ChunkScratch::default(),
            &mut state,
            &q,
            &k,
            &v,
            &g,
            &beta,
            &mut out,
        );
        assert!(
            max_abs_diff(&out, &expect) < 1e-4,
            "{}",
            max_abs_diff(&out, &expect)
        );
        assert!(max_abs_diff(&state, &reference) < 1e-4);
    }
}
