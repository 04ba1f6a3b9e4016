//! Zero-centred RMSNorm (MODEL_MATH §1.1) of rows or of groups within rows: the norm of
//! every sublayer not fused into its decode matvec, and the grouped head norms.

use crate::device::{threads_for, DevBuf, Device};
use crate::error::Result;
use crate::kernels::{self, i, Launch, Ptr};

/// Zero-centred RMSNorm of `groups` groups of `group` values in each of `tokens` rows
/// (row t of x at `t·ldx`, of y at `t·ldy`).
pub(crate) fn group_norm(
    dev: &Device,
    x: Ptr<f32>,
    ldx: usize,
    y: Ptr<f32>,
    ldy: usize,
    w: &DevBuf<f32>,
    tokens: usize,
    groups: usize,
    group: usize,
    eps: f32,
) -> Result<()> {
    kernels::norm::RmsNormZeroCentred::launch(
        dev,
        Launch::new(
            (tokens as u32, groups as u32, 1),
            threads_for(group).min(256),
            0,
        ),
        x,
        i(ldx),
        y,
        i(ldy),
        w.arg(),
        i(group),
        eps,
    )
}

/// Zero-centred RMSNorm of `tokens` rows of `[groups · group]` (MODEL_MATH §1.1).
pub fn norm_rows(
    dev: &Device,
    x: Ptr<f32>,
    w: &DevBuf<f32>,
    tokens: usize,
    groups: usize,
    group: usize,
    eps: f32,
) -> Result<DevBuf<f32>> {
    let width = groups * group;
    let y = dev.scratch::<f32>(tokens * width)?;
    group_norm(dev, x, width, y.arg(), width, w, tokens, groups, group, eps)?;
    Ok(y)
}
