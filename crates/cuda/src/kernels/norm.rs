//! Launchers of the kernels in `norm.cu`.

use super::Ptr;

kernels! {
    /// Zero-centred RMSNorm (MODEL_MATH §1.1), grouped: block (t, g) normalises the group
    /// x[t·ldx + g·group ..][..group] and multiplies it by (1 + w[g·group + i]).
    RmsNormZeroCentred = "rms_norm_zero_centred"
    (
        x: Ptr<f32>,
        ldx: i32,
        y: Ptr<f32>,
        ldy: i32,
        w: Ptr<f32>,
        group: i32,
        eps: f32,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[RmsNormZeroCentred::DECLS];
