//! A deterministic mutation harness: cases of damaged bytes run through a loader under
//! `catch_unwind`, every panic, every case that should have been refused but loaded, and every
//! refusal that does not name the file reported together at the end; a global allocator
//! refuses (and names the case of) any single allocation over [`ALLOC_LIMIT`], far more than
//! any fixture could need. `MUTATE_TRACE=1` names each case before it runs (for a case that
//! aborts the process, as a stack overflow does).

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The largest single allocation a case may make: fixtures are a few MB, so even dequantized
/// to f32 nothing legitimate comes near.
pub const ALLOC_LIMIT: usize = 1 << 30;

pub struct Bounded;

/// The label of the case running now, written out (without allocating) when it asks for more
/// than [`ALLOC_LIMIT`] in one allocation, before the process aborts.
static CURRENT: Mutex<String> = Mutex::new(String::new());
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged, except a request over the limit,
// which is refused with a null pointer (a legal answer for an allocator).
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT {
            refuse(new_size);
            return std::ptr::null_mut();
        }
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

fn refuse(size: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = size;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let write = |bytes: &[u8]| {
        // SAFETY: writes a live buffer to stderr; nothing is allocated.
        unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    };
    write(b"\nmutation harness: an allocation of ");
    write(&digits[at..]);
    write(b" bytes in case: ");
    if let Ok(label) = CURRENT.try_lock() {
        write(label.as_bytes());
    }
    write(b"\n");
}

/// What a case must do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// Damage the loader must notice: an `Err`.
    Refused,
    /// Damage that may leave a valid, different file (a flipped digit): `Ok` or `Err`, never a
    /// panic.
    Either,
}

pub struct Case {
    pub label: String,
    pub bytes: Vec<u8>,
    pub expect: Expect,
}

impl Case {
    pub fn refused(label: impl Into<String>, bytes: Vec<u8>) -> Self {
        Case {
            label: label.into(),
            bytes,
            expect: Expect::Refused,
        }
    }
    pub fn either(label: impl Into<String>, bytes: Vec<u8>) -> Self {
        Case {
            label: label.into(),
            bytes,
            expect: Expect::Either,
        }
    }
}

/// Runs every case through `load` (which writes the bytes where the loader reads them and
/// returns its error message) and fails listing each panic, each damaged input that loaded
/// and each refusal that lacks every one of `names` (the file the message must name).
pub fn run_cases(
    what: &str,
    cases: Vec<Case>,
    names: &[&str],
    mut load: impl FnMut(&[u8]) -> Result<(), String>,
) {
    let mut failures = Vec::new();
    let mut loaded = Vec::new();
    let mut refused = 0;
    let total = cases.len();
    // A case that aborts the process (a stack overflow) cannot be reported after the fact:
    // MUTATE_TRACE=1 (with --nocapture) names each case before it runs.
    let trace = std::env::var_os("MUTATE_TRACE").is_some();
    for case in cases {
        *CURRENT.lock().unwrap() = format!("{what}: {}", case.label);
        if trace {
            eprintln!("mutation harness: running {what}: {}", case.label);
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| load(&case.bytes)));
        match outcome {
            Err(payload) => {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{}: PANIC {message}", case.label));
            }
            Ok(Ok(())) => {
                loaded.push(case.label.clone());
                if case.expect == Expect::Refused {
                    failures.push(format!("{}: loaded, expected a refusal", case.label));
                }
            }
            Ok(Err(message)) => {
                refused += 1;
                if !names.iter().any(|n| message.contains(n)) {
                    failures.push(format!(
                        "{}: the refusal names none of {names:?}: {message}",
                        case.label
                    ));
                }
            }
        }
    }
    CURRENT.lock().unwrap().clear();
    eprintln!(
        "{what}: {total} cases, {refused} refused, {} loaded:\n  {}",
        loaded.len(),
        loaded.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{what}: {} of {total} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// xorshift64*: the same seed gives the same cases on every machine.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `bytes` cut to each of `count` lengths spread over `range` (and the range's ends).
pub fn truncations(
    label: &str,
    bytes: &[u8],
    range: std::ops::Range<usize>,
    count: usize,
) -> Vec<Case> {
    let span = range.end - range.start;
    let mut lengths: Vec<usize> = (0..count).map(|i| range.start + span * i / count).collect();
    lengths.push(range.end.saturating_sub(1));
    lengths.dedup();
    lengths
        .into_iter()
        .filter(|&n| n < bytes.len())
        .map(|n| Case::refused(format!("{label} cut to {n} bytes"), bytes[..n].to_vec()))
        .collect()
}

/// `count` copies of `bytes`, each with 1 to 4 random bytes in `range` replaced.
pub fn flips(
    label: &str,
    bytes: &[u8],
    range: std::ops::Range<usize>,
    count: usize,
    rng: &mut XorShift,
) -> Vec<Case> {
    (0..count)
        .map(|_| {
            let mut out = bytes.to_vec();
            let mut at = Vec::new();
            for _ in 0..1 + rng.below(4) {
                let i = range.start + rng.below(range.end - range.start);
                out[i] = rng.next() as u8;
                at.push(i);
            }
            Case::either(format!("{label} bytes {at:?} replaced"), out)
        })
        .collect()
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
