//! Reductions over whole buffers: the greedy token on the device and the read pass of the
//! bandwidth probe.

use crate::device::{DevBuf, Device};
use crate::error::Result;
use crate::kernels::reduce::{ArgmaxTwoStage, ReadBandwidthProbe};
use crate::kernels::{i, p, Launch};
use crate::session::ARGMAX_BLOCKS;

/// Writes the index of the largest of the `n` f32 values at `x` (the first on ties) as an i32
/// to `out`, in one launch: every block reduces its share into `parts` (per-block values, then
/// indices, then the finished-block counter, `2·ARGMAX_BLOCKS + 1` words), the last to finish
/// reduces the parts.
pub fn argmax(dev: &Device, x: u64, n: usize, parts: &DevBuf<u32>, out: u64) -> Result<()> {
    let blocks = n.div_ceil(256).min(ARGMAX_BLOCKS);
    ArgmaxTwoStage::launch(
        dev,
        Launch::new((blocks as u32, 1, 1), 256, 0),
        p(x),
        i(n),
        p(parts.ptr()),
        p(parts.at(ARGMAX_BLOCKS)),
        parts.arg_at(2 * ARGMAX_BLOCKS),
        p(out),
    )
}

/// Reads `words` 16-byte words of `buf` once (`out` is written only on an impossible checksum,
/// so the loads stay).
pub fn read_pass(dev: &Device, buf: &DevBuf<u8>, words: usize, out: &DevBuf<u32>) -> Result<()> {
    ReadBandwidthProbe::launch(
        dev,
        Launch::new((132 * 8, 1, 1), 512, 0),
        buf.arg(),
        words as u64,
        out.arg(),
    )
}
