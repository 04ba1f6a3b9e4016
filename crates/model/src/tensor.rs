//! Weight tensors that live in a memory map (or, rarely, an aligned heap copy).

use std::sync::{Arc, OnceLock};

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
    /// f32 values made on first read and kept (a block-FP8 tensor's dequantization: a
    /// backend that runs the stored FP8 form never pays for it); `[start, end)` of their bytes.
    Lazy {
        values: Arc<LazyValues>,
        start: usize,
        end: usize,
    },
}

/// The f32 values behind [`Storage::Lazy`], made once by `make`.
pub struct LazyValues {
    words: OnceLock<Vec<u64>>,
    make: Box<dyn Fn() -> Vec<f32> + Send + Sync>,
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

    /// `len` f32 values that `make` computes when they are first read.
    pub fn lazy_f32(len: usize, make: impl Fn() -> Vec<f32> + Send + Sync + 'static) -> Self {
        Storage::Lazy {
            values: Arc::new(LazyValues {
                words: OnceLock::new(),
                make: Box::new(make),
            }),
            start: 0,
            end: len * 4,
        }
    }

    /// Whether the bytes exist: false for lazy values not read yet.
    pub fn is_materialized(&self) -> bool {
        match self {
            Storage::Lazy { values, .. } => values.words.get().is_some(),
            _ => true,
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
            Storage::Lazy { values, start, end } => {
                let words = values.words.get_or_init(|| {
                    let made = (values.make)();
                    let mut words = vec![0u64; (made.len() * 4).div_ceil(8)];
                    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..made.len() * 4]
                        .copy_from_slice(bytemuck::cast_slice(&made));
                    words
                });
                &bytemuck::cast_slice::<u64, u8>(words)[*start..*end]
            }
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
            Storage::Lazy {
                values, start: s, ..
            } => Storage::Lazy {
                values: values.clone(),
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
    /// For a block-FP8 tensor dequantized on load: its stored codes and scales (what a
    /// backend that runs FP8 reads instead of the f32 values).
    fp8: Option<StoredFp8>,
}

/// The stored form of a block-FP8 matrix (MODEL_MATH §9) viewed as `[rows, cols]`: e4m3
/// codes and the tensor's whole f32 scale grid, W[r, c] = e4m3(code[r, c]) · scale(r, c).
#[derive(Clone)]
pub struct StoredFp8 {
    /// e4m3fn codes, `rows · cols` bytes.
    codes: Storage,
    /// The tensor's scale grid `[.., ⌈R/Bo⌉, ⌈cols/Bi⌉]` as f32.
    scales: Arc<Vec<f32>>,
    /// `weight_block_size` [Bo, Bi].
    pub block: [usize; 2],
    /// R: the rows of one matrix of the stored tensor (a fused expert tensor `[E, R, cols]`
    /// stacks E of them).
    stack_rows: usize,
    /// This view's first row within the tensor's `E · R` rows.
    row0: usize,
}

impl StoredFp8 {
    /// The codes of a whole tensor of `rows` (= E · `stack_rows`) rows of `cols`.
    pub fn new(codes: Storage, scales: Vec<f32>, block: [usize; 2], stack_rows: usize) -> Self {
        StoredFp8 {
            codes,
            scales: Arc::new(scales),
            block,
            stack_rows,
            row0: 0,
        }
    }

    /// The e4m3 codes of this view, row-major.
    pub fn codes(&self) -> &[u8] {
        self.codes.bytes()
    }

    /// The whole tensor's scale grid (of the tensor this view was cut from).
    pub fn grid(&self) -> &[f32] {
        &self.scales
    }

    /// The scales of row `r` of this view, one per block of `block[1]` columns.
    pub fn row_scales(&self, r: usize, cols: usize) -> &[f32] {
        let g = self.row0 + r;
        let (e, i) = (g / self.stack_rows, g % self.stack_rows);
        let (srows, scols) = (
            self.stack_rows.div_ceil(self.block[0]),
            cols.div_ceil(self.block[1]),
        );
        &self.scales[(e * srows + i / self.block[0]) * scols..][..scols]
    }
}

impl Matrix {
    pub fn new(dtype: DType, rows: usize, cols: usize, storage: Storage) -> Self {
        debug_assert_eq!(storage.bytes().len(), rows * cols * dtype.size());
        Matrix {
            dtype,
            rows,
            cols,
            storage,
            fp8: None,
        }
    }

    /// This matrix (the f32 dequantization of a block-FP8 tensor) with its stored form.
    pub fn with_fp8(mut self, fp8: StoredFp8) -> Self {
        debug_assert_eq!(fp8.codes.bytes().len(), self.rows * self.cols);
        self.fp8 = Some(fp8);
        self
    }

    /// The stored block-FP8 form of this matrix, when it was dequantized from one.
    pub fn fp8(&self) -> Option<&StoredFp8> {
        self.fp8.as_ref()
    }

    /// Whether the values exist yet (a block-FP8 tensor's are made when first read).
    pub fn is_materialized(&self) -> bool {
        self.storage.is_materialized()
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
            // A reshape regroups rows: the scale grid no longer lines up.
            fp8: None,
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
            fp8: self.fp8.as_ref().map(|f| StoredFp8 {
                codes: f
                    .codes
                    .slice(first * self.cols, (first + count) * self.cols),
                row0: f.row0 + first,
                ..f.clone()
            }),
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
        ty: crate::quant::ggml::GgmlType,
        shape: Vec<usize>,
        start: usize,
        end: usize,
        /// Column `c` of the stored blocks multiplies input element `input_order[c]` (the
        /// converter reordered the columns in units smaller than a block).
        input_order: Option<std::sync::Arc<[u32]>>,
    },
    /// ggml blocks reordered on open (whole rows moved, the blocks as stored).
    OwnedBlocks {
        ty: crate::quant::ggml::GgmlType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    },
    /// Values converted on open.
    Owned { shape: Vec<usize>, values: Vec<f32> },
    /// An integer buffer rebuilt from metadata (qwen4exp's PLE hash constants), stored as I64.
    Ints { shape: Vec<usize>, values: Vec<i64> },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_values_are_made_once_on_first_read_and_slices_share_them() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = calls.clone();
        let storage = Storage::lazy_f32(6, move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        });
        let m = Matrix::new(DType::F32, 3, 2, storage);
        let rows = m.rows_slice(1, 2);
        assert!(!m.is_materialized() || cfg!(debug_assertions));
        assert_eq!(rows.to_f32(), [3.0, 4.0, 5.0, 6.0]);
        assert!(m.is_materialized());
        assert_eq!(m.to_f32(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
