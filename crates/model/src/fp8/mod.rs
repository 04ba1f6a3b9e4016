//! Block-FP8 checkpoints (MODEL_MATH §9): the `quantization_config` that announces them, the
//! float8 e4m3fn code, and the exact weight-only dequantization W[i, j] = fp8[i, j] ·
//! scale_inv[i / Bo, j / Bi]. A checkpoint's FP8 tensors are dequantized to f32 when the
//! loader asks for them (`Checkpoint::matrix`), so every backend and `spindle convert` see the
//! same weights as an f32 checkpoint holding the dequantized values.

pub mod make;

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// `quantization_config` of a block-FP8 checkpoint (`quant_method: "fp8"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockFp8 {
    /// `weight_block_size`: [rows, columns] of one scale block.
    pub block: [usize; 2],
    /// `modules_to_not_convert`: module names (without `.weight`) stored unquantized.
    pub modules_to_not_convert: Vec<String>,
}

impl BlockFp8 {
    /// The name of the scale tensor beside FP8 tensor `weight` (`X.weight` →
    /// `X.weight_scale_inv`, fused `mlp.experts.gate_up_proj` → `..._scale_inv`).
    pub fn scale_name(weight: &str) -> String {
        format!("{weight}_scale_inv")
    }

    /// The shape of the scale grid of a weight of `shape` ([.., out, in] → [.., ⌈out/Bo⌉,
    /// ⌈in/Bi⌉]); `None` for a weight of rank below 2.
    pub fn scale_shape(&self, shape: &[usize]) -> Option<Vec<usize>> {
        let n = shape.len();
        if n < 2 {
            return None;
        }
        let mut out = shape.to_vec();
        out[n - 2] = shape[n - 2].div_ceil(self.block[0]);
        out[n - 1] = shape[n - 1].div_ceil(self.block[1]);
        Some(out)
    }

    /// Reads the `quantization_config` of `DIR/config.json` (top level or `text_config`):
    /// `None` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("config.json");
        let text =
            crate::fs::read_bounded_to_string(&path, crate::fs::CONFIG_LIMIT).map_err(|error| {
                ModelError::Io {
                    path: path.clone(),
                    error,
                }
            })?;
        let value: Value = serde_json::from_str(&text).map_err(|error| ModelError::Json {
            path: path.clone(),
            error,
        })?;
        let empty = Map::new();
        let top = value.as_object().unwrap_or(&empty);
        let text = top
            .get("text_config")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        parse_quantization(top, text, &path)
    }
}

/// Parses `quantization_config` (top level, else `text_config`): block FP8 is accepted with
/// every field checked; other methods are refused by name.
pub fn parse_quantization(
    top: &Map<String, Value>,
    text: &Map<String, Value>,
    path: &Path,
) -> Result<Option<BlockFp8>> {
    let qc = top
        .get("quantization_config")
        .or_else(|| text.get("quantization_config"))
        .filter(|v| !v.is_null());
    let Some(qc) = qc else { return Ok(None) };
    let err = |message: String| ModelError::Unsupported {
        path: path.to_owned(),
        message,
    };
    let qc = qc
        .as_object()
        .ok_or_else(|| err(format!("quantization_config = {qc}: expected an object")))?;
    let method = qc
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    if !method.eq_ignore_ascii_case("fp8") {
        return Err(err(format!(
            "quantization_config.quant_method = {method:?}: pre-quantized checkpoints other than block FP8 (\"fp8\") are not supported yet"
        )));
    }
    match qc.get("fmt").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::String(f)) if f == "e4m3" || f == "float8_e4m3fn" => {}
        Some(other) => {
            return Err(err(format!(
                "quantization_config.fmt = {other}: only \"e4m3\" (float8_e4m3fn) is supported"
            )))
        }
    }
    match qc.get("activation_scheme").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::String(s)) if s == "dynamic" => {}
        Some(other) => {
            return Err(err(format!(
                "quantization_config.activation_scheme = {other}: only \"dynamic\" is supported (static schemes carry activation scales spindle does not apply)"
            )))
        }
    }
    let block = match qc.get("weight_block_size").filter(|v| !v.is_null()) {
        None => {
            return Err(err(
                "quantization_config.weight_block_size is missing: per-tensor FP8 (one scale per tensor) is not supported yet, only block FP8".into(),
            ))
        }
        Some(v) => {
            let dims: Option<Vec<usize>> = v.as_array().and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().filter(|&n| n > 0 && n <= 1 << 20).map(|n| n as usize))
                    .collect()
            });
            match dims.as_deref() {
                Some(&[rows, cols]) => [rows, cols],
                _ => {
                    return Err(ModelError::Config {
                        path: path.to_owned(),
                        message: format!(
                            "quantization_config.weight_block_size = {v}: expected two positive integers [rows, columns]"
                        ),
                    })
                }
            }
        }
    };
    let modules_to_not_convert = match qc.get("modules_to_not_convert").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| ModelError::Config {
                path: path.to_owned(),
                message: format!(
                    "quantization_config.modules_to_not_convert = {v}: expected a list of module names"
                ),
            })?,
    };
    Ok(Some(BlockFp8 {
        block,
        modules_to_not_convert,
    }))
}

/// The value of float8 e4m3fn code `code`: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
/// infinities, S.1111.111 is NaN, the largest finite value is 448.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((code >> 3) & 0xf) as i32;
    let mant = (code & 0x7) as f32;
    if exp == 0xf && code & 0x7 == 0x7 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        mant / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + mant / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

/// The largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// `x` rounded to the nearest e4m3fn code (ties to the even code), saturating at ±448; NaN
/// maps to NaN (0x7f).
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    if a < 2f32.powi(-6) {
        // Subnormal codes 0..=8 are multiples of 2^-9 (8: the smallest normal, 2^-6); the
        // product is exact.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Normal: keep 3 of the 23 mantissa bits, rounding the other 20 to nearest even; a carry
    // moves to the next exponent (the code's bits are exponent then mantissa).
    let bits = a.to_bits();
    let exp = (bits >> 23) as i32 - 127; // −6 ..= 8
    let mant = bits & 0x7f_ffff;
    let (top, rest) = (mant >> 20, mant & 0xf_ffff);
    let up = rest > 0x8_0000 || (rest == 0x8_0000 && top & 1 == 1);
    let code = (((exp + 7) as u32) << 3) + top + up as u32;
    sign | code.min(0x7e) as u8
}

/// [`f32_to_e4m3`] by search over the code table (the definition the fast one is tested
/// against).
#[cfg(test)]
fn f32_to_e4m3_search(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // Positive codes 0x00..=0x7e are ordered by value: find the two around `a`.
    let (mut lo, mut hi) = (0u8, 0x7eu8);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_to_f32(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    let code = if a - vl < vh - a {
        lo
    } else if a - vl > vh - a {
        hi
    } else if lo % 2 == 0 {
        lo
    } else {
        hi
    };
    sign | code
}

/// Dequantizes a block-FP8 tensor of `shape` ([.., out, in], rank ≥ 2): `codes` are its e4m3
/// bytes, `scales` its scale grid [.., ⌈out/Bo⌉, ⌈in/Bi⌉] as f32. Each value is the f32 product
/// code · scale, as transformers and vLLM compute it.
pub fn dequantize(codes: &[u8], scales: &[f32], shape: &[usize], block: [usize; 2]) -> Vec<f32> {
    use rayon::prelude::*;
    let n = shape.len();
    let (rows, cols) = (shape[n - 2], shape[n - 1]);
    let (srows, scols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
    assert_eq!(
        codes.len(),
        shape.iter().product::<usize>(),
        "codes of {shape:?}"
    );
    assert_eq!(
        scales.len() * rows * cols,
        codes.len() * srows * scols,
        "scales of {shape:?}"
    );
    let table: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
    let mut out = vec![0.0f32; codes.len()];
    out.par_chunks_mut(cols.max(1))
        .zip(codes.par_chunks(cols.max(1)))
        .enumerate()
        .for_each(|(r, (dst, src))| {
            let (b, i) = (r / rows, r % rows);
            let grid = &scales[(b * srows + i / block[0]) * scols..][..scols];
            for (j, (d, &c)) in dst.iter_mut().zip(src).enumerate() {
                *d = table[c as usize] * grid[j / block[1]];
            }
        });
    out
}

/// A `[rows, cols]` block-FP8 matrix from its e4m3 `codes` and f32 scale grid `scales`
/// (`[⌈rows/Bo⌉, ⌈cols/Bi⌉]`), as a checkpoint's loader hands one out: the exact f32
/// dequantization, with the stored form attached (for tests and tools).
pub fn matrix(
    codes: &[u8],
    scales: Vec<f32>,
    rows: usize,
    cols: usize,
    block: [usize; 2],
) -> crate::Matrix {
    use crate::tensor::{DType, Storage, StoredFp8};
    let values = dequantize(codes, &scales, &[rows, cols], block);
    let mut words = vec![0u64; codes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..codes.len()].copy_from_slice(codes);
    let stored = Storage::Owned {
        words: std::sync::Arc::new(words),
        len: codes.len(),
    };
    crate::Matrix::new(DType::F32, rows, cols, Storage::from_f32(&values))
        .with_fp8(StoredFp8::new(stored, scales, block, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_codes_decode_to_the_format_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7, mantissa 0
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(e4m3_to_f32(0x78), 256.0); // exponent 15 is finite in e4m3fn
    }

    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        for code in 0..=0x7eu8 {
            let v = e4m3_to_f32(code);
            assert_eq!(f32_to_e4m3(v), code, "{v}");
            assert_eq!(f32_to_e4m3(-v) & 0x7f, code, "{v}");
        }
        // 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // 1.125 and 1.25 (0x3a): the midpoint goes to 0x3a.
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(f32_to_e4m3(1.05), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        assert_eq!(f32_to_e4m3(1.1), 0x39);
        assert_eq!(f32_to_e4m3(1e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    }

    #[test]
    fn fast_encoding_equals_the_table_search() {
        // Every code's value, the midpoints between neighbours and values just around them,
        // and a sweep over the whole range.
        let mut values = Vec::new();
        for code in 0..0x7eu8 {
            let (lo, hi) = (e4m3_to_f32(code), e4m3_to_f32(code + 1));
            let mid = (lo + hi) / 2.0;
            values.extend([lo, hi, mid, f32::from_bits(mid.to_bits() + 1)]);
            if mid > 0.0 {
                values.push(f32::from_bits(mid.to_bits() - 1));
            }
        }
        let mut v = 1e-5f32;
        while v < 1000.0 {
            values.push(v);
            v *= 1.0001;
        }
        for v in values {
            for x in [v, -v] {
                assert_eq!(f32_to_e4m3(x), f32_to_e4m3_search(x), "{x:e}");
            }
        }
    }

    #[test]
    fn dequantize_applies_each_block_scale_with_partial_edge_blocks() {
        // [2 experts, 3 rows, 5 cols] with blocks [2, 2]: grid [2, 2, 3], last row and last
        // column blocks partial.
        let shape = [2, 3, 5];
        let codes: Vec<u8> = (0..30).map(|i| (i * 7 % 0x70) as u8).collect();
        let scales: Vec<f32> = (0..12).map(|i| 0.5 + i as f32).collect();
        let out = dequantize(&codes, &scales, &shape, [2, 2]);
        for b in 0..2 {
            for i in 0..3 {
                for j in 0..5 {
                    let k = (b * 3 + i) * 5 + j;
                    let s = scales[(b * 2 + i / 2) * 3 + j / 2];
                    assert_eq!(out[k], e4m3_to_f32(codes[k]) * s, "[{b}, {i}, {j}]");
                }
            }
        }
    }
}
