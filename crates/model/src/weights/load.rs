//! Reading every tensor the forward pass needs from a checkpoint or an install, by the keys
//! and shapes of the weight schema (`crate::layout::schema`), each shape-checked.

use crate::layout::{
    AttentionSchema, GdnSchema, HyperSchema, MlpSchema, MoeSchema, NormsSchema, TrunkSchema,
};
use crate::weights::experts::load::{load_layer, LayerExperts};
use crate::{Checkpoint, ExpertLayout, FfnKind, MixerKind, ModelConfig, Result, TensorNames};

use super::load_qwen4::{load_hyper, load_indexer, load_ple};
use super::source::{At, Source};
use super::{
    AttentionWeights, FfnWeights, GdnProjection, GdnWeights, HeadInput, LayerWeights, Linear,
    MixerWeights, MlpWeights, ModelWeights, MoeWeights, Residual,
};

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
    let names = TensorNames::detect(src.ck)?;
    let trunk = TrunkSchema::new(config);
    let at = At::trunk(src, &names);
    let embed = at.mapped(&trunk.embed)?;
    // An install stores a tied head apart when it quantized it.
    let head = &trunk.lm_head;
    let stored_head = src.install.is_some() && src.contains(&head.key);
    let lm_head = if config.tie_word_embeddings && !stored_head {
        embed.clone()
    } else {
        src.linear(&head.key, &head.shape)?
    };
    let layers = (0..config.num_layers())
        .map(|i| load_layer_weights(&At::layer(src, &names, i), config, i))
        .collect::<Result<Vec<_>>>()?;
    let head_input = match &trunk.hyper_mixer {
        Some(mixer) => HeadInput::HyperMixer(load_hyper(&at, mixer)?),
        None => HeadInput::Norm(at.values(&trunk.norm)?),
    };
    Ok(ModelWeights {
        embed,
        layers,
        head_input,
        lm_head,
    })
}

fn load_layer_weights(at: &At, config: &ModelConfig, i: usize) -> Result<LayerWeights> {
    let h = config.hidden_size;
    let spec = config.layers[i];
    let mixer = match spec.mixer {
        MixerKind::FullAttention => MixerWeights::Attention(load_attention(at, config)?),
        MixerKind::LinearAttention => MixerWeights::Gdn(load_gdn(at, config)?),
    };
    let ffn = match spec.ffn {
        FfnKind::Dense => {
            let inter = config
                .intermediate_size
                .expect("validated: dense layers have intermediate_size");
            FfnWeights::Dense(load_mlp(at, &MlpSchema::dense(config, inter))?)
        }
        FfnKind::Moe => FfnWeights::Moe(load_moe(at, config, i)?),
    };
    let residual = match &config.hyper {
        Some(hc) => Residual::Hyper {
            attn: load_hyper(at, &HyperSchema::new("attn_hyper_connection", hc, h, true))?,
            mlp: load_hyper(at, &HyperSchema::new("mlp_hyper_connection", hc, h, true))?,
        },
        None => {
            let norms = NormsSchema::new(h);
            Residual::Norms {
                input: at.values(&norms.input)?,
                post: at.values(&norms.post)?,
            }
        }
    };
    let ple = match &config.ple {
        Some(ple) if ple.layers.contains(&i) => Some(load_ple(at, config, ple, i)?),
        _ => None,
    };
    Ok(LayerWeights {
        residual,
        ple,
        mixer,
        ffn,
    })
}

fn load_attention(at: &At, config: &ModelConfig) -> Result<AttentionWeights> {
    let s = AttentionSchema::new(config);
    Ok(AttentionWeights {
        q_proj: at.linear(&s.q_proj)?,
        k_proj: at.linear(&s.k_proj)?,
        v_proj: at.linear(&s.v_proj)?,
        o_proj: at.linear(&s.o_proj)?,
        q_norm: at.values(&s.q_norm)?,
        k_norm: at.values(&s.k_norm)?,
        indexer: match &s.indexer {
            Some(indexer) => Some(load_indexer(at, indexer)?),
            None => None,
        },
    })
}

fn load_gdn(at: &At, config: &ModelConfig) -> Result<GdnWeights> {
    let s = GdnSchema::new(config);
    let projection = if at.contains(&s.qkvz) {
        GdnProjection::Fused {
            qkvz: at.linear(&s.qkvz)?,
            ba: at.linear(&s.ba)?,
        }
    } else {
        GdnProjection::Split {
            qkv: at.linear(&s.qkv)?,
            z: at.linear(&s.z)?,
            b: at.linear(&s.b)?,
            a: at.linear(&s.a)?,
        }
    };
    Ok(GdnWeights {
        projection,
        conv: at.values(&s.conv)?,
        a_log: at.values(&s.a_log)?,
        dt_bias: at.values(&s.dt_bias)?,
        norm: at.values(&s.norm)?,
        out_proj: at.linear(&s.out_proj)?,
    })
}

fn load_mlp(at: &At, s: &MlpSchema) -> Result<MlpWeights> {
    Ok(MlpWeights {
        gate: at.linear(&s.gate)?,
        up: at.linear(&s.up)?,
        down: at.linear(&s.down)?,
    })
}

fn load_moe(at: &At, config: &ModelConfig, i: usize) -> Result<MoeWeights> {
    let ck = at.src.ck;
    let moe = config
        .moe
        .as_ref()
        .expect("validated: MoE layers have a MoE config");
    let s = MoeSchema::new(config, moe);
    let e_count = moe.num_experts;
    let mut streamed = None;
    let experts = if let Some((install, setup)) = at.src.install {
        match load_layer(install, i, setup)? {
            LayerExperts::InMemory(experts) => experts,
            LayerExperts::Streamed(s) => {
                streamed = Some(Box::new(s));
                Vec::new()
            }
        }
    } else {
        match at.names.expert_layout(ck, i)? {
            ExpertLayout::PerExpert => (0..e_count)
                .map(|e| load_mlp(at, &s.expert(e)))
                .collect::<Result<Vec<_>>>()?,
            ExpertLayout::Fused => {
                let gate_up = ck.matrix(&at.name(&s.gate_up), &s.gate_up.shape)?;
                let down = ck.matrix(&at.name(&s.down), &s.down.shape)?;
                (0..e_count)
                    .map(|e| {
                        let [gate, up, down] = s.fused_expert(&gate_up, &down, e);
                        MlpWeights {
                            gate: Linear::Mapped(gate),
                            up: Linear::Mapped(up),
                            down: Linear::Mapped(down),
                        }
                    })
                    .collect()
            }
        }
    };
    Ok(MoeWeights {
        router: at.linear(&s.router)?,
        experts,
        streamed,
        shared: load_mlp(at, &s.shared)?,
        shared_gate: at.linear(&s.shared_gate)?,
    })
}
