//! Block-FP8 tensors of a checkpoint (MODEL_MATH §9): paired with their scales at open,
//! dequantized when read.

use safetensors::Dtype as StDtype;

use super::{Checkpoint, Entry};
use crate::error::{ModelError, Result};
use crate::fp8::BlockFp8;
use crate::tensor::{decode_f32, Storage, StoredFp8};

impl Checkpoint {
    /// Pairs every `F8_E4M3` tensor with its scale tensor, checking the scale's dtype and its
    /// shape against `weight_block_size` of the directory's `config.json`.
    pub(super) fn pair_fp8_scales(&mut self) -> Result<()> {
        let mut fp8_names: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.dtype == StDtype::F8_E4M3)
            .map(|(n, _)| n.clone())
            .collect();
        if fp8_names.is_empty() {
            return Ok(());
        }
        fp8_names.sort();
        let first = &fp8_names[0];
        let first_path = self.shards[self.entries[first].shard].path.clone();
        let Some(fp8) = BlockFp8::from_dir(&self.dir)? else {
            return Err(ModelError::BadScale {
                path: first_path,
                tensor: first.clone(),
                message: format!(
                    "stored as F8_E4M3 but {} has no quantization_config with quant_method \"fp8\" (its weight_block_size is needed to apply the scales)",
                    self.dir.join("config.json").display()
                ),
            });
        };
        for name in &fp8_names {
            let entry = &self.entries[name];
            let path = self.shards[entry.shard].path.clone();
            let bad = |message: String| ModelError::BadScale {
                path: path.clone(),
                tensor: name.clone(),
                message,
            };
            let Some(expected) = fp8.scale_shape(&entry.shape) else {
                return Err(bad(format!(
                    "an F8_E4M3 tensor of shape {:?}: block FP8 needs a matrix (rank 2) or a stack of them",
                    entry.shape
                )));
            };
            let scale_name = BlockFp8::scale_name(name);
            let Some(scale) = self.entries.get(&scale_name) else {
                return Err(bad(format!(
                    "an F8_E4M3 weight without its scale tensor `{scale_name}`"
                )));
            };
            if !matches!(scale.dtype, StDtype::F32 | StDtype::BF16 | StDtype::F16) {
                return Err(bad(format!(
                    "its scale `{scale_name}` is {:?}; expected F32, BF16 or F16",
                    scale.dtype
                )));
            }
            if scale.shape != expected {
                return Err(bad(format!(
                    "its scale `{scale_name}` has shape {:?}; weight_block_size {:?} on a weight of shape {:?} needs {:?}",
                    scale.shape, fp8.block, entry.shape, expected
                )));
            }
            self.entries.get_mut(name).expect("listed").scale = Some(scale_name);
        }
        self.fp8 = Some(fp8);
        Ok(())
    }

    /// The block-FP8 `quantization_config` when the checkpoint holds FP8 tensors.
    pub fn fp8(&self) -> Option<&BlockFp8> {
        self.fp8.as_ref()
    }

    pub(super) fn is_paired_scale(&self, name: &str) -> bool {
        name.strip_suffix("_scale_inv")
            .and_then(|weight| self.entries.get(weight))
            .is_some_and(|w| w.scale.is_some())
    }

    /// Whether any tensor is stored as block FP8.
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    /// The stored form of block-FP8 tensor `name` (paired at open): its codes and f32 scales.
    pub(super) fn fp8_stored(&self, entry: &Entry) -> Result<StoredFp8> {
        let scale_name = entry
            .scale
            .as_deref()
            .expect("FP8 entries are paired at open");
        let scales = self.fp8_scales(scale_name)?;
        let codes = Storage::new(&self.shards[entry.shard].map, entry.start, entry.end, 1);
        let fp8 = self.fp8.as_ref().expect("set with the pairs");
        let n = entry.shape.len();
        Ok(StoredFp8::new(codes, scales, fp8.block, entry.shape[n - 2]))
    }

    /// The f32 values of block-FP8 tensor `name` (paired at open), dequantized exactly.
    pub(super) fn fp8_values(&self, name: &str, entry: &Entry) -> Result<Vec<f32>> {
        let scale_name = entry
            .scale
            .as_deref()
            .expect("FP8 entries are paired at open");
        let scales = self.fp8_scales(scale_name)?;
        let codes = &self.shards[entry.shard].map[entry.start..entry.end];
        let fp8 = self.fp8.as_ref().expect("set with the pairs");
        tracing::trace!(tensor = name, "dequantizing block FP8");
        Ok(crate::fp8::dequantize(
            codes,
            &scales,
            &entry.shape,
            fp8.block,
        ))
    }

    /// The f32 values of scale tensor `scale_name`, each checked: a NaN, infinite or negative
    /// block scale (which no quantizer writes) would make every weight of its block wrong.
    fn fp8_scales(&self, scale_name: &str) -> Result<Vec<f32>> {
        let scale = &self.entries[scale_name];
        let scale_dtype = self.float_dtype(scale_name, scale)?;
        let shard = &self.shards[scale.shard];
        let scales = decode_f32(scale_dtype, &shard.map[scale.start..scale.end]);
        if let Some((i, v)) = scales
            .iter()
            .enumerate()
            .find(|(_, v)| !v.is_finite() || v.is_sign_negative() && **v != 0.0)
        {
            return Err(ModelError::BadScale {
                path: shard.path.clone(),
                tensor: scale_name.to_owned(),
                message: format!(
                    "element {i} is {v}: a block scale must be finite and not negative"
                ),
            });
        }
        Ok(scales)
    }
}
