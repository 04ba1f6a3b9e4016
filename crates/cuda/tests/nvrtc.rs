//! The kernels compile with NVRTC (needs libnvrtc, no GPU):
//! `cargo test -p spindle-cuda --test nvrtc -- --ignored`.

#[test]
#[ignore = "needs the NVRTC library"]
fn kernels_compile_for_hopper() {
    let ptx = spindle_cuda::ptx_for("sm_90").unwrap_or_else(|e| panic!("{e}"));
    // For `ptxas -v` (registers, spills) on a machine with the CUDA toolkit.
    if let Some(path) = std::env::var_os("SPINDLE_PTX_OUT") {
        std::fs::write(&path, &ptx).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    }
    for kernel in [
        "matvec_bf16",
        "matvec_q8",
        "matvec_q4",
        "gemm_bf16",
        "gemm_q4",
        "moe_gate_up_q4",
        "moe_down_q8",
        "read_probe",
        "gdn_recurrent",
        "attn_decode",
        "moe_route",
        "ple_conv",
        "ple_gather",
        "ple_advance",
        "qsa_prep",
        "qsa_scores",
        "qsa_pick",
        "dmv_q4_t1",
        "dmv_bf16_t8",
        "dmoe_gate_up_q4",
        "dmoe_down_q8",
        "argmax_multi",
        "attn_split",
        "attn_combine",
        "gdn_heads",
        "dmvc_q4_t1",
        "tgemm_bf16",
        "tgemm_q8",
        "tgemm_q4",
        "tg_prep_q",
        "tg_prep_bf16",
        "moe_sort",
        "moe_combine",
        "attn_prefill",
        "gdn_chunk_prep",
        "gdn_chunk_scan",
        "gdn_gated_norm",
    ] {
        assert!(ptx.contains(kernel), "PTX lacks {kernel}");
    }
}
