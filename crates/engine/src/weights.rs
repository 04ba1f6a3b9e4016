//! The checkpoint's tensors gathered per layer, with every shape checked against the config.
//! Matrices stay in the memory map; only small vectors (norms, A_log, conv taps) are copied.

use std::sync::Arc;

use spindle_model::quant::{QuantizedMatrix, WeightFormat};
use spindle_model::view::{MatRef, Weights};
use spindle_model::{
    Checkpoint, DType, ExpertLayout, FfnKind, Matrix, MixerKind, ModelConfig, Result, TensorNames,
};

use crate::experts::load::{load_layer, ExpertSetup, LayerExperts};
use crate::experts::packed::PackedMatrix;
use crate::experts::StreamedExperts;
use crate::qwen4::{self, HyperWeights, IndexerWeights, PleWeights};
use spindle_model::install::Install;

/// Where the loader reads tensors: a checkpoint, and for an install also its quantized
/// resident tensors and its expert files.
pub struct Source<'a> {
    pub ck: &'a Checkpoint,
    pub install: Option<(&'a Install, &'a ExpertSetup)>,
}

impl Source<'_> {
    /// Whether tensor `name` exists, as stored or quantized.
    fn contains(&self, name: &str) -> bool {
        self.ck.contains(name)
            || self
                .install
                .is_some_and(|(i, _)| matches!(i.quantized(name), Ok(Some(_))))
    }

    /// The matrix `name` of `shape`: quantized as the install stores it, or as mapped.
    fn linear(&self, name: &str, shape: &[usize]) -> Result<Linear> {
        if let Some((install, _)) = self.install {
            if let Some(q) = install.quantized(name)? {
                if shape != [q.rows, q.cols] {
                    return Err(spindle_model::ModelError::ShapeMismatch {
                        path: q.file.path().to_owned(),
                        tensor: name.to_owned(),
                        actual: vec![q.rows, q.cols],
                        expected: shape.to_vec(),
                    });
                }
                return Ok(Linear::Packed(PackedMatrix::from_resident(&q)));
            }
        }
        Ok(Linear::Mapped(self.ck.matrix(name, shape)?))
    }
}

/// A linear layer y = x·Wᵀ with W `[out, in]`: as stored in the checkpoint (memory-mapped)
/// or quantized on load.
#[derive(Clone, Debug)]
pub enum Linear {
    Mapped(Matrix),
    Quantized(Arc<QuantizedMatrix>),
    /// Laid out by an install: a quantized resident tensor or an expert record's part.
    Packed(PackedMatrix),
}

impl Linear {
    pub fn mat(&self) -> MatRef<'_> {
        match self {
            Linear::Mapped(m) => {
                let weights = match m.dtype {
                    DType::Bf16 => Weights::Bf16(bytemuck::cast_slice(m.bytes())),
                    DType::F16 => Weights::F16(bytemuck::cast_slice(m.bytes())),
                    DType::F32 => Weights::F32(bytemuck::cast_slice(m.bytes())),
                };
                MatRef::new(weights, m.rows, m.cols)
            }
            Linear::Quantized(q) => q.mat(),
            Linear::Packed(p) => p.mat(),
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.rows,
            Linear::Quantized(q) => q.rows,
            Linear::Packed(p) => p.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Linear::Mapped(m) => m.cols,
            Linear::Quantized(q) => q.cols,
            Linear::Packed(p) => p.cols,
        }
    }

    pub fn out_features(&self) -> usize {
        self.rows()
    }

    /// Bytes of weights (codes and scales for quantized formats).
    pub fn size_bytes(&self) -> usize {
        self.mat().size_bytes()
    }

    /// `y [tokens, out] = x [tokens, in] · Wᵀ`.
    pub fn forward(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        let mut y = vec![0.0; tokens * self.rows()];
        spindle_kernels::linear::matmul(&self.mat(), x, tokens, &mut y);
        y
    }

    /// This layer in `format`; unchanged for bf16, or when the row length is not a whole
    /// number of quantization groups.
    pub fn quantized(&self, format: WeightFormat) -> Linear {
        if format == WeightFormat::Bf16 {
            return self.clone();
        }
        if !format.fits(self.cols()) || matches!(self, Linear::Quantized(_) | Linear::Packed(_)) {
            return self.clone();
        }
        let mat = self.mat();
        let mut values = vec![0.0f32; mat.rows * mat.cols];
        for (r, row) in values.chunks_mut(mat.cols).enumerate() {
            mat.row_to_f32(r, row);
        }
        let quantized = QuantizedMatrix::quantize(&values, mat.rows, mat.cols, format);
        if let Linear::Mapped(m) = self {
            // The bf16 pages are not read again: keep them out of the resident set.
            m.release_pages();
        }
        Linear::Quantized(Arc::new(quantized))
    }
}

pub struct AttentionWeights {
    /// `[n_h·2d, H]`: per head, d query rows then d gate rows.
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// qwen4_exp: the QSA indexer that selects which cached tokens attention sees.
    pub indexer: Option<IndexerWeights>,
}

/// GDN input projections in either checkpoint layout (MODEL_MATH §1.5).
pub enum GdnProjection {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, grouped per key head.
    Fused { qkvz: Linear, ba: Linear },
    /// Qwen3.5 and later: outputs already in channel order.
    Split {
        qkv: Linear,
        z: Linear,
        b: Linear,
        a: Linear,
    },
}

pub struct GdnWeights {
    pub projection: GdnProjection,
    /// `[C, K]` depthwise conv taps.
    pub conv: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Gated-norm weight `[d_v]`, shared by all heads.
    pub norm: Vec<f32>,
    pub out_proj: Linear,
}

/// SwiGLU MLP: `down(silu(gate(x)) ⊙ up(x))`.
pub struct MlpWeights {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

pub struct MoeWeights {
    /// `[E, H]` router.
    pub router: Linear,
    /// Every expert, addressable (resident or mapped); empty when `streamed` holds them.
    pub experts: Vec<MlpWeights>,
    /// The experts behind a slot cache, read from an install as routing asks for them.
    pub streamed: Option<Box<StreamedExperts>>,
    pub shared: MlpWeights,
    /// `[1, H]` sigmoid gate of the shared expert.
    pub shared_gate: Linear,
}

pub enum MixerWeights {
    Attention(AttentionWeights),
    Gdn(GdnWeights),
}

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

pub struct ModelWeights {
    pub embed: Linear,
    pub layers: Vec<LayerWeights>,
    pub head_input: HeadInput,
    pub lm_head: Linear,
}

/// Reads and shape-checks every tensor the forward pass needs.
pub fn load(checkpoint: &Checkpoint, config: &ModelConfig) -> Result<ModelWeights> {
    load_from(
        &Source {
            ck: checkpoint,
            install: None,
        },
        config,
    )
}

/// [`load`] from a checkpoint or an install.
pub fn load_from(src: &Source, config: &ModelConfig) -> Result<ModelWeights> {
    let checkpoint = src.ck;
    let names = TensorNames::detect(checkpoint)?;
    let h = config.hidden_size;
    let embed = Linear::Mapped(
        checkpoint.matrix(&names.trunk("embed_tokens.weight"), &[config.vocab_size, h])?,
    );
    // An install stores a tied head apart when it quantized it.
    let stored_head = src.install.is_some() && src.contains("lm_head.weight");
    let lm_head = if config.tie_word_embeddings && !stored_head {
        embed.clone()
    } else {
        src.linear("lm_head.weight", &[config.vocab_size, h])?
    };
    let layers = (0..config.num_layers())
        .map(|i| load_layer_weights(src, &names, config, i))
        .collect::<Result<Vec<_>>>()?;
    let head_input = match &config.hyper {
        Some(hc) => HeadInput::HyperMixer(qwen4::load_hyper(
            checkpoint,
            &names.trunk("hyper_connection_mixer"),
            hc,
            h,
            false,
        )?),
        None => HeadInput::Norm(checkpoint.f32_values(&names.trunk("norm.weight"), &[h])?),
    };
    Ok(ModelWeights {
        embed,
        layers,
        head_input,
        lm_head,
    })
}

fn load_layer_weights(
    src: &Source,
    names: &TensorNames,
    config: &ModelConfig,
    i: usize,
) -> Result<LayerWeights> {
    let ck = src.ck;
    let h = config.hidden_size;
    let spec = config.layers[i];
    let mixer = match spec.mixer {
        MixerKind::FullAttention => MixerWeights::Attention(load_attention(src, names, config, i)?),
        MixerKind::LinearAttention => MixerWeights::Gdn(load_gdn(src, names, config, i)?),
    };
    let ffn = match spec.ffn {
        FfnKind::Dense => {
            let inter = config
                .intermediate_size
                .expect("validated: dense layers have intermediate_size");
            FfnWeights::Dense(load_mlp(
                src,
                &|s| names.layer(i, &format!("mlp.{s}")),
                h,
                inter,
            )?)
        }
        FfnKind::Moe => FfnWeights::Moe(load_moe(src, names, config, i)?),
    };
    let residual = match &config.hyper {
        Some(hc) => Residual::Hyper {
            attn: qwen4::load_hyper(ck, &names.layer(i, "attn_hyper_connection"), hc, h, true)?,
            mlp: qwen4::load_hyper(ck, &names.layer(i, "mlp_hyper_connection"), hc, h, true)?,
        },
        None => Residual::Norms {
            input: ck.f32_values(&names.layer(i, "input_layernorm.weight"), &[h])?,
            post: ck.f32_values(&names.layer(i, "post_attention_layernorm.weight"), &[h])?,
        },
    };
    let ple = match &config.ple {
        Some(ple) if ple.layers.contains(&i) => Some(qwen4::load_ple(ck, names, config, ple, i)?),
        _ => None,
    };
    Ok(LayerWeights {
        residual,
        ple,
        mixer,
        ffn,
    })
}

fn load_attention(
    src: &Source,
    names: &TensorNames,
    config: &ModelConfig,
    i: usize,
) -> Result<AttentionWeights> {
    let ck = src.ck;
    let a = &config.attention;
    let h = config.hidden_size;
    let t = |s: &str| names.layer(i, &format!("self_attn.{s}"));
    Ok(AttentionWeights {
        q_proj: src.linear(&t("q_proj.weight"), &[a.num_heads * a.head_dim * 2, h])?,
        k_proj: src.linear(&t("k_proj.weight"), &[a.num_kv_heads * a.head_dim, h])?,
        v_proj: src.linear(&t("v_proj.weight"), &[a.num_kv_heads * a.head_dim, h])?,
        o_proj: src.linear(&t("o_proj.weight"), &[h, a.num_heads * a.head_dim])?,
        q_norm: ck.f32_values(&t("q_norm.weight"), &[a.head_dim])?,
        k_norm: ck.f32_values(&t("k_norm.weight"), &[a.head_dim])?,
        indexer: match &config.qsa {
            Some(qsa) => Some(qwen4::load_indexer(ck, &t("indexer"), qsa, h)?),
            None => None,
        },
    })
}

fn load_gdn(
    src: &Source,
    names: &TensorNames,
    config: &ModelConfig,
    i: usize,
) -> Result<GdnWeights> {
    let ck = src.ck;
    let g = &config.gdn;
    let h = config.hidden_size;
    let t = |s: &str| names.layer(i, &format!("linear_attn.{s}"));
    let (nk, nv, dk, dv) = g.dims();
    let channels = g.conv_channels();
    let projection = if src.contains(&t("in_proj_qkvz.weight")) {
        GdnProjection::Fused {
            qkvz: src.linear(&t("in_proj_qkvz.weight"), &[2 * nk * dk + 2 * nv * dv, h])?,
            ba: src.linear(&t("in_proj_ba.weight"), &[2 * nv, h])?,
        }
    } else {
        GdnProjection::Split {
            qkv: src.linear(&t("in_proj_qkv.weight"), &[channels, h])?,
            z: src.linear(&t("in_proj_z.weight"), &[nv * dv, h])?,
            b: src.linear(&t("in_proj_b.weight"), &[nv, h])?,
            a: src.linear(&t("in_proj_a.weight"), &[nv, h])?,
        }
    };
    Ok(GdnWeights {
        projection,
        conv: ck.f32_values(&t("conv1d.weight"), &[channels, 1, g.conv_kernel])?,
        a_log: ck.f32_values(&t("A_log"), &[nv])?,
        dt_bias: ck.f32_values(&t("dt_bias"), &[nv])?,
        norm: ck.f32_values(&t("norm.weight"), &[dv])?,
        out_proj: src.linear(&t("out_proj.weight"), &[h, nv * dv])?,
    })
}

fn load_mlp(
    src: &Source,
    name: &dyn Fn(&str) -> String,
    h: usize,
    inter: usize,
) -> Result<MlpWeights> {
    Ok(MlpWeights {
        gate: src.linear(&name("gate_proj.weight"), &[inter, h])?,
        up: src.linear(&name("up_proj.weight"), &[inter, h])?,
        down: src.linear(&name("down_proj.weight"), &[h, inter])?,
    })
}

fn load_moe(
    src: &Source,
    names: &TensorNames,
    config: &ModelConfig,
    i: usize,
) -> Result<MoeWeights> {
    let ck = src.ck;
    let moe = config
        .moe
        .as_ref()
        .expect("validated: MoE layers have a MoE config");
    let h = config.hidden_size;
    let (e_count, inter) = (moe.num_experts, moe.expert_intermediate);
    let t = |s: &str| names.layer(i, &format!("mlp.{s}"));
    let mut streamed = None;
    let experts = if let Some((install, setup)) = src.install {
        match load_layer(install, i, setup)? {
            LayerExperts::InMemory(experts) => experts,
            LayerExperts::Streamed(s) => {
                streamed = Some(Box::new(s));
                Vec::new()
            }
        }
    } else {
        match names.expert_layout(ck, i)? {
            ExpertLayout::PerExpert => (0..e_count)
                .map(|e| load_mlp(src, &|s| t(&format!("experts.{e}.{s}")), h, inter))
                .collect::<Result<Vec<_>>>()?,
            ExpertLayout::Fused => {
                let gate_up = ck.matrix(&t("experts.gate_up_proj"), &[e_count, 2 * inter, h])?;
                let down = ck.matrix(&t("experts.down_proj"), &[e_count, h, inter])?;
                (0..e_count)
                    .map(|e| MlpWeights {
                        gate: Linear::Mapped(gate_up.rows_slice(e * 2 * inter, inter)),
                        up: Linear::Mapped(gate_up.rows_slice(e * 2 * inter + inter, inter)),
                        down: Linear::Mapped(down.rows_slice(e * h, h)),
                    })
                    .collect()
            }
        }
    };
    Ok(MoeWeights {
        router: src.linear(&t("gate.weight"), &[e_count, h])?,
        experts,
        streamed,
        shared: load_mlp(
            src,
            &|s| t(&format!("shared_expert.{s}")),
            h,
            moe.shared_intermediate,
        )?,
        shared_gate: src.linear(&t("shared_expert_gate.weight"), &[1, h])?,
    })
}

impl MlpWeights {
    pub fn size_bytes(&self) -> usize {
        self.gate.size_bytes() + self.up.size_bytes() + self.down.size_bytes()
    }
}

impl ModelWeights {
    /// Bytes of weights one decode step reads on average: every dense tensor, one embedding
    /// row, the shared experts, and top-k of E routed experts per MoE layer (plus the PLE
    /// table rows). This is the numerator of the decode roofline.
    pub fn bytes_per_token(&self, top_k: usize) -> usize {
        let linear = |l: &Linear| l.size_bytes();
        let vec = |v: &Vec<f32>| v.len() * 4;
        let hyper = |h: &crate::qwen4::HyperWeights| {
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
