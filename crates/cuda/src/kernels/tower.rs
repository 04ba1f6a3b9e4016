//! Launchers of the kernels in `tower.cu` (the vision tower on the tensor cores).

use super::Ptr;

kernels! {
    /// f32 rows → fp16 planes `[rows][planes][cols]` (hi, lo).
    TowerSplitF16 = "tower_split_f16"
    (
        x: Ptr<f32>,
        ldx: i32,
        rows: i32,
        cols: i32,
        planes: i32,
        out: Ptr<u16>,
        flag: Ptr<i32>,
    );
    /// LayerNorm with bias (f64 statistics), the result as fp16 planes, a block per row.
    TowerLayerNormF16 = "tower_layer_norm_f16"
    (
        x: Ptr<f32>,
        w: Ptr<f32>,
        b: Ptr<f32>,
        cols: i32,
        eps: f32,
        planes: i32,
        out: Ptr<u16>,
        flag: Ptr<i32>,
    );
    /// qkv → q, k rotated (2-D vision RoPE), as two fp16 planes each: `[2][heads][n_pad][hdp]`.
    TowerRopeSplitF16 = "tower_rope_split_f16"
    (
        qkv: Ptr<f32>,
        cos: Ptr<f32>,
        sin: Ptr<f32>,
        q: Ptr<u16>,
        k: Ptr<u16>,
        n: i32,
        n_pad: i32,
        heads: i32,
        hd: i32,
        hdp: i32,
        flag: Ptr<i32>,
    );
    /// qkv's v → two fp16 planes transposed, `[2][heads][hdp][n_pad]` (32 × 32 tiles).
    TowerVTransposeF16 = "tower_v_transpose_f16"
    (
        qkv: Ptr<f32>,
        vt: Ptr<u16>,
        n: i32,
        n_pad: i32,
        heads: i32,
        hd: i32,
        hdp: i32,
        flag: Ptr<i32>,
    );
    /// `act(scale·A·Wᵀ + bias)` on the tensor cores (fp16 planes of A, fp16 W), into f32 rows
    /// or fp16 planes.
    TowerGemmF16 {
        P1 = "tower_gemm_f16_p1",
        P2 = "tower_gemm_f16_p2",
    }
    (
        w: Ptr<u16>,
        a: Ptr<u16>,
        bias: Ptr<f32>,
        scale: f32,
        y: Ptr<f32>,
        ldy: i32,
        accumulate: i32,
        p: Ptr<u16>,
        out_planes: i32,
        act: i32,
        m: i32,
        n: i32,
        k: i32,
        flag: Ptr<i32>,
    );
    /// Bidirectional flash attention of one image on the tensor cores, by padded head size
    /// (and precision: split planes, or `_fast` one plane, `_qk` split in Q·Kᵀ only).
    TowerAttention {
        H16 = "tower_attention_h16",
        H32 = "tower_attention_h32",
        H48 = "tower_attention_h48",
        H64 = "tower_attention_h64",
        H80 = "tower_attention_h80",
        H32_FAST = "tower_attention_h32_fast",
        H80_FAST = "tower_attention_h80_fast",
        H32_QK = "tower_attention_h32_qk",
        H80_QK = "tower_attention_h80_qk",
    }
    (
        q: Ptr<u16>,
        k: Ptr<u16>,
        vt: Ptr<u16>,
        o: Ptr<u16>,
        n: i32,
        n_pad: i32,
        heads: i32,
        hd: i32,
        scale_log2: f32,
        out_planes: i32,
        flag: Ptr<i32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    TowerSplitF16::DECLS,
    TowerLayerNormF16::DECLS,
    TowerRopeSplitF16::DECLS,
    TowerVTransposeF16::DECLS,
    TowerGemmF16::DECLS,
    TowerAttention::DECLS,
];
