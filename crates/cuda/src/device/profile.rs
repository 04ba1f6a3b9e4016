//! Per-kernel timing (`SPINDLE_CUDA_PROFILE=1`).

use std::collections::HashMap;

use cudarc::driver::CudaEvent;

use super::Device;
use crate::error::{DriverContext, Result};

/// Per-kernel timing (`SPINDLE_CUDA_PROFILE=1`): an event pair around every launch, summed
/// by kernel and grid when [`Device::profile_report`] is asked for. Graphs are off meanwhile.
#[derive(Default)]
pub(super) struct Profile {
    /// (kernel, grid, start event, end event) per launch.
    pub(super) records: Vec<(&'static str, Grid, CudaEvent, CudaEvent)>,
}

/// A launch grid.
pub(super) type Grid = (u32, u32, u32);

/// One line of [`Device::profile_report`].
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub name: &'static str,
    pub grid: (u32, u32, u32),
    pub calls: usize,
    pub total_us: f64,
}

impl Device {
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
