//! The CUDA device: its context and the stream every operation runs on, with the kernels
//! compiled for it (`compile`), its buffers (`buffer`), kernel launches (`launch`) and the
//! per-kernel profiler (`profile`).
//!
//! Kernels are CUDA C (`kernels/*.cu`), compiled once per process and architecture by NVRTC
//! and loaded as one module. Buffers are plain `cuMemAlloc(Async)` allocations; kernels take
//! raw device addresses, so a buffer can be addressed at any element offset.

mod buffer;
mod compile;
mod launch;
mod pdl;
mod profile;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaError, DriverContext, Result};

use buffer::Arena;
pub use buffer::{DevBuf, MappedHost};
pub use compile::compile;
pub use launch::{threads_for, Launch};
use profile::Profile;

/// One CUDA device: context, the stream every operation runs on, and the loaded kernels.
pub struct Device {
    arena: Mutex<Option<Arena>>,
    profile: Option<Mutex<Profile>>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: HashMap<&'static str, CudaFunction>,
    name: String,
    arch: String,
    /// Streaming multiprocessors.
    sms: u32,
    /// The dynamic shared memory a block of each kernel may ask for (opted in at open).
    shared_limits: HashMap<&'static str, usize>,
    /// Resident blocks per multiprocessor, by (kernel, threads, dynamic shared bytes).
    occupancy: Mutex<HashMap<(&'static str, u32, usize), u32>>,
    /// Prefill GEMMs run on the tensor cores (sm_80 and later, unless
    /// `SPINDLE_CUDA_TENSOR_CORES=0`).
    tensor_cores: std::sync::atomic::AtomicBool,
    /// The tensor cores take e4m3 operands (sm_89 and later): FP8 prefill GEMMs use them
    /// unless `SPINDLE_CUDA_FP8_MMA=0` (the weight-only FP8 kernels then run every batch).
    fp8_mma: std::sync::atomic::AtomicBool,
    /// Inside a batched step: projections and MoE blocks of more than MATVEC_MAX_TOKENS but
    /// at most this many rows run as decode matvecs in groups of MATVEC_MAX_TOKENS rows
    /// instead of the tensor-core GEMM (0: never).
    small_batch_rows: std::sync::atomic::AtomicUsize,
    /// Inside a batched step of decoding sequences only (one token each): larger MoE blocks
    /// group their routed experts with the small-batch kernels (`moe::routed_small`).
    decode_step: std::sync::atomic::AtomicBool,
    /// Decode matvecs of more than MATVEC_MAX_TOKENS rows run as one launch (a row of blocks
    /// per group of rows) rather than a launch per group (`SPINDLE_CUDA_DECODE_GROUP_LAUNCH=0`,
    /// for A/B measurements: the same bits either way).
    group_launch: std::sync::atomic::AtomicBool,
    /// Q8/Q4 decode matvecs of at least this many rows (never fewer than TCD_TOKENS) run their
    /// integer dot products on the tensor cores (`matvec_tc.cu`; 0: none do). sm_80 and later;
    /// `SPINDLE_CUDA_TC_DECODE=0` turns it off and `=N` sets N, for A/B measurements: the same
    /// bits either way.
    tc_decode_rows: std::sync::atomic::AtomicUsize,
    /// The device has int8 tensor cores (`mma.sync` s8, sm_80 and later).
    int8_mma: bool,
    /// Tensor-core GEMMs of a few rows (dense up to two skinny tiles, grouped experts that see
    /// few pairs each) run on 16-row tiles (`gemm_tensor_skinny_*`) instead of 64-row ones:
    /// the same sums. Off unless `SPINDLE_CUDA_SKINNY_GEMM=1` until the device has run the
    /// `kernels` test's bit-for-bit comparison and measured it (written 2026-12-02 after the
    /// session's device time ran out).
    skinny_gemm: std::sync::atomic::AtomicBool,
    /// Kernels launched with programmatic stream serialization ([`Device::pdl`]): those whose
    /// PTX waits on their predecessor (`pdl.rs`).
    pdl_kernels: HashSet<&'static str>,
    /// The device takes programmatic dependent launches (sm_90 and later).
    pdl_able: bool,
    /// Programmatic dependent launch is on (`SPINDLE_CUDA_PDL=0` turns it off).
    pdl: std::sync::atomic::AtomicBool,
}

/// The fewest rows of a Q8/Q4 decode matvec that run on the tensor cores by default: at 64
/// rows they made the 40-layer 35B-A3B q4 step 2.7% faster, at 16 rows 12% slower (H200,
/// 2026-12-02, `docs/benchmarks/cuda-h200.md`).
pub(crate) const TC_DECODE_ROWS: usize = 64;

/// [`TC_DECODE_ROWS`], or what `SPINDLE_CUDA_TC_DECODE` says: 0 (off) or a row count (the
/// matvec takes at least its own tile's rows: `matvec::tc_decode_kernel`); a value that is
/// neither is reported and the default kept.
fn tc_decode_rows_from_env() -> usize {
    match std::env::var("SPINDLE_CUDA_TC_DECODE") {
        Err(_) => TC_DECODE_ROWS,
        Ok(v) => match v.parse::<usize>() {
            Ok(0) => 0,
            Ok(n) => n,
            Err(_) => {
                tracing::warn!(
                    value = %v,
                    "SPINDLE_CUDA_TC_DECODE takes 0 (off) or a row count; keeping {TC_DECODE_ROWS}"
                );
                TC_DECODE_ROWS
            }
        },
    }
}

impl Device {
    /// Opens device `ordinal` and loads `kernels` from the PTX `ptx_for` gives for its
    /// architecture ([`Device::open`] passes the crate's kernels). Fails with a message naming
    /// CUDA when there is no driver, no NVRTC or no such device.
    pub(crate) fn open_with(
        ordinal: usize,
        ptx_for: fn(&str) -> Result<String>,
        kernels: &[&'static str],
    ) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library; cudarc panics later without it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        // SAFETY: as above, for libnvrtc.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(CudaError::NoNvrtc);
        }
        cudarc::driver::result::init().during("initialising the CUDA driver (cuInit)")?;
        let count = CudaContext::device_count().during("counting CUDA devices")? as usize;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).during("creating the CUDA context")?;
        // One stream, ordered: the per-buffer events cudarc records are not needed.
        // SAFETY: no buffer exists yet, and every operation runs on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().during("creating a CUDA stream")?;
        let (major, minor) = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let arch = format!("sm_{major}{minor}");
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let ptx = ptx_for(&arch)?;
        let waiting = pdl::waiting_kernels(&ptx);
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .during("loading the compiled kernels")?;
        if std::env::var_os("SPINDLE_CUDA_L2_PREFETCH").is_some_and(|v| v == "0") {
            // The decode kernels' L2 prefetch of their weights (kernels/common.cuh), off for
            // A/B measurements; the same bits either way.
            let mut flag = module
                .get_global("spindle_l2_prefetch", &stream)
                .during("looking up spindle_l2_prefetch")?;
            stream
                .memcpy_htod(&[0u8; 4], &mut flag)
                .during("turning the L2 prefetch off")?;
            stream.synchronize().during("turning the L2 prefetch off")?;
        }
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("reading the multiprocessor count")? as u32;
        let max_shared = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .during("reading the shared memory limit")? as usize;
        let names = kernels;
        let mut kernels = HashMap::new();
        let mut shared_limits = HashMap::new();
        for &name in names {
            let func = module
                .load_function(name)
                .during(&format!("looking up kernel {name}"))?;
            // Opt in to all the shared memory a block can have (the decode kernels stage
            // their inputs there); the launch still asks only for what it needs.
            let static_bytes = func
                .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                .during(&format!("reading kernel {name}'s shared memory"))?
                as usize;
            let limit = max_shared.saturating_sub(static_bytes);
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                limit as i32,
            )
            .during(&format!("raising kernel {name}'s shared memory limit"))?;
            kernels.insert(name, func);
            shared_limits.insert(name, limit);
        }
        let pdl_kernels: HashSet<&'static str> = names
            .iter()
            .copied()
            .filter(|n| waiting.contains(*n))
            .collect();
        let pdl_able = major >= 9;
        tracing::info!(
            ordinal,
            name = %name,
            arch = %arch,
            pdl_kernels = pdl_kernels.len(),
            "CUDA device ready"
        );
        let profile = std::env::var_os("SPINDLE_CUDA_PROFILE")
            .is_some_and(|v| v != "0")
            .then(|| Mutex::new(Profile::default()));
        Ok(Device {
            arena: Mutex::new(None),
            profile,
            ctx,
            stream,
            kernels,
            name,
            arch,
            sms,
            shared_limits,
            occupancy: Mutex::new(HashMap::new()),
            small_batch_rows: 0.into(),
            decode_step: false.into(),
            group_launch: std::env::var_os("SPINDLE_CUDA_DECODE_GROUP_LAUNCH")
                .is_none_or(|v| v != "0")
                .into(),
            int8_mma: major >= 8,
            skinny_gemm: std::env::var_os("SPINDLE_CUDA_SKINNY_GEMM")
                .is_some_and(|v| v == "1")
                .into(),
            tc_decode_rows: if major >= 8 {
                tc_decode_rows_from_env()
            } else {
                0
            }
            .into(),
            tensor_cores: (major >= 8
                && std::env::var_os("SPINDLE_CUDA_TENSOR_CORES").is_none_or(|v| v != "0"))
            .into(),
            pdl: pdl::enabled_for((major, minor)).into(),
            pdl_kernels,
            pdl_able,
            fp8_mma: ((major, minor) >= (8, 9)
                && std::env::var_os("SPINDLE_CUDA_FP8_MMA").is_none_or(|v| v != "0"))
            .into(),
        })
    }

    /// Whether prefill GEMMs run on the tensor cores (`mma.sync`, sm_80 and later; off with
    /// `SPINDLE_CUDA_TENSOR_CORES=0`, which keeps the SIMT GEMM for comparison).
    pub fn small_batch_rows(&self) -> usize {
        self.small_batch_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Device::small_batch_rows`] (batched steps set it for their length).
    pub fn set_small_batch_rows(&self, rows: usize) {
        self.small_batch_rows
            .store(rows, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether decode matvecs of more than MATVEC_MAX_TOKENS rows run as one launch.
    pub fn group_launch(&self) -> bool {
        self.group_launch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Device::group_launch`].
    pub fn set_group_launch(&self, on: bool) {
        self.group_launch
            .store(on, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether tensor-core GEMMs of a few rows run on 16-row tiles (see the field; the same
    /// bits either way).
    pub fn skinny_gemm(&self) -> bool {
        self.skinny_gemm.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Device::skinny_gemm`] (tests compare the two tilings bit for bit).
    pub fn set_skinny_gemm(&self, on: bool) {
        self.skinny_gemm
            .store(on, std::sync::atomic::Ordering::Relaxed)
    }

    /// The fewest rows of a Q8/Q4 decode matvec that run on the tensor cores (`matvec_tc.cu`);
    /// 0 when none do.
    pub fn tc_decode_rows(&self) -> usize {
        self.tc_decode_rows
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Device::tc_decode_rows`]: 0 turns the tensor-core decode matvec off (a count
    /// below the kernel's tile of rows acts as that tile); stays 0 where the device has no int8
    /// tensor cores (before sm_80).
    pub fn set_tc_decode_rows(&self, rows: usize) {
        let rows = match rows {
            0 => 0,
            _ if !self.int8_mma => 0,
            n => n,
        };
        self.tc_decode_rows
            .store(rows, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether kernels that wait on their predecessor (`PDL_WAIT()`) are launched with
    /// programmatic stream serialization: on sm_90 and later unless `SPINDLE_CUDA_PDL=0`.
    /// The same bits either way.
    pub fn pdl(&self) -> bool {
        self.pdl.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch off (or back on where the device has it), for
    /// side-by-side comparisons; graphs captured before keep the launches they were made of.
    pub fn set_pdl(&self, on: bool) {
        self.pdl
            .store(on && self.pdl_able, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the device takes programmatic dependent launches (sm_90 and later).
    pub fn pdl_supported(&self) -> bool {
        self.pdl_able
    }

    /// The kernels launched with programmatic stream serialization when [`Device::pdl`] is on.
    pub fn pdl_kernels(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.pdl_kernels.iter().copied().collect();
        names.sort_unstable();
        names
    }

    /// Whether the forward pass being issued is a batched step of decoding sequences only.
    pub fn decode_step(&self) -> bool {
        self.decode_step.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Device::decode_step`] (batched steps set it for their length).
    pub fn set_decode_step(&self, decode: bool) {
        self.decode_step
            .store(decode, std::sync::atomic::Ordering::Relaxed)
    }

    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether FP8 prefill GEMMs run on the e4m3 tensor cores (with [`Device::tensor_cores`]).
    pub fn fp8_tensor_cores(&self) -> bool {
        self.fp8_mma.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns the FP8 tensor-core GEMM off (or back on where the device has it): FP8 weights
    /// then run through the exact weight-only kernels whatever the batch.
    pub fn set_fp8_tensor_cores(&self, on: bool) {
        let able = self.ctx.compute_capability().is_ok_and(|cc| cc >= (8, 9));
        self.fp8_mma
            .store(on && able, std::sync::atomic::Ordering::Relaxed);
    }

    /// Turns the tensor-core GEMMs off (or back on where the device has them), for
    /// side-by-side comparisons.
    pub fn set_tensor_cores(&self, on: bool) {
        let able = self
            .ctx
            .compute_capability()
            .is_ok_and(|(major, _)| major >= 8);
        self.tensor_cores
            .store(on && able, std::sync::atomic::Ordering::Relaxed);
    }

    /// e.g. "NVIDIA H200 (sm_90)".
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().during("waiting for the GPU")
    }
}
