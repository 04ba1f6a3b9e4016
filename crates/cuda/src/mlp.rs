//! The dense SwiGLU MLP on the device (MODEL_MATH §1.6): `down(silu(gate(x)) ⊙ up(x))`, gate
//! and up one fused matrix; on the decode path the SwiGLU is the gate|up matvec's epilogue.

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::io::{decode_sized, Io};
use crate::kernels::{self, i, Launch};
use crate::linear::{decode_linear, linear, project};
use crate::matvec::DecodeOut;
use crate::weights::GpuMlp;

/// `down(silu(gate(x)) ⊙ up(x))` for `[tokens, H]` (input and output as `io`).
pub fn mlp(
    dev: &Device,
    w: &GpuMlp,
    io: Io,
    tokens: usize,
    hidden: usize,
) -> Result<Option<DevBuf<f32>>> {
    let inter = w.down.cols;
    let x = match io {
        Io::Split(x) if !decode_sized(dev, tokens) => x,
        _ => {
            let act = dev.scratch::<f32>(tokens * inter)?;
            let out = DecodeOut::SwiGlu {
                y: act.arg(),
                ldy: inter,
            };
            let input = io.input_rows(hidden, 0);
            decode_linear(dev, &w.gate_up, 0..2 * inter, input, tokens, out)?;
            return io.finish(dev, &w.down, act.arg(), inter, hidden, tokens);
        }
    };
    let gu = project(dev, &w.gate_up, x.arg(), hidden, tokens)?;
    let act = dev.scratch::<f32>(tokens * inter)?;
    kernels::elementwise::Swiglu::launch(
        dev,
        Launch::elementwise(tokens * inter),
        gu.arg(),
        i(2 * inter),
        i(0),
        i(inter),
        act.arg(),
        i(tokens),
        i(inter),
    )?;
    let y = dev.scratch::<f32>(tokens * hidden)?;
    linear(
        dev,
        &w.down,
        act.arg(),
        inter,
        y.arg(),
        hidden,
        tokens,
        false,
    )?;
    Ok(Some(y))
}
