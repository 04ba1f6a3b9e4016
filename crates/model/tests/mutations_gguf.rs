//! GGUF files damaged field by field (counts, lengths, types, dimensions, offsets, metadata
//! values, UTF-8), cut at many lengths and with random bytes replaced: each is refused naming
//! the file, never a panic, never an allocation beyond what the file could hold
//! (`spindle_testkit::mutate`).

mod common;

use std::fs;
use std::path::Path;

use common::gguf_map::{GgufMap, N_KV_AT, N_TENSORS_AT};
use spindle_model::{gguf, weights, Checkpoint, ModelConfig};
use spindle_testkit::fixtures;
use spindle_testkit::mutate::{
    self, flips, put_u32, put_u64, run_cases, truncations, Case, XorShift,
};

#[global_allocator]
static ALLOC: mutate::Bounded = mutate::Bounded;

const Q8: &str = "qwen3_5_moe_fused.q8_0.gguf";

/// Everything spindle reads from a GGUF model: config, tensors, the weight tree, tokenizer.
fn load_gguf(path: &Path) -> Result<(), String> {
    let err = |e: spindle_model::ModelError| e.to_string();
    let config = ModelConfig::from_dir(path).map_err(err)?;
    let checkpoint = Checkpoint::open(path).map_err(err)?;
    weights::load(&checkpoint, &config).map_err(err)?;
    gguf::open_tokenizer_json(path).map_err(err)?;
    gguf::describe(path).map_err(err)?;
    Ok(())
}

fn edited(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = bytes.to_vec();
    edit(&mut out);
    out
}

/// Cases that damage one named header field each.
fn field_cases(b: &[u8], m: &GgufMap) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut refused = |label: String, edit: &dyn Fn(&mut Vec<u8>)| {
        cases.push(Case::refused(label, edited(b, edit)));
    };
    refused("magic GGUX".into(), &|b| b[3] = b'X');
    for v in [0u32, 1, 4, u32::MAX] {
        refused(format!("version {v}"), &|b| put_u32(b, 4, v));
    }
    let n_tensors = m.tensors.len() as u64;
    for n in [0, n_tensors - 1, n_tensors + 1, 1 << 24, u64::MAX] {
        refused(format!("tensor count {n}"), &|b| {
            put_u64(b, N_TENSORS_AT, n)
        });
    }
    let n_kv = m.kvs.len() as u64;
    for n in [n_kv - 1, n_kv + 1, 1 << 24, u64::MAX] {
        refused(format!("metadata count {n}"), &|b| put_u64(b, N_KV_AT, n));
    }
    let first = &m.kvs[0];
    for n in [first.key.len() as u64 + 1, 1 << 40, u64::MAX] {
        refused(format!("first key length {n}"), &|b| {
            put_u64(b, first.key_len_at, n)
        });
    }
    refused("first key not UTF-8".into(), &|b| {
        b[first.key_len_at + 8] = 0xff
    });
    // general.architecture's value (a string).
    let arch = m.kv("general.architecture");
    refused("architecture not UTF-8".into(), &|b| {
        b[arch.value_at + 9] = 0xc3
    });
    for n in [u64::MAX, 1 << 40] {
        refused(format!("architecture length {n}"), &|b| {
            put_u64(b, arch.value_at, n)
        });
    }
    for ty in [13u32, 255, u32::MAX] {
        refused(format!("metadata type {ty}"), &|b| {
            put_u32(b, arch.ty_at, ty)
        });
    }
    let array = m.kv("attention.recurrent_layers");
    for ty in [9u32, 13, 8] {
        refused(format!("recurrent_layers elements of type {ty}"), &|b| {
            put_u32(b, array.value_at, ty)
        });
    }
    for n in [0u64, 3, 5, 1 << 24, u64::MAX] {
        refused(format!("recurrent_layers length {n}"), &|b| {
            put_u64(b, array.value_at + 4, n)
        });
    }
    refused("recurrent_layers bool 2".into(), &|b| {
        b[array.value_at + 12] = 2
    });
    // Tensor infos: the first (Q8_0 output), one F32 norm and the last.
    let picks = [0, 2, m.tensors.len() - 1];
    for &i in &picks {
        let t = &m.tensors[i];
        let name = &t.name;
        for n in [u64::MAX, 1 << 40, t.name.len() as u64 + 1] {
            refused(format!("tensor {name} name length {n}"), &|b| {
                put_u64(b, t.name_len_at, n)
            });
        }
        refused(format!("tensor {name} name not UTF-8"), &|b| {
            b[t.name_len_at + 8] = 0xfe
        });
        for n in [0u32, 5, u32::MAX] {
            refused(format!("tensor {name} n_dims {n}"), &|b| {
                put_u32(b, t.n_dims_at, n)
            });
        }
        for d in [0u64, 2 * t.dims[0], 1 << 40, (1 << 40) + 1, u64::MAX] {
            refused(format!("tensor {name} ne[0] {d}"), &|b| {
                put_u64(b, t.dims_at[0], d)
            });
        }
        let last = *t.dims_at.last().unwrap();
        refused(format!("tensor {name} last dim doubled"), &|b| {
            put_u64(b, last, 2 * t.dims.last().unwrap())
        });
        for ty in [99u32, 6, 1, 30, u32::MAX] {
            refused(format!("tensor {name} type {ty}"), &|b| {
                put_u32(b, t.ty_at, ty)
            });
        }
        for off in [1u64, 32 * 1024 * 1024, u64::MAX - 31, u64::MAX] {
            refused(format!("tensor {name} offset {off}"), &|b| {
                put_u64(b, t.offset_at, off)
            });
        }
    }
    // Dimensions whose product overflows u64, with each dimension in range: a 4-d tensor.
    let t = &m.tensors[0];
    refused("tensor output.weight as 4-d 2^40 each".into(), &|b| {
        let mut out = b[..t.n_dims_at].to_vec();
        out.extend(4u32.to_le_bytes());
        for _ in 0..4 {
            out.extend((1u64 << 40).to_le_bytes());
        }
        out.extend(&b[t.ty_at..]);
        *b = out;
    });
    // Two tensors of one name: blk.1's attn_norm renamed to blk.0's.
    let twin = m
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.attn_norm.weight")
        .unwrap();
    refused("two tensors named blk.0.attn_norm.weight".into(), &|b| {
        b[twin.name_len_at + 8 + 4] = b'0'
    });
    cases
}

/// Cases that set one metadata value: sizes to 0 or beyond any model, floats to NaN / ±inf,
/// the entries of integer arrays to 0 and u32::MAX.
fn metadata_cases(b: &[u8], m: &GgufMap) -> Vec<Case> {
    let mut cases = Vec::new();
    for kv in &m.kvs {
        let array_of = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        match kv.ty {
            9 if array_of(kv.value_at) == 4 || array_of(kv.value_at) == 5 => {
                let n =
                    u64::from_le_bytes(b[kv.value_at + 4..kv.value_at + 12].try_into().unwrap());
                for i in [0, n.saturating_sub(1)] {
                    for v in [0u32, u32::MAX] {
                        let at = kv.value_at + 12 + 4 * i as usize;
                        cases.push(Case::either(
                            format!("{}[{i}] = {v}", kv.key),
                            edited(b, |b| put_u32(b, at, v)),
                        ));
                    }
                }
            }
            10 | 11 => {
                for v in [0u64, 1 << 40, u64::MAX] {
                    cases.push(Case::either(
                        format!("{} = {v}", kv.key),
                        edited(b, |b| put_u64(b, kv.value_at, v)),
                    ));
                }
            }
            4 | 5 => {
                for v in [0u32, 1 << 31, u32::MAX] {
                    cases.push(Case::either(
                        format!("{} = {v}", kv.key),
                        edited(b, |b| put_u32(b, kv.value_at, v)),
                    ));
                }
            }
            6 => {
                for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 0.0] {
                    cases.push(Case::either(
                        format!("{} = {v}", kv.key),
                        edited(b, |b| put_u32(b, kv.value_at, v.to_bits())),
                    ));
                }
            }
            _ => {}
        }
    }
    cases
}

#[test]
fn damaged_gguf_files_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(Q8);
    let pristine = fs::read(fixtures().join("gguf").join(Q8)).unwrap();
    let map = GgufMap::of(&pristine);
    let mut rng = XorShift(0x5eed_6675_6600_0001);
    let mut cases = Vec::new();
    cases.extend(truncations("Q8", &pristine, 0..map.header_end, 60));
    cases.extend(truncations(
        "Q8",
        &pristine,
        map.header_end..pristine.len(),
        15,
    ));
    cases.extend(field_cases(&pristine, &map));
    cases.extend(metadata_cases(&pristine, &map));
    cases.extend(flips("Q8", &pristine, 0..map.header_end, 150, &mut rng));
    run_cases("GGUF Q8_0", cases, &[Q8], |bytes| {
        fs::write(&path, bytes).unwrap();
        load_gguf(&path)
    });
}

#[test]
fn a_damaged_part_of_a_split_set_is_refused_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let parts: Vec<String> = (1..=3)
        .map(|i| format!("qwen3_5_dense.bf16-0000{i}-of-00003.gguf"))
        .collect();
    for part in &parts {
        fs::copy(fixtures().join("gguf").join(part), tmp.path().join(part)).unwrap();
    }
    let second = tmp.path().join(&parts[1]);
    let pristine = fs::read(&second).unwrap();
    let map = GgufMap::of(&pristine);
    let mut rng = XorShift(0x5eed_6675_6600_0002);
    let mut cases = truncations("part 2", &pristine, 0..pristine.len(), 30);
    for key in ["split.no", "split.count"] {
        let kv = map.kv(key);
        for v in [0u64, 2, 3, u64::MAX] {
            let v = if kv.ty == 2 { v & 0xffff } else { v };
            let bytes = edited(&pristine, |b| match kv.ty {
                2 => b[kv.value_at..kv.value_at + 2].copy_from_slice(&(v as u16).to_le_bytes()),
                4 => put_u32(b, kv.value_at, v as u32),
                _ => put_u64(b, kv.value_at, v),
            });
            let expect_ok = (key == "split.no" && v == 1) || (key == "split.count" && v == 3);
            if !expect_ok {
                cases.push(Case::refused(format!("part 2 {key} = {v}"), bytes));
            }
        }
    }
    cases.extend(flips("part 2", &pristine, 0..map.header_end, 40, &mut rng));
    let first = tmp.path().join(&parts[0]);
    run_cases("GGUF split set", cases, &[parts[1].as_str()], |bytes| {
        fs::write(&second, bytes).unwrap();
        load_gguf(&first)
    });
}

/// GPT-2's byte-to-character table: the spelling of each byte token.
fn byte_tokens() -> Vec<String> {
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars = bytes.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![String::new(); 256];
    for (b, c) in bytes.iter().zip(&chars) {
        table[*b as usize] = char::from_u32(*c).unwrap().to_string();
    }
    table
}

#[test]
fn hostile_tokenizer_metadata_is_refused_by_key_or_harmless() {
    use spindle_model::gguf::file::{GgufFile, Value};
    use spindle_model::gguf::write::{write, TensorOut};
    let src = GgufFile::open(&fixtures().join("gguf").join(Q8)).unwrap();
    let s = |t: &str| Value::Str(t.to_owned());
    let mut tokens: Vec<Value> = byte_tokens().iter().map(|t| s(t)).collect();
    tokens.extend(["he", "ll", "hell", "<|im_start|>", "<|im_end|>"].map(s));
    let mut types = vec![Value::I64(1); tokens.len()];
    types[259] = Value::I64(3);
    types[260] = Value::I64(3);
    let tokenizer: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("qwen35")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(["h e", "l l", "he ll"].map(s).to_vec()),
        ),
        ("tokenizer.chat_template".into(), s("{{ messages }}")),
    ];
    let tensors: Vec<TensorOut> = src
        .tensors
        .iter()
        .map(|t| TensorOut {
            name: &t.name,
            ty: t.ty,
            ne: t.ne.clone(),
            bytes: src.bytes(t),
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(Q8);
    let encode = |extra: &[(String, Value)]| {
        let mut metadata = src.metadata.clone();
        metadata.extend(extra.iter().cloned());
        write(&path, &metadata, &tensors).unwrap();
        fs::read(&path).unwrap()
    };
    let pristine = encode(&tokenizer);
    fs::write(&path, &pristine).unwrap();
    assert!(gguf::open_tokenizer_json(&path).unwrap().is_some());
    assert_eq!(
        gguf::open_chat_template(&path).unwrap().as_deref(),
        Some("{{ messages }}")
    );
    let hostile = [
        Value::U64(u64::MAX),
        Value::I64(-1),
        Value::F64(f64::NAN),
        Value::Bool(true),
        s("x"),
        s(&"long ".repeat(10_000)),
        Value::Array(vec![]),
        Value::Array(vec![Value::U64(1); 3]),
        Value::Array(vec![s("a b"); 3]),
        Value::Array(vec![Value::I64(99); 261]),
    ];
    let mut cases = Vec::new();
    for i in 0..tokenizer.len() {
        let key = &tokenizer[i].0;
        for value in &hostile {
            let mut meta = tokenizer.clone();
            meta[i].1 = value.clone();
            // A chat template that is not a string would silently be no template.
            let label = format!("{key} = {value:?}");
            cases.push(match (key.as_str(), value) {
                ("tokenizer.chat_template", Value::Str(_)) => Case::either(label, encode(&meta)),
                ("tokenizer.chat_template", _) => Case::refused(label, encode(&meta)),
                // Types outside llama.cpp's seven.
                ("tokenizer.ggml.token_type", _) => Case::refused(label, encode(&meta)),
                _ => Case::either(label, encode(&meta)),
            });
        }
        let mut meta = tokenizer.clone();
        meta.remove(i);
        let label = format!("{key} removed");
        cases.push(match key.as_str() {
            // Tokens of an unknown kind would silently be no tokenizer.
            "tokenizer.ggml.model" => Case::refused(label, encode(&meta)),
            _ => Case::either(label, encode(&meta)),
        });
    }
    run_cases("GGUF tokenizer metadata", cases, &[Q8], |bytes| {
        fs::write(&path, bytes).unwrap();
        let err = |e: spindle_model::ModelError| e.to_string();
        gguf::open_tokenizer_json(&path).map_err(err)?;
        gguf::open_chat_template(&path).map_err(err)?;
        load_gguf(&path)
    });
}

#[test]
fn qwen4_exp_metadata_given_hostile_values_is_refused_or_harmless() {
    const QWEN4: &str = "qwen4_exp.bf16.gguf";
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(QWEN4);
    let pristine = fs::read(fixtures().join("gguf").join(QWEN4)).unwrap();
    let map = GgufMap::of(&pristine);
    let mut rng = XorShift(0x5eed_6675_6600_0003);
    let mut cases = metadata_cases(&pristine, &map);
    cases.extend(flips(
        "qwen4_exp",
        &pristine,
        0..map.header_end,
        60,
        &mut rng,
    ));
    run_cases("GGUF qwen4_exp metadata", cases, &[QWEN4], |bytes| {
        fs::write(&path, bytes).unwrap();
        load_gguf(&path)
    });
}
