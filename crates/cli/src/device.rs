//! `--device`: which backend runs the model, for every command that runs one (`run`, `serve`,
//! `logits`, `bench`).

use std::fmt;
use std::str::FromStr;

/// The backends a command can run a model on: the CPU, and CUDA GPU N in a build with the
/// `cuda` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

/// The devices `--device` accepts, for messages.
pub const AVAILABLE: &str = if cfg!(feature = "cuda") {
    "cpu, cuda, cuda:N"
} else {
    "cpu"
};

fn is_cuda(s: &str) -> bool {
    s == "cuda" || s.starts_with("cuda:")
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            #[cfg(feature = "cuda")]
            cuda if is_cuda(cuda) => match cuda.strip_prefix("cuda:") {
                None => Ok(Device::Cuda(0)),
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| {
                    format!(
                        "device {cuda:?}: {n:?} is not a CUDA device number (expected e.g. cuda:0)"
                    )
                }),
            },
            #[cfg(not(feature = "cuda"))]
            cuda if is_cuda(cuda) => Err(format!(
                "device {cuda:?} is not available: this spindle was built without the CUDA backend (build with `--features cuda`; available devices: {AVAILABLE})"
            )),
            other => Err(format!(
                "unknown device {other:?} (available devices: {AVAILABLE})"
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        spindle_runtime::Device::from(*self).fmt(f)
    }
}

impl From<Device> for spindle_runtime::Device {
    fn from(device: Device) -> Self {
        match device {
            Device::Cpu => spindle_runtime::Device::Cpu,
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => spindle_runtime::Device::Cuda(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_accepted_and_unknown_devices_list_the_available_ones() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!(Device::Cpu.to_string(), "cpu");
        let tpu = "tpu".parse::<Device>().unwrap_err();
        assert!(
            tpu.contains("unknown device \"tpu\"") && tpu.contains(AVAILABLE),
            "{tpu}"
        );
        assert!("gpu".parse::<Device>().is_err());
        assert!("cudax".parse::<Device>().is_err());
    }

    #[test]
    fn cuda_is_taken_only_when_built_with_it() {
        #[cfg(feature = "cuda")]
        {
            assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
            assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
            assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
            assert_eq!(
                spindle_runtime::Device::from(Device::Cuda(1)),
                spindle_runtime::Device::Cuda(1)
            );
            let bad = "cuda:x".parse::<Device>().unwrap_err();
            assert!(bad.contains("\"x\"") && bad.contains("cuda:0"), "{bad}");
            assert!("cuda:-1".parse::<Device>().is_err());
        }
        #[cfg(not(feature = "cuda"))]
        for name in ["cuda", "cuda:1"] {
            let err = name.parse::<Device>().unwrap_err();
            assert!(
                err.contains("without the CUDA backend")
                    && err.contains("--features cuda")
                    && err.contains(&format!("{name:?}"))
                    && err.contains("available devices: cpu"),
                "{err}"
            );
        }
    }
}
