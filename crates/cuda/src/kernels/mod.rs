//! Every CUDA kernel, declared once: its name and parameter list, from which [`kernels!`]
//! makes a typed launcher (device pointers by element type, `i32`/`u32`/`f32`/`u64` scalars,
//! in the CUDA signature's order) and the list the device loads at open and the NVRTC test
//! checks against the compiled PTX.
//!
//! Each `.cu` file has a Rust module of the same name here declaring its kernels.

use std::marker::PhantomData;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub use crate::device::Launch;
use crate::device::{DevBuf, Device};
use crate::error::Result;

/// Declares kernels. Two forms, one per line:
/// - `Name = "kernel" (args);` a single kernel: `Name::launch(dev, cfg, args..)`, `Name::NAME`;
/// - `Name { A = "kernel_a", B = "kernel_b" } (args);` kernels with one signature (variants
///   of one template): `Name::A.launch(dev, cfg, args..)`, `Name::A.name()`.
///
/// `args` are `name: Type` with `Type` a [`KernelArg`]: `Ptr<T>` for `T*` (`const` or not),
/// `i32` for `int`, `u32` for `unsigned`, `f32` for `float`, `u64` for `unsigned long long`.
macro_rules! kernels {
    () => {};
    (
        $(#[$meta:meta])*
        $ty:ident { $($variant:ident = $name:literal),+ $(,)? }
        ($($arg:ident: $aty:ty),* $(,)?);
        $($rest:tt)*
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $ty(&'static str);

        #[allow(dead_code)]
        impl $ty {
            $(#[doc = concat!("`", $name, "`")] pub const $variant: $ty = $ty($name);)+

            /// The kernel's name in the CUDA sources.
            pub fn name(self) -> &'static str {
                self.0
            }

            /// The parameter list shared by every variant.
            pub const PARAMS: &'static [$crate::kernels::Param] =
                &[$(<$aty as $crate::kernels::KernelArg>::PARAM),*];

            pub(crate) const DECLS: &'static [$crate::kernels::KernelDecl] = &[$(
                $crate::kernels::KernelDecl { name: $name, params: $ty::PARAMS },
            )+];

            /// Launches this kernel on `dev`'s stream with arguments in the CUDA signature's order.
            #[allow(clippy::too_many_arguments)]
            pub fn launch(
                self,
                dev: &$crate::device::Device,
                cfg: $crate::kernels::Launch,
                $($arg: $aty),*
            ) -> $crate::error::Result<()> {
                dev.launch_slots(self.0, cfg, &[$($crate::kernels::KernelArg::slot($arg)),*])
            }
        }

        kernels!($($rest)*);
    };
    (
        $(#[$meta:meta])*
        $ty:ident = $name:literal
        ($($arg:ident: $aty:ty),* $(,)?);
        $($rest:tt)*
    ) => {
        $(#[$meta])*
        #[doc = concat!("Kernel `", $name, "`.")]
        pub struct $ty;

        #[allow(dead_code)]
        impl $ty {
            /// The kernel's name in the CUDA sources.
            pub const NAME: &'static str = $name;

            pub const PARAMS: &'static [$crate::kernels::Param] =
                &[$(<$aty as $crate::kernels::KernelArg>::PARAM),*];

            pub(crate) const DECLS: &'static [$crate::kernels::KernelDecl] =
                &[$crate::kernels::KernelDecl { name: $name, params: $ty::PARAMS }];

            /// Launches the kernel on `dev`'s stream with arguments in the CUDA signature's order.
            #[allow(clippy::too_many_arguments)]
            pub fn launch(
                dev: &$crate::device::Device,
                cfg: $crate::kernels::Launch,
                $($arg: $aty),*
            ) -> $crate::error::Result<()> {
                dev.launch_slots($name, cfg, &[$($crate::kernels::KernelArg::slot($arg)),*])
            }
        }

        kernels!($($rest)*);
    };
}

/// Declares constants that Rust and the CUDA C both use: each becomes a `pub const` here and a
/// `#define` line of the prelude NVRTC compiles before the sources, so the two cannot drift.
macro_rules! shared_constants {
    ($($(#[$meta:meta])* $name:ident = $value:expr;)*) => {
        $($(#[$meta])* pub const $name: usize = $value;)*

        /// Every shared constant by name, as the prelude defines it.
        pub const SHARED_CONSTANTS: &[(&str, usize)] = &[$((stringify!($name), $name)),*];
    };
}

shared_constants! {
    /// The most tokens a forward pass runs through the decode kernels (matvec, decode MoE,
    /// flash-decoding attention, GDN heads); larger passes take the prefill path.
    MATVEC_MAX_TOKENS = 8;
    /// Keys per flash-decoding split (`attention_decode_split`).
    ATTN_SPLIT_KEYS = 32;
    /// Tokens per block of a paged KV cache (`spindle_model::paged::BLOCK_TOKENS`).
    KV_BLOCK_TOKENS = spindle_model::paged::BLOCK_TOKENS;
    /// Rows (query heads × tokens) of one tiled prefill attention block.
    ATTN_PREFILL_ROWS = 64;
    /// Keys per tile of the tiled prefill attention.
    ATTN_PREFILL_KEYS = 32;
    /// Key blocks per `qsa_score_blocks` block (a warp each).
    QSA_WARPS = 8;
    /// Threads of a `qsa_pick_blocks` block.
    QSA_PICK_THREADS = 512;
    /// The most experts per token the decode MoE kernels hold in shared memory.
    MOE_MAX_K = 32;
    /// The largest d_k the token-serial GDN recurrence holds in registers.
    GDN_MAX_DK = 128;
    /// Tokens per chunk of the chunked GDN prefill (the CPU's `gdn_chunked::CHUNK`).
    GDN_CHUNK = 64;
    /// Threads of `gdn_chunk_prep`.
    GDN_PREP_THREADS = 256;
    /// Threads of `gdn_chunk_scan`.
    GDN_SCAN_THREADS = 512;
    /// Columns of S per `gdn_chunk_scan` block.
    GDN_SCAN_COLS = 32;
    /// Tokens of the tensor-core GEMM block tile (and of a grouped-GEMM tile).
    TENSOR_GEMM_TOKENS = 64;
    /// Tokens of the skinny tensor-core GEMM's block tile (the same sums on fewer rows).
    TENSOR_GEMM_SKINNY_TOKENS = 16;
    /// Weight rows of the tensor-core GEMM block tile.
    TENSOR_GEMM_ROWS = 128;
    /// Stages of the tensor-core GEMM's `cp.async` pipeline.
    TENSOR_GEMM_STAGES = 4;
    /// Groups of 32 columns whose Q8/Q4/FP8 scales the tensor-core GEMM stages at a time
    /// (two such blocks in shared memory, each loaded a block ahead).
    TENSOR_GEMM_SCALE_GROUPS = 8;
    /// Conv rows (K − 1 + T) the decode matvec's fused GDN conv epilogue holds.
    DECODE_CONV_WINDOW = 16;
    /// Tokens per row of blocks of the tensor-core decode matvec (`matvec_tc.cu`).
    TCD_TOKENS = 16;
}

/// The `#define` lines of every shared constant, compiled before the sources.
pub fn prelude() -> String {
    let mut out = String::from("// Generated from spindle_cuda::kernels::SHARED_CONSTANTS.\n");
    for (name, value) in SHARED_CONSTANTS {
        out.push_str(&format!("#define {name} {value}\n"));
    }
    out
}

/// The whole program NVRTC compiles: the prelude, then every source file.
pub fn program() -> String {
    let mut out = prelude();
    out.push_str(&SOURCES.join("\n"));
    out
}

pub mod attention;
pub mod elementwise;
pub mod fp8;
pub mod gdn;
pub mod gemm;
pub mod ggml;
pub mod matvec;
pub mod moe;
pub mod norm;
pub mod qwen4;
pub mod reduce;
pub mod sampling;
pub mod tower;
pub mod vision;

/// The CUDA C sources, concatenated into one program (after the generated prelude) in this
/// order: helpers first, each file after those it uses.
const SOURCES: &[&str] = &[
    include_str!("common.cuh"),
    include_str!("ggml.cu"),
    include_str!("decode_staging.cuh"),
    include_str!("matvec.cu"),
    include_str!("gemm.cu"),
    include_str!("matvec_tc.cu"),
    include_str!("fp8.cu"),
    include_str!("moe.cu"),
    include_str!("norm.cu"),
    include_str!("elementwise.cu"),
    include_str!("reduce.cu"),
    include_str!("gdn.cu"),
    include_str!("attention.cu"),
    include_str!("qwen4.cu"),
    include_str!("sampling.cu"),
    include_str!("vision.cu"),
    include_str!("tower.cu"),
];

/// Every declared kernel, by source file.
const DECLARED: &[&[&[KernelDecl]]] = &[
    ggml::DECLARED,
    matvec::DECLARED,
    gemm::DECLARED,
    fp8::DECLARED,
    moe::DECLARED,
    norm::DECLARED,
    elementwise::DECLARED,
    reduce::DECLARED,
    gdn::DECLARED,
    attention::DECLARED,
    qwen4::DECLARED,
    sampling::DECLARED,
    vision::DECLARED,
    tower::DECLARED,
];

/// PTX of every kernel for `arch` (e.g. `sm_90`), compiled by NVRTC at most once per process.
/// Needs only the NVRTC library, no GPU. With `SPINDLE_CUDA_PTX_CACHE=DIR` the PTX is also
/// kept in DIR, named by the architecture and a hash of the program, and read from there by
/// later processes (GPU scripts that start several binaries skip a compile each).
pub fn ptx_for(arch: &str) -> Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(ptx) = cache.get(arch) {
        return Ok(ptx.clone());
    }
    let source = program();
    let file = std::env::var_os("SPINDLE_CUDA_PTX_CACHE").map(|dir| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        source.hash(&mut h);
        std::path::PathBuf::from(dir).join(format!("{arch}-{:016x}.ptx", h.finish()))
    });
    let text = match file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        Some(text) => text,
        None => {
            let text = crate::device::compile(source, arch)?;
            if let Some(f) = &file {
                // A cache that cannot be written only costs the next process a compile.
                let _ = std::fs::write(f, &text);
            }
            text
        }
    };
    cache.insert(arch.to_owned(), text.clone());
    Ok(text)
}

impl Device {
    /// Opens device `ordinal` with every declared kernel, compiled for its architecture (here,
    /// beside the kernels, so that `device` needs nothing of them). Fails with a message naming
    /// CUDA when there is no driver, no NVRTC or no such device.
    pub fn open(ordinal: usize) -> Result<Self> {
        let names: Vec<&'static str> = declared().map(|k| k.name).collect();
        Device::open_with(ordinal, ptx_for, &names)
    }
}

/// Every `extern "C" __global__` function the sources define, with its parameter list.
pub fn declared() -> impl Iterator<Item = &'static KernelDecl> {
    DECLARED
        .iter()
        .flat_map(|m| m.iter())
        .flat_map(|k| k.iter())
}

/// A kernel's name and parameter list, as declared in Rust.
#[derive(Clone, Copy, Debug)]
pub struct KernelDecl {
    pub name: &'static str,
    pub params: &'static [Param],
}

/// A kernel parameter's type as the launcher passes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// A device address (`T*`): `.u64` in PTX.
    Ptr,
    /// `int`: `.u32` (or `.s32`) in PTX.
    I32,
    /// `unsigned`: `.u32` in PTX.
    U32,
    /// `float`: `.f32` in PTX.
    F32,
    /// `unsigned long long`: `.u64` in PTX.
    U64,
}

impl Param {
    /// Whether a PTX `.param` of type `ptx` (e.g. `u64`, without the dot) takes this argument.
    pub fn matches_ptx(self, ptx: &str) -> bool {
        match self {
            Param::Ptr | Param::U64 => matches!(ptx, "u64" | "b64" | "s64"),
            Param::I32 | Param::U32 => matches!(ptx, "u32" | "b32" | "s32"),
            Param::F32 => ptx == "f32",
        }
    }
}

/// A device address of elements of type `T` (a kernel's `T*` parameter).
#[repr(transparent)]
pub struct Ptr<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}

impl<T> std::fmt::Debug for Ptr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ptr({:#x})", self.addr)
    }
}

impl<T> Ptr<T> {
    /// A raw device address taken as pointing to `T`s (the caller vouches for the type).
    pub fn raw(addr: u64) -> Self {
        Ptr {
            addr,
            _elem: PhantomData,
        }
    }

    /// The null pointer (an optional input the kernel skips).
    pub fn null() -> Self {
        Self::raw(0)
    }

    pub fn addr(self) -> u64 {
        self.addr
    }

    /// Whether this is the null pointer.
    pub fn is_null(self) -> bool {
        self.addr == 0
    }

    /// The address of element `i` from here.
    pub fn at(self, i: usize) -> Self {
        Self::raw(self.addr + (i * std::mem::size_of::<T>()) as u64)
    }
}

impl<T> DevBuf<T> {
    /// Element 0's address, as a kernel argument.
    pub fn arg(&self) -> Ptr<T> {
        Ptr::raw(self.ptr())
    }

    /// Element `i`'s address, as a kernel argument.
    pub fn arg_at(&self, i: usize) -> Ptr<T> {
        Ptr::raw(self.at(i))
    }
}

/// A raw device address as a kernel's `T*` argument: the element type is the launcher's (the
/// caller vouches for it). Prefer [`DevBuf::arg`], whose type the compiler checks.
pub fn p<T>(addr: u64) -> Ptr<T> {
    Ptr::raw(addr)
}

/// An `int` argument (shapes, counts, offsets); they are checked to fit when the model loads.
pub fn i(v: usize) -> i32 {
    v as i32
}

/// A value a kernel takes as one argument slot.
pub trait KernelArg: Copy {
    const PARAM: Param;
    /// The value in an 8-byte slot; 4-byte values sit in the low half (little endian).
    fn slot(self) -> u64;
}

impl<T> KernelArg for Ptr<T> {
    const PARAM: Param = Param::Ptr;
    fn slot(self) -> u64 {
        self.addr
    }
}

impl KernelArg for i32 {
    const PARAM: Param = Param::I32;
    fn slot(self) -> u64 {
        self as u32 as u64
    }
}

impl KernelArg for u32 {
    const PARAM: Param = Param::U32;
    fn slot(self) -> u64 {
        self as u64
    }
}

impl KernelArg for f32 {
    const PARAM: Param = Param::F32;
    fn slot(self) -> u64 {
        self.to_bits() as u64
    }
}

impl KernelArg for u64 {
    const PARAM: Param = Param::U64;
    fn slot(self) -> u64 {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared constant is defined by the prelude alone: a `#define` of it in a source file
    /// would be a second copy (and NVRTC would only warn when they differ).
    #[test]
    fn sources_do_not_redefine_shared_constants() {
        for source in SOURCES {
            for line in source.lines() {
                if let Some(rest) = line.trim().strip_prefix("#define ") {
                    let name = rest.split_whitespace().next().unwrap_or("");
                    assert!(
                        SHARED_CONSTANTS.iter().all(|(n, _)| *n != name),
                        "{name} is a shared constant (kernels/mod.rs) but a source defines it: {line}"
                    );
                }
            }
        }
        let prelude = prelude();
        for (name, value) in SHARED_CONSTANTS {
            assert!(prelude.contains(&format!("#define {name} {value}\n")));
        }
    }

    #[test]
    fn kernel_names_are_unique() {
        let mut names: Vec<&str> = declared().map(|k| k.name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a kernel is declared twice");
    }
}
