//! A GGUF tensor kept in its ggml blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): the bytes of the file,
//! memory-mapped, which the CPU kernels read directly (`spindle_kernels::linear`).

use crate::gguf::quants::GgmlType;
use crate::quant::view::{MatRef, Weights};
use crate::tensor::Storage;

/// A row-major `[rows, cols]` matrix in ggml blocks of one type (each row whole blocks).
#[derive(Clone)]
pub struct BlockMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
}

impl BlockMatrix {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, storage: Storage) -> Self {
        assert_eq!(
            storage.bytes().len(),
            rows * crate::quant::view::ggml_row_bytes(ty, cols),
            "{} [{rows}, {cols}] blocks of another length",
            ty.name()
        );
        BlockMatrix {
            ty,
            rows,
            cols,
            storage,
        }
    }

    pub fn mat(&self) -> MatRef<'_> {
        let weights = Weights::Ggml {
            ty: self.ty,
            blocks: self.storage.bytes(),
        };
        MatRef::new(weights, self.rows, self.cols)
    }
}

impl std::fmt::Debug for BlockMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlockMatrix({} [{}, {}])",
            self.ty.name(),
            self.rows,
            self.cols
        )
    }
}
