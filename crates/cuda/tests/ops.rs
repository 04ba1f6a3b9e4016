//! Every device op against its CPU kernel on random shapes, as llama.cpp's `test-backend-ops`
//! does: a table of ops, each drawing shapes and data from a seeded [`Rng`], running the
//! device path (a typed launcher of `spindle_cuda::kernels`, or the crate's host function
//! through `spindle_cuda::testing`) and a CPU reference (`spindle_kernels`, or the CPU
//! engine's `Linear`), and bounding the relative difference. Decode hot-path kernels
//! included: decode matvecs, decode MoE, flash-decoding attention, hyper-connections, PLE.
//!
//! Needs a CUDA GPU: `cargo test --release -p spindle-cuda --test ops -- --ignored --nocapture`
//! (`SPINDLE_OPS=name,name` runs only those ops, `SPINDLE_OPS_SEED` changes the data,
//! `SPINDLE_CUDA_DEVICE` picks the GPU). `every_kernel_is_covered` needs no GPU: it checks that
//! the table (or the list of kernels checked elsewhere, with where) names every declared kernel.

use std::collections::BTreeSet;
use std::path::Path;

use spindle_cpu::LinearExt;
use spindle_cuda::kernels::{self, i, Launch};
use spindle_cuda::{testing, Device};
use spindle_kernels::activation::{sigmoid, silu};
use spindle_kernels::attention::{attend, HeadCache};
use spindle_kernels::norm::{group_rms_norm_zc, rms_norm_zc};
use spindle_kernels::softmax::{argmax, softmax_in_place, top_k};
use spindle_model::quant::blocks::bf16_to_f32;
use spindle_model::quant::WeightFormat;
use spindle_model::weights::Linear;
use spindle_model::ModelConfig;
use spindle_testkit::Rng;

/// One op of the table: the kernels it runs and how to check it.
struct Op {
    name: &'static str,
    kernels: &'static [&'static str],
    run: fn(&Device, &mut Rng) -> Vec<Check>,
}

/// One comparison: what ran, max |device − CPU| / max |CPU|, and the bound it must stay under.
struct Check {
    what: String,
    err: f32,
    bound: f32,
}

fn check(what: String, got: &[f32], want: &[f32], bound: f32) -> Check {
    Check {
        what,
        err: relative_error(got, want),
        bound,
    }
}

const OPS: &[Op] = &[
    Op {
        name: "elementwise",
        kernels: &[
            "add_in_place",
            "swiglu",
            "silu_scaled",
            "scale_by_sigmoid",
            "embed_bf16",
        ],
        run: elementwise,
    },
    Op {
        name: "norm",
        kernels: &["rms_norm_zero_centred"],
        run: norm,
    },
    Op {
        name: "matvec",
        kernels: &["matvec_bf16", "matvec_q8", "matvec_q4"],
        run: matvec,
    },
    Op {
        name: "decode_matvec",
        kernels: &[
            "decode_matvec_bf16_t1",
            "decode_matvec_q8_t1",
            "decode_matvec_q4_t1",
            "decode_matvec_bf16_t8",
            "decode_matvec_q8_t8",
            "decode_matvec_q4_t8",
        ],
        run: decode_matvec,
    },
    Op {
        name: "gemm",
        kernels: &[
            "gemm_simt_bf16",
            "gemm_simt_q8",
            "gemm_simt_q4",
            "gemm_tensor_bf16",
            "gemm_tensor_q8",
            "gemm_tensor_q4",
            "gemm_tensor_quantize_acts",
            "gemm_tensor_split_acts_bf16",
        ],
        run: gemm,
    },
    Op {
        name: "moe",
        kernels: &[
            "decode_moe_gate_up_bf16",
            "decode_moe_gate_up_q8",
            "decode_moe_gate_up_q4",
            "decode_moe_down_bf16",
            "decode_moe_down_q8",
            "decode_moe_down_q4",
            "moe_route",
            "moe_gate_up_bf16",
            "moe_gate_up_q8",
            "moe_gate_up_q4",
            "moe_down_bf16",
            "moe_down_q8",
            "moe_down_q4",
            "moe_grouped_gate_up_q8",
            "moe_grouped_gate_up_q4",
            "moe_grouped_down_q8",
            "moe_grouped_down_q4",
            "moe_group_by_expert",
            "moe_combine",
            "moe_route_warps",
            "moe_combine_slots",
        ],
        run: moe,
    },
    Op {
        name: "attention",
        kernels: &[
            "attention_decode_split",
            "attention_decode_combine",
            "attention_serial",
            "attention_prefill_tiled",
        ],
        run: attention,
    },
    Op {
        name: "hyper_connections",
        kernels: &["hyper_connection_mix", "hyper_connection_inject"],
        run: hyper_connections,
    },
    Op {
        name: "ple",
        kernels: &["ple_gates", "ple_conv", "ple_advance"],
        run: ple,
    },
    Op {
        name: "argmax",
        kernels: &["argmax_two_stage"],
        run: argmax_op,
    },
];

/// Kernels this table does not run, and where they are checked instead.
const CHECKED_ELSEWHERE: &[(&str, &str)] = &[
    (
        "matvec_fp8",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "decode_matvec_fp8_t1",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "decode_matvec_fp8_t8",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "gemm_simt_fp8",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "gemm_tensor_fp8",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "gemm_fp8_quantize_acts",
        "tests/fp8.rs (FP8 kernels against scalar references)",
    ),
    (
        "moe_gate_up_fp8",
        "tests/fp8.rs (FP8 routed experts against a scalar reference)",
    ),
    (
        "moe_down_fp8",
        "tests/fp8.rs (FP8 routed experts against a scalar reference)",
    ),
    (
        "decode_moe_gate_up_fp8",
        "tests/fp8.rs (FP8 MoE fixtures against the CPU)",
    ),
    (
        "decode_moe_down_fp8",
        "tests/fp8.rs (FP8 MoE fixtures against the CPU)",
    ),
    ("sample_count_history", "tests/sampling.rs"),
    ("sample_row_stats", "tests/sampling.rs"),
    ("sample_histogram", "tests/sampling.rs"),
    ("sample_window_choose", "tests/sampling.rs"),
    ("sample_collect", "tests/sampling.rs"),
    ("sample_pick", "tests/sampling.rs"),
    (
        "attention_prepare",
        "tests/fixtures.rs (whole attention layers)",
    ),
    ("qsa_prepare", "tests/fixtures.rs (qwen4_exp)"),
    (
        "gdn_decode_heads_rows",
        "tests/batch.rs (prompt chunks and decodes of several sequences against solo runs)",
    ),
    (
        "gdn_conv_decode_batch",
        "tests/batch.rs (decode steps of several sequences against solo runs)",
    ),
    (
        "gdn_decode_heads_batch",
        "tests/batch.rs (decode steps of several sequences against solo runs)",
    ),
    (
        "attention_prepare_batch",
        "tests/batch.rs (decode steps of several sequences against solo runs)",
    ),
    (
        "attention_decode_split_batch",
        "tests/batch.rs (decode steps of several sequences against solo runs)",
    ),
    (
        "attention_decode_combine_batch",
        "tests/batch.rs (decode steps of several sequences against solo runs)",
    ),
    (
        "gather_rows",
        "tests/batch.rs (mixed prefill and decode steps against solo runs)",
    ),
    ("qsa_score_blocks", "tests/fixtures.rs (qwen4_exp)"),
    (
        "qsa_pick_blocks",
        "tests/qwen4.rs (against the CPU selection)",
    ),
    (
        "ple_gather",
        "tests/fixtures.rs (qwen4_exp: n-gram hashing and table rows)",
    ),
    ("gdn_conv", "tests/gdn_chunked.rs, tests/fixtures.rs"),
    (
        "gdn_conv_state_update",
        "tests/gdn_chunked.rs, tests/fixtures.rs",
    ),
    ("gdn_recurrent", "tests/gdn_chunked.rs, tests/fixtures.rs"),
    ("gdn_decode_heads", "tests/fixtures.rs (GDN decode)"),
    ("gdn_chunk_prep", "tests/gdn_chunked.rs"),
    (
        "decode_matvec_q4k_t1",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_matvec_q4k_t8",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_moe_gate_up_q4k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "decode_moe_down_q4k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "ggml_dequantize_q4k",
        "tests/gguf.rs (every weight the device reads equals the host dequantizer's)",
    ),
    (
        "decode_matvec_q5k_t1",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_matvec_q5k_t8",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_moe_gate_up_q5k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "decode_moe_down_q5k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "ggml_dequantize_q5k",
        "tests/gguf.rs (every weight the device reads equals the host dequantizer's)",
    ),
    (
        "decode_matvec_q6k_t1",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_matvec_q6k_t8",
        "tests/gguf.rs (products on random blocks against f64; the K-quant GGUF files against the CPU in blocks)",
    ),
    (
        "decode_moe_gate_up_q6k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "decode_moe_down_q6k",
        "tests/gguf.rs (the K-quant GGUF files' experts against the CPU in blocks)",
    ),
    (
        "ggml_dequantize_q6k",
        "tests/gguf.rs (every weight the device reads equals the host dequantizer's)",
    ),
    (
        "qsa_block_keys",
        "tests/prefix.rs (a qwen4_exp session restored from raw indexer keys continues bit for bit)",
    ),
    ("gdn_chunk_scan", "tests/gdn_chunked.rs"),
    ("gdn_gated_norm", "tests/gdn_chunked.rs"),
    (
        "decode_matvec_conv_bf16_t1",
        "tests/fixtures.rs (GDN in_proj)",
    ),
    (
        "decode_matvec_conv_q8_t1",
        "tests/fixtures.rs (GDN in_proj, q8)",
    ),
    (
        "decode_matvec_conv_q4_t1",
        "tests/fixtures.rs (GDN in_proj, q4)",
    ),
    (
        "decode_matvec_conv_bf16_t8",
        "tests/fixtures.rs (GDN in_proj)",
    ),
    (
        "decode_matvec_conv_q8_t8",
        "tests/fixtures.rs (GDN in_proj, q8)",
    ),
    (
        "decode_matvec_conv_q4_t8",
        "tests/fixtures.rs (GDN in_proj, q4)",
    ),
    (
        "read_bandwidth_probe",
        "nothing to compare: `spindle bench` reads its timing",
    ),
    (
        "layer_norm_rows",
        "tests/vision.rs (the tower's LayerNorms: vision_blocks_out vs transformers and the CPU)",
    ),
    (
        "bias_add_rows",
        "tests/vision.rs (the tower's biased linears: vision_patch_embed, vision_blocks_out)",
    ),
    (
        "bias_gelu_rows",
        "tests/vision.rs (the tower's MLP and merger GELUs: vision_blocks_out, vision_embeds)",
    ),
    (
        "vision_pos_embed_add",
        "tests/vision.rs (the interpolated position table: vision_patch_embed)",
    ),
    (
        "vision_rope_split",
        "tests/vision.rs (the tower's 2-D rotary: vision_blocks_out)",
    ),
    (
        "scatter_rows",
        "tests/vision.rs (image rows replacing their pads: logits with images vs transformers)",
    ),
    (
        "tower_split_f16",
        "tests/tower.rs (hi/lo fp16 planes: the GEMM against an f64 reference)",
    ),
    (
        "tower_gemm_f16_p1",
        "tests/tower.rs (tensor-core tower GEMM, one plane, against f64)",
    ),
    (
        "tower_gemm_f16_p2",
        "tests/tower.rs (tensor-core tower GEMM, two planes, against f64)",
    ),
    (
        "tower_layer_norm_f16",
        "tests/tower.rs (LayerNorm into fp16 planes against f64)",
    ),
    (
        "tower_rope_split_f16",
        "tests/vision.rs (the tensor-core tower's 2-D rotary: vision_embeds vs transformers)",
    ),
    (
        "tower_v_transpose_f16",
        "tests/tower.rs (flash attention per image against f64)",
    ),
    (
        "tower_attention_h16",
        "tests/tower.rs (flash attention per image against f64) and tests/vision.rs (tensor_core_tower_precisions)",
    ),
    (
        "tower_attention_h32",
        "tests/tower.rs (flash attention per image against f64) and tests/vision.rs (tensor_core_tower_precisions)",
    ),
    (
        "tower_attention_h32_fast",
        "tests/vision.rs (tensor_core_tower_precisions: the cheaper attention precisions on the fixtures)",
    ),
    (
        "tower_attention_h32_qk",
        "tests/vision.rs (tensor_core_tower_precisions: the cheaper attention precisions on the fixtures)",
    ),
    (
        "tower_attention_h48",
        "tests/tower.rs (flash attention per image against f64) and tests/vision.rs (tensor_core_tower_precisions)",
    ),
    (
        "tower_attention_h64",
        "tests/tower.rs (flash attention per image against f64) and tests/vision.rs (tensor_core_tower_precisions)",
    ),
    (
        "tower_attention_h80",
        "tests/tower.rs (flash attention per image against f64) and tests/vision.rs (tensor_core_tower_precisions)",
    ),
    (
        "tower_attention_h80_fast",
        "tests/vision.rs (tensor_core_tower_precisions: the cheaper attention precisions on the fixtures)",
    ),
    (
        "tower_attention_h80_qk",
        "tests/vision.rs (tensor_core_tower_precisions: the cheaper attention precisions on the fixtures)",
    ),
    (
        "decode_matvec_tc_q8",
        "tests/decode_tc.rs (against the dp4a decode matvec, bit for bit) and tests/batch.rs",
    ),
    (
        "decode_matvec_tc_q4",
        "tests/decode_tc.rs (against the dp4a decode matvec, bit for bit) and tests/batch.rs",
    ),
    (
        "gemm_tensor_skinny_bf16",
        "tests/kernels.rs (skinny_gemm_tiles_equal_wide_tiles: the 64-row tiles' bits, dense and grouped)",
    ),
    (
        "gemm_tensor_skinny_q8",
        "tests/kernels.rs (skinny_gemm_tiles_equal_wide_tiles: the 64-row tiles' bits, dense and grouped)",
    ),
    (
        "gemm_tensor_skinny_q4",
        "tests/kernels.rs (skinny_gemm_tiles_equal_wide_tiles: the 64-row tiles' bits, dense and grouped)",
    ),
    (
        "gemm_tensor_skinny_fp8",
        "tests/fp8.rs run with SPINDLE_CUDA_SKINNY_GEMM=1 (the fixtures' FP8 prefills of up to 32 tokens)",
    ),
];

#[test]
fn every_kernel_is_covered() {
    let mut covered = BTreeSet::new();
    for op in OPS {
        for &k in op.kernels {
            assert!(covered.insert(k), "{k} is listed twice");
        }
    }
    for &(k, _) in CHECKED_ELSEWHERE {
        assert!(covered.insert(k), "{k} is listed twice");
    }
    let declared: BTreeSet<&str> = kernels::declared().map(|k| k.name).collect();
    let missing: Vec<_> = declared.difference(&covered).collect();
    let unknown: Vec<_> = covered.difference(&declared).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "kernels no op checks: {missing:?}; listed but not declared: {unknown:?}"
    );
}

/// The MoE op's configuration (the demo model's, resized) parses and takes the sizes.
#[test]
fn moe_config_takes_the_sizes() {
    let config = moe_config(96, 12, 3, 64, 32, false);
    let moe = config.moe.as_ref().expect("a MoE config");
    assert_eq!(config.hidden_size, 96);
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_intermediate),
        (12, 3, 64)
    );
    assert_eq!((moe.shared_intermediate, moe.renormalize), (32, false));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_ops_match_cpu() {
    let dev = device();
    let only: Option<Vec<String>> = std::env::var("SPINDLE_OPS")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().to_owned()).collect());
    let seed = std::env::var("SPINDLE_OPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201);
    let mut failed = Vec::new();
    let mut ran = 0;
    for op in OPS {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == op.name))
        {
            continue;
        }
        let mut rng = Rng(seed ^ op.name.len() as u64);
        for c in (op.run)(&dev, &mut rng) {
            ran += 1;
            let ok = c.err < c.bound;
            println!(
                "{:<18} {:<60} {:>9.2e} < {:.0e} {}",
                op.name,
                c.what,
                c.err,
                c.bound,
                if ok { "ok" } else { "FAIL" }
            );
            if !ok {
                failed.push(format!("{}: {} ({:.2e})", op.name, c.what, c.err));
            }
        }
    }
    assert!(ran > 0, "SPINDLE_OPS named no op of the table");
    assert!(
        failed.is_empty(),
        "device ops differ from the CPU:\n{}",
        failed.join("\n")
    );
}

// ---- helpers ----

fn device() -> Device {
    let ordinal = std::env::var("SPINDLE_CUDA_DEVICE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Device::open(ordinal).unwrap_or_else(|e| panic!("{e}"))
}

/// max |got − want| / max |want| (NaN or infinite output fails).
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "output length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    if err.is_finite() {
        err / scale
    } else {
        f32::INFINITY
    }
}

/// A uniform integer in `lo..=hi`.
fn pick(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + ((rng.unit() * (hi - lo + 1) as f32) as usize).min(hi - lo)
}

fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

const FORMATS: [WeightFormat; 3] = [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4];

/// A `[rows, cols]` CPU matrix in `format` from f32 values (Q8/Q4: the reference
/// quantizer's codes, so both backends hold the same weights).
fn matrix(format: WeightFormat, values: &[f32], rows: usize, cols: usize) -> Linear {
    Linear::from_f32(format, values, rows, cols)
}

/// A random `[rows, cols]` matrix in `format`.
fn random_matrix(rng: &mut Rng, format: WeightFormat, rows: usize, cols: usize) -> Linear {
    matrix(format, &rng.signed_vec(rows * cols, 0.1), rows, cols)
}

/// Column counts every format takes (whole groups of 32).
fn cols(rng: &mut Rng) -> usize {
    32 * pick(rng, 1, 48)
}

/// Q8/Q4 on the CPU may keep f32 activations where the device quantizes them to int8 (or the
/// reverse): a bound for one linear layer, relative to its largest output.
fn linear_bound(format: WeightFormat) -> f32 {
    match format {
        WeightFormat::Bf16 => 3e-5,
        WeightFormat::Q8 | WeightFormat::Q4 => 1e-2,
    }
}

// ---- ops ----

fn elementwise(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let (tokens, n) = (pick(rng, 1, 40), pick(rng, 1, 3000));
        let ld = 2 * n + pick(rng, 0, 7);
        let input = rng.signed_vec(tokens * ld, 4.0);
        let d_in = dev.upload(&input).unwrap();
        let shape = format!("T {tokens}, n {n}, ld {ld}");

        // add_in_place
        let (y, x) = (
            rng.signed_vec(tokens * n, 1.0),
            rng.signed_vec(tokens * n, 1.0),
        );
        let (d_y, d_x) = (dev.upload(&y).unwrap(), dev.upload(&x).unwrap());
        kernels::elementwise::AddInPlace::launch(
            dev,
            Launch::elementwise(tokens * n),
            d_y.arg(),
            d_x.arg(),
            i(tokens * n),
        )
        .unwrap();
        let want: Vec<f32> = y.iter().zip(&x).map(|(a, b)| a + b).collect();
        let got = dev.download(&d_y, 0, tokens * n).unwrap();
        out.push(check(format!("add_in_place {shape}"), &got, &want, 1e-7));

        // swiglu: gate at column 0, up at column n of each row.
        let d_out = dev.zeros::<f32>(tokens * n).unwrap();
        kernels::elementwise::Swiglu::launch(
            dev,
            Launch::elementwise(tokens * n),
            d_in.arg(),
            i(ld),
            i(0),
            i(n),
            d_out.arg(),
            i(tokens),
            i(n),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * n)
            .map(|e| {
                let row = &input[(e / n) * ld..];
                silu(row[e % n]) * row[n + e % n]
            })
            .collect();
        let got = dev.download(&d_out, 0, tokens * n).unwrap();
        out.push(check(format!("swiglu {shape}"), &got, &want, 1e-6));

        // silu_scaled
        let scale = 0.25 + rng.unit();
        kernels::elementwise::SiluScaled::launch(
            dev,
            Launch::elementwise(tokens * n),
            d_in.arg(),
            i(ld),
            scale,
            d_out.arg(),
            i(tokens),
            i(n),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * n)
            .map(|e| silu(input[(e / n) * ld + e % n] * scale))
            .collect();
        let got = dev.download(&d_out, 0, tokens * n).unwrap();
        out.push(check(format!("silu_scaled {shape}"), &got, &want, 1e-6));

        // scale_by_sigmoid: the gate is column 0 of each input row.
        let d_y = dev.upload(&y).unwrap();
        kernels::elementwise::ScaleBySigmoid::launch(
            dev,
            Launch::elementwise(tokens * n),
            d_y.arg(),
            d_in.arg(),
            i(ld),
            i(tokens),
            i(n),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * n)
            .map(|e| y[e] * sigmoid(input[(e / n) * ld]))
            .collect();
        let got = dev.download(&d_y, 0, tokens * n).unwrap();
        out.push(check(
            format!("scale_by_sigmoid {shape}"),
            &got,
            &want,
            1e-6,
        ));

        // embed_bf16: rows of a bf16 table, repeated over the streams.
        let (vocab, hidden, streams) = (pick(rng, 2, 500), pick(rng, 1, 700), pick(rng, 1, 4));
        let table: Vec<u16> = rng
            .signed_vec(vocab * hidden, 1.0)
            .iter()
            .map(|&v| bf16_bits(v))
            .collect();
        let ids: Vec<i32> = (0..tokens)
            .map(|_| pick(rng, 0, vocab - 1) as i32)
            .collect();
        let (d_table, d_ids) = (dev.upload(&table).unwrap(), dev.upload(&ids).unwrap());
        let d_h = dev.zeros::<f32>(tokens * streams * hidden).unwrap();
        kernels::elementwise::EmbedBf16::launch(
            dev,
            Launch::elementwise(tokens * streams * hidden),
            d_table.arg(),
            d_ids.arg(),
            d_h.arg(),
            i(tokens),
            i(hidden),
            i(streams),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * streams * hidden)
            .map(|e| {
                let t = e / (streams * hidden);
                bf16_to_f32(table[ids[t] as usize * hidden + e % hidden])
            })
            .collect();
        let got = dev.download(&d_h, 0, tokens * streams * hidden).unwrap();
        out.push(check(
            format!("embed_bf16 V {vocab}, H {hidden}, streams {streams}, T {tokens}"),
            &got,
            &want,
            1e-7,
        ));
    }
    out
}

fn norm(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for _ in 0..4 {
        let (tokens, groups, group) = (pick(rng, 1, 20), pick(rng, 1, 8), pick(rng, 1, 1200));
        let width = groups * group;
        let x = rng.signed_vec(tokens * width, 3.0);
        let w = rng.signed_vec(width, 0.5);
        let eps = 1e-6;
        let got = testing::group_norm_of(dev, &x, &w, tokens, groups, group, eps).unwrap();
        let mut want = vec![0.0f32; tokens * width];
        for t in 0..tokens {
            let r = t * width..(t + 1) * width;
            group_rms_norm_zc(&x[r.clone()], &w, group, eps, &mut want[r]);
        }
        out.push(check(
            format!("T {tokens}, {groups} groups of {group}"),
            &got,
            &want,
            1e-5,
        ));
    }
    out
}

fn matvec(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let (rows, cols, tokens) = (pick(rng, 1, 1500), cols(rng), pick(rng, 1, 8));
        let x = rng.signed_vec(tokens * cols, 1.0);
        for format in FORMATS {
            let w = random_matrix(rng, format, rows, cols);
            let got = testing::linear(dev, &w, &x, tokens).unwrap();
            out.push(check(
                format!("{format:?} [{rows}, {cols}] × {tokens}"),
                &got,
                &w.forward(&x, tokens),
                linear_bound(format),
            ));
        }
    }
    out
}

fn decode_matvec(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for case in 0..4 {
        // One token (the _t1 kernels) and batches of up to 8 (_t8).
        let tokens = if case % 2 == 0 { 1 } else { pick(rng, 2, 8) };
        let (rows, cols) = (2 * pick(rng, 1, 1000), cols(rng));
        let x = rng.signed_vec(tokens * cols, 2.0);
        let nw = rng.signed_vec(cols, 0.5);
        let eps = 1e-6;
        let normed: Vec<f32> = x
            .chunks(cols)
            .flat_map(|row| {
                let mut o = vec![0.0f32; cols];
                rms_norm_zc(row, &nw, eps, &mut o);
                o
            })
            .collect();
        for format in FORMATS {
            let w = random_matrix(rng, format, rows, cols);
            let shape = format!("{format:?} [{rows}, {cols}] × {tokens}");
            let bound = linear_bound(format);
            let plain = w.forward(&x, tokens);
            let with_norm = w.forward(&normed, tokens);

            let got =
                testing::decode_linear_of(dev, &w, &x, tokens, None, testing::Epilogue::Store)
                    .unwrap();
            out.push(check(format!("store {shape}"), &got, &plain, bound));

            let norm = Some((nw.as_slice(), eps));
            let got =
                testing::decode_linear_of(dev, &w, &x, tokens, norm, testing::Epilogue::Store)
                    .unwrap();
            out.push(check(
                format!("norm, store {shape}"),
                &got,
                &with_norm,
                bound,
            ));

            let half = rows / 2;
            let want: Vec<f32> = (0..tokens * half)
                .map(|e| {
                    let row = &with_norm[(e / half) * rows..];
                    silu(row[e % half]) * row[half + e % half]
                })
                .collect();
            let got =
                testing::decode_linear_of(dev, &w, &x, tokens, norm, testing::Epilogue::SwiGlu)
                    .unwrap();
            out.push(check(
                format!("norm, swiglu {shape}"),
                &got,
                &want,
                4.0 * bound,
            ));

            let init = rng.signed_vec(tokens * rows, 1.0);
            let gate = rng.signed_vec(tokens, 3.0);
            let want: Vec<f32> = (0..tokens * rows)
                .map(|e| init[e] + sigmoid(gate[e / rows]) * plain[e])
                .collect();
            let epilogue = testing::Epilogue::Accumulate {
                init: &init,
                gate: Some(&gate),
            };
            let got = testing::decode_linear_of(dev, &w, &x, tokens, None, epilogue).unwrap();
            out.push(check(
                format!("gated accumulate {shape}"),
                &got,
                &want,
                bound,
            ));
        }
    }
    out
}

fn gemm(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    let tensor_cores = dev.tensor_cores();
    for _ in 0..3 {
        let (rows, cols, tokens) = (pick(rng, 1, 700), cols(rng), pick(rng, 9, 300));
        let x = rng.signed_vec(tokens * cols, 1.0);
        for format in FORMATS {
            let w = random_matrix(rng, format, rows, cols);
            let want = w.forward(&x, tokens);
            let shape = format!("{format:?} [{rows}, {cols}] × {tokens}");
            if tensor_cores {
                // The CPU's int8 activations for Q8/Q4 (the same quantizer), exact bf16
                // products from three bf16 planes.
                let got = testing::linear(dev, &w, &x, tokens).unwrap();
                let bound = if format == WeightFormat::Bf16 {
                    3e-5
                } else {
                    1e-5
                };
                out.push(check(format!("tensor cores {shape}"), &got, &want, bound));
            }
            dev.set_tensor_cores(false);
            let got = testing::linear(dev, &w, &x, tokens).unwrap();
            dev.set_tensor_cores(tensor_cores);
            out.push(check(
                format!("SIMT {shape}"),
                &got,
                &want,
                linear_bound(format),
            ));
        }
    }
    out
}

/// The demo model's configuration with the MoE sizes replaced.
fn moe_config(
    hidden: usize,
    experts: usize,
    k: usize,
    inter: usize,
    shared: usize,
    renormalize: bool,
) -> ModelConfig {
    // Compiled in: the test binary also runs on GPU machines without the repository.
    let text = include_str!("../../../models/demo/config.json");
    let mut config = ModelConfig::from_json_str(text, Path::new("models/demo/config.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    config.hidden_size = hidden;
    let moe = config.moe.as_mut().expect("the demo model is a MoE model");
    moe.num_experts = experts;
    moe.top_k = k;
    moe.expert_intermediate = inter;
    moe.shared_intermediate = shared;
    moe.renormalize = renormalize;
    config
}

/// The MoE block on the CPU (MODEL_MATH §1.6): softmax over the router logits, top-k (ties to
/// the lower index), optional renormalisation, each chosen expert's SwiGLU and down projection
/// weighted, plus the sigmoid-gated shared expert. `input` rows as in
/// [`testing::moe_block_of`]; `expert_down[e]` is expert e's `[hidden, I]`.
#[allow(clippy::too_many_arguments)]
fn moe_on_cpu(
    input: &Linear,
    shared_down: &Linear,
    gate_up: &Linear,
    expert_down: &[Linear],
    x: &[f32],
    tokens: usize,
    (experts, k, inter, shared): (usize, usize, usize, usize),
    renormalize: bool,
) -> Vec<f32> {
    let hidden = gate_up.cols();
    let ld = experts + 1 + 2 * shared;
    let logits = input.forward(x, tokens);
    let all_gu = gate_up.forward(x, tokens);
    let mut want = vec![0.0f32; tokens * hidden];
    for t in 0..tokens {
        let row = &logits[t * ld..(t + 1) * ld];
        let mut p = row[..experts].to_vec();
        softmax_in_place(&mut p);
        let chosen = top_k(&p, k);
        let sum: f32 = chosen.iter().map(|&e| p[e]).sum();
        let y = &mut want[t * hidden..(t + 1) * hidden];
        for &e in &chosen {
            let wt = if renormalize { p[e] / sum } else { p[e] };
            let gu = &all_gu[t * experts * 2 * inter + e * 2 * inter..];
            let act: Vec<f32> = (0..inter).map(|c| silu(gu[c]) * gu[inter + c]).collect();
            let expert_out = expert_down[e].forward(&act, 1);
            for r in 0..hidden {
                y[r] += wt * expert_out[r];
            }
        }
        let sg = sigmoid(row[experts]);
        let act: Vec<f32> = (0..shared)
            .map(|c| silu(row[experts + 1 + c]) * row[experts + 1 + shared + c])
            .collect();
        let shared_out = shared_down.forward(&act, 1);
        for r in 0..hidden {
            y[r] += sg * shared_out[r];
        }
    }
    want
}

/// Whether every token's k-th and (k+1)-th router probabilities are apart (a near-tie could
/// pick a different expert on the device from rounding alone).
fn routing_is_clear(input: &Linear, x: &[f32], tokens: usize, experts: usize, k: usize) -> bool {
    let ld = input.rows();
    let logits = input.forward(x, tokens);
    (0..tokens).all(|t| {
        let mut p = logits[t * ld..t * ld + experts].to_vec();
        softmax_in_place(&mut p);
        let order = top_k(&p, k + 1);
        k >= experts || p[order[k - 1]] - p[order[k]] > 1e-3 * p[order[0]]
    })
}

fn moe(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    let tensor_cores = dev.tensor_cores();
    for case in 0..4 {
        let experts = pick(rng, 4, 32);
        let k = pick(rng, 1, experts.min(8));
        let (hidden, inter, shared) = (
            32 * pick(rng, 2, 16),
            32 * pick(rng, 1, 8),
            32 * pick(rng, 1, 8),
        );
        let renormalize = case % 2 == 0;
        // Decode (the three-launch kernels), a batched decode step (route, then the experts
        // grouped per expert: `moe_grouped_*` for Q8/Q4) and prefill (route, then the grouped
        // tensor-core GEMMs).
        let tokens = match case {
            0 | 1 => pick(rng, 1, 8),
            2 => pick(rng, 9, 80),
            _ => pick(rng, 129, 200),
        };
        let config = moe_config(hidden, experts, k, inter, shared, renormalize);
        // Case 2 as a batched step of decoding sequences (Q8/Q4: `moe_grouped_*`).
        dev.set_decode_step(case == 2);
        let input_rows = experts + 1 + 2 * shared;
        let input = random_matrix(rng, WeightFormat::Bf16, input_rows, hidden);
        let mut x = rng.signed_vec(tokens * hidden, 1.0);
        for _ in 0..20 {
            if routing_is_clear(&input, &x, tokens, experts, k) {
                break;
            }
            x = rng.signed_vec(tokens * hidden, 1.0);
        }
        for format in FORMATS {
            let shared_down = random_matrix(rng, format, hidden, shared);
            let gate_up = random_matrix(rng, format, experts * 2 * inter, hidden);
            // Row-wise quantization: expert e's own matrix holds the stacked one's codes.
            let down_values = rng.signed_vec(experts * hidden * inter, 0.1);
            let down = matrix(format, &down_values, experts * hidden, inter);
            let expert_down: Vec<Linear> = down_values
                .chunks(hidden * inter)
                .map(|v| matrix(format, v, hidden, inter))
                .collect();
            let want = moe_on_cpu(
                &input,
                &shared_down,
                &gate_up,
                &expert_down,
                &x,
                tokens,
                (experts, k, inter, shared),
                renormalize,
            );
            let shape = format!(
                "{format:?} E {experts}, k {k}, H {hidden}, I {inter}, I_s {shared}, T {tokens}"
            );
            // Q8/Q4: int8 activations on one side and not the other, twice in a row.
            let bound = if format == WeightFormat::Bf16 {
                1e-4
            } else {
                3e-2
            };
            let run = || {
                testing::moe_block_of(
                    dev,
                    &config,
                    &input,
                    &shared_down,
                    &gate_up,
                    &down,
                    &x,
                    tokens,
                )
                .unwrap()
            };
            out.push(check(shape.clone(), &run(), &want, bound));
            if case == 2 && format != WeightFormat::Bf16 {
                // The shared expert in the experts' format rides in their launches, and a
                // batched decode step then groups the experts (`moe_route_warps`, the grouped
                // kernels, `moe_combine_slots`): every row bit for bit that row decoded alone.
                let input_q = random_matrix(rng, format, input_rows, hidden);
                let block = |x: &[f32], tokens: usize| {
                    testing::moe_block_of(
                        dev,
                        &config,
                        &input_q,
                        &shared_down,
                        &gate_up,
                        &down,
                        x,
                        tokens,
                    )
                    .unwrap()
                };
                let batched = block(&x, tokens);
                dev.set_decode_step(false);
                let alone: Vec<f32> = x.chunks(hidden).flat_map(|row| block(row, 1)).collect();
                dev.set_decode_step(true);
                out.push(check(
                    format!("grouped decode step vs each row alone, {shape}"),
                    &batched,
                    &alone,
                    f32::MIN_POSITIVE,
                ));
            }
            if tokens > 8 && tensor_cores {
                dev.set_tensor_cores(false);
                let got = run();
                dev.set_tensor_cores(true);
                out.push(check(format!("per-pair {shape}"), &got, &want, bound));
            }
        }
    }
    dev.set_decode_step(false);
    out
}

/// Causal gated attention on the CPU: each token t (position start + t) and query head h over
/// positions 0..=start + t of its kv head, times sigmoid(gate).
fn attention_on_cpu(
    q: &[f32],
    gate: &[f32],
    keys: &[f32],
    values: &[f32],
    (n_h, n_kv, d): (usize, usize, usize),
    tokens: usize,
    start: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; tokens * n_h * d];
    let mut scores = Vec::new();
    for t in 0..tokens {
        for h in 0..n_h {
            let at = (t * n_h + h) * d;
            let o = &mut out[at..at + d];
            attend(
                &q[at..at + d],
                HeadCache {
                    data: keys,
                    heads: n_kv,
                    head_dim: d,
                },
                HeadCache {
                    data: values,
                    heads: n_kv,
                    head_dim: d,
                },
                h / (n_h / n_kv),
                0..start + t + 1,
                1.0 / (d as f32).sqrt(),
                &mut scores,
                o,
            );
            for (v, g) in o.iter_mut().zip(&gate[at..at + d]) {
                *v *= sigmoid(*g);
            }
        }
    }
    out
}

fn attention(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    let shapes = [
        (16, 2, 256),
        (24, 4, 256),
        (8, 8, 128),
        (4, 2, 16),
        (6, 3, 64),
    ];
    for (case, heads) in shapes.into_iter().enumerate() {
        let (n_h, n_kv, d) = heads;
        let start = pick(rng, 0, 700);
        for tokens in [1, pick(rng, 2, 8), pick(rng, 9, 100)] {
            let q = rng.signed_vec(tokens * n_h * d, 1.0);
            let gate = rng.signed_vec(tokens * n_h * d, 2.0);
            let keys = rng.signed_vec((start + tokens) * n_kv * d, 1.0);
            let values = rng.signed_vec((start + tokens) * n_kv * d, 1.0);
            let want = attention_on_cpu(&q, &gate, &keys, &values, heads, tokens, start);
            let shape = format!("heads {heads:?}, {tokens} tokens after {start}");
            let serial =
                testing::attention_of(dev, &q, &gate, &keys, &values, heads, tokens, start, false)
                    .unwrap()
                    .expect("the serial kernel takes every shape");
            out.push(check(format!("serial {shape}"), &serial, &want, 1e-5));
            if tokens > 8 {
                if let Some(tiled) = testing::attention_of(
                    dev, &q, &gate, &keys, &values, heads, tokens, start, true,
                )
                .unwrap()
                {
                    out.push(check(format!("tiled {shape}"), &tiled, &want, 1e-5));
                }
            } else {
                // A cache reserved beyond the context, as in a captured graph.
                let capacity = (start + tokens).next_multiple_of(256) + 256 * (case % 2);
                let split = testing::attention_split_of(
                    dev, &q, &gate, &keys, &values, heads, tokens, start, capacity,
                )
                .unwrap()
                .expect("flash-decoding takes these shapes");
                out.push(check(format!("split {shape}"), &split, &want, 1e-5));
            }
        }
    }
    out
}

fn hyper_connections(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let (tokens, n, hidden) = (pick(rng, 1, 40), pick(rng, 1, 4), pick(rng, 1, 2000));
        let shape = format!("T {tokens}, {n} streams, H {hidden}");
        // mix: x[t, i] = Σ_s sigmoid(a[t, s, i])·normed[t, s, i] / n.
        let a = rng.signed_vec(tokens * n * hidden, 3.0);
        let normed = rng.signed_vec(tokens * n * hidden, 1.0);
        let (d_a, d_normed) = (dev.upload(&a).unwrap(), dev.upload(&normed).unwrap());
        let d_x = dev.zeros::<f32>(tokens * hidden).unwrap();
        kernels::qwen4::HyperConnectionMix::launch(
            dev,
            Launch::elementwise(tokens * hidden),
            d_a.arg(),
            d_normed.arg(),
            d_x.arg(),
            i(tokens),
            i(n),
            i(hidden),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * hidden)
            .map(|e| {
                let (t, c) = (e / hidden, e % hidden);
                let sum: f32 = (0..n)
                    .map(|s| {
                        let at = t * n * hidden + s * hidden + c;
                        sigmoid(a[at]) * normed[at]
                    })
                    .sum();
                sum / n as f32
            })
            .collect();
        let got = dev.download(&d_x, 0, tokens * hidden).unwrap();
        out.push(check(format!("mix {shape}"), &got, &want, 1e-6));

        // inject: hs[t, s, i] += 2·sigmoid(o[t·ld + s] / n)·y[t, i].
        let ld = n + pick(rng, 0, 9);
        let hs = rng.signed_vec(tokens * n * hidden, 1.0);
        let y = rng.signed_vec(tokens * hidden, 1.0);
        let o = rng.signed_vec(tokens * ld, 3.0);
        let (d_hs, d_y, d_o) = (
            dev.upload(&hs).unwrap(),
            dev.upload(&y).unwrap(),
            dev.upload(&o).unwrap(),
        );
        kernels::qwen4::HyperConnectionInject::launch(
            dev,
            Launch::elementwise(tokens * n * hidden),
            d_hs.arg(),
            d_y.arg(),
            d_o.arg(),
            i(ld),
            i(tokens),
            i(n),
            i(hidden),
        )
        .unwrap();
        let want: Vec<f32> = (0..tokens * n * hidden)
            .map(|e| {
                let (t, s, c) = (e / (n * hidden), (e / hidden) % n, e % hidden);
                hs[e] + 2.0 * sigmoid(o[t * ld + s] / n as f32) * y[t * hidden + c]
            })
            .collect();
        let got = dev.download(&d_hs, 0, tokens * n * hidden).unwrap();
        out.push(check(format!("inject {shape}, ld {ld}"), &got, &want, 1e-6));
    }
    out
}

fn ple(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for _ in 0..3 {
        let (tokens, n, hidden) = (pick(rng, 1, 30), pick(rng, 1, 4), pick(rng, 1, 1500));
        let shape = format!("T {tokens}, {n} streams, H {hidden}");

        // gates[t, s·H + i] = sigmoid(γ)·V[t, i], γ = signed sqrt of max(|K_s·Q_s/√H|, 1e-6).
        let ldv = hidden + pick(rng, 0, 5);
        let keys = rng.signed_vec(tokens * n * hidden, 1.0);
        let queries = rng.signed_vec(tokens * n * hidden, 1.0);
        let vals = rng.signed_vec(tokens * ldv, 1.0);
        let (d_k, d_q, d_v) = (
            dev.upload(&keys).unwrap(),
            dev.upload(&queries).unwrap(),
            dev.upload(&vals).unwrap(),
        );
        let d_gates = dev.zeros::<f32>(tokens * n * hidden).unwrap();
        kernels::qwen4::PleGates::launch(
            dev,
            Launch::new((tokens as u32, n as u32, 1), 256, 0),
            d_k.arg(),
            d_q.arg(),
            d_v.arg(),
            i(ldv),
            d_gates.arg(),
            i(n),
            i(hidden),
        )
        .unwrap();
        let mut want = vec![0.0f32; tokens * n * hidden];
        for t in 0..tokens {
            for s in 0..n {
                let base = t * n * hidden + s * hidden;
                let dot: f32 = (0..hidden)
                    .map(|c| keys[base + c] * queries[base + c])
                    .sum();
                let gamma = dot / (hidden as f32).sqrt();
                let g = sigmoid(gamma.abs().max(1e-6).sqrt().copysign(gamma));
                for c in 0..hidden {
                    want[base + c] = g * vals[t * ldv + c];
                }
            }
        }
        let got = dev.download(&d_gates, 0, tokens * n * hidden).unwrap();
        out.push(check(format!("gates {shape}"), &got, &want, 1e-5));

        // conv: c_t = Σ_j w[c, j]·G_{t − dil·(K−1−j)} over [state | normed];
        // hs += gates + silu(c); the state keeps the last (K−1)·dil rows.
        let (width, taps, dil) = (pick(rng, 1, 3000), pick(rng, 1, 4), pick(rng, 1, 4));
        let past = (taps - 1) * dil;
        let hs = rng.signed_vec(tokens * width, 1.0);
        let gates = rng.signed_vec(tokens * width, 1.0);
        let normed = rng.signed_vec(tokens * width, 1.0);
        let state = rng.signed_vec(past.max(1) * width, 1.0);
        let w = rng.signed_vec(width * taps, 0.5);
        let (d_hs, d_g, d_n, d_s, d_w) = (
            dev.upload(&hs).unwrap(),
            dev.upload(&gates).unwrap(),
            dev.upload(&normed).unwrap(),
            dev.upload(&state).unwrap(),
            dev.upload(&w).unwrap(),
        );
        kernels::qwen4::PleConv::launch(
            dev,
            Launch::new((width.div_ceil(128) as u32, 1, 1), 128, 0),
            d_hs.arg(),
            d_g.arg(),
            d_n.arg(),
            d_s.arg(),
            d_w.arg(),
            i(tokens),
            i(width),
            i(taps),
            i(dil),
        )
        .unwrap();
        let rows: Vec<&[f32]> = (0..past)
            .map(|r| &state[r * width..(r + 1) * width])
            .chain((0..tokens).map(|t| &normed[t * width..(t + 1) * width]))
            .collect();
        let mut want = hs.clone();
        for t in 0..tokens {
            for c in 0..width {
                let acc: f32 = (0..taps)
                    .map(|j| w[c * taps + j] * rows[past + t - dil * (taps - 1 - j)][c])
                    .sum();
                want[t * width + c] += gates[t * width + c] + silu(acc);
            }
        }
        let got = dev.download(&d_hs, 0, tokens * width).unwrap();
        let conv = format!("conv T {tokens}, W {width}, K {taps}, dilation {dil}");
        out.push(check(conv.clone(), &got, &want, 1e-5));
        let want_state: Vec<f32> = rows[rows.len() - past..].concat();
        let got_state = dev.download(&d_s, 0, past * width).unwrap();
        out.push(check(
            format!("{conv}: state"),
            &got_state,
            &want_state,
            1e-7,
        ));

        // advance: the history keeps the last `past` ids of [history | ids].
        let past = pick(rng, 1, 5);
        let history: Vec<i32> = (0..past).map(|_| pick(rng, 0, 1000) as i32).collect();
        let ids: Vec<i32> = (0..tokens).map(|_| pick(rng, 0, 1000) as i32).collect();
        let (d_hist, d_ids) = (dev.upload(&history).unwrap(), dev.upload(&ids).unwrap());
        kernels::qwen4::PleAdvance::launch(
            dev,
            Launch::new((1, 1, 1), 32, 0),
            d_hist.arg(),
            d_ids.arg(),
            i(tokens),
            i(past),
        )
        .unwrap();
        let all: Vec<i32> = history.iter().chain(&ids).copied().collect();
        let want: Vec<f32> = all[all.len() - past..].iter().map(|&v| v as f32).collect();
        let got: Vec<f32> = dev
            .download(&d_hist, 0, past)
            .unwrap()
            .iter()
            .map(|&v| v as f32)
            .collect();
        out.push(check(
            format!("advance past {past}, T {tokens}"),
            &got,
            &want,
            1e-7,
        ));
    }
    out
}

fn argmax_op(dev: &Device, rng: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    for case in 0..4 {
        let n = pick(rng, 1, 300_000);
        let mut values = rng.signed_vec(n, 10.0);
        if case == 3 && n > 2 {
            // A tie: the first index wins.
            let top = values.iter().copied().fold(f32::MIN, f32::max) + 1.0;
            values[n / 3] = top;
            values[n - 1] = top;
        }
        let got = testing::argmax_of(dev, &values).unwrap();
        let want = argmax(&values);
        out.push(Check {
            what: format!("n {n}: device {got}, CPU {want}"),
            err: if got == want { 0.0 } else { 1.0 },
            bound: 0.5,
        });
    }
    out
}
