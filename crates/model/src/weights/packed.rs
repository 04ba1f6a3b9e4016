//! Weight matrices stored in a byte buffer laid out by an install: an expert record, or a
//! quantized tensor of the resident file. The bytes are a memory map or a heap buffer.

use std::ops::Range;
use std::sync::Arc;

use crate::install::{MappedFile, PartLayout, QuantTensor};
use crate::quant::view::{MatRef, Weights};
use crate::quant::WeightFormat;
use crate::weights::experts::buf::AlignedBuf;

/// Who keeps the bytes alive.
#[derive(Clone)]
pub enum Owner {
    Mapped(Arc<MappedFile>),
    Heap(Arc<AlignedBuf>),
}

impl Owner {
    fn bytes(&self) -> &[u8] {
        match self {
            Owner::Mapped(m) => m.bytes(),
            Owner::Heap(b) => b.as_slice(),
        }
    }
}

/// Element format of a packed matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    Bf16,
    F16,
    F32,
    Q8,
    Q4,
}

impl PackedFormat {
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "bf16" => PackedFormat::Bf16,
            "f16" => PackedFormat::F16,
            "f32" => PackedFormat::F32,
            "q8" => PackedFormat::Q8,
            "q4" => PackedFormat::Q4,
            _ => return None,
        })
    }
}

/// A `[rows, cols]` matrix whose codes (values) and scales are byte ranges of `owner`.
#[derive(Clone)]
pub struct PackedMatrix {
    pub format: PackedFormat,
    pub rows: usize,
    pub cols: usize,
    owner: Owner,
    codes: Range<usize>,
    scales: Range<usize>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({:?} [{}, {}])",
            self.format, self.rows, self.cols
        )
    }
}

impl PackedMatrix {
    pub fn mat(&self) -> MatRef<'_> {
        let bytes = self.owner.bytes();
        let codes = &bytes[self.codes.clone()];
        let scales = || bytemuck::cast_slice(&bytes[self.scales.clone()]);
        let weights = match self.format {
            PackedFormat::Bf16 => Weights::Bf16(bytemuck::cast_slice(codes)),
            PackedFormat::F16 => Weights::F16(bytemuck::cast_slice(codes)),
            PackedFormat::F32 => Weights::F32(bytemuck::cast_slice(codes)),
            PackedFormat::Q8 => Weights::Q8 {
                qs: bytemuck::cast_slice(codes),
                scales: scales(),
            },
            PackedFormat::Q4 => Weights::Q4 {
                qs: codes,
                scales: scales(),
            },
        };
        MatRef::new(weights, self.rows, self.cols)
    }

    /// Gives up the matrix, returning who holds its bytes.
    pub fn into_owner(self) -> Owner {
        self.owner
    }

    /// A quantized tensor of an install's resident file.
    pub fn from_resident(q: &QuantTensor) -> Self {
        PackedMatrix {
            format: match q.format {
                WeightFormat::Q4 => PackedFormat::Q4,
                _ => PackedFormat::Q8,
            },
            rows: q.rows,
            cols: q.cols,
            owner: Owner::Mapped(q.file.clone()),
            codes: q.codes.clone(),
            scales: q.scales.clone(),
        }
    }

    /// One part of the expert record starting at byte `base` of `owner`.
    pub(crate) fn from_part(owner: &Owner, base: usize, part: &PartLayout) -> Self {
        let at = |offset: u64, len: u64| base + offset as usize..base + (offset + len) as usize;
        PackedMatrix {
            format: PackedFormat::parse(&part.format)
                .expect("validated when the manifest was read"),
            rows: part.rows,
            cols: part.cols,
            owner: owner.clone(),
            codes: at(part.codes_offset, part.codes_bytes),
            scales: at(part.scales_offset, part.scales_bytes),
        }
    }
}
