//! How a sublayer takes its input and gives back its output ([`Io`]): split (a separate input
//! buffer, the output returned), or fused with the residual on the decode path (the norm in
//! the first matvec, the output added by the last).

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::kernels::{self, i, Launch, Ptr, MATVEC_MAX_TOKENS};
use crate::linear::{decode_linear, linear, project};
use crate::matrix::DevMatrix;
use crate::matvec::{DecodeIn, DecodeOut};

/// How a sublayer gets its input and gives back its output.
#[derive(Clone, Copy)]
pub enum Io<'a> {
    /// `x` (`[tokens, hidden]`) is the sublayer's input; its output is returned for the caller.
    Split(&'a DevBuf<f32>),
    /// Decode with a plain residual: the sublayer norms `h` itself (fused into its first
    /// matvec) and adds its output into `h` (fused into its last).
    Fused {
        h: &'a DevBuf<f32>,
        norm: &'a DevBuf<f32>,
        eps: f32,
    },
}

/// Whether `tokens` rows run through the decode kernels: at most [`MATVEC_MAX_TOKENS`], or,
/// inside a batched step, at most the device's small-batch limit (then in groups of
/// MATVEC_MAX_TOKENS rows, each row's arithmetic that of the same row decoded alone).
pub fn decode_sized(dev: &Device, tokens: usize) -> bool {
    tokens <= MATVEC_MAX_TOKENS || tokens <= dev.small_batch_rows()
}

/// The groups of at most [`MATVEC_MAX_TOKENS`] rows that decode kernels run `tokens` rows in:
/// (first row, rows).
pub fn row_groups(tokens: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..tokens)
        .step_by(MATVEC_MAX_TOKENS)
        .map(move |t0| (t0, (tokens - t0).min(MATVEC_MAX_TOKENS)))
}

impl<'a> Io<'a> {
    /// The input of the sublayer's first linear layer(s); `normed_out` as in [`DecodeIn`].
    pub fn input(&self, hidden: usize, normed_out: Ptr<f32>) -> DecodeIn<'a> {
        match *self {
            Io::Split(x) => DecodeIn::plain(x.arg(), hidden),
            Io::Fused { h, norm, eps } => DecodeIn {
                x: h.arg(),
                ldx: hidden,
                norm: Some((norm, eps)),
                normed_out,
            },
        }
    }

    /// As [`Io::input`] from row `t0` on (no normed copy).
    pub fn input_rows(&self, hidden: usize, t0: usize) -> DecodeIn<'a> {
        let whole = self.input(hidden, Ptr::null());
        DecodeIn {
            x: whole.x.at(t0 * hidden),
            ..whole
        }
    }

    /// `x·Wᵀ` of the sublayer input into a new `[tokens, w.rows]` buffer.
    pub fn project(
        &self,
        dev: &Device,
        w: &DevMatrix,
        hidden: usize,
        tokens: usize,
    ) -> Result<DevBuf<f32>> {
        match *self {
            Io::Split(x) if !decode_sized(dev, tokens) => project(dev, w, x.arg(), hidden, tokens),
            _ => {
                let y = dev.scratch::<f32>(tokens * w.rows)?;
                let out = DecodeOut::Store {
                    y: y.arg(),
                    ldy: w.rows,
                };
                let input = self.input(hidden, Ptr::null());
                decode_linear(dev, w, 0..w.rows, input, tokens, out)?;
                Ok(y)
            }
        }
    }

    /// The sublayer's last linear layer on `x` (`[tokens, ldx]`): returned (split) or added
    /// into the residual (fused).
    pub fn finish(
        &self,
        dev: &Device,
        w: &DevMatrix,
        x: Ptr<f32>,
        ldx: usize,
        hidden: usize,
        tokens: usize,
    ) -> Result<Option<DevBuf<f32>>> {
        match *self {
            Io::Split(_) => {
                let y = dev.scratch::<f32>(tokens * w.rows)?;
                if !decode_sized(dev, tokens) {
                    linear(dev, w, x, ldx, y.arg(), w.rows, tokens, false)?;
                } else {
                    let out = DecodeOut::Store {
                        y: y.arg(),
                        ldy: w.rows,
                    };
                    decode_linear(dev, w, 0..w.rows, DecodeIn::plain(x, ldx), tokens, out)?;
                }
                Ok(Some(y))
            }
            Io::Fused { h, .. } => {
                let out = DecodeOut::Accumulate {
                    y: h.arg(),
                    ldy: hidden,
                    gate: None,
                };
                decode_linear(dev, w, 0..w.rows, DecodeIn::plain(x, ldx), tokens, out)?;
                Ok(None)
            }
        }
    }

    /// Hands a sublayer output computed apart back: returned (split) or added into `h`.
    pub fn give(&self, dev: &Device, y: DevBuf<f32>) -> Result<Option<DevBuf<f32>>> {
        match *self {
            Io::Split(_) => Ok(Some(y)),
            Io::Fused { h, .. } => {
                kernels::elementwise::AddInPlace::launch(
                    dev,
                    Launch::elementwise(y.len()),
                    h.arg(),
                    y.arg(),
                    i(y.len()),
                )?;
                Ok(None)
            }
        }
    }
}
