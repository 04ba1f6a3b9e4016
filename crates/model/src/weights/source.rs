//! Where the loader reads tensors, and the keys of the weight schema mapped to a checkpoint's
//! names.

use crate::install::Install;
use crate::layout::TensorDef;
use crate::weights::experts::load::ExpertSetup;
use crate::{Checkpoint, ModelError, Result, TensorNames};

use super::packed::PackedMatrix;
use super::Linear;

/// Where the loader reads tensors: a checkpoint, and for an install also its quantized
/// resident tensors and its expert files.
pub struct Source<'a> {
    pub ck: &'a Checkpoint,
    pub install: Option<(&'a Install, &'a ExpertSetup)>,
}

impl Source<'_> {
    /// Whether tensor `name` exists, as stored or quantized.
    pub fn contains(&self, name: &str) -> bool {
        self.ck.contains(name)
            || self
                .install
                .is_some_and(|(i, _)| matches!(i.quantized(name), Ok(Some(_))))
    }

    /// The matrix `name` of `shape`: quantized as the install stores it, or as mapped.
    pub fn linear(&self, name: &str, shape: &[usize]) -> Result<Linear> {
        if let Some((install, _)) = self.install {
            if let Some(q) = install.quantized(name)? {
                if shape != [q.rows, q.cols] {
                    return Err(ModelError::ShapeMismatch {
                        path: q.file.path().to_owned(),
                        tensor: name.to_owned(),
                        actual: vec![q.rows, q.cols],
                        expected: shape.to_vec(),
                    });
                }
                return Ok(Linear::Packed(PackedMatrix::from_resident(&q)));
            }
        }
        self.mapped(name, shape)
    }

    /// The matrix `name` of `shape` as the checkpoint holds it: mapped, or a GGUF tensor in
    /// its blocks when the checkpoint keeps them.
    pub fn mapped(&self, name: &str, shape: &[usize]) -> Result<Linear> {
        if let Some(b) = self.ck.blocks(name, shape)? {
            return Ok(Linear::Blocks(b));
        }
        Ok(Linear::Mapped(self.ck.matrix(name, shape)?))
    }
}

/// Tensor keys below one prefix (the trunk, or one layer) of a [`Source`], mapped to the
/// checkpoint's names (text-only or VLM trunk prefix).
pub(super) struct At<'a> {
    pub src: &'a Source<'a>,
    pub names: &'a TensorNames,
    layer: Option<usize>,
}

impl<'a> At<'a> {
    pub fn trunk(src: &'a Source<'a>, names: &'a TensorNames) -> Self {
        At {
            src,
            names,
            layer: None,
        }
    }

    pub fn layer(src: &'a Source<'a>, names: &'a TensorNames, layer: usize) -> Self {
        At {
            src,
            names,
            layer: Some(layer),
        }
    }

    /// The checkpoint key of `d`.
    pub fn name(&self, d: &TensorDef) -> String {
        match self.layer {
            Some(i) => self.names.layer(i, &d.key),
            None => self.names.trunk(&d.key),
        }
    }

    /// Whether `d` exists, as stored or quantized.
    pub fn contains(&self, d: &TensorDef) -> bool {
        self.src.contains(&self.name(d))
    }

    /// Matrix `d`: quantized as an install stores it, or as mapped.
    pub fn linear(&self, d: &TensorDef) -> Result<Linear> {
        self.src.linear(&self.name(d), &d.shape)
    }

    /// Matrix `d` as the checkpoint maps it (tensors an install never quantizes).
    pub fn mapped(&self, d: &TensorDef) -> Result<Linear> {
        self.src.mapped(&self.name(d), &d.shape)
    }

    /// Small vector `d` copied as f32.
    pub fn values(&self, d: &TensorDef) -> Result<Vec<f32>> {
        self.src.ck.f32_values(&self.name(d), &d.shape)
    }
}
