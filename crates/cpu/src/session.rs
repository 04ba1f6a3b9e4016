//! One sequence's state: the KV cache of each attention layer and the conv and recurrent
//! state of each GDN layer (f32).

use spindle_model::{MixerKind, ModelConfig};

use crate::qwen4::IndexerCache;

/// Keys and values of every past token, `[len, n_kv, d]` each (keys after norm and RoPE).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    /// qwen4_exp: the QSA indexer's raw keys and pooled block keys.
    pub indexer: IndexerCache,
}

/// GDN state: the last K−1 raw conv inputs `[K−1, C]` and S per v-head `[n_v, d_k, d_v]`.
#[derive(Clone, Debug)]
pub struct GdnState {
    pub conv: Vec<f32>,
    pub recurrent: Vec<f32>,
}

#[derive(Clone, Debug)]
pub enum LayerState {
    Attention(KvCache),
    Gdn(GdnState),
}

/// qwen4_exp PLE state: the n-gram history and each PLE layer's dilated-conv rows.
#[derive(Clone, Debug)]
pub struct PleState {
    /// The last ngram_size − 1 token ids (EOS before the first token).
    pub history: Vec<u32>,
    /// Per PLE layer (in ple_layer_ids order): the last (K − 1)·dilation normed gate rows.
    pub conv: Vec<Vec<f32>>,
}

/// The state of one sequence. Cloning it snapshots the sequence.
#[derive(Clone, Debug)]
pub struct Session {
    /// Number of tokens already processed (the next token's position).
    pub position: usize,
    pub layers: Vec<LayerState>,
    pub ple: Option<PleState>,
    /// Why the state is incomplete, after a step failed part-way (no further steps run).
    pub broken: Option<String>,
}

impl Session {
    pub fn new(config: &ModelConfig) -> Self {
        let g = &config.gdn;
        let layers = config
            .layers
            .iter()
            .map(|spec| match spec.mixer {
                MixerKind::FullAttention => LayerState::Attention(KvCache::default()),
                MixerKind::LinearAttention => LayerState::Gdn(GdnState {
                    conv: vec![0.0; (g.conv_kernel - 1) * g.conv_channels()],
                    recurrent: vec![0.0; g.num_value_heads * g.key_head_dim * g.value_head_dim],
                }),
            })
            .collect();
        let ple = config.ple.as_ref().map(|ple| {
            let width = config.hyper.as_ref().map_or(1, |h| h.streams) * config.hidden_size;
            let rows = (ple.conv_kernel - 1) * ple.ngram_size;
            PleState {
                history: vec![ple.eos; ple.ngram_size - 1],
                conv: vec![vec![0.0; rows * width]; ple.layers.len()],
            }
        });
        Session {
            position: 0,
            layers,
            ple,
            broken: None,
        }
    }

    /// Bytes held by the caches and states.
    pub fn state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => {
                    (kv.keys.len()
                        + kv.values.len()
                        + kv.indexer.raw_keys.len()
                        + kv.indexer.block_keys.len())
                        * 4
                }
                LayerState::Gdn(s) => (s.conv.len() + s.recurrent.len()) * 4,
            })
            .sum::<usize>()
            + self
                .ple
                .as_ref()
                .map_or(0, |p| p.conv.iter().map(|c| c.len() * 4).sum())
    }
}
