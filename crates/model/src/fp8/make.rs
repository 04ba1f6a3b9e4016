//! Turns a checkpoint into a block-FP8 one (test data, benchmarks): each large projection is
//! stored as float8 e4m3fn with one f32 scale per block (scale = block amax / 448, codes
//! rounded to nearest even with saturation), and beside it an f32 checkpoint holding the
//! exactly dequantized weights. spindle on the two must agree bit for bit.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{json, Value};

use super::{e4m3_to_f32, f32_to_e4m3, BlockFp8, E4M3_MAX};
use crate::error::{ModelError, Result};
use crate::tensor::{decode_f32, DType};

/// Whether tensor `name` of `shape` is converted: the linear projections (`*_proj.weight`,
/// the fused expert tensors), not the small GDN gates `in_proj_a`/`in_proj_b`, nor the vision
/// tower or the MTP head (the released checkpoints' `modules_to_not_convert`).
fn converted(name: &str, shape: &[usize]) -> bool {
    let projection = (shape.len() == 2 && name.ends_with("_proj.weight"))
        || (shape.len() == 3
            && (name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj")));
    projection
        && !name.contains("in_proj_a.")
        && !name.contains("in_proj_b.")
        && !name.contains("in_proj_ba.")
        && !name.contains("visual.")
        && !name.starts_with("mtp.")
}

/// Quantizes `values` of `shape` to block FP8: (e4m3 codes, f32 scale grid). Block rows run
/// in parallel.
pub fn quantize(values: &[f32], shape: &[usize], block: [usize; 2]) -> (Vec<u8>, Vec<f32>) {
    use rayon::prelude::*;
    let fp8 = BlockFp8 {
        block,
        modules_to_not_convert: Vec::new(),
    };
    let grid = fp8.scale_shape(shape).expect("rank >= 2");
    let n = shape.len();
    let (rows, cols) = (shape[n - 2], shape[n - 1]);
    let (srows, scols) = (grid[n - 2], grid[n - 1]);
    let mut scales = vec![0.0f32; grid.iter().product()];
    let mut codes = vec![0u8; values.len()];
    if values.is_empty() {
        return (codes, scales);
    }
    // Each stacked matrix, then each block row of it (Bo rows; the last may be partial).
    values
        .par_chunks(rows * cols)
        .zip(codes.par_chunks_mut(rows * cols))
        .zip(scales.par_chunks_mut(srows * scols))
        .for_each(|((v, c), s)| {
            v.par_chunks(block[0] * cols)
                .zip(c.par_chunks_mut(block[0] * cols))
                .zip(s.par_chunks_mut(scols))
                .for_each(|((v, c), s)| quantize_block_row(v, c, s, cols, block[1]))
        });
    (codes, scales)
}

/// One block row: `values` (whole rows of `cols`) to `codes`, `scales` one per block of
/// `block_cols` columns (block amax / 448; 1 for an all-zero block).
fn quantize_block_row(
    values: &[f32],
    codes: &mut [u8],
    scales: &mut [f32],
    cols: usize,
    block_cols: usize,
) {
    scales.fill(0.0);
    for row in values.chunks(cols) {
        for (j, v) in row.iter().enumerate() {
            let s = &mut scales[j / block_cols];
            *s = s.max(v.abs());
        }
    }
    for s in scales.iter_mut() {
        *s = if *s > 0.0 { *s / E4M3_MAX } else { 1.0 };
    }
    for (row, out) in values.chunks(cols).zip(codes.chunks_mut(cols)) {
        for (j, (v, c)) in row.iter().zip(out.iter_mut()).enumerate() {
            *c = f32_to_e4m3(v / scales[j / block_cols]);
        }
    }
}

struct Out {
    name: String,
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn write_file(path: &Path, tensors: &[Out]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| ModelError::Safetensors {
                    path: path.to_owned(),
                    message: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| ModelError::Safetensors {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |error| ModelError::Io {
        path: path.to_owned(),
        error,
    }
}

fn float_dtype(d: StDtype) -> Option<DType> {
    match d {
        StDtype::BF16 => Some(DType::Bf16),
        StDtype::F16 => Some(DType::F16),
        StDtype::F32 => Some(DType::F32),
        _ => None,
    }
}

/// Writes the block-FP8 form of the checkpoint at `src` to `fp8_dir` and its exact
/// dequantization (f32) to `deq_dir` (both created). Shards and their index keep their names;
/// scales join their weight's shard. `reference.safetensors` is not copied.
pub fn write_fp8_pair(src: &Path, fp8_dir: &Path, deq_dir: &Path, block: [usize; 2]) -> Result<()> {
    write_fp8(src, fp8_dir, Some(deq_dir), block)
}

/// As [`write_fp8_pair`], the dequantized copy only when `deq_dir` is given (a benchmark
/// checkpoint needs none: it would take 4 bytes per weight).
pub fn write_fp8(
    src: &Path,
    fp8_dir: &Path,
    deq_dir: Option<&Path>,
    block: [usize; 2],
) -> Result<()> {
    let scratch;
    let (deq_dir, keep_deq) = match deq_dir {
        Some(d) => (d, true),
        None => {
            // Nothing is written there (checked below), but paths are built from it.
            scratch = fp8_dir.join(".no-deq");
            (scratch.as_path(), false)
        }
    };
    let dirs: &[&Path] = if keep_deq {
        &[fp8_dir, deq_dir]
    } else {
        &[fp8_dir]
    };
    for dir in dirs {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut shard_names: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.ends_with(".safetensors") && name != "reference.safetensors" {
            shard_names.push(name);
        } else if path.is_file()
            && name != "config.json"
            && name != "reference.safetensors"
            && !name.ends_with(".index.json")
        {
            for dir in dirs {
                std::fs::copy(&path, dir.join(&name)).map_err(io(&path))?;
            }
        }
    }
    shard_names.sort();
    let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
    let mut not_converted: Vec<String> = Vec::new();
    for shard in &shard_names {
        let path = src.join(shard);
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let parsed = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let (mut fp8_out, mut deq_out) = (Vec::new(), Vec::new());
        let mut names: Vec<String> = parsed.names().into_iter().map(str::to_owned).collect();
        names.sort();
        for name in names {
            let view = parsed.tensor(&name).expect("listed");
            let shape = view.shape().to_vec();
            let dtype = float_dtype(view.dtype()).filter(|_| converted(&name, &shape));
            let Some(dtype) = dtype else {
                if let Some(module) = name.strip_suffix(".weight") {
                    not_converted.push(module.to_owned());
                }
                weight_map.insert(name.clone(), shard.clone());
                let copy = || Out {
                    name: name.clone(),
                    dtype: view.dtype(),
                    shape: shape.clone(),
                    bytes: view.data().to_vec(),
                };
                fp8_out.push(copy());
                if keep_deq {
                    deq_out.push(copy());
                }
                continue;
            };
            let values = decode_f32(dtype, view.data());
            let (codes, scales) = quantize(&values, &shape, block);
            let grid = BlockFp8 {
                block,
                modules_to_not_convert: Vec::new(),
            }
            .scale_shape(&shape)
            .expect("rank >= 2");
            let deq = if keep_deq {
                super::dequantize(&codes, &scales, &shape, block)
            } else {
                Vec::new()
            };
            debug_assert!(deq
                .iter()
                .zip(&codes)
                .all(|(d, &c)| e4m3_to_f32(c).is_nan() || d.is_finite()));
            let scale_name = BlockFp8::scale_name(&name);
            weight_map.insert(name.clone(), shard.clone());
            weight_map.insert(scale_name.clone(), shard.clone());
            fp8_out.push(Out {
                name: name.clone(),
                dtype: StDtype::F8_E4M3,
                shape: shape.clone(),
                bytes: codes,
            });
            fp8_out.push(Out {
                name: scale_name,
                dtype: StDtype::F32,
                shape: grid,
                bytes: bytemuck::cast_slice(&scales).to_vec(),
            });
            if keep_deq {
                deq_out.push(Out {
                    name,
                    dtype: StDtype::F32,
                    shape,
                    bytes: bytemuck::cast_slice(&deq).to_vec(),
                });
            }
        }
        write_file(&fp8_dir.join(shard), &fp8_out)?;
        if keep_deq {
            write_file(&deq_dir.join(shard), &deq_out)?;
        }
    }
    let index = src.join("model.safetensors.index.json");
    if index.exists() {
        let fp8_map: BTreeMap<&String, &String> = weight_map.iter().collect();
        let deq_map: BTreeMap<&String, &String> = weight_map
            .iter()
            .filter(|(n, _)| !n.ends_with("_scale_inv"))
            .collect();
        for (dir, map) in [(fp8_dir, fp8_map), (deq_dir, deq_map)] {
            if dir == deq_dir && !keep_deq {
                continue;
            }
            let out = dir.join("model.safetensors.index.json");
            let text = serde_json::to_string_pretty(&json!({"metadata": {}, "weight_map": map}))
                .expect("a JSON value");
            std::fs::write(&out, text).map_err(io(&out))?;
        }
    }
    let config_path = src.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
    let mut config: Value = serde_json::from_str(&text).map_err(|error| ModelError::Json {
        path: config_path.clone(),
        error,
    })?;
    if keep_deq {
        let deq_config = dir_file(deq_dir, "config.json");
        std::fs::write(&deq_config, &text).map_err(io(&deq_config))?;
    }
    not_converted.sort();
    config["quantization_config"] = json!({
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": block,
        "modules_to_not_convert": not_converted,
    });
    let fp8_config = dir_file(fp8_dir, "config.json");
    std::fs::write(
        &fp8_config,
        serde_json::to_string_pretty(&config).expect("a JSON value"),
    )
    .map_err(io(&fp8_config))
}

fn dir_file(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(name)
}
