//! The ggml dequantizers against the `gguf` Python package's (`tools/gguf_quant_vectors.py`
//! wrote random blocks of every type and their `gguf.quants.dequantize` as F32).

use spindle_model::gguf::file::GgufFile;
use spindle_model::gguf::quants::{dequantize, GgmlType};
use spindle_testkit::fixtures;

#[test]
fn every_type_dequantizes_exactly_as_the_gguf_package_does() {
    let dir = fixtures().join("gguf");
    let q = GgufFile::open(&dir.join("quant_vectors.gguf")).unwrap();
    let r = GgufFile::open(&dir.join("quant_vectors.reference.gguf")).unwrap();
    let mut seen = Vec::new();
    for t in &q.tensors {
        let reference = r.tensors.iter().find(|x| x.name == t.name).unwrap();
        assert_eq!(reference.ty, GgmlType::F32);
        assert_eq!(t.ne, reference.ne, "{}", t.name);
        let want = dequantize(GgmlType::F32, r.bytes(reference));
        let got = dequantize(t.ty, q.bytes(t));
        assert_eq!(got.len(), want.len(), "{}", t.name);
        let mismatches = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(mismatches, 0, "{}: {mismatches} values differ", t.name);
        assert!(want.iter().any(|&v| v != 0.0), "{}: all zeros", t.name);
        seen.push(t.ty);
    }
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::F16,
        GgmlType::Bf16,
    ] {
        assert!(seen.contains(&ty), "no {} vectors", ty.name());
    }
}
