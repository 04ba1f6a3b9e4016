//! The CPU's KV block pool: host storage for `spindle_model::paged`'s blocks. One pool per
//! loaded model; every session's keys and values live in it, reached through the session's
//! [`BlockTable`]. A block holds [`BLOCK_TOKENS`] tokens of every attention layer, laid out
//! `[attention layer][keys | values][token in block][n_kv · head_dim]`, so one block id serves
//! all layers (one table per sequence) and a layer's rows of a block are contiguous.
//!
//! Blocks are allocated the first time their id is handed out and kept for reuse after they
//! are freed (the pool's memory is its high-water mark, at most its capacity).
//!
//! One lock guards the counts and the storage. A layer's attention holds it while it writes the
//! step's rows and reads every sequence's blocks (in parallel, on rayon's threads, which never
//! take it themselves): forward passes of one engine on several threads take turns per layer.
//! A forward pass must not be started from inside a rayon job of another one (the lock is not
//! re-entrant).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use spindle_model::paged::{
    blocks_for, plan_write, BlockBook, BlockCounts, BlockId, PoolFull, BLOCK_TOKENS,
};
use spindle_model::{MixerKind, ModelConfig};

/// The blocks of one loaded model and their reference counts.
pub struct KvPool {
    inner: Mutex<PoolInner>,
    /// Attention layers of the model (each block holds all of them).
    layers: usize,
    /// Floats of one token's keys (or values) in one layer: n_kv · head_dim.
    row: usize,
}

/// The bookkeeping and the storage, under one lock.
pub(crate) struct PoolInner {
    book: BlockBook,
    /// `storage[id]`: block `id`'s floats (allocated when the id is first handed out).
    storage: Vec<Box<[f32]>>,
    block_floats: usize,
}

impl KvPool {
    /// A pool for `config`'s attention layers holding at most `budget_bytes` of blocks (at
    /// least one block). A model without attention layers gets an empty pool nothing uses.
    pub fn new(config: &ModelConfig, budget_bytes: u64) -> Arc<Self> {
        let layers = config
            .layers
            .iter()
            .filter(|l| l.mixer == MixerKind::FullAttention)
            .count();
        let row = config.attention.num_kv_heads * config.attention.head_dim;
        Self::with_shape(layers, row, budget_bytes)
    }

    /// A pool of blocks for `layers` attention layers of `row` floats per token's keys.
    fn with_shape(layers: usize, row: usize, budget_bytes: u64) -> Arc<Self> {
        let block_floats = layers * 2 * BLOCK_TOKENS * row;
        let capacity = match block_floats * 4 {
            0 => 0,
            bytes => (budget_bytes / bytes as u64).max(1) as usize,
        };
        Arc::new(Self {
            inner: Mutex::new(PoolInner {
                book: BlockBook::new(capacity),
                storage: Vec::new(),
                block_floats,
            }),
            layers,
            row,
        })
    }

    /// Bytes of one block (every attention layer's keys and values of `BLOCK_TOKENS` tokens).
    pub fn block_bytes(&self) -> usize {
        self.layers * 2 * BLOCK_TOKENS * self.row * 4
    }

    /// Bytes of one token's keys and values in every attention layer.
    pub fn token_bytes(&self) -> usize {
        self.layers * 2 * self.row * 4
    }

    /// Blocks in use, shared and free now.
    pub fn counts(&self) -> BlockCounts {
        self.lock().book.counts(self.block_bytes())
    }

    /// References to block `id` now (0 when free).
    pub fn refs(&self, id: BlockId) -> u32 {
        self.lock().book.refs(id)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolInner> {
        // A panic elsewhere cannot leave the counts half-updated: every update is one call.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where layer `layer`'s keys (or values) sit in a block.
    fn span(&self, layer: usize, values: bool) -> std::ops::Range<usize> {
        let len = BLOCK_TOKENS * self.row;
        let start = (layer * 2 + values as usize) * len;
        start..start + len
    }
}

impl PoolInner {
    /// Allocates storage for every id handed out so far.
    fn grow_storage(&mut self) {
        while self.storage.len() < self.book.made() {
            self.storage
                .push(vec![0.0; self.block_floats].into_boxed_slice());
        }
    }
}

/// References to blocks of one pool, in position order: a sequence's block table, or the
/// blocks a piece of the prefix cache pins. Cloning takes one more reference to each block;
/// dropping gives them back (a block is free again when its last reference goes).
pub struct BlockTable {
    pool: Arc<KvPool>,
    blocks: Vec<BlockId>,
}

impl BlockTable {
    pub fn new(pool: &Arc<KvPool>) -> Self {
        Self {
            pool: Arc::clone(pool),
            blocks: Vec::new(),
        }
    }

    /// A table of `blocks` of `pool`, each taking one more reference.
    fn retaining(pool: &Arc<KvPool>, blocks: &[BlockId]) -> Self {
        let mut inner = pool.lock();
        for &id in blocks {
            inner.book.retain(id);
        }
        Self {
            pool: Arc::clone(pool),
            blocks: blocks.to_vec(),
        }
    }

    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Bytes of the blocks referenced (shared ones included).
    pub fn bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes()
    }

    /// Makes the table ready for tokens `[from, to)` to be written (it holds at least `from`
    /// tokens): new blocks at its end, and a private copy of every shared block in the range
    /// (copy on write: a sequence never writes into a block another table references). All
    /// or nothing: when the pool is short, the table is unchanged.
    pub fn prepare_write(&mut self, from: usize, to: usize) -> Result<(), PoolFull> {
        if self.pool.layers == 0 {
            return Ok(());
        }
        let mut inner = self.pool.lock();
        let plan = plan_write(&mut inner.book, &self.blocks, from, to)?;
        inner.grow_storage();
        for (index, shared, copy) in plan.copies {
            let source = inner.storage[shared as usize].clone();
            inner.storage[copy as usize].copy_from_slice(&source);
            inner.book.release(shared);
            self.blocks[index] = copy;
        }
        self.blocks.extend(plan.appended);
        Ok(())
    }

    /// The references of blocks `[first, last)` (by index in this table), as a table. A
    /// model without attention layers has no blocks: its tables stay empty.
    fn slice(&self, first: usize, last: usize) -> BlockTable {
        if self.pool.layers == 0 {
            return BlockTable::new(&self.pool);
        }
        BlockTable::retaining(&self.pool, &self.blocks[first..last])
    }
}

impl Clone for BlockTable {
    fn clone(&self) -> Self {
        BlockTable::retaining(&self.pool, &self.blocks)
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        if self.blocks.is_empty() {
            return;
        }
        let mut inner = self.pool.lock();
        for &id in &self.blocks {
            inner.book.release(id);
        }
    }
}

impl fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockTable")
            .field("blocks", &self.blocks)
            .finish()
    }
}

/// One attention layer's view of the pool while a step runs (the pool locked).
pub(crate) struct LayerAccess<'p> {
    pool: &'p KvPool,
    inner: MutexGuard<'p, PoolInner>,
    /// The layer's index among the attention layers.
    layer: usize,
}

impl<'p> LayerAccess<'p> {
    pub(crate) fn new(pool: &'p KvPool, layer: usize) -> Self {
        Self {
            pool,
            inner: pool.lock(),
            layer,
        }
    }

    /// Writes `keys` and `values` (`[tokens, n_kv·d]` each) as the rows of positions
    /// `start..` in `table`'s blocks, which [`BlockTable::prepare_write`] made this table's own.
    pub(crate) fn write(&mut self, table: &BlockTable, start: usize, keys: &[f32], values: &[f32]) {
        let row = self.pool.row;
        for (t, (k, v)) in keys.chunks(row).zip(values.chunks(row)).enumerate() {
            let p = start + t;
            let id = table.blocks[p / BLOCK_TOKENS];
            debug_assert_eq!(self.inner.book.refs(id), 1, "a write into a shared block");
            let block = &mut self.inner.storage[id as usize];
            let at = (p % BLOCK_TOKENS) * row;
            block[self.pool.span(self.layer, false)][at..at + row].copy_from_slice(k);
            block[self.pool.span(self.layer, true)][at..at + row].copy_from_slice(v);
        }
    }

    /// The layer's keys (or values) of each of `table`'s blocks.
    pub(crate) fn blocks(&self, table: &BlockTable, values: bool) -> Vec<&[f32]> {
        let span = self.pool.span(self.layer, values);
        table
            .blocks
            .iter()
            .map(|&id| &self.inner.storage[id as usize][span.clone()])
            .collect()
    }
}

/// The attention layers' KV of tokens `[start, end)` of a sequence, held as references to the
/// sequence's blocks (no copy): a piece of the prefix cache. The first and last blocks may hold
/// rows outside the range; those are never read through this piece. qwen4_exp's indexer keys
/// are small (one `d_i` row per token and layer) and are kept as rows.
#[derive(Clone, Debug)]
pub struct PagedKv {
    pub start: usize,
    pub end: usize,
    /// The blocks covering `[start, end)`: entry `i` is the sequence's block `start / B + i`.
    blocks: BlockTable,
    /// Per model layer (`Some` for an attention layer with an indexer): its raw indexer keys
    /// of `[start, end)`, `[tokens, d_i]`.
    indexer: Vec<Option<Vec<f32>>>,
}

impl PagedKv {
    /// Blocks `[start / B, ceil(end / B))` of `table` and the indexer rows given.
    pub(crate) fn new(
        table: &BlockTable,
        start: usize,
        end: usize,
        indexer: Vec<Option<Vec<f32>>>,
    ) -> Self {
        Self {
            start,
            end,
            blocks: table.slice(start / BLOCK_TOKENS, blocks_for(end)),
            indexer,
        }
    }

    pub fn tokens(&self) -> usize {
        self.end - self.start
    }

    /// Bytes this piece holds: the whole blocks it references (a block it covers only in
    /// part is held whole, so a cache of short pieces is bounded by what it keeps from the
    /// pool; blocks shared with another piece or a sequence are counted by each, the pool
    /// counts each once) and its indexer rows.
    pub fn bytes(&self) -> usize {
        self.blocks.bytes() + self.indexer.iter().flatten().map(Vec::len).sum::<usize>() * 4
    }

    pub fn pool(&self) -> &Arc<KvPool> {
        &self.blocks.pool
    }

    /// The block ids referenced, in position order from block `start / B`.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks.blocks
    }

    /// The block holding position `p` (`start <= p < end`'s block range).
    pub(crate) fn block_at(&self, index: usize) -> Option<BlockId> {
        let first = self.start / BLOCK_TOKENS;
        index
            .checked_sub(first)
            .and_then(|i| self.blocks.blocks.get(i).copied())
    }

    pub(crate) fn indexer(&self) -> &[Option<Vec<f32>>] {
        &self.indexer
    }

    /// Splits at position `at` (`start <= at <= end`) into `[start, at)` and `[at, end)`; a
    /// block holding `at` mid-way is referenced by both.
    pub fn split_at(&self, at: usize) -> (PagedKv, PagedKv) {
        assert!(
            self.start <= at && at <= self.end,
            "split at {at} outside [{}, {})",
            self.start,
            self.end
        );
        let first = self.start / BLOCK_TOKENS;
        let cut = at - self.start;
        let part = |from: usize, to: usize| -> Vec<Option<Vec<f32>>> {
            self.indexer
                .iter()
                .map(|rows| {
                    rows.as_ref().map(|r| {
                        let width = r.len().checked_div(self.tokens()).unwrap_or(0);
                        r[from * width..to * width].to_vec()
                    })
                })
                .collect()
        };
        let head = PagedKv {
            start: self.start,
            end: at,
            blocks: self.blocks.slice(0, blocks_for(at) - first),
            indexer: part(0, cut),
        };
        let tail = PagedKv {
            start: at,
            end: self.end,
            blocks: self
                .blocks
                .slice(at / BLOCK_TOKENS - first, self.blocks.blocks.len()),
            indexer: part(cut, self.tokens()),
        };
        (head, tail)
    }
}

/// A block table for tokens `[0, end)` from `pieces` (contiguous from 0, in order): for each
/// block, the one of the last piece that covers it (a later piece's block holds the earlier
/// rows of that block too, for the same tokens), each taking a reference.
pub(crate) fn table_from_pieces(pool: &Arc<KvPool>, pieces: &[&PagedKv], end: usize) -> BlockTable {
    if pool.layers == 0 {
        return BlockTable::new(pool);
    }
    let mut ids: Vec<Option<BlockId>> = vec![None; blocks_for(end)];
    for piece in pieces {
        for (index, id) in ids.iter_mut().enumerate() {
            if index * BLOCK_TOKENS < piece.end {
                if let Some(block) = piece.block_at(index) {
                    *id = Some(block);
                }
            }
        }
    }
    let ids: Vec<BlockId> = ids
        .into_iter()
        .map(|id| id.expect("contiguous pieces cover every block"))
        .collect();
    BlockTable::retaining(pool, &ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows `[tokens, row]` whose values name their layer, position and keys/values.
    fn rows(layer: usize, from: usize, tokens: usize, row: usize, values: bool) -> Vec<f32> {
        (0..tokens * row)
            .map(|i| (layer * 10_000 + (from + i / row) * 10 + values as usize) as f32)
            .collect()
    }

    fn write(pool: &KvPool, table: &BlockTable, from: usize, tokens: usize, layers: usize) {
        for layer in 0..layers {
            let mut access = LayerAccess::new(pool, layer);
            let (k, v) = (
                rows(layer, from, tokens, pool.row, false),
                rows(layer, from, tokens, pool.row, true),
            );
            access.write(table, from, &k, &v);
        }
    }

    /// Every row of `[0, tokens)` of every layer, read through the table.
    fn read(pool: &KvPool, table: &BlockTable, tokens: usize, layers: usize) -> Vec<f32> {
        let mut out = Vec::new();
        for layer in 0..layers {
            let access = LayerAccess::new(pool, layer);
            for values in [false, true] {
                let blocks = access.blocks(table, values);
                for p in 0..tokens {
                    let at = (p % BLOCK_TOKENS) * pool.row;
                    out.extend_from_slice(&blocks[p / BLOCK_TOKENS][at..at + pool.row]);
                }
            }
        }
        out
    }

    fn expected(tokens: usize, row: usize, layers: usize) -> Vec<f32> {
        (0..layers)
            .flat_map(|l| [false, true].map(|v| rows(l, 0, tokens, row, v)))
            .flatten()
            .collect()
    }

    #[test]
    fn a_shared_block_is_copied_before_a_write_and_the_original_keeps_its_rows() {
        let (layers, row) = (2, 3);
        let pool = KvPool::with_shape(
            layers,
            row,
            8 * (layers * 2 * BLOCK_TOKENS * row * 4) as u64,
        );
        assert_eq!(pool.counts().capacity, 8);
        let mut a = BlockTable::new(&pool);
        // 21 tokens: one full block and 5 rows of the next.
        a.prepare_write(0, 21).unwrap();
        write(&pool, &a, 0, 21, layers);
        let b = a.clone();
        assert_eq!((pool.counts().used, pool.counts().shared), (2, 2));
        // The clone writes on: the full block stays shared, the partial one is copied first.
        let mut b = b;
        b.prepare_write(21, 40).unwrap();
        assert_eq!(b.blocks()[0], a.blocks()[0]);
        assert_ne!(b.blocks()[1], a.blocks()[1]);
        assert_eq!((pool.counts().used, pool.counts().shared), (4, 1));
        write(&pool, &b, 21, 19, layers);
        assert_eq!(read(&pool, &a, 21, layers), expected(21, row, layers));
        assert_eq!(read(&pool, &b, 40, layers), expected(40, row, layers));
        // A write the pool cannot hold changes nothing.
        let before = b.blocks().to_vec();
        let err = b.prepare_write(40, 40 + 9 * BLOCK_TOKENS).unwrap_err();
        assert_eq!((err.free, err.capacity), (4, 8));
        assert_eq!(b.blocks(), &before[..]);
        drop(a);
        assert_eq!((pool.counts().used, pool.counts().shared), (3, 0));
        drop(b);
        assert_eq!(pool.counts().used, 0);
    }

    #[test]
    fn pieces_split_and_rebuild_a_table_of_the_same_blocks() {
        let (layers, row) = (1, 2);
        let pool = KvPool::with_shape(layers, row, 1 << 20);
        let mut table = BlockTable::new(&pool);
        table.prepare_write(0, 45).unwrap();
        write(&pool, &table, 0, 45, layers);
        let whole = PagedKv::new(&table, 0, 45, vec![None]);
        // Mid-block and on an edge.
        for at in [20, 32] {
            let (head, tail) = whole.split_at(at);
            assert_eq!((head.end, tail.start), (at, at));
            let rebuilt = table_from_pieces(&pool, &[&head, &tail], 45);
            assert_eq!(rebuilt.blocks(), table.blocks());
            assert_eq!(read(&pool, &rebuilt, 45, layers), expected(45, row, layers));
        }
        drop((whole, table));
        assert_eq!(pool.counts().used, 0, "every reference given back");
    }
}
