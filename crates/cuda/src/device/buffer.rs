//! Device buffers: owned allocations, views into a session's workspace (a bump arena), copies
//! between host and device, and page-locked host memory mapped into the device.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::Device;
use crate::error::{DriverContext, Result};

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

    /// `len` elements from element `offset`, viewed (no allocation of its own: valid while
    /// `self` is).
    pub fn view(&self, offset: usize, len: usize) -> DevBuf<T> {
        debug_assert!(offset + len <= self.len);
        DevBuf {
            slice: None,
            ptr: self.at(offset),
            len,
        }
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
pub(super) struct Arena {
    base: u64,
    capacity: usize,
    used: usize,
    /// Requests that did not fit (served by real allocations instead).
    overflowed: bool,
}

impl Device {
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
    /// Copies `len` f32 at device address `src` into a new host vector through `staging`
    /// (page-locked, mapped: a copy from pageable memory runs at a fraction of the bus's
    /// speed), a staging buffer's worth at a time.
    pub fn download_staged(
        &self,
        staging: &mut MappedHost,
        src: u64,
        len: usize,
    ) -> Result<Vec<f32>> {
        let chunk = (staging.bytes / 4).max(1);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = chunk.min(len - out.len());
            self.copy_raw(src + (out.len() * 4) as u64, staging.ptr(), n * 4)?;
            self.sync()?;
            out.extend_from_slice(bytemuck::cast_slice::<u8, f32>(
                &staging.bytes_mut()[..n * 4],
            ));
        }
        Ok(out)
    }

    /// Copies `data` to device address `dst` through `staging` (see
    /// [`Device::download_staged`]).
    pub fn upload_staged(&self, staging: &mut MappedHost, dst: u64, data: &[f32]) -> Result<()> {
        let chunk = (staging.bytes / 4).max(1);
        for (k, part) in data.chunks(chunk).enumerate() {
            let bytes: &[u8] = bytemuck::cast_slice(part);
            staging.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
            self.copy_raw(staging.ptr(), dst + (k * chunk * 4) as u64, bytes.len())?;
            // The staging buffer is refilled next: the copy must have read it.
            self.sync()?;
        }
        Ok(())
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
