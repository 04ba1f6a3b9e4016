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
//! A GGUF file opens as a checkpoint too (`assembled.rs`), under the safetensors names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::fp8::BlockFp8;
use crate::quant::ggml::{dequantize, GgmlType};
use crate::tensor::{decode_f32, DType, Matrix, Storage};
use crate::weights::BlockMatrix;

mod assembled;
mod fp8;

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
    /// For a quantized GGUF tensor (stored as `U8`): its ggml block type.
    ggml: Option<GgmlType>,
    /// For a GGUF tensor whose columns the converter reordered: the input element each
    /// stored column multiplies ([`BlockMatrix::input_order`]).
    input_order: Option<Arc<[u32]>>,
}

/// All tensors of a checkpoint directory, by name.
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    /// The block-FP8 `quantization_config`, when the checkpoint holds FP8 tensors.
    fp8: Option<BlockFp8>,
    /// Whether the loader takes quantized GGUF tensors in their blocks
    /// ([`Checkpoint::keep_blocks`]) rather than dequantized.
    keep_blocks: bool,
}

impl Checkpoint {
    /// Opens `DIR/model.safetensors.index.json` (sharded) or `DIR/model.safetensors`, or a
    /// GGUF file (`x.gguf`, or the first of a split set), its tensors under the safetensors
    /// names (`crate::gguf`).
    pub fn open(dir: &Path) -> Result<Self> {
        if crate::gguf::is_gguf(dir) {
            return Checkpoint::assembled(dir, crate::gguf::open_parts(dir)?);
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
            keep_blocks: false,
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
            keep_blocks: false,
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
            if file.is_empty() || file.contains('/') || file.contains('\\') || file.starts_with('.')
            {
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
            keep_blocks: false,
        };
        for file in files {
            checkpoint.add_shard(&dir.join(file)).map_err(|e| match e {
                ModelError::Io { path, error } => ModelError::Io {
                    path,
                    error: std::io::Error::new(
                        error.kind(),
                        format!("{error} (a shard named by {INDEX_FILE})"),
                    ),
                },
                other => other,
            })?;
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
                ggml: None,
                input_order: None,
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
        if entry.ggml.is_some() {
            let values = self.ggml_values(entry, cols);
            return Ok(Matrix::new(
                DType::F32,
                rows,
                cols,
                Storage::from_f32(&values),
            ));
        }
        if entry.scale.is_some() {
            // Dequantized when first read: a backend that runs the stored FP8 form (CUDA)
            // never makes the f32 copy.
            let stored = self.fp8_stored(entry)?;
            let (whole, shape) = (stored.clone(), entry.shape.clone());
            let values = Storage::lazy_f32(rows * cols, move || {
                tracing::trace!("dequantizing block FP8");
                crate::fp8::dequantize(whole.codes(), whole.grid(), &shape, whole.block)
            });
            return Ok(Matrix::new(DType::F32, rows, cols, values).with_fp8(stored));
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

    /// Makes the loader take quantized GGUF tensors in their ggml blocks, memory-mapped
    /// ([`Checkpoint::blocks`]), instead of dequantized to f32 ([`Checkpoint::matrix`]): what
    /// the CPU engine does unless `--quant` asks for a format.
    pub fn keep_blocks(&mut self, keep: bool) {
        self.keep_blocks = keep;
    }

    /// Tensor `name` with exactly `shape` in its ggml blocks, when it is a quantized GGUF
    /// tensor and [`Checkpoint::keep_blocks`] is on; `None` otherwise (read it with
    /// [`Checkpoint::matrix`]).
    pub fn blocks(&self, name: &str, shape: &[usize]) -> Result<Option<BlockMatrix>> {
        let entry = self.entry(name)?;
        self.check_shape(name, entry, shape)?;
        let Some(ty) = entry.ggml.filter(|_| self.keep_blocks) else {
            return Ok(None);
        };
        let cols = *shape.last().unwrap_or(&1);
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        let storage = Storage::new(&self.shards[entry.shard].map, entry.start, entry.end, 1);
        let blocks = BlockMatrix::new(ty, rows, cols, storage);
        Ok(Some(match &entry.input_order {
            Some(order) => blocks.with_input_order(order.clone()),
            None => blocks,
        }))
    }

    /// A quantized GGUF tensor dequantized to f32, its columns in input order.
    fn ggml_values(&self, entry: &Entry, cols: usize) -> Vec<f32> {
        let ty = entry.ggml.expect("a ggml entry");
        let values = dequantize(ty, &self.shards[entry.shard].map[entry.start..entry.end]);
        let Some(order) = &entry.input_order else {
            return values;
        };
        let mut out = vec![0.0f32; values.len()];
        for (o, v) in out.chunks_exact_mut(cols).zip(values.chunks_exact(cols)) {
            for (&to, &x) in order.iter().zip(v) {
                o[to as usize] = x;
            }
        }
        out
    }

    /// Tensor `name` with exactly `shape`, converted to f32 (for norms, biases, small tensors).
    pub fn f32_values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        self.check_shape(name, entry, shape)?;
        if entry.ggml.is_some() {
            return Ok(self.ggml_values(entry, *shape.last().unwrap_or(&1)));
        }
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
            if let Some(ty) = entry.ggml {
                let values = dequantize(ty, &self.shards[entry.shard].map[entry.start..entry.end]);
                if let Some((index, nan)) =
                    crate::finite::first_non_finite(DType::F32, bytemuck::cast_slice(&values))
                {
                    return Err(crate::finite::non_finite_error(
                        &self.shards[entry.shard].path,
                        name,
                        index,
                        nan,
                    ));
                }
                continue;
            }
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
