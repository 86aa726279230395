//! Writing files in directories others can reach (the CDI spec directory, NFD's `features.d`,
//! the kubelet's plugins directory): atomically, and never through a link someone planted.
//!
//! [`write_atomic`] writes a temporary file beside the target, created with `O_CREAT | O_EXCL`
//! under an unpredictable name (the `tempfile` crate: `.<name>.<random>.tmp`), so a symlink or
//! file planted at any name is never opened, let alone written through; then it is fsynced,
//! renamed over the target (readers see the old file or the new one, never half of one) and
//! the directory is fsynced. A failed step removes the temporary file. [`write_atomic_from`]
//! does the same with the bytes streamed from a reader and a mode of the caller's (the hook
//! binary `slicelet install-hook` puts on the host, mode 0755).

use std::io::{Read, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// The mode of every file written: readable by all (a container runtime reads CDI specs, NFD
/// its feature files), writable by slicelet only.
pub const MODE: u32 = 0o644;

/// Writes `bytes` to `path` atomically (see the module docs), mode [`MODE`]. Blocking.
///
/// # Errors
/// The I/O error of the step that failed (creating the temporary file, writing, syncing or
/// renaming it).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_from(path, &mut &bytes[..], MODE).map(|_| ())
}

/// Writes everything `from` reads to `path` atomically (see the module docs), streamed (a
/// binary of hundreds of MiB is never held in memory), with mode `mode` set on the file
/// whatever the umask. Returns the bytes written. Blocking.
///
/// # Errors
/// As [`write_atomic`], and reading `from`.
pub fn write_atomic_from(path: &Path, from: &mut impl Read, mode: u32) -> std::io::Result<u64> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    // The umask applied at creation may have taken bits away: set the mode itself.
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    let written = std::io::copy(from, &mut tmp)?;
    tmp.flush()?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(written)
}

/// Removes the temporary files [`write_atomic`] left beside `path` when it was killed
/// mid-write (`.<name>.<random>.tmp`; a SIGKILL gives the writer no chance to remove its own).
/// Only files and links (a link itself, never what it points to) are removed, never
/// directories; call it only where no other writer of `path` runs (a daemon at start).
/// Returns how many were removed; errors (a directory that cannot be read) remove nothing.
pub fn remove_stale_temporaries(path: &Path) -> usize {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return 0;
    };
    let (prefix, suffix) = (format!(".{name}."), ".tmp");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let file = e.file_name();
        let file = file.to_string_lossy();
        let ours = file.len() > prefix.len() + suffix.len()
            && file.starts_with(&prefix)
            && file.ends_with(suffix);
        let not_dir = e.file_type().is_ok_and(|t| !t.is_dir());
        if ours && not_dir && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn writes_replace_the_file_and_leave_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(names(dir.path()), ["spec.json"]);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, MODE);
    }

    /// A symlink planted at the temporary name the writers used before (`.<name>.tmp`) is
    /// never followed: its target keeps its content (it was overwritten before).
    #[test]
    fn a_planted_link_at_the_old_temp_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("checkpoint.json");
        std::os::unix::fs::symlink(&victim, dir.path().join(".checkpoint.json.tmp")).unwrap();
        write_atomic(&path, b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert!(std::fs::symlink_metadata(dir.path().join(".checkpoint.json.tmp")).is_ok());
    }

    #[test]
    fn a_stream_is_written_whole_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bin");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let n = write_atomic_from(&path, &mut &data[..], 0o755).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        assert_eq!(names(dir.path()), ["bin"]);
    }

    /// What a writer killed mid-write leaves (`.<name>.<random>.tmp`, as a file or a link) is
    /// removed; the target, other files, a directory of that shape and the bare
    /// `.<name>.tmp` are kept.
    #[test]
    fn stale_temporaries_of_a_killed_writer_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        write_atomic(&path, b"{}").unwrap();
        std::fs::write(dir.path().join(".checkpoint.json.a1B2c3.tmp"), "half").unwrap();
        std::fs::write(dir.path().join(".other.json.x.tmp"), "x").unwrap();
        std::fs::write(dir.path().join(".checkpoint.json.tmp"), "x").unwrap();
        std::fs::create_dir(dir.path().join(".checkpoint.json.d.tmp")).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".checkpoint.json.l.tmp")).unwrap();
        assert_eq!(remove_stale_temporaries(&path), 2);
        assert_eq!(
            names(dir.path()),
            [
                ".checkpoint.json.d.tmp",
                ".checkpoint.json.tmp",
                ".other.json.x.tmp",
                "checkpoint.json",
                "victim"
            ]
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(remove_stale_temporaries(&path), 0);
    }

    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        assert!(write_atomic(&target, b"x").is_err());
        assert_eq!(names(dir.path()), ["target"]);
        assert!(write_atomic(&dir.path().join("missing/x"), b"x").is_err());
    }
}
