//! The weights of a full-attention layer (MODEL_MATH §1.4) and qwen4_exp's QSA indexer (§4.4).

use super::Linear;

/// A gated full-attention layer's projections and q/k norms.
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

/// qwen4_exp's QSA indexer: scores cached blocks of keys for each query.
pub struct IndexerWeights {
    /// `[(n_i + 1)·d_i, H]`: n_i query heads, then one raw key.
    pub qk_proj: Linear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}
