//! Launchers of the kernels in `vision.cu`.

use super::Ptr;

kernels! {
    /// y[r, c] += b[c].
    BiasAddRows = "bias_add_rows"
    (
        y: Ptr<f32>,
        b: Ptr<f32>,
        rows: i32,
        cols: i32,
    );
    /// y[r, c] = gelu(y[r, c] + b[c]), tanh form (erf_form 0) or erf form.
    BiasGeluRows = "bias_gelu_rows"
    (
        y: Ptr<f32>,
        b: Ptr<f32>,
        rows: i32,
        cols: i32,
        erf_form: i32,
    );
    /// LayerNorm with bias, a block per row (f64 statistics).
    LayerNormRows = "layer_norm_rows"
    (
        x: Ptr<f32>,
        y: Ptr<f32>,
        w: Ptr<f32>,
        b: Ptr<f32>,
        cols: i32,
        eps: f32,
    );
    /// h[r, k] += Σ_c weights[4r + c]·table[index[4r + c], k].
    VisionPosEmbedAdd = "vision_pos_embed_add"
    (
        h: Ptr<f32>,
        table: Ptr<f32>,
        index: Ptr<i32>,
        weights: Ptr<f64>,
        rows: i32,
        d: i32,
    );
    /// qkv → q, k, v `[n, heads, hd]`, q and k rotated (2-D vision RoPE, rotate_half).
    VisionRopeSplit = "vision_rope_split"
    (
        qkv: Ptr<f32>,
        cos: Ptr<f32>,
        sin: Ptr<f32>,
        q: Ptr<f32>,
        k: Ptr<f32>,
        v: Ptr<f32>,
        n: i32,
        heads: i32,
        hd: i32,
    );
    /// Image rows into a step's embeddings, every stream.
    ScatterRows = "scatter_rows"
    (
        src: Ptr<f32>,
        index: Ptr<i32>,
        h: Ptr<f32>,
        n: i32,
        hidden: i32,
        streams: i32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    BiasAddRows::DECLS,
    BiasGeluRows::DECLS,
    LayerNormRows::DECLS,
    VisionPosEmbedAdd::DECLS,
    VisionRopeSplit::DECLS,
    ScatterRows::DECLS,
];
