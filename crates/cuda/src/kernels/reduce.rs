//! Launchers of the kernels in `reduce.cu`.

use super::Ptr;

kernels! {
    /// Every block finds its best (value, first index) and writes it to part[blockIdx].
    ArgmaxTwoStage = "argmax_two_stage"
    (
        x: Ptr<f32>,
        n: i32,
        part_v: Ptr<f32>,
        part_i: Ptr<i32>,
        done: Ptr<u32>,
        out: Ptr<i32>,
    );
    /// Reads n 16-byte words (the bandwidth probe of `spindle bench`).
    ReadBandwidthProbe = "read_bandwidth_probe"
    (
        src: Ptr<u8>,
        n: u64,
        out: Ptr<u32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] =
    &[ArgmaxTwoStage::DECLS, ReadBandwidthProbe::DECLS];
