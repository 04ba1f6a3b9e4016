//! The kernels of `moe.cu`.

use super::Ptr;

kernels! {
    MoeRoute = "moe_route"
        (logits: Ptr<f32>, ld: i32, experts: i32, k: i32, renormalize: i32, idx: Ptr<i32>, wt: Ptr<f32>);
    MoeGateUp { BF16 = "moe_gate_up_bf16", Q8 = "moe_gate_up_q8", Q4 = "moe_gate_up_q4" }
        (gu: Ptr<u8>, gs: Ptr<u16>, x: Ptr<f32>, ldx: i32, idx: Ptr<i32>, act: Ptr<f32>, k: i32, inter: i32, hidden: i32, vec: i32);
    MoeDown { BF16 = "moe_down_bf16", Q8 = "moe_down_q8", Q4 = "moe_down_q4" }
        (down: Ptr<u8>, ds: Ptr<u16>, act: Ptr<f32>, idx: Ptr<i32>, wt: Ptr<f32>, y: Ptr<f32>, k: i32, inter: i32, hidden: i32, vec: i32);
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] =
    &[MoeRoute::DECLS, MoeGateUp::DECLS, MoeDown::DECLS];
