//! One sequence's state: the KV cache of each attention layer and the conv and recurrent
//! state of each GDN layer (f32).

use spindle_model::{MixerKind, ModelConfig};

/// Keys and values of every past token, `[len, n_kv, d]` each (keys after norm and RoPE).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
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

/// The state of one sequence. Cloning it snapshots the sequence.
#[derive(Clone, Debug)]
pub struct Session {
    /// Number of tokens already processed (the next token's position).
    pub position: usize,
    pub layers: Vec<LayerState>,
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
        Session { position: 0, layers }
    }

    /// Bytes held by the caches and states.
    pub fn state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => (kv.keys.len() + kv.values.len()) * 4,
                LayerState::Gdn(s) => (s.conv.len() + s.recurrent.len()) * 4,
            })
            .sum()
    }
}
