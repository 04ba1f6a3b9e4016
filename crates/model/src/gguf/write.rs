//! A small GGUF (version 3) writer: metadata and tensors as given, data aligned to 32 bytes.
//! Tests and tools use it to build GGUF files from spindle's own data (a tokenizer's
//! metadata, a damaged copy).

use std::io::Write;
use std::path::Path;

use super::file::Value;
use crate::error::{ModelError, Result};
use crate::quant::ggml::GgmlType;

/// One tensor to write: name, type, ggml dimensions (`ne[0]` fastest) and its bytes.
pub struct TensorOut<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub ne: Vec<usize>,
    pub bytes: &'a [u8],
}

fn type_id(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q8_0 => 8,
        GgmlType::Q4K => 12,
        GgmlType::Q5K => 13,
        GgmlType::Q6K => 14,
        GgmlType::Bf16 => 30,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// The GGUF type id of `v` (arrays: 9).
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array(_) => 9,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U64(n) => out.extend(n.to_le_bytes()),
        Value::I64(n) => out.extend(n.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Bool(b) => out.push(*b as u8),
        Value::Str(s) => put_str(out, s),
        Value::Array(items) => {
            let inner = items.first().map_or(10, value_type);
            out.extend(inner.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

/// Writes a GGUF file (64-bit integers and f64 for every number; arrays take the type of
/// their first element).
pub fn write(path: &Path, metadata: &[(String, Value)], tensors: &[TensorOut]) -> Result<()> {
    const ALIGN: usize = 32;
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut out, key);
        out.extend(value_type(value).to_le_bytes());
        put_value(&mut out, value);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, t.name);
        out.extend((t.ne.len() as u32).to_le_bytes());
        for &d in &t.ne {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(type_id(t.ty).to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset = (offset + t.bytes.len()).next_multiple_of(ALIGN);
    }
    out.resize(out.len().next_multiple_of(ALIGN), 0);
    for t in tensors {
        out.extend(t.bytes);
        out.resize(out.len().next_multiple_of(ALIGN), 0);
    }
    let io = |error| ModelError::Io {
        path: path.to_owned(),
        error,
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(&out).map_err(io)
}
