//! The model's weights in VRAM, uploaded from the memory-mapped checkpoint through the CPU
//! engine's validated [`ModelWeights`]. Projections that read the same input are fused into
//! one matrix so a sublayer starts with one matvec/GEMM.

use spindle_engine::qwen4::HyperWeights;
use spindle_engine::weights::{
    FfnWeights, GdnProjection, HeadInput, MixerWeights, MlpWeights, ModelWeights, MoeWeights,
    Residual,
};
use spindle_model::ModelConfig;

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::linear::{CheckpointMatrix, DevMatrix, MatrixBuilder};

/// Gated attention: `qkv` = [q_proj (n_h·2d) | k_proj | v_proj] rows.
pub struct GpuAttention {
    pub qkv: DevMatrix,
    pub o_proj: DevMatrix,
    pub q_norm: DevBuf<f32>,
    pub k_norm: DevBuf<f32>,
}

/// GDN: `in_proj` rows = [q (n_k·d_k) | k | v (n_v·d_v) | z (n_v·d_v) | b (n_v) | a (n_v)],
/// whatever the checkpoint layout (Qwen3-Next's per-key-group rows are regrouped here).
pub struct GpuGdn {
    pub in_proj: DevMatrix,
    /// `[C, K]` conv taps.
    pub conv: DevBuf<f32>,
    pub a_log: DevBuf<f32>,
    pub dt_bias: DevBuf<f32>,
    pub norm: DevBuf<f32>,
    pub out_proj: DevMatrix,
}

/// Dense SwiGLU MLP: `gate_up` = [gate (I) | up (I)] rows.
pub struct GpuMlp {
    pub gate_up: DevMatrix,
    pub down: DevMatrix,
}

/// MoE: `input` = [router (E) | shared gate (I_s) | shared up (I_s) | shared_expert_gate (1)]
/// rows; the routed experts stacked as `[E, 2I, H]` (gate rows, then up) and `[E, H, I]`.
pub struct GpuMoe {
    pub input: DevMatrix,
    pub shared_down: DevMatrix,
    pub experts_gate_up: DevBuf<u16>,
    pub experts_down: DevBuf<u16>,
}

/// A hyper-connection block: `down_inject` = [input_mix_weight_down (lowrank) |
/// block_inject_weight (n, absent in the final mixer)] rows.
pub struct GpuHyper {
    pub norm: DevBuf<f32>,
    pub down_inject: DevMatrix,
    pub up: DevMatrix,
    pub lowrank: usize,
}

/// PLE: `kv_proj` = [key_proj (n·H) | value_proj (H)] rows. The n-gram table stays on the host.
pub struct GpuPle {
    pub kv_proj: DevMatrix,
    pub norm_key: DevBuf<f32>,
    pub norm_query: DevBuf<f32>,
    pub norm_conv: DevBuf<f32>,
    pub conv: DevBuf<f32>,
}

pub enum GpuMixer {
    Attention(GpuAttention),
    Gdn(GpuGdn),
}

pub enum GpuFfn {
    Dense(GpuMlp),
    Moe(GpuMoe),
}

#[allow(clippy::large_enum_variant)] // one per layer
pub enum GpuResidual {
    Norms {
        input: DevBuf<f32>,
        post: DevBuf<f32>,
    },
    Hyper {
        attn: GpuHyper,
        mlp: GpuHyper,
    },
}

pub struct GpuLayer {
    pub residual: GpuResidual,
    pub ple: Option<GpuPle>,
    pub mixer: GpuMixer,
    pub ffn: GpuFfn,
}

pub enum GpuHeadInput {
    Norm(DevBuf<f32>),
    HyperMixer(GpuHyper),
}

pub struct GpuModel {
    pub embed: DevMatrix,
    pub layers: Vec<GpuLayer>,
    pub head_input: GpuHeadInput,
    /// `None` when the LM head is tied to the embedding.
    pub lm_head: Option<DevMatrix>,
}

impl GpuModel {
    pub fn lm_head(&self) -> &DevMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

pub fn upload(dev: &Device, w: &ModelWeights, config: &ModelConfig) -> Result<GpuModel> {
    let layers = w
        .layers
        .iter()
        .map(|layer| {
            Ok(GpuLayer {
                residual: match &layer.residual {
                    Residual::Norms { input, post } => GpuResidual::Norms {
                        input: dev.upload(input)?,
                        post: dev.upload(post)?,
                    },
                    Residual::Hyper { attn, mlp } => GpuResidual::Hyper {
                        attn: upload_hyper(dev, attn)?,
                        mlp: upload_hyper(dev, mlp)?,
                    },
                },
                ple: match &layer.ple {
                    Some(ple) => Some(GpuPle {
                        kv_proj: DevMatrix::stack(dev, &[ple.key_proj.m()?, ple.value_proj.m()?])?,
                        norm_key: dev.upload(&ple.norm_key)?,
                        norm_query: dev.upload(&ple.norm_query)?,
                        norm_conv: dev.upload(&ple.norm_conv)?,
                        conv: dev.upload(&ple.conv)?,
                    }),
                    None => None,
                },
                mixer: match &layer.mixer {
                    MixerWeights::Attention(a) => GpuMixer::Attention(GpuAttention {
                        qkv: DevMatrix::stack(dev, &[a.q_proj.m()?, a.k_proj.m()?, a.v_proj.m()?])?,
                        o_proj: DevMatrix::upload(dev, a.o_proj.m()?)?,
                        q_norm: dev.upload(&a.q_norm)?,
                        k_norm: dev.upload(&a.k_norm)?,
                    }),
                    MixerWeights::Gdn(g) => GpuMixer::Gdn(upload_gdn(dev, g, config)?),
                },
                ffn: match &layer.ffn {
                    FfnWeights::Dense(m) => GpuFfn::Dense(upload_mlp(dev, m)?),
                    FfnWeights::Moe(m) => GpuFfn::Moe(upload_moe(dev, m)?),
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let head_input = match &w.head_input {
        HeadInput::Norm(n) => GpuHeadInput::Norm(dev.upload(n)?),
        HeadInput::HyperMixer(h) => GpuHeadInput::HyperMixer(upload_hyper(dev, h)?),
    };
    let embed = DevMatrix::upload(dev, w.embed.m()?)?;
    let lm_head = if config.tie_word_embeddings {
        None
    } else {
        Some(DevMatrix::upload(dev, w.lm_head.m()?)?)
    };
    dev.sync()?;
    Ok(GpuModel {
        embed,
        layers,
        head_input,
        lm_head,
    })
}

fn upload_hyper(dev: &Device, h: &HyperWeights) -> Result<GpuHyper> {
    let down_inject = match &h.inject {
        Some(inject) => DevMatrix::stack(dev, &[h.mix_down.m()?, inject.m()?])?,
        None => DevMatrix::upload(dev, h.mix_down.m()?)?,
    };
    Ok(GpuHyper {
        norm: dev.upload(&h.norm)?,
        down_inject,
        up: DevMatrix::upload(dev, h.mix_up.m()?)?,
        lowrank: h.mix_down.rows(),
    })
}

fn upload_mlp(dev: &Device, m: &MlpWeights) -> Result<GpuMlp> {
    Ok(GpuMlp {
        gate_up: DevMatrix::stack(dev, &[m.gate.m()?, m.up.m()?])?,
        down: DevMatrix::upload(dev, m.down.m()?)?,
    })
}

fn upload_moe(dev: &Device, m: &MoeWeights) -> Result<GpuMoe> {
    let e_count = m.experts.len();
    let (inter, hidden) = (m.experts[0].gate.rows(), m.experts[0].gate.cols());
    let mut gate_up = MatrixBuilder::new(dev, e_count * 2 * inter, hidden)?;
    let mut down = MatrixBuilder::new(dev, e_count * hidden, inter)?;
    for (e, expert) in m.experts.iter().enumerate() {
        gate_up.put_all(expert.gate.m()?, e * 2 * inter)?;
        gate_up.put_all(expert.up.m()?, e * 2 * inter + inter)?;
        down.put_all(expert.down.m()?, e * hidden)?;
    }
    Ok(GpuMoe {
        input: DevMatrix::stack(
            dev,
            &[
                m.router.m()?,
                m.shared.gate.m()?,
                m.shared.up.m()?,
                m.shared_gate.m()?,
            ],
        )?,
        shared_down: DevMatrix::upload(dev, m.shared.down.m()?)?,
        experts_gate_up: gate_up.finish().buf,
        experts_down: down.finish().buf,
    })
}

fn upload_gdn(
    dev: &Device,
    g: &spindle_engine::weights::GdnWeights,
    config: &ModelConfig,
) -> Result<GpuGdn> {
    let c = &config.gdn;
    let (nk, nv, dk, dv) = (
        c.num_key_heads,
        c.num_value_heads,
        c.key_head_dim,
        c.value_head_dim,
    );
    let channels = c.conv_channels();
    let in_proj = match &g.projection {
        GdnProjection::Split { qkv, z, b, a } => {
            DevMatrix::stack(dev, &[qkv.m()?, z.m()?, b.m()?, a.m()?])?
        }
        GdnProjection::Fused { qkvz, ba } => {
            // Per key group g: [q (d_k) | k (d_k) | v (ρ·d_v) | z (ρ·d_v)] and [b (ρ) | a (ρ)].
            let rho = nv / nk;
            let width = 2 * dk + 2 * rho * dv;
            let rows = channels + nv * dv + 2 * nv;
            let mut m = MatrixBuilder::new(dev, rows, qkvz.cols())?;
            let (qkvz, ba) = (qkvz.m()?, ba.m()?);
            for kg in 0..nk {
                let src = kg * width;
                m.put(qkvz, src, dk, kg * dk)?;
                m.put(qkvz, src + dk, dk, nk * dk + kg * dk)?;
                m.put(qkvz, src + 2 * dk, rho * dv, 2 * nk * dk + kg * rho * dv)?;
                m.put(
                    qkvz,
                    src + 2 * dk + rho * dv,
                    rho * dv,
                    channels + kg * rho * dv,
                )?;
                m.put(ba, kg * 2 * rho, rho, channels + nv * dv + kg * rho)?;
                m.put(
                    ba,
                    kg * 2 * rho + rho,
                    rho,
                    channels + nv * dv + nv + kg * rho,
                )?;
            }
            m.finish()
        }
    };
    Ok(GpuGdn {
        in_proj,
        conv: dev.upload(&g.conv)?,
        a_log: dev.upload(&g.a_log)?,
        dt_bias: dev.upload(&g.dt_bias)?,
        norm: dev.upload(&g.norm)?,
        out_proj: DevMatrix::upload(dev, g.out_proj.m()?)?,
    })
}
