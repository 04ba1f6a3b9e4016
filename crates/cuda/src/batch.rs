//! Steps over many sequences at once ([`crate::CudaEngine::forward_batch_device`]): the
//! engine-level state they share (a scratch arena, decode graphs per batch-size bucket, a
//! dummy sequence that pads a bucket) and the two ways a step runs.
//!
//! - Eager: the items' ids concatenated, [`flow::body`] over all rows, each sequence's GDN,
//!   attention and PLE on its own state; a decode step (one token each) reads every
//!   sequence's state addresses and position from device tables ([`DecodeTables`]) so each
//!   mixer op is one launch for all of them.
//! - Graph: a decode step of B ≤ 128 sequences, on a model whose every mixer has batched
//!   kernels (no PLE, no QSA), replays a graph captured once per engine for the bucket
//!   (2, 4, …, 128 ≥ B). The graph reads the ids, positions and state tables from a device
//!   buffer the host refills each step (one copy); rows past B are a dummy sequence at
//!   position 0, whose results nobody reads. A bucket's graph is captured again only when a
//!   sequence's context outgrows the flash-decoding splits it was captured for.

use std::collections::HashMap;

use spindle_model::forward::LogitsFor;

use crate::device::DevBuf;
use crate::error::{CudaError, DriverContext, Result};
use crate::flow::{self, ensure_capacity, Logits, StepSeq};
use crate::kernels::{ATTN_SPLIT_KEYS, MATVEC_MAX_TOKENS};
use crate::session::{CudaSession, DecodeTables, LayerState, Seg};
use crate::{attention, gdn, CudaBatchItem, CudaEngine};

/// Batch-size buckets of the decode graphs.
pub const BUCKETS: [usize; 7] = [2, 4, 8, 16, 32, 64, 128];

/// Batched steps of decoding sequences of up to this many rows (every graph bucket) run their
/// dense projections, the LM head and (with experts not grouped) their MoE blocks through the
/// decode matvecs: one launch for all rows, each group of MATVEC_MAX_TOKENS rows staged and
/// dotted as a decode of those rows alone, so every row keeps its solo bits (see
/// `CudaEngine::set_batch_matvec_rows`). Larger steps take the tensor-core GEMM, whose rows are
/// not a solo run's: on the q8 fixtures one int8 activation code can flip and move a
/// sequence's logits by up to 0.055, far past the 1e-4 a batch may differ by.
pub const DEFAULT_MATVEC_ROWS: usize = 128;

/// Steps holding prompt chunks of more than MATVEC_MAX_TOKENS tokens run as decode matvecs
/// up to this many rows at most (above it the GEMMs, which such a chunk takes alone as well).
pub const PROMPT_MATVEC_ROWS: usize = 32;

/// Eager batched steps of at most this many rows use the engine's arena.
const ARENA_MAX_ROWS: usize = 256;

/// The smallest split count a graph is captured for (512 positions of context).
const MIN_GRAPH_SPLITS: usize = 512 / ATTN_SPLIT_KEYS;

/// The engine-level state of batched steps (under the engine's lock).
#[derive(Default)]
pub(crate) struct BatchState {
    /// Scratch of eager batched steps, grown (at the next step) when a step overflows it.
    arena: Option<DevBuf<u8>>,
    /// The least arena size the next eager step gets (doubled after an overflow).
    arena_min: usize,
    graphs: HashMap<usize, BucketGraph>,
    /// Graph capture failed once: batched decode runs eagerly from then on.
    graphs_failed: bool,
    /// The sequence that pads a bucket (its state is scribbled on, never read for results).
    dummy: Option<CudaSession>,
}

// SAFETY: the state holds driver handles (graphs, device allocations, a session's buffers)
// that cudarc keeps as raw pointers, which makes it !Send; the driver API may use them from
// any thread (cudarc binds the engine's context before each call), and every use of this
// state happens under the engine's lock, so moving it between threads is sound.
unsafe impl Send for BatchState {}

impl BatchState {
    /// Drops every bucket's graph (they are captured again on use).
    pub(crate) fn clear_graphs(&mut self) {
        self.graphs.clear();
    }

    /// Drops the graphs and the pad sequence (whose blocks belong to the engine's KV pool).
    pub(crate) fn reset(&mut self) {
        self.graphs.clear();
        self.dummy = None;
    }
}

/// Runs `f` with the device's small-batch matvec limit set to the engine's (at most
/// PROMPT_MATVEC_ROWS when `prompt`: an item feeds more than MATVEC_MAX_TOKENS tokens), and
/// whether the step decodes only (both reset after).
fn with_small_batch<T>(e: &CudaEngine, decode: bool, prompt: bool, f: impl FnOnce() -> T) -> T {
    let rows = if prompt {
        e.batch_matvec_rows.min(PROMPT_MATVEC_ROWS)
    } else {
        e.batch_matvec_rows
    };
    e.dev.set_small_batch_rows(rows);
    e.dev.set_decode_step(decode);
    let out = f();
    e.dev.set_small_batch_rows(0);
    e.dev.set_decode_step(false);
    out
}

/// A captured decode step for `bucket` rows.
struct BucketGraph {
    graph: cudarc::driver::CudaGraph,
    /// `[layers][2][bucket]` u64 state addresses, then `[bucket]` i32 positions, then
    /// `[bucket]` i32 ids: what the graph reads, refilled per step.
    io: DevBuf<u8>,
    /// The scratch the graph's kernels use (addresses baked in).
    _workspace: DevBuf<u8>,
    /// The logits `[bucket, V]` the graph writes.
    logits: u64,
    /// The flash-decoding splits it was captured for (contexts up to splits·ATTN_SPLIT_KEYS).
    splits: usize,
}

/// Byte layout of a bucket's io buffer.
struct IoLayout {
    tables: usize,
    positions: usize,
    ids: usize,
    bytes: usize,
}

impl IoLayout {
    fn new(layers: usize, rows: usize) -> Self {
        let tables = 0;
        let positions = layers * 2 * rows * 8;
        let ids = positions + rows * 4;
        IoLayout {
            tables,
            positions,
            ids,
            bytes: ids + rows * 4,
        }
    }
}

/// The host image of a decode step's io: state tables, positions, ids (rows past the
/// sessions: `pad`'s state, position 0, id 0).
fn io_image(
    sessions: &[&CudaSession],
    ids: &[u32],
    rows: usize,
    pad: Option<&CudaSession>,
) -> Vec<u8> {
    let mut all: Vec<&CudaSession> = sessions.to_vec();
    while all.len() < rows {
        all.push(pad.expect("a pad sequence when rows exceed the sessions"));
    }
    let layout = IoLayout::new(sessions[0].layers.len(), rows);
    let mut bytes = Vec::with_capacity(layout.bytes);
    for a in DecodeTables::addresses(&all) {
        bytes.extend_from_slice(&a.to_le_bytes());
    }
    for n in 0..rows {
        let pos = if n < sessions.len() {
            sessions[n].position as i32
        } else {
            0
        };
        bytes.extend_from_slice(&pos.to_le_bytes());
    }
    for n in 0..rows {
        let id = ids.get(n).copied().unwrap_or(0) as i32;
        bytes.extend_from_slice(&id.to_le_bytes());
    }
    debug_assert_eq!(bytes.len(), layout.bytes);
    bytes
}

/// ⌈largest KV cache capacity of `sessions` / ATTN_SPLIT_KEYS⌉ (at least 1).
fn max_splits(sessions: &[&CudaSession]) -> usize {
    sessions
        .iter()
        .flat_map(|s| s.layers.iter())
        .filter_map(|l| match l {
            LayerState::Attention(kv) => Some(kv.capacity),
            LayerState::Gdn(_) => None,
        })
        .max()
        .unwrap_or(0)
        .div_ceil(ATTN_SPLIT_KEYS)
        .max(1)
}

/// A first guess at the scratch bytes of a batched step of `tokens` rows (grown on overflow).
fn arena_guess(e: &CudaEngine, tokens: usize, splits: usize) -> usize {
    let a = &e.config.attention;
    let partials = tokens * a.num_heads * splits * (a.head_dim + 2) * 4 * e.config.layers.len();
    e.gpu
        .scratch_bytes(&e.config, tokens.max(MATVEC_MAX_TOKENS))
        + partials
        + (8 << 20)
}

/// One step over `items` (validated by the caller: at least two, none empty, at most
/// MAX_CHUNK tokens). Returns the wanted rows of every item, in item order, on the device.
pub(crate) fn forward_batch_device(
    e: &CudaEngine,
    items: &mut [CudaBatchItem<'_>],
) -> Result<Logits> {
    let mut state = e.batch.lock().unwrap_or_else(|p| p.into_inner());
    let decode = items.iter().all(|it| it.ids.len() == 1);
    if decode && e.graphs && !state.graphs_failed && items.len() <= BUCKETS[BUCKETS.len() - 1] {
        let graphable = e.config.ple.is_none()
            && gdn::batch_decode_supported(&e.dev, &e.config)
            && attention::batch_decode_supported(&e.dev, &e.config, MIN_GRAPH_SPLITS);
        if graphable {
            match graph_step(e, items, &mut state) {
                Ok(logits) => return Ok(logits),
                Err(err) => {
                    tracing::warn!(error = %err, "batched decode graph failed: decoding batches without graphs");
                    state.graphs_failed = true;
                    state.graphs.clear();
                }
            }
        }
    }
    eager_step(e, items, &mut state)
}

/// A decode step through the bucket's graph (captured first when missing or too short).
fn graph_step(
    e: &CudaEngine,
    items: &mut [CudaBatchItem<'_>],
    state: &mut BatchState,
) -> Result<Logits> {
    let dev = &e.dev;
    let b = items.len();
    let bucket = *BUCKETS
        .iter()
        .find(|&&k| k >= b)
        .expect("checked by the caller");
    for it in items.iter_mut() {
        let needed = it.session.position + 1;
        ensure_capacity(e, it.session, needed)?;
    }
    if state.dummy.is_none() {
        state.dummy = Some(e.new_session_with_capacity(1)?);
    }
    let max_position = items
        .iter()
        .map(|it| it.session.position)
        .max()
        .unwrap_or(0);
    let needed_splits = (max_position + 1).div_ceil(ATTN_SPLIT_KEYS);
    let stale = state
        .graphs
        .get(&bucket)
        .is_none_or(|g| g.splits < needed_splits);
    if stale {
        state.graphs.remove(&bucket);
        let splits = needed_splits.next_power_of_two().max(MIN_GRAPH_SPLITS);
        if !attention::batch_decode_supported(dev, &e.config, splits) {
            return Err(CudaError::Unsupported(format!(
                "a context of {} positions exceeds the batched decode kernels' shared memory",
                max_position + 1
            )));
        }
        let graph = capture(e, items, bucket, splits)?;
        state.graphs.insert(bucket, graph);
    }
    let g = state.graphs.get(&bucket).expect("captured above");
    let sessions: Vec<&CudaSession> = items.iter().map(|it| &*it.session).collect();
    let ids: Vec<u32> = items.iter().map(|it| it.ids[0]).collect();
    let image = io_image(&sessions, &ids, bucket, state.dummy.as_ref());
    dev.write_raw(g.io.ptr(), &image)?;
    g.graph
        .launch()
        .during("launching a batched decode graph")?;
    for it in items.iter_mut() {
        it.session.position += 1;
    }
    Ok(Logits {
        ptr: g.logits,
        rows: b,
        _owned: None,
    })
}

/// Captures the decode step of `bucket` rows, reading its io from a new buffer, with
/// `splits` flash-decoding splits; the scratch grows until the step fits.
fn capture(
    e: &CudaEngine,
    items: &mut [CudaBatchItem<'_>],
    bucket: usize,
    splits: usize,
) -> Result<BucketGraph> {
    let dev = &e.dev;
    let layout = IoLayout::new(e.config.layers.len(), bucket);
    let io = dev.zeros::<u8>(layout.bytes)?;
    let tables = DecodeTables {
        tables: io.ptr() + layout.tables as u64,
        positions: io.ptr() + layout.positions as u64,
        seqs: bucket,
        splits,
    };
    let ids_dev = io.ptr() + layout.ids as u64;
    let mut bytes = arena_guess(e, bucket, splits);
    let mut shrunk = false;
    for _attempt in 0..6 {
        let workspace = dev.zeros::<u8>(bytes)?;
        let started = std::time::Instant::now();
        let stream = dev.stream().clone();
        dev.begin_workspace(&workspace);
        stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .inspect_err(|_| {
                dev.end_workspace();
            })
            .during("beginning a CUDA graph capture")?;
        // The sequences only name rows here: every mixer reads the tables.
        let mut seqs: Vec<StepSeq> = items
            .iter_mut()
            .enumerate()
            .map(|(n, it)| StepSeq {
                seg: Seg::text(n, 1, it.session.position, 0),
                session: &mut *it.session,
                want: LogitsFor::Last,
            })
            .collect();
        let result = with_small_batch(e, true, false, || {
            flow::body(e, &mut seqs, bucket, ids_dev, Some(&tables), None)
        });
        let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
        let (used, overflowed) = dev.end_workspace();
        let (logits, rows) = result?;
        let graph = graph
            .during("ending a CUDA graph capture")?
            .ok_or_else(|| CudaError::Unsupported("the captured CUDA graph is empty".into()))?;
        if overflowed || logits.is_owned() {
            drop(graph);
            bytes *= 2;
            continue;
        }
        // The guess is generous: capture once more into what the step used (the same
        // launches carve the same scratch), so a bucket holds no more memory than it needs.
        if !shrunk && used + (1 << 20) < bytes / 2 {
            drop(graph);
            bytes = (used + (1 << 20)).next_multiple_of(256);
            shrunk = true;
            continue;
        }
        debug_assert_eq!(rows, bucket);
        tracing::debug!(
            bucket,
            splits,
            workspace = bytes,
            elapsed_us = started.elapsed().as_micros() as u64,
            "captured a batched decode step as a CUDA graph"
        );
        return Ok(BucketGraph {
            graph,
            io,
            _workspace: workspace,
            logits: logits.ptr(),
            splits,
        });
    }
    Err(CudaError::Unsupported(
        "the batched decode step did not fit its workspace".into(),
    ))
}

/// A step without graphs: the items' rows concatenated, scratch from the engine's arena.
fn eager_step(
    e: &CudaEngine,
    items: &mut [CudaBatchItem<'_>],
    state: &mut BatchState,
) -> Result<Logits> {
    let dev = &e.dev;
    let tokens: usize = items.iter().map(|it| it.ids.len()).sum();
    let ids_i32: Vec<i32> = items
        .iter()
        .flat_map(|it| it.ids.iter().map(|&id| id as i32))
        .collect();
    let ids_buf = dev.upload(&ids_i32)?;
    // Every sequence's blocks first (a step cannot stop half-way for want of them); a decode
    // step (one token each) then reads every sequence's state addresses and position from
    // device tables in the batched kernels.
    for it in items.iter_mut() {
        let needed = it.session.position + it.ids.len();
        ensure_capacity(e, it.session, needed)?;
    }
    let decode = items.iter().all(|it| it.ids.len() == 1);
    let mut tables = None;
    let mut splits = 1;
    let _table_buf;
    if decode {
        let sessions: Vec<&CudaSession> = items.iter().map(|it| &*it.session).collect();
        splits = max_splits(&sessions);
        let layout = IoLayout::new(e.config.layers.len(), items.len());
        let image = io_image(&sessions, &[], items.len(), None);
        let buf = dev.upload(&image)?;
        tables = Some(DecodeTables {
            tables: buf.ptr() + layout.tables as u64,
            positions: buf.ptr() + layout.positions as u64,
            seqs: items.len(),
            splits,
        });
        _table_buf = buf;
    }
    // Decode-sized steps carve their scratch from the arena; larger ones (prompt chunks)
    // allocate as a solo prefill does, so the arena stays small.
    let use_arena = tokens <= ARENA_MAX_ROWS;
    let wanted = arena_guess(e, tokens, splits).max(state.arena_min);
    if use_arena && state.arena.as_ref().is_none_or(|a| a.len() < wanted) {
        state.arena = None;
        state.arena = Some(dev.zeros::<u8>(wanted)?);
    }
    let prompt = items.iter().any(|it| it.ids.len() > MATVEC_MAX_TOKENS);
    let mut offset = 0;
    let mut seqs: Vec<StepSeq> = items
        .iter_mut()
        .map(|it| {
            let seg = Seg::text(offset, it.ids.len(), it.session.position, 0);
            offset += it.ids.len();
            StepSeq {
                session: &mut *it.session,
                seg,
                want: it.want,
            }
        })
        .collect();
    let arena_bytes = state.arena.as_ref().map_or(0, |a| a.len());
    if use_arena {
        dev.begin_workspace(state.arena.as_ref().expect("allocated above"));
    }
    let result = with_small_batch(e, decode, prompt, || {
        flow::body(e, &mut seqs, tokens, ids_buf.ptr(), tables.as_ref(), None)
    });
    let overflowed = use_arena && dev.end_workspace().1;
    let (logits, rows) = result?;
    if overflowed {
        // Served by allocations this time; a larger arena from the next step on (this step's
        // logits may live in the current one).
        state.arena_min = 2 * arena_bytes;
        tracing::debug!(bytes = state.arena_min, "growing the batched-step arena");
    }
    for sq in seqs.iter_mut() {
        sq.session.position += sq.seg.tokens;
    }
    let ptr = logits.ptr();
    let owned = logits.is_owned().then_some(logits);
    Ok(Logits {
        ptr,
        rows,
        _owned: owned,
    })
}
