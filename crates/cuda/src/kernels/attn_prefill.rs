//! The kernels of `attn_prefill.cu`.

use super::Ptr;

kernels! {
    AttnPrefill = "attn_prefill"
        (q: Ptr<f32>, gate: Ptr<f32>, k_cache: Ptr<f32>, v_cache: Ptr<f32>, out: Ptr<f32>, tokens: i32, n_h: i32, n_kv: i32, d: i32, start: i32, scale: f32);
}

pub(crate) const DECLARED: &[&[super::KernelDecl]] = &[AttnPrefill::DECLS];
