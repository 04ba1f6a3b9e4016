//! CPU kernels on plain slices. They know shapes and formats, never models.
//!
//! Every fast kernel has a scalar reference beside it (`*_ref`) and a test that runs both on
//! random inputs.

pub mod activation;
pub mod attention;
pub mod gdn;
pub mod gdn_chunked;
pub mod gdn_fused;
pub mod ggml;
pub mod linear;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod simd;
pub mod softmax;

pub use quant::QuantizedActs;
pub use simd::Isa;

#[cfg(test)]
pub(crate) mod testutil;
