//! Launchers of the kernels in `attention.cu`.

use super::Ptr;

kernels! {
    /// Block (t, head): head < n_h are query heads (split [query | gate], q_norm, RoPE), the rest
    /// key heads (k_norm, RoPE) whose keys and values go to cache row start + t.
    AttentionPrepare = "attention_prepare"
    (
        qkv: Ptr<f32>,
        ld: i32,
        q_norm: Ptr<f32>,
        k_norm: Ptr<f32>,
        inv_freq: Ptr<f64>,
        rot: i32,
        q_out: Ptr<f32>,
        gate_out: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        table: Ptr<i32>,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
        rope_delta: i32,
        slots: Ptr<i32>,
        eps: f32,
    );
    /// Block (t, h): softmax(q·Kᵀ/√d)·V over the visible keys, times sigmoid(gate).
    AttentionSerial = "attention_serial"
    (
        q: Ptr<f32>,
        gate: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        table: Ptr<i32>,
        sel: Ptr<i32>,
        sel_count: Ptr<i32>,
        sel_stride: i32,
        out: Ptr<f32>,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
        scale: f32,
    );
    /// Flash-decoding, block (kv head g, split, t): the ρ query heads of g against ATTN_SPLIT_KEYS
    /// keys, writing (max, sum, Σ p·v) per head to `part`.
    AttentionDecodeSplit = "attention_decode_split"
    (
        q: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        table: Ptr<i32>,
        part: Ptr<f32>,
        splits: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
        scale: f32,
    );
    /// Block (h, t): out = (Σ_s e^{m_s − M}·acc_s) / (Σ_s e^{m_s − M}·l_s) · sigmoid(gate), over
    /// the splits attention_decode_split wrote for token t.
    AttentionDecodeCombine = "attention_decode_combine"
    (
        part: Ptr<f32>,
        splits: i32,
        gate: Ptr<f32>,
        out: Ptr<f32>,
        n_h: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
    );
    /// Block (t, head), a thread per dimension: head < n_i norms query head `head` (q_norm) and
    /// rotates it at start + t into q_out [T, n_i, d_i].
    QsaPrepare = "qsa_prepare"
    (
        qk: Ptr<f32>,
        ld: i32,
        col0: i32,
        q_norm: Ptr<f32>,
        k_norm: Ptr<f32>,
        inv_freq: Ptr<f64>,
        rot: i32,
        q_out: Ptr<f32>,
        raw_keys: Ptr<f32>,
        block_keys: Ptr<f32>,
        n_i: i32,
        d_i: i32,
        cr: i32,
        start: i32,
        startp: Ptr<i32>,
        eps: f32,
    );
    /// The indexer's block keys of blocks `[0, grid)` recomputed from its raw keys, with
    /// `qsa_prepare`'s arithmetic (a restored session's), a block per key block.
    QsaBlockKeys = "qsa_block_keys"
    (
        raw_keys: Ptr<f32>,
        k_norm: Ptr<f32>,
        inv_freq: Ptr<f64>,
        rot: i32,
        block_keys: Ptr<f32>,
        d_i: i32,
        cr: i32,
        eps: f32,
    );
    /// Block (chunk, r), a warp per key block: token t = t0 + r scores block b = chunk·QSA_WARPS +
    /// warp as scores[r·ld + b] = Σ_h max(0, q_h·K_b) · scale, for each of its complete blocks (b <
    /// (start + t + 1) / cr) when it sees more than …
    QsaScoreBlocks = "qsa_score_blocks"
    (
        q: Ptr<f32>,
        block_keys: Ptr<f32>,
        scores: Ptr<f32>,
        ld: i32,
        t0: i32,
        n_i: i32,
        d_i: i32,
        cr: i32,
        budget: i32,
        start: i32,
        startp: Ptr<i32>,
        scale: f32,
    );
    /// Block r: the positions token t = t0 + r attends to, ascending, into sel[t·stride ..] and
    /// their count into counts[t] (what attention_serial reads).
    QsaPickBlocks = "qsa_pick_blocks"
    (
        scores: Ptr<f32>,
        ld: i32,
        t0: i32,
        sel: Ptr<i32>,
        counts: Ptr<i32>,
        stride: i32,
        cr: i32,
        budget: i32,
        max_blocks: i32,
        start: i32,
        startp: Ptr<i32>,
    );
    /// Causal attention for prefill, tiled: a block holds the queries of all ρ heads of one kv head
    /// for ATTN_PREFILL_ROWS/ρ tokens and walks the keys in tiles of ATTN_PREFILL_KEYS.
    AttentionPrefillTiled = "attention_prefill_tiled"
    (
        q: Ptr<f32>,
        gate: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        table: Ptr<i32>,
        out: Ptr<f32>,
        tokens: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        causal: i32,
        scale: f32,
    );
    /// Batched decode: `attention_prepare` for B sequences of one token, grid (B, n_h + n_kv);
    /// sequence b's block table at `kv[b]`, position `positions[b]`, into the layer's pools.
    AttentionPrepareBatch = "attention_prepare_batch"
    (
        qkv: Ptr<f32>,
        ld: i32,
        q_norm: Ptr<f32>,
        k_norm: Ptr<f32>,
        inv_freq: Ptr<f64>,
        rot: i32,
        q_out: Ptr<f32>,
        gate_out: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        kv: Ptr<u64>,
        positions: Ptr<i32>,
        seqs: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        eps: f32,
    );
    /// Batched decode: `attention_decode_split`, grid (n_kv, splits, B).
    AttentionDecodeSplitBatch = "attention_decode_split_batch"
    (
        q: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        kv: Ptr<u64>,
        part: Ptr<f32>,
        splits: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        positions: Ptr<i32>,
        seqs: i32,
        scale: f32,
    );
    /// Batched decode: `attention_decode_combine`, grid (n_h, B).
    AttentionDecodeCombineBatch = "attention_decode_combine_batch"
    (
        part: Ptr<f32>,
        splits: i32,
        gate: Ptr<f32>,
        out: Ptr<f32>,
        n_h: i32,
        d: i32,
        positions: Ptr<i32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    AttentionPrepare::DECLS,
    AttentionSerial::DECLS,
    AttentionDecodeSplit::DECLS,
    AttentionDecodeCombine::DECLS,
    AttentionPrepareBatch::DECLS,
    AttentionDecodeSplitBatch::DECLS,
    AttentionDecodeCombineBatch::DECLS,
    QsaPrepare::DECLS,
    QsaBlockKeys::DECLS,
    QsaScoreBlocks::DECLS,
    QsaPickBlocks::DECLS,
    AttentionPrefillTiled::DECLS,
];
