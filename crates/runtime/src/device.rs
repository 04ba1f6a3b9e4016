//! `Device`: which backend runs a model, as `--device` spells it (`cpu`, `cuda`, `cuda:N`).
//! Parsed once here for every front end (the CLI's `run`, `serve`, `logits` and `bench`).

use std::fmt;
use std::str::FromStr;

/// Where a model runs: the CPU, or CUDA GPU N in a build with the `cuda` feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU engine (every feature: installs, expert streaming, SIMD kernels).
    #[default]
    Cpu,
    /// CUDA GPU N (Hugging Face checkpoints only, every expert in GPU memory).
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

impl Device {
    /// The devices this build accepts, for messages.
    pub const AVAILABLE: &'static str = if cfg!(feature = "cuda") {
        "cpu, cuda, cuda:N"
    } else {
        "cpu"
    };
}

fn is_cuda(s: &str) -> bool {
    s == "cuda" || s.starts_with("cuda:")
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (GPU 0) or `cuda:N`; an error names the text and lists the devices this
    /// build has (a build without the `cuda` feature names the feature for `cuda[:N]`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let available = Device::AVAILABLE;
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
                "device {cuda:?} is not available: this spindle was built without the CUDA backend (build with `--features cuda`; available devices: {available})"
            )),
            other => Err(format!(
                "unknown device {other:?} (available devices: {available})"
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_print_as_the_flag_spells_them() {
        assert_eq!(Device::Cpu.to_string(), "cpu");
        assert_eq!(Device::default(), Device::Cpu);
        #[cfg(feature = "cuda")]
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn cpu_is_always_accepted_and_unknown_devices_list_the_available_ones() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        let tpu = "tpu".parse::<Device>().unwrap_err();
        assert!(
            tpu.contains("unknown device \"tpu\"") && tpu.contains(Device::AVAILABLE),
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
