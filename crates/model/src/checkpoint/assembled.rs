//! Checkpoints assembled from another format's tensors (GGUF): ranges of mapped files kept as
//! they are, and tensors converted on open.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use safetensors::Dtype as StDtype;

use super::{Checkpoint, Entry, Shard};
use crate::error::{ModelError, Result};
use crate::tensor::{DType, Part};

/// `len` bytes of writable memory backed by a memory file (`memfd_create`), shared-mapped:
/// unlike a private anonymous map, pages a tensor gives back with
/// [`Storage::release_pages`](crate::tensor::Storage::release_pages) (MADV_DONTNEED) read back
/// their contents, not zeros, when another view of the same bytes touches them again.
fn shared_memory(len: usize) -> std::io::Result<memmap2::MmapMut> {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it returns a new descriptor
    // or -1 with errno set.
    let fd =
        unsafe { libc::memfd_create(c"spindle-converted-tensors".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor this function owns; the File closes it.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    // SAFETY: the memory file is private to this process and only written through this map.
    unsafe { memmap2::MmapMut::map_mut(&file) }
}

fn st_dtype(dtype: DType) -> StDtype {
    match dtype {
        DType::Bf16 => StDtype::BF16,
        DType::F16 => StDtype::F16,
        DType::F32 => StDtype::F32,
    }
}

impl Checkpoint {
    /// A checkpoint assembled from another format's tensors (GGUF), under the safetensors
    /// names the loader asks for: ranges of mapped files kept as they are, and tensors
    /// converted on open, laid into one anonymous map.
    pub(crate) fn assembled(dir: &Path, tensors: Vec<(String, Part)>) -> Result<Self> {
        let mut checkpoint = Checkpoint {
            dir: dir.to_owned(),
            shards: Vec::new(),
            entries: HashMap::new(),
            fp8: None,
            keep_blocks: false,
        };
        let owned_bytes: usize = tensors
            .iter()
            .map(|(_, p)| match p {
                Part::Owned { values, .. } => values.len() * 4,
                Part::Ints { values, .. } => values.len() * 8,
                Part::OwnedBlocks { bytes, .. } => bytes.len(),
                Part::Mapped { .. } | Part::Blocks { .. } => 0,
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
                    placed.push((name, shard, st_dtype(dtype), None, shape, start, end));
                }
                Part::Blocks {
                    path,
                    map,
                    ty,
                    shape,
                    start,
                    end,
                    input_order,
                } => {
                    let shard = match checkpoint.shards.iter().position(|s| s.path == path) {
                        Some(i) => i,
                        None => {
                            checkpoint.shards.push(Shard { path, map });
                            checkpoint.shards.len() - 1
                        }
                    };
                    placed.push((
                        name,
                        shard,
                        StDtype::U8,
                        Some((ty, input_order)),
                        shape,
                        start,
                        end,
                    ));
                }
                Part::Owned { shape, values } => {
                    let bytes: &[u8] = bytemuck::cast_slice(&values);
                    owned[at..at + bytes.len()].copy_from_slice(bytes);
                    placed.push((
                        name,
                        usize::MAX,
                        StDtype::F32,
                        None,
                        shape,
                        at,
                        at + bytes.len(),
                    ));
                    at += bytes.len();
                }
                Part::OwnedBlocks { ty, shape, bytes } => {
                    owned[at..at + bytes.len()].copy_from_slice(&bytes);
                    placed.push((
                        name,
                        usize::MAX,
                        StDtype::U8,
                        Some((ty, None)),
                        shape,
                        at,
                        at + bytes.len(),
                    ));
                    at += bytes.len();
                }
                Part::Ints { shape, values } => {
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    owned[at..at + bytes.len()].copy_from_slice(&bytes);
                    placed.push((
                        name,
                        usize::MAX,
                        StDtype::I64,
                        None,
                        shape,
                        at,
                        at + bytes.len(),
                    ));
                    at += bytes.len();
                }
            }
        }
        let owned_shard = checkpoint.shards.len();
        checkpoint.shards.push(Shard {
            path: dir.to_owned(),
            map: Arc::new(owned.make_read_only().map_err(io_err)?),
        });
        for (name, shard, dtype, ggml, shape, start, end) in placed {
            let entry = Entry {
                shard: if shard == usize::MAX {
                    owned_shard
                } else {
                    shard
                },
                dtype,
                shape,
                start,
                end,
                scale: None,
                ggml: ggml.as_ref().map(|(ty, _)| *ty),
                input_order: ggml.and_then(|(_, order)| order),
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
}
