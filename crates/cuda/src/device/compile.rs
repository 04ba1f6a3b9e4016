//! NVRTC: the kernels' CUDA C compiled to PTX for one architecture.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::CompileOptions;

use crate::error::{CudaError, Result};

/// PTX of every kernel for `arch` (e.g. `sm_90`), compiled by NVRTC at most once per process.
/// Needs only the NVRTC library, no GPU.
pub fn ptx_for(arch: &str) -> Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ptx) = cache.get(arch) {
        return Ok(ptx.clone());
    }
    let source = crate::kernels::program();
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
    let text = ptx.to_src();
    cache.insert(arch.to_owned(), text.clone());
    Ok(text)
}
