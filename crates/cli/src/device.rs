//! `--device`: which backend runs the model.

use std::fmt;
use std::str::FromStr;

/// The backends this build of spindle can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
}

/// The devices `--device` accepts, for messages.
pub const AVAILABLE: &str = "cpu";

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Device::Cpu),
            cuda if cuda == "cuda" || cuda.starts_with("cuda:") => Err(format!(
                "device {cuda:?} is not available: the CUDA backend is not built yet (available devices: {AVAILABLE})"
            )),
            other => Err(format!("unknown device {other:?} (available devices: {AVAILABLE})")),
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
}
