//! Launchers of the kernels in `reduce.cu`.

use super::Ptr;

kernels! {
    ArgmaxTwoStage = "argmax_two_stage"
    (
        x: Ptr<f32>,
        n: i32,
        part_v: Ptr<f32>,
        part_i: Ptr<i32>,
        done: Ptr<u32>,
        out: Ptr<i32>,
    );
    ReadBandwidthProbe = "read_bandwidth_probe"
    (
        src: Ptr<u8>,
        n: u64,
        out: Ptr<u32>,
    );
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] =
    &[ArgmaxTwoStage::DECLS, ReadBandwidthProbe::DECLS];
