//! `ModelWeights::round_wide_to_bf16`, what the CUDA engine calls before its upload (which
//! reads bf16 or quantized matrices only): after it, a GGUF model (F32 routers and converted
//! tensors) and a block-FP8 model (f32 dequantized projections) hold no f32 matrix.

use spindle_model::fp8::make::write_fp8_pair;
use spindle_model::weights::{FfnWeights, GdnProjection, Linear, MixerWeights, ModelWeights};
use spindle_model::{Checkpoint, DType, ModelConfig};
use spindle_testkit::{fixture, fixtures};

fn mapped_dtypes(w: &ModelWeights) -> Vec<DType> {
    let mut out = Vec::new();
    let mut add = |l: &Linear| {
        if let Linear::Mapped(m) = l {
            out.push(m.dtype);
        }
    };
    add(&w.embed);
    add(&w.lm_head);
    for layer in &w.layers {
        match &layer.mixer {
            MixerWeights::Attention(a) => [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                .into_iter()
                .for_each(&mut add),
            MixerWeights::Gdn(g) => {
                match &g.projection {
                    GdnProjection::Fused { qkvz, ba } => [qkvz, ba].into_iter().for_each(&mut add),
                    GdnProjection::Split { qkv, z, b, a } => {
                        [qkv, z, b, a].into_iter().for_each(&mut add)
                    }
                }
                add(&g.out_proj);
            }
        }
        match &layer.ffn {
            FfnWeights::Dense(m) => [&m.gate, &m.up, &m.down].into_iter().for_each(&mut add),
            FfnWeights::Moe(m) => {
                add(&m.router);
                add(&m.shared_gate);
                for e in m.experts.iter().chain([&m.shared]) {
                    [&e.gate, &e.up, &e.down].into_iter().for_each(&mut add);
                }
            }
        }
    }
    out
}

fn check(path: &std::path::Path) {
    let config = ModelConfig::from_dir(path).unwrap();
    let ck = Checkpoint::open(path).unwrap();
    let mut w = spindle_model::weights::load(&ck, &config).unwrap();
    assert!(
        mapped_dtypes(&w).contains(&DType::F32),
        "{}: no f32 matrix to round",
        path.display()
    );
    let embed_row = w.embed.mat().rows;
    w.round_wide_to_bf16();
    let dtypes = mapped_dtypes(&w);
    assert!(
        dtypes.iter().all(|&d| d == DType::Bf16),
        "{}: {dtypes:?}",
        path.display()
    );
    assert_eq!(w.embed.mat().rows, embed_row);
}

#[test]
fn gguf_and_fp8_models_round_to_bf16_for_the_cuda_upload() {
    check(&fixtures().join("gguf/qwen3_5_moe_fused.q8_0.gguf"));
    check(&fixtures().join("gguf/qwen3_next_moe.bf16.gguf"));
    let tmp = tempfile::tempdir().unwrap();
    let (fp8, deq) = (tmp.path().join("fp8"), tmp.path().join("deq"));
    write_fp8_pair(&fixture("qwen3_5_moe"), &fp8, &deq, [32, 48]).unwrap();
    check(&fp8);
}

/// Every mapped matrix of `w`.
fn mapped(w: &ModelWeights) -> Vec<spindle_model::Matrix> {
    let mut out = Vec::new();
    let mut add = |l: &Linear| {
        if let Linear::Mapped(m) = l {
            out.push(m.clone());
        }
    };
    add(&w.embed);
    add(&w.lm_head);
    for layer in &w.layers {
        match &layer.mixer {
            MixerWeights::Attention(a) => [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                .into_iter()
                .for_each(&mut add),
            MixerWeights::Gdn(g) => {
                match &g.projection {
                    GdnProjection::Fused { qkvz, ba } => [qkvz, ba].into_iter().for_each(&mut add),
                    GdnProjection::Split { qkv, z, b, a } => {
                        [qkv, z, b, a].into_iter().for_each(&mut add)
                    }
                }
                add(&g.out_proj);
            }
        }
        match &layer.ffn {
            FfnWeights::Dense(m) => [&m.gate, &m.up, &m.down].into_iter().for_each(&mut add),
            FfnWeights::Moe(m) => {
                for e in m.experts.iter().chain([&m.shared]) {
                    [&e.gate, &e.up, &e.down].into_iter().for_each(&mut add);
                }
            }
        }
    }
    out
}

/// Kept for a backend that runs FP8 (the CUDA upload reads the stored codes), the block-FP8
/// projections are never dequantized on the host; read, their values are the dequantized
/// copy's, per-expert and fused experts alike.
#[test]
fn fp8_projections_kept_as_stored_are_dequantized_only_when_read() {
    for name in ["qwen3_5_moe", "qwen3_5_moe_fused"] {
        let tmp = tempfile::tempdir().unwrap();
        let (fp8, deq) = (tmp.path().join("fp8"), tmp.path().join("deq"));
        write_fp8_pair(&fixture(name), &fp8, &deq, [64, 64]).unwrap();
        let load = |dir: &std::path::Path| {
            let config = ModelConfig::from_dir(dir).unwrap();
            let ck = Checkpoint::open(dir).unwrap();
            spindle_model::weights::load(&ck, &config).unwrap()
        };
        let mut w = load(&fp8);
        w.round_wide_to_bf16_keeping(&|l| l.fp8().is_some());
        let kept: Vec<_> = mapped(&w)
            .into_iter()
            .filter(|m| m.fp8().is_some())
            .collect();
        assert!(!kept.is_empty(), "{name}: no FP8 projection kept");
        if !cfg!(debug_assertions) {
            // (Debug builds check every matrix's length when it is made, which reads it.)
            assert!(
                kept.iter().all(|m| !m.is_materialized()),
                "{name}: dequantized on load"
            );
        }
        let want: Vec<_> = mapped(&load(&deq))
            .into_iter()
            .filter(|m| m.dtype == DType::F32)
            .collect();
        assert_eq!(kept.len(), want.len(), "{name}: FP8 and f32 projections");
        for (got, want) in kept.iter().zip(&want) {
            assert_eq!(got.to_f32(), want.to_f32(), "{name}: {got:?}");
        }
    }
}

/// GGUF blocks kept by the checkpoint (`keep_blocks`) and rounded for the CUDA upload are the
/// bf16 rounding of the same tensors dequantized on load: byte for byte, `ssm_out`'s
/// reordered columns (`BlockMatrix::input_order`) put back in input order.
#[test]
fn gguf_blocks_round_to_the_dequantized_files_bf16() {
    let path = fixtures().join("gguf/llama_cpp/qwen35moe_k256.Q4_K_M.gguf");
    let config = ModelConfig::from_dir(&path).unwrap();
    let load = |keep: bool| {
        let mut ck = Checkpoint::open(&path).unwrap();
        ck.keep_blocks(keep);
        let mut w = spindle_model::weights::load(&ck, &config).unwrap();
        w.round_wide_to_bf16();
        w
    };
    let (blocks, dequantized) = (load(true), load(false));
    let (a, b) = (mapped(&blocks), mapped(&dequantized));
    assert_eq!(a.len(), b.len(), "every matrix mapped after rounding");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.dtype, x.rows, x.cols), (DType::Bf16, y.rows, y.cols));
        assert!(x.bytes() == y.bytes(), "[{}, {}] differs", x.rows, x.cols);
    }
    let reordered = |w: &ModelWeights| {
        w.layers.iter().any(|l| match &l.mixer {
            MixerWeights::Gdn(g) => matches!(&g.out_proj, Linear::Mapped(_)),
            _ => false,
        })
    };
    assert!(reordered(&blocks), "ssm_out rounded from its blocks");
}
