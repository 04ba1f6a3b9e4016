//! One sequence's state on the device: its KV block table (the keys and values live in the
//! model's [`KvPool`]), GDN conv and recurrent state (f32), and for qwen4_exp the QSA indexer
//! caches, the PLE n-gram history and the PLE conv rows.

use std::sync::Arc;

use spindle_model::mrope::RopeCursor;
use spindle_model::{MixerKind, ModelConfig, QsaConfig};

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::kernels::{Ptr, MATVEC_MAX_TOKENS};
use crate::paged::{KvPool, SeqKv};

/// One attention layer's per-sequence scratch beside its keys and values (which are rows of the
/// pool's blocks, reached through the session's block table).
pub struct KvCache {
    /// Positions the flash-decoding grid and partials cover (grown by doubling; a captured
    /// graph's grid is fixed by it).
    pub capacity: usize,
    /// Flash-decoding partials: (max, sum, Σp·v) per (token, head, split of 32 keys) for
    /// `MATVEC_MAX_TOKENS` tokens at this capacity (empty for a QSA layer, which attends
    /// through selection lists).
    pub partials: DevBuf<f32>,
    /// Bumped whenever the capacity grows (a captured graph holds the partials' address and a
    /// grid fixed by the capacity).
    pub generation: u64,
    /// qwen4_exp: the QSA indexer's keys, grown with the cache.
    pub indexer: Option<IndexerCache>,
}

/// The QSA indexer's device state for one attention layer (MODEL_MATH §4.4), at the KV cache's
/// capacity; rows below the position are valid.
pub struct IndexerCache {
    /// `[capacity, d_i]`: each position's raw key (not normalised, not rotated).
    pub raw_keys: DevBuf<f32>,
    /// `[blocks, d_i]`, blocks = ⌈capacity / cr⌉: each complete block's key (pooled, k_norm,
    /// RoPE at its first position); it never changes once written.
    pub block_keys: DevBuf<f32>,
    /// `[attention::SCORE_TOKENS, blocks]`: block scores of the tokens being selected for
    /// (scratch of one selection launch).
    pub scores: DevBuf<f32>,
}

/// GDN state: the last K−1 raw conv inputs `[K−1, C]` and S `[n_v, d_k, d_v]`.
pub struct GdnState {
    pub conv: DevBuf<f32>,
    pub recurrent: DevBuf<f32>,
}

#[allow(clippy::large_enum_variant)] // one per layer
pub enum LayerState {
    Attention(KvCache),
    Gdn(GdnState),
}

/// qwen4_exp PLE state: the n-gram history (the last ngram_size − 1 ids, EOS at the start;
/// shared by the PLE layers, advanced after the last of them) and each PLE layer's conv rows.
pub struct PleState {
    pub history: DevBuf<i32>,
    pub conv: Vec<DevBuf<f32>>,
}

/// One sequence's rows in a (batched) forward step: rows `offset..offset + tokens` of the
/// step's activations, at positions `start..` of that sequence, or, in a captured graph
/// (`start_dev` not 0), from the position stored at device address `start_dev`.
#[derive(Clone, Copy, Debug)]
pub struct Seg {
    pub offset: usize,
    pub tokens: usize,
    pub start: usize,
    pub start_dev: u64,
    /// What the rotary position adds to the cache index (rope_delta, shared docs `VISION.md`
    /// §4.4; 0 for a text-only sequence).
    pub rope_delta: i64,
    /// Device address of `[tokens, rotary_dim/2]` i32 positions per frequency slot (the 3-D
    /// mRoPE of a chunk holding image rows, §4.3), or 0: every slot at cache index + delta.
    pub slots: u64,
}

impl Seg {
    /// Rows `offset..offset + tokens` at positions `start..` of a text-only sequence.
    pub fn text(offset: usize, tokens: usize, start: usize, start_dev: u64) -> Self {
        Seg {
            offset,
            tokens,
            start,
            start_dev,
            rope_delta: 0,
            slots: 0,
        }
    }
}

/// A decode step of B sequences of one token each, as its batched kernels read it: per layer
/// two arrays of B state addresses (GDN: conv states then recurrent states; attention: the
/// sequences' block tables, twice), each sequence's position, and the flash-decoding splits
/// that cover the largest KV cache.
#[derive(Clone, Copy, Debug)]
pub struct DecodeTables {
    /// Device address of `[layers][2][B]` u64.
    pub tables: u64,
    /// Device address of `[B]` i32.
    pub positions: u64,
    pub seqs: usize,
    /// ⌈largest KV capacity / ATTN_SPLIT_KEYS⌉.
    pub splits: usize,
}

/// One layer's view of [`DecodeTables`].
#[derive(Clone, Copy, Debug)]
pub struct LayerTables {
    /// `[2][B]` state addresses.
    pub table: Ptr<u64>,
    /// `[B]` positions.
    pub positions: Ptr<i32>,
    pub seqs: usize,
    pub splits: usize,
}

impl DecodeTables {
    /// Layer `index`'s view: its two address arrays `[2][B]`, the positions.
    pub fn layer(&self, index: usize) -> LayerTables {
        LayerTables {
            table: Ptr::raw(self.tables + (index * 2 * self.seqs * 8) as u64),
            positions: Ptr::raw(self.positions),
            seqs: self.seqs,
            splits: self.splits,
        }
    }

    /// The host image of the address tables for `sessions` (their caches already reserved).
    pub fn addresses(sessions: &[&CudaSession]) -> Vec<u64> {
        let b = sessions.len();
        let layers = sessions.first().map_or(0, |s| s.layers.len());
        let mut table = vec![0u64; layers * 2 * b];
        for (n, s) in sessions.iter().enumerate() {
            for (l, layer) in s.layers.iter().enumerate() {
                let (first, second) = match layer {
                    LayerState::Gdn(g) => (g.conv.ptr(), g.recurrent.ptr()),
                    LayerState::Attention(_) => (s.kv.table_ptr(), s.kv.table_ptr()),
                };
                table[l * 2 * b + n] = first;
                table[l * 2 * b + b + n] = second;
            }
        }
        table
    }
}

/// The length of one token's QSA selection list: the most positions it attends to: max_blocks whole blocks (the budget,
/// a multiple of cr as the config checks) plus a partial tail of fewer than cr positions.
pub fn selection_stride(q: &QsaConfig) -> usize {
    q.max_blocks() * q.compress_ratio + q.compress_ratio - 1
}

/// A captured decode step: replayed per token with the token id and position read from
/// [`CudaSession::step_io`].
pub struct DecodeGraph {
    pub graph: cudarc::driver::CudaGraph,
    /// The logits row `[V]` the graph writes (in the workspace).
    pub logits: u64,
    /// The sum of the KV caches' generations when captured.
    pub generation: u64,
    /// The rope_delta baked into the graph (a later image changes it: captured again).
    pub rope_delta: i64,
}

/// The decode step's inputs and output on the device, at fixed addresses that a captured
/// graph reads: the token ids of a batch of at most [`MATVEC_MAX_TOKENS`], the position of its
/// first token, and the greedy next token the device argmax writes. One host→device copy fills
/// the inputs of a step.
pub struct StepIo {
    /// i32 slots: ids `[0, MATVEC_MAX_TOKENS)`, then the position, then the next token.
    slots: DevBuf<i32>,
}

impl StepIo {
    const IDS: usize = 0;
    const POSITION: usize = MATVEC_MAX_TOKENS;
    const NEXT_TOKEN: usize = MATVEC_MAX_TOKENS + 1;

    fn new(dev: &Device) -> Result<Self> {
        Ok(StepIo {
            slots: dev.zeros(16)?,
        })
    }

    /// The address of the ids (i32).
    pub fn ids(&self) -> u64 {
        self.slots.at(Self::IDS)
    }

    /// The address of the position of the step's first token (i32).
    pub fn position(&self) -> u64 {
        self.slots.at(Self::POSITION)
    }

    /// The address the device argmax writes the greedy token to (i32).
    pub fn next_token(&self) -> u64 {
        self.slots.at(Self::NEXT_TOKEN)
    }

    /// Writes the ids of a batch of at most [`MATVEC_MAX_TOKENS`] tokens.
    pub fn write_ids(&mut self, dev: &Device, ids: &[i32]) -> Result<()> {
        debug_assert!(
            ids.len() <= MATVEC_MAX_TOKENS,
            "too many ids for a decode step"
        );
        dev.write_raw(self.ids(), ids)
    }

    /// Writes one token's id and position (one copy of the id slots and the position).
    pub fn write_step(&mut self, dev: &Device, id: u32, position: usize) -> Result<()> {
        let mut io = [0i32; Self::POSITION + 1];
        io[Self::IDS] = id as i32;
        io[Self::POSITION] = position as i32;
        dev.write_raw(self.ids(), &io)
    }
}

/// The most positions a layer's flash-decoding partials (and QSA indexer cache) can cover at
/// `context` tokens, however they grew (`attention::reserve` grows to max(needed, 2·capacity,
/// 256)): max(256, 2·(context − 1)).
pub fn kv_capacity_bound(context: usize) -> usize {
    (2 * context.saturating_sub(1)).max(context).max(256)
}

/// Device bytes one sequence's state holds at `context` tokens outside the KV block pool (GDN
/// and PLE state, the flash-decoding partials or QSA indexer keys at the capacity
/// [`kv_capacity_bound`] gives, the block table); the session's own workspace is not included.
/// Its keys and values are blocks of the pool, counted there.
pub fn sequence_state_bytes(config: &ModelConfig, context: usize) -> usize {
    let a = &config.attention;
    let g = &config.gdn;
    let capacity = kv_capacity_bound(context);
    let mut floats = 0;
    for spec in &config.layers {
        floats += match spec.mixer {
            MixerKind::FullAttention => match &config.qsa {
                Some(q) => capacity * q.head_dim + capacity.div_ceil(q.compress_ratio) * q.head_dim,
                None => {
                    MATVEC_MAX_TOKENS
                        * a.num_heads
                        * capacity.div_ceil(crate::kernels::ATTN_SPLIT_KEYS)
                        * (a.head_dim + 2)
                }
            },
            MixerKind::LinearAttention => {
                (g.conv_kernel - 1) * g.conv_channels()
                    + g.num_value_heads * g.key_head_dim * g.value_head_dim
            }
        };
    }
    if let Some(ple) = &config.ple {
        let width = config.hyper.as_ref().map_or(1, |h| h.streams) * config.hidden_size;
        floats += ple.layers.len() * (ple.conv_kernel - 1) * ple.ngram_size * width;
    }
    let table = spindle_model::paged::blocks_for(config.max_position_embeddings);
    (floats + table) * std::mem::size_of::<f32>()
}

/// Blocks of the device argmax (`argmax_two_stage`).
pub const ARGMAX_BLOCKS: usize = 256;

/// The state of one sequence on one device.
pub struct CudaSession {
    /// Number of tokens already processed (the next token's position).
    pub position: usize,
    pub layers: Vec<LayerState>,
    /// The KV block table (every attention layer's keys and values of this sequence).
    pub kv: SeqKv,
    pub ple: Option<PleState>,
    /// Scratch for forward passes of at most `kernels::MATVEC_MAX_TOKENS` tokens (decode).
    pub workspace: DevBuf<u8>,
    /// The decode step's ids and position, read by the graph, and the device argmax's token.
    pub step_io: StepIo,
    /// The device argmax's per-block bests (values, then indices) and its finished-block
    /// counter (zero between launches): `2·ARGMAX_BLOCKS + 1` words.
    pub argmax_parts: DevBuf<u32>,
    pub graph: Option<DecodeGraph>,
    /// Graph capture failed once: decode runs eagerly from then on.
    pub graph_failed: bool,
    /// Rotary positions apart from the cache index after an image (rope_delta), and the
    /// images whose pads are still to come (shared docs `VISION.md` §4).
    pub rope: RopeCursor,
}

impl CudaSession {
    /// Bytes held by the caches and states on the device (KV blocks referenced, shared ones
    /// included, QSA indexer keys, GDN conv and recurrent states, PLE conv rows), as the CPU
    /// session counts them.
    pub fn state_bytes(&self) -> usize {
        let blocks = self.kv.blocks().len() * self.kv.table.pool().block_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) => kv
                    .indexer
                    .as_ref()
                    .map_or(0, |i| i.raw_keys.len() + i.block_keys.len()),
                LayerState::Gdn(s) => s.conv.len() + s.recurrent.len(),
            })
            .sum();
        let ple = self
            .ple
            .as_ref()
            .map_or(0, |p| p.conv.iter().map(|c| c.len()).sum());
        blocks + (layers + ple) * std::mem::size_of::<f32>()
    }

    /// The sum of the KV caches' generations (changes when any layer's capacity grows).
    pub fn cache_generation(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(c) => c.generation,
                LayerState::Gdn(_) => 0,
            })
            .sum()
    }
}

impl CudaSession {
    pub(crate) fn new(
        dev: &Device,
        config: &ModelConfig,
        pool: &Arc<KvPool>,
        workspace_bytes: usize,
    ) -> Result<Self> {
        let g = &config.gdn;
        let layers = config
            .layers
            .iter()
            .map(|spec| {
                Ok(match spec.mixer {
                    MixerKind::FullAttention => LayerState::Attention(KvCache {
                        partials: dev.zeros(0)?,
                        capacity: 0,
                        generation: 0,
                        indexer: match config.qsa {
                            Some(_) => Some(IndexerCache {
                                raw_keys: dev.zeros(0)?,
                                block_keys: dev.zeros(0)?,
                                scores: dev.zeros(0)?,
                            }),
                            None => None,
                        },
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
                    history: dev.upload(&vec![ple.eos as i32; ple.ngram_size - 1])?,
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
            kv: SeqKv::new(dev, pool, config.max_position_embeddings)?,
            ple,
            workspace: dev.zeros(workspace_bytes)?,
            step_io: StepIo::new(dev)?,
            argmax_parts: dev.zeros(2 * ARGMAX_BLOCKS + 1)?,
            graph: None,
            graph_failed: false,
            rope: RopeCursor::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_capacity_bound_covers_every_growth_order() {
        // Grow as attention::reserve does, in steps of 1, 7 and 1000 tokens.
        for step in [1usize, 7, 1000] {
            let mut capacity = 0usize;
            let mut context = 0usize;
            while context < 20_000 {
                context += step;
                if context > capacity {
                    capacity = context.max(capacity * 2).max(256);
                }
                assert!(
                    capacity <= kv_capacity_bound(context),
                    "step {step} at {context}"
                );
            }
        }
    }

    #[test]
    fn sequence_state_grows_with_the_context() {
        let config = ModelConfig::from_dir(&spindle_testkit::fixture("qwen3_5_moe")).unwrap();
        let small = sequence_state_bytes(&config, 1);
        let large = sequence_state_bytes(&config, 10_000);
        assert!(small > 0 && large > small, "{small} then {large}");
    }
}
