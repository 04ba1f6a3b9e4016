//! GGUF files of the fixtures (`fixtures/gguf/`, written by `tools/gguf_from_fixture.py` in
//! llama.cpp's converter layout, and `fixtures/gguf/llama_cpp/` by llama.cpp's converter
//! itself): bf16 files reproduce transformers' logits, quantized files
//! their exactly dequantized copy, directly, quantized on load and converted to an install.

mod common;

use std::path::{Path, PathBuf};

use common::{fixtures, max_abs_diff, Reference, TempDir};
use spindle_cpu::experts::ExpertResidency;
use spindle_cpu::{Engine, LoadOptions};
use spindle_model::install;
use spindle_model::quant::WeightFormat;

/// Bound on max |Δlogit| against the float64 reference (as `tests/fixtures.rs`).
const TOLERANCE: f32 = 1e-4;

fn gguf(name: &str) -> PathBuf {
    let path = fixtures().join("gguf").join(name);
    assert!(path.is_file(), "GGUF fixture {} is missing", path.display());
    path
}

fn load(path: &Path, quant: WeightFormat) -> Engine {
    let options = LoadOptions {
        quant,
        ..LoadOptions::default()
    };
    Engine::load_with(path, &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check_against_reference(file: &str, fixture: &str) {
    let reference = Reference::load(fixture);
    let engine = load(&gguf(file), WeightFormat::Bf16);
    let prompt = reference.ids("prompt_ids");
    let expected = reference.ids("gen_ids");
    let run = engine.greedy(&prompt, expected.len()).unwrap();
    let prefill = max_abs_diff(&run.prefill_logits, &reference.f32("prefill_logits").1);
    let decode = max_abs_diff(&run.decode_logits, &reference.f32("decode_logits").1);
    println!("{file}: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}");
    assert!(
        prefill < TOLERANCE,
        "{file}: prefill logits differ by {prefill}"
    );
    assert!(
        decode < TOLERANCE,
        "{file}: decode logits differ by {decode}"
    );
    assert_eq!(run.gen_ids, expected, "{file}: greedy tokens");
}

#[test]
fn qwen35moe_bf16_gguf_matches_transformers() {
    check_against_reference("qwen3_5_moe.bf16.gguf", "qwen3_5_moe");
}

#[test]
fn qwen35_split_bf16_gguf_matches_transformers() {
    // A split set, opened from its first part.
    check_against_reference("qwen3_5_dense.bf16-00001-of-00003.gguf", "qwen3_5_dense");
}

#[test]
fn qwen3next_bf16_gguf_matches_transformers() {
    check_against_reference("qwen3_next_moe.bf16.gguf", "qwen3_next_moe");
}

/// Files written by llama.cpp's own converter (`convert_hf_to_gguf.py` of the tree PyPI's
/// `llama-cpp-python` 0.3.36 carries, through `tools/gpu/llama_convert.py`, bf16, no
/// vocabulary), not by spindle's re-implementation of its transforms.
#[test]
fn gguf_files_from_llama_cpps_converter_match_transformers() {
    for (file, fixture) in [
        ("llama_cpp/qwen3_5_moe.bf16.gguf", "qwen3_5_moe"),
        ("llama_cpp/qwen3_5_dense.bf16.gguf", "qwen3_5_dense"),
        ("llama_cpp/qwen3_next_moe.bf16.gguf", "qwen3_next_moe"),
    ] {
        check_against_reference(file, fixture);
    }
}

fn same_run(a: &Engine, b: &Engine, what: &str) {
    let prompt = Reference::load("qwen3_5_moe_fused").ids("prompt_ids");
    let (ra, rb) = (a.greedy(&prompt, 6).unwrap(), b.greedy(&prompt, 6).unwrap());
    let prefill = max_abs_diff(&ra.prefill_logits, &rb.prefill_logits);
    let decode = max_abs_diff(&ra.decode_logits, &rb.decode_logits);
    println!("{what}: prefill max|Δ| {prefill:.2e}, decode max|Δ| {decode:.2e}");
    assert!(
        prefill <= 1e-5 && decode <= 1e-5,
        "{what}: logits differ by {prefill} / {decode}"
    );
    assert_eq!(ra.gen_ids, rb.gen_ids, "{what}: greedy tokens");
}

#[test]
fn q8_0_and_q4_0_gguf_match_their_dequantized_copy() {
    // Q8_0 projections, Q4_0 routed experts; the copy holds gguf.quants.dequantize of each.
    let quantized = gguf("qwen3_5_moe_fused.q8_0.gguf");
    let dequantized = gguf("qwen3_5_moe_fused.q8_0.dequantized.gguf");
    same_run(
        &load(&quantized, WeightFormat::Bf16),
        &load(&dequantized, WeightFormat::Bf16),
        "as stored",
    );
    same_run(
        &load(&quantized, WeightFormat::Q8),
        &load(&dequantized, WeightFormat::Q8),
        "--quant q8",
    );
    // The quantization is real: the logits differ from the bf16 fixture's.
    let prompt = Reference::load("qwen3_5_moe_fused").ids("prompt_ids");
    let original = Reference::load("qwen3_5_moe_fused").f32("prefill_logits").1;
    let run = load(&quantized, WeightFormat::Bf16)
        .greedy(&prompt, 1)
        .unwrap();
    assert!(max_abs_diff(&run.prefill_logits, &original) > 1e-3);
}

#[test]
fn gguf_converts_to_an_install_that_streams_experts() {
    let src = gguf("qwen3_5_moe_fused.q8_0.gguf");
    let tmp = TempDir::new("gguf-convert");
    let dst = tmp.0.join("install");
    install::convert(&src, &dst, WeightFormat::Bf16, &mut |_| true)
        .unwrap_or_else(|e| panic!("convert: {e}"));
    let streamed = LoadOptions {
        experts: ExpertResidency::Streamed,
        expert_slots: Some(2),
        ..LoadOptions::default()
    };
    let installed = Engine::load_with(&dst, &streamed).unwrap();
    same_run(
        &installed,
        &load(&src, WeightFormat::Bf16),
        "install from GGUF",
    );
}

/// A qwen35moe model of 256-wide rows (the K-quant block) built here: every projection of
/// random Q4_K / Q5_K / Q6_K blocks (small scales), norms and GDN vectors f32. Written twice:
/// as K-quants, and as f32 holding the dequantized values (the dequantizers are checked
/// against the `gguf` package in `spindle-model`'s `gguf_quants` test).
/// With `tied`, the file has no `output.weight` (the head is the embedding).
fn write_k_quant_pair(quantized: &Path, dequantized: &Path, tied: bool) {
    use spindle_model::gguf::file::Value;
    use spindle_model::gguf::quants::{dequantize, GgmlType};
    use spindle_model::gguf::write::{write, TensorOut};
    use spindle_testkit::Rng;

    let mut rng = Rng(0x6a4f);
    // An f16 by truncation (the values only need to be small and normal).
    let half = |x: f32| {
        let bits = x.to_bits();
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
        let h =
            ((bits >> 16) & 0x8000) | ((exp.clamp(1, 30) as u32) << 10) | ((bits >> 13) & 0x3ff);
        (h as u16).to_le_bytes()
    };
    let mut blocks = |ty: GgmlType, elements: usize| -> Vec<u8> {
        let n = elements / 256;
        let mut out = Vec::with_capacity(n * ty.block_bytes());
        for _ in 0..n {
            let mut b: Vec<u8> = (0..ty.block_bytes())
                .map(|_| (rng.unit() * 256.0) as u8)
                .collect();
            match ty {
                GgmlType::Q4K | GgmlType::Q5K => {
                    b[0..2].copy_from_slice(&half(rng.signed(2e-3)));
                    b[2..4].copy_from_slice(&half(rng.signed(2e-3)));
                }
                GgmlType::Q6K => b[208..210].copy_from_slice(&half(rng.signed(1e-4))),
                _ => unreachable!(),
            }
            out.extend(b);
        }
        out
    };
    const H: usize = 256;
    // (name, type, ne)
    let mut specs: Vec<(String, GgmlType, Vec<usize>)> = vec![
        ("token_embd.weight".into(), GgmlType::Q6K, vec![H, 256]),
        ("output.weight".into(), GgmlType::Q6K, vec![H, 256]),
    ];
    if tied {
        specs.pop();
    }
    for (l, gdn) in [(0, true), (1, false)] {
        let mut add =
            |name: &str, ty, ne: Vec<usize>| specs.push((format!("blk.{l}.{name}"), ty, ne));
        if gdn {
            add("attn_qkv.weight", GgmlType::Q4K, vec![H, 512]);
            add("attn_gate.weight", GgmlType::Q5K, vec![H, 256]);
            add("ssm_alpha.weight", GgmlType::Q4K, vec![H, 4]);
            add("ssm_beta.weight", GgmlType::Q6K, vec![H, 4]);
            add("ssm_out.weight", GgmlType::Q5K, vec![256, H]);
        } else {
            add("attn_q.weight", GgmlType::Q4K, vec![H, 512]);
            add("attn_k.weight", GgmlType::Q5K, vec![H, 128]);
            add("attn_v.weight", GgmlType::Q6K, vec![H, 128]);
            add("attn_output.weight", GgmlType::Q4K, vec![256, H]);
        }
        add("ffn_gate_exps.weight", GgmlType::Q4K, vec![H, 256, 4]);
        add("ffn_up_exps.weight", GgmlType::Q5K, vec![H, 256, 4]);
        add("ffn_down_exps.weight", GgmlType::Q6K, vec![256, H, 4]);
        add("ffn_gate_shexp.weight", GgmlType::Q4K, vec![H, 256]);
        add("ffn_up_shexp.weight", GgmlType::Q5K, vec![H, 256]);
        add("ffn_down_shexp.weight", GgmlType::Q6K, vec![256, H]);
    }
    let mut quant_bytes: Vec<Vec<u8>> = specs
        .iter()
        .map(|(_, ty, ne)| blocks(*ty, ne.iter().product()))
        .collect();
    let mut deq_bytes: Vec<Vec<u8>> = specs
        .iter()
        .zip(&quant_bytes)
        .map(|((_, ty, _), b)| bytemuck::cast_slice(&dequantize(*ty, b)).to_vec())
        .collect();
    // The f32 tensors, the same in both files.
    let mut f32s: Vec<(String, Vec<usize>, Vec<f32>)> = vec![(
        "output_norm.weight".into(),
        vec![H],
        (0..H).map(|_| 1.0 + rng.signed(0.1)).collect(),
    )];
    for (l, gdn) in [(0, true), (1, false)] {
        let mut add =
            |name: &str, ne: Vec<usize>, v: Vec<f32>| f32s.push((format!("blk.{l}.{name}"), ne, v));
        add(
            "attn_norm.weight",
            vec![H],
            (0..H).map(|_| 1.0 + rng.signed(0.1)).collect(),
        );
        add(
            "post_attention_norm.weight",
            vec![H],
            (0..H).map(|_| 1.0 + rng.signed(0.1)).collect(),
        );
        if gdn {
            add("ssm_conv1d.weight", vec![4, 512], rng.signed_vec(2048, 0.5));
            add(
                "ssm_a",
                vec![4],
                (0..4).map(|_| -0.5 - rng.unit()).collect(),
            );
            add("ssm_dt.bias", vec![4], rng.signed_vec(4, 0.5));
            add(
                "ssm_norm.weight",
                vec![64],
                (0..64).map(|_| 1.0 + rng.signed(0.1)).collect(),
            );
        } else {
            add(
                "attn_q_norm.weight",
                vec![64],
                (0..64).map(|_| 1.0 + rng.signed(0.1)).collect(),
            );
            add(
                "attn_k_norm.weight",
                vec![64],
                (0..64).map(|_| 1.0 + rng.signed(0.1)).collect(),
            );
        }
        add(
            "ffn_gate_inp.weight",
            vec![H, 4],
            rng.signed_vec(4 * H, 0.1),
        );
        add("ffn_gate_inp_shexp.weight", vec![H], rng.signed_vec(H, 0.1));
    }
    let u = |n: u64| Value::U64(n);
    let arch = "qwen35moe";
    let metadata: Vec<(String, Value)> = [
        ("block_count", u(2)),
        ("context_length", u(4096)),
        ("embedding_length", u(H as u64)),
        ("attention.head_count", u(4)),
        ("attention.head_count_kv", u(2)),
        ("attention.key_length", u(64)),
        ("attention.value_length", u(64)),
        ("attention.layer_norm_rms_epsilon", Value::F64(1e-6)),
        ("rope.freq_base", Value::F64(10000.0)),
        ("rope.dimension_count", u(16)),
        ("expert_count", u(4)),
        ("expert_used_count", u(2)),
        ("expert_feed_forward_length", u(256)),
        ("expert_shared_feed_forward_length", u(256)),
        ("ssm.conv_kernel", u(4)),
        ("ssm.state_size", u(64)),
        ("ssm.group_count", u(2)),
        ("ssm.time_step_rank", u(4)),
        ("ssm.inner_size", u(256)),
        (
            "attention.recurrent_layers",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{arch}.{k}"), v))
    .chain([
        ("general.architecture".to_owned(), Value::Str(arch.into())),
        ("tokenizer.ggml.eos_token_id".to_owned(), u(1)),
    ])
    .collect();
    let f32_bytes: Vec<Vec<u8>> = f32s
        .iter()
        .map(|(_, _, v)| bytemuck::cast_slice(v).to_vec())
        .collect();
    for (path, quantized_file) in [(quantized, true), (dequantized, false)] {
        let bytes = if quantized_file {
            &mut quant_bytes
        } else {
            &mut deq_bytes
        };
        let mut tensors: Vec<TensorOut> = specs
            .iter()
            .zip(bytes.iter())
            .map(|((name, ty, ne), b)| TensorOut {
                name,
                ty: if quantized_file { *ty } else { GgmlType::F32 },
                ne: ne.clone(),
                bytes: b,
            })
            .collect();
        tensors.extend(
            f32s.iter()
                .zip(&f32_bytes)
                .map(|((name, ne, _), b)| TensorOut {
                    name,
                    ty: GgmlType::F32,
                    ne: ne.clone(),
                    bytes: b,
                }),
        );
        write(path, &metadata, &tensors).unwrap();
    }
}

#[test]
fn k_quant_gguf_matches_its_dequantized_copy() {
    let tmp = TempDir::new("gguf-kquant");
    let (q, d) = (tmp.0.join("k.gguf"), tmp.0.join("k-f32.gguf"));
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 256).collect();
    // Tied: the head quantized on load from a dequantized embedding the lookup still reads.
    for (tied, quant) in [
        (false, WeightFormat::Bf16),
        (false, WeightFormat::Q8),
        (true, WeightFormat::Q4),
    ] {
        write_k_quant_pair(&q, &d, tied);
        let (a, b) = (load(&q, quant), load(&d, quant));
        let (ra, rb) = (a.greedy(&prompt, 6).unwrap(), b.greedy(&prompt, 6).unwrap());
        assert!(ra.prefill_logits.iter().all(|v| v.is_finite()));
        assert!(
            ra.prefill_logits.iter().any(|&v| v != ra.prefill_logits[0]),
            "constant logits"
        );
        assert_eq!(
            ra.prefill_logits, rb.prefill_logits,
            "{quant}: prefill logits"
        );
        assert_eq!(ra.decode_logits, rb.decode_logits, "{quant}: decode logits");
        assert_eq!(ra.gen_ids, rb.gen_ids, "{quant}: greedy tokens");
    }
}

/// A qwen35moe model of 256-wide rows quantized by llama.cpp's own `llama-quantize`
/// (`fixtures/gguf/llama_cpp/qwen35moe_k256.*.gguf`, made by `tools/make_kquant_fixture.py`):
/// its tensors, dequantized by spindle, hash to what `gguf.quants.dequantize` gives
/// (`*.dequantized.json`), so the f32 copy written here holds exactly the `gguf` package's
/// values; spindle's logits on the quantized file equal those on that copy, as stored and
/// re-encoded by `--quant q8|q4`.
#[test]
fn gguf_quantized_by_llama_quantize_matches_its_dequantized_copy() {
    use serde_json::Value as Json;
    use sha2::{Digest, Sha256};
    use spindle_model::gguf::file::GgufFile;
    use spindle_model::gguf::quants::{dequantize, GgmlType};
    use spindle_model::gguf::write::{write, TensorOut};

    let tmp = TempDir::new("gguf-llama-quantize");
    let prompt: Vec<u32> = (0..20).map(|i| (i * 613 + 9) % 4096).collect();
    for (name, k_types) in [
        ("qwen35moe_k256.Q4_K_M", ["Q4_K", "Q6_K"]),
        ("qwen35moe_k256.Q5_K_M", ["Q5_K", "Q6_K"]),
    ] {
        let quantized = gguf(&format!("llama_cpp/{name}.gguf"));
        let expected: Json = serde_json::from_slice(
            &std::fs::read(gguf(&format!("llama_cpp/{name}.dequantized.json"))).unwrap(),
        )
        .unwrap();
        let expected = expected["tensors"].as_array().unwrap();
        let file = GgufFile::open(&quantized).unwrap();
        assert_eq!(file.tensors.len(), expected.len(), "{name}: tensor count");
        let mut values = Vec::new();
        for (t, want) in file.tensors.iter().zip(expected) {
            assert_eq!(t.name, want["name"], "{name}: tensor order");
            assert_eq!(t.ty.name(), want["type"], "{name}: {}", t.name);
            assert_eq!(Json::from(t.ne.clone()), want["ne"], "{name}: {}", t.name);
            let v = dequantize(t.ty, file.bytes(t));
            assert_eq!(v.len(), t.elements(), "{name}: {}", t.name);
            let sha = format!("{:x}", Sha256::digest(bytemuck::cast_slice::<f32, u8>(&v)));
            assert_eq!(
                sha, want["sha256_f32"],
                "{name}: {} ({}) dequantizes differently from gguf.quants.dequantize",
                t.name, want["type"]
            );
            values.push(v);
        }
        for ty in k_types {
            assert!(
                file.tensors.iter().any(|t| t.ty.name() == ty),
                "{name}: no {ty} tensor"
            );
        }
        // Every matrix but the routers and the GDN's conv (llama.cpp keeps those f32).
        let unquantized = [GgmlType::F32, GgmlType::F16, GgmlType::Bf16];
        let projections = file
            .tensors
            .iter()
            .filter(|t| t.ne.len() >= 2 && !t.name.contains("ffn_gate_inp"))
            .filter(|t| !t.name.contains("ssm_conv1d"))
            .collect::<Vec<_>>();
        assert!(
            projections.iter().all(|t| !unquantized.contains(&t.ty)),
            "{name}: a projection left unquantized"
        );

        let copy = tmp.0.join(format!("{name}.dequantized.gguf"));
        let tensors: Vec<TensorOut> = file
            .tensors
            .iter()
            .zip(&values)
            .map(|(t, v)| TensorOut {
                name: &t.name,
                ty: GgmlType::F32,
                ne: t.ne.clone(),
                bytes: bytemuck::cast_slice(v),
            })
            .collect();
        write(&copy, &file.metadata, &tensors).unwrap();

        let stored = load(&quantized, WeightFormat::Bf16)
            .greedy(&prompt, 6)
            .unwrap();
        for quant in [WeightFormat::Bf16, WeightFormat::Q8, WeightFormat::Q4] {
            let (a, b) = (load(&quantized, quant), load(&copy, quant));
            let (ra, rb) = (a.greedy(&prompt, 6).unwrap(), b.greedy(&prompt, 6).unwrap());
            assert!(ra.prefill_logits.iter().all(|v| v.is_finite()));
            assert_eq!(
                ra.prefill_logits, rb.prefill_logits,
                "{name} {quant}: prefill"
            );
            assert_eq!(ra.decode_logits, rb.decode_logits, "{name} {quant}: decode");
            assert_eq!(ra.gen_ids, rb.gen_ids, "{name} {quant}: greedy tokens");
            let drift = max_abs_diff(&ra.prefill_logits, &stored.prefill_logits);
            println!(
                "{name} {quant}: max|Δ| against as stored {drift:.2e}, tokens {:?}",
                ra.gen_ids
            );
            if quant == WeightFormat::Q8 {
                assert_eq!(
                    ra.gen_ids, stored.gen_ids,
                    "{name} q8: greedy tokens as stored"
                );
            }
        }
    }
}

#[test]
fn qwen4exp_bf16_gguf_matches_transformers() {
    // Hyper-connections, the QSA indexer and PLE, mapped back from llama.cpp's layout.
    check_against_reference("qwen4_exp.bf16.gguf", "qwen4_exp");
}

/// A copy of `src` at `dst` with metadata key `key` replaced by `value` (removed when `None`)
/// and tensor `drop` left out.
fn rewrite(
    src: &Path,
    dst: &Path,
    key: &str,
    value: Option<spindle_model::gguf::file::Value>,
    drop: &str,
) {
    use spindle_model::gguf::file::GgufFile;
    use spindle_model::gguf::write::{write, TensorOut};
    let f = GgufFile::open(src).unwrap();
    let metadata: Vec<_> = f
        .metadata
        .iter()
        .filter_map(|(k, v)| match (k == key, &value) {
            (false, _) => Some((k.clone(), v.clone())),
            (true, Some(new)) => Some((k.clone(), new.clone())),
            (true, None) => None,
        })
        .collect();
    let tensors: Vec<TensorOut> = f
        .tensors
        .iter()
        .filter(|t| t.name != drop)
        .map(|t| TensorOut {
            name: &t.name,
            ty: t.ty,
            ne: t.ne.clone(),
            bytes: f.bytes(t),
        })
        .collect();
    write(dst, &metadata, &tensors).unwrap();
}

#[test]
fn bad_qwen4exp_ggufs_are_refused_by_key_or_tensor() {
    use spindle_model::gguf::file::Value;
    let src = gguf("qwen4_exp.bf16.gguf");
    let tmp = TempDir::new("gguf-qwen4exp-bad");
    let dst = tmp.0.join("bad.gguf");
    let u = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::U64(x)).collect());
    let cases: Vec<(&str, Option<Value>, &str, &str)> = vec![
        // A missing PLE tensor.
        (
            "",
            None,
            "blk.1.ple_key.weight",
            "tensor `blk.1.ple_key.weight` is missing",
        ),
        (
            "",
            None,
            "per_layer_token_embd.weight",
            "tensor `per_layer_token_embd.weight` is missing",
        ),
        // The attention layer with no QSA compress ratio (what the converter writes when the
        // config does not spell the layer type "full_attention").
        (
            "qwen4exp.attention.compress_ratios",
            Some(u(&[0, 0, 0, 0])),
            "",
            "`qwen4exp.attention.compress_ratios` = [0, 0, 0, 0]: attention layer 3",
        ),
        (
            "qwen4exp.attention.indexer.top_k",
            None,
            "",
            "metadata key `qwen4exp.attention.indexer.top_k` is missing",
        ),
        // Hash constants no seed produces.
        (
            "qwen4exp.ple.layer_multipliers",
            Some(u(&[3, 5, 7])),
            "",
            "metadata key `qwen4exp.ple.layer_multipliers` = [3, 5, 7]",
        ),
        (
            "qwen4exp.ple.head_offsets",
            Some(u(&[0, 1009, 2022, 3040])),
            "",
            "metadata key `qwen4exp.ple.head_offsets`",
        ),
        (
            "qwen4exp.ple.layers",
            Some(u(&[0, 1])),
            "",
            "metadata key `qwen4exp.ple.layers` = [0, 1]",
        ),
        (
            "qwen4exp.ple.layers",
            Some(u(&[3])),
            "",
            "metadata key `qwen4exp.ple.layers` = [3]: PLE needs",
        ),
        (
            "qwen4exp.ple.ngram_size",
            Some(Value::U64(1)),
            "",
            "metadata keys `qwen4exp.ple.ngram_size` = 1",
        ),
        (
            "",
            None,
            "blk.3.indexer.k_proj.weight",
            "tensor `blk.3.indexer.k_proj.weight` is missing",
        ),
        (
            "",
            None,
            "blk.2.hc_ffn_inject.weight",
            "tensor `blk.2.hc_ffn_inject.weight` is missing",
        ),
    ];
    for (key, value, drop, expected) in cases {
        rewrite(&src, &dst, key, value, drop);
        let e = match Engine::load_with(&dst, &LoadOptions::default()) {
            Ok(_) => panic!("{key}{drop}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(expected), "{key}{drop}: {e}");
        assert!(
            e.contains("bad.gguf"),
            "{key}{drop}: the file is not named: {e}"
        );
    }
}
