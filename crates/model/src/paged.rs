//! Paged KV bookkeeping shared by the backends: a pool of fixed-size blocks, each holding
//! [`BLOCK_TOKENS`] tokens' keys and values of every attention layer, handed out by id with a
//! reference count. A sequence's KV is a block table (its block ids in position order: token
//! `p` lives in block `table[p / BLOCK_TOKENS]`, row `p % BLOCK_TOKENS`); the prefix cache and
//! other sequences may reference the same blocks read-only. A block is written only by a table
//! that holds its one reference: a table about to write into a shared block copies it first
//! (copy on write). Storage is the backend's (host memory on the CPU); this module only counts.

/// Tokens per block. Small enough that a 200-token prefix wastes at most 15 rows and a
/// partially filled block is cheap to copy; large enough that attention reads 16 consecutive
/// rows (16·n_kv·head_dim floats) from one allocation before it follows the table again.
pub const BLOCK_TOKENS: usize = 16;

/// A block's index in its pool.
pub type BlockId = u32;

/// Blocks needed to hold `tokens` tokens.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_TOKENS)
}

/// The pool's occupancy at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    /// Blocks the pool may hand out (its memory budget over the bytes of one block).
    pub capacity: usize,
    /// Blocks with at least one reference.
    pub used: usize,
    /// Blocks with more than one reference (shared by sequences and the prefix cache).
    pub shared: usize,
    /// Bytes of one block.
    pub block_bytes: usize,
}

impl BlockCounts {
    /// Blocks that can still be handed out.
    pub fn free(&self) -> usize {
        self.capacity - self.used
    }
}

/// Why a block could not be handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the KV block pool is full: {wanted} more blocks of {BLOCK_TOKENS} tokens wanted, {free} free \
     of {capacity}"
)]
pub struct PoolFull {
    pub wanted: usize,
    pub free: usize,
    pub capacity: usize,
}

/// Reference counts of a pool's blocks and the list of free ones. Ids are handed out from
/// the free list first (the storage behind them is reused), then new ones up to `capacity`.
#[derive(Debug)]
pub struct BlockBook {
    /// References per block id ever handed out.
    refs: Vec<u32>,
    /// Ids with no reference, reused first.
    free: Vec<BlockId>,
    capacity: usize,
    used: usize,
    shared: usize,
}

impl BlockBook {
    pub fn new(capacity: usize) -> Self {
        Self {
            refs: Vec::new(),
            free: Vec::new(),
            capacity,
            used: 0,
            shared: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks that can still be handed out.
    pub fn free(&self) -> usize {
        self.capacity - self.used
    }

    /// Block ids ever handed out (the backend's storage holds this many blocks).
    pub fn made(&self) -> usize {
        self.refs.len()
    }

    pub fn counts(&self, block_bytes: usize) -> BlockCounts {
        BlockCounts {
            capacity: self.capacity,
            used: self.used,
            shared: self.shared,
            block_bytes,
        }
    }

    /// References to `id` (0 for a free block).
    pub fn refs(&self, id: BlockId) -> u32 {
        self.refs[id as usize]
    }

    /// Refuses a request for `wanted` new blocks that the pool cannot meet.
    pub fn check_free(&self, wanted: usize) -> Result<(), PoolFull> {
        if wanted > self.free() {
            return Err(PoolFull {
                wanted,
                free: self.free(),
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// A block with one reference; `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.used == self.capacity {
            return None;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.refs.push(0);
                (self.refs.len() - 1) as BlockId
            }
        };
        debug_assert_eq!(self.refs[id as usize], 0, "a free block has no reference");
        self.refs[id as usize] = 1;
        self.used += 1;
        Some(id)
    }

    /// One more reference to `id`, which must be in use.
    pub fn retain(&mut self, id: BlockId) {
        let refs = &mut self.refs[id as usize];
        assert!(*refs > 0, "block {id} retained while free");
        *refs += 1;
        if *refs == 2 {
            self.shared += 1;
        }
    }

    /// Drops one reference to `id`; the block is free again when none is left.
    pub fn release(&mut self, id: BlockId) {
        let refs = &mut self.refs[id as usize];
        assert!(*refs > 0, "block {id} released while free");
        *refs -= 1;
        match *refs {
            0 => {
                self.used -= 1;
                self.free.push(id);
            }
            1 => self.shared -= 1,
            _ => {}
        }
    }
}

/// What a table must do before it writes tokens `[from, to)`: the blocks to add at its end
/// and, for each shared block in that range, a private copy to take its place.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WritePlan {
    /// `(index in the table, shared block, its private copy)`: copy the storage, then the
    /// table's entry becomes the copy and the shared block loses this table's reference.
    pub copies: Vec<(usize, BlockId, BlockId)>,
    /// Blocks appended to the table.
    pub appended: Vec<BlockId>,
}

/// Makes `table` (a block table holding at least `from` tokens) ready for tokens `[from, to)`
/// to be written: every block of that range exists and holds only this table's reference.
/// All or nothing: when the pool cannot give every block needed, nothing changes.
pub fn plan_write(
    book: &mut BlockBook,
    table: &[BlockId],
    from: usize,
    to: usize,
) -> Result<WritePlan, PoolFull> {
    if to <= from {
        return Ok(WritePlan::default());
    }
    let (first, last) = (from / BLOCK_TOKENS, blocks_for(to));
    let shared: Vec<usize> = (first..last.min(table.len()))
        .filter(|&i| book.refs(table[i]) > 1)
        .collect();
    let appended = last.saturating_sub(table.len());
    book.check_free(shared.len() + appended)?;
    let mut fresh = || book.allocate().expect("checked free");
    let copies = shared.iter().map(|&i| (i, table[i], fresh())).collect();
    let appended = (0..appended).map(|_| fresh()).collect();
    Ok(WritePlan { copies, appended })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_count_and_free_blocks_are_reused() {
        let mut book = BlockBook::new(3);
        let a = book.allocate().unwrap();
        let b = book.allocate().unwrap();
        book.retain(a);
        assert_eq!(
            book.counts(8),
            BlockCounts {
                capacity: 3,
                used: 2,
                shared: 1,
                block_bytes: 8
            }
        );
        book.release(a);
        book.release(b);
        assert_eq!((book.counts(8).used, book.counts(8).shared), (1, 0));
        // b's id comes back before a new one is made.
        assert_eq!(book.allocate(), Some(b));
        assert!(book.allocate().is_some());
        assert_eq!(book.allocate(), None, "capacity 3");
        assert_eq!(book.made(), 3);
        book.release(a);
        assert_eq!(book.refs(a), 0);
        assert_eq!(book.free(), 1);
    }

    #[test]
    fn a_write_copies_shared_blocks_and_appends_new_ones() {
        let mut book = BlockBook::new(4);
        let table = vec![book.allocate().unwrap(), book.allocate().unwrap()];
        // Another owner of the second (partially filled) block.
        book.retain(table[1]);
        // 20 tokens held; writing 20..40 touches block 1 (shared) and needs block 2.
        let plan = plan_write(&mut book, &table, 20, 40).unwrap();
        assert_eq!(plan.copies.len(), 1);
        assert_eq!((plan.copies[0].0, plan.copies[0].1), (1, table[1]));
        assert_eq!(plan.appended.len(), 1);
        assert_eq!(book.free(), 0);
        // Nothing changes when the pool cannot give all of it.
        let mut book = BlockBook::new(3);
        let table = vec![book.allocate().unwrap(), book.allocate().unwrap()];
        book.retain(table[1]);
        let err = plan_write(&mut book, &table, 20, 40).unwrap_err();
        assert_eq!((err.wanted, err.free), (2, 1));
        assert_eq!(book.free(), 1);
        // A write on a block edge leaves the full shared block alone.
        let plan = plan_write(&mut book, &table, 32, 33).unwrap();
        assert!(plan.copies.is_empty());
        assert_eq!(plan.appended.len(), 1);
    }
}
