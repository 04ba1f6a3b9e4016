//! Feed-forward blocks: the dense SwiGLU MLP and the routed mixture of experts with a shared
//! expert (MODEL_MATH §1.6).

use rayon::prelude::*;
use spindle_kernels::activation::{sigmoid, swiglu_in_place};
use spindle_kernels::softmax::{softmax_in_place, top_k};
use spindle_model::MoeConfig;

use crate::error::{EngineError, Result};
use crate::weights::{MlpWeights, MoeWeights};

/// `down(silu(gate(x)) ⊙ up(x))` for `[tokens, H]`.
pub fn mlp(w: &MlpWeights, x: &[f32], tokens: usize) -> Vec<f32> {
    let mut gate = w.gate.forward(x, tokens);
    let up = w.up.forward(x, tokens);
    swiglu_in_place(&mut gate, &up);
    w.down.forward(&gate, tokens)
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

/// The MoE block for `[tokens, H]`: routed experts (tokens grouped per expert so each expert's
/// weights are read once per call) plus the sigmoid-gated shared expert.
///
/// With streamed experts the reads of the routed experts start as soon as routing is known
/// and overlap the shared expert; when a layer has fewer slots than the call needs experts,
/// they run in waves of at most `slots`. Outputs are added in expert order either way, so the
/// result does not depend on residency, slot count or scheduling.
pub fn moe(
    w: &MoeWeights,
    cfg: &MoeConfig,
    x: &[f32],
    tokens: usize,
    hidden: usize,
) -> Result<Vec<f32>> {
    let routes = route(&w.router.forward(x, tokens), cfg);
    let users = expert_users(&routes, cfg.num_experts);
    let ids: Vec<usize> = users.iter().map(|(e, _)| *e).collect();
    let wave = w.streamed.as_ref().map_or(ids.len(), |s| s.slots()).max(1);
    let mut pending = w
        .streamed
        .as_ref()
        .map(|s| s.begin(&ids[..wave.min(ids.len())]));

    // The sigmoid-gated shared expert runs beside the first wave of routed experts (and while
    // their reads complete, when streamed).
    let mut shared = Some(|| {
        let mut out = mlp(&w.shared, x, tokens);
        let shared_gate = w.shared_gate.forward(x, tokens);
        for (t, row) in out.chunks_mut(hidden).enumerate() {
            let g = sigmoid(shared_gate[t]);
            row.iter_mut().for_each(|v| *v *= g);
        }
        out
    });
    let mut out: Option<Vec<f32>> = None;
    let mut first = 0;
    loop {
        let group = &users[first..(first + wave).min(users.len())];
        let mut routed = || {
            let loaded = match (&w.streamed, pending.take()) {
                (Some(s), Some(slots)) => s.wait(&slots)?,
                (Some(s), None) => s.wait(&s.begin(&ids[first..first + group.len()]))?,
                (None, _) => Vec::new(),
            };
            let expert = |i: usize| match loaded.get(i) {
                Some(l) => &l.weights,
                None => &w.experts[group[i].0],
            };
            // The selected experts run in parallel; their outputs are added in expert order.
            Ok::<_, String>(
                (0..group.len())
                    .into_par_iter()
                    .map(|i| {
                        let chosen = &group[i].1;
                        let mut xs = Vec::with_capacity(chosen.len() * hidden);
                        for &(t, _) in chosen {
                            xs.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
                        }
                        mlp(expert(i), &xs, chosen.len())
                    })
                    .collect::<Vec<Vec<f32>>>(),
            )
        };
        let outputs = match shared.take() {
            None => routed(),
            Some(shared) => {
                let (s, r) = rayon::join(shared, routed);
                out = Some(s);
                r
            }
        }
        .map_err(|message| EngineError::ExpertRead { message })?;
        let out = out.as_mut().expect("set with the first wave");
        for ((_, chosen), ys) in group.iter().zip(&outputs) {
            for (i, &(t, weight)) in chosen.iter().enumerate() {
                let dst = &mut out[t * hidden..(t + 1) * hidden];
                dst.iter_mut()
                    .zip(&ys[i * hidden..(i + 1) * hidden])
                    .for_each(|(o, &y)| *o += weight * y);
            }
        }
        first += group.len();
        if first >= users.len() {
            break;
        }
    }
    Ok(out.expect("the first wave always runs"))
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
