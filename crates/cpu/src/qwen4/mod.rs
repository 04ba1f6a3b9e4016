//! The pieces qwen4_exp (Qwen3.8-Flash-Next) adds to the shared hybrid flow (MODEL_MATH §4):
//! hyper-connections, PLE n-gram embeddings and the QSA indexer. Their weights are
//! `spindle_model::weights`'.

pub mod hyper;
pub use spindle_model::ngram;

pub mod ple;
pub mod qsa;

pub use qsa::IndexerCache;
