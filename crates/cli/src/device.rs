//! `--device`: which backend runs the model.

use std::fmt;
use std::str::FromStr;

/// The backends `spindle run` and `spindle bench` can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
}

/// The devices `--device` of `run` and `bench` accepts, for messages.
pub const AVAILABLE: &str = "cpu";

/// Why `cuda[:N]` is refused where it is refused.
fn cuda_unavailable(name: &str, available: &str) -> String {
    if cfg!(feature = "cuda") {
        format!(
            "device {name:?} is not available for this command: the CUDA backend runs `spindle logits` only so far (available devices: {available})"
        )
    } else {
        format!(
            "device {name:?} is not available: this spindle was built without the CUDA backend (build with `--features cuda`; available devices: {available})"
        )
    }
}

fn is_cuda(s: &str) -> bool {
    s == "cuda" || s.starts_with("cuda:")
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            cuda if is_cuda(cuda) => Err(cuda_unavailable(cuda, AVAILABLE)),
            other => Err(format!(
                "unknown device {other:?} (available devices: {AVAILABLE})"
            )),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
        }
    }
}

/// The backends `spindle logits` can run on: the CPU, and CUDA GPU N in a build with the
/// `cuda` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsDevice {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

/// The devices `spindle logits --device` accepts, for messages.
pub const LOGITS_AVAILABLE: &str = if cfg!(feature = "cuda") {
    "cpu, cuda, cuda:N"
} else {
    "cpu"
};

impl FromStr for LogitsDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(LogitsDevice::Cpu),
            #[cfg(feature = "cuda")]
            cuda if is_cuda(cuda) => match cuda.strip_prefix("cuda:") {
                None => Ok(LogitsDevice::Cuda(0)),
                Some(n) => n.parse().map(LogitsDevice::Cuda).map_err(|_| {
                    format!(
                        "device {cuda:?}: {n:?} is not a CUDA device number (expected e.g. cuda:0)"
                    )
                }),
            },
            #[cfg(not(feature = "cuda"))]
            cuda if is_cuda(cuda) => Err(cuda_unavailable(cuda, LOGITS_AVAILABLE)),
            other => Err(format!(
                "unknown device {other:?} (available devices: {LOGITS_AVAILABLE})"
            )),
        }
    }
}

/// The backends `spindle bench` can run on: as `spindle logits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchDevice {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(usize),
}

impl FromStr for BenchDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.parse::<LogitsDevice>()? {
            LogitsDevice::Cpu => BenchDevice::Cpu,
            #[cfg(feature = "cuda")]
            LogitsDevice::Cuda(n) => BenchDevice::Cuda(n),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cpu_is_accepted_and_errors_list_the_devices() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        let cuda = "cuda:1".parse::<Device>().unwrap_err();
        assert!(
            cuda.contains("cuda:1") && cuda.contains("available devices: cpu"),
            "{cuda}"
        );
        let tpu = "tpu".parse::<Device>().unwrap_err();
        assert!(
            tpu.contains("unknown device \"tpu\"") && tpu.contains("cpu"),
            "{tpu}"
        );
    }

    #[test]
    fn bench_device_parses_as_logits_device() {
        assert_eq!("cpu".parse::<BenchDevice>(), Ok(BenchDevice::Cpu));
        assert!("tpu".parse::<BenchDevice>().is_err());
        #[cfg(feature = "cuda")]
        assert_eq!("cuda:2".parse::<BenchDevice>(), Ok(BenchDevice::Cuda(2)));
        #[cfg(not(feature = "cuda"))]
        assert!("cuda".parse::<BenchDevice>().is_err());
    }

    #[test]
    fn logits_device_takes_cuda_only_when_built_with_it() {
        assert_eq!("cpu".parse::<LogitsDevice>(), Ok(LogitsDevice::Cpu));
        assert!("tpu".parse::<LogitsDevice>().is_err());
        #[cfg(feature = "cuda")]
        {
            assert_eq!("cuda".parse::<LogitsDevice>(), Ok(LogitsDevice::Cuda(0)));
            assert_eq!("cuda:3".parse::<LogitsDevice>(), Ok(LogitsDevice::Cuda(3)));
            let bad = "cuda:x".parse::<LogitsDevice>().unwrap_err();
            assert!(bad.contains("\"x\""), "{bad}");
        }
        #[cfg(not(feature = "cuda"))]
        {
            let err = "cuda:1".parse::<LogitsDevice>().unwrap_err();
            assert!(
                err.contains("without the CUDA backend") && err.contains("cuda:1"),
                "{err}"
            );
        }
    }
}
