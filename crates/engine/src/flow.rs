//! The hybrid decoder flow shared by Qwen3-Next and Qwen3.5/3.6 (MODEL_MATH §2, §3):
//! embedding → per layer `h += Mixer(norm(h)); h += FFN(norm(h))` → final norm → LM head.

use spindle_kernels::norm::{rms_norm_zc, GateActivation};
use spindle_kernels::rope::RopeFreqs;
use spindle_model::ModelConfig;

use crate::session::{LayerState, Session};
use crate::weights::{FfnWeights, MixerWeights, ModelWeights};
use crate::{attention, ffn, gdn};

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every input position: `[tokens, V]`.
    All,
    /// Only the last input position: `[1, V]`.
    Last,
}

/// Norms every `[H]` row of `x` with a zero-centred RMSNorm.
fn norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (xi, oi) in x.chunks(w.len()).zip(out.chunks_mut(w.len())) {
        rms_norm_zc(xi, w, eps, oi);
    }
    out
}

fn add_in_place(h: &mut [f32], y: &[f32]) {
    h.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Runs `ids` (already validated) through the model from the session's state.
pub fn forward(
    config: &ModelConfig,
    weights: &ModelWeights,
    rope: &RopeFreqs,
    session: &mut Session,
    ids: &[u32],
    want: LogitsFor,
) -> Vec<f32> {
    let hidden = config.hidden_size;
    let tokens = ids.len();
    let eps = config.rms_norm_eps as f32;
    let start = session.position;
    let embed = weights.embed.mat();

    let mut h = vec![0.0f32; tokens * hidden];
    for (t, &id) in ids.iter().enumerate() {
        embed.row_to_f32(id as usize, &mut h[t * hidden..(t + 1) * hidden]);
    }

    for (layer, state) in weights.layers.iter().zip(session.layers.iter_mut()) {
        let x = norm_rows(&h, &layer.input_norm, eps);
        let y = match (&layer.mixer, state) {
            (MixerWeights::Attention(w), LayerState::Attention(cache)) => {
                attention::forward(w, &config.attention, rope, eps, cache, &x, tokens, start)
            }
            (MixerWeights::Gdn(w), LayerState::Gdn(s)) => {
                gdn::forward(w, &config.gdn, eps, GateActivation::Silu, s, &x, tokens)
            }
            _ => unreachable!("session layers are built from the same config as the weights"),
        };
        add_in_place(&mut h, &y);

        let x = norm_rows(&h, &layer.post_norm, eps);
        let y = match &layer.ffn {
            FfnWeights::Dense(w) => ffn::mlp(w, &x, tokens),
            FfnWeights::Moe(w) => ffn::moe(w, config.moe.as_ref().expect("validated"), &x, tokens, hidden),
        };
        add_in_place(&mut h, &y);
    }
    session.position += tokens;

    let rows = match want {
        LogitsFor::All => &h[..],
        LogitsFor::Last => &h[(tokens - 1) * hidden..],
    };
    let normed = norm_rows(rows, &weights.final_norm, eps);
    weights.lm_head.forward(&normed, normed.len() / hidden)
}
