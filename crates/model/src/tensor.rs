//! Weight tensors that live in a memory map (or, rarely, an aligned heap copy).

use std::sync::Arc;

use memmap2::Mmap;

/// Element types spindle reads from checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    Bf16,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        }
    }
}

/// Bytes of a tensor: a range of a shared memory map, or an owned copy aligned to 8 bytes
/// (used when a tensor's offset in the file is not aligned to its element size).
#[derive(Clone)]
pub enum Storage {
    Mapped {
        map: Arc<Mmap>,
        start: usize,
        end: usize,
    },
    Owned {
        words: Arc<Vec<u64>>,
        len: usize,
    },
}

impl Storage {
    /// Wraps `map[start..end]`, copying it when `start` is not aligned to `align`.
    pub fn new(map: &Arc<Mmap>, start: usize, end: usize, align: usize) -> Self {
        let addr = map.as_ptr() as usize + start;
        if addr % align == 0 {
            return Storage::Mapped {
                map: map.clone(),
                start,
                end,
            };
        }
        let len = end - start;
        let mut words = vec![0u64; len.div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len].copy_from_slice(&map[start..end]);
        Storage::Owned {
            words: Arc::new(words),
            len,
        }
    }

    /// An owned copy of f32 `values` (a tensor dequantized on load).
    pub fn from_f32(values: &[f32]) -> Self {
        let len = values.len() * 4;
        let mut words = vec![0u64; len.div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len]
            .copy_from_slice(bytemuck::cast_slice(values));
        Storage::Owned {
            words: Arc::new(words),
            len,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped { map, start, end } => &map[*start..*end],
            Storage::Owned { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
        }
    }

    /// Tells the kernel this process no longer needs the mapped pages wholly inside this
    /// range (they stay in the page cache and fault back in if read again), so a tensor that
    /// was converted on load stops counting towards the resident set. No-op for heap copies.
    pub fn release_pages(&self) {
        if let Storage::Mapped { map, start, end } = self {
            const PAGE: usize = 4096;
            let base = map.as_ptr() as usize;
            let first = (base + start).next_multiple_of(PAGE) - base;
            let last = (base + end) / PAGE * PAGE - base;
            if last > first {
                // SAFETY: the map is a read-only file mapping (`Mmap`); MADV_DONTNEED drops
                // our page-table entries and later reads re-fault the same file contents, so
                // no reference into the map ever observes different bytes.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        first,
                        last - first,
                    )
                };
            }
        }
    }

    /// The sub-range `[start, end)` of these bytes, sharing the storage.
    fn slice(&self, start: usize, end: usize) -> Self {
        match self {
            Storage::Mapped { map, start: s, .. } => Storage::Mapped {
                map: map.clone(),
                start: s + start,
                end: s + end,
            },
            Storage::Owned { words, .. } => {
                // Owned copies are rare (misaligned files); slicing copies again.
                let bytes = &bytemuck::cast_slice::<u64, u8>(words)[start..end];
                let mut out = vec![0u64; bytes.len().div_ceil(8)];
                bytemuck::cast_slice_mut::<u64, u8>(&mut out)[..bytes.len()].copy_from_slice(bytes);
                Storage::Owned {
                    words: Arc::new(out),
                    len: end - start,
                }
            }
        }
    }
}

/// A row-major `[rows, cols]` weight matrix (y = x·Wᵀ reads it row by row).
#[derive(Clone)]
pub struct Matrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
}

impl Matrix {
    pub fn new(dtype: DType, rows: usize, cols: usize, storage: Storage) -> Self {
        debug_assert_eq!(storage.bytes().len(), rows * cols * dtype.size());
        Matrix {
            dtype,
            rows,
            cols,
            storage,
        }
    }

    /// The raw little-endian bytes, aligned to the element size.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// The same bytes viewed as `[rows, cols]` (a row-major reshape; the element count must
    /// agree), e.g. a Conv3d kernel `[D, C, T, P, P]` as `[D, C·T·P·P]`.
    pub fn reshaped(&self, rows: usize, cols: usize) -> Matrix {
        assert_eq!(
            rows * cols,
            self.rows * self.cols,
            "reshape changes the element count"
        );
        Matrix {
            rows,
            cols,
            ..self.clone()
        }
    }

    /// Rows `[first, first + count)` as a matrix sharing the same bytes.
    pub fn rows_slice(&self, first: usize, count: usize) -> Matrix {
        assert!(first + count <= self.rows, "row slice out of range");
        let row_bytes = self.cols * self.dtype.size();
        Matrix {
            dtype: self.dtype,
            rows: count,
            cols: self.cols,
            storage: self
                .storage
                .slice(first * row_bytes, (first + count) * row_bytes),
        }
    }

    /// See [`Storage::release_pages`].
    pub fn release_pages(&self) {
        self.storage.release_pages();
    }

    /// Row `r` converted to f32.
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let row_bytes = self.cols * self.dtype.size();
        decode_f32(
            self.dtype,
            &self.bytes()[r * row_bytes..(r + 1) * row_bytes],
        )
    }

    /// All elements converted to f32 (for small tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        decode_f32(self.dtype, self.bytes())
    }

    pub fn size_bytes(&self) -> usize {
        self.rows * self.cols * self.dtype.size()
    }
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Matrix({} [{}, {}])",
            self.dtype.name(),
            self.rows,
            self.cols
        )
    }
}

/// Converts little-endian bytes of `dtype` to f32.
pub fn decode_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// One tensor of a checkpoint assembled from another format's tensors (GGUF): a range of a
/// mapped file as stored, or values converted on open.
pub(crate) enum Part {
    /// Bytes `start..end` of a mapped file, as stored.
    Mapped {
        path: std::path::PathBuf,
        map: std::sync::Arc<memmap2::Mmap>,
        dtype: DType,
        shape: Vec<usize>,
        start: usize,
        end: usize,
    },
    /// Bytes `start..end` of a mapped file in ggml blocks (a quantized GGUF tensor as
    /// stored): run in its blocks on the CPU, or dequantized when read as a float matrix.
    Blocks {
        path: std::path::PathBuf,
        map: std::sync::Arc<memmap2::Mmap>,
        ty: crate::gguf::quants::GgmlType,
        shape: Vec<usize>,
        start: usize,
        end: usize,
        /// Column `c` of the stored blocks multiplies input element `input_order[c]` (the
        /// converter reordered the columns in units smaller than a block).
        input_order: Option<std::sync::Arc<[u32]>>,
    },
    /// ggml blocks reordered on open (whole rows moved, the blocks as stored).
    OwnedBlocks {
        ty: crate::gguf::quants::GgmlType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    },
    /// Values converted on open.
    Owned { shape: Vec<usize>, values: Vec<f32> },
    /// An integer buffer rebuilt from metadata (qwen4exp's PLE hash constants), stored as I64.
    Ints { shape: Vec<usize>, values: Vec<i64> },
}
