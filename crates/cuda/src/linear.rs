//! y = x·Wᵀ on the device, whatever the batch: the decode matvecs for at most
//! [`MATVEC_MAX_TOKENS`] tokens ([`decode_linear`]: input staged once per block, int8
//! activations for Q8/Q4 as on the CPU, norm and epilogue fused, with a fallback through the
//! general kernels for shapes they do not take); larger batches the tensor-core GEMM, or the
//! SIMT GEMM where it does not apply.

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::gemm::{simt_gemm, tensor_gemm, tensor_gemm_ok, GemmActs, GemmRows};
use crate::kernels::{self, i, Launch, Ptr, MATVEC_MAX_TOKENS};
use crate::matrix::{DevMatrix, DevPart};
use crate::matvec::{
    decode_matvec, decode_matvec_fits, ggml_only_decode, matvec, DecodeIn, DecodeOut,
};
use crate::norm::group_norm;

/// `y[t·ldy + r] (+)= Σ_c W[r, c]·x[t·ldx + c]` for `tokens` rows of x.
pub fn linear(
    dev: &Device,
    w: &DevMatrix,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    // A small batch inside a batched step: groups of MATVEC_MAX_TOKENS rows, each through
    // the path a decode of that many rows takes (each weight read once per group; cheaper
    // than the GEMM's padded tiles up to a few groups).
    if tokens > MATVEC_MAX_TOKENS && tokens <= dev.small_batch_rows() {
        for t0 in (0..tokens).step_by(MATVEC_MAX_TOKENS) {
            let n = (tokens - t0).min(MATVEC_MAX_TOKENS);
            linear(
                dev,
                w,
                x.at(t0 * ldx),
                ldx,
                y.at(t0 * ldy),
                ldy,
                n,
                accumulate,
            )?;
        }
        return Ok(());
    }
    // Prepared once per weight family for the tensor-core GEMM: [bf16, int8, e4m3].
    let mut prepared: [Option<GemmActs>; 3] = [None, None, None];
    for (row0, part) in &w.parts {
        let y = y.at(*row0);
        if part.fmt.ggml() {
            ggml_linear(dev, part, x, ldx, y, ldy, tokens, accumulate)?;
        } else if tokens > MATVEC_MAX_TOKENS && tensor_gemm_ok(dev, part.fmt, part.cols) {
            let slot = &mut prepared[part.fmt.acts_kind()];
            if slot.is_none() {
                *slot = Some(GemmActs::prepare(
                    dev, part.fmt, x, ldx, None, tokens, part.cols,
                )?);
            }
            let acts = slot.as_ref().expect("prepared above");
            tensor_gemm(dev, part, acts, y, ldy, accumulate, GemmRows::Dense(tokens))?;
        } else {
            linear_part(dev, part, x, ldx, y, ldy, tokens, accumulate)?;
        }
    }
    Ok(())
}

/// A GGUF K-quant block for any number of tokens: the decode matvec, one launch with a row
/// of blocks per group of [`MATVEC_MAX_TOKENS`] tokens (int8 activations as on the CPU; each
/// weight read once per group: exact, not yet fast for long prompts).
fn ggml_linear(
    dev: &Device,
    w: &DevPart,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    if tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    let input = DecodeIn::plain(x, ldx);
    if !decode_matvec_fits(dev, w, &input, tokens) {
        return Err(ggml_only_decode(w.fmt));
    }
    let out = if accumulate {
        DecodeOut::Accumulate { y, ldy, gate: None }
    } else {
        DecodeOut::Store { y, ldy }
    };
    decode_matvec(dev, w, 0, w.rows, input, tokens, out, 0)
}

fn linear_part(
    dev: &Device,
    w: &DevPart,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    tokens: usize,
    accumulate: bool,
) -> Result<()> {
    if tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if tokens <= MATVEC_MAX_TOKENS {
        matvec(dev, w, x, ldx, y, ldy, tokens, accumulate)
    } else {
        simt_gemm(dev, w, x, ldx, y, ldy, tokens, accumulate)
    }
}

/// `linear` into a new `[tokens, rows]` scratch buffer.
pub fn project(
    dev: &Device,
    w: &DevMatrix,
    x: Ptr<f32>,
    ldx: usize,
    tokens: usize,
) -> Result<DevBuf<f32>> {
    let y = dev.scratch::<f32>(tokens * w.rows)?;
    linear(dev, w, x, ldx, y.arg(), w.rows, tokens, false)?;
    Ok(y)
}

/// Rows `rows` of `w` for `tokens` tokens through the decode kernels (input staged in shared
/// memory, norm fused, output epilogue fused), each group of [`MATVEC_MAX_TOKENS`] tokens as
/// a decode of those tokens alone (one launch for all groups); falls back to a norm kernel,
/// the plain matvec and elementwise kernels when a shape does not suit them.
pub fn decode_linear(
    dev: &Device,
    w: &DevMatrix,
    rows: std::ops::Range<usize>,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
) -> Result<()> {
    if tokens > MATVEC_MAX_TOKENS {
        let one_launch = dev.group_launch()
            && match out {
                DecodeOut::SwiGlu { .. } => w
                    .part_of(rows.clone())
                    .is_some_and(|(part, _)| decode_matvec_fits(dev, part, &input, tokens)),
                _ => w
                    .parts
                    .iter()
                    .all(|(_, part)| decode_matvec_fits(dev, part, &input, tokens)),
            };
        if !one_launch {
            for t0 in (0..tokens).step_by(MATVEC_MAX_TOKENS) {
                let n = (tokens - t0).min(MATVEC_MAX_TOKENS);
                let input = DecodeIn {
                    x: input.x.at(t0 * input.ldx),
                    normed_out: if input.normed_out.is_null() {
                        Ptr::null()
                    } else {
                        input.normed_out.at(t0 * w.cols)
                    },
                    ..input
                };
                let out = match out {
                    DecodeOut::Store { y, ldy } => DecodeOut::Store {
                        y: y.at(t0 * ldy),
                        ldy,
                    },
                    DecodeOut::SwiGlu { y, ldy } => DecodeOut::SwiGlu {
                        y: y.at(t0 * ldy),
                        ldy,
                    },
                    DecodeOut::Accumulate { y, ldy, gate } => DecodeOut::Accumulate {
                        y: y.at(t0 * ldy),
                        ldy,
                        gate: gate.map(|(g, ldg)| (g.at(t0 * ldg), ldg)),
                    },
                };
                decode_linear(dev, w, rows.clone(), input, n, out)?;
            }
            return Ok(());
        }
    }
    if let DecodeOut::SwiGlu { .. } = out {
        // Gate and up rows must sit in one block of one format.
        let half = rows.len() / 2;
        if let Some((part, first)) = w.part_of(rows.clone()) {
            if decode_matvec_fits(dev, part, &input, tokens) {
                return decode_matvec(dev, part, first, half, input, tokens, out, half);
            }
        }
        return decode_fallback(dev, w, rows, input, tokens, out);
    }
    // Every block of the range on its own (each applies the norm again).
    let fits = w
        .parts
        .iter()
        .all(|(_, part)| decode_matvec_fits(dev, part, &input, tokens));
    if !fits {
        return decode_fallback(dev, w, rows, input, tokens, out);
    }
    let mut first_part = true;
    for (row0, part) in &w.parts {
        let (lo, hi) = (rows.start.max(*row0), rows.end.min(row0 + part.rows));
        if lo >= hi {
            continue;
        }
        let shift = |y: Ptr<f32>| y.at(lo - rows.start);
        let out = match out {
            DecodeOut::Store { y, ldy } => DecodeOut::Store { y: shift(y), ldy },
            DecodeOut::Accumulate { y, ldy, gate } => DecodeOut::Accumulate {
                y: shift(y),
                ldy,
                gate,
            },
            DecodeOut::SwiGlu { .. } => unreachable!("handled above"),
        };
        let input = DecodeIn {
            normed_out: if first_part {
                input.normed_out
            } else {
                Ptr::null()
            },
            ..input
        };
        first_part = false;
        decode_matvec(dev, part, lo - row0, hi - lo, input, tokens, out, 0)?;
    }
    Ok(())
}

/// The same results through the general kernels: norm, matvec, then the epilogue.
fn decode_fallback(
    dev: &Device,
    w: &DevMatrix,
    rows: std::ops::Range<usize>,
    input: DecodeIn,
    tokens: usize,
    out: DecodeOut,
) -> Result<()> {
    let cols = w.cols;
    let normed;
    let (x, ldx) = match input.norm {
        Some((nw, eps)) => {
            let dst = if !input.normed_out.is_null() {
                input.normed_out
            } else {
                normed = dev.scratch::<f32>(tokens * cols)?;
                normed.arg()
            };
            group_norm(dev, input.x, input.ldx, dst, cols, nw, tokens, 1, cols, eps)?;
            (dst, cols)
        }
        None => {
            if !input.normed_out.is_null() {
                for t in 0..tokens {
                    dev.copy_raw(
                        input.x.at(t * input.ldx).addr(),
                        input.normed_out.at(t * cols).addr(),
                        cols * 4,
                    )?;
                }
            }
            (input.x, input.ldx)
        }
    };
    let n = rows.len();
    let full = project(dev, w, x, ldx, tokens)?; // [tokens, w.rows]
    let src = full.arg_at(rows.start);
    match out {
        DecodeOut::Store { y, ldy } => {
            for t in 0..tokens {
                dev.copy_raw(src.at(t * w.rows).addr(), y.at(t * ldy).addr(), n * 4)?;
            }
            Ok(())
        }
        DecodeOut::SwiGlu { y, ldy } => {
            let half = n / 2;
            for t in 0..tokens {
                kernels::elementwise::Swiglu::launch(
                    dev,
                    Launch::elementwise(half),
                    src.at(t * w.rows),
                    i(w.rows),
                    i(0),
                    i(half),
                    y.at(t * ldy),
                    i(1),
                    i(half),
                )?;
            }
            Ok(())
        }
        DecodeOut::Accumulate { y, ldy, gate } => {
            for t in 0..tokens {
                let row = src.at(t * w.rows);
                if let Some((g, ldg)) = gate {
                    kernels::elementwise::ScaleBySigmoid::launch(
                        dev,
                        Launch::elementwise(n),
                        row,
                        g.at(t * ldg),
                        i(ldg),
                        i(1),
                        i(n),
                    )?;
                }
                kernels::elementwise::AddInPlace::launch(
                    dev,
                    Launch::elementwise(n),
                    y.at(t * ldy),
                    row,
                    i(n),
                )?;
            }
            Ok(())
        }
    }
}
