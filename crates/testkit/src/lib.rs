//! Test support shared by spindle's crates: where the fixtures are, writable copies of them,
//! and the tensors of a fixture's `reference.safetensors`. A test that needs a fixture fails
//! loudly when it is missing; it never skips.

use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};
use tempfile::TempDir;

/// `../shared/fixtures` beside the repository (or `$SPINDLE_FIXTURES`).
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("SPINDLE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/fixtures"
        )),
    };
    assert!(
        dir.is_dir(),
        "fixtures directory {} is missing",
        dir.display()
    );
    dir
}

/// The checkpoint fixture `name` (a directory with a config.json).
pub fn fixture(name: &str) -> PathBuf {
    let dir = fixtures().join(name);
    assert!(
        dir.join("config.json").is_file(),
        "fixture {} is missing",
        dir.display()
    );
    dir
}

/// A writable copy of fixture `name` in a temporary directory.
pub fn copy_fixture(name: &str) -> TempDir {
    let tmp = tempfile::tempdir().expect("temporary directory");
    for entry in std::fs::read_dir(fixture(name)).expect("fixture readable") {
        let entry = entry.expect("fixture entry");
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).expect("fixture copied");
    }
    tmp
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

    /// An f32 tensor: (shape, values).
    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::F32, "{name} dtype");
        let data = v
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (v.shape().to_vec(), data)
    }

    /// An i64 tensor of token ids.
    pub fn ids(&self, name: &str) -> Vec<u32> {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::I64, "{name} dtype");
        v.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as u32)
            .collect()
    }
}

/// Largest |a − b| over two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Deterministic pseudo-random numbers for tests on random data (a 64-bit LCG: the same seed
/// gives the same values on every machine).
pub struct Rng(pub u64);

impl Rng {
    /// Uniform in [0, 1), 24 bits.
    pub fn unit(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [−scale, scale).
    pub fn signed(&mut self, scale: f32) -> f32 {
        (self.unit() * 2.0 - 1.0) * scale
    }

    /// `n` values uniform in [−scale, scale).
    pub fn signed_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.signed(scale)).collect()
    }
}
