//! The CUDA KV block pool: device storage for `spindle_model::paged`'s blocks (the CPU's
//! bookkeeping, the same 16-token blocks). One pool per loaded model, allocated once: per
//! attention layer one buffer of keys and one of values `[n_blocks, BLOCK_TOKENS, n_kv, d]` f32,
//! so a block id names the same block in every layer and a sequence has one block table. The
//! attention kernels find position `p` of a sequence at row
//! `table[p / BLOCK_TOKENS]·BLOCK_TOKENS + p % BLOCK_TOKENS` of the layer's buffers.
//!
//! A block is written only by the one table that references it: a table about to write into a
//! block shared with the prefix cache or another sequence copies it first (copy on write,
//! [`BlockTable::prepare_write`]).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use spindle_model::paged::{
    blocks_for, plan_write, BlockBook, BlockCounts, BlockId, PoolFull, BLOCK_TOKENS,
};
use spindle_model::{MixerKind, ModelConfig};

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};
use crate::kernels::Ptr;

/// Tokens of KV the default pool holds at most (when `--kv-pool` is not given): a bound so that
/// a small model does not take half of the device.
const DEFAULT_MAX_TOKENS: usize = 1 << 20;

/// The blocks of one loaded model on the device and their reference counts.
pub struct KvPool {
    book: Mutex<BlockBook>,
    /// Per model layer (`None` for a GDN layer): keys and values of every block.
    layers: Vec<Option<[DevBuf<f32>; 2]>>,
    /// Floats of one token's keys (or values) in one layer: n_kv · head_dim.
    row: usize,
    attention_layers: usize,
}

impl KvPool {
    /// A pool of `config`'s attention layers holding at most `budget_bytes` of blocks (at least
    /// one block), all allocated now.
    pub(crate) fn new(dev: &Device, config: &ModelConfig, budget_bytes: u64) -> Result<Self> {
        let attention_layers = config
            .layers
            .iter()
            .filter(|l| l.mixer == MixerKind::FullAttention)
            .count();
        let row = config.attention.num_kv_heads * config.attention.head_dim;
        let block_bytes = attention_layers * 2 * BLOCK_TOKENS * row * 4;
        let blocks = match block_bytes {
            0 => 0,
            b => (budget_bytes / b as u64).max(1) as usize,
        };
        let layers = config
            .layers
            .iter()
            .map(|l| match l.mixer {
                MixerKind::FullAttention => Ok(Some([
                    dev.zeros::<f32>(blocks * BLOCK_TOKENS * row)?,
                    dev.zeros::<f32>(blocks * BLOCK_TOKENS * row)?,
                ])),
                MixerKind::LinearAttention => Ok(None),
            })
            .collect::<Result<Vec<_>>>()
            .map_err(|e| {
                CudaError::Unsupported(format!(
                    "the KV block pool of {blocks} blocks ({} MiB) does not fit the device: {e}",
                    (blocks * block_bytes) >> 20
                ))
            })?;
        tracing::info!(
            blocks,
            tokens = blocks * BLOCK_TOKENS,
            mib = (blocks * block_bytes) >> 20,
            "KV block pool on the device"
        );
        Ok(KvPool {
            book: Mutex::new(BlockBook::new(blocks)),
            layers,
            row,
            attention_layers,
        })
    }

    /// The pool's size when none is given: half the device memory free now (after the weights),
    /// at most [`DEFAULT_MAX_TOKENS`] tokens' blocks.
    pub(crate) fn default_bytes(config: &ModelConfig, free_device_bytes: usize) -> u64 {
        let token = Self::token_bytes_of(config);
        ((free_device_bytes / 2) as u64).min((DEFAULT_MAX_TOKENS * token) as u64)
    }

    fn token_bytes_of(config: &ModelConfig) -> usize {
        let attention = config
            .layers
            .iter()
            .filter(|l| l.mixer == MixerKind::FullAttention)
            .count();
        attention * 2 * config.attention.num_kv_heads * config.attention.head_dim * 4
    }

    /// Bytes of one block (every attention layer's keys and values of `BLOCK_TOKENS` tokens).
    pub fn block_bytes(&self) -> usize {
        self.token_bytes() * BLOCK_TOKENS
    }

    /// Bytes of one token's keys and values in every attention layer.
    pub fn token_bytes(&self) -> usize {
        self.attention_layers * 2 * self.row * 4
    }

    /// Blocks in use, shared and free now.
    pub fn counts(&self) -> BlockCounts {
        self.lock().counts(self.block_bytes())
    }

    /// References to block `id` now (0 when free).
    pub fn refs(&self, id: BlockId) -> u32 {
        self.lock().refs(id)
    }

    fn lock(&self) -> MutexGuard<'_, BlockBook> {
        // Every update of the book is one call: a panic elsewhere cannot leave it half done.
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Layer `layer`'s keys and values of every block (`None` for a GDN layer).
    pub(crate) fn layer(&self, layer: usize) -> Option<(Ptr<f32>, Ptr<f32>)> {
        self.layers[layer].as_ref().map(|[k, v]| (k.arg(), v.arg()))
    }

    /// Device address of the row of block `id`, row `r` in layer `layer` (keys or values).
    fn row_addr(&self, layer: usize, values: bool, id: BlockId, r: usize) -> u64 {
        let bufs = self.layers[layer]
            .as_ref()
            .expect("an attention layer's rows");
        bufs[values as usize].at((id as usize * BLOCK_TOKENS + r) * self.row)
    }

    /// Copies block `from` to block `to` in every attention layer.
    fn copy_block(&self, dev: &Device, from: BlockId, to: BlockId) -> Result<()> {
        let bytes = BLOCK_TOKENS * self.row * 4;
        for (n, layer) in self.layers.iter().enumerate() {
            if layer.is_some() {
                for values in [false, true] {
                    dev.copy_raw(
                        self.row_addr(n, values, from, 0),
                        self.row_addr(n, values, to, 0),
                        bytes,
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KvPool({:?})", self.counts())
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
        let mut book = pool.lock();
        for &id in blocks {
            book.retain(id);
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

    /// Makes the table ready for tokens `[from, to)` to be written (it holds at least `from`
    /// tokens): new blocks at its end, and a private copy (on `dev`'s stream) of every shared
    /// block in the range. All or nothing: when the pool is short, the table is unchanged.
    /// Returns the index of the first entry that changed (the table's length when none did).
    pub(crate) fn prepare_write(&mut self, dev: &Device, from: usize, to: usize) -> Result<usize> {
        if self.pool.attention_layers == 0 {
            return Ok(self.blocks.len());
        }
        let plan = {
            let mut book = self.pool.lock();
            plan_write(&mut book, &self.blocks, from, to).map_err(CudaError::KvPoolFull)?
        };
        let mut first = self.blocks.len();
        for &(index, shared, copy) in &plan.copies {
            if let Err(e) = self.pool.copy_block(dev, shared, copy) {
                let mut book = self.pool.lock();
                for &(_, _, c) in &plan.copies {
                    book.release(c);
                }
                for &a in &plan.appended {
                    book.release(a);
                }
                return Err(e);
            }
            first = first.min(index);
        }
        {
            let mut book = self.pool.lock();
            for &(index, shared, copy) in &plan.copies {
                book.release(shared);
                self.blocks[index] = copy;
            }
        }
        self.blocks.extend(plan.appended);
        Ok(first)
    }

    /// The references of blocks `[first, last)` (by index in this table), as a table.
    fn slice(&self, first: usize, last: usize) -> BlockTable {
        BlockTable::retaining(&self.pool, &self.blocks[first..last])
    }

    /// Calls `f(block, first row in the block, rows)` for each run of positions `[from, to)`
    /// that lies in one block, entry 0 of this table being block `base` of the sequence (the
    /// table covers `to`).
    pub(crate) fn runs(
        &self,
        base: usize,
        from: usize,
        to: usize,
        mut f: impl FnMut(BlockId, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let mut p = from;
        while p < to {
            let r = p % BLOCK_TOKENS;
            let n = (BLOCK_TOKENS - r).min(to - p);
            f(self.blocks[p / BLOCK_TOKENS - base], r, n)?;
            p += n;
        }
        Ok(())
    }

    /// Device address of layer `layer`'s row `r` of block `id`.
    pub(crate) fn row_addr(&self, layer: usize, values: bool, id: BlockId, r: usize) -> u64 {
        self.pool.row_addr(layer, values, id, r)
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
        let mut book = self.pool.lock();
        for &id in &self.blocks {
            book.release(id);
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

/// A sequence's KV: its block table and the table's device copy, which the attention kernels
/// (and captured graphs) read. The device copy has room for the model's whole context, so its
/// address never changes as the sequence grows.
pub struct SeqKv {
    pub(crate) table: BlockTable,
    pub(crate) device: DevBuf<i32>,
}

impl SeqKv {
    pub(crate) fn new(dev: &Device, pool: &Arc<KvPool>, max_tokens: usize) -> Result<Self> {
        Ok(SeqKv {
            table: BlockTable::new(pool),
            device: dev.zeros::<i32>(blocks_for(max_tokens).max(1))?,
        })
    }

    /// The device table's address (i32 block ids).
    pub fn table_ptr(&self) -> u64 {
        self.device.ptr()
    }

    /// Blocks referenced, in position order.
    pub fn blocks(&self) -> &[BlockId] {
        self.table.blocks()
    }

    /// Makes the table ready for tokens `[from, to)` (copy on write of shared blocks, new blocks
    /// at the end) and updates its device copy. All or nothing.
    pub(crate) fn prepare_write(&mut self, dev: &Device, from: usize, to: usize) -> Result<()> {
        if blocks_for(to) > self.device.len() {
            return Err(CudaError::Unsupported(format!(
                "{to} tokens exceed the block table of {} tokens (the model's context)",
                self.device.len() * BLOCK_TOKENS
            )));
        }
        let before = self.table.blocks.len();
        let first = self.table.prepare_write(dev, from, to)?;
        if first < self.table.blocks.len() || before != self.table.blocks.len() {
            self.upload(dev, first)?;
        }
        Ok(())
    }

    /// Replaces the table by `table` (a restored prefix's blocks) and uploads it.
    pub(crate) fn set(&mut self, dev: &Device, table: BlockTable) -> Result<()> {
        if table.blocks.len() > self.device.len() {
            return Err(CudaError::Unsupported(format!(
                "a cached prefix of {} blocks exceeds the block table of {} blocks",
                table.blocks.len(),
                self.device.len()
            )));
        }
        self.table = table;
        self.upload(dev, 0)
    }

    /// Copies entries `first..` of the table to the device.
    fn upload(&self, dev: &Device, first: usize) -> Result<()> {
        let ids: Vec<i32> = self.table.blocks[first..]
            .iter()
            .map(|&b| b as i32)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        dev.write_raw(self.device.at(first), &ids)
    }
}

/// The attention layers' KV of tokens `[start, end)` of a sequence, held as references to the
/// sequence's blocks (no copy): a piece of the prefix cache on CUDA. The first and last blocks
/// may hold rows outside the range; those are never read through this piece.
#[derive(Clone)]
pub struct DeviceKv {
    start: usize,
    end: usize,
    /// The blocks covering `[start, end)`: entry `i` is the sequence's block `start / B + i`.
    blocks: BlockTable,
}

impl DeviceKv {
    /// Blocks `[start / B, ceil(end / B))` of `table`.
    pub(crate) fn new(table: &BlockTable, start: usize, end: usize) -> Self {
        DeviceKv {
            start,
            end,
            blocks: table.slice(start / BLOCK_TOKENS, blocks_for(end)),
        }
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn end(&self) -> usize {
        self.end
    }

    /// Bytes of the rows this piece stands for (every attention layer's keys and values of its
    /// tokens; a block shared with another piece or a sequence is counted by each, the pool
    /// counts it once).
    pub fn bytes(&self) -> usize {
        (self.end - self.start) * self.blocks.pool.token_bytes()
    }

    /// The block ids referenced, in position order from block `start / B`.
    pub fn blocks(&self) -> &[BlockId] {
        self.blocks.blocks()
    }

    /// The table of this piece's blocks, its entry 0 being block `start / B` of the sequence.
    pub(crate) fn table(&self) -> &BlockTable {
        &self.blocks
    }

    /// The pool the blocks are in.
    pub fn pool(&self) -> &Arc<KvPool> {
        self.blocks.pool()
    }

    /// The block at table index `index`, when this piece covers it.
    fn block_at(&self, index: usize) -> Option<BlockId> {
        let first = self.start / BLOCK_TOKENS;
        index
            .checked_sub(first)
            .and_then(|i| self.blocks.blocks.get(i).copied())
    }

    /// `[start, at)` and `[at, end)`; a block holding `at` mid-way is referenced by both.
    pub fn split_at(&self, at: usize) -> (DeviceKv, DeviceKv) {
        assert!(
            self.start <= at && at <= self.end,
            "split of a KV segment outside it"
        );
        let first = self.start / BLOCK_TOKENS;
        let head = DeviceKv {
            start: self.start,
            end: at,
            blocks: self.blocks.slice(0, blocks_for(at) - first),
        };
        let tail = DeviceKv {
            start: at,
            end: self.end,
            blocks: self
                .blocks
                .slice(at / BLOCK_TOKENS - first, self.blocks.blocks.len()),
        };
        (head, tail)
    }
}

impl fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceKv({}..{}, {} blocks)",
            self.start,
            self.end,
            self.blocks.blocks.len()
        )
    }
}

/// A block table for tokens `[0, end)` from `pieces` (contiguous from 0, in order): for each
/// block, the one of the last piece that covers it (a later piece's block holds the earlier
/// rows of that block too, for the same tokens), each taking a reference.
pub(crate) fn table_from_pieces(
    pool: &Arc<KvPool>,
    pieces: &[&DeviceKv],
    end: usize,
) -> Result<BlockTable> {
    let mut ids: Vec<Option<BlockId>> = vec![None; blocks_for(end)];
    for piece in pieces {
        if !Arc::ptr_eq(piece.pool(), pool) {
            return Err(CudaError::Unsupported(
                "a cached prefix's blocks belong to another model's KV pool".into(),
            ));
        }
        for (index, id) in ids.iter_mut().enumerate() {
            if index * BLOCK_TOKENS < piece.end {
                if let Some(block) = piece.block_at(index) {
                    *id = Some(block);
                }
            }
        }
    }
    let ids = ids
        .into_iter()
        .collect::<Option<Vec<BlockId>>>()
        .ok_or_else(|| {
            CudaError::Unsupported("cached prefix pieces leave a block uncovered".into())
        })?;
    Ok(BlockTable::retaining(pool, &ids))
}

/// Why a pool could not give blocks (for callers that make room and retry).
pub fn is_pool_full(e: &CudaError) -> Option<&PoolFull> {
    match e {
        CudaError::KvPoolFull(full) => Some(full),
        _ => None,
    }
}
