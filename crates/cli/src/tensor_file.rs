//! Reading and writing the small safetensors files of `spindle logits` (the layout of the
//! fixtures' `reference.safetensors`): f32, i64 and u8 tensors, written atomically.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// The values of one tensor, converted from little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
    /// Raw bytes (a reference's images, `image_k` u8 [h, w, 3]).
    U8(Vec<u8>),
    /// A dtype `spindle logits` neither writes nor compares; kept so messages can name it.
    Other(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub values: Values,
}

impl Tensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            shape,
            values: Values::F32(data),
        }
    }

    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor {
            shape,
            values: Values::I64(data),
        }
    }

    fn bytes(&self) -> Result<(Dtype, Vec<u8>)> {
        Ok(match &self.values {
            Values::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Values::I64(v) => (Dtype::I64, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            Values::U8(v) => (Dtype::U8, v.clone()),
            Values::Other(dtype) => bail!("cannot write a tensor of dtype {dtype}"),
        })
    }
}

/// Largest reference file `--compare` / `--tokens-from` reads (logits of a long prompt).
const READ_LIMIT: u64 = 4 << 30;

/// Every tensor of a safetensors file, by name (a regular file of at most [`READ_LIMIT`]).
pub fn read(path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let bytes = spindle_model::fs::read_bounded(path, READ_LIMIT)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let parsed = SafeTensors::deserialize(&bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    let mut out = BTreeMap::new();
    for (name, view) in parsed.tensors() {
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => Values::F32(
                data.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            Dtype::I64 => Values::I64(
                data.chunks_exact(8)
                    .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                    .collect(),
            ),
            Dtype::U8 => Values::U8(data.to_vec()),
            other => Values::Other(format!("{other:?}")),
        };
        out.insert(
            name,
            Tensor {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok(out)
}

/// Writes `tensors` to `path` atomically: a temporary file in the same directory, synced, then
/// renamed over `path`, so a reader never sees a half-written file.
pub fn write_atomic(path: &Path, tensors: &[(&str, Tensor)]) -> Result<()> {
    let encoded = tensors
        .iter()
        .map(|(name, t)| Ok((*name, t.bytes()?, t.shape.clone())))
        .collect::<Result<Vec<_>>>()?;
    let views = encoded
        .iter()
        .map(|(name, (dtype, bytes), shape)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (*name, view))
                .with_context(|| format!("tensor `{name}`: bytes do not match shape {shape:?}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        safetensors::serialize(views, None).context("cannot serialize the output tensors")?;

    spindle_model::fs::check_output(path, &[], false)
        .with_context(|| format!("cannot write {}", path.display()))?;
    let temp = temp_path(path)?;
    let written = (|| -> std::io::Result<()> {
        // A new file: never one a symlink planted at the temporary name points to.
        let _ = fs::remove_file(&temp);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()
    })();
    if let Err(err) = written.and_then(|()| fs::rename(&temp, path)) {
        let _ = fs::remove_file(&temp);
        return Err(err).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(())
}

/// `DIR/.NAME.PID.tmp` beside `path`, so the final rename stays on one file system.
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("--out {}: expected a file path", path.display()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!(
            "cannot write {}: directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    Ok(dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_round_trips_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.safetensors");
        let tensors = [
            (
                "a",
                Tensor::f32(
                    vec![2, 3],
                    vec![0.5, -1.0, 2.0, 3.25, f32::MIN_POSITIVE, 7.0],
                ),
            ),
            ("ids", Tensor::i64(vec![3], vec![1, -2, i64::MAX])),
        ];
        write_atomic(&path, &tensors).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back["a"], tensors[0].1);
        assert_eq!(back["ids"], tensors[1].1);
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("out.safetensors")]);
    }

    #[test]
    fn writing_into_a_missing_directory_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope").join("out.safetensors");
        let err = write_atomic(&path, &[("a", Tensor::f32(vec![1], vec![1.0]))]).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
    }
}
