//! Gated DeltaNet linear attention (MODEL_MATH §1.5), token by token from the session state.

use spindle_kernels::activation::{sigmoid, softplus};
use spindle_kernels::gdn::{causal_conv1d_silu, gdn_step, l2_normalize};
use spindle_kernels::norm::{rms_norm_gated, GateActivation};
use spindle_model::GdnConfig;

use crate::session::GdnState;
use crate::weights::{GdnProjection, GdnWeights};

/// Projected inputs of a GDN layer for `tokens` tokens, in the split layout.
struct Projected {
    /// `[T, C]` in channel order `[q | k | v]`.
    mixed: Vec<f32>,
    /// `[T, n_v·d_v]` output gate.
    z: Vec<f32>,
    /// `[T, n_v]`.
    b: Vec<f32>,
    /// `[T, n_v]`.
    a: Vec<f32>,
}

fn project(w: &GdnWeights, g: &GdnConfig, x: &[f32], tokens: usize) -> Projected {
    match &w.projection {
        GdnProjection::Split { qkv, z, b, a } => Projected {
            mixed: qkv.forward(x, tokens),
            z: z.forward(x, tokens),
            b: b.forward(x, tokens),
            a: a.forward(x, tokens),
        },
        GdnProjection::Fused { qkvz, ba } => {
            let (nk, nv, dk, dv) = (
                g.num_key_heads,
                g.num_value_heads,
                g.key_head_dim,
                g.value_head_dim,
            );
            let rho = nv / nk;
            let qkvz_out = qkvz.forward(x, tokens);
            let ba_out = ba.forward(x, tokens);
            let channels = g.conv_channels();
            let mut p = Projected {
                mixed: vec![0.0; tokens * channels],
                z: vec![0.0; tokens * nv * dv],
                b: vec![0.0; tokens * nv],
                a: vec![0.0; tokens * nv],
            };
            // Per key group: [q (d_k) | k (d_k) | v (ρ·d_v) | z (ρ·d_v)] and [b (ρ) | a (ρ)].
            let group_width = 2 * dk + 2 * rho * dv;
            for t in 0..tokens {
                let row = &qkvz_out[t * nk * group_width..][..nk * group_width];
                let mixed = &mut p.mixed[t * channels..][..channels];
                for kg in 0..nk {
                    let src = &row[kg * group_width..][..group_width];
                    mixed[kg * dk..][..dk].copy_from_slice(&src[..dk]);
                    mixed[nk * dk + kg * dk..][..dk].copy_from_slice(&src[dk..2 * dk]);
                    mixed[2 * nk * dk + kg * rho * dv..][..rho * dv]
                        .copy_from_slice(&src[2 * dk..2 * dk + rho * dv]);
                    p.z[t * nv * dv + kg * rho * dv..][..rho * dv]
                        .copy_from_slice(&src[2 * dk + rho * dv..]);
                    let ba_row = &ba_out[(t * nk + kg) * 2 * rho..][..2 * rho];
                    p.b[t * nv + kg * rho..][..rho].copy_from_slice(&ba_row[..rho]);
                    p.a[t * nv + kg * rho..][..rho].copy_from_slice(&ba_row[rho..]);
                }
            }
            p
        }
    }
}

/// Runs `tokens` tokens through one GDN layer, updating `state`. `x` is `[tokens, H]`.
pub fn forward(
    w: &GdnWeights,
    g: &GdnConfig,
    eps: f32,
    act: GateActivation,
    state: &mut GdnState,
    x: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let (nk, nv, dk, dv) = (
        g.num_key_heads,
        g.num_value_heads,
        g.key_head_dim,
        g.value_head_dim,
    );
    let rho = nv / nk;
    let channels = g.conv_channels();
    let p = project(w, g, x, tokens);

    let mut u = vec![0.0f32; tokens * channels];
    causal_conv1d_silu(
        &mut state.conv,
        &p.mixed,
        &w.conv,
        channels,
        g.conv_kernel,
        &mut u,
    );

    let q_scale = 1.0 / (dk as f32).sqrt();
    let decay_rate: Vec<f32> = w.a_log.iter().map(|a| -a.exp()).collect();
    let mut o = vec![0.0f32; tokens * nv * dv];
    let mut q = vec![0.0f32; nk * dk];
    let mut k = vec![0.0f32; nk * dk];
    for t in 0..tokens {
        let ut = &u[t * channels..][..channels];
        q.copy_from_slice(&ut[..nk * dk]);
        k.copy_from_slice(&ut[nk * dk..2 * nk * dk]);
        for (qh, kh) in q.chunks_mut(dk).zip(k.chunks_mut(dk)) {
            l2_normalize(qh, 1e-6, q_scale);
            l2_normalize(kh, 1e-6, 1.0);
        }
        for h in 0..nv {
            let kh = h / rho;
            let beta = sigmoid(p.b[t * nv + h]);
            let alpha = (decay_rate[h] * softplus(p.a[t * nv + h] + w.dt_bias[h])).exp();
            let v = &ut[2 * nk * dk + h * dv..][..dv];
            let oh = &mut o[(t * nv + h) * dv..][..dv];
            let s = &mut state.recurrent[h * dk * dv..][..dk * dv];
            gdn_step(
                s,
                &q[kh * dk..][..dk],
                &k[kh * dk..][..dk],
                v,
                alpha,
                beta,
                oh,
            );
            rms_norm_gated(oh, &p.z[(t * nv + h) * dv..][..dv], &w.norm, eps, act);
        }
    }
    w.out_proj.forward(&o, tokens)
}
