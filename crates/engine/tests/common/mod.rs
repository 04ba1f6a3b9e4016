//! Shared helpers for fixture tests: locating fixtures and reading reference tensors.

#![allow(dead_code)]

use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

/// `../shared/fixtures/NAME` relative to the repository root; panics loudly when missing.
pub fn fixture(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name);
    assert!(
        dir.exists(),
        "fixture {} is missing (expected beside the repository)",
        dir.display()
    );
    dir
}

/// The tensors of a fixture's `reference.safetensors`.
pub struct Reference {
    bytes: Vec<u8>,
}

impl Reference {
    pub fn load(name: &str) -> Self {
        let path = fixture(name).join("reference.safetensors");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Reference { bytes }
    }

    fn view(&self, name: &str) -> safetensors::tensor::TensorView<'_> {
        let st = SafeTensors::deserialize(&self.bytes).expect("reference parses");
        st.tensor(name)
            .unwrap_or_else(|_| panic!("reference has no `{name}`"))
    }

    pub fn has(&self, name: &str) -> bool {
        SafeTensors::deserialize(&self.bytes)
            .expect("reference parses")
            .tensor(name)
            .is_ok()
    }

    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::F32, "{name} dtype");
        let data = v
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (v.shape().to_vec(), data)
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::I64, "{name} dtype");
        v.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
            .collect()
    }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
