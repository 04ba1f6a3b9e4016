//! Errors of the CUDA backend.

use spindle_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "CUDA is not available: no CUDA driver library (libcuda.so) was found on this machine; \
             install the NVIDIA driver or run with --device cpu"
    )]
    NoDriver,
    #[error(
        "CUDA is not available: the NVRTC library (libnvrtc.so) that compiles spindle's CUDA \
             kernels was not found; install the CUDA toolkit's NVRTC or add its lib directory to \
             LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("CUDA device {ordinal} does not exist: this machine has {count} CUDA device(s)")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("CUDA driver error while {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    #[error("NVRTC could not compile spindle's CUDA kernels for {arch}: {log}")]
    Compile { arch: String, log: String },
    #[error("the CUDA backend does not support this model: {0}")]
    Unsupported(String),
    /// Image input that cannot run: no tower loaded, an image that does not fit it, pads
    /// that do not match the queued images.
    #[error("{0}")]
    Image(String),
    #[error("the batched step failed: {0}")]
    BatchStep(String),
    /// Found by [`crate::CudaEngine::locate_non_finite`]'s replay.
    #[error("the hidden state went non-finite (NaN or infinity) {site}, at input token {token}")]
    NonFinite {
        site: spindle_model::forward::NonFiniteSite,
        token: usize,
    },
    /// The KV block pool has no blocks for a sequence's next tokens (it waits, or another
    /// sequence or the prefix cache gives blocks back).
    #[error(transparent)]
    KvPoolFull(spindle_model::paged::PoolFull),
    #[error(transparent)]
    Model(#[from] ModelError),
}

pub type Result<T> = std::result::Result<T, CudaError>;

/// Adds what was being done to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, what: &str) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn during(self, what: &str) -> Result<T> {
        self.map_err(|source| CudaError::Driver {
            what: what.to_owned(),
            source,
        })
    }
}
