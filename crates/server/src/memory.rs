//! Giving freed memory back: glibc keeps the pages of freed allocations in its arenas, so
//! without a trim the peak of one large request (a 4 MB body, its template rendering and
//! tokenization) stays in the process's RSS long after the request is gone.

/// Bodies at least this large trim the heap once their prompt is prepared.
pub const LARGE_REQUEST_BYTES: usize = 256 << 10;

/// Returns the free pages of every malloc arena to the OS (`malloc_trim(0)`); a no-op off
/// glibc.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and shrinks the allocator's own free lists; it takes the
    // arena locks itself and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
