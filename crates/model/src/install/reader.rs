//! Opening an install: the manifest is read, every listed file's size is checked (and its
//! SHA-256 on request), and the resident tensors are memory-mapped.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::json;

use super::error::{InstallError, Result};
use super::manifest::{ExpertLayerLayout, Manifest};
use super::{sha256, MANIFEST, RECEIPT};
use crate::quant::WeightFormat;
use crate::ModelConfig;

/// How much of an install to check when it is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verify {
    /// Every file exists with the manifest's size (always done).
    #[default]
    Sizes,
    /// Also every file's SHA-256; a receipt (`verified.json`) records the success.
    Full,
    /// Full the first time; later opens trust a receipt whose files still have the sizes and
    /// modification times it recorded.
    Once,
}

/// A read-only memory map of one file.
pub struct MappedFile {
    path: PathBuf,
    map: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<Arc<Self>> {
        let file = crate::fs::open_regular(path).map_err(InstallError::io(path))?;
        // SAFETY: the file is opened read-only and spindle never writes through the map; an
        // install changed while in use is outside the contract (as for any mmap loader).
        let map = unsafe { Mmap::map(&file) }.map_err(InstallError::io(path))?;
        Ok(Arc::new(MappedFile {
            path: path.to_owned(),
            map,
        }))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tells the kernel accesses will be random (no read-ahead beyond what is asked).
    pub fn advise_random(&self) {
        let _ = self.map.advise(memmap2::Advice::Random);
    }
}

/// A quantized matrix of the resident file: codes and f16 scales, as byte ranges of the map.
#[derive(Clone)]
pub struct QuantTensor {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    pub file: Arc<MappedFile>,
    pub codes: Range<usize>,
    pub scales: Range<usize>,
}

struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    range: Range<usize>,
}

/// An opened, checked install.
pub struct Install {
    dir: PathBuf,
    manifest: Manifest,
    config: ModelConfig,
    resident: Arc<MappedFile>,
    entries: HashMap<String, Entry>,
}

impl Install {
    /// Opens the install at `dir`: refuses a missing, wrongly sized or misplaced file (and
    /// with [`Verify::Full`], an altered one) by name, and an expert layout that disagrees
    /// with `config.json` by manifest field.
    pub fn open(dir: &Path, verify: Verify) -> Result<Self> {
        let manifest_path = dir.join(MANIFEST);
        let manifest = Manifest::read(&manifest_path)?;
        let config = ModelConfig::from_dir(dir)?;
        manifest
            .check_against(&config)
            .map_err(|message| InstallError::Manifest {
                path: manifest_path,
                message,
            })?;
        check_files(dir, &manifest, verify)?;
        let path = dir.join(&manifest.resident.file);
        let resident = MappedFile::open(&path)?;
        let parsed =
            SafeTensors::deserialize(resident.bytes()).map_err(|e| InstallError::Manifest {
                path: path.clone(),
                message: format!("not a valid safetensors file: {e}"),
            })?;
        let base = resident.bytes().as_ptr() as usize;
        let entries = parsed
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let start = view.data().as_ptr() as usize - base;
                let entry = Entry {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    range: start..start + view.data().len(),
                };
                (name, entry)
            })
            .collect();
        Ok(Install {
            dir: dir.to_owned(),
            manifest,
            config,
            resident,
            entries,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The install's `config.json`, validated, which the manifest was checked against.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The quantized matrix `name` (`name.qs` + `name.scales`), if the install stores it so.
    pub fn quantized(&self, name: &str) -> Result<Option<QuantTensor>> {
        let codes_name = format!("{name}{}", self.manifest.resident.codes_suffix);
        let Some(codes) = self.entries.get(&codes_name) else {
            return Ok(None);
        };
        let scales_name = format!("{name}{}", self.manifest.resident.scales_suffix);
        let bad = |message: String| InstallError::Manifest {
            path: self.resident.path().to_owned(),
            message: format!("tensor `{name}`: {message}"),
        };
        let scales = self
            .entries
            .get(&scales_name)
            .ok_or_else(|| bad(format!("{codes_name} has no {scales_name}")))?;
        let (format, cols) = match (codes.dtype, codes.shape.as_slice()) {
            (Dtype::I8, &[_, c]) => (WeightFormat::Q8, c),
            (Dtype::U8, &[_, c]) => (WeightFormat::Q4, c * 2),
            (d, s) => {
                return Err(bad(format!(
                    "codes are {d:?} {s:?}, expected I8 or U8 [rows, cols]"
                )))
            }
        };
        let rows = codes.shape[0];
        if !format.fits(cols) {
            return Err(bad(format!(
                "{format} codes of {cols} columns are not whole {}-weight groups",
                crate::quant::GROUP
            )));
        }
        let expected = [rows, cols / crate::quant::GROUP];
        if scales.dtype != Dtype::F16 || scales.shape != expected || scales.range.start % 2 != 0 {
            return Err(bad(format!(
                "scales are {:?} {:?}, expected F16 {expected:?}",
                scales.dtype, scales.shape
            )));
        }
        Ok(Some(QuantTensor {
            format,
            rows,
            cols,
            file: self.resident.clone(),
            codes: codes.range.clone(),
            scales: scales.range.clone(),
        }))
    }

    /// The expert layout of MoE layer `layer`.
    pub fn expert_layer(&self, layer: usize) -> Option<&ExpertLayerLayout> {
        self.manifest.expert_layer(layer)
    }

    pub fn path_of(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// Total bytes of the routed-expert files.
    pub fn expert_bytes(&self) -> u64 {
        self.manifest
            .experts
            .iter()
            .map(|l| l.stride * l.experts as u64)
            .sum()
    }

    /// Bytes of the resident file.
    pub fn resident_bytes(&self) -> u64 {
        self.resident.bytes().len() as u64
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Refuses `path` (a file the manifest lists) unless it is a regular file that resolves,
/// through any symlinks, to a place inside the install directory `root` (canonical).
fn check_inside(root: &Path, path: &Path) -> Result<std::fs::Metadata> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(InstallError::Missing {
                path: path.to_owned(),
            })
        }
        Err(error) => {
            return Err(InstallError::Io {
                path: path.to_owned(),
                error,
            })
        }
    };
    crate::fs::check_regular(&meta).map_err(InstallError::io(path))?;
    let real = path.canonicalize().map_err(InstallError::io(path))?;
    if !real.starts_with(root) {
        return Err(InstallError::Manifest {
            path: path.to_owned(),
            message: format!(
                "resolves to {}, outside the install {}: an install's files must lie inside it",
                real.display(),
                root.display()
            ),
        });
    }
    Ok(meta)
}

fn check_files(dir: &Path, manifest: &Manifest, verify: Verify) -> Result<()> {
    let root = dir.canonicalize().map_err(InstallError::io(dir))?;
    let mut stamps = Vec::new();
    for f in &manifest.files {
        let path = dir.join(&f.path);
        let meta = check_inside(&root, &path)?;
        if meta.len() != f.size {
            return Err(InstallError::Size {
                path,
                actual: meta.len(),
                expected: f.size,
            });
        }
        stamps
            .push(json!({"path": f.path, "size": f.size, "mtime_ns": mtime_ns(&meta).to_string()}));
    }
    let manifest_path = dir.join(MANIFEST);
    let manifest_hash =
        sha256::file_hex(&manifest_path).map_err(InstallError::io(&manifest_path))?;
    let receipt = json!({"manifest_sha256": manifest_hash, "files": stamps});
    let receipt_path = dir.join(RECEIPT);
    let trusted = verify == Verify::Once
        && crate::fs::read_bounded_to_string(&receipt_path, crate::fs::MANIFEST_LIMIT)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|r| r == receipt);
    if verify == Verify::Sizes || trusted {
        return Ok(());
    }
    for f in &manifest.files {
        let path = dir.join(&f.path);
        let actual = sha256::file_hex(&path).map_err(InstallError::io(&path))?;
        if actual != f.sha256 {
            return Err(InstallError::Checksum {
                path,
                actual,
                expected: f.sha256.clone(),
            });
        }
    }
    // A read-only install cannot hold a receipt; the next open verifies again.
    let text = serde_json::to_string_pretty(&receipt).expect("JSON values serialize");
    if let Err(e) = crate::fs::write_replacing(&receipt_path, (text + "\n").as_bytes()) {
        tracing::warn!("cannot write {}: {e}", receipt_path.display());
    }
    Ok(())
}
