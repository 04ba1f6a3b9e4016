//! Test support shared by spindle's crates: where the fixtures are, writable copies of them,
//! and the tensors of a fixture's `reference.safetensors`. A test that needs a fixture fails
//! loudly when it is missing; it never skips. [`mutate`] runs damaged inputs through a loader
//! (the mutation tests of the loaders and the image decoder).

pub mod mutate;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::{Dtype, SafeTensors};
use tempfile::TempDir;

/// The repository's `fixtures/` directory (or `$SPINDLE_FIXTURES`), with every compressed
/// file in it unpacked beside itself (`tokenizer/tokenizer.json.gz` → `tokenizer.json`) so
/// tests read plain files. A clone runs its tests with nothing beside it.
pub fn fixtures() -> PathBuf {
    let dir = match std::env::var_os("SPINDLE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures")),
    };
    assert!(
        dir.is_dir(),
        "fixtures directory {} is missing",
        dir.display()
    );
    static UNPACKED: OnceLock<()> = OnceLock::new();
    UNPACKED.get_or_init(|| unpack_gz_files(&dir));
    dir
}

/// Writes `X` beside every `X.gz` under `dir` that lacks it (through a temporary file and a
/// rename, so test binaries running at once never read a partial file).
fn unpack_gz_files(dir: &Path) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("fixture entry").path();
        if path.is_dir() {
            unpack_gz_files(&path);
            continue;
        }
        if path.extension().is_none_or(|e| e != "gz") {
            continue;
        }
        let plain = path.with_extension("");
        if plain.is_file() {
            continue;
        }
        let packed =
            std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tmp = plain.with_extension(format!("unpacking.{}", std::process::id()));
        let mut out =
            std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
        std::io::copy(&mut flate2::read::GzDecoder::new(packed), &mut out)
            .unwrap_or_else(|e| panic!("unpacking {}: {e}", path.display()));
        std::fs::rename(&tmp, &plain).unwrap_or_else(|e| panic!("{}: {e}", plain.display()));
    }
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

    /// An i64 tensor (positions, deltas, grids): (shape, values).
    pub fn i64(&self, name: &str) -> (Vec<usize>, Vec<i64>) {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::I64, "{name} dtype");
        let data = v
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        (v.shape().to_vec(), data)
    }

    /// A u8 tensor (an image `[h, w, 3]`): (shape, values).
    pub fn u8(&self, name: &str) -> (Vec<usize>, Vec<u8>) {
        let v = self.view(name);
        assert_eq!(v.dtype(), Dtype::U8, "{name} dtype");
        (v.shape().to_vec(), v.data().to_vec())
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
