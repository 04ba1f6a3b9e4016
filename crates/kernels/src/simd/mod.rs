//! Instruction-set selection for the fast kernels: detected once at run time, overridable with
//! `SPINDLE_SIMD=scalar|avx2|avx512|neon` (a path the CPU lacks falls back to the best it has).
//!
//! Every `#[target_feature]` function in the submodules is reached only through an [`Isa`]
//! value for which [`Isa::available`] returned true.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_ggml;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_direct;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod scalar;

use std::sync::OnceLock;

/// A kernel family. `Avx2` means AVX2 + FMA + F16C; `Avx512` means AVX-512 F/BW/VNNI on top
/// of those; `Neon` is the aarch64 baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
    Neon,
}

impl Isa {
    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest path this CPU runs.
    pub fn best() -> Isa {
        [Isa::Avx512, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// The path the kernels use: `SPINDLE_SIMD` when set and available, else [`Isa::best`].
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let Ok(name) = std::env::var("SPINDLE_SIMD") else {
                return Isa::best();
            };
            let wanted = match name.as_str() {
                "scalar" => Isa::Scalar,
                "avx2" => Isa::Avx2,
                "avx512" => Isa::Avx512,
                "neon" => Isa::Neon,
                other => {
                    tracing::warn!(
                        "SPINDLE_SIMD={other:?} is not one of scalar|avx2|avx512|neon; ignored"
                    );
                    return Isa::best();
                }
            };
            if wanted.available() {
                wanted
            } else {
                tracing::warn!(
                    "SPINDLE_SIMD={name}: this CPU lacks it; using {:?}",
                    Isa::best()
                );
                Isa::best()
            }
        })
    }

    /// Every path this CPU runs (tests cover each).
    pub fn all_available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|i| i.available())
            .collect()
    }
}
