//! Hugging Face safetensors checkpoints, single-file or sharded, memory-mapped.
//!
//! Opening validates every file's header (the `safetensors` crate checks that offsets are
//! contiguous, that each tensor's byte length matches dtype × shape, and that the data section
//! is exactly as long as the header says, so truncation is caught). Tensors are then handed out
//! as views of the maps; nothing is copied whole into the heap.
//!
//! Block-FP8 checkpoints (MODEL_MATH §9): each `F8_E4M3` tensor is paired at open with its
//! `<name>_scale_inv` (shape checked against the config's `weight_block_size`), and handed out
//! dequantized to f32 (the one copy into the heap); the scale tensors are not listed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::fp8::BlockFp8;
use crate::tensor::{decode_f32, DType, Matrix, Storage};

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

struct Shard {
    path: PathBuf,
    map: Arc<Mmap>,
}

#[derive(Clone)]
struct Entry {
    shard: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
    /// For an `F8_E4M3` tensor: the name of its scale tensor.
    scale: Option<String>,
}

/// `len` bytes of writable memory backed by a memory file (`memfd_create`), shared-mapped:
/// unlike a private anonymous map, pages a tensor gives back with
/// [`Storage::release_pages`](crate::tensor::Storage::release_pages) (MADV_DONTNEED) read back
/// their contents, not zeros, when another view of the same bytes touches them again.
fn shared_memory(len: usize) -> std::io::Result<memmap2::MmapMut> {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new descriptor
    // or -1 with errno set.
    let fd = unsafe { libc::memfd_create(c"spindle-converted-tensors".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function owns; the File closes it.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    // SAFETY: the memory file is private to this process and only written through this map.
    unsafe { memmap2::MmapMut::map_mut(&file) }
}

/// One tensor of an [`Checkpoint::assembled`] checkpoint.
pub(crate) enum Part {
    /// Bytes `start..end` of a mapped file, as stored.
    Mapped {
        path: PathBuf,
        map: Arc<Mmap>,
        dtype: DType,
        shape: Vec<usize>,
        start: usize,
        end: usize,
    },
    /// Values converted on open.
    Owned { shape: Vec<usize>, values: Vec<f32> },
}

/// All tensors of a checkpoint directory, by name.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    /// The block-FP8 `quantization_config`, when the checkpoint holds FP8 tensors.
    fp8: Option<BlockFp8>,
}

impl Checkpoint {
    /// Opens `DIR/model.safetensors.index.json` (sharded) or `DIR/model.safetensors`, or a
    /// GGUF file (`x.gguf`, or the first of a split set), its tensors under the safetensors
    /// names (`crate::gguf`).
    pub fn open(dir: &Path) -> Result<Self> {
        if crate::gguf::is_gguf(dir) {
            return crate::gguf::open_checkpoint(dir);
        }
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return Self::open_sharded(dir, &index);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.exists() {
            return Err(ModelError::Io {
                path: single,
                error: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
                ),
            });
        }
        let mut checkpoint = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            entries: HashMap::new(),
            fp8: None,
        };
        checkpoint.add_shard(&single)?;
        checkpoint.pair_fp8_scales()?;
        Ok(checkpoint)
    }

    /// Opens the one safetensors file `file` of `dir` (an install's resident file), ignoring
    /// any index or other file the directory holds.
    pub fn open_file(dir: &Path, file: &Path) -> Result<Self> {
        let mut checkpoint = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            entries: HashMap::new(),
            fp8: None,
        };
        checkpoint.add_shard(file)?;
        checkpoint.pair_fp8_scales()?;
        Ok(checkpoint)
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Self> {
        let text =
            crate::fs::read_bounded_to_string(index, crate::fs::INDEX_LIMIT).map_err(|error| {
                ModelError::Io {
                    path: index.to_owned(),
                    error,
                }
            })?;
        let value: Value = serde_json::from_str(&text).map_err(|error| ModelError::Json {
            path: index.to_owned(),
            error,
        })?;
        let index_err = |message: String| ModelError::Index {
            path: index.to_owned(),
            message,
        };
        let map = value
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| index_err("weight_map is missing or not an object".into()))?;
        let mut wanted: HashMap<String, String> = HashMap::new();
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                index_err(format!(
                    "weight_map[{name:?}] = {file}: expected a file name"
                ))
            })?;
            if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                return Err(index_err(format!(
                    "weight_map[{name:?}] = {file:?}: shard names must be plain file names"
                )));
            }
            wanted.insert(name.clone(), file.to_owned());
        }
        let mut files: Vec<&String> = wanted.values().collect();
        files.sort();
        files.dedup();

        let mut checkpoint = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            entries: HashMap::new(),
            fp8: None,
        };
        for file in files {
            checkpoint.add_shard(&dir.join(file))?;
        }
        for (name, file) in &wanted {
            let Some(entry) = checkpoint.entries.get(name) else {
                return Err(index_err(format!(
                    "tensor `{name}` is listed in shard {file} but no shard holds it"
                )));
            };
            let holder = &checkpoint.shards[entry.shard].path;
            if holder.file_name().and_then(|s| s.to_str()) != Some(file.as_str()) {
                return Err(index_err(format!(
                    "tensor `{name}` is listed in shard {file} but found in {}",
                    holder.display()
                )));
            }
        }
        checkpoint.pair_fp8_scales()?;
        Ok(checkpoint)
    }

    /// Pairs every `F8_E4M3` tensor with its scale tensor, checking the scale's dtype and its
    /// shape against `weight_block_size` of the directory's `config.json`.
    fn pair_fp8_scales(&mut self) -> Result<()> {
        let mut fp8_names: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.dtype == StDtype::F8_E4M3)
            .map(|(n, _)| n.clone())
            .collect();
        if fp8_names.is_empty() {
            return Ok(());
        }
        fp8_names.sort();
        let first = &fp8_names[0];
        let first_path = self.shards[self.entries[first].shard].path.clone();
        let Some(fp8) = BlockFp8::from_dir(&self.dir)? else {
            return Err(ModelError::BadScale {
                path: first_path,
                tensor: first.clone(),
                message: format!(
                    "stored as F8_E4M3 but {} has no quantization_config with quant_method \"fp8\" (its weight_block_size is needed to apply the scales)",
                    self.dir.join("config.json").display()
                ),
            });
        };
        for name in &fp8_names {
            let entry = &self.entries[name];
            let path = self.shards[entry.shard].path.clone();
            let bad = |message: String| ModelError::BadScale {
                path: path.clone(),
                tensor: name.clone(),
                message,
            };
            let Some(expected) = fp8.scale_shape(&entry.shape) else {
                return Err(bad(format!(
                    "an F8_E4M3 tensor of shape {:?}: block FP8 needs a matrix (rank 2) or a stack of them",
                    entry.shape
                )));
            };
            let scale_name = BlockFp8::scale_name(name);
            let Some(scale) = self.entries.get(&scale_name) else {
                return Err(bad(format!(
                    "an F8_E4M3 weight without its scale tensor `{scale_name}`"
                )));
            };
            if !matches!(scale.dtype, StDtype::F32 | StDtype::BF16 | StDtype::F16) {
                return Err(bad(format!(
                    "its scale `{scale_name}` is {:?}; expected F32, BF16 or F16",
                    scale.dtype
                )));
            }
            if scale.shape != expected {
                return Err(bad(format!(
                    "its scale `{scale_name}` has shape {:?}; weight_block_size {:?} on a weight of shape {:?} needs {:?}",
                    scale.shape, fp8.block, entry.shape, expected
                )));
            }
            self.entries.get_mut(name).expect("listed").scale = Some(scale_name);
        }
        self.fp8 = Some(fp8);
        Ok(())
    }

    /// The block-FP8 `quantization_config` when the checkpoint holds FP8 tensors.
    pub fn fp8(&self) -> Option<&BlockFp8> {
        self.fp8.as_ref()
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let io_err = |error| ModelError::Io {
            path: path.to_owned(),
            error,
        };
        let file = crate::fs::open_regular(path).map_err(io_err)?;
        // SAFETY: the file is opened read-only and spindle never writes through the map.
        // Another process truncating a checkpoint while it is in use is outside our contract
        // (as for every mmap-based loader).
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let map = Arc::new(map);
        let parsed = SafeTensors::deserialize(&map[..]).map_err(|e| ModelError::Safetensors {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let shard = self.shards.len();
        let base = map.as_ptr() as usize;
        for (name, view) in parsed.tensors() {
            let start = view.data().as_ptr() as usize - base;
            let end = start + view.data().len();
            let entry = Entry {
                shard,
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                start,
                end,
                scale: None,
            };
            if let Some(previous) = self.entries.insert(name.clone(), entry) {
                return Err(ModelError::Index {
                    path: path.to_owned(),
                    message: format!(
                        "tensor `{name}` appears twice (also in {})",
                        self.shards[previous.shard].path.display()
                    ),
                });
            }
        }
        self.shards.push(Shard {
            path: path.to_owned(),
            map,
        });
        Ok(())
    }

    /// A checkpoint assembled from another format's tensors (GGUF), under the safetensors
    /// names the loader asks for: ranges of mapped files kept as they are, and tensors
    /// converted on open, laid into one anonymous map.
    pub(crate) fn assembled(dir: &Path, tensors: Vec<(String, Part)>) -> Result<Self> {
        let mut checkpoint = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            entries: HashMap::new(),
            fp8: None,
        };
        let owned_bytes: usize = tensors
            .iter()
            .map(|(_, p)| match p {
                Part::Owned { values, .. } => values.len() * 4,
                Part::Mapped { .. } => 0,
            })
            .sum();
        let io_err = |error| ModelError::Io {
            path: dir.to_owned(),
            error,
        };
        let mut owned = shared_memory(owned_bytes.max(1)).map_err(io_err)?;
        let mut at = 0;
        let mut placed = Vec::with_capacity(tensors.len());
        for (name, part) in tensors {
            match part {
                Part::Mapped {
                    path,
                    map,
                    dtype,
                    shape,
                    start,
                    end,
                } => {
                    let shard = match checkpoint.shards.iter().position(|s| s.path == path) {
                        Some(i) => i,
                        None => {
                            checkpoint.shards.push(Shard { path, map });
                            checkpoint.shards.len() - 1
                        }
                    };
                    placed.push((name, shard, dtype, shape, start, end));
                }
                Part::Owned { shape, values } => {
                    let bytes: &[u8] = bytemuck::cast_slice(&values);
                    owned[at..at + bytes.len()].copy_from_slice(bytes);
                    placed.push((name, usize::MAX, DType::F32, shape, at, at + bytes.len()));
                    at += bytes.len();
                }
            }
        }
        let owned_shard = checkpoint.shards.len();
        checkpoint.shards.push(Shard {
            path: dir.to_owned(),
            map: Arc::new(owned.make_read_only().map_err(io_err)?),
        });
        for (name, shard, dtype, shape, start, end) in placed {
            let entry = Entry {
                shard: if shard == usize::MAX {
                    owned_shard
                } else {
                    shard
                },
                dtype: match dtype {
                    DType::Bf16 => StDtype::BF16,
                    DType::F16 => StDtype::F16,
                    DType::F32 => StDtype::F32,
                },
                shape,
                start,
                end,
                scale: None,
            };
            if checkpoint.entries.insert(name.clone(), entry).is_some() {
                return Err(ModelError::Index {
                    path: dir.to_owned(),
                    message: format!("tensor `{name}` is produced twice"),
                });
            }
        }
        Ok(checkpoint)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Every tensor name in the checkpoint, less the FP8 scales paired with a weight (they
    /// are applied when the weight is read).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries
            .keys()
            .map(String::as_str)
            .filter(|n| !self.is_paired_scale(n))
    }

    fn is_paired_scale(&self, name: &str) -> bool {
        name.strip_suffix("_scale_inv")
            .and_then(|weight| self.entries.get(weight))
            .is_some_and(|w| w.scale.is_some())
    }

    /// Whether any tensor is stored as block FP8.
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    /// The f32 values of block-FP8 tensor `name` (paired at open), dequantized exactly.
    fn fp8_values(&self, name: &str, entry: &Entry) -> Result<Vec<f32>> {
        let scale_name = entry
            .scale
            .as_deref()
            .expect("FP8 entries are paired at open");
        let scale = &self.entries[scale_name];
        let scale_dtype = self.float_dtype(scale_name, scale)?;
        let map = &self.shards[scale.shard].map;
        let scales = decode_f32(scale_dtype, &map[scale.start..scale.end]);
        let codes = &self.shards[entry.shard].map[entry.start..entry.end];
        let fp8 = self.fp8.as_ref().expect("set with the pairs");
        tracing::trace!(tensor = name, "dequantizing block FP8");
        Ok(crate::fp8::dequantize(
            codes,
            &scales,
            &entry.shape,
            fp8.block,
        ))
    }

    /// The shape of tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                dir: self.dir.clone(),
                tensor: name.to_owned(),
            })
    }

    fn check_shape(&self, name: &str, entry: &Entry, expected: &[usize]) -> Result<()> {
        if entry.shape != expected {
            return Err(ModelError::ShapeMismatch {
                path: self.shards[entry.shard].path.clone(),
                tensor: name.to_owned(),
                actual: entry.shape.clone(),
                expected: expected.to_vec(),
            });
        }
        Ok(())
    }

    fn float_dtype(&self, name: &str, entry: &Entry) -> Result<DType> {
        match entry.dtype {
            StDtype::BF16 => Ok(DType::Bf16),
            StDtype::F16 => Ok(DType::F16),
            StDtype::F32 => Ok(DType::F32),
            other => Err(ModelError::UnsupportedDtype {
                path: self.shards[entry.shard].path.clone(),
                tensor: name.to_owned(),
                dtype: format!("{other:?}"),
            }),
        }
    }

    /// Tensor `name` with exactly `shape`, viewed as a `[rows, cols]` matrix where `cols` is the
    /// last dimension and `rows` the product of the others.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Matrix> {
        let entry = self.entry(name)?;
        self.check_shape(name, entry, shape)?;
        let cols = *shape.last().unwrap_or(&1);
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        if entry.scale.is_some() {
            let values = self.fp8_values(name, entry)?;
            return Ok(Matrix::new(
                DType::F32,
                rows,
                cols,
                Storage::from_f32(&values),
            ));
        }
        let dtype = self.float_dtype(name, entry)?;
        let storage = Storage::new(
            &self.shards[entry.shard].map,
            entry.start,
            entry.end,
            dtype.size(),
        );
        Ok(Matrix::new(dtype, rows, cols, storage))
    }

    /// Tensor `name` with exactly `shape`, converted to f32 (for norms, biases, small tensors).
    pub fn f32_values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        self.check_shape(name, entry, shape)?;
        if entry.scale.is_some() {
            return self.fp8_values(name, entry);
        }
        let dtype = self.float_dtype(name, entry)?;
        let map = &self.shards[entry.shard].map;
        Ok(decode_f32(dtype, &map[entry.start..entry.end]))
    }

    /// Tensor `name` with exactly `shape`, as i64 values (int64 buffers).
    pub fn i64_values(&self, name: &str, shape: &[usize]) -> Result<Vec<i64>> {
        let entry = self.entry(name)?;
        self.check_shape(name, entry, shape)?;
        if entry.dtype != StDtype::I64 {
            return Err(ModelError::UnsupportedDtype {
                path: self.shards[entry.shard].path.clone(),
                tensor: name.to_owned(),
                dtype: format!("{:?} (expected I64)", entry.dtype),
            });
        }
        let map = &self.shards[entry.shard].map;
        Ok(map[entry.start..entry.end]
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("chunks of 8")))
            .collect())
    }

    /// The file holding tensor `name` (for messages).
    pub fn file_of(&self, name: &str) -> PathBuf {
        match self.entries.get(name) {
            Some(e) => self.shards[e.shard].path.clone(),
            None => self.dir.clone(),
        }
    }

    /// Refuses the first tensor (in name order) holding a NaN or an infinity, naming it and
    /// its file (`--check-weights`; reads every float tensor once). Integer tensors (quantized
    /// codes, buffers) cannot be non-finite and are skipped.
    pub fn check_finite(&self) -> Result<()> {
        let mut names: Vec<&String> = self.entries.keys().collect();
        names.sort();
        for name in names {
            let entry = &self.entries[name];
            let dtype = match entry.dtype {
                StDtype::BF16 => DType::Bf16,
                StDtype::F16 => DType::F16,
                StDtype::F32 => DType::F32,
                StDtype::F8_E4M3 => {
                    // e4m3fn has no infinities; S.1111.111 is NaN.
                    let bytes = &self.shards[entry.shard].map[entry.start..entry.end];
                    if let Some(index) = bytes.iter().position(|b| b & 0x7f == 0x7f) {
                        return Err(crate::finite::non_finite_error(
                            &self.shards[entry.shard].path,
                            name,
                            index,
                            true,
                        ));
                    }
                    continue;
                }
                _ => continue,
            };
            let bytes = &self.shards[entry.shard].map[entry.start..entry.end];
            if let Some((index, nan)) = crate::finite::first_non_finite(dtype, bytes) {
                return Err(crate::finite::non_finite_error(
                    &self.shards[entry.shard].path,
                    name,
                    index,
                    nan,
                ));
            }
        }
        Ok(())
    }

    /// Total bytes of all mapped files.
    pub fn mapped_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.map.len()).sum()
    }
}
