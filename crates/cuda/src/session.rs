//! One sequence's state on the device: KV caches, GDN conv and recurrent state (f32), and for
//! qwen4_exp the PLE conv rows. The QSA indexer cache and the n-gram history stay on the host.

use spindle_engine::qwen4::IndexerCache;
use spindle_model::{MixerKind, ModelConfig};

use crate::device::{DevBuf, Device};
use crate::error::Result;

/// Keys (after norm and RoPE) and values `[capacity, n_kv, d]`; rows `< position` are valid.
pub struct KvCache {
    pub keys: DevBuf<f32>,
    pub values: DevBuf<f32>,
    /// Token rows allocated.
    pub capacity: usize,
    /// qwen4_exp: raw indexer keys and pooled block keys, on the host.
    pub indexer: IndexerCache,
}

/// GDN state: the last K−1 raw conv inputs `[K−1, C]` and S `[n_v, d_k, d_v]`.
pub struct GdnState {
    pub conv: DevBuf<f32>,
    pub recurrent: DevBuf<f32>,
}

pub enum LayerState {
    Attention(KvCache),
    Gdn(GdnState),
}

/// qwen4_exp PLE state: the n-gram history (host) and each PLE layer's conv rows (device).
pub struct PleState {
    pub history: Vec<u32>,
    pub conv: Vec<DevBuf<f32>>,
}

/// The state of one sequence on one device.
pub struct CudaSession {
    /// Number of tokens already processed (the next token's position).
    pub position: usize,
    pub layers: Vec<LayerState>,
    pub ple: Option<PleState>,
}

impl CudaSession {
    pub(crate) fn new(dev: &Device, config: &ModelConfig) -> Result<Self> {
        let g = &config.gdn;
        let layers = config
            .layers
            .iter()
            .map(|spec| {
                Ok(match spec.mixer {
                    MixerKind::FullAttention => LayerState::Attention(KvCache {
                        keys: dev.zeros(0)?,
                        values: dev.zeros(0)?,
                        capacity: 0,
                        indexer: IndexerCache::default(),
                    }),
                    MixerKind::LinearAttention => LayerState::Gdn(GdnState {
                        conv: dev.zeros((g.conv_kernel - 1) * g.conv_channels())?,
                        recurrent: dev
                            .zeros(g.num_value_heads * g.key_head_dim * g.value_head_dim)?,
                    }),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ple = match &config.ple {
            Some(ple) => {
                let width = config.hyper.as_ref().map_or(1, |h| h.streams) * config.hidden_size;
                let rows = (ple.conv_kernel - 1) * ple.ngram_size;
                Some(PleState {
                    history: vec![ple.eos; ple.ngram_size - 1],
                    conv: (0..ple.layers.len())
                        .map(|_| dev.zeros(rows * width))
                        .collect::<Result<Vec<_>>>()?,
                })
            }
            None => None,
        };
        Ok(CudaSession {
            position: 0,
            layers,
            ple,
        })
    }
}
