//! Kernel launches: the per-kernel shared-memory limits and occupancy, and the launch itself
//! (arguments in 8-byte slots, built by the typed launchers of `kernels`).

use std::ffi::c_void;

use cudarc::driver::CudaFunction;

use super::Device;
use crate::error::{DriverContext, Result};

impl Device {
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

    /// Launches kernel `name` on the stream with its arguments in 8-byte slots (the typed
    /// launchers of `kernels` build them from the kernel's declaration).
    pub(crate) fn launch_slots(
        &self,
        name: &'static str,
        cfg: Launch,
        slots: &[u64],
    ) -> Result<()> {
        let func = self.function(name);
        let Launch {
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
        let mut launched = false;
        if self.pdl() && self.pdl_kernels.contains(name) {
            // SAFETY: as below; the kernel's PTX waits on its predecessor before it touches
            // anything the predecessor may read or write (tests/nvrtc.rs checks the order).
            match unsafe {
                launch_programmatic(
                    func.cu_function(),
                    cfg,
                    self.stream.cu_stream(),
                    &mut params,
                )
            } {
                Ok(()) => launched = true,
                Err(err) => {
                    // A driver that refuses the attribute: plain launches from now on.
                    tracing::warn!(kernel = name, error = %err, "programmatic dependent launch refused: launching plainly");
                    self.set_pdl(false);
                }
            }
        }
        if !launched {
            // SAFETY: the argument list matches the kernel's signature (the launcher is
            // generated from its declaration, which tests/nvrtc.rs checks against the PTX),
            // and every address points into a live buffer of the right size.
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
        }
        if let (Some(profile), Some(start)) = (&self.profile, start) {
            let end = timing("recording a profiling event")?;
            let mut profile = profile.lock().unwrap_or_else(|e| e.into_inner());
            profile.records.push((name, grid, start, end));
        }
        Ok(())
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed: the kernel may start
/// before its predecessor on `stream` has finished (it waits in `griddepcontrol.wait`).
///
/// # Safety
/// As `cudarc::driver::result::launch_kernel`, and the kernel waits on its predecessor before
/// it reads or writes anything the predecessor may touch.
unsafe fn launch_programmatic(
    f: cudarc::driver::sys::CUfunction,
    cfg: Launch,
    stream: cudarc::driver::sys::CUstream,
    params: &mut [*mut c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    // SAFETY: a plain C union of integers; zero is a valid value of every field.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid.0,
        gridDimY: cfg.grid.1,
        gridDimZ: cfg.grid.2,
        blockDimX: cfg.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: cfg.shared_bytes,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `config` and `attr` outlive the call; the caller vouches for the rest.
    unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }.result()
}

/// Threads for a block that covers `n` elements (a multiple of 32, at most 1024).
pub fn threads_for(n: usize) -> u32 {
    n.next_multiple_of(32).clamp(32, 1024) as u32
}

/// A launch's grid, block size (threads, one dimension) and dynamic shared memory (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub shared_bytes: u32,
}

impl Launch {
    pub fn new(grid: (u32, u32, u32), block: u32, shared_bytes: u32) -> Self {
        Launch {
            grid,
            block,
            shared_bytes,
        }
    }

    /// A grid-stride elementwise launch over `n` elements: blocks of 256, at most 65535.
    pub fn elementwise(n: usize) -> Self {
        let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
        Launch::new((blocks, 1, 1), 256, 0)
    }
}
