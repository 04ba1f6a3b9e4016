//! Reading every tensor the forward pass needs from a checkpoint or an install, each
//! shape-checked against the config.

use crate::experts::load::{load_layer, ExpertSetup, LayerExperts};
use crate::install::Install;
use crate::{
    Checkpoint, ExpertLayout, FfnKind, MixerKind, ModelConfig, ModelError, Result, TensorNames,
};

use super::load_qwen4::{load_hyper, load_indexer, load_ple};
use super::packed::PackedMatrix;
use super::{
    AttentionWeights, FfnWeights, GdnProjection, GdnWeights, HeadInput, LayerWeights, Linear,
    MixerWeights, MlpWeights, ModelWeights, MoeWeights, Residual,
};

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
                    return Err(ModelError::ShapeMismatch {
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
        Some(hc) => HeadInput::HyperMixer(load_hyper(
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
            attn: load_hyper(ck, &names.layer(i, "attn_hyper_connection"), hc, h, true)?,
            mlp: load_hyper(ck, &names.layer(i, "mlp_hyper_connection"), hc, h, true)?,
        },
        None => Residual::Norms {
            input: ck.f32_values(&names.layer(i, "input_layernorm.weight"), &[h])?,
            post: ck.f32_values(&names.layer(i, "post_attention_layernorm.weight"), &[h])?,
        },
    };
    let ple = match &config.ple {
        Some(ple) if ple.layers.contains(&i) => Some(load_ple(ck, names, config, ple, i)?),
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
            Some(qsa) => Some(load_indexer(ck, &t("indexer"), qsa, h)?),
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
