//! What one tensor of the weight schema is: key, shape and class.

/// What a tensor is for: the unit of parameter counts and memory plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorClass {
    Embedding,
    LmHead,
    /// Layer norms and the final norm.
    Norm,
    /// Full-attention projections, q/k norms and the QSA indexer.
    Attention,
    /// Gated DeltaNet projections, conv, decay parameters and output norm.
    Gdn,
    DenseMlp,
    Router,
    SharedExpert,
    /// The routed experts: the bytes that can be streamed from disk.
    RoutedExperts,
    /// qwen4_exp hyper-connection blocks.
    HyperConnection,
    /// qwen4_exp PLE projections, norms and conv.
    Ple,
    /// qwen4_exp hashed n-gram table (read a few rows per token).
    NgramTable,
    /// The vision tower (`model.visual.*`).
    Vision,
}

impl TensorClass {
    pub fn name(self) -> &'static str {
        match self {
            TensorClass::Embedding => "embedding",
            TensorClass::LmHead => "lm_head",
            TensorClass::Norm => "norms",
            TensorClass::Attention => "attention",
            TensorClass::Gdn => "gdn",
            TensorClass::DenseMlp => "dense_mlp",
            TensorClass::Router => "router",
            TensorClass::SharedExpert => "shared_expert",
            TensorClass::RoutedExperts => "routed_experts",
            TensorClass::HyperConnection => "hyper_connections",
            TensorClass::Ple => "ple",
            TensorClass::NgramTable => "ngram_table",
            TensorClass::Vision => "vision",
        }
    }
}

/// One tensor: its key below its prefix (the trunk's `model.`, or layer i's
/// `model.layers.{i}.`; the LM head's is the whole key), its shape and its class.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDef {
    pub key: String,
    pub shape: Vec<usize>,
    pub class: TensorClass,
    /// Re-encoded when q8/q4 is asked for: the LM head, the attention and GDN projections,
    /// every MLP (dense, shared and routed experts). Everything else stays as stored.
    pub quantizable: bool,
}

/// A tensor kept as stored.
pub(super) fn def(key: impl Into<String>, shape: Vec<usize>, class: TensorClass) -> TensorDef {
    TensorDef {
        key: key.into(),
        shape,
        class,
        quantizable: false,
    }
}

/// A large projection, re-encoded when q8/q4 is asked for.
pub(super) fn proj(key: impl Into<String>, shape: Vec<usize>, class: TensorClass) -> TensorDef {
    TensorDef {
        quantizable: true,
        ..def(key, shape, class)
    }
}
