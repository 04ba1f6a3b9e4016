//! An install's manifest against its model config: every number the loader will trust (expert
//! counts, part shapes, record strides, file sizes) agrees with the weight schema before use.

use super::manifest::Manifest;
use crate::layout::MoeSchema;
use crate::{FfnKind, ModelConfig};

impl Manifest {
    /// Refuses an expert layout that disagrees with `config`: a MoE layer without one (or one
    /// for a dense layer), an expert count other than `num_experts`, a part whose `[rows, cols]`
    /// is not the schema's, or a file whose size (in `files[]`, checked against the disk) is
    /// not `experts · stride`. Each message names the manifest field and both values.
    pub fn check_against(&self, config: &ModelConfig) -> Result<(), String> {
        for (i, layer) in self.experts.iter().enumerate() {
            let is_moe = config
                .layers
                .get(layer.layer)
                .is_some_and(|l| l.ffn == FfnKind::Moe);
            if !is_moe {
                return Err(format!(
                    "experts[{i}].layer {} is not a MoE layer of config.json ({} layers)",
                    layer.layer,
                    config.num_layers()
                ));
            }
        }
        let Some(moe) = &config.moe else {
            return Ok(());
        };
        let schema = MoeSchema::new(config, moe).expert(0);
        let shapes = [&schema.gate.shape, &schema.up.shape, &schema.down.shape];
        for (index, spec) in config.layers.iter().enumerate() {
            if spec.ffn != FfnKind::Moe {
                continue;
            }
            let Some(i) = self.experts.iter().position(|l| l.layer == index) else {
                return Err(format!(
                    "layer {index} is a MoE layer in config.json but experts[] has no entry for it"
                ));
            };
            let layer = &self.experts[i];
            if layer.experts != moe.num_experts {
                return Err(format!(
                    "experts[{i}].experts is {} but config.json's num_experts is {}",
                    layer.experts, moe.num_experts
                ));
            }
            for (j, (part, shape)) in layer.parts.iter().zip(shapes).enumerate() {
                if [part.rows, part.cols] != shape[..] {
                    return Err(format!(
                        "experts[{i}].parts[{j}] ({}) is [{}, {}] (rows, cols) but the weight schema's is {shape:?}",
                        part.name, part.rows, part.cols
                    ));
                }
            }
            let needed = (layer.experts as u64).checked_mul(layer.stride);
            let size = self
                .files
                .iter()
                .find(|f| f.path == layer.file)
                .map(|f| f.size);
            if needed.is_none() || needed != size {
                return Err(format!(
                    "experts[{i}]: experts {} × stride {} is {} bytes but files[] gives {} {} bytes",
                    layer.experts,
                    layer.stride,
                    needed.map_or("more than 2^64".to_owned(), |n| n.to_string()),
                    layer.file,
                    size.unwrap_or(0)
                ));
            }
        }
        Ok(())
    }
}
