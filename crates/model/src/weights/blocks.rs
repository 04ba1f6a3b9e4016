//! A GGUF tensor kept in its ggml blocks (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): the bytes of the file,
//! memory-mapped, which the CPU kernels read directly (`spindle_kernels::linear`).

use crate::quant::ggml::GgmlType;
use crate::quant::view::{MatRef, Weights};
use crate::tensor::Storage;
use std::sync::Arc;

/// A row-major `[rows, cols]` matrix in ggml blocks of one type (each row whole blocks).
#[derive(Clone)]
pub struct BlockMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
    /// Column `c` multiplies input element `input_order[c]` (the converter reordered the
    /// columns; backends gather the input), or None when in order.
    input_order: Option<Arc<[u32]>>,
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
            input_order: None,
        }
    }

    /// This matrix with its columns multiplying the input elements `order` (one per column).
    pub fn with_input_order(self, order: Arc<[u32]>) -> Self {
        assert_eq!(order.len(), self.cols, "one input index per column");
        BlockMatrix {
            input_order: Some(order),
            ..self
        }
    }

    /// The input element each column multiplies, when not in order: y = W·x[order].
    pub fn input_order(&self) -> Option<&[u32]> {
        self.input_order.as_deref()
    }

    /// The stored blocks, row after row (`rows · ggml_row_bytes(ty, cols)` bytes).
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
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
