//! The checkpoint's tensors gathered per layer, with every shape checked against the config:
//! the host-side weight tree every backend runs from (the CPU engine reads it in place, the
//! CUDA backend uploads it). Matrices stay in the memory map; only small vectors (norms,
//! A_log, conv taps) are copied.

mod attention;
mod blocks;
pub mod experts;
mod gdn;
mod linear;
mod load;
mod load_qwen4;
mod mlp;
mod moe;
pub mod packed;
mod qwen4;
mod source;
pub mod vision;

pub use attention::{AttentionWeights, IndexerWeights};
pub use blocks::BlockMatrix;
pub use gdn::{GdnProjection, GdnWeights};
pub use linear::Linear;
pub use load::{load, load_from};
pub use mlp::MlpWeights;
pub use moe::MoeWeights;
pub use qwen4::{HyperWeights, NgramTable, PleWeights};
pub use source::Source;
pub use vision::{load_vision, VisionWeights};

use crate::quant::WeightFormat;

/// A layer's token mixer.
pub enum MixerWeights {
    Attention(AttentionWeights),
    Gdn(GdnWeights),
}

/// A layer's FFN.
pub enum FfnWeights {
    Dense(MlpWeights),
    Moe(MoeWeights),
}

/// How a sublayer reads from and writes to the residual.
pub enum Residual {
    /// `h += f(ZC-RMS(h))` with the layer's input and post-attention norms.
    Norms { input: Vec<f32>, post: Vec<f32> },
    /// qwen4_exp hyper-connections around the mixer and the FFN.
    Hyper {
        attn: HyperWeights,
        mlp: HyperWeights,
    },
}

/// One decoder layer.
pub struct LayerWeights {
    pub residual: Residual,
    /// qwen4_exp: PLE added to the streams before this layer.
    pub ple: Option<PleWeights>,
    pub mixer: MixerWeights,
    pub ffn: FfnWeights,
}

/// What turns the last residual into the LM head's input.
pub enum HeadInput {
    /// The final zero-centred RMSNorm (`model.norm`).
    Norm(Vec<f32>),
    /// qwen4_exp: the `hyper_connection_mixer` (no separate final norm).
    HyperMixer(HyperWeights),
}

/// Every tensor the forward pass reads: the host-side weight tree both backends start from.
pub struct ModelWeights {
    pub embed: Linear,
    pub layers: Vec<LayerWeights>,
    pub head_input: HeadInput,
    pub lm_head: Linear,
}

impl ModelWeights {
    /// Bytes of weights one decode step reads on average: every dense tensor, one embedding
    /// row, the shared experts, and top-k of E routed experts per MoE layer (plus the PLE
    /// table rows). This is the numerator of the decode roofline.
    pub fn bytes_per_token(&self, top_k: usize) -> usize {
        let linear = |l: &Linear| l.size_bytes();
        let vec = |v: &Vec<f32>| v.len() * 4;
        let hyper = |h: &HyperWeights| {
            vec(&h.norm)
                + linear(&h.mix_down)
                + linear(&h.mix_up)
                + h.inject.as_ref().map_or(0, linear)
        };
        let mut total = linear(&self.embed) / self.embed.rows() + linear(&self.lm_head);
        total += match &self.head_input {
            HeadInput::Norm(w) => vec(w),
            HeadInput::HyperMixer(h) => hyper(h),
        };
        for layer in &self.layers {
            total += match &layer.residual {
                Residual::Norms { input, post } => vec(input) + vec(post),
                Residual::Hyper { attn, mlp } => hyper(attn) + hyper(mlp),
            };
            if let Some(ple) = &layer.ple {
                let heads = ple.hash.vocab_sizes.len();
                let row = linear(&ple.table.shards[0]) / ple.table.shards[0].rows();
                total +=
                    heads * row + linear(&ple.key_proj) + linear(&ple.value_proj) + vec(&ple.conv);
            }
            total += match &layer.mixer {
                MixerWeights::Attention(a) => {
                    linear(&a.q_proj)
                        + linear(&a.k_proj)
                        + linear(&a.v_proj)
                        + linear(&a.o_proj)
                        + a.indexer.as_ref().map_or(0, |i| linear(&i.qk_proj))
                }
                MixerWeights::Gdn(g) => {
                    let proj = match &g.projection {
                        GdnProjection::Fused { qkvz, ba } => linear(qkvz) + linear(ba),
                        GdnProjection::Split { qkv, z, b, a } => {
                            linear(qkv) + linear(z) + linear(b) + linear(a)
                        }
                    };
                    proj + vec(&g.conv) + linear(&g.out_proj)
                }
            };
            total += match &layer.ffn {
                FfnWeights::Dense(m) => m.size_bytes(),
                FfnWeights::Moe(m) => {
                    let routed = match &m.streamed {
                        Some(s) => s.bytes_per_expert() * top_k,
                        None => {
                            m.experts.iter().map(MlpWeights::size_bytes).sum::<usize>() * top_k
                                / m.experts.len().max(1)
                        }
                    };
                    linear(&m.router) + m.shared.size_bytes() + linear(&m.shared_gate) + routed
                }
            };
        }
        total
    }
}

impl ModelWeights {
    /// Every large projection, for re-encoding. The embedding (read one row at a time), the
    /// router and shared-expert gate (tiny, and routing decisions are sensitive), the
    /// hyper-connection and PLE blocks and the n-gram table stay as stored.
    fn projections_mut(&mut self) -> Vec<&mut Linear> {
        let mut out: Vec<&mut Linear> = vec![&mut self.lm_head];
        for layer in &mut self.layers {
            match &mut layer.mixer {
                MixerWeights::Attention(a) => {
                    out.extend([&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj])
                }
                MixerWeights::Gdn(g) => {
                    match &mut g.projection {
                        GdnProjection::Fused { qkvz, ba } => out.extend([qkvz, ba]),
                        GdnProjection::Split { qkv, z, b, a } => out.extend([qkv, z, b, a]),
                    }
                    out.push(&mut g.out_proj);
                }
            }
            match &mut layer.ffn {
                FfnWeights::Dense(m) => out.extend([&mut m.gate, &mut m.up, &mut m.down]),
                FfnWeights::Moe(m) => {
                    out.extend([&mut m.shared.gate, &mut m.shared.up, &mut m.shared.down]);
                    for e in &mut m.experts {
                        out.extend([&mut e.gate, &mut e.up, &mut e.down]);
                    }
                }
            }
        }
        out
    }

    /// Rounds the matrices held as f32 or f16 (block-FP8 weights dequantized on load, GGUF
    /// tensors: llama.cpp keeps routers in F32) to bf16, nearest even, for backends that upload
    /// bf16 matrices only (CUDA): the projections, the embedding, the routers and shared-expert
    /// gates. Bf16 and quantized matrices are left as they are.
    pub fn round_wide_to_bf16(&mut self) {
        self.round_wide_to_bf16_keeping(&|_| false);
    }

    /// As [`ModelWeights::round_wide_to_bf16`], leaving the matrices `keep` picks as they are
    /// (a backend that runs block FP8 reads the stored form of those dequantized from it,
    /// [`Linear::fp8`]).
    pub fn round_wide_to_bf16_keeping(&mut self, keep: &(dyn Fn(&Linear) -> bool + Sync)) {
        use rayon::prelude::*;
        let round = |linear: &Linear| {
            if keep(linear) {
                linear.clone()
            } else {
                linear.rounded_to_bf16()
            }
        };
        let tied = matches!((&self.embed, &self.lm_head), (Linear::Mapped(e), Linear::Mapped(h))
            if e.bytes().as_ptr() == h.bytes().as_ptr());
        self.embed = self.embed.rounded_to_bf16();
        let mut targets = self.projections_mut();
        if tied {
            // The head stays the embedding's view.
            targets.remove(0);
        }
        targets
            .par_iter_mut()
            .for_each(|linear| **linear = round(linear));
        if tied {
            self.lm_head = self.embed.clone();
        }
        for layer in &mut self.layers {
            if let FfnWeights::Moe(m) = &mut layer.ffn {
                m.router = round(&m.router);
                m.shared_gate = round(&m.shared_gate);
            }
        }
    }

    /// Re-encodes the projections in `format` (in parallel), calling `progress(done, total)`.
    pub fn quantize(&mut self, format: WeightFormat, progress: &(dyn Fn(usize, usize) + Sync)) {
        if format == WeightFormat::Bf16 {
            return;
        }
        use rayon::prelude::*;
        let mut targets = self.projections_mut();
        let total = targets.len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        targets.par_iter_mut().for_each(|linear| {
            **linear = linear.quantized(format);
            progress(
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
                total,
            );
        });
    }
}
