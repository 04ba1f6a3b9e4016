//! The CUDA context, its stream, the NVRTC-compiled kernels and device buffers.
//!
//! Kernels are CUDA C (`kernels/*.cu`), compiled once per process and architecture by NVRTC
//! and loaded as one module. Buffers are plain `cuMemAlloc(Async)` allocations; kernels take
//! raw device addresses, so a buffer can be addressed at any element offset.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::error::{CudaError, DriverContext, Result};

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

/// A device allocation of `len` elements and its raw address, or a view into a session's
/// workspace (no allocation of its own: nothing is freed when it drops).
pub struct DevBuf<T> {
    slice: Option<CudaSlice<T>>,
    ptr: u64,
    len: usize,
}

impl<T> DevBuf<T> {
    /// The address of element 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The address of element `i`.
    pub fn at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len);
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this buffer owns an allocation (rather than viewing a workspace).
    pub fn is_owned(&self) -> bool {
        self.slice.is_some()
    }
}

/// A bump allocator over a session's workspace: `scratch` buffers of one forward pass are
/// carved out of it in order, so a decode step allocates nothing and its addresses are the
/// same every step (what a captured CUDA graph needs).
#[derive(Clone, Copy, Debug)]
struct Arena {
    base: u64,
    capacity: usize,
    used: usize,
    /// Requests that did not fit (served by real allocations instead).
    overflowed: bool,
}

/// Per-kernel timing (`SPINDLE_CUDA_PROFILE=1`): an event pair around every launch, summed
/// by kernel and grid when [`Device::profile_report`] is asked for. Graphs are off meanwhile.
#[derive(Default)]
struct Profile {
    /// (kernel, grid, start event, end event) per launch.
    records: Vec<(&'static str, Grid, CudaEvent, CudaEvent)>,
}

/// A launch grid.
type Grid = (u32, u32, u32);

/// One line of [`Device::profile_report`].
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub name: &'static str,
    pub grid: (u32, u32, u32),
    pub calls: usize,
    pub total_us: f64,
}

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
}

impl Device {
    /// Opens device `ordinal`, compiling the kernels for its architecture. Fails with a
    /// message naming CUDA when there is no driver, no NVRTC or no such device.
    pub fn open(ordinal: usize) -> Result<Self> {
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
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .during("loading the compiled kernels")?;
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .during("reading the multiprocessor count")? as u32;
        let max_shared = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .during("reading the shared memory limit")? as usize;
        let mut kernels = HashMap::new();
        let mut shared_limits = HashMap::new();
        for name in crate::kernels::declared().map(|k| k.name) {
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
        tracing::info!(ordinal, name = %name, arch = %arch, "CUDA device ready");
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
            tensor_cores: (major >= 8
                && std::env::var_os("SPINDLE_CUDA_TENSOR_CORES").is_none_or(|v| v != "0"))
            .into(),
        })
    }

    /// Whether prefill GEMMs run on the tensor cores (`mma.sync`, sm_80 and later; off with
    /// `SPINDLE_CUDA_TENSOR_CORES=0`, which keeps the SIMT GEMM for comparison).
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(std::sync::atomic::Ordering::Relaxed)
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

    /// The dynamic shared memory kernel `name` may ask for per block.
    pub fn shared_limit(&self, name: &'static str) -> usize {
        *self
            .shared_limits
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not declared in kernels/"))
    }

    /// Blocks for a grid-stride kernel with `wanted` blocks of work: no more than fit on the
    /// GPU at once (extra blocks would only repeat the input staging).
    pub fn resident_grid(
        &self,
        name: &'static str,
        threads: u32,
        shared_bytes: usize,
        wanted: usize,
    ) -> Result<u32> {
        let mut cache = self.occupancy.lock().unwrap_or_else(|e| e.into_inner());
        let per_sm = match cache.get(&(name, threads, shared_bytes)) {
            Some(&n) => n,
            None => {
                let n = self
                    .function(name)
                    .occupancy_max_active_blocks_per_multiprocessor(threads, shared_bytes, None)
                    .during(&format!("reading kernel {name}'s occupancy"))?
                    .max(1);
                cache.insert((name, threads, shared_bytes), n);
                n
            }
        };
        Ok((wanted.max(1) as u64).min(per_sm as u64 * self.sms as u64) as u32)
    }

    fn function(&self, name: &'static str) -> &CudaFunction {
        self.kernels
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not declared in kernels/"))
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

    /// `len` zeroed elements (at least one, so every buffer has an address): a real allocation,
    /// for weights and sequence state.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DevBuf<T>> {
        let slice = self
            .stream
            .alloc_zeros::<T>(len.max(1))
            .during("allocating device memory")?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(&self.stream);
            ptr
        };
        Ok(DevBuf {
            slice: Some(slice),
            ptr,
            len,
        })
    }

    /// `len` elements of scratch for the current forward pass, NOT zeroed when a workspace is
    /// active (every caller overwrites what it allocates); otherwise a zeroed allocation.
    pub fn scratch<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DevBuf<T>> {
        let bytes = (len.max(1) * std::mem::size_of::<T>()).next_multiple_of(256);
        {
            let mut guard = self.arena.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(arena) = guard.as_mut() {
                if arena.used + bytes <= arena.capacity {
                    let ptr = arena.base + arena.used as u64;
                    arena.used += bytes;
                    return Ok(DevBuf {
                        slice: None,
                        ptr,
                        len,
                    });
                }
                if !arena.overflowed {
                    tracing::warn!(
                        capacity = arena.capacity,
                        used = arena.used,
                        bytes,
                        "CUDA workspace full: falling back to allocations"
                    );
                }
                arena.overflowed = true;
            }
        }
        self.zeros(len)
    }

    /// Makes `workspace` the arena `scratch` carves from (until [`Device::end_workspace`]).
    pub fn begin_workspace(&self, workspace: &DevBuf<u8>) {
        *self.arena.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arena {
            base: workspace.ptr(),
            capacity: workspace.len(),
            used: 0,
            overflowed: false,
        });
    }

    /// Stops carving from the workspace; returns (bytes used, whether a request overflowed).
    pub fn end_workspace(&self) -> (usize, bool) {
        match self.arena.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(a) => (a.used, a.overflowed),
            None => (0, false),
        }
    }

    /// A new buffer holding `data`.
    pub fn upload<T: DeviceRepr + ValidAsZeroBits>(&self, data: &[T]) -> Result<DevBuf<T>> {
        let mut buf = self.zeros::<T>(data.len())?;
        self.write(&mut buf, 0, data)?;
        Ok(buf)
    }

    /// Copies `data` into `buf[offset..]`.
    pub fn write<T: DeviceRepr>(
        &self,
        buf: &mut DevBuf<T>,
        offset: usize,
        data: &[T],
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        assert!(
            offset + data.len() <= buf.len.max(1),
            "write past the end of a device buffer"
        );
        self.write_raw(buf.at(offset), data)
    }

    /// Copies `data` to device address `dst` (ordered on the stream).
    pub fn write_raw<T: DeviceRepr>(&self, dst: u64, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` addresses at least `data.len()` elements of a live buffer; a pageable
        // source is staged by the driver before the call returns.
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, data, self.stream.cu_stream()) }
            .during("copying to the device")
    }

    /// Copies `buf[offset..offset + len]` to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &DevBuf<T>,
        offset: usize,
        len: usize,
    ) -> Result<Vec<T>> {
        assert!(
            offset + len <= buf.len.max(1),
            "read past the end of a device buffer"
        );
        self.download_raw(buf.at(offset), len)
    }

    /// Copies `len` elements at device address `src` to the host (waits for the stream).
    pub fn download_raw<T: DeviceRepr + Default + Clone>(
        &self,
        src: u64,
        len: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); len];
        if len > 0 {
            // SAFETY: `src` addresses `len` elements of a live buffer; `out` outlives the
            // copy because the stream is synchronised below before returning.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut out, src, self.stream.cu_stream())
            }
            .during("copying from the device")?;
        }
        self.sync()?;
        Ok(out)
    }

    /// Copies the first `len` elements of `src` into `dst`.
    pub fn copy<T>(&self, src: &DevBuf<T>, dst: &mut DevBuf<T>, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        assert!(
            len <= src.len && len <= dst.len,
            "copy past the end of a device buffer"
        );
        self.copy_raw(src.ptr(), dst.ptr(), len * std::mem::size_of::<T>())
    }

    /// Copies `bytes` bytes between device addresses.
    pub fn copy_raw(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        // SAFETY: both ranges lie in live buffers.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
        }
        .during("copying on the device")
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().during("waiting for the GPU")
    }

    /// Launches kernel `name` on the stream with its arguments in 8-byte slots (the typed
    /// launchers of [`crate::kernels`] build them from the kernel's declaration).
    pub(crate) fn launch_slots(
        &self,
        name: &'static str,
        cfg: crate::kernels::Launch,
        slots: &[u64],
    ) -> Result<()> {
        let func = self.function(name);
        let crate::kernels::Launch {
            grid,
            block,
            shared_bytes,
        } = cfg;
        let mut slots = slots.to_vec();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        let timing = |what| {
            let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            self.stream.record_event(flags).during(what)
        };
        let start = match &self.profile {
            Some(_) => Some(timing("recording a profiling event")?),
            None => None,
        };
        // SAFETY: the argument list matches the kernel's signature (the launcher is generated
        // from its declaration, which tests/nvrtc.rs checks against the PTX), and every
        // address points into a live buffer of the right size.
        unsafe {
            cudarc::driver::result::launch_kernel(
                func.cu_function(),
                grid,
                (block, 1, 1),
                shared_bytes,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .during(&format!("launching kernel {name}"))?;
        if let (Some(profile), Some(start)) = (&self.profile, start) {
            let end = timing("recording a profiling event")?;
            let mut profile = profile.lock().unwrap_or_else(|e| e.into_inner());
            profile.records.push((name, grid, start, end));
        }
        Ok(())
    }

    /// Whether launches are being timed (`SPINDLE_CUDA_PROFILE=1`).
    pub fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    /// The kernel time recorded since the last report, by kernel and grid, largest first;
    /// empty when not profiling.
    pub fn profile_report(&self) -> Result<Vec<KernelTime>> {
        let Some(profile) = &self.profile else {
            return Ok(Vec::new());
        };
        self.sync()?;
        let records =
            std::mem::take(&mut profile.lock().unwrap_or_else(|e| e.into_inner()).records);
        let mut by_kernel: HashMap<(&'static str, (u32, u32, u32)), KernelTime> = HashMap::new();
        for (name, grid, start, end) in records {
            let ms = start.elapsed_ms(&end).during("reading a profiling event")?;
            let line = by_kernel.entry((name, grid)).or_insert(KernelTime {
                name,
                grid,
                calls: 0,
                total_us: 0.0,
            });
            line.calls += 1;
            line.total_us += ms as f64 * 1e3;
        }
        let mut lines: Vec<KernelTime> = by_kernel.into_values().collect();
        lines.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
        Ok(lines)
    }
}

/// Page-locked host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `DEVICEMAP`): kernels read it across the bus at [`MappedHost::ptr`], with no copy and no
/// host code per use. For data too large for VRAM that a step reads a few rows of.
pub struct MappedHost {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
    dev_ptr: u64,
    bytes: usize,
}

// SAFETY: the allocation is owned by this value alone; the host side is written only through
// `&mut self` and read by kernels, so sharing or moving it between threads is sound.
unsafe impl Send for MappedHost {}
// SAFETY: as above: `&self` gives out only the device address.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// The device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.dev_ptr
    }

    /// The memory, for filling from the host.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `host` points to `bytes` bytes allocated by cuMemHostAlloc and owned here;
        // the exclusive borrow keeps any other host access out.
        unsafe { std::slice::from_raw_parts_mut(self.host as *mut u8, self.bytes) }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // No kernel may still be reading the memory: wait for the whole context.
        if let Err(e) = self.ctx.synchronize() {
            tracing::warn!(error = %e, "waiting for the GPU before freeing mapped host memory");
            return;
        }
        // SAFETY: `host` came from cuMemHostAlloc and is freed once, here, with no kernel in
        // flight (synchronised above).
        if let Err(e) = unsafe { cudarc::driver::result::free_host(self.host) } {
            tracing::warn!(error = %e, "freeing mapped host memory");
        }
    }
}

impl Device {
    /// `bytes` bytes of page-locked host memory mapped into the device (uninitialised until
    /// the caller fills it through [`MappedHost::bytes_mut`]).
    pub fn mapped_host(&self, bytes: usize) -> Result<MappedHost> {
        use cudarc::driver::sys;
        self.ctx
            .bind_to_thread()
            .during("binding the CUDA context")?;
        let what = format!("allocating {bytes} bytes of mapped, page-locked host memory");
        // SAFETY: a plain allocation; the memory is only handed out as bytes (any value valid).
        let host = unsafe {
            cudarc::driver::result::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .during(&what)?;
        let mut dev_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a live DEVICEMAP allocation of this (current) context.
        let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev_ptr, host, 0) }.result();
        let buf = MappedHost {
            ctx: self.ctx.clone(),
            host,
            dev_ptr,
            bytes,
        };
        mapped.during("mapping page-locked host memory into the device")?;
        Ok(buf)
    }
}

/// Threads for a block that covers `n` elements (a multiple of 32, at most 1024).
pub fn threads_for(n: usize) -> u32 {
    n.next_multiple_of(32).clamp(32, 1024) as u32
}
