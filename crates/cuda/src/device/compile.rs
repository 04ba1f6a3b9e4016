//! NVRTC: the kernels' CUDA C compiled to PTX for one architecture.

use cudarc::nvrtc::CompileOptions;

use crate::error::{CudaError, Result};

/// PTX of the CUDA C program `source` for `arch` (e.g. `sm_90`). Needs only the NVRTC
/// library, no GPU.
pub fn compile(source: String, arch: &str) -> Result<String> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some("spindle_kernels.cu".into()),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| {
        let log = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => other.to_string(),
        };
        CudaError::Compile {
            arch: arch.to_owned(),
            log,
        }
    })?;
    tracing::info!(
        arch,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "compiled CUDA kernels"
    );
    Ok(ptx.to_src())
}
