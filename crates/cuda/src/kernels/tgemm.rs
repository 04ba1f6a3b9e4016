//! The kernels of `tgemm.cu`.

use super::Ptr;

kernels! {
    TgPrepQ = "tg_prep_q"
        (x: Ptr<f32>, ldx: i32, up: i32, rows: i32, cols: i32, xq: Ptr<i8>, xd: Ptr<f32>);
    TgPrepBf16 = "tg_prep_bf16"
        (x: Ptr<f32>, ldx: i32, up: i32, rows: i32, cols: i32, out: Ptr<u16>);
    TensorGemm { BF16 = "tgemm_bf16", Q8 = "tgemm_q8", Q4 = "tgemm_q4" }
        (w: Ptr<u8>, s: Ptr<u16>, a: Ptr<u8>, a_aux: Ptr<u8>, y: Ptr<f32>, ldy: i32, accumulate: i32, n: i32, k_dim: i32, m: i32, tiles: Ptr<i32>, order: Ptr<i32>, a_div: i32);
    MoeSort = "moe_sort"
        (idx: Ptr<i32>, pairs: i32, experts: i32, order: Ptr<i32>, tiles: Ptr<i32>, max_tiles: i32);
    MoeCombine = "moe_combine"
        (out: Ptr<f32>, wt: Ptr<f32>, y: Ptr<f32>, tokens: i32, k: i32, hidden: i32);
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    TgPrepQ::DECLS,
    TgPrepBf16::DECLS,
    TensorGemm::DECLS,
    MoeSort::DECLS,
    MoeCombine::DECLS,
];
