//! Gated DeltaNet pieces (MODEL_MATH §1.5): the causal depthwise conv with its state, the
//! L2 normalisation and the token-serial delta-rule recurrence.

use crate::activation::silu;

/// Causal depthwise conv + SiLU over `tokens` new inputs.
///
/// `x` is `[tokens, channels]` raw (pre-conv) inputs, `w` is `[channels, kernel]`
/// (w[c, kernel−1] multiplies the current token), `state` holds the previous `kernel − 1`
/// raw inputs `[kernel − 1, channels]` (zeros at the start of a sequence) and is updated to
/// the last `kernel − 1` inputs. `out` is `[tokens, channels]`.
pub fn causal_conv1d_silu(
    state: &mut [f32],
    x: &[f32],
    w: &[f32],
    channels: usize,
    kernel: usize,
    out: &mut [f32],
) {
    let tokens = x.len() / channels;
    let past = kernel - 1;
    // Window rows: the `past` cached rows followed by the new rows.
    let mut window = Vec::with_capacity((past + tokens) * channels);
    window.extend_from_slice(state);
    window.extend_from_slice(x);
    for t in 0..tokens {
        for c in 0..channels {
            let mut acc = 0.0f32;
            for j in 0..kernel {
                acc += w[c * kernel + j] * window[(t + j) * channels + c];
            }
            out[t * channels + c] = silu(acc);
        }
    }
    state.copy_from_slice(&window[tokens * channels..]);
}

/// `x ← x · rsqrt(Σx² + eps) · scale` (FLA's l2norm with the eps inside the sqrt).
pub fn l2_normalize(x: &mut [f32], eps: f32, scale: f32) {
    let sum_sq: f32 = x.iter().map(|v| v * v).sum();
    let s = scale / (sum_sq + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

/// One delta-rule step for one v-head, state `S` `[d_k, d_v]` in f32:
/// `S ← α·S;  e = β·(v − Sᵀk);  S ← S + k ⊗ e;  o = Sᵀq` (read-out after the update).
/// `q` and `k` are already L2-normalised (q also scaled by d_k^−½).
pub fn gdn_step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: f32,
    beta: f32,
    out: &mut [f32],
) {
    let d_v = v.len();
    // e = β(v − Sᵀk) computed on the decayed state: Sᵀk after decay = α·(Sᵀk).
    let mut sk = vec![0.0f32; d_v];
    for (i, &ki) in k.iter().enumerate() {
        let row = &state[i * d_v..(i + 1) * d_v];
        sk.iter_mut().zip(row).for_each(|(a, &s)| *a += s * ki);
    }
    let e: Vec<f32> = v
        .iter()
        .zip(&sk)
        .map(|(&vj, &sj)| beta * (vj - alpha * sj))
        .collect();
    out.fill(0.0);
    for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
        let row = &mut state[i * d_v..(i + 1) * d_v];
        for ((s, &ej), o) in row.iter_mut().zip(&e).zip(out.iter_mut()) {
            *s = alpha * *s + ki * ej;
            *o += *s * qi;
        }
    }
}

/// Scalar reference of [`gdn_step`], written exactly as the four lines of the math.
pub fn gdn_step_ref(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: f32,
    beta: f32,
    out: &mut [f32],
) {
    let (d_k, d_v) = (k.len(), v.len());
    for s in state.iter_mut() {
        *s *= alpha;
    }
    let mut e = vec![0.0f64; d_v];
    for j in 0..d_v {
        let sk: f64 = (0..d_k)
            .map(|i| state[i * d_v + j] as f64 * k[i] as f64)
            .sum();
        e[j] = beta as f64 * (v[j] as f64 - sk);
    }
    for i in 0..d_k {
        for j in 0..d_v {
            state[i * d_v + j] += (k[i] as f64 * e[j]) as f32;
        }
    }
    for j in 0..d_v {
        out[j] = (0..d_k)
            .map(|i| state[i * d_v + j] as f64 * q[i] as f64)
            .sum::<f64>() as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn gdn_step_matches_reference_over_many_steps() {
        let mut r = rng(5);
        let (d_k, d_v) = (16, 24);
        let mut fast = vec(&mut r, d_k * d_v, 0.5);
        let mut reference = fast.clone();
        for step in 0..20 {
            let mut q = vec(&mut r, d_k, 1.0);
            let mut k = vec(&mut r, d_k, 1.0);
            l2_normalize(&mut q, 1e-6, 0.25);
            l2_normalize(&mut k, 1e-6, 1.0);
            let v = vec(&mut r, d_v, 1.0);
            let (alpha, beta) = (0.5 + 0.02 * step as f32, 0.3 + 0.01 * step as f32);
            let mut o1 = vec![0.0; d_v];
            let mut o2 = vec![0.0; d_v];
            gdn_step(&mut fast, &q, &k, &v, alpha, beta, &mut o1);
            gdn_step_ref(&mut reference, &q, &k, &v, alpha, beta, &mut o2);
            assert!(max_abs_diff(&o1, &o2) < 1e-5, "step {step}");
            assert!(max_abs_diff(&fast, &reference) < 1e-5, "step {step}");
        }
    }

    #[test]
    fn conv_in_chunks_equals_conv_at_once() {
        let mut r = rng(9);
        let (channels, kernel, tokens) = (6, 4, 7);
        let w = vec(&mut r, channels * kernel, 1.0);
        let x = vec(&mut r, tokens * channels, 1.0);
        let mut state_all = vec![0.0; (kernel - 1) * channels];
        let mut out_all = vec![0.0; tokens * channels];
        causal_conv1d_silu(&mut state_all, &x, &w, channels, kernel, &mut out_all);
        let mut state = vec![0.0; (kernel - 1) * channels];
        let mut out = vec![0.0; tokens * channels];
        for (t, xt) in x.chunks(channels).enumerate() {
            causal_conv1d_silu(
                &mut state,
                xt,
                &w,
                channels,
                kernel,
                &mut out[t * channels..(t + 1) * channels],
            );
        }
        assert_eq!(out, out_all);
        assert_eq!(state, state_all);
        // Token 0 sees only itself: silu(w[c, K−1]·x[0, c]).
        for c in 0..channels {
            let expect = silu(w[c * kernel + kernel - 1] * x[c]);
            assert!((out_all[c] - expect).abs() < 1e-6);
        }
    }
}
