//! Launchers of the kernels in `qwen4.cu`.

use super::Ptr;

kernels! {
    /// x[t, i] = (1/n) Σ_s sigmoid(a[t, s·H + i]) · normed[t, s·H + i].
    HyperConnectionMix = "hyper_connection_mix"
    (
        a: Ptr<f32>,
        normed: Ptr<f32>,
        x: Ptr<f32>,
        tokens: i32,
        n: i32,
        hidden: i32,
    );
    /// hs[t, s·H + i] += ω_ts · y[t, i], ω_ts = 2·sigmoid(o[t·ld + s] / n).
    HyperConnectionInject = "hyper_connection_inject"
    (
        hs: Ptr<f32>,
        y: Ptr<f32>,
        o: Ptr<f32>,
        ld: i32,
        tokens: i32,
        n: i32,
        hidden: i32,
    );
    /// Block (t, s): γ = K_s·Q_s/√H, γ = sign(γ)·sqrt(max(|γ|, 1e-6)).
    PleGates = "ple_gates"
    (
        keys: Ptr<f32>,
        queries: Ptr<f32>,
        vals: Ptr<f32>,
        ldv: i32,
        gates: Ptr<f32>,
        n: i32,
        hidden: i32,
    );
    /// One thread per channel c of width W: c_t = Σ_j w[c, j] · Gn_{t − dil·(K−1−j)} over [state
    /// ((K−1)·dil rows) | normed rows].
    PleConv = "ple_conv"
    (
        hs: Ptr<f32>,
        gates: Ptr<f32>,
        normed: Ptr<f32>,
        state: Ptr<f32>,
        w: Ptr<f32>,
        tokens: i32,
        width: i32,
        taps: i32,
        dil: i32,
    );
    /// PLE n-gram rows (MODEL_MATH §4.6), as NgramHash::rows on the CPU.
    PleGather = "ple_gather"
    (
        ids: Ptr<i32>,
        hist: Ptr<i32>,
        hash: Ptr<u64>,
        n: i32,
        heads_per_ngram: i32,
        eos: i32,
        table: Ptr<u8>,
        dtype: i32,
        dim: i32,
        eng: Ptr<f32>,
    );
    /// hist ← the last `past` ids of [hist | ids (T)], in place (one thread: slot r reads slot T +
    /// r > r, not yet written).
    PleAdvance = "ple_advance"
    (
        hist: Ptr<i32>,
        ids: Ptr<i32>,
        tokens: i32,
        past: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    HyperConnectionMix::DECLS,
    HyperConnectionInject::DECLS,
    PleGates::DECLS,
    PleConv::DECLS,
    PleGather::DECLS,
    PleAdvance::DECLS,
];
