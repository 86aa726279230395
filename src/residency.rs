//! Keeping the daemon's heap to what it uses while idle, with glibc's own tunables only.
//!
//! - [`enable`] (called by `main` for `slicelet run` and `slicelet mps`, before any thread
//!   starts; in tests and the library's other users nothing happens): at most
//!   [`MALLOC_ARENAS`] glibc malloc arenas. Each thread would otherwise get an arena of its
//!   own (up to 8 per core), and the pages it touched once stay resident.
//! - [`settle`], called by the supervisor once it has been quiet for a while after a change
//!   (the start, a reload): glibc returns the heap's free pages to the kernel
//!   (`malloc_trim(0)`: the plan build's transient allocations).
//!
//! Nothing here touches code pages: the binary's code is left to the kernel. Best effort: on
//! another libc both are no-ops. Figures: docs/benchmarks.md ("Resident memory").

#![allow(unsafe_code)]

/// The most glibc malloc arenas the daemon uses (glibc's default is 8 per CPU core). Two keep
/// the Allocate path from contending with the hardware thread on one arena lock.
pub const MALLOC_ARENAS: i32 = 2;

/// Caps the malloc arenas for this process (the daemon binary calls it first thing, before
/// any thread starts: `mallopt` applies to arenas created later).
pub fn enable() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tunable of glibc's allocator; called before any other
    // thread exists, so no allocation races with it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Returns the heap's free pages to the kernel (`malloc_trim(0)`); true where glibc released
/// some. Costs well under a millisecond: call it after changes, not often.
pub fn settle() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the kernel; it takes
    // the arenas' locks itself.
    unsafe {
        libc::malloc_trim(0) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn settling_keeps_live_memory() {
        let live: Vec<u64> = (0..100_000).collect();
        {
            let freed: Vec<Vec<u8>> = (0..64).map(|_| vec![7u8; 64 * 1024]).collect();
            drop(freed);
        }
        super::settle();
        assert_eq!(live.iter().sum::<u64>(), 4_999_950_000);
    }
}
