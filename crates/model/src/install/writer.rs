//! `spindle convert`: a Hugging Face checkpoint to an install, tensor by tensor.
//!
//! Memory stays bounded whatever the checkpoint's size: tensors are read from the memory map,
//! converted a block of rows at a time (at most [`BLOCK_BYTES`] of f32), written and hashed as
//! they go, so a checkpoint far larger than RAM converts. Everything is written under
//! `DST.partial` and renamed to `DST` only when complete and synced; an error or cancellation
//! removes the partial directory, so a half install never exists under `DST`. A convert holds
//! an exclusive lock on `DST.lock` (beside `DST`) throughout, so a second convert into the same
//! destination is refused rather than mixed with the first ([`super::lock`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::error::{InstallError, Result};
use super::lock::DestinationLock;
use super::manifest::{
    part_bytes, ExpertLayerLayout, FileEntry, Manifest, PartLayout, ResidentSection, FORMAT,
    FORMAT_VERSION,
};
use super::quantize::quantize_rows;
use super::sha256::Sha256;
use super::{
    classify, quantizable, AUX_FILES, CODES_SUFFIX, EXPERT_DIR, MANIFEST, RESIDENT_FILE,
    SCALES_SUFFIX,
};
use crate::layout::{MoeSchema, TensorClass, TensorDef, TrunkSchema};
use crate::quant::WeightFormat;
use crate::tensor::{decode_f32, DType, Matrix};
use crate::{Checkpoint, ExpertLayout, FfnKind, ModelConfig, TensorNames};

/// f32 bytes converted at a time (a block of rows of one tensor).
const BLOCK_BYTES: usize = 64 << 20;

/// Where a convert stands, passed to the progress callback after every tensor or expert.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    /// Checkpoint bytes read so far and in all.
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// A file written under the partial directory, hashed as it is written.
struct HashedFile {
    path: PathBuf,
    relative: String,
    out: BufWriter<File>,
    hasher: Sha256,
    size: u64,
}

impl HashedFile {
    fn create(root: &Path, relative: &str) -> Result<Self> {
        let path = root.join(relative);
        let file = File::create(&path).map_err(InstallError::io(&path))?;
        Ok(HashedFile {
            out: BufWriter::with_capacity(8 << 20, file),
            path,
            relative: relative.to_owned(),
            hasher: Sha256::new(),
            size: 0,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(InstallError::io(&self.path))?;
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        Ok(())
    }

    fn finish(self) -> Result<FileEntry> {
        let file = self.out.into_inner().map_err(|e| InstallError::Io {
            path: self.path.clone(),
            error: e.into_error(),
        })?;
        file.sync_all().map_err(InstallError::io(&self.path))?;
        Ok(FileEntry {
            path: self.relative,
            size: self.size,
            sha256: self.hasher.finish_hex(),
        })
    }
}

fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(InstallError::io(path))
}

/// How one resident tensor is written.
enum Resident {
    /// The checkpoint's bytes, as stored.
    Copy {
        name: String,
        dtype: &'static str,
        shape: Vec<usize>,
        source: Source,
    },
    /// `NAME.qs` + `NAME.scales`, quantized from `matrix`.
    Quantized {
        name: String,
        matrix: Matrix,
        format: WeightFormat,
    },
}

enum Source {
    Float(Matrix),
    I64(Vec<u8>),
}

impl Resident {
    fn source_bytes(&self) -> u64 {
        match self {
            Resident::Copy {
                source: Source::Float(m),
                ..
            }
            | Resident::Quantized { matrix: m, .. } => m.size_bytes() as u64,
            Resident::Copy {
                source: Source::I64(b),
                ..
            } => b.len() as u64,
        }
    }

    /// `(name, dtype, shape, bytes)` of the safetensors entries this tensor becomes.
    fn entries(&self) -> Vec<(String, &'static str, Vec<usize>, usize)> {
        match self {
            Resident::Copy {
                name,
                dtype,
                shape,
                source,
            } => {
                let bytes = match source {
                    Source::Float(m) => m.size_bytes(),
                    Source::I64(b) => b.len(),
                };
                vec![(name.clone(), *dtype, shape.clone(), bytes)]
            }
            Resident::Quantized {
                name,
                matrix: m,
                format,
            } => {
                let (codes_dtype, code_cols) = match format {
                    WeightFormat::Q8 => ("I8", m.cols),
                    _ => ("U8", m.cols / 2),
                };
                let groups = m.cols / crate::quant::GROUP;
                vec![
                    (
                        format!("{name}{CODES_SUFFIX}"),
                        codes_dtype,
                        vec![m.rows, code_cols],
                        m.rows * code_cols,
                    ),
                    (
                        format!("{name}{SCALES_SUFFIX}"),
                        "F16",
                        vec![m.rows, groups],
                        m.rows * groups * 2,
                    ),
                ]
            }
        }
    }
}

fn st_dtype(d: DType) -> &'static str {
    match d {
        DType::Bf16 => "BF16",
        DType::F16 => "F16",
        DType::F32 => "F32",
    }
}

/// Calls `f` with row blocks of `m` as f32 (at most [`BLOCK_BYTES`] each).
fn for_row_blocks(m: &Matrix, f: &mut dyn FnMut(&[f32]) -> Result<()>) -> Result<()> {
    let row_bytes = m.cols * m.dtype.size();
    let rows_per_block = (BLOCK_BYTES / (m.cols * 4)).max(1);
    let bytes = m.bytes();
    let mut r = 0;
    while r < m.rows {
        let n = rows_per_block.min(m.rows - r);
        let values = decode_f32(m.dtype, &bytes[r * row_bytes..(r + n) * row_bytes]);
        f(&values)?;
        r += n;
    }
    Ok(())
}

/// Writes a quantized matrix's codes, returning its scales (1/16 of the codes for q8).
fn write_quantized(out: &mut HashedFile, m: &Matrix, format: WeightFormat) -> Result<Vec<u8>> {
    let mut scales = Vec::new();
    for_row_blocks(m, &mut |values| {
        let mut codes = Vec::new();
        quantize_rows(format, values, m.cols, &mut codes, &mut scales);
        out.write(&codes)
    })?;
    Ok(scales)
}

fn resident_tensors(
    ck: &Checkpoint,
    config: &ModelConfig,
    names: &TensorNames,
    quant: WeightFormat,
    vision_quant: WeightFormat,
) -> Result<Vec<Resident>> {
    let expert_prefixes: Vec<String> = moe_layers(config)
        .map(|i| names.layer(i, "mlp.experts."))
        .collect();
    let mut all: Vec<&str> = ck
        .names()
        .filter(|n| {
            !n.starts_with("mtp.") && !expert_prefixes.iter().any(|p| n.starts_with(p.as_str()))
        })
        .collect();
    all.sort();
    let mut out = Vec::new();
    for name in all {
        let shape = ck.shape(name).expect("listed names exist").to_vec();
        let source = match ck.matrix(name, &shape) {
            Ok(m) => Source::Float(m),
            Err(_) => Source::I64(
                ck.i64_values(name, &shape)?
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
        };
        // The vision tower's matrices follow `vision_quant` (bf16: kept as stored).
        let vision = name.starts_with(crate::layout::VISION_PREFIX);
        out.push(match source {
            Source::Float(m)
                if vision
                    && vision_quant != WeightFormat::Bf16
                    && shape.len() == 2
                    && vision_quant.fits(m.cols) =>
            {
                Resident::Quantized {
                    name: name.to_owned(),
                    matrix: m,
                    format: vision_quant,
                }
            }
            Source::Float(m)
                if quant != WeightFormat::Bf16
                    && !vision
                    && shape.len() == 2
                    && quantizable(name)
                    && quant.fits(m.cols) =>
            {
                Resident::Quantized {
                    name: name.to_owned(),
                    matrix: m,
                    format: quant,
                }
            }
            Source::Float(m) => Resident::Copy {
                name: name.to_owned(),
                dtype: st_dtype(m.dtype),
                shape,
                source: Source::Float(m),
            },
            i64 => Resident::Copy {
                name: name.to_owned(),
                dtype: "I64",
                shape,
                source: i64,
            },
        });
    }
    // A tied LM head is quantized on load from the embedding; an install stores it so.
    if config.tie_word_embeddings && quant != WeightFormat::Bf16 && quant.fits(config.hidden_size) {
        let trunk = TrunkSchema::new(config);
        let embed = ck.matrix(&names.trunk(&trunk.embed.key), &trunk.embed.shape)?;
        out.push(Resident::Quantized {
            name: trunk.lm_head.key,
            matrix: embed,
            format: quant,
        });
    }
    Ok(out)
}

fn moe_layers(config: &ModelConfig) -> impl Iterator<Item = usize> + '_ {
    config
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.ffn == FfnKind::Moe)
        .map(|(i, _)| i)
}

fn write_resident(
    root: &Path,
    tensors: &[Resident],
    tick: &mut dyn FnMut(u64) -> Result<()>,
) -> Result<FileEntry> {
    let mut meta = Map::new();
    meta.insert("__metadata__".into(), json!({"format": "spindle-install"}));
    let mut offset = 0usize;
    for t in tensors {
        for (name, dtype, shape, bytes) in t.entries() {
            meta.insert(
                name,
                json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
    }
    let mut header = Value::Object(meta).to_string().into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut out = HashedFile::create(root, RESIDENT_FILE)?;
    out.write(&(header.len() as u64).to_le_bytes())?;
    out.write(&header)?;
    for t in tensors {
        match t {
            Resident::Copy {
                source: Source::Float(m),
                ..
            } => {
                for chunk in m.bytes().chunks(BLOCK_BYTES) {
                    out.write(chunk)?;
                }
            }
            Resident::Copy {
                source: Source::I64(b),
                ..
            } => out.write(b)?,
            Resident::Quantized { matrix, format, .. } => {
                let scales = write_quantized(&mut out, matrix, *format)?;
                out.write(&scales)?;
            }
        }
        // The checkpoint pages just read are not needed again: keep them out of the RSS.
        match t {
            Resident::Copy {
                source: Source::Float(m),
                ..
            }
            | Resident::Quantized { matrix: m, .. } => m.release_pages(),
            Resident::Copy { .. } => {}
        }
        tick(t.source_bytes())?;
    }
    out.finish()
}

/// The gate, up and down matrices of every expert of MoE layer `i`.
fn layer_experts(
    ck: &Checkpoint,
    names: &TensorNames,
    config: &ModelConfig,
    i: usize,
) -> Result<Vec<[Matrix; 3]>> {
    let moe = config
        .moe
        .as_ref()
        .expect("validated: MoE layers have a MoE config");
    let e_count = moe.num_experts;
    let s = MoeSchema::new(config, moe);
    let matrix = |d: &TensorDef| ck.matrix(&names.layer(i, &d.key), &d.shape);
    Ok(match names.expert_layout(ck, i)? {
        ExpertLayout::PerExpert => (0..e_count)
            .map(|e| {
                let x = s.expert(e);
                Ok([matrix(&x.gate)?, matrix(&x.up)?, matrix(&x.down)?])
            })
            .collect::<crate::Result<Vec<_>>>()?,
        ExpertLayout::Fused => {
            let gate_up = matrix(&s.gate_up)?;
            let down = matrix(&s.down)?;
            (0..e_count)
                .map(|e| s.fused_expert(&gate_up, &down, e))
                .collect()
        }
    })
}

/// One expert's record: each part at its offsets, zero padding to the stride.
fn expert_record(parts: &[Matrix; 3], layout: &ExpertLayerLayout) -> Result<Vec<u8>> {
    let mut record = vec![0u8; layout.stride as usize];
    for (m, part) in parts.iter().zip(&layout.parts) {
        let at = part.codes_offset as usize;
        match part.format.parse::<WeightFormat>() {
            Ok(format @ (WeightFormat::Q8 | WeightFormat::Q4)) => {
                let (mut codes, mut scales) = (Vec::new(), Vec::new());
                for_row_blocks(m, &mut |values| {
                    quantize_rows(format, values, m.cols, &mut codes, &mut scales);
                    Ok(())
                })?;
                record[at..at + codes.len()].copy_from_slice(&codes);
                let s = part.scales_offset as usize;
                record[s..s + scales.len()].copy_from_slice(&scales);
            }
            _ => record[at..at + m.size_bytes()].copy_from_slice(m.bytes()),
        }
    }
    Ok(record)
}

fn expert_layout_of(i: usize, experts: &[[Matrix; 3]], quant: WeightFormat) -> ExpertLayerLayout {
    let align = |x: u64| x.div_ceil(64) * 64;
    let mut offset = 0u64;
    let parts = ["gate", "up", "down"]
        .iter()
        .zip(&experts[0])
        .map(|(&name, m)| {
            // Matrices whose rows are not whole groups, and every matrix at bf16, keep the
            // checkpoint's element type.
            let format = if quant != WeightFormat::Bf16 && quant.fits(m.cols) {
                quant.name()
            } else {
                m.dtype.name()
            };
            let (codes_bytes, scales_bytes) =
                part_bytes(format, m.rows, m.cols).expect("formats chosen to fit");
            let codes_offset = offset;
            let scales_offset = align(codes_offset + codes_bytes);
            offset = align(scales_offset + scales_bytes);
            PartLayout {
                name: name.into(),
                format: format.into(),
                rows: m.rows,
                cols: m.cols,
                codes_offset,
                codes_bytes,
                scales_offset,
                scales_bytes,
            }
        })
        .collect();
    let stride = offset.div_ceil(super::PAGE) * super::PAGE;
    ExpertLayerLayout {
        layer: i,
        file: format!("{EXPERT_DIR}/layer-{i:03}.bin"),
        experts: experts.len(),
        stride,
        parts,
    }
}

/// Converts the checkpoint at `src` into an install at `dst` (which must not exist), storing
/// the large projections in `quant`. `progress` is called after every tensor and expert; when
/// it returns false the convert stops, removes what it wrote and returns `Cancelled`.
pub fn convert(
    src: &Path,
    dst: &Path,
    quant: WeightFormat,
    progress: &mut dyn FnMut(&Progress) -> bool,
) -> Result<Manifest> {
    convert_with(src, dst, quant, WeightFormat::Bf16, progress)
}

/// [`convert`] with the vision tower's matrices stored in `vision_quant` (bf16 or q8; the
/// patch embedding and matrices whose rows are not whole groups stay as stored).
pub fn convert_with(
    src: &Path,
    dst: &Path,
    quant: WeightFormat,
    vision_quant: WeightFormat,
    progress: &mut dyn FnMut(&Progress) -> bool,
) -> Result<Manifest> {
    if vision_quant == WeightFormat::Q4 {
        return Err(InstallError::Manifest {
            path: dst.to_owned(),
            message: "--vision-quant q4 is not supported (bf16 or q8)".into(),
        });
    }
    let file_name = dst.file_name().ok_or_else(|| InstallError::Manifest {
        path: dst.to_owned(),
        message: "the destination needs a directory name".into(),
    })?;
    if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(InstallError::io(parent))?;
    }
    // Checked under the lock, so a convert that finished just before us is seen.
    let _lock = DestinationLock::acquire(dst, &file_name.to_string_lossy())?;
    if dst.symlink_metadata().is_ok() {
        return Err(InstallError::Exists {
            path: dst.to_owned(),
        });
    }
    crate::fs::check_output(dst, &[src], true).map_err(InstallError::io(dst))?;
    let tmp = dst.with_file_name(format!("{}.partial", file_name.to_string_lossy()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(InstallError::io(&tmp))?;
    }
    std::fs::create_dir_all(tmp.join(EXPERT_DIR)).map_err(InstallError::io(&tmp))?;
    let result = write_install(src, &tmp, quant, vision_quant, progress).and_then(|manifest| {
        sync_dir(&tmp.join(EXPERT_DIR))?;
        sync_dir(&tmp)?;
        std::fs::rename(&tmp, dst).map_err(InstallError::io(dst))?;
        if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(manifest)
    });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map_err(|e| match e {
        InstallError::Cancelled { .. } => InstallError::Cancelled {
            path: dst.to_owned(),
        },
        other => other,
    })
}

fn write_install(
    src: &Path,
    root: &Path,
    quant: WeightFormat,
    vision_quant: WeightFormat,
    progress: &mut dyn FnMut(&Progress) -> bool,
) -> Result<Manifest> {
    let config = ModelConfig::from_dir(src)?;
    let ck = Checkpoint::open(src)?;
    let names = TensorNames::detect(&ck)?;
    // A GGUF source's config is the one its metadata maps to.
    let mut config_json: Value = if crate::gguf::is_gguf(src) {
        crate::gguf::qwen::config_json(&crate::gguf::open_files(src)?)?
    } else {
        let config_path = src.join("config.json");
        serde_json::from_str(
            &crate::fs::read_bounded_to_string(&config_path, crate::fs::CONFIG_LIMIT)
                .map_err(InstallError::io(&config_path))?,
        )
        .map_err(|e| {
            InstallError::Model(crate::ModelError::Json {
                path: config_path.clone(),
                error: e,
            })
        })?
    };

    // Block-FP8 weights are written dequantized (or requantized): the install's config
    // describes what it holds.
    if config_json.get("quantization_config").is_some() || config.fp8.is_some() {
        if let Some(top) = config_json.as_object_mut() {
            top.remove("quantization_config");
        }
        if let Some(text) = config_json
            .get_mut("text_config")
            .and_then(Value::as_object_mut)
        {
            text.remove("quantization_config");
        }
    }
    let resident = resident_tensors(&ck, &config, &names, quant, vision_quant)?;
    let layers: Vec<usize> = moe_layers(&config).collect();
    let mut state = Progress {
        tensors_total: resident.len()
            + layers.len() * config.moe.as_ref().map_or(0, |m| m.num_experts),
        bytes_total: resident.iter().map(Resident::source_bytes).sum(),
        ..Progress::default()
    };
    // Expert bytes (read per layer below) join the total up front.
    for &i in &layers {
        state.bytes_total += layer_experts(&ck, &names, &config, i)?
            .iter()
            .flatten()
            .map(|m| m.size_bytes() as u64)
            .sum::<u64>();
    }
    if !progress(&state) {
        return Err(InstallError::Cancelled {
            path: root.to_owned(),
        });
    }
    let mut tick = |bytes: u64| -> Result<()> {
        state.tensors_done += 1;
        state.bytes_done += bytes;
        if progress(&state) {
            Ok(())
        } else {
            Err(InstallError::Cancelled {
                path: root.to_owned(),
            })
        }
    };

    let mut files = vec![write_resident(root, &resident, &mut tick)?];
    let mut classes = std::collections::BTreeMap::new();
    for t in &resident {
        let (name, format) = match t {
            Resident::Copy { name, dtype, .. } => (name, dtype.to_ascii_lowercase()),
            Resident::Quantized { name, format, .. } => (name, format.name().to_owned()),
        };
        merge_class(&mut classes, classify(name), &format);
    }

    let mut expert_layouts = Vec::new();
    for &i in &layers {
        let experts = layer_experts(&ck, &names, &config, i)?;
        let layout = expert_layout_of(i, &experts, quant);
        let mut out = HashedFile::create(root, &layout.file)?;
        for parts in &experts {
            out.write(&expert_record(parts, &layout)?)?;
            parts.iter().for_each(Matrix::release_pages);
            tick(parts.iter().map(|m| m.size_bytes() as u64).sum())?;
        }
        files.push(out.finish()?);
        for p in &layout.parts {
            merge_class(&mut classes, TensorClass::RoutedExperts, &p.format);
        }
        expert_layouts.push(layout);
    }

    // A GGUF or block-FP8 source's config.json is the one the install describes (mapped from
    // the metadata, or without its quantization_config); other sources' is copied verbatim.
    let rewritten_config = crate::gguf::is_gguf(src) || config.fp8.is_some();
    if rewritten_config {
        let bytes = serde_json::to_vec_pretty(&config_json).expect("a JSON value");
        let mut out = HashedFile::create(root, "config.json")?;
        out.write(&bytes)?;
        files.push(out.finish()?);
    }
    for name in AUX_FILES {
        if rewritten_config && *name == "config.json" {
            continue;
        }
        let from = src.join(name);
        if from.is_file() {
            let bytes = crate::fs::read_bounded(&from, crate::fs::AUX_LIMIT)
                .map_err(InstallError::io(&from))?;
            let mut out = HashedFile::create(root, name)?;
            out.write(&bytes)?;
            files.push(out.finish()?);
        }
    }

    let manifest = Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        quant: quant.name().into(),
        classes,
        config: config_json,
        resident: ResidentSection {
            file: RESIDENT_FILE.into(),
            codes_suffix: CODES_SUFFIX.into(),
            scales_suffix: SCALES_SUFFIX.into(),
        },
        experts: expert_layouts,
        files,
    };
    manifest.write(&root.join(MANIFEST))?;
    Ok(manifest)
}

/// Records `format` for `class`; a class holding several formats lists them joined by `+`.
fn merge_class(
    classes: &mut std::collections::BTreeMap<String, String>,
    class: TensorClass,
    format: &str,
) {
    let entry = classes.entry(class.name().to_owned()).or_default();
    if !entry.split('+').any(|f| f == format) {
        if !entry.is_empty() {
            entry.push('+');
        }
        entry.push_str(format);
    }
}
