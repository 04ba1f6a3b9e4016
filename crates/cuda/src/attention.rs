//! Gated full attention on the device (MODEL_MATH §1.4), with qwen4_exp's QSA selection.
//!
//! QSA (MODEL_MATH §4.4) is a host round-trip for now: the normed input goes back to the
//! host, the CPU engine's indexer picks the attended tokens, and the lists come back.

use spindle_engine::qwen4::qsa;
use spindle_engine::weights::MixerWeights;
use spindle_kernels::rope::RopeFreqs;
use spindle_model::ModelConfig;

use crate::device::{f, i, p, threads_for, DevBuf, Device};
use crate::error::Result;
use crate::linear::{Io, MATVEC_MAX_TOKENS};
use crate::session::KvCache;
use crate::weights::GpuAttention;

/// What attention needs besides the layer's device weights.
pub struct AttentionCtx<'a> {
    pub config: &'a ModelConfig,
    /// `rope_inv_freq` on the device (f64, r/2 values).
    pub inv_freq: &'a DevBuf<f64>,
    pub rope: &'a RopeFreqs,
    /// The CPU weights of this layer (for the QSA indexer).
    pub cpu: &'a MixerWeights,
    pub eps: f32,
}

/// Keys per flash-decoding split (`ATT_SPLIT` in attention.cu).
const SPLIT: usize = 32;

/// Grows the cache to hold at least `needed` tokens, keeping its contents (and the
/// flash-decoding partials sized for that capacity).
pub fn reserve(
    dev: &Device,
    cache: &mut KvCache,
    needed: usize,
    a: &spindle_model::AttentionConfig,
) -> Result<()> {
    if needed <= cache.capacity {
        return Ok(());
    }
    let row = a.num_kv_heads * a.head_dim;
    let capacity = needed.max(cache.capacity * 2).max(256);
    let mut keys = dev.zeros(capacity * row)?;
    let mut values = dev.zeros(capacity * row)?;
    dev.copy(&cache.keys, &mut keys, cache.capacity * row)?;
    dev.copy(&cache.values, &mut values, cache.capacity * row)?;
    cache.keys = keys;
    cache.values = values;
    cache.partials =
        dev.zeros(MATVEC_MAX_TOKENS * a.num_heads * capacity.div_ceil(SPLIT) * (a.head_dim + 2))?;
    cache.capacity = capacity;
    cache.generation += 1;
    Ok(())
}

/// Runs `tokens` tokens at positions `start..` through one attention layer (input and output
/// as `io`; QSA selection needs the split form, which qwen4_exp's hyper-connections give).
pub fn forward(
    dev: &Device,
    ctx: &AttentionCtx,
    w: &GpuAttention,
    cache: &mut KvCache,
    io: Io,
    tokens: usize,
    start: usize,
    start_dev: u64,
) -> Result<Option<DevBuf<f32>>> {
    let a = &ctx.config.attention;
    let hidden = ctx.config.hidden_size;
    let (n_h, n_kv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);

    let selection = match io {
        Io::Split(x) => select(dev, ctx, cache, x, tokens, start)?,
        Io::Fused { .. } => {
            debug_assert!(ctx.config.qsa.is_none(), "QSA layers run split");
            None
        }
    };

    let qkv = io.project(dev, &w.qkv, hidden, tokens)?;
    reserve(dev, cache, start + tokens, a)?;
    let q = dev.scratch::<f32>(tokens * n_h * d)?;
    let gate = dev.scratch::<f32>(tokens * n_h * d)?;
    dev.launch(
        "attn_prep",
        (tokens as u32, (n_h + n_kv) as u32, 1),
        threads_for(d),
        (d * 4) as u32,
        &[
            p(qkv.ptr()),
            i(w.qkv.rows),
            p(w.q_norm.ptr()),
            p(w.k_norm.ptr()),
            p(ctx.inv_freq.ptr()),
            i(ctx.config.rope.rotary_dim),
            p(q.ptr()),
            p(gate.ptr()),
            p(cache.keys.ptr()),
            p(cache.values.ptr()),
            i(n_h),
            i(n_kv),
            i(d),
            i(start),
            p(start_dev),
            f(ctx.eps),
        ],
    )?;

    let out = dev.scratch::<f32>(tokens * n_h * d)?;
    let flash = selection.is_none()
        && tokens <= MATVEC_MAX_TOKENS
        && d % 4 == 0
        && d <= 256
        && n_h % n_kv == 0;
    let split_shared = 4 * (n_h / n_kv * d + SPLIT * (d + 4) + SPLIT * d + n_h / n_kv * SPLIT);
    let splits = cache.capacity.div_ceil(SPLIT);
    if flash
        && split_shared <= dev.shared_limit("attn_split")
        && 4 * splits <= dev.shared_limit("attn_combine")
    {
        dev.launch(
            "attn_split",
            (n_kv as u32, splits as u32, tokens as u32),
            256,
            split_shared as u32,
            &[
                p(q.ptr()),
                p(cache.keys.ptr()),
                p(cache.values.ptr()),
                p(cache.partials.ptr()),
                i(splits),
                i(n_h),
                i(n_kv),
                i(d),
                i(start),
                p(start_dev),
                f(1.0 / (d as f32).sqrt()),
            ],
        )?;
        dev.launch(
            "attn_combine",
            (n_h as u32, tokens as u32, 1),
            256,
            (4 * splits) as u32,
            &[
                p(cache.partials.ptr()),
                i(splits),
                p(gate.ptr()),
                p(out.ptr()),
                i(n_h),
                i(d),
                i(start),
                p(start_dev),
            ],
        )?;
        return io.finish(dev, &w.o_proj, out.ptr(), n_h * d, hidden, tokens);
    }
    let (sel, counts, stride) = match &selection {
        Some((sel, counts, stride)) => (sel.ptr(), counts.ptr(), *stride),
        None => (0, 0, 0),
    };
    dev.launch(
        "attn_decode",
        (tokens as u32, n_h as u32, 1),
        128,
        0,
        &[
            p(q.ptr()),
            p(gate.ptr()),
            p(cache.keys.ptr()),
            p(cache.values.ptr()),
            p(sel),
            p(counts),
            i(stride),
            p(out.ptr()),
            i(n_h),
            i(n_kv),
            i(d),
            i(start),
            p(start_dev),
            f(1.0 / (d as f32).sqrt()),
        ],
    )?;
    io.finish(dev, &w.o_proj, out.ptr(), n_h * d, hidden, tokens)
}

/// Selected positions per token `[tokens, stride]` (i32), their counts, and the stride; `None`
/// when every token attends to its whole causal prefix.
type DeviceSelection = Option<(DevBuf<i32>, DevBuf<i32>, usize)>;

fn select(
    dev: &Device,
    ctx: &AttentionCtx,
    cache: &mut KvCache,
    x: &DevBuf<f32>,
    tokens: usize,
    start: usize,
) -> Result<DeviceSelection> {
    let (MixerWeights::Attention(cpu), Some(cfg)) = (ctx.cpu, ctx.config.qsa.as_ref()) else {
        return Ok(None);
    };
    let Some(indexer) = &cpu.indexer else {
        return Ok(None);
    };
    let hidden = ctx.config.hidden_size;
    let x_host = dev.download(x, 0, tokens * hidden)?;
    let selection = qsa::select(
        indexer,
        cfg,
        ctx.rope,
        ctx.eps,
        &mut cache.indexer,
        &x_host,
        tokens,
        start,
    );
    if selection.iter().all(Option::is_none) {
        return Ok(None);
    }
    let lists: Vec<Vec<usize>> = selection
        .into_iter()
        .enumerate()
        .map(|(t, s)| s.unwrap_or_else(|| (0..start + t + 1).collect()))
        .collect();
    let stride = lists.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut flat = vec![0i32; tokens * stride];
    for (t, list) in lists.iter().enumerate() {
        for (j, &pos) in list.iter().enumerate() {
            flat[t * stride + j] = pos as i32;
        }
    }
    let counts: Vec<i32> = lists.iter().map(|l| l.len() as i32).collect();
    Ok(Some((dev.upload(&flat)?, dev.upload(&counts)?, stride)))
}
