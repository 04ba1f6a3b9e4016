//! The model's weights in VRAM, uploaded from the memory-mapped checkpoint through the CPU
//! engine's validated [`ModelWeights`]. Projections that read the same input are fused into
//! one matrix so a sublayer starts with one matvec/GEMM. The one exception to VRAM is
//! qwen4_exp's PLE n-gram table (about 100 GB in the released model): it is copied, in its
//! stored dtype, into page-locked host memory that kernels read through a device mapping.

use spindle_model::weights::{
    FfnWeights, GdnProjection, HeadInput, MixerWeights, MlpWeights, ModelWeights, MoeWeights,
    Residual,
};
use spindle_model::weights::{HyperWeights, PleWeights};
use spindle_model::{DType, ModelConfig};

use crate::device::{DevBuf, Device, MappedHost};
use crate::error::{CudaError, Result};
use spindle_model::weights::Linear;

use crate::matrix::{DevMatrix, DevPart, DeviceLayout, Source};

/// Gated attention: `qkv` = [q_proj (n_h·2d) | k_proj | v_proj | index_qk_proj (qwen4_exp's
/// QSA indexer, (n_i + 1)·d_i)] rows.
pub struct GpuAttention {
    pub qkv: DevMatrix,
    pub o_proj: DevMatrix,
    pub q_norm: DevBuf<f32>,
    pub k_norm: DevBuf<f32>,
    pub indexer: Option<GpuIndexer>,
}

/// The QSA indexer (MODEL_MATH §4.4): its projection is the rows of `GpuAttention::qkv` from
/// `row`.
pub struct GpuIndexer {
    pub row: usize,
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

/// MoE: `input` = [router (E) | shared_expert_gate (1) | shared gate (I_s) | shared up (I_s)]
/// rows (the bf16 rows first, so decode reads them in one launch); the routed experts stacked as `[E, 2I, H]` (gate rows, then up) and `[E, H, I]`.
pub struct GpuMoe {
    pub input: DevMatrix,
    pub shared_down: DevMatrix,
    /// `[E·2I, H]`.
    pub experts_gate_up: DevPart,
    /// `[E·H, I]`.
    pub experts_down: DevPart,
}

/// A hyper-connection block: `down_inject` = [input_mix_weight_down (lowrank) |
/// block_inject_weight (n, absent in the final mixer)] rows.
pub struct GpuHyper {
    pub norm: DevBuf<f32>,
    pub down_inject: DevMatrix,
    pub up: DevMatrix,
    pub lowrank: usize,
}

/// PLE: `kv_proj` = [key_proj (n·H) | value_proj (H)] rows; the n-gram hash and table.
pub struct GpuPle {
    pub kv_proj: DevMatrix,
    pub norm_key: DevBuf<f32>,
    pub norm_query: DevBuf<f32>,
    pub norm_conv: DevBuf<f32>,
    pub conv: DevBuf<f32>,
    /// `[multipliers (ngram_size) | head sizes (heads) | head offsets (heads)]`.
    pub hash: DevBuf<u64>,
    pub ngram_size: usize,
    pub heads: usize,
    pub heads_per_ngram: usize,
    pub eos: u32,
    /// The conv's dilation (ngram_size).
    pub dilation: usize,
    pub table: NgramTable,
}

/// The PLE n-gram table `[rows, dim]`, the checkpoint's shards back to back in their stored
/// dtype, in host memory the device reads.
pub struct NgramTable {
    pub memory: MappedHost,
    /// The `ple_gather` code of the dtype: 0 bf16, 1 f16, 2 f32.
    pub dtype: usize,
    pub dim: usize,
}

pub enum GpuMixer {
    Attention(GpuAttention),
    Gdn(GpuGdn),
}

#[allow(clippy::large_enum_variant)] // one per layer
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

    /// Weight bytes one decode step reads: every matrix (codes and scales), the routed experts
    /// in proportion top_k / E, and one embedding row.
    pub fn bytes_per_token(&self, config: &ModelConfig) -> usize {
        let top_k = config.moe.as_ref().map_or(0, |m| m.top_k);
        let hyper = |h: &GpuHyper| h.down_inject.size_bytes() + h.up.size_bytes();
        let mut total = self.lm_head().size_bytes() + config.hidden_size * 2;
        if let GpuHeadInput::HyperMixer(h) = &self.head_input {
            total += hyper(h);
        }
        for layer in &self.layers {
            if let GpuResidual::Hyper { attn, mlp } = &layer.residual {
                total += hyper(attn) + hyper(mlp);
            }
            if let Some(ple) = &layer.ple {
                total += ple.kv_proj.size_bytes();
            }
            total += match &layer.mixer {
                GpuMixer::Attention(a) => a.qkv.size_bytes() + a.o_proj.size_bytes(),
                GpuMixer::Gdn(g) => g.in_proj.size_bytes() + g.out_proj.size_bytes(),
            };
            total += match &layer.ffn {
                GpuFfn::Dense(m) => m.gate_up.size_bytes() + m.down.size_bytes(),
                GpuFfn::Moe(m) => {
                    let experts = config.moe.as_ref().map_or(1, |c| c.num_experts).max(1);
                    m.input.size_bytes()
                        + m.shared_down.size_bytes()
                        + (m.experts_gate_up.size_bytes() + m.experts_down.size_bytes()) * top_k
                            / experts
                }
            };
        }
        total
    }

    /// Device bytes of the weight matrices (codes and scales) by format name, formats in
    /// first-seen order.
    pub fn bytes_by_format(&self) -> Vec<(&'static str, usize)> {
        let mut out: Vec<(&'static str, usize)> = Vec::new();
        let mut add = |p: &DevPart| {
            let name = p.fmt.suffix();
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, bytes)) => *bytes += p.size_bytes(),
                None => out.push((name, p.size_bytes())),
            }
        };
        let matrix =
            |m: &DevMatrix, add: &mut dyn FnMut(&DevPart)| m.parts.iter().for_each(|(_, p)| add(p));
        let hyper = |h: &GpuHyper, add: &mut dyn FnMut(&DevPart)| {
            h.down_inject.parts.iter().for_each(|(_, p)| add(p));
            h.up.parts.iter().for_each(|(_, p)| add(p));
        };
        matrix(&self.embed, &mut add);
        if let Some(head) = &self.lm_head {
            matrix(head, &mut add);
        }
        if let GpuHeadInput::HyperMixer(h) = &self.head_input {
            hyper(h, &mut add);
        }
        for layer in &self.layers {
            if let GpuResidual::Hyper { attn, mlp } = &layer.residual {
                hyper(attn, &mut add);
                hyper(mlp, &mut add);
            }
            if let Some(ple) = &layer.ple {
                matrix(&ple.kv_proj, &mut add);
            }
            match &layer.mixer {
                GpuMixer::Attention(a) => {
                    matrix(&a.qkv, &mut add);
                    matrix(&a.o_proj, &mut add);
                }
                GpuMixer::Gdn(g) => {
                    matrix(&g.in_proj, &mut add);
                    matrix(&g.out_proj, &mut add);
                }
            }
            match &layer.ffn {
                GpuFfn::Dense(m) => {
                    matrix(&m.gate_up, &mut add);
                    matrix(&m.down, &mut add);
                }
                GpuFfn::Moe(m) => {
                    matrix(&m.input, &mut add);
                    matrix(&m.shared_down, &mut add);
                    add(&m.experts_gate_up);
                    add(&m.experts_down);
                }
            }
        }
        out
    }

    /// A generous bound on the scratch bytes one forward pass of `tokens` tokens carves from
    /// a session workspace (every intermediate of every layer, 256-byte aligned).
    pub fn scratch_bytes(&self, config: &ModelConfig, tokens: usize) -> usize {
        let width = config.hyper.as_ref().map_or(1, |h| h.streams) * config.hidden_size;
        let top_k = config.moe.as_ref().map_or(0, |m| m.top_k);
        let a = &config.attention;
        let g = &config.gdn;
        let mut floats = 0;
        for layer in &self.layers {
            let mut rows = 8 * width;
            if let GpuResidual::Hyper { attn, mlp } = &layer.residual {
                rows += 2 * (attn.down_inject.rows + mlp.down_inject.rows + attn.lowrank);
            }
            if let Some(ple) = &layer.ple {
                // + the gathered n-gram rows.
                rows += ple.kv_proj.rows + ple.kv_proj.cols + 2 * width;
            }
            rows += match &layer.mixer {
                GpuMixer::Attention(w) => {
                    // + the QSA queries and the selected positions and their count (i32).
                    let qsa = config.qsa.as_ref().filter(|_| w.indexer.is_some());
                    let selection = qsa.map_or(0, |q| {
                        q.n_heads * q.head_dim + crate::session::selection_stride(q) + 1
                    });
                    w.qkv.rows + 3 * a.num_heads * a.head_dim + selection
                }
                GpuMixer::Gdn(w) => {
                    w.in_proj.rows + g.conv_channels() + g.num_value_heads * g.value_head_dim
                }
            };
            rows += match &layer.ffn {
                GpuFfn::Dense(m) => m.gate_up.rows + m.down.cols,
                GpuFfn::Moe(m) => {
                    // + the decode path's normed input, routing probabilities and shared act.
                    2 * m.input.rows
                        + 2 * m.shared_down.cols
                        + top_k * (m.experts_down.cols + 2)
                        + width
                }
            };
            floats += rows;
        }
        floats += 4 * width + self.lm_head().rows;
        tokens * floats * 4 + 256 * 64 * (self.layers.len() + 2)
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
                    Some(ple) => Some(upload_ple(dev, ple)?),
                    None => None,
                },
                mixer: match &layer.mixer {
                    MixerWeights::Attention(a) => GpuMixer::Attention(upload_attention(dev, a)?),
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
    let embed = DevMatrix::upload(dev, &w.embed)?;
    let lm_head = if config.tie_word_embeddings && matches!(w.lm_head, Linear::Mapped(_)) {
        None
    } else {
        Some(DevMatrix::upload(dev, &w.lm_head)?)
    };
    dev.sync()?;
    Ok(GpuModel {
        embed,
        layers,
        head_input,
        lm_head,
    })
}

fn upload_attention(
    dev: &Device,
    a: &spindle_model::weights::AttentionWeights,
) -> Result<GpuAttention> {
    let (qkv, indexer) = match &a.indexer {
        Some(ix) => (
            DevMatrix::stack(dev, &[&a.q_proj, &a.k_proj, &a.v_proj, &ix.qk_proj])?,
            Some(GpuIndexer {
                row: a.q_proj.rows() + a.k_proj.rows() + a.v_proj.rows(),
                q_norm: dev.upload(&ix.q_norm)?,
                k_norm: dev.upload(&ix.k_norm)?,
            }),
        ),
        None => (
            DevMatrix::stack(dev, &[&a.q_proj, &a.k_proj, &a.v_proj])?,
            None,
        ),
    };
    Ok(GpuAttention {
        qkv,
        o_proj: DevMatrix::upload(dev, &a.o_proj)?,
        q_norm: dev.upload(&a.q_norm)?,
        k_norm: dev.upload(&a.k_norm)?,
        indexer,
    })
}

fn upload_ple(dev: &Device, ple: &PleWeights) -> Result<GpuPle> {
    let hash = &ple.hash;
    let mut words = hash.multipliers.clone();
    words.extend_from_slice(&hash.vocab_sizes);
    words.extend_from_slice(&hash.offsets);
    Ok(GpuPle {
        kv_proj: DevMatrix::stack(dev, &[&ple.key_proj, &ple.value_proj])?,
        norm_key: dev.upload(&ple.norm_key)?,
        norm_query: dev.upload(&ple.norm_query)?,
        norm_conv: dev.upload(&ple.norm_conv)?,
        conv: dev.upload(&ple.conv)?,
        hash: dev.upload(&words)?,
        ngram_size: hash.ngram_size(),
        heads: hash.vocab_sizes.len(),
        heads_per_ngram: hash.heads_per_ngram,
        eos: hash.eos,
        dilation: ple.dilation(),
        table: upload_table(dev, &ple.table)?,
    })
}

/// Copies the n-gram table's shards, as stored, into mapped host memory.
fn upload_table(dev: &Device, table: &spindle_model::weights::NgramTable) -> Result<NgramTable> {
    let shards = table
        .shards
        .iter()
        .map(|shard| match shard {
            Linear::Mapped(m) => Ok(m),
            _ => Err(CudaError::Unsupported(
                "the PLE n-gram table is not as the checkpoint stores it".into(),
            )),
        })
        .collect::<Result<Vec<_>>>()?;
    let Some(&first) = shards.first() else {
        return Err(CudaError::Unsupported(
            "the PLE n-gram table has no shards".into(),
        ));
    };
    if let Some(odd) = shards
        .iter()
        .find(|m| m.dtype != first.dtype || m.cols != first.cols)
    {
        return Err(CudaError::Unsupported(format!(
            "the PLE n-gram table's shards differ: [{}, {}] {} and [{}, {}] {}",
            first.rows,
            first.cols,
            first.dtype.name(),
            odd.rows,
            odd.cols,
            odd.dtype.name()
        )));
    }
    let dtype = match first.dtype {
        DType::Bf16 => 0,
        DType::F16 => 1,
        DType::F32 => 2,
    };
    let bytes: usize = shards.iter().map(|m| m.bytes().len()).sum();
    let started = std::time::Instant::now();
    let mut memory = dev.mapped_host(bytes)?;
    let mut at = 0;
    let dst = memory.bytes_mut();
    for m in &shards {
        let src = m.bytes();
        dst[at..at + src.len()].copy_from_slice(src);
        at += src.len();
    }
    tracing::info!(
        bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "PLE n-gram table copied to mapped host memory"
    );
    Ok(NgramTable {
        memory,
        dtype,
        dim: first.cols,
    })
}

fn upload_hyper(dev: &Device, h: &HyperWeights) -> Result<GpuHyper> {
    let down_inject = match &h.inject {
        Some(inject) => DevMatrix::stack(dev, &[&h.mix_down, inject])?,
        None => DevMatrix::upload(dev, &h.mix_down)?,
    };
    Ok(GpuHyper {
        norm: dev.upload(&h.norm)?,
        down_inject,
        up: DevMatrix::upload(dev, &h.mix_up)?,
        lowrank: h.mix_down.rows(),
    })
}

fn upload_mlp(dev: &Device, m: &MlpWeights) -> Result<GpuMlp> {
    Ok(GpuMlp {
        gate_up: DevMatrix::stack(dev, &[&m.gate, &m.up])?,
        down: DevMatrix::upload(dev, &m.down)?,
    })
}

fn upload_moe(dev: &Device, m: &MoeWeights) -> Result<GpuMoe> {
    let e_count = m.experts.len();
    let (inter, hidden) = (m.experts[0].gate.rows(), m.experts[0].gate.cols());
    // A GGUF file may store the down projections in another type than gate and up.
    let fmt = Source::of(&m.experts[0].gate)?.fmt;
    let down_fmt = Source::of(&m.experts[0].down)?.fmt;
    let mut gate_up = DevPart::new(dev, fmt, e_count * 2 * inter, hidden)?;
    let mut down = DevPart::new(dev, down_fmt, e_count * hidden, inter)?;
    for (e, expert) in m.experts.iter().enumerate() {
        gate_up.put(dev, &Source::of(&expert.gate)?, 0, inter, e * 2 * inter)?;
        gate_up.put(
            dev,
            &Source::of(&expert.up)?,
            0,
            inter,
            e * 2 * inter + inter,
        )?;
        down.put(dev, &Source::of(&expert.down)?, 0, hidden, e * hidden)?;
    }
    Ok(GpuMoe {
        input: DevMatrix::stack(
            dev,
            &[&m.router, &m.shared_gate, &m.shared.gate, &m.shared.up],
        )?,
        shared_down: DevMatrix::upload(dev, &m.shared.down)?,
        experts_gate_up: gate_up,
        experts_down: down,
    })
}

fn upload_gdn(
    dev: &Device,
    g: &spindle_model::weights::GdnWeights,
    config: &ModelConfig,
) -> Result<GpuGdn> {
    let c = &config.gdn;
    let (nk, nv, dk, dv) = c.dims();
    let channels = c.conv_channels();
    let in_proj = match &g.projection {
        GdnProjection::Split { qkv, z, b, a } => DevMatrix::stack(dev, &[qkv, z, b, a])?,
        GdnProjection::Fused { qkvz, ba } => {
            // Per key group g: [q (d_k) | k (d_k) | v (ρ·d_v) | z (ρ·d_v)] and [b (ρ) | a (ρ)].
            let rho = nv / nk;
            let width = 2 * dk + 2 * rho * dv;
            let rows = channels + nv * dv + 2 * nv;
            let (qkvz, ba) = (Source::of(qkvz)?, Source::of(ba)?);
            // The b and a rows come last: a block of their own when their format differs (a
            // block-FP8 checkpoint leaves in_proj_ba unconverted).
            let ba_row = channels + nv * dv;
            let mut ba_part = if ba.fmt == qkvz.fmt {
                None
            } else {
                Some(DevPart::new(dev, ba.fmt, 2 * nv, ba.cols)?)
            };
            let own_rows = if ba_part.is_some() { ba_row } else { rows };
            let mut m = DevPart::new(dev, qkvz.fmt, own_rows, qkvz.cols)?;
            for kg in 0..nk {
                let src = kg * width;
                m.put(dev, &qkvz, src, dk, kg * dk)?;
                m.put(dev, &qkvz, src + dk, dk, nk * dk + kg * dk)?;
                m.put(
                    dev,
                    &qkvz,
                    src + 2 * dk,
                    rho * dv,
                    2 * nk * dk + kg * rho * dv,
                )?;
                m.put(
                    dev,
                    &qkvz,
                    src + 2 * dk + rho * dv,
                    rho * dv,
                    channels + kg * rho * dv,
                )?;
                let (dst, at) = match &mut ba_part {
                    Some(part) => (part, 0),
                    None => (&mut m, ba_row),
                };
                dst.put(dev, &ba, kg * 2 * rho, rho, at + kg * rho)?;
                dst.put(dev, &ba, kg * 2 * rho + rho, rho, at + nv + kg * rho)?;
            }
            match ba_part {
                None => DevMatrix::single(m),
                Some(part) => DevMatrix {
                    rows: ba_row + part.rows,
                    cols: m.cols,
                    parts: vec![(0, m), (ba_row, part)],
                },
            }
        }
    };
    Ok(GpuGdn {
        in_proj,
        conv: dev.upload(&g.conv)?,
        a_log: dev.upload(&g.a_log)?,
        dt_bias: dev.upload(&g.dt_bias)?,
        norm: dev.upload(&g.norm)?,
        out_proj: DevMatrix::upload(dev, &g.out_proj)?,
    })
}
