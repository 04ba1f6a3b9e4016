//! The kernels of `decode.cu`.

use super::Ptr;

kernels! {
    DecodeMatvec { BF16_T1 = "dmv_bf16_t1", Q8_T1 = "dmv_q8_t1", Q4_T1 = "dmv_q4_t1", BF16_T8 = "dmv_bf16_t8", Q8_T8 = "dmv_q8_t8", Q4_T8 = "dmv_q4_t8" }
        (w: Ptr<u8>, s: Ptr<u16>, outs: i32, cols: i32, x: Ptr<f32>, ldx: i32, tokens: i32, nw: Ptr<f32>, eps: f32, xn: Ptr<f32>, y: Ptr<f32>, ldy: i32, accumulate: i32, pair: i32, gate: Ptr<f32>, ldg: i32, lpr: i32);
    DecodeMatvecConv { BF16_T1 = "dmvc_bf16_t1", Q8_T1 = "dmvc_q8_t1", Q4_T1 = "dmvc_q4_t1", BF16_T8 = "dmvc_bf16_t8", Q8_T8 = "dmvc_q8_t8", Q4_T8 = "dmvc_q4_t8" }
        (w: Ptr<u8>, s: Ptr<u16>, outs: i32, cols: i32, x: Ptr<f32>, ldx: i32, tokens: i32, nw: Ptr<f32>, eps: f32, xn: Ptr<f32>, y: Ptr<f32>, ldy: i32, accumulate: i32, pair: i32, gate: Ptr<f32>, ldg: i32, lpr: i32, cstate: Ptr<f32>, cw: Ptr<f32>, conv_taps: i32, conv_channels: i32);
    DecodeMoeGateUp { BF16 = "dmoe_gate_up_bf16", Q8 = "dmoe_gate_up_q8", Q4 = "dmoe_gate_up_q4" }
        (gu: Ptr<u8>, gs: Ptr<u16>, sgu: Ptr<u8>, sgs: Ptr<u16>, x: Ptr<f32>, tokens: i32, logits: Ptr<f32>, ld: i32, experts: i32, renormalize: i32, idx: Ptr<i32>, wt: Ptr<f32>, k: i32, inter: i32, inter_shared: i32, hidden: i32, act: Ptr<f32>, act_s: Ptr<f32>);
    DecodeMoeDown { BF16 = "dmoe_down_bf16", Q8 = "dmoe_down_q8", Q4 = "dmoe_down_q4" }
        (dw: Ptr<u8>, ds: Ptr<u16>, sdw: Ptr<u8>, sds: Ptr<u16>, act: Ptr<f32>, act_s: Ptr<f32>, idx: Ptr<i32>, wt: Ptr<f32>, sg: Ptr<f32>, ldsg: i32, tokens: i32, k: i32, inter: i32, inter_shared: i32, hidden: i32, h: Ptr<f32>, ldh: i32, accumulate: i32);
    ArgmaxMulti = "argmax_multi"
        (x: Ptr<f32>, n: i32, part_v: Ptr<f32>, part_i: Ptr<i32>, done: Ptr<u32>, out: Ptr<i32>);
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[
    DecodeMatvec::DECLS,
    DecodeMatvecConv::DECLS,
    DecodeMoeGateUp::DECLS,
    DecodeMoeDown::DECLS,
    ArgmaxMulti::DECLS,
];
