//! Gated DeltaNet linear attention (MODEL_MATH §1.5) for a step of sequences: projections over
//! all their rows, then per sequence the causal conv and the delta rule from its own state.

use rayon::prelude::*;
use spindle_kernels::activation::{sigmoid, softplus};
use spindle_kernels::gdn::{causal_conv1d_silu, l2_normalize};
use spindle_kernels::gdn_chunked::{gdn_chunked, ChunkScratch};
use spindle_kernels::gdn_fused::gdn_step_fused;
use spindle_kernels::norm::{rms_norm_gated, GateActivation};
use spindle_model::GdnConfig;

use crate::session::GdnState;
use spindle_model::weights::{GdnProjection, GdnWeights};

use crate::batch::{for_each_seq, split_rows, Span};
use crate::linear::LinearExt;

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

/// The projections of `x [N, H]`, rows in `groups` (one per sequence).
fn project(w: &GdnWeights, g: &GdnConfig, x: &[f32], groups: &[usize]) -> Projected {
    let tokens: usize = groups.iter().sum();
    match &w.projection {
        GdnProjection::Split { qkv, z, b, a } => Projected {
            mixed: qkv.forward_groups(x, groups),
            z: z.forward_groups(x, groups),
            b: b.forward_groups(x, groups),
            a: a.forward_groups(x, groups),
        },
        GdnProjection::Fused { qkvz, ba } => {
            let (nk, nv, dk, dv) = g.dims();
            let rho = nv / nk;
            let qkvz_out = qkvz.forward_groups(x, groups);
            let ba_out = ba.forward_groups(x, groups);
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

impl Projected {
    /// The projections of one sequence's rows.
    fn rows(&self, g: &GdnConfig, span: &Span) -> ProjectedRows<'_> {
        let (_, nv, _, dv) = g.dims();
        let r = &span.rows;
        let channels = g.conv_channels();
        ProjectedRows {
            mixed: &self.mixed[r.start * channels..r.end * channels],
            z: &self.z[r.start * nv * dv..r.end * nv * dv],
            b: &self.b[r.start * nv..r.end * nv],
            a: &self.a[r.start * nv..r.end * nv],
        }
    }
}

/// [`Projected`] restricted to one sequence's rows.
struct ProjectedRows<'p> {
    mixed: &'p [f32],
    z: &'p [f32],
    b: &'p [f32],
    a: &'p [f32],
}

/// Runs a step's tokens through one GDN layer. `x` is the normed input `[N, H]` of every
/// sequence in the step; `seqs` gives each sequence's rows of `x` (consecutive, in order) and
/// its state, which is updated. The projections run once over all rows; the causal conv and
/// the delta rule run per sequence on its own state (in parallel across sequences).
pub fn forward(
    w: &GdnWeights,
    g: &GdnConfig,
    eps: f32,
    act: GateActivation,
    x: &[f32],
    seqs: Vec<(Span, &mut GdnState)>,
) -> Vec<f32> {
    let (_, nv, _, dv) = g.dims();
    let spans: Vec<Span> = seqs.iter().map(|(span, _)| span.clone()).collect();
    let groups: Vec<usize> = spans.iter().map(Span::tokens).collect();
    let tokens: usize = groups.iter().sum();
    let p = project(w, g, x, &groups);
    let mut o = vec![0.0f32; tokens * nv * dv];
    let parts: Vec<_> = split_rows(&mut o, nv * dv, &spans)
        .into_iter()
        .zip(seqs)
        .collect();
    for_each_seq(parts, |(o, (span, state))| {
        core(w, g, eps, act, state, &p.rows(g, &span), span.tokens(), o)
    });
    w.out_proj.forward_groups(&o, &groups)
}

/// One sequence's GDN core (MODEL_MATH §1.5) over its `tokens` projected rows: causal conv,
/// then the delta rule from `state` (one token: the recurrent step; more: the chunked form),
/// then the gated norm, into `o [tokens, n_v·d_v]`.
#[allow(clippy::too_many_arguments)]
fn core(
    w: &GdnWeights,
    g: &GdnConfig,
    eps: f32,
    act: GateActivation,
    state: &mut GdnState,
    p: &ProjectedRows,
    tokens: usize,
    o: &mut [f32],
) {
    let (nk, nv, dk, dv) = g.dims();
    let rho = nv / nk;
    let channels = g.conv_channels();
    let mut u = vec![0.0f32; tokens * channels];
    causal_conv1d_silu(
        &mut state.conv,
        p.mixed,
        &w.conv,
        channels,
        g.conv_kernel,
        &mut u,
    );

    // Per token: l2-normalised q̂ (scaled by d_k^−½) and k̂ per key head, β and ln α per v-head.
    let q_scale = 1.0 / (dk as f32).sqrt();
    let decay_rate: Vec<f32> = w.a_log.iter().map(|a| -a.exp()).collect();
    let mut q = vec![0.0f32; tokens * nk * dk];
    let mut k = vec![0.0f32; tokens * nk * dk];
    let mut beta = vec![0.0f32; tokens * nv];
    let mut log_alpha = vec![0.0f32; tokens * nv];
    for t in 0..tokens {
        let ut = &u[t * channels..][..channels];
        let (qt, kt) = (
            &mut q[t * nk * dk..][..nk * dk],
            &mut k[t * nk * dk..][..nk * dk],
        );
        qt.copy_from_slice(&ut[..nk * dk]);
        kt.copy_from_slice(&ut[nk * dk..2 * nk * dk]);
        for (qh, kh) in qt.chunks_mut(dk).zip(kt.chunks_mut(dk)) {
            l2_normalize(qh, 1e-6, q_scale);
            l2_normalize(kh, 1e-6, 1.0);
        }
        for h in 0..nv {
            beta[t * nv + h] = sigmoid(p.b[t * nv + h]);
            log_alpha[t * nv + h] = decay_rate[h] * softplus(p.a[t * nv + h] + w.dt_bias[h]);
        }
    }

    if tokens == 1 {
        for h in 0..nv {
            let kh = h / rho;
            let v = &u[2 * nk * dk + h * dv..][..dv];
            let s = &mut state.recurrent[h * dk * dv..][..dk * dv];
            let oh = &mut o[h * dv..][..dv];
            gdn_step_fused(
                s,
                &q[kh * dk..][..dk],
                &k[kh * dk..][..dk],
                v,
                log_alpha[h].exp(),
                beta[h],
                oh,
            );
        }
    } else {
        // Prefill: the chunked delta rule per v-head, heads in parallel.
        let per_head: Vec<Vec<f32>> = state
            .recurrent
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, s)| {
                let kh = h / rho;
                let gather = |src: &[f32],
                              width: usize,
                              heads: usize,
                              head: usize,
                              offset: usize|
                 -> Vec<f32> {
                    (0..tokens)
                        .flat_map(|t| {
                            src[t * heads * width + offset + head * width..][..width].to_vec()
                        })
                        .collect()
                };
                let qh = gather(&q, dk, nk, kh, 0);
                let kh_ = gather(&k, dk, nk, kh, 0);
                let vh: Vec<f32> = (0..tokens)
                    .flat_map(|t| u[t * channels + 2 * nk * dk + h * dv..][..dv].to_vec())
                    .collect();
                let gh: Vec<f32> = (0..tokens).map(|t| log_alpha[t * nv + h]).collect();
                let bh: Vec<f32> = (0..tokens).map(|t| beta[t * nv + h]).collect();
                let mut out = vec![0.0f32; tokens * dv];
                gdn_chunked(
                    &mut ChunkScratch::default(),
                    s,
                    &qh,
                    &kh_,
                    &vh,
                    &gh,
                    &bh,
                    &mut out,
                );
                out
            })
            .collect();
        for (h, out) in per_head.iter().enumerate() {
            for t in 0..tokens {
                o[(t * nv + h) * dv..][..dv].copy_from_slice(&out[t * dv..][..dv]);
            }
        }
    }
    for t in 0..tokens {
        for h in 0..nv {
            let oh = &mut o[(t * nv + h) * dv..][..dv];
            rms_norm_gated(oh, &p.z[(t * nv + h) * dv..][..dv], &w.norm, eps, act);
        }
    }
}
