//! Weight matrices in VRAM: bf16, Q8/Q4 codes with f16 scales in the CPU layouts of
//! `spindle_model::quant`, or block-FP8 e4m3 codes with their f32 block scales, as row blocks
//! of one format each (fused projections).

use std::borrow::Cow;

use spindle_model::quant::ggml::GgmlType;
use spindle_model::quant::{QuantizedMatrix, WeightFormat};
use spindle_model::weights::{BlockMatrix, Linear};
use spindle_model::DType;

/// The format of a matrix on the device: a CPU engine format, or block FP8 as the checkpoint
/// stores it (e4m3fn codes `[rows, cols]` and an f32 scale per row and group of 32 columns,
/// the last group of a row possibly 16: the block scale of those columns, so fused and
/// regrouped rows keep their scales), or a GGUF K-quant as the file stores it, split into
/// codes and per-superblock scale words ([`ggml_source`]; layouts in `kernels/ggml.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevFormat {
    Bf16,
    Q8,
    Q4,
    Fp8,
    Q4K,
    Q5K,
    Q6K,
}

impl From<WeightFormat> for DevFormat {
    fn from(f: WeightFormat) -> Self {
        match f {
            WeightFormat::Bf16 => DevFormat::Bf16,
            WeightFormat::Q8 => DevFormat::Q8,
            WeightFormat::Q4 => DevFormat::Q4,
        }
    }
}

impl DevFormat {
    pub fn name(self) -> &'static str {
        match self {
            DevFormat::Bf16 => "bf16",
            DevFormat::Q8 => "q8",
            DevFormat::Q4 => "q4",
            DevFormat::Fp8 => "fp8",
            DevFormat::Q4K => "q4_k",
            DevFormat::Q5K => "q5_k",
            DevFormat::Q6K => "q6_k",
        }
    }

    /// A GGUF K-quant: run by the decode kernels only (int8 activations), prefill included.
    pub fn ggml(self) -> bool {
        matches!(self, DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K)
    }

    /// Whether the tensor-core GEMM and the grouped expert kernels read int8 activations.
    pub fn int8(self) -> bool {
        matches!(self, DevFormat::Q8 | DevFormat::Q4)
    }

    /// Which activations the tensor-core GEMM reads: 0 bf16 planes, 1 int8, 2 e4m3 (the
    /// K-quants never reach it: int8, as their decode kernels stage).
    pub fn acts_kind(self) -> usize {
        match self {
            DevFormat::Bf16 => 0,
            DevFormat::Q8 | DevFormat::Q4 | DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => 1,
            DevFormat::Fp8 => 2,
        }
    }
}

/// Whether a `[rows, cols]` block-FP8 matrix with blocks of `block_cols` columns can stay FP8
/// on the device: rows of whole 16-byte chunks, and every group of 32 columns within one
/// block (true of any `block_cols` that is a multiple of 32, e.g. the released 128).
pub fn fp8_fits(cols: usize, block_cols: usize) -> bool {
    cols % 16 == 0
        && block_cols > 0
        && (0..cols.div_ceil(32))
            .all(|g| 32 * g / block_cols == ((32 * g + 32).min(cols) - 1) / block_cols)
}

use crate::device::{DevBuf, Device};
use crate::error::{CudaError, Result};

/// How the device kernels walk a row of a matrix in one of the [`DevFormat`]s (the
/// layouts are `spindle_model::quant`'s: bf16 words; Q8 i8 codes; Q4 packed nibbles in
/// llama.cpp Q4_0 order within a group of 32; f16 scales per group of 32; and FP8: e4m3
/// bytes, an f32 scale (two 16-bit words) per group of 32).
pub trait DeviceLayout: Copy {
    /// Bytes of codes per row.
    fn row_bytes(self, cols: usize) -> usize;
    /// 16-bit scale words per row.
    fn row_scales(self, cols: usize) -> usize;
    /// Bytes per row, codes and scales.
    fn row_size(self, cols: usize) -> usize {
        self.row_bytes(cols) + 2 * self.row_scales(cols)
    }
    /// The kernel-name suffix.
    fn suffix(self) -> &'static str;
    /// The tensor-core GEMM's granule of columns: a quantization group, or an mma k16 step.
    fn tensor_k(self) -> usize;
    /// Values per 16-byte chunk of codes (the vector kernels' unit).
    fn chunk_values(self) -> usize;
}

impl DeviceLayout for DevFormat {
    fn row_bytes(self, cols: usize) -> usize {
        match self {
            DevFormat::Bf16 => WeightFormat::Bf16.code_bytes(1, cols),
            DevFormat::Q8 => WeightFormat::Q8.code_bytes(1, cols),
            DevFormat::Q4 => WeightFormat::Q4.code_bytes(1, cols),
            DevFormat::Fp8 => cols,
            DevFormat::Q4K => cols / 2,
            DevFormat::Q5K => cols / 256 * 160,
            DevFormat::Q6K => cols / 256 * 192,
        }
    }

    fn row_scales(self, cols: usize) -> usize {
        match self {
            DevFormat::Bf16 => WeightFormat::Bf16.scale_bytes(1, cols) / 2,
            DevFormat::Q8 => WeightFormat::Q8.scale_bytes(1, cols) / 2,
            DevFormat::Q4 => WeightFormat::Q4.scale_bytes(1, cols) / 2,
            DevFormat::Fp8 => cols.div_ceil(32) * 2,
            DevFormat::Q4K | DevFormat::Q5K => cols / 256 * 8,
            DevFormat::Q6K => cols / 256 * 10,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            DevFormat::Bf16 => "bf16",
            DevFormat::Q8 => "q8",
            DevFormat::Q4 => "q4",
            DevFormat::Fp8 => "fp8",
            DevFormat::Q4K => "q4k",
            DevFormat::Q5K => "q5k",
            DevFormat::Q6K => "q6k",
        }
    }

    fn tensor_k(self) -> usize {
        match self {
            DevFormat::Bf16 => 16,
            DevFormat::Q8 | DevFormat::Q4 | DevFormat::Fp8 => 32,
            DevFormat::Q4K | DevFormat::Q5K | DevFormat::Q6K => 256,
        }
    }

    fn chunk_values(self) -> usize {
        match self {
            DevFormat::Bf16 => 8,
            DevFormat::Q8 | DevFormat::Fp8 => 16,
            DevFormat::Q4 | DevFormat::Q4K | DevFormat::Q5K => 32,
            DevFormat::Q6K => 64,
        }
    }
}

/// Whether a GGUF matrix in blocks runs on the device as stored ([`ggml_source`]): Q4_K,
/// Q5_K, Q6_K, Q8_0 (as Q8) and Q4_0 (as Q4), columns in input order (the loader dequantizes
/// the others, e.g. `ssm_out` with its reordered columns, to bf16).
pub fn ggml_fits(b: &BlockMatrix) -> bool {
    b.input_order().is_none()
        && match b.ty {
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => b.cols % 256 == 0,
            GgmlType::Q8_0 | GgmlType::Q4_0 => b.cols % 32 == 0,
            GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => false,
        }
}

/// A GGUF matrix's blocks split into the device layout, no value changed: Q8_0 and Q4_0
/// blocks are exactly spindle's Q8 and Q4 groups (an f16 scale, then the 32 codes / 16 bytes
/// of nibbles in Q4_0 order); a K-quant superblock's codes go to the codes and its scales to
/// the scale words (Q4_K, Q5_K: the 16-byte header d, dmin, 12 bytes of 6-bit scales and
/// mins, then qs (Q5_K: qh, qs); Q6_K: ql, qh, then its 16 int8 scales and d, padded to 20
/// bytes).
pub fn ggml_source(b: &BlockMatrix) -> Result<Source<'_>> {
    if !ggml_fits(b) {
        return Err(CudaError::Unsupported(format!(
            "a [{}, {}] {} matrix in GGUF blocks{}: the CUDA backend runs Q4_K, Q5_K, Q6_K, Q8_0 and Q4_0 blocks in input order",
            b.rows,
            b.cols,
            b.ty.name(),
            if b.input_order().is_some() { " with reordered columns" } else { "" }
        )));
    }
    // (device format, bytes of scales leading a block (Q6_K: of codes), zero bytes of padding
    // after the scales)
    let (fmt, split, pad) = match b.ty {
        GgmlType::Q8_0 => (DevFormat::Q8, 2, 0),
        GgmlType::Q4_0 => (DevFormat::Q4, 2, 0),
        GgmlType::Q4K => (DevFormat::Q4K, 16, 0),
        GgmlType::Q5K => (DevFormat::Q5K, 16, 0),
        GgmlType::Q6K => (DevFormat::Q6K, 192, 2),
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => unreachable!("checked by ggml_fits"),
    };
    let mut codes = Vec::with_capacity(b.rows * fmt.row_bytes(b.cols));
    let mut scale_bytes = Vec::with_capacity(b.rows * fmt.row_scales(b.cols) * 2);
    for blk in b.bytes().chunks_exact(b.ty.block_bytes()) {
        // Q6_K keeps its scales after the codes; the others lead with them.
        let (scales, code) = if b.ty == GgmlType::Q6K {
            (&blk[split..], &blk[..split])
        } else {
            blk.split_at(split)
        };
        codes.extend_from_slice(code);
        scale_bytes.extend_from_slice(scales);
        scale_bytes.extend(std::iter::repeat_n(0u8, pad));
    }
    let scales: Vec<u16> = scale_bytes
        .chunks_exact(2)
        .map(|w| u16::from_le_bytes([w[0], w[1]]))
        .collect();
    assert_eq!(
        (codes.len(), scales.len()),
        (
            b.rows * fmt.row_bytes(b.cols),
            b.rows * fmt.row_scales(b.cols)
        ),
        "{} [{}, {}]: the device layout's sizes",
        b.ty.name(),
        b.rows,
        b.cols
    );
    Ok(Source {
        fmt,
        codes: Cow::Owned(codes),
        scales: Cow::Owned(scales),
        rows: b.rows,
        cols: b.cols,
    })
}

/// A row-major `[rows, cols]` matrix in one format on the device.
pub struct DevPart {
    pub fmt: DevFormat,
    pub codes: DevBuf<u8>,
    /// Empty for bf16.
    pub scales: DevBuf<u16>,
    pub rows: usize,
    pub cols: usize,
}

impl DevPart {
    pub fn new(dev: &Device, fmt: DevFormat, rows: usize, cols: usize) -> Result<Self> {
        Ok(DevPart {
            fmt,
            codes: dev.zeros(rows * fmt.row_bytes(cols))?,
            scales: dev.zeros(rows * fmt.row_scales(cols))?,
            rows,
            cols,
        })
    }

    pub fn size_bytes(&self) -> usize {
        self.rows * self.fmt.row_size(self.cols)
    }

    /// Whether the 16-byte vector path can read rows of this matrix.
    pub fn vec_ok(&self) -> bool {
        self.cols % self.fmt.chunk_values() == 0 && self.codes.ptr() % 16 == 0
    }

    /// Copies rows `[from, from + count)` of `src` to rows `[to, to + count)`.
    pub fn put(
        &mut self,
        dev: &Device,
        src: &Source,
        from: usize,
        count: usize,
        to: usize,
    ) -> Result<()> {
        if src.fmt != self.fmt {
            return Err(CudaError::Unsupported(format!(
                "fusing a {} matrix into a {} one",
                src.fmt.suffix(),
                self.fmt.suffix()
            )));
        }
        assert_eq!(
            src.cols, self.cols,
            "fused matrices share their input width"
        );
        assert!(from + count <= src.rows && to + count <= self.rows);
        let rb = self.fmt.row_bytes(self.cols);
        dev.write(
            &mut self.codes,
            to * rb,
            &src.codes[from * rb..(from + count) * rb],
        )?;
        let rs = self.fmt.row_scales(self.cols);
        if rs > 0 {
            dev.write(
                &mut self.scales,
                to * rs,
                &src.scales[from * rs..(from + count) * rs],
            )?;
        }
        Ok(())
    }
}

/// The host bytes of a CPU engine matrix: bf16 as mapped, Q8/Q4 as quantized on load, or
/// block FP8 as stored (kept by the loader when it fits, [`fp8_fits`]).
pub struct Source<'a> {
    pub fmt: DevFormat,
    pub codes: Cow<'a, [u8]>,
    pub scales: Cow<'a, [u16]>,
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Source<'a> {
    pub fn of(linear: &'a Linear) -> Result<Self> {
        match linear {
            Linear::Mapped(m) => {
                if let Some(fp8) = m.fp8().filter(|f| fp8_fits(m.cols, f.block[1])) {
                    // One f32 per row and group of 32 columns: its block's scale.
                    let groups = m.cols.div_ceil(32);
                    let mut scales = Vec::with_capacity(m.rows * groups * 2);
                    for r in 0..m.rows {
                        let blocks = fp8.row_scales(r, m.cols);
                        for g in 0..groups {
                            let bits = blocks[g * 32 / fp8.block[1]].to_bits();
                            scales.extend_from_slice(&[bits as u16, (bits >> 16) as u16]);
                        }
                    }
                    return Ok(Source {
                        fmt: DevFormat::Fp8,
                        codes: Cow::Borrowed(fp8.codes()),
                        scales: Cow::Owned(scales),
                        rows: m.rows,
                        cols: m.cols,
                    });
                }
                if m.dtype != DType::Bf16 {
                    return Err(CudaError::Unsupported(format!(
                        "a [{}, {}] weight matrix is {}; the CUDA backend reads bf16 checkpoints only",
                        m.rows,
                        m.cols,
                        m.dtype.name()
                    )));
                }
                Ok(Source {
                    fmt: DevFormat::Bf16,
                    codes: Cow::Borrowed(m.bytes()),
                    scales: Cow::Borrowed(&[]),
                    rows: m.rows,
                    cols: m.cols,
                })
            }
            Linear::Quantized(q) => Ok(Self::quantized(q)),
            Linear::Packed(_) => Err(CudaError::Unsupported(
                "a weight matrix comes from a spindle install; the CUDA backend reads Hugging Face checkpoints only"
                    .into(),
            )),
            Linear::Blocks(b) => ggml_source(b),
        }
    }

    fn quantized(q: &'a QuantizedMatrix) -> Self {
        Source {
            fmt: q.format.into(),
            codes: Cow::Borrowed(&q.qs),
            scales: Cow::Borrowed(&q.scales),
            rows: q.rows,
            cols: q.cols,
        }
    }
}

/// A `[rows, cols]` weight matrix made of row blocks, each in one format (projections that
/// read the same input are fused; the CPU may have quantized some of them and not others).
pub struct DevMatrix {
    /// (first row, block).
    pub parts: Vec<(usize, DevPart)>,
    pub rows: usize,
    pub cols: usize,
}

impl DevMatrix {
    /// Uploads one CPU engine matrix as is.
    pub fn upload(dev: &Device, m: &Linear) -> Result<Self> {
        Self::stack(dev, &[m])
    }

    /// Uploads the vertical concatenation of `parts` (consecutive parts of one format share
    /// one block).
    pub fn stack(dev: &Device, parts: &[&Linear]) -> Result<Self> {
        let sources = parts
            .iter()
            .map(|m| Source::of(m))
            .collect::<Result<Vec<_>>>()?;
        let cols = sources[0].cols;
        let mut out = Vec::new();
        let mut at = 0;
        let mut k = 0;
        while k < sources.len() {
            let fmt = sources[k].fmt;
            let mut end = k;
            while end < sources.len() && sources[end].fmt == fmt {
                end += 1;
            }
            let rows: usize = sources[k..end].iter().map(|s| s.rows).sum();
            let mut part = DevPart::new(dev, fmt, rows, cols)?;
            let mut to = 0;
            for s in &sources[k..end] {
                part.put(dev, s, 0, s.rows, to)?;
                to += s.rows;
            }
            out.push((at, part));
            at += rows;
            k = end;
        }
        Ok(DevMatrix {
            parts: out,
            rows: at,
            cols,
        })
    }

    /// One block, for a matrix assembled row range by row range.
    pub fn single(part: DevPart) -> Self {
        DevMatrix {
            rows: part.rows,
            cols: part.cols,
            parts: vec![(0, part)],
        }
    }

    /// The block holding all of `rows`, and the first of them within it.
    pub fn part_of(&self, rows: std::ops::Range<usize>) -> Option<(&DevPart, usize)> {
        self.parts.iter().find_map(|(row0, part)| {
            (rows.start >= *row0 && rows.end <= row0 + part.rows).then(|| (part, rows.start - row0))
        })
    }

    /// The bf16 words of a one-block bf16 matrix (the embedding table).
    pub fn bf16_ptr(&self) -> Result<u64> {
        match self.parts.as_slice() {
            [(0, part)] if part.fmt == DevFormat::Bf16 => Ok(part.codes.ptr()),
            _ => Err(CudaError::Unsupported(
                "the embedding table must be bf16".into(),
            )),
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(|(_, p)| p.size_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_model::quant::ggml::dequantize;
    use spindle_model::tensor::Storage;

    /// `rows` rows of `cols` in pseudo-random blocks of `ty` (finite f16 scales).
    fn blocks(ty: GgmlType, rows: usize, cols: usize) -> (BlockMatrix, Vec<u8>) {
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ ty.block_bytes() as u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        };
        let n = rows * cols / ty.block_elements() * ty.block_bytes();
        let mut bytes: Vec<u8> = (0..n).map(|_| byte()).collect();
        for blk in bytes.chunks_exact_mut(ty.block_bytes()) {
            let scale = half::f16::from_f32(0.01 * (blk[5] as f32 - 128.0) / 128.0).to_bits();
            let at = match ty {
                GgmlType::Q6K => 208,
                _ => 0,
            };
            blk[at..at + 2].copy_from_slice(&scale.to_le_bytes());
            if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) {
                blk[2..4].copy_from_slice(&scale.to_le_bytes());
            }
        }
        let mut words = vec![0u64; n.div_ceil(8)];
        for (i, &b) in bytes.iter().enumerate() {
            words[i / 8] |= (b as u64) << (8 * (i % 8));
        }
        let storage = Storage::Owned {
            words: std::sync::Arc::new(words),
            len: n,
        };
        (BlockMatrix::new(ty, rows, cols, storage), bytes)
    }

    #[test]
    fn q8_0_and_q4_0_blocks_are_spindles_q8_and_q4_groups() {
        for (ty, format) in [
            (GgmlType::Q8_0, WeightFormat::Q8),
            (GgmlType::Q4_0, WeightFormat::Q4),
        ] {
            let (rows, cols) = (5, 96);
            let (b, bytes) = blocks(ty, rows, cols);
            let src = ggml_source(&b).unwrap();
            assert_eq!(src.fmt, DevFormat::from(format));
            let q = QuantizedMatrix {
                rows,
                cols,
                qs: src.codes.to_vec(),
                scales: src.scales.to_vec(),
                format,
            };
            let mut row = vec![0.0f32; cols];
            let want = dequantize(ty, &bytes);
            for r in 0..rows {
                q.mat().row_to_f32(r, &mut row);
                assert_eq!(row, want[r * cols..(r + 1) * cols], "{} row {r}", ty.name());
            }
        }
    }

    #[test]
    fn k_quant_blocks_split_into_codes_and_scale_words_losslessly() {
        for (ty, fmt) in [
            (GgmlType::Q4K, DevFormat::Q4K),
            (GgmlType::Q5K, DevFormat::Q5K),
            (GgmlType::Q6K, DevFormat::Q6K),
        ] {
            let (rows, cols) = (3, 512);
            let (b, bytes) = blocks(ty, rows, cols);
            let src = ggml_source(&b).unwrap();
            assert_eq!(src.fmt, fmt);
            assert_eq!(src.codes.len(), rows * fmt.row_bytes(cols));
            assert_eq!(src.scales.len(), rows * fmt.row_scales(cols));
            // Superblock k back from its codes and scale words.
            let (cb, sw) = (fmt.row_bytes(256), fmt.row_scales(256));
            let scale_bytes: Vec<u8> = src.scales.iter().flat_map(|w| w.to_le_bytes()).collect();
            for (k, blk) in bytes.chunks_exact(ty.block_bytes()).enumerate() {
                let codes = &src.codes[k * cb..(k + 1) * cb];
                let scales = &scale_bytes[k * 2 * sw..(k + 1) * 2 * sw];
                let whole = match ty {
                    GgmlType::Q6K => {
                        assert_eq!(&scales[18..], &[0, 0], "Q6_K padding");
                        [codes, &scales[..18]].concat()
                    }
                    _ => [scales, codes].concat(),
                };
                assert_eq!(whole, blk, "{} superblock {k}", ty.name());
            }
        }
        // Reordered columns stay on the host (dequantized by the loader).
        let (b, _) = blocks(GgmlType::Q4K, 2, 256);
        let order: std::sync::Arc<[u32]> = (0..256u32).rev().collect();
        let reordered = b.with_input_order(order);
        assert!(!ggml_fits(&reordered));
        let err = ggml_source(&reordered).err().expect("refused").to_string();
        assert!(err.contains("reordered columns"), "{err}");
    }
}
