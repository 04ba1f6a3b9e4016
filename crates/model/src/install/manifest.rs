//! `manifest.json`: what an install holds and how to check it.
//!
//! ```json
//! {
//!   "format": "spindle-install", "format_version": 1,
//!   "quant": "q4",
//!   "classes": { "attention": "q4", "embedding": "bf16", "routed_experts": "q4", ... },
//!   "config": { ...the model's config.json (also copied verbatim as config.json)... },
//!   "resident": { "file": "model.safetensors", "codes_suffix": ".qs", "scales_suffix": ".scales" },
//!   "experts": [ { "layer": 0, "file": "experts/layer-000.bin", "experts": 256, "stride": 1806336,
//!                  "parts": [ { "name": "gate", "format": "q4", "rows": 512, "cols": 2048,
//!                               "codes_offset": 0, "codes_bytes": 524288,
//!                               "scales_offset": 524288, "scales_bytes": 65536 }, ... ] } ],
//!   "files": [ { "path": "model.safetensors", "size": 123, "sha256": "…" }, ... ]
//! }
//! ```
//!
//! Expert `e` of a layer occupies bytes `[e·stride, (e+1)·stride)` of the layer's file; within
//! that record each part (gate, up, down) has its codes and (for q8/q4) its f16 scales at the
//! listed offsets, each 64-byte aligned; the stride is a multiple of 4096, so one aligned read
//! (O_DIRECT-capable) fetches one expert. Padding bytes are zero.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{InstallError, Result};
use crate::quant::WeightFormat;

pub const FORMAT: &str = "spindle-install";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    /// The `--quant` of the convert.
    pub quant: String,
    /// Weight format per tensor class (`TensorClass::name`). Matrices of a quantized class
    /// whose rows are not a whole number of 32-weight groups stay bf16.
    pub classes: BTreeMap<String, String>,
    /// The model's config.json.
    pub config: Value,
    pub resident: ResidentSection,
    /// One entry per MoE layer, in layer order.
    pub experts: Vec<ExpertLayerLayout>,
    /// Every file of the install except manifest.json itself and the verification receipt.
    pub files: Vec<FileEntry>,
}

/// The file of everything but the routed experts: a safetensors file with the checkpoint's
/// tensor names. A quantized matrix `NAME` is stored as `NAME.qs` (i8 `[rows, cols]` for q8,
/// u8 `[rows, cols/2]` for q4) and `NAME.scales` (f16 `[rows, cols/32]`); `lm_head.weight` is
/// stored quantized even when tied to the embedding.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResidentSection {
    pub file: String,
    pub codes_suffix: String,
    pub scales_suffix: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ExpertLayerLayout {
    pub layer: usize,
    pub file: String,
    pub experts: usize,
    /// Bytes per expert record, a multiple of 4096.
    pub stride: u64,
    /// gate `[I, H]`, up `[I, H]`, down `[H, I]`, in that order.
    pub parts: Vec<PartLayout>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PartLayout {
    pub name: String,
    pub format: String,
    pub rows: usize,
    pub cols: usize,
    pub codes_offset: u64,
    pub codes_bytes: u64,
    pub scales_offset: u64,
    pub scales_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    /// Relative to the install directory, `/`-separated.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// `(codes, scales)` bytes of a `[rows, cols]` part stored as `format`: bf16, f16 or f32
/// values (no scales), or q8/q4 blocks. None for an unknown format or a block format whose rows
/// are not whole groups.
pub fn part_bytes(format: &str, rows: usize, cols: usize) -> Option<(u64, u64)> {
    let element = match format {
        "bf16" | "f16" => 2,
        "f32" => 4,
        _ => {
            let q: WeightFormat = format.parse().ok()?;
            return q.fits(cols).then(|| {
                (
                    q.code_bytes(rows, cols) as u64,
                    q.scale_bytes(rows, cols) as u64,
                )
            });
        }
    };
    Some(((rows * cols * element) as u64, 0))
}

impl Manifest {
    pub fn read(path: &Path) -> Result<Manifest> {
        let bad = |message: String| InstallError::Manifest {
            path: path.to_owned(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(InstallError::io(path))?;
        let manifest: Manifest =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a valid manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {FORMAT:?}",
                manifest.format
            )));
        }
        if manifest.format_version != FORMAT_VERSION {
            return Err(bad(format!(
                "format_version {} but this spindle reads version {FORMAT_VERSION}; convert again",
                manifest.format_version
            )));
        }
        if manifest.quant.parse::<WeightFormat>().is_err() {
            return Err(bad(format!(
                "quant {:?} is not bf16, q8 or q4",
                manifest.quant
            )));
        }
        for layer in &manifest.experts {
            if layer.stride % super::PAGE != 0 || layer.parts.len() != 3 {
                return Err(bad(format!(
                    "experts of layer {}: stride {} must be a multiple of {} and there must be 3 parts (gate, up, down)",
                    layer.layer,
                    layer.stride,
                    super::PAGE
                )));
            }
            for part in &layer.parts {
                let sizes = part_bytes(&part.format, part.rows, part.cols);
                let end = (part.scales_offset + part.scales_bytes)
                    .max(part.codes_offset + part.codes_bytes);
                if sizes != Some((part.codes_bytes, part.scales_bytes))
                    || end > layer.stride
                    || part.codes_offset % 64 != 0
                    || part.scales_offset % 64 != 0
                {
                    return Err(bad(format!(
                        "layer {} part {}: offsets/sizes disagree with [{}, {}] {} and stride {}",
                        layer.layer, part.name, part.rows, part.cols, part.format, layer.stride
                    )));
                }
            }
        }
        for f in &manifest.files {
            if f.path.starts_with('/') || f.path.split('/').any(|c| c == ".." || c.is_empty()) {
                return Err(bad(format!(
                    "file path {:?} must be relative and inside the install",
                    f.path
                )));
            }
        }
        Ok(manifest)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("manifests serialize");
        write_synced(path, (text + "\n").as_bytes())
    }

    pub fn quant_format(&self) -> WeightFormat {
        self.quant.parse().unwrap_or_default()
    }

    pub fn expert_layer(&self, layer: usize) -> Option<&ExpertLayerLayout> {
        self.experts.iter().find(|l| l.layer == layer)
    }
}

/// Writes `bytes` to `path` and syncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(InstallError::io(path))?;
    file.write_all(bytes).map_err(InstallError::io(path))?;
    file.sync_all().map_err(InstallError::io(path))
}
