//! Feed-forward blocks: the dense SwiGLU MLP and the routed mixture of experts with a shared
//! expert (MODEL_MATH §1.6).

use rayon::prelude::*;
use spindle_kernels::activation::{sigmoid, swiglu_in_place};
use spindle_kernels::softmax::{softmax_in_place, top_k};
use spindle_model::MoeConfig;

#[cfg(doc)]
use crate::error::EngineError;
use spindle_model::weights::{MlpWeights, MoeWeights};

use crate::linear::LinearExt;

/// `down(silu(gate(x)) ⊙ up(x))` for `x [N, H]`, rows in `groups` (one per sequence of a step).
pub fn mlp(w: &MlpWeights, x: &[f32], groups: &[usize]) -> Vec<f32> {
    let mut gate = w.gate.forward_groups(x, groups);
    let up = w.up.forward_groups(x, groups);
    swiglu_in_place(&mut gate, &up);
    w.down.forward_groups(&gate, groups)
}

/// One token's routing: the selected experts and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// softmax → top-k → optional renormalisation, per token of `router_logits [tokens, E]`.
pub fn route(router_logits: &[f32], cfg: &MoeConfig) -> Vec<Route> {
    router_logits
        .chunks(cfg.num_experts)
        .map(|logits| {
            let mut p = logits.to_vec();
            softmax_in_place(&mut p);
            let experts = top_k(&p, cfg.top_k);
            let mut weights: Vec<f32> = experts.iter().map(|&e| p[e]).collect();
            if cfg.renormalize {
                let sum: f32 = weights.iter().sum();
                weights.iter_mut().for_each(|w| *w /= sum);
            }
            Route { experts, weights }
        })
        .collect()
}

/// The MoE block for `x [N, H]` (rows in `groups`, one per sequence of a step): routed experts
/// (the step's tokens grouped per expert so each expert's weights are read once per call) plus
/// the sigmoid-gated shared expert. An expert's rows keep their sequences' grouping, so each
/// sequence's rows come out as they would alone.
///
/// With streamed experts the reads of the routed experts start as soon as routing is known
/// and overlap the shared expert; when a layer has fewer slots than the call needs experts,
/// they run in waves of at most `slots`. Outputs are added in expert order either way, so the
/// result does not depend on residency, slot count or scheduling.
///
/// The error is the message of a streamed expert that could not be read: it concerns every
/// token of the call (the caller turns it into [`EngineError::ExpertRead`] for each sequence).
pub fn moe(
    w: &MoeWeights,
    cfg: &MoeConfig,
    x: &[f32],
    groups: &[usize],
    hidden: usize,
) -> std::result::Result<Vec<f32>, String> {
    let routes = route(&w.router.forward_groups(x, groups), cfg);
    let users = expert_users(&routes, cfg.num_experts);
    // The sequence of every token, to keep each expert's rows grouped by sequence.
    let sequence_of: Vec<usize> = if groups.len() == 1 {
        Vec::new()
    } else {
        groups
            .iter()
            .enumerate()
            .flat_map(|(s, &n)| std::iter::repeat_n(s, n))
            .collect()
    };
    let ids: Vec<usize> = users.iter().map(|(e, _)| *e).collect();
    let wave = w.streamed.as_ref().map_or(ids.len(), |s| s.slots()).max(1);
    let group_of = |first: usize| &users[first..(first + wave).min(users.len())];

    // Streamed slots of a wave: the reads start as soon as routing is known.
    let begin = |first: usize| {
        let group = group_of(first);
        w.streamed
            .as_ref()
            .map(|s| s.begin(&ids[first..first + group.len()]))
    };
    // One wave of routed experts: wait for its slots, then run the experts in parallel.
    let run_wave = |first: usize, slots: Option<Vec<_>>| -> std::result::Result<_, String> {
        let group = group_of(first);
        let loaded = match (&w.streamed, slots) {
            (Some(s), Some(slots)) => s.wait(&slots)?,
            _ => Vec::new(),
        };
        let expert = |i: usize| match loaded.get(i) {
            Some(l) => &l.weights,
            None => &w.experts[group[i].0],
        };
        Ok((0..group.len())
            .into_par_iter()
            .map(|i| {
                let chosen = &group[i].1;
                let mut xs = Vec::with_capacity(chosen.len() * hidden);
                let mut rows_per_sequence: Vec<usize> = Vec::new();
                let mut last_sequence = None;
                for &(t, _) in chosen {
                    xs.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
                    if groups.len() == 1 {
                        continue;
                    }
                    if last_sequence == Some(sequence_of[t]) {
                        *rows_per_sequence.last_mut().expect("pushed below") += 1;
                    } else {
                        rows_per_sequence.push(1);
                        last_sequence = Some(sequence_of[t]);
                    }
                }
                if groups.len() == 1 {
                    rows_per_sequence.push(chosen.len());
                }
                mlp(expert(i), &xs, &rows_per_sequence)
            })
            .collect::<Vec<Vec<f32>>>())
    };
    // The selected experts' outputs are added in expert order.
    let add = |out: &mut [f32], first: usize, outputs: &[Vec<f32>]| {
        for ((_, chosen), ys) in group_of(first).iter().zip(outputs) {
            for (i, &(t, weight)) in chosen.iter().enumerate() {
                let dst = &mut out[t * hidden..(t + 1) * hidden];
                dst.iter_mut()
                    .zip(&ys[i * hidden..(i + 1) * hidden])
                    .for_each(|(o, &y)| *o += weight * y);
            }
        }
    };

    // The sigmoid-gated shared expert runs beside the first wave (and while its reads
    // complete, when streamed).
    let shared = || {
        let mut out = mlp(&w.shared, x, groups);
        let shared_gate = w.shared_gate.forward_groups(x, groups);
        for (t, row) in out.chunks_mut(hidden).enumerate() {
            let g = sigmoid(shared_gate[t]);
            row.iter_mut().for_each(|v| *v *= g);
        }
        out
    };
    let slots = begin(0);
    let (mut out, outputs) = rayon::join(shared, || run_wave(0, slots));
    add(&mut out, 0, &outputs?);
    let mut first = group_of(0).len();
    while first < users.len() {
        add(&mut out, first, &run_wave(first, begin(first))?);
        first += group_of(first).len();
    }
    Ok(out)
}

/// `(expert, [(token, weight)])` for every expert some token chose, in expert order.
fn expert_users(routes: &[Route], num_experts: usize) -> Vec<(usize, Vec<(usize, f32)>)> {
    let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
    for (t, r) in routes.iter().enumerate() {
        for (&e, &weight) in r.experts.iter().zip(&r.weights) {
            users[e].push((t, weight));
        }
    }
    users
        .into_iter()
        .enumerate()
        .filter(|(_, chosen)| !chosen.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(renormalize: bool) -> MoeConfig {
        MoeConfig {
            num_experts: 4,
            top_k: 2,
            expert_intermediate: 1,
            shared_intermediate: 1,
            renormalize,
        }
    }

    #[test]
    fn routing_softmax_then_top_k_then_renormalise() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let r = route(&logits, &cfg(false));
        assert_eq!(r[0].experts, vec![1, 2]);
        let z: f32 = logits.iter().map(|v| v.exp()).sum();
        assert!((r[0].weights[0] - 2f32.exp() / z).abs() < 1e-6);
        let r = route(&logits, &cfg(true));
        let expect = 2f32.exp() / (2f32.exp() + 1f32.exp());
        assert!((r[0].weights[0] - expect).abs() < 1e-6);
        assert!((r[0].weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
