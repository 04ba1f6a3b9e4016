//! One sequence's state: its block table into the model's KV pool (every attention layer's
//! keys and values), qwen4_exp's indexer keys, and the conv and recurrent state of each GDN
//! layer (f32).

use std::sync::Arc;

use spindle_model::mrope::RopeCursor;
use spindle_model::{MixerKind, ModelConfig};

use crate::paged::{table_from_pieces, BlockTable, KvPool, PagedKv};
use crate::qwen4::IndexerCache;

/// An attention layer's own state beside the keys and values (which live in the pool, reached
/// through [`Session::kv`]): qwen4_exp's indexer keys, a row per token (small next to the KV
/// rows, and only this family has them, so they stay with the sequence).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
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

/// The state of one sequence. Cloning it snapshots the sequence: the clone shares every KV
/// block, and whichever of the two writes into a shared block first copies it.
#[derive(Clone, Debug)]
pub struct Session {
    /// Number of tokens already processed (the next token's position).
    pub position: usize,
    /// Keys and values of tokens `[0, position)` of every attention layer: token `p` in block
    /// `kv.blocks()[p / BLOCK_TOKENS]` (blocks past the position may be reserved ahead).
    pub kv: BlockTable,
    pub layers: Vec<LayerState>,
    pub ple: Option<PleState>,
    /// Why the state is incomplete, after a step failed part-way (no further steps run).
    pub broken: Option<String>,
    /// Rotary positions apart from the cache index after an image (rope_delta), and the
    /// images whose pads are still to come (shared docs `VISION.md` §4).
    pub rope: RopeCursor,
}

impl Session {
    /// An empty session whose KV blocks come from `pool` (the engine's).
    pub fn new(config: &ModelConfig, pool: &Arc<KvPool>) -> Self {
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
            kv: BlockTable::new(pool),
            layers,
            ple,
            broken: None,
            rope: RopeCursor::default(),
        }
    }

    /// Bytes held by the caches and states (every KV block the session references, shared
    /// ones included).
    pub fn state_bytes(&self) -> usize {
        self.kv.bytes()
            + self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Attention(kv) => {
                        (kv.indexer.raw_keys.len() + kv.indexer.block_keys.len()) * 4
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

/// One attention layer's rows for a run of tokens, `[tokens, width]` each: keys, values and
/// (qwen4_exp) the QSA indexer's raw keys. The indexer's pooled block keys are not kept: they
/// are a function of the raw keys and are recomputed when next needed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvRows {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
    pub indexer_keys: Vec<f32>,
}

impl KvRows {
    fn floats(&self) -> usize {
        self.keys.len() + self.values.len() + self.indexer_keys.len()
    }

    /// Rows `[from, to)` of `rows` holding `tokens` tokens.
    fn slice(rows: &[f32], tokens: usize, from: usize, to: usize) -> Vec<f32> {
        let width = rows.len().checked_div(tokens).unwrap_or(0);
        rows[from * width..to * width].to_vec()
    }
}

/// The attention layers' rows of tokens `[start, end)` of a sequence, copied out: a piece of a
/// prefix that is valid at any cut (each token's KV row depends only on the tokens before it).
/// `layers` follows the model's layers: `Some` for an attention layer, `None` for a GDN layer.
/// The layout of CUDA's prefix pieces kept on the host; the CPU's own pieces are references to
/// its KV blocks ([`PagedKv`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KvSegment {
    pub start: usize,
    pub end: usize,
    pub layers: Vec<Option<KvRows>>,
}

impl KvSegment {
    pub fn tokens(&self) -> usize {
        self.end - self.start
    }

    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(KvRows::floats)
            .sum::<usize>()
            * 4
    }

    /// Splits at position `at` (`start <= at <= end`) into `[start, at)` and `[at, end)`.
    pub fn split_at(&self, at: usize) -> (KvSegment, KvSegment) {
        assert!(
            self.start <= at && at <= self.end,
            "split at {at} outside [{}, {})",
            self.start,
            self.end
        );
        let (tokens, cut) = (self.tokens(), at - self.start);
        let part = |from: usize, to: usize| {
            self.layers
                .iter()
                .map(|l| {
                    l.as_ref().map(|r| KvRows {
                        keys: KvRows::slice(&r.keys, tokens, from, to),
                        values: KvRows::slice(&r.values, tokens, from, to),
                        indexer_keys: KvRows::slice(&r.indexer_keys, tokens, from, to),
                    })
                })
                .collect()
        };
        (
            KvSegment {
                start: self.start,
                end: at,
                layers: part(0, cut),
            },
            KvSegment {
                start: at,
                end: self.end,
                layers: part(cut, tokens),
            },
        )
    }
}

/// The state a sequence has only exactly at `position`: every GDN layer's conv and recurrent
/// state (`None` for an attention layer) and qwen4_exp's PLE state. It cannot be cut or moved:
/// resuming from it anywhere but `position` would be wrong.
#[derive(Clone, Debug)]
pub struct BoundaryState {
    pub position: usize,
    pub layers: Vec<Option<GdnState>>,
    pub ple: Option<PleState>,
}

impl BoundaryState {
    pub fn bytes(&self) -> usize {
        let gdn: usize = self
            .layers
            .iter()
            .flatten()
            .map(|s| s.conv.len() + s.recurrent.len())
            .sum();
        let ple: usize = self
            .ple
            .as_ref()
            .map_or(0, |p| p.conv.iter().map(Vec::len).sum());
        (gdn + ple) * 4
    }
}

impl Session {
    /// The attention layers' KV of tokens `[from, position)`: references to the session's
    /// blocks (no copy; the session copies a shared block before it writes into it again) and
    /// qwen4_exp's indexer rows. Refused for a broken session (its state is incomplete) and for
    /// `from` past the position.
    pub fn capture_kv(&self, from: usize) -> Result<PagedKv, String> {
        self.check_capturable()?;
        if from > self.position {
            return Err(format!(
                "KV rows from position {from} asked of a session at position {}",
                self.position
            ));
        }
        let tokens = self.position;
        let indexer = self
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Attention(kv) if !kv.indexer.raw_keys.is_empty() => {
                    Some(KvRows::slice(&kv.indexer.raw_keys, tokens, from, tokens))
                }
                _ => None,
            })
            .collect();
        Ok(PagedKv::new(&self.kv, from, tokens, indexer))
    }

    /// The GDN and PLE state at the session's position.
    pub fn capture_boundary(&self) -> Result<BoundaryState, String> {
        self.check_capturable()?;
        Ok(BoundaryState {
            position: self.position,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Gdn(s) => Some(s.clone()),
                    LayerState::Attention(_) => None,
                })
                .collect(),
            ple: self.ple.clone(),
        })
    }

    fn check_capturable(&self) -> Result<(), String> {
        if let Some(cause) = &self.broken {
            return Err(format!(
                "a broken session's state cannot be cached ({cause})"
            ));
        }
        // A restored session starts at delta 0 with no image fed: state that depends on an
        // image is never cached (images queued but not reached yet do not count).
        if self.rope.images_started > 0 {
            return Err(
                "a session past an image's pads cannot be cached (its rotary positions are not its token positions)".into(),
            );
        }
        Ok(())
    }

    /// A session at `state.position` rebuilt from a prefix: the KV blocks of `segments` (which
    /// must run from 0 to the state's position without a gap, in order, from `pool`) mapped
    /// into its block table without a copy, and the boundary state. Its next step continues as
    /// the session the pieces were captured from would have; its first write into a block the
    /// pieces share (a prefix ending mid-block) copies that block first.
    pub fn restore(
        config: &ModelConfig,
        pool: &Arc<KvPool>,
        segments: &[&PagedKv],
        state: &BoundaryState,
    ) -> Result<Session, String> {
        let mut session = Session::new(config, pool);
        let layers = session.layers.len();
        let mut position = 0;
        for segment in segments {
            if segment.start != position {
                return Err(format!(
                    "prefix segments leave a gap: one ends at {position}, the next starts at {}",
                    segment.start
                ));
            }
            if !Arc::ptr_eq(segment.pool(), pool) {
                return Err("a prefix segment holds blocks of another model's KV pool".into());
            }
            if segment.indexer().len() != layers {
                return Err(format!(
                    "a prefix segment has {} layers but the model {layers}",
                    segment.indexer().len()
                ));
            }
            for (n, (layer, rows)) in session.layers.iter_mut().zip(segment.indexer()).enumerate() {
                match (layer, rows) {
                    (LayerState::Attention(kv), Some(rows)) => {
                        kv.indexer.raw_keys.extend_from_slice(rows);
                    }
                    (LayerState::Attention(_) | LayerState::Gdn(_), None) => {}
                    _ => return Err(format!("layer {n}'s kind differs in a prefix segment")),
                }
            }
            position = segment.end;
        }
        if position != state.position {
            return Err(format!(
                "prefix segments end at {position} but the boundary state is at {}",
                state.position
            ));
        }
        if state.layers.len() != layers || state.ple.is_some() != session.ple.is_some() {
            return Err("the boundary state does not fit the model's layers".into());
        }
        for (n, (layer, gdn)) in session.layers.iter_mut().zip(&state.layers).enumerate() {
            match (layer, gdn) {
                (LayerState::Gdn(s), Some(g)) => *s = g.clone(),
                (LayerState::Attention(_), None) => {}
                _ => return Err(format!("layer {n}'s kind differs in the boundary state")),
            }
        }
        session.kv = table_from_pieces(pool, segments, position);
        session.ple.clone_from(&state.ple);
        session.position = position;
        Ok(session)
    }
}
