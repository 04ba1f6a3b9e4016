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
    // Every kernel the device module loads at open (a name missing from the sources would
    // otherwise fail only on a GPU).
    for kernel in spindle_cuda::KERNELS {
        assert!(
            ptx.contains(&format!(".entry {kernel}(")),
            "PTX lacks kernel {kernel}"
        );
    }
    // And no kernel the module defines goes unlisted (unused).
    for entry in ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
    {
        let name = entry.split('(').next().unwrap_or(entry);
        assert!(
            spindle_cuda::KERNELS.contains(&name),
            "kernel {name} is defined but not in KERNELS"
        );
    }
}
