//! Programmatic dependent launch (sm_90 and later): a kernel whose compiled PTX waits on its
//! predecessor (`griddepcontrol.wait`, the `PDL_WAIT()` of `kernels/common.cuh`) is launched
//! with programmatic stream serialization, so its blocks start, and prefetch their weights,
//! while the kernel before it on the stream finishes. Kernels without the wait launch as
//! plain launches, and so does every kernel with `SPINDLE_CUDA_PDL=0` or on older devices.
//! Graphs captured from such launches keep the programmatic edges (CUDA 12.3 and later).

use std::collections::HashSet;

/// The kernels of `ptx` whose own body (their `.entry`) executes `griddepcontrol.wait`.
/// A wait inside a separate `.func` does not count: such a kernel launches plainly.
pub(super) fn waiting_kernels(ptx: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut current: Option<String> = None;
    for line in ptx.lines() {
        let line = line.trim();
        if let Some(rest) = line
            .strip_prefix(".visible .entry ")
            .or_else(|| line.strip_prefix(".entry "))
        {
            current = Some(rest.split('(').next().unwrap_or(rest).trim().to_owned());
        } else if line.contains(".func ") {
            current = None;
        } else if line.starts_with("griddepcontrol.wait") {
            if let Some(name) = &current {
                out.insert(name.clone());
            }
        }
    }
    out
}

/// Whether programmatic dependent launch is on for a device of compute capability `cc`:
/// sm_90 and later, unless `SPINDLE_CUDA_PDL=0`.
pub(super) fn enabled_for(cc: (i32, i32)) -> bool {
    cc.0 >= 9 && std::env::var_os("SPINDLE_CUDA_PDL").is_none_or(|v| v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_entries_that_wait() {
        let ptx = "\
.visible .entry waits(
\t.param .u64 a
)
{
\tmov.u32 %r1, %tid.x;
\tgriddepcontrol.wait;
\tgriddepcontrol.launch_dependents;
\tret;
}
.visible .entry plain(
\t.param .u64 a
)
{
\tret;
}
.func helper()
{
\tgriddepcontrol.wait;
\tret;
}
";
        let found = waiting_kernels(ptx);
        assert!(found.contains("waits"));
        assert!(!found.contains("plain"));
        assert!(!found.contains("helper"));
        assert_eq!(found.len(), 1);
    }
}
