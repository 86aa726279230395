//! Keeping the daemon's resident code to what it executes.
//!
//! On a page fault in a file mapping the kernel maps up to 64 KiB of neighbouring pages
//! (`fault_around_bytes`), so each first call of a function not in `link/symbol-order.txt`
//! (the hot list placed first by the linker) makes 16 pages of unrelated code resident. With
//! the DRA, Kubernetes and GPU-use code in the binary that cost about 2 MiB of idle RSS
//! (measured with `/proc/<pid>/pagemap`: 470 resident text pages held no function the idle
//! daemon runs). [`executed_code_only`] advises the kernel that the executable code mappings
//! (the binary's and its libraries' `r-xp` segments) are read at random, which turns
//! fault-around off for them (Linux `madvise(2)`, `MADV_RANDOM`), and lets go of the pages
//! faulted so far (`MADV_DONTNEED`; clean, read-only file pages, re-read from the page cache
//! on the next call). Only ever applied to executable, read-only, file-backed mappings: data
//! segments (written by relocation) are never touched.
//!
//! Best effort: any failure (no `/proc`, an old kernel) leaves the process as it was.

#![allow(unsafe_code)]

/// Applies `MADV_RANDOM` and then `MADV_DONTNEED` to every executable file mapping of this
/// process (see the module docs); returns how many bytes of mappings were advised (0 when
/// `/proc/self/maps` is unreadable).
pub fn executed_code_only() -> usize {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return 0;
    };
    let mut advised = 0;
    for line in maps.lines() {
        // "start-end perms offset dev inode path"
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3).unwrap_or("");
        if perms != "r-xp" || !path.starts_with('/') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        if end <= start {
            continue;
        }
        let len = end - start;
        // SAFETY: the range is one whole mapping the kernel just listed for this process;
        // advice never changes its contents. MADV_DONTNEED on a private, read-only
        // (r-xp, never written) file mapping only drops page-table entries: the next access
        // re-reads the same bytes from the file's page cache.
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
        let advised = super::executed_code_only();
        assert!(advised > 0, "no executable mapping advised");
        let v: Vec<u64> = (0..1000).map(|i| i * i).collect();
        assert_eq!(v.iter().sum::<u64>(), 332_833_500);
    }
}
