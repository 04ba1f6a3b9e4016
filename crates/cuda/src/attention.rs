//! Gated full attention on the device (MODEL_MATH §1.4), with qwen4_exp's QSA selection.
//!
//! QSA (MODEL_MATH §4.4) runs on the device as well, so a qwen4_exp decode step is captured
//! in a CUDA graph like any other. The indexer's projection is fused into the layer's `qkv`
//! matrix; `qsa_prepare` norms and rotates the indexer queries, stores each raw key in the
//! layer's [`IndexerCache`](crate::session::IndexerCache) and finishes a block key once its
//! last position is seen; `qsa_score_blocks` scores every complete block for each token (its grid
//! covers the cache's capacity, blocks past the position exit); `qsa_pick_blocks` keeps the top
//! blocks (ties to the earlier one), as the CPU engine's `qsa::select`, and writes the
//! ascending position lists `attention_serial` reads.

use spindle_model::{ModelConfig, QsaConfig};

use crate::device::{threads_for, DevBuf, Device};
use crate::error::Result;
use crate::io::Io;
use crate::kernels::{self, i, p, Launch, Ptr};
use crate::kernels::{
    ATTN_PREFILL_KEYS, ATTN_PREFILL_ROWS, ATTN_SPLIT_KEYS, MATVEC_MAX_TOKENS, QSA_PICK_THREADS,
    QSA_WARPS,
};
use crate::session::{selection_stride, KvCache, LayerTables, Seg};
use crate::weights::{GpuAttention, GpuIndexer};

/// What attention needs besides the layer's device weights.
pub struct AttentionCtx<'a> {
    pub config: &'a ModelConfig,
    /// `rope_inv_freq` on the device (f64, r/2 values).
    pub inv_freq: &'a DevBuf<f64>,
    pub eps: f32,
    /// The layer's keys and values in the KV block pool (`[n_blocks, BLOCK_TOKENS, n_kv, d]`).
    pub pool: (Ptr<f32>, Ptr<f32>),
}

/// Tokens whose block scores one selection launch holds (a longer prefill selects in pieces).
pub const SCORE_TOKENS: usize = 64;

/// Grows the layer's per-sequence scratch to cover at least `needed` positions: the
/// flash-decoding partials, or the QSA indexer's keys and scores (keeping their contents). The
/// keys and values themselves are blocks of the pool.
pub fn reserve(
    dev: &Device,
    cache: &mut KvCache,
    needed: usize,
    config: &ModelConfig,
) -> Result<()> {
    if needed <= cache.capacity {
        return Ok(());
    }
    let a = &config.attention;
    let capacity = needed.max(cache.capacity * 2).max(256);
    match (cache.indexer.as_mut(), config.qsa.as_ref()) {
        (Some(indexer), Some(q)) => {
            // QSA layers attend through selection lists, never the flash path.
            let (d_i, cr) = (q.head_dim, q.compress_ratio);
            let blocks = capacity.div_ceil(cr);
            let mut raw_keys = dev.zeros(capacity * d_i)?;
            let mut block_keys = dev.zeros(blocks * d_i)?;
            dev.copy(&indexer.raw_keys, &mut raw_keys, cache.capacity * d_i)?;
            let old_blocks = indexer.block_keys.len();
            dev.copy(&indexer.block_keys, &mut block_keys, old_blocks)?;
            indexer.raw_keys = raw_keys;
            indexer.block_keys = block_keys;
            indexer.scores = dev.zeros(SCORE_TOKENS * blocks)?;
        }
        _ => {
            cache.partials = dev.zeros(
                MATVEC_MAX_TOKENS
                    * a.num_heads
                    * capacity.div_ceil(ATTN_SPLIT_KEYS)
                    * (a.head_dim + 2),
            )?;
        }
    }
    cache.capacity = capacity;
    cache.generation += 1;
    Ok(())
}

/// Runs a step's `tokens` tokens through one attention layer (input and output as `io`): the
/// projections once over all rows, the core (q/k norms, RoPE at each sequence's own
/// positions, the KV append, QSA selection, attention) per sequence on its own blocks (`seqs`:
/// the layer's cache, the device block table, the rows; every table already holds the step's
/// positions).
pub fn forward(
    dev: &Device,
    ctx: &AttentionCtx,
    w: &GpuAttention,
    seqs: &mut [(&mut KvCache, Ptr<i32>, Seg)],
    io: Io,
    tokens: usize,
    batch: Option<LayerTables>,
) -> Result<Option<DevBuf<f32>>> {
    let a = &ctx.config.attention;
    let hidden = ctx.config.hidden_size;
    let (n_h, n_kv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);

    let qkv = io.project(dev, &w.qkv, hidden, tokens)?;
    let q = dev.scratch::<f32>(tokens * n_h * d)?;
    let gate = dev.scratch::<f32>(tokens * n_h * d)?;
    let out = dev.scratch::<f32>(tokens * n_h * d)?;
    // Decode of B sequences (one token each, caches and positions in device tables; their
    // caches reserved by the caller): one launch per op for all of them.
    if let (Some(t), None) = (batch, &w.indexer) {
        let heads = Heads { n_h, n_kv, d };
        if let Some(split_shared) = split_shape(dev, heads, t.splits) {
            debug_assert_eq!(t.seqs, tokens, "one token per sequence");
            let b = t.seqs;
            kernels::attention::AttentionPrepareBatch::launch(
                dev,
                Launch::new(
                    (b as u32, (n_h + n_kv) as u32, 1),
                    threads_for(d),
                    (d * 4) as u32,
                ),
                qkv.arg(),
                i(w.qkv.rows),
                w.q_norm.arg(),
                w.k_norm.arg(),
                ctx.inv_freq.arg(),
                i(ctx.config.rope.rotary_dim),
                q.arg(),
                gate.arg(),
                ctx.pool.0,
                ctx.pool.1,
                t.table,
                t.positions,
                i(b),
                i(n_h),
                i(n_kv),
                i(d),
                ctx.eps,
            )?;
            let partials = dev.scratch::<f32>(b * n_h * t.splits * (d + 2))?;
            kernels::attention::AttentionDecodeSplitBatch::launch(
                dev,
                Launch::new(
                    (n_kv as u32, t.splits as u32, b as u32),
                    256,
                    split_shared as u32,
                ),
                q.arg(),
                ctx.pool.0,
                ctx.pool.1,
                t.table,
                partials.arg(),
                i(t.splits),
                i(n_h),
                i(n_kv),
                i(d),
                t.positions,
                i(b),
                1.0 / (d as f32).sqrt(),
            )?;
            kernels::attention::AttentionDecodeCombineBatch::launch(
                dev,
                Launch::new((n_h as u32, b as u32, 1), 256, (4 * t.splits) as u32),
                partials.arg(),
                i(t.splits),
                gate.arg(),
                out.arg(),
                i(n_h),
                i(d),
                t.positions,
            )?;
            return io.finish(dev, &w.o_proj, out.arg(), n_h * d, hidden, tokens);
        }
    }
    for (cache, table, seg) in seqs.iter_mut() {
        if seg.tokens > 0 {
            let rows = (qkv.arg_at(seg.offset * w.qkv.rows), w.qkv.rows);
            let qgo = (
                q.arg_at(seg.offset * n_h * d),
                gate.arg_at(seg.offset * n_h * d),
                out.arg_at(seg.offset * n_h * d),
            );
            core(dev, ctx, w, cache, *table, rows, qgo, seg)?;
        }
    }
    io.finish(dev, &w.o_proj, out.arg(), n_h * d, hidden, tokens)
}

/// One sequence's attention core on its rows of the step: `qkv` rows (address, stride) in,
/// the gated attention output rows `out` (`[tokens, n_h·d]`) out; `q` and `gate` are scratch
/// rows of the same shape. `table` is the sequence's device block table.
fn core(
    dev: &Device,
    ctx: &AttentionCtx,
    w: &GpuAttention,
    cache: &mut KvCache,
    table: Ptr<i32>,
    (qkv, ld): (Ptr<f32>, usize),
    (q, gate, out): (Ptr<f32>, Ptr<f32>, Ptr<f32>),
    seg: &Seg,
) -> Result<()> {
    let a = &ctx.config.attention;
    let (n_h, n_kv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);
    let (tokens, start, start_dev) = (seg.tokens, seg.start, seg.start_dev);
    // Blocks are taken before the step (a captured graph cannot allocate); the scratch that
    // follows the capacity is grown here when a caller has not (a no-op in a graph).
    reserve(dev, cache, start + tokens, ctx.config)?;
    let (keys, values) = ctx.pool;
    kernels::attention::AttentionPrepare::launch(
        dev,
        Launch::new(
            (tokens as u32, (n_h + n_kv) as u32, 1),
            threads_for(d),
            (d * 4) as u32,
        ),
        qkv,
        i(ld),
        w.q_norm.arg(),
        w.k_norm.arg(),
        ctx.inv_freq.arg(),
        i(ctx.config.rope.rotary_dim),
        q,
        gate,
        keys,
        values,
        table,
        i(n_h),
        i(n_kv),
        i(d),
        i(start),
        p(start_dev),
        seg.rope_delta as i32,
        p(seg.slots),
        ctx.eps,
    )?;

    let selection = match (&w.indexer, ctx.config.qsa.as_ref()) {
        (Some(indexer), Some(qc)) => Some(select(
            dev, ctx, qc, indexer, cache, qkv, ld, tokens, start, start_dev,
        )?),
        _ => None,
    };

    let heads = Heads { n_h, n_kv, d };
    if selection.is_none()
        && attend_split(
            dev,
            heads,
            (q, gate, out),
            (keys, values, table, cache.partials.arg()),
            cache.capacity,
            tokens,
            start,
            p(start_dev),
        )?
    {
        return Ok(());
    }
    // A short chunk deep into the cache (a prompt's tail after a cached prefix, a small
    // chunk): the tiled kernel runs one block per 8 queries and KV head, too few blocks to
    // spread thousands of keys over the GPU (18 tokens after 4,000 cached took ~2.6 ms per
    // layer), so flash-decoding runs it per group of 8 rows instead, each group split over
    // the keys.
    if selection.is_none() && start_dev == 0 && tokens <= SPLIT_GROUPS_MAX_TOKENS {
        let rows = n_h * d;
        let mut all = true;
        for (t0, n) in crate::io::row_groups(tokens) {
            all &= attend_split(
                dev,
                heads,
                (q.at(t0 * rows), gate.at(t0 * rows), out.at(t0 * rows)),
                (keys, values, table, cache.partials.arg()),
                cache.capacity,
                n,
                start + t0,
                p(0),
            )?;
            if !all {
                break;
            }
        }
        if all {
            return Ok(());
        }
    }
    let tiled = selection.is_none()
        && tokens > MATVEC_MAX_TOKENS
        && attend_tiled(
            dev,
            heads,
            q,
            gate,
            (keys, values, table),
            out,
            tokens,
            start,
        )?;
    if !tiled {
        let sel = selection
            .as_ref()
            .map(|s| (s.positions.arg(), s.counts.arg(), s.stride));
        attend_serial(
            dev,
            heads,
            q,
            gate,
            (keys, values, table),
            sel,
            out,
            tokens,
            start,
            p(start_dev),
        )?;
    }
    Ok(())
}

/// The longest chunk whose attention runs as flash-decoding per group of
/// [`MATVEC_MAX_TOKENS`] rows rather than through the tiled prefill kernel.
const SPLIT_GROUPS_MAX_TOKENS: usize = 64;

/// Query heads, KV heads and head size.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub n_h: usize,
    pub n_kv: usize,
    pub d: usize,
}

/// Flash-decoding of at most [`MATVEC_MAX_TOKENS`] tokens at positions `start..` (or from the
/// position at `start_dev`, in a captured graph) over a cache of `capacity` positions (keys
/// and values through the block table, or contiguous when it is null):
/// `attention_decode_split` scores [`ATTN_SPLIT_KEYS`] keys per block into `partials`
/// (`[tokens, n_h, ⌈capacity / ATTN_SPLIT_KEYS⌉, d + 2]` f32; blocks past the context exit,
/// so the grid is fixed by the capacity), `attention_decode_combine` merges them and applies
/// the sigmoid gate. False, launching nothing, when the shape does not suit the kernels.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_split(
    dev: &Device,
    h: Heads,
    (q, gate, out): (Ptr<f32>, Ptr<f32>, Ptr<f32>),
    (keys, values, table, partials): (Ptr<f32>, Ptr<f32>, Ptr<i32>, Ptr<f32>),
    capacity: usize,
    tokens: usize,
    start: usize,
    start_dev: Ptr<i32>,
) -> Result<bool> {
    let Heads { n_h, n_kv, d } = h;
    let splits = capacity.div_ceil(ATTN_SPLIT_KEYS);
    let Some(split_shared) = split_shape(dev, h, splits).filter(|_| tokens <= MATVEC_MAX_TOKENS)
    else {
        return Ok(false);
    };
    kernels::attention::AttentionDecodeSplit::launch(
        dev,
        Launch::new(
            (n_kv as u32, splits as u32, tokens as u32),
            256,
            split_shared as u32,
        ),
        q,
        keys,
        values,
        table,
        partials,
        i(splits),
        i(n_h),
        i(n_kv),
        i(d),
        i(start),
        start_dev,
        1.0 / (d as f32).sqrt(),
    )?;
    kernels::attention::AttentionDecodeCombine::launch(
        dev,
        Launch::new((n_h as u32, tokens as u32, 1), 256, (4 * splits) as u32),
        partials,
        i(splits),
        gate,
        out,
        i(n_h),
        i(d),
        i(start),
        start_dev,
    )?;
    Ok(true)
}

/// Whether a decode step of many sequences runs this model's attention layers through the
/// batched kernels (caches and positions from device tables), with `splits` splits, on this
/// device (not QSA layers, which select per sequence).
pub fn batch_decode_supported(dev: &Device, config: &ModelConfig, splits: usize) -> bool {
    let a = &config.attention;
    let heads = Heads {
        n_h: a.num_heads,
        n_kv: a.num_kv_heads,
        d: a.head_dim,
    };
    config.qsa.is_none() && split_shape(dev, heads, splits).is_some()
}

/// The dynamic shared bytes of `attention_decode_split` when the flash-decoding kernels take
/// these heads and `splits` splits on this device.
fn split_shape(dev: &Device, h: Heads, splits: usize) -> Option<usize> {
    let Heads { n_h, n_kv, d } = h;
    let flash = d % 4 == 0 && d <= 256 && n_h % n_kv == 0;
    let split_shared = 4
        * (n_h / n_kv * d
            + ATTN_SPLIT_KEYS * (d + 4)
            + ATTN_SPLIT_KEYS * d
            + n_h / n_kv * ATTN_SPLIT_KEYS);
    (flash
        && split_shared <= dev.shared_limit(kernels::attention::AttentionDecodeSplit::NAME)
        && 4 * splits <= dev.shared_limit(kernels::attention::AttentionDecodeCombine::NAME))
    .then_some(split_shared)
}

/// Causal attention of `tokens` tokens at positions `start..` over the cache through the
/// tiled prefill kernel (a block per kv head and run of tokens: every K/V row read once per
/// block); false, launching nothing, when the shape does not suit it. q, gate and out are
/// `[tokens, n_h·d]`; keys and values are rows `[n_kv·d]` reached through the block table
/// (contiguous when it is null).
pub(crate) fn attend_tiled(
    dev: &Device,
    h: Heads,
    q: Ptr<f32>,
    gate: Ptr<f32>,
    (keys, values, table): (Ptr<f32>, Ptr<f32>, Ptr<i32>),
    out: Ptr<f32>,
    tokens: usize,
    start: usize,
) -> Result<bool> {
    if h.n_h % h.n_kv != 0 || h.n_h / h.n_kv > ATTN_PREFILL_ROWS || h.d % 16 != 0 || h.d > 256 {
        return Ok(false);
    }
    let shared = 4
        * ((ATTN_PREFILL_ROWS + 2 * ATTN_PREFILL_KEYS) * (h.d + 4)
            + ATTN_PREFILL_ROWS * (ATTN_PREFILL_KEYS + 1));
    if shared > dev.shared_limit(kernels::attention::AttentionPrefillTiled::NAME) {
        return Ok(false);
    }
    let per = ATTN_PREFILL_ROWS / (h.n_h / h.n_kv);
    kernels::attention::AttentionPrefillTiled::launch(
        dev,
        Launch::new(
            (tokens.div_ceil(per) as u32, h.n_kv as u32, 1),
            256,
            shared as u32,
        ),
        q,
        gate,
        keys,
        values,
        table,
        out,
        i(tokens),
        i(h.n_h),
        i(h.n_kv),
        i(h.d),
        i(start),
        1,
        1.0 / (h.d as f32).sqrt(),
    )?;
    Ok(true)
}

/// Attention through `attention_serial` (a block per (token, head)): over the causal prefix, or,
/// with `sel = Some((positions, counts, stride))`, over each token's selected positions; keys
/// and values through the block table (contiguous when it is null).
pub(crate) fn attend_serial(
    dev: &Device,
    h: Heads,
    q: Ptr<f32>,
    gate: Ptr<f32>,
    (keys, values, table): (Ptr<f32>, Ptr<f32>, Ptr<i32>),
    sel: Option<(Ptr<i32>, Ptr<i32>, usize)>,
    out: Ptr<f32>,
    tokens: usize,
    start: usize,
    start_dev: Ptr<i32>,
) -> Result<()> {
    let (sel, counts, stride) = sel.unwrap_or((Ptr::null(), Ptr::null(), 0));
    kernels::attention::AttentionSerial::launch(
        dev,
        Launch::new((tokens as u32, h.n_h as u32, 1), 128, 0),
        q,
        gate,
        keys,
        values,
        table,
        sel,
        counts,
        i(stride),
        out,
        i(h.n_h),
        i(h.n_kv),
        i(h.d),
        i(start),
        start_dev,
        1.0 / (h.d as f32).sqrt(),
    )
}

/// The positions each token attends to, as `attention_serial` reads them.
struct Selection {
    /// `[tokens, stride]` (i32), ascending; the first `counts[t]` of row t are valid.
    positions: DevBuf<i32>,
    counts: DevBuf<i32>,
    stride: usize,
}

/// QSA selection (MODEL_MATH §4.4) for `tokens` tokens from position `start` (or the position
/// at `start_dev`), whose indexer projections are the columns `w.row..` of `qkv` (row stride
/// `ld`). Appends their raw keys and any block they complete to the layer's indexer cache.
fn select(
    dev: &Device,
    ctx: &AttentionCtx,
    q: &QsaConfig,
    w: &GpuIndexer,
    cache: &KvCache,
    qkv: Ptr<f32>,
    ld: usize,
    tokens: usize,
    start: usize,
    start_dev: u64,
) -> Result<Selection> {
    let indexer = cache
        .indexer
        .as_ref()
        .expect("a QSA layer's cache has an indexer (both follow the config)");
    let (n_i, d_i, cr) = (q.n_heads, q.head_dim, q.compress_ratio);
    let queries = dev.scratch::<f32>(tokens * n_i * d_i)?;
    kernels::attention::QsaPrepare::launch(
        dev,
        Launch::new(
            (tokens as u32, (n_i + 1) as u32, 1),
            threads_for(d_i),
            (d_i * 4) as u32,
        ),
        qkv,
        i(ld),
        i(w.row),
        w.q_norm.arg(),
        w.k_norm.arg(),
        ctx.inv_freq.arg(),
        i(ctx.config.rope.rotary_dim),
        queries.arg(),
        indexer.raw_keys.arg(),
        indexer.block_keys.arg(),
        i(n_i),
        i(d_i),
        i(cr),
        i(start),
        p(start_dev),
        ctx.eps,
    )?;

    let stride = selection_stride(q);
    let positions = dev.scratch::<i32>(tokens * stride)?;
    let counts = dev.scratch::<i32>(tokens)?;
    // A row of scores per token, as many as the cache can hold blocks. In a graph the
    // position is on the device, so the grid covers all of them (a warp past the live blocks
    // exits, and the graph stays valid until the cache grows); otherwise the live ones.
    let blocks = cache.capacity.div_ceil(cr);
    let scored = if start_dev == 0 {
        (start + tokens) / cr
    } else {
        blocks
    };
    for t0 in (0..tokens).step_by(SCORE_TOKENS) {
        let rows = SCORE_TOKENS.min(tokens - t0);
        kernels::attention::QsaScoreBlocks::launch(
            dev,
            Launch::new(
                (scored.div_ceil(QSA_WARPS).max(1) as u32, rows as u32, 1),
                (QSA_WARPS * 32) as u32,
                0,
            ),
            queries.arg(),
            indexer.block_keys.arg(),
            indexer.scores.arg(),
            i(blocks),
            i(t0),
            i(n_i),
            i(d_i),
            i(cr),
            i(q.budget),
            i(start),
            p(start_dev),
            1.0 / (d_i as f32).sqrt(),
        )?;
        kernels::attention::QsaPickBlocks::launch(
            dev,
            Launch::new((rows as u32, 1, 1), QSA_PICK_THREADS as u32, 0),
            indexer.scores.arg(),
            i(blocks),
            i(t0),
            positions.arg(),
            counts.arg(),
            i(stride),
            i(cr),
            i(q.budget),
            i(q.max_blocks()),
            i(start),
            p(start_dev),
        )?;
    }
    Ok(Selection {
        positions,
        counts,
        stride,
    })
}

/// Recomputes the block keys of every block complete at `position` from the indexer's raw
/// keys (rows `[0, position)` already in `cache`), bit for bit what the forward pass wrote:
/// a session restored from cached raw keys.
pub fn rebuild_block_keys(
    dev: &Device,
    config: &ModelConfig,
    w: &GpuIndexer,
    inv_freq: &DevBuf<f64>,
    cache: &KvCache,
    position: usize,
) -> Result<()> {
    let (Some(q), Some(indexer)) = (config.qsa.as_ref(), cache.indexer.as_ref()) else {
        return Ok(());
    };
    let (d_i, cr) = (q.head_dim, q.compress_ratio);
    let blocks = position / cr;
    if blocks == 0 {
        return Ok(());
    }
    kernels::attention::QsaBlockKeys::launch(
        dev,
        Launch::new((blocks as u32, 1, 1), threads_for(d_i), (d_i * 4) as u32),
        indexer.raw_keys.arg(),
        w.k_norm.arg(),
        inv_freq.arg(),
        i(config.rope.rotary_dim),
        indexer.block_keys.arg(),
        i(d_i),
        i(cr),
        config.rms_norm_eps as f32,
    )
}

/// The positions `qsa_pick_blocks` selects for one token that sees `visible` positions, from
/// `scores` of its ⌊visible / cr⌋ complete blocks (host data in and out; for a GPU test
/// against the CPU engine's selection).
#[doc(hidden)]
pub fn qsa_pick_on_host(
    dev: &Device,
    q: &QsaConfig,
    scores: &[f32],
    visible: usize,
) -> Result<Vec<i32>> {
    assert_eq!(
        scores.len(),
        visible / q.compress_ratio,
        "one score per complete block"
    );
    let scores = dev.upload(scores)?;
    let stride = selection_stride(q);
    let positions = dev.zeros::<i32>(stride)?;
    let counts = dev.zeros::<i32>(1)?;
    kernels::attention::QsaPickBlocks::launch(
        dev,
        Launch::new((1, 1, 1), QSA_PICK_THREADS as u32, 0),
        scores.arg(),
        i(scores.len()),
        i(0),
        positions.arg(),
        counts.arg(),
        i(stride),
        i(q.compress_ratio),
        i(q.budget),
        i(q.max_blocks()),
        i(visible - 1),
        p(0),
    )?;
    let count = dev.download(&counts, 0, 1)?[0] as usize;
    dev.download(&positions, 0, count.min(stride))
}
