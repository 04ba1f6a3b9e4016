//! `--check-weights` over an install's expert packs (the resident tensors are a safetensors
//! file, scanned by [`crate::Checkpoint::check_finite`]).

use crate::error::{ModelError, Result};
use crate::finite::{first_non_finite, non_finite_error};
use crate::install::{Install, MappedFile};
use crate::tensor::DType;

/// Scans the routed experts of `install` (the files the manifest's expert layers name): the
/// f16 scales of q8/q4 parts, the values of bf16/f16/f32 parts. A region the file does not
/// hold is left to the loader, which refuses it by name.
pub fn check_install_experts(install: &Install) -> Result<()> {
    for layer in &install.manifest().experts {
        let path = install.path_of(&layer.file);
        let file = MappedFile::open(&path).map_err(ModelError::from)?;
        let bytes = file.bytes();
        for expert in 0..layer.experts {
            for part in &layer.parts {
                let (dtype, offset, len) = match part.format.as_str() {
                    "bf16" => (DType::Bf16, part.codes_offset, part.codes_bytes),
                    "f16" => (DType::F16, part.codes_offset, part.codes_bytes),
                    "f32" => (DType::F32, part.codes_offset, part.codes_bytes),
                    _ => (DType::F16, part.scales_offset, part.scales_bytes),
                };
                let start = (expert as u64)
                    .checked_mul(layer.stride)
                    .and_then(|base| base.checked_add(offset));
                let region =
                    start
                        .and_then(|s| Some((s, s.checked_add(len)?)))
                        .and_then(|(s, e)| {
                            bytes.get(usize::try_from(s).ok()?..usize::try_from(e).ok()?)
                        });
                let Some(region) = region else { continue };
                if let Some((index, nan)) = first_non_finite(dtype, region) {
                    let what = if part.format.starts_with('q') {
                        format!(
                            "layer {} expert {expert} {} (scales)",
                            layer.layer, part.name
                        )
                    } else {
                        format!("layer {} expert {expert} {}", layer.layer, part.name)
                    };
                    return Err(non_finite_error(&path, &what, index, nan));
                }
            }
        }
    }
    Ok(())
}
