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
/// values (no scales), or q8/q4 blocks. None for an unknown format, a block format whose rows
/// are not whole groups, or sizes that overflow.
pub fn part_bytes(format: &str, rows: usize, cols: usize) -> Option<(u64, u64)> {
    let element: u64 = match format {
        "bf16" | "f16" => 2,
        "f32" => 4,
        // Exactly the names the loader's `PackedFormat::parse` takes (no case folding).
        "q8" | "q4" => {
            let q: WeightFormat = format.parse().ok()?;
            // Every format stores at most 2 bytes per weight: a product that fits is safe.
            (rows as u64).checked_mul(cols as u64)?.checked_mul(2)?;
            return q.fits(cols).then(|| {
                (
                    q.code_bytes(rows, cols) as u64,
                    q.scale_bytes(rows, cols) as u64,
                )
            });
        }
        _ => return None,
    };
    let codes = (rows as u64)
        .checked_mul(cols as u64)?
        .checked_mul(element)?;
    Some((codes, 0))
}

/// Whether `path`, the value of manifest field `field`, names a file inside the install: a
/// relative `/`-separated path of plain names (no `..`, `.`, empty component, backslash or
/// NUL), at most one directory deep (`experts/layer-003.bin`).
pub fn check_relative(field: &str, path: &str) -> std::result::Result<(), String> {
    let components: Vec<&str> = path.split('/').collect();
    let plain = |c: &&str| !c.is_empty() && *c != "." && *c != ".." && !c.contains(['\\', '\0']);
    if components.len() > 2 || !components.iter().all(plain) {
        return Err(format!(
            "{field} {path:?} must be a file name inside the install (relative, no `..`, at most one directory)"
        ));
    }
    Ok(())
}

impl Manifest {
    pub fn read(path: &Path) -> Result<Manifest> {
        let bad = |message: String| InstallError::Manifest {
            path: path.to_owned(),
            message,
        };
        let text = crate::fs::read_bounded_to_string(path, crate::fs::MANIFEST_LIMIT)
            .map_err(InstallError::io(path))?;
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
        manifest.check_paths().map_err(bad)?;
        manifest.check_expert_layouts().map_err(bad)?;
        Ok(manifest)
    }

    /// Every path is a file name inside the install, listed once in `files[]` (so its size is
    /// always checked and its SHA-256 by `--verify`).
    fn check_paths(&self) -> std::result::Result<(), String> {
        let mut listed = std::collections::HashSet::new();
        for (i, f) in self.files.iter().enumerate() {
            check_relative(&format!("files[{i}].path"), &f.path)?;
            if !listed.insert(f.path.as_str()) {
                return Err(format!("files[{i}].path {:?} is listed twice", f.path));
            }
        }
        let mut referenced = vec![("resident.file".to_owned(), &self.resident.file)];
        for (i, layer) in self.experts.iter().enumerate() {
            referenced.push((format!("experts[{i}].file"), &layer.file));
        }
        for (field, path) in referenced {
            check_relative(&field, path)?;
            if !listed.contains(path.as_str()) {
                return Err(format!(
                    "{field} {path:?} is not listed in files[] with its size and SHA-256"
                ));
            }
        }
        Ok(())
    }

    /// Each expert layout is self-consistent: stride a multiple of the page, three parts whose
    /// byte counts match their shapes and formats, 64-byte aligned, inside the stride (all in
    /// checked arithmetic). Agreement with the config and the file sizes is
    /// [`Self::check_against`]'s.
    fn check_expert_layouts(&self) -> std::result::Result<(), String> {
        let mut layers = std::collections::HashSet::new();
        for (i, layer) in self.experts.iter().enumerate() {
            // Every part's codes and scales, to refuse two that share bytes.
            let mut ranges: Vec<(u64, u64, String)> = Vec::new();
            if !layers.insert(layer.layer) {
                return Err(format!(
                    "experts[{i}].layer {} is listed twice",
                    layer.layer
                ));
            }
            if layer.stride % super::PAGE != 0 {
                return Err(format!(
                    "experts[{i}].stride {} is not a multiple of {}",
                    layer.stride,
                    super::PAGE
                ));
            }
            let names: Vec<&str> = layer.parts.iter().map(|p| p.name.as_str()).collect();
            if names != ["gate", "up", "down"] {
                return Err(format!(
                    "experts[{i}].parts are {names:?}, expected [\"gate\", \"up\", \"down\"]"
                ));
            }
            for (j, part) in layer.parts.iter().enumerate() {
                let at = format!("experts[{i}].parts[{j}]");
                let sizes = part_bytes(&part.format, part.rows, part.cols).ok_or_else(|| {
                    format!(
                        "{at}: format {:?} cannot hold [{}, {}] (unknown format, rows not whole 32-weight groups, or too large)",
                        part.format, part.rows, part.cols
                    )
                })?;
                if sizes != (part.codes_bytes, part.scales_bytes) {
                    return Err(format!(
                        "{at}: codes_bytes {} and scales_bytes {} but [{}, {}] {} takes {} and {}",
                        part.codes_bytes,
                        part.scales_bytes,
                        part.rows,
                        part.cols,
                        part.format,
                        sizes.0,
                        sizes.1
                    ));
                }
                for (field, offset, bytes) in [
                    ("codes", part.codes_offset, part.codes_bytes),
                    ("scales", part.scales_offset, part.scales_bytes),
                ] {
                    if offset % 64 != 0 {
                        return Err(format!(
                            "{at}.{field}_offset {offset} is not a multiple of 64"
                        ));
                    }
                    let end = offset.checked_add(bytes).filter(|&e| e <= layer.stride);
                    let Some(end) = end else {
                        return Err(format!(
                            "{at}: {field}_offset {offset} + {field}_bytes {bytes} runs past experts[{i}].stride {}",
                            layer.stride
                        ));
                    };
                    ranges.push((offset, end, format!("{at}.{field}")));
                }
            }
            ranges.sort();
            for pair in ranges.windows(2) {
                let ((a_start, a_end, a), (b_start, b_end, b)) = (&pair[0], &pair[1]);
                if b_start < a_end {
                    return Err(format!(
                        "{a} [{a_start}, {a_end}) and {b} [{b_start}, {b_end}) overlap: each part needs its own bytes"
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("manifests serialize");
        write_synced(path, (text + "\n").as_bytes())
    }

    pub fn quant_format(&self) -> WeightFormat {
        self.quant.parse().unwrap_or_default()
    }

    /// The format of the vision tower's quantized matrices (`--vision-quant`): class `vision`
    /// lists its formats (`bf16`, or `bf16+q8` where the patch embedding stays bf16); bf16
    /// when the install has no tower.
    pub fn vision_format(&self) -> WeightFormat {
        self.classes
            .get("vision")
            .into_iter()
            .flat_map(|formats| formats.split('+'))
            .filter_map(|f| f.parse::<WeightFormat>().ok())
            .find(|&f| f != WeightFormat::Bf16)
            .unwrap_or(WeightFormat::Bf16)
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
