//! Launchers of the kernels in `attention.cu`.

use super::Ptr;

kernels! {
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
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
        eps: f32,
    );
    AttentionSerial = "attention_serial"
    (
        q: Ptr<f32>,
        gate: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
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
    AttentionDecodeSplit = "attention_decode_split"
    (
        q: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        part: Ptr<f32>,
        splits: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        startp: Ptr<i32>,
        scale: f32,
    );
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
    AttentionPrefillTiled = "attention_prefill_tiled"
    (
        q: Ptr<f32>,
        gate: Ptr<f32>,
        k_cache: Ptr<f32>,
        v_cache: Ptr<f32>,
        out: Ptr<f32>,
        tokens: i32,
        n_h: i32,
        n_kv: i32,
        d: i32,
        start: i32,
        scale: f32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    AttentionPrepare::DECLS,
    AttentionSerial::DECLS,
    AttentionDecodeSplit::DECLS,
    AttentionDecodeCombine::DECLS,
    QsaPrepare::DECLS,
    QsaScoreBlocks::DECLS,
    QsaPickBlocks::DECLS,
    AttentionPrefillTiled::DECLS,
];
