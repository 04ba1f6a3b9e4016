//! The weights qwen4_exp adds (MODEL_MATH §4): hyper-connection blocks (§4.3) and PLE with
//! its hashed n-gram table (§4.5, §4.6). The QSA indexer's are in [`super::attention`].

use crate::ngram::NgramHash;

use super::Linear;

/// One hyper-connection block (`*_hyper_connection` or the final `hyper_connection_mixer`).
pub struct HyperWeights {
    /// `[n·H]` grouped zero-centred norm weight.
    pub norm: Vec<f32>,
    /// `[lowrank, n·H]`.
    pub mix_down: Linear,
    /// `[n·H, lowrank]`.
    pub mix_up: Linear,
    /// `[n, n·H]`; absent in the final mixer (use_combine = False).
    pub inject: Option<Linear>,
}

/// The n-gram table, as the checkpoint's shards (concatenated along rows).
pub struct NgramTable {
    pub shards: Vec<Linear>,
    pub shard_rows: usize,
}

impl NgramTable {
    /// Row `row` of the whole table, as f32.
    pub fn row(&self, row: u64, out: &mut [f32]) {
        let (shard, local) = (
            row as usize / self.shard_rows,
            row as usize % self.shard_rows,
        );
        self.shards[shard].mat().row_to_f32(local, out);
    }
}

/// One PLE layer: the n-gram hash and table, projections, norms and the dilated conv.
pub struct PleWeights {
    pub hash: NgramHash,
    pub table: NgramTable,
    /// `[n·H, ple_dim]`.
    pub key_proj: Linear,
    /// `[H, ple_dim]`.
    pub value_proj: Linear,
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// `[n·H, K]` depthwise taps, dilation = ngram_size.
    pub conv: Vec<f32>,
    pub conv_kernel: usize,
}

impl PleWeights {
    pub fn dilation(&self) -> usize {
        self.hash.ngram_size()
    }

    /// Rows of normed gates the dilated conv needs from the past: (K − 1) · dilation.
    pub fn conv_history(&self) -> usize {
        (self.conv_kernel - 1) * self.dilation()
    }
}
