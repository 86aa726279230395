//! Keeping the daemon's resident memory to what it uses while idle.
//!
//! Most of an idle daemon's RSS is the binary's own code pages. On a page fault in a file
//! mapping the kernel maps up to 64 KiB of neighbouring pages already in the page cache
//! (`fault_around_bytes`), so each first call of a function outside the hot list
//! (`link/symbol-order.txt`, placed first by the linker) makes 16 pages of unrelated code
//! resident; and everything the daemon ran while starting (the policy's YAML parser, clap,
//! registration) stays resident after it ran once. `MADV_RANDOM` does not stop fault-around
//! (measured on Linux 6.18: three touches of a cached file mapping map 48 pages with or without
//! it); it only stops read-ahead when a page is not in the page cache.
//!
//! What this module does, only in the daemon binary ([`enable`] is called by `main` for
//! `slicelet run` and `slicelet mps`; in tests and the library's other users nothing happens):
//! - [`enable`]: at most [`MALLOC_ARENAS`] glibc malloc arenas (each thread would otherwise
//!   get one of its own, and the pages it touched once stay resident), then [`settle`].
//! - [`settle`], called by the supervisor once it has been quiet for a while after a change
//!   (the start, a reload): the executable code mappings that existed at [`enable`] (the
//!   binary's and the start-up libraries' `r-xp` segments; never one loaded later, which
//!   could be unmapped under the call) are advised `MADV_RANDOM` and their pages let go
//!   (`MADV_DONTNEED`; clean, read-only file pages, re-read from the page cache on the next
//!   call, so only the code the idle daemon runs comes back), and glibc returns the heap's
//!   free pages to the kernel (`malloc_trim(0)`: the plan build's transient allocations).
//!   Data segments (written by relocation) are never touched.
//!
//! Best effort: any failure (no `/proc`, an old kernel, another libc) leaves the process as
//! it was. Figures: README, Benchmarks ("Resident memory").

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The most glibc malloc arenas the daemon uses (glibc's default is 8 per CPU core). Two keep
/// the Allocate path from contending with the hardware thread on one arena lock.
pub const MALLOC_ARENAS: i32 = 2;

/// The code mappings listed by [`enable`], before any other thread existed: the executable's
/// and those of the libraries the loader mapped before `main` (`DT_NEEDED`), which are never
/// unmapped. Only these are ever let go: a library loaded later (NVML, by the hardware thread)
/// can be unmapped between a `/proc/self/smaps` read and the `madvise`, and its range reused
/// by fresh heap memory, which `MADV_DONTNEED` would zero.
static CODE: OnceLock<Vec<(usize, usize)>> = OnceLock::new();

/// Turns the measures on for this process (the daemon binary calls it first thing, before any
/// thread starts: `mallopt` applies to arenas created later, and the code mappings recorded
/// now are the ones [`settle`] may ever touch) and settles once.
pub fn enable() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tunable of glibc's allocator; called before any other
    // thread exists, so no allocation races with it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    let _ = CODE.set(code_mappings(&smaps));
    settle();
}

/// Lets go of the code pages faulted so far and of the heap's free pages (see the module
/// docs); returns how many bytes of code mappings were advised (0 when [`enable`] was never
/// called or `/proc/self/smaps` is unreadable). Costs about a millisecond, and the idle code's
/// pages (a few hundred minor faults) when it next runs: call it after changes, not often.
pub fn settle() -> usize {
    let Some(code) = CODE.get() else {
        return 0;
    };
    let advised = let_go(code);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the kernel; it takes
    // the arenas' locks itself.
    unsafe {
        libc::malloc_trim(0);
    }
    advised
}

/// The executable code mappings `settle` may let go, from `/proc/self/smaps` text: each
/// `r-xp` mapping of a file (a path starting with `/`) as `(start, length)` in bytes, except
/// one holding anonymous pages, resident or swapped out: a debugger's breakpoint or a uprobe
/// (eBPF tracing) wrote a private copy of a code page there, and dropping it would silently
/// remove that probe.
fn code_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The mapping whose fields are being read: (start, length), or None when not a candidate.
    let mut current: Option<(usize, usize)> = None;
    let mut flush = |current: &mut Option<(usize, usize)>| {
        if let Some(m) = current.take() {
            out.push(m);
        }
    };
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let Some(first) = f.next() else { continue };
        if let Some((start, end)) = first.split_once('-') {
            // A mapping's header: "start-end perms offset dev inode path".
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            flush(&mut current);
            let perms = f.next().unwrap_or("");
            let path = f.nth(3).unwrap_or("");
            if perms == "r-xp" && path.starts_with('/') && end > start {
                current = Some((start, end - start));
            }
        } else if (first == "Anonymous:" || first == "Swap:")
            && f.next().is_some_and(|kb| kb != "0")
        {
            current = None;
        }
    }
    flush(&mut current);
    out
}

/// Applies `MADV_RANDOM` and then `MADV_DONTNEED` to each of `recorded` that
/// [`code_mappings`] still lists now, unchanged and unwritten (see the module docs); returns
/// how many bytes of mappings were advised (0 when `/proc/self/smaps` is unreadable).
/// `recorded` must hold only mappings that are never unmapped (see [`CODE`]).
fn let_go(recorded: &[(usize, usize)]) -> usize {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let mut advised = 0;
    for (start, len) in code_mappings(&smaps) {
        if !recorded.contains(&(start, len)) {
            continue;
        }
        // SAFETY: the range is one whole read-only executable file mapping, listed before any
        // other thread existed and never unmapped since (the executable's or a library the
        // loader mapped before `main`), so between the listing above and this call it cannot
        // have become other memory. Advice never changes its contents: MADV_DONTNEED on a
        // private file mapping with no anonymous (written) page only drops page-table
        // entries, and the next access re-reads the same bytes from the file's page cache. A
        // breakpoint written in between is the one thing lost (a probe, never data).
        unsafe {
            let addr = start as *mut libc::c_void;
            if libc::madvise(addr, len, libc::MADV_RANDOM) == 0 {
                libc::madvise(addr, len, libc::MADV_DONTNEED);
                advised += len;
            }
        }
    }
    advised
}

#[cfg(test)]
mod tests {
    /// The process keeps running its code after its code pages were let go (they come back
    /// from the page cache), and the test binary's own text was among them.
    #[test]
    fn code_still_runs_after_its_pages_were_dropped() {
        // Outside the daemon binary (no enable()) settling does nothing.
        assert_eq!(super::settle(), 0, "settled without enable()");
        // Only this test binary's own code mapping (other tests' threads may load libraries).
        let here = code_still_runs_after_its_pages_were_dropped as *const () as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mine: Vec<(usize, usize)> = super::code_mappings(&smaps)
            .into_iter()
            .filter(|&(start, len)| (start..start + len).contains(&here))
            .collect();
        assert_eq!(mine.len(), 1, "the test's code mapping");
        let advised = super::let_go(&mine);
        assert!(advised > 0, "no executable mapping advised");
        let v: Vec<u64> = (0..1000).map(|i| i * i).collect();
        assert_eq!(v.iter().sum::<u64>(), 332_833_500);
    }

    /// Only mappings recorded at enable() are ever advised: a library loaded later (and maybe
    /// unmapped under the call, its range reused by heap memory) never is.
    #[test]
    fn only_recorded_mappings_are_let_go() {
        assert_eq!(super::let_go(&[]), 0, "nothing recorded, nothing advised");
        // A range that is no mapping of this process (any more).
        assert_eq!(super::let_go(&[(0x1000, 0x1000)]), 0);
    }

    /// Only read-only executable file mappings without written pages are candidates.
    #[test]
    fn code_mappings_skip_data_anonymous_and_probed_code() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 fe:00 42 /usr/bin/slicelet
Rss:                 400 kB
Anonymous:             0 kB
55d0a0100000-55d0a0900000 r-xp 00100000 fe:00 42 /usr/bin/slicelet
Rss:                2400 kB
Anonymous:             0 kB
55d0a0900000-55d0a0910000 rw-p 00900000 fe:00 42 /usr/bin/slicelet
Anonymous:            64 kB
7f0000000000-7f0000021000 r-xp 00000000 00:00 0
Anonymous:             0 kB
7f1000026000-7f100017c000 r-xp 00026000 fe:00 7 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 684 kB
Anonymous:             4 kB
7f2000001000-7f2000027000 r-xp 00001000 fe:00 9 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me
7f3000001000-7f3000027000 r-xp 00001000 fe:00 11 /opt/lib/libtraced.so
Anonymous:             0 kB
Swap:                  4 kB
";
        assert_eq!(
            super::code_mappings(smaps),
            [(0x55d0a0100000, 0x800000), (0x7f2000001000, 0x26000)],
            "the binary's code and ld.so's; not its data, an anonymous r-xp mapping, libc's code \
             with a breakpoint written into it, or a library whose probed page is swapped out"
        );
    }
}
