//! The kernels compile with NVRTC, and each compiled kernel takes exactly the parameters its
//! Rust declaration (`src/kernels/*.rs`) passes: same count, and in each position a 64-bit
//! slot for a pointer or `u64`, a 32-bit one for `i32`/`u32`, an `f32` for `f32`. Needs
//! libnvrtc, no GPU: `bash tests/nvrtc/run.sh` (from the repository root) fetches it from the
//! `nvidia-cuda-nvrtc` wheel and runs `cargo test -p spindle-cuda --test nvrtc -- --ignored`.

use std::collections::BTreeMap;

use spindle_cuda::kernels::{self, Param};

/// Every `.entry` of `ptx` with its parameters' PTX types (`u64`, `u32`, `f32` ...), in order.
fn entries(ptx: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut lines = ptx.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim().strip_prefix(".visible .entry ") else {
            continue;
        };
        let name = rest.split('(').next().unwrap_or(rest).trim().to_owned();
        let mut params = Vec::new();
        if !rest.trim_end().ends_with("()") {
            for line in lines.by_ref() {
                let line = line.trim();
                if line.starts_with(')') {
                    break;
                }
                // `.param .u64 name_param_0,` (an `.align`ed array would be a by-value struct,
                // which no kernel takes).
                let ty = line
                    .strip_prefix(".param .")
                    .and_then(|t| t.split_whitespace().next())
                    .unwrap_or_else(|| panic!("kernel {name}: unexpected parameter line {line:?}"));
                params.push(ty.to_owned());
            }
        }
        assert!(
            out.insert(name.clone(), params).is_none(),
            "kernel {name} defined twice"
        );
    }
    out
}

#[test]
#[ignore = "needs the NVRTC library (bash tests/nvrtc/run.sh)"]
fn kernels_compile_and_match_their_declarations() {
    let ptx = spindle_cuda::ptx_for("sm_90").unwrap_or_else(|e| panic!("{e}"));
    // For `ptxas -v` (registers, spills) on a machine with the CUDA toolkit.
    if let Some(path) = std::env::var_os("SPINDLE_PTX_OUT") {
        std::fs::write(&path, &ptx).unwrap_or_else(|e| panic!("writing {path:?}: {e}"));
    }
    let compiled = entries(&ptx);
    let mut problems = Vec::new();
    let mut declared = Vec::new();
    for decl in kernels::declared() {
        declared.push(decl.name);
        let Some(ptx_params) = compiled.get(decl.name) else {
            problems.push(format!("{}: declared in Rust, not in the PTX", decl.name));
            continue;
        };
        if ptx_params.len() != decl.params.len() {
            problems.push(format!(
                "{}: {} parameters in the PTX {:?}, {} declared {:?}",
                decl.name,
                ptx_params.len(),
                ptx_params,
                decl.params.len(),
                decl.params
            ));
            continue;
        }
        for (n, (ptx_ty, param)) in ptx_params.iter().zip(decl.params).enumerate() {
            if !param.matches_ptx(ptx_ty) {
                problems.push(format!(
                    "{}: parameter {n} is .{ptx_ty} in the PTX, declared {param:?}",
                    decl.name
                ));
            }
        }
    }
    for name in compiled.keys() {
        if !declared.contains(&name.as_str()) {
            problems.push(format!("{name}: in the PTX, not declared in Rust"));
        }
    }
    let mut sorted = declared.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), declared.len(), "a kernel is declared twice");
    assert!(
        problems.is_empty(),
        "kernel declarations disagree with the PTX:\n{}",
        problems.join("\n")
    );
    assert!(!declared.is_empty());
    // The checks above can fail: a pointer where the PTX has an int, and the reverse.
    assert!(!Param::Ptr.matches_ptx("u32") && !Param::I32.matches_ptx("u64"));
}

#[test]
fn param_kinds_map_to_ptx_widths() {
    assert!(Param::Ptr.matches_ptx("u64"));
    assert!(Param::U64.matches_ptx("u64"));
    assert!(Param::I32.matches_ptx("u32") && Param::I32.matches_ptx("s32"));
    assert!(Param::U32.matches_ptx("u32"));
    assert!(Param::F32.matches_ptx("f32") && !Param::F32.matches_ptx("u32"));
}

/// The kernels of a decode step wait on their predecessor (`PDL_WAIT()`, so the device
/// launches them with programmatic dependent launch), and every kernel that waits does so
/// before any global or shared memory access of its own in the PTX (only parameter and
/// constant loads and L2 prefetches come first) and lets its successor start only after that wait.
#[test]
#[ignore = "needs the NVRTC library (bash tests/nvrtc/run.sh)"]
fn pdl_kernels_wait_before_touching_memory() {
    let ptx = spindle_cuda::ptx_for("sm_90").unwrap_or_else(|e| panic!("{e}"));
    let mut waiting = Vec::new();
    let mut problems = Vec::new();
    let mut current: Option<(String, bool)> = None;
    for line in ptx.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            current = Some((
                rest.split('(').next().unwrap_or(rest).trim().to_owned(),
                false,
            ));
            continue;
        }
        if line.contains(".func ") {
            current = None;
            continue;
        }
        let Some((name, waited)) = current.as_mut() else {
            continue;
        };
        if line.starts_with("griddepcontrol.wait") {
            if !*waited {
                waiting.push(name.clone());
            }
            *waited = true;
            continue;
        }
        let op = line.split_whitespace().next().unwrap_or("");
        let touches_memory = ["ld.", "ldu.", "st.", "atom.", "red.", "cp.async"]
            .iter()
            .any(|p| op.starts_with(p))
            && !op.starts_with("ld.param")
            && !op.starts_with("ld.const");
        if !*waited && op.starts_with("griddepcontrol.launch_dependents") {
            problems.push(format!("{name}: launches its dependents before it waits"));
        }
        if !*waited && touches_memory {
            problems.push(format!("{name}: {line} before griddepcontrol.wait"));
        }
    }
    let waiting_set: std::collections::HashSet<&str> = waiting.iter().map(String::as_str).collect();
    // Problems only count for kernels that wait at all (the others launch plainly).
    problems.retain(|p| waiting_set.contains(p.split(':').next().unwrap_or("")));
    assert!(
        problems.is_empty(),
        "kernels launched with PDL touch memory before they wait:\n{}",
        problems.join("\n")
    );
    for fmt in ["bf16", "q8", "q4", "fp8"] {
        for t in ["t1", "t8"] {
            for k in [
                format!("decode_matvec_{fmt}_{t}"),
                format!("decode_matvec_conv_{fmt}_{t}"),
            ] {
                if k.starts_with("decode_matvec_conv_fp8") {
                    continue; // no FP8 conv variant
                }
                assert!(waiting_set.contains(k.as_str()), "{k} does not wait");
            }
        }
        for k in [
            format!("decode_moe_gate_up_{fmt}"),
            format!("decode_moe_down_{fmt}"),
        ] {
            assert!(waiting_set.contains(k.as_str()), "{k} does not wait");
        }
    }
    for k in [
        "embed_bf16",
        "rms_norm_zero_centred",
        "gdn_decode_heads",
        "attention_prepare",
        "attention_decode_split",
        "attention_decode_combine",
        "argmax_two_stage",
    ] {
        assert!(waiting_set.contains(k), "{k} does not wait");
    }
}
