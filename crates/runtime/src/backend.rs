//! The backend interface: which engine runs the model, the CPU [`Engine`] or (with the `cuda`
//! feature) the CUDA engine on one GPU. Every front end goes through here: `load`, a new
//! session, `forward` (token ids in, logits on the host out, the input checked once here for
//! every backend), the state a session holds, and what the bench measures beside them (a
//! greedy decode step, the memory-bandwidth probe, the CUDA kernel profile). Above this the
//! decode loop, sampling, stop strings, chat templates and tool parsing are one code path.

#[cfg(feature = "cuda")]
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::Arc;
#[cfg(feature = "cuda")]
use std::sync::Mutex;

use spindle_engine::experts::load::Placement;
use spindle_engine::experts::{ExpertCounters, ExpertResidency, ExpertStats};
use spindle_engine::{Engine, GreedyRun, LoadOptions, LogitsFor, Session};
use spindle_kernels::softmax::argmax;
use spindle_model::ModelConfig;

use crate::bench::{measure_read_bandwidth, KernelTime};
pub use crate::device::Device;
use crate::error::{Result, RuntimeError};
use crate::input::check_input;

/// Why `options` (or the directory) cannot be run by the CUDA backend, naming the option at
/// fault: the CUDA engine reads Hugging Face checkpoints only and keeps every expert in GPU
/// memory, so installs, `--experts mapped|streamed` and `--expert-slots` are CPU features.
/// `None` when the CUDA backend can take them. (Available in every build, so the refusals are
/// tested without a GPU.)
pub fn cuda_refusal(dir: &Path, options: &LoadOptions) -> Option<String> {
    if spindle_model::install::is_install(dir) {
        return Some(format!(
            "{} is a spindle install (it has a manifest.json); the CUDA backend reads Hugging Face \
             checkpoints only: point --model at the checkpoint the install was converted from \
             (with --quant for q8/q4), or run the install with --device cpu",
            dir.display()
        ));
    }
    match options.experts {
        ExpertResidency::Resident | ExpertResidency::Auto => {}
        other => {
            return Some(format!(
                "--experts {} is not available with --device cuda: the CUDA backend keeps every \
                 expert in GPU memory (use --experts resident or auto, or --device cpu)",
                other.name()
            ))
        }
    }
    if let Some(slots) = options.expert_slots {
        return Some(format!(
            "--expert-slots {slots} is not available with --device cuda: expert slots are a \
             feature of the CPU engine's expert streaming (drop the option, or use --device cpu)"
        ));
    }
    None
}

/// A loaded model on one backend.
// One per loaded model: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Cpu(Engine),
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
}

/// The CUDA engine and the lock that serializes its use.
///
/// One engine has one stream and one scratch arena, and captures decode steps as CUDA graphs
/// on that stream, so two sessions must never run (or free device memory) at the same time:
/// every forward pass, session creation and session drop holds `lock`. Sessions of a server
/// with `--parallel N` therefore take turns step by step on the GPU.
#[cfg(feature = "cuda")]
pub struct CudaBackend {
    engine: spindle_cuda::CudaEngine,
    ordinal: usize,
    lock: Arc<Mutex<()>>,
}

#[cfg(feature = "cuda")]
impl CudaBackend {
    pub fn engine(&self) -> &spindle_cuda::CudaEngine {
        &self.engine
    }
}

/// One sequence's state on the backend that created it.
pub enum BackendSession {
    Cpu(Session),
    #[cfg(feature = "cuda")]
    Cuda(Box<CudaSessionGuard>),
}

/// A CUDA session that is dropped under its engine's lock (freeing device memory enqueues
/// work on the engine's stream).
#[cfg(feature = "cuda")]
pub struct CudaSessionGuard {
    session: ManuallyDrop<spindle_cuda::CudaSession>,
    lock: Arc<Mutex<()>>,
}

#[cfg(feature = "cuda")]
impl CudaSessionGuard {
    pub fn session(&self) -> &spindle_cuda::CudaSession {
        &self.session
    }
}

#[cfg(feature = "cuda")]
impl Drop for CudaSessionGuard {
    fn drop(&mut self) {
        let _held = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `session` is dropped exactly once, here, and never used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.session) }
    }
}

impl From<Session> for BackendSession {
    fn from(session: Session) -> Self {
        BackendSession::Cpu(session)
    }
}

impl BackendSession {
    /// Tokens already processed (the next token's position).
    pub fn position(&self) -> usize {
        match self {
            BackendSession::Cpu(s) => s.position,
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(s) => s.session.position,
        }
    }

    /// Bytes held by the session's caches and states (KV caches, GDN and PLE states), on the
    /// device that runs it.
    pub fn state_bytes(&self) -> usize {
        match self {
            BackendSession::Cpu(s) => s.state_bytes(),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(s) => s.session.state_bytes(),
        }
    }

    /// The CPU session, when this is one.
    pub fn cpu(&self) -> Option<&Session> {
        match self {
            BackendSession::Cpu(s) => Some(s),
            #[cfg(feature = "cuda")]
            BackendSession::Cuda(_) => None,
        }
    }
}

impl Backend {
    /// Loads the model in `dir` onto `device` with `options`. On CUDA only `options.quant` is
    /// used; options only the CPU engine has are refused by name (see [`cuda_refusal`]), and a
    /// machine without CUDA gets the CUDA engine's "CUDA is not available" error before any
    /// weight is read.
    pub fn load(dir: &Path, device: Device, options: &LoadOptions) -> Result<Self> {
        Self::load_layers(dir, device, options, None)
    }

    /// [`Backend::load`], keeping only the first `layers` layers when given (the per-layer
    /// costs of a truncated model, for the bench). The CPU engine runs whole models only.
    pub fn load_layers(
        dir: &Path,
        device: Device,
        options: &LoadOptions,
        layers: Option<usize>,
    ) -> Result<Self> {
        match device {
            Device::Cpu => {
                if let Some(n) = layers {
                    return Err(RuntimeError::Unsupported(format!(
                        "--layers {n} is not available with --device cpu: the CPU engine runs whole models (use --device cuda)"
                    )));
                }
                Ok(Backend::Cpu(Engine::load_with(dir, options)?))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                if let Some(reason) = cuda_refusal(dir, options) {
                    return Err(RuntimeError::Unsupported(reason));
                }
                let engine =
                    spindle_cuda::CudaEngine::load_with(dir, ordinal, options.quant, layers)?;
                tracing::info!(
                    device = %engine.device_name(),
                    graphs = engine.uses_graphs(),
                    "model loaded onto CUDA device {ordinal}"
                );
                Ok(Backend::Cuda(CudaBackend {
                    engine,
                    ordinal,
                    lock: Arc::new(Mutex::new(())),
                }))
            }
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Backend::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Device::Cuda(c.ordinal),
        }
    }

    /// The processor by name: `cpu`, or the GPU's, e.g. `NVIDIA H200 (sm_90)`.
    pub fn device_name(&self) -> String {
        match self {
            Backend::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine.device_name(),
        }
    }

    /// The device in words: `cpu`, or e.g. `cuda:0 (NVIDIA H200 (sm_90))`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => format!("cuda:{} ({})", c.ordinal, c.engine.device_name()),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Backend::Cpu(e) => e.config(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine.config(),
        }
    }

    /// The CPU engine, when the model runs on the CPU.
    pub fn cpu(&self) -> Option<&Engine> {
        match self {
            Backend::Cpu(e) => Some(e),
            #[cfg(feature = "cuda")]
            Backend::Cuda(_) => None,
        }
    }

    /// A fresh session (empty caches). On CUDA this allocates device memory and may fail.
    pub fn new_session(&self) -> Result<BackendSession> {
        self.new_session_with_capacity(0)
    }

    /// A fresh session whose caches already hold `tokens` tokens where the backend allocates
    /// them ahead (CUDA: a captured decode graph stays valid until the context passes them;
    /// the CPU's caches grow as they fill).
    pub fn new_session_with_capacity(&self, tokens: usize) -> Result<BackendSession> {
        match self {
            Backend::Cpu(e) => {
                let _grown_as_filled = tokens;
                Ok(BackendSession::Cpu(e.new_session()))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => {
                let _held = c.lock.lock().unwrap_or_else(|e| e.into_inner());
                let session = if tokens == 0 {
                    c.engine.new_session()?
                } else {
                    c.engine.new_session_with_capacity(tokens)?
                };
                Ok(BackendSession::Cuda(Box::new(CudaSessionGuard {
                    session: ManuallyDrop::new(session),
                    lock: Arc::clone(&c.lock),
                })))
            }
        }
    }

    /// Feeds `ids` to `session` and returns logits `[rows, V]` on the host for the positions
    /// `want` asks for (the same values on every backend, within float rounding). The input is
    /// checked here, once, before any backend runs: an empty input, a token outside the
    /// vocabulary or a sequence past the context is refused by name.
    pub fn forward(
        &self,
        session: &mut BackendSession,
        ids: &[u32],
        want: LogitsFor,
    ) -> Result<Vec<f32>> {
        check_input(self.config(), session.position(), ids)?;
        match (self, session) {
            (Backend::Cpu(e), BackendSession::Cpu(s)) => Ok(e.forward(s, ids, want)?),
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => {
                let _held = c.lock.lock().unwrap_or_else(|e| e.into_inner());
                Ok(c.engine.forward(&mut s.session, ids, want)?)
            }
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    /// Feeds one token and returns the greedy next token ([`argmax`] of its logits): on the
    /// CPU from the logits row, on CUDA chosen on the device (4 bytes come back instead of the
    /// row; the device argmax keeps the lowest index on ties, as [`argmax`] does).
    pub fn decode_greedy(&self, session: &mut BackendSession, id: u32) -> Result<u32> {
        check_input(self.config(), session.position(), &[id])?;
        match (self, session) {
            (Backend::Cpu(e), BackendSession::Cpu(s)) => {
                Ok(argmax(&e.forward(s, &[id], LogitsFor::Last)?) as u32)
            }
            #[cfg(feature = "cuda")]
            (Backend::Cuda(c), BackendSession::Cuda(s)) => {
                let _held = c.lock.lock().unwrap_or_else(|e| e.into_inner());
                Ok(c.engine.decode_argmax(&mut s.session, id)?)
            }
            #[cfg(feature = "cuda")]
            (backend, _) => Err(backend.foreign_session()),
        }
    }

    #[cfg(feature = "cuda")]
    fn foreign_session(&self) -> RuntimeError {
        RuntimeError::Request(format!(
            "a session of another backend was given to the model on {}",
            self.device()
        ))
    }

    /// Prefills `prompt` in a fresh session and decodes `steps` tokens greedily, one at a time
    /// with the cache, in the layout of the fixtures' `reference.safetensors`.
    pub fn greedy(&self, prompt: &[u32], steps: usize) -> Result<GreedyRun> {
        let mut session = self.new_session()?;
        GreedyRun::collect(self.config().vocab_size, prompt, steps, |ids, want| {
            self.forward(&mut session, ids, want)
        })
    }

    /// Average bytes of weights one decode step reads (routed experts counted top_k / E).
    pub fn weight_bytes_per_token(&self) -> usize {
        match self {
            Backend::Cpu(e) => e.weight_bytes_per_token(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine.weight_bytes_per_token(),
        }
    }

    /// Waits until the work queued on the device is done (a no-op on the CPU, whose forward
    /// pass returns when it is done).
    pub fn sync(&self) -> Result<()> {
        match self {
            Backend::Cpu(_) => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Ok(c.engine.sync()?),
        }
    }

    /// Read bandwidth of the memory the weights live in, bytes/s, measured now over a fresh
    /// `bytes`-byte buffer: on the CPU the median of parallel passes summing host memory
    /// ([`measure_read_bandwidth`]), on CUDA the best pass of a read kernel over device memory.
    pub fn measure_bandwidth(&self, bytes: usize) -> Result<f64> {
        match self {
            Backend::Cpu(_) => Ok(measure_read_bandwidth(bytes)),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Ok(c.engine.measure_bandwidth(bytes)?),
        }
    }

    /// Whether decode steps replay a captured CUDA graph (never on the CPU).
    pub fn uses_graphs(&self) -> bool {
        match self {
            Backend::Cpu(_) => false,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.engine.uses_graphs(),
        }
    }

    /// The kernel time recorded since the last call, by kernel and grid, largest first: CUDA
    /// with `SPINDLE_CUDA_PROFILE=1` (every launch timed, no graphs); empty otherwise.
    pub fn kernel_profile(&self) -> Result<Vec<KernelTime>> {
        match self {
            Backend::Cpu(_) => Ok(Vec::new()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Ok(c
                .engine
                .device()
                .profile_report()?
                .into_iter()
                .map(|k| KernelTime {
                    name: k.name,
                    grid: k.grid,
                    calls: k.calls,
                    total_us: k.total_us,
                })
                .collect()),
        }
    }

    /// The CPU engine's expert counters (slot-cache hits and misses); `None` on CUDA, where
    /// every expert is resident in GPU memory.
    pub fn expert_counters(&self) -> Option<Arc<ExpertCounters>> {
        self.cpu().map(Engine::expert_counters)
    }

    /// Expert lookups since load; `None` on CUDA.
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        self.cpu().map(Engine::expert_stats)
    }

    /// Where the routed experts live on the CPU; `None` on CUDA.
    pub fn expert_placement(&self) -> Option<Placement> {
        self.cpu().map(Engine::expert_placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_refuses_cpu_only_options_by_name() {
        let dir = Path::new("no-such-checkpoint");
        assert_eq!(cuda_refusal(dir, &LoadOptions::default()), None);
        let auto = LoadOptions {
            experts: ExpertResidency::Auto,
            ..LoadOptions::default()
        };
        assert_eq!(cuda_refusal(dir, &auto), None);
        for (experts, name) in [
            (ExpertResidency::Streamed, "--experts streamed"),
            (ExpertResidency::Mapped, "--experts mapped"),
        ] {
            let options = LoadOptions {
                experts,
                ..LoadOptions::default()
            };
            let why = cuda_refusal(dir, &options).expect("refused");
            assert!(why.contains(name) && why.contains("--device cpu"), "{why}");
        }
        let slots = LoadOptions {
            expert_slots: Some(8),
            ..LoadOptions::default()
        };
        let why = cuda_refusal(dir, &slots).expect("refused");
        assert!(why.contains("--expert-slots 8"), "{why}");
    }

    #[test]
    fn cuda_refuses_an_install_naming_the_directory() {
        let tmp = std::env::temp_dir().join(format!("spindle-backend-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("manifest.json"), "{}").unwrap();
        let why = cuda_refusal(&tmp, &LoadOptions::default()).expect("refused");
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            why.contains("spindle install")
                && why.contains("Hugging Face")
                && why.contains("--device cpu")
                && why.contains(&tmp.display().to_string()),
            "{why}"
        );
    }
}
