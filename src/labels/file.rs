//! The NFD feature file on disk: written atomically, within NFD's size limit, off the async
//! runtime, and removed when slicelet stops.
//!
//! NFD's local source (nfd-worker) reads every file in
//! `/etc/kubernetes/node-feature-discovery/features.d/` whose name does not start with a dot,
//! ignores a file over 64 KiB (65,536 bytes) whole, and re-reads the directory when it changes.
//! So a new content is written to a dot-file in the same directory (same file system, never
//! read by NFD; [`crate::files::write_atomic`]), flushed, and renamed over `<name>`: NFD sees
//! the old file or the new one, never a half-written one.
//!
//! [`Writer`] owns the file for the daemon: it holds the content wanted now, applies it on a
//! blocking thread (a write never runs on a runtime worker that serves Allocate), skips
//! contents already on disk, retries a failed write with a capped backoff (1 s doubling to
//! 30 s) until it succeeds or is superseded, and reports every outcome. It starts by removing a
//! file left by an earlier run (its labels describe a plan this process has not published) and,
//! on shutdown, removes the file so NFD drops the labels.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// NFD's limit for one feature file, bytes (`MaxFeatureFileSize` of its local source): a larger
/// file is ignored whole.
pub const MAX_FEATURE_FILE_BYTES: usize = 65536;

/// The first wait before a failed write is tried again; it doubles up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_secs(1);

/// The longest wait between tries of a failed write.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// The feature file could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The content is over NFD's size limit (NFD would ignore the whole file).
    #[error("feature file {path}: {bytes} bytes exceed NFD's limit of {limit} bytes (NFD would ignore the file); not written")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The content's size, bytes.
        bytes: usize,
        /// [`MAX_FEATURE_FILE_BYTES`].
        limit: usize,
    },
    /// The path has no file name, or one NFD ignores (starting with a dot).
    #[error("feature file {path}: needs a file name that does not start with a dot (NFD ignores dot-files)")]
    Name {
        /// The path.
        path: PathBuf,
    },
    /// An I/O step failed.
    #[error("{step} {path}")]
    Io {
        /// What was done: `writing`, `renaming into`, `removing`.
        step: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Checks that `path` names a file NFD reads: a file name not starting with `.`.
///
/// # Errors
/// [`FileError::Name`].
pub fn check_path(path: &Path) -> Result<(), FileError> {
    match path.file_name().and_then(|n| n.to_str()) {
        Some(n) if !n.starts_with('.') => Ok(()),
        _ => Err(FileError::Name {
            path: path.to_path_buf(),
        }),
    }
}

/// Writes `content` to `path` atomically (blocking; [`crate::files::write_atomic`]: a dot-file
/// NFD ignores, under a name nobody can plant a link at, flushed and renamed over `path`).
/// Nothing is written when `content` is over [`MAX_FEATURE_FILE_BYTES`].
///
/// # Errors
/// [`FileError`] naming the file.
pub fn write_atomic(path: &Path, content: &str) -> Result<(), FileError> {
    if content.len() > MAX_FEATURE_FILE_BYTES {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            bytes: content.len(),
            limit: MAX_FEATURE_FILE_BYTES,
        });
    }
    check_path(path)?;
    crate::files::write_atomic(path, content.as_bytes()).map_err(|source| FileError::Io {
        step: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// Removes `path` (blocking); a file that is not there is fine.
///
/// # Errors
/// [`FileError::Io`] for any other failure.
pub fn remove(path: &Path) -> Result<(), FileError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FileError::Io {
            step: "removing",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// What happened to the file, as [`Writer`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A new content is on disk.
    Written,
    /// The file is gone (at start, or on shutdown).
    Removed,
    /// Applying the wanted state failed; it is tried again after a backoff (unless shutting
    /// down). The error with its causes on one line.
    Failed(String),
}

/// Where [`Writer`] reports each outcome (the daemon folds it into its `Status`).
pub type Report = Arc<dyn Fn(&Outcome) + Send + Sync>;

/// The daemon's owner of the feature file (see the module docs).
pub struct Writer {
    want: watch::Sender<Option<Arc<str>>>,
    task: JoinHandle<()>,
}

impl Writer {
    /// Starts the writer for `path` on the current runtime; it removes a file left by an
    /// earlier run at once. Each outcome goes to `report`.
    pub fn spawn(path: PathBuf, report: Report) -> Writer {
        let (want, rx) = watch::channel(None);
        let task = tokio::spawn(run(path, rx, report));
        Writer { want, task }
    }

    /// Asks for `content` on disk; a content equal to the one asked for last changes nothing.
    pub fn set(&self, content: String) {
        self.want.send_if_modified(|w| {
            if w.as_deref() == Some(content.as_str()) {
                return false;
            }
            *w = Some(content.into());
            true
        });
    }

    /// Removes the file (so NFD drops the labels) and stops, within `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        self.want.send_replace(None);
        drop(self.want);
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::warn!(deadline = ?deadline, "the NFD feature file writer did not finish in time");
            task.abort();
        }
    }
}

/// Applies `want` (blocking): the content written, or the file removed.
fn apply(path: &Path, want: Option<&str>) -> Outcome {
    let result = match want {
        Some(content) => write_atomic(path, content).map(|()| Outcome::Written),
        None => remove(path).map(|()| Outcome::Removed),
    };
    result.unwrap_or_else(|e| Outcome::Failed(crate::errors::chain(&e)))
}

async fn run(path: PathBuf, mut rx: watch::Receiver<Option<Arc<str>>>, report: Report) {
    // What is on disk, once known (`Some(None)`: no file). Unknown at start, so a file left by
    // an earlier run is removed.
    let mut on_disk: Option<Option<Arc<str>>> = None;
    let mut backoff = RETRY_MIN;
    let mut last_error: Option<String> = None;
    loop {
        let want = rx.borrow_and_update().clone();
        if on_disk.as_ref() != Some(&want) {
            let (p, w) = (path.clone(), want.clone());
            let outcome = tokio::task::spawn_blocking(move || apply(&p, w.as_deref()))
                .await
                .unwrap_or_else(|e| Outcome::Failed(format!("the write task failed: {e}")));
            match &outcome {
                Outcome::Failed(e) => {
                    if last_error.as_deref() != Some(e.as_str()) {
                        tracing::error!(path = %path.display(), error = %e, retry_in = ?backoff,
                            "the NFD feature file could not be updated; node labels may be stale (serving continues)");
                        last_error = Some(e.clone());
                    }
                }
                Outcome::Written | Outcome::Removed => {
                    if outcome == Outcome::Written {
                        tracing::info!(path = %path.display(), "NFD feature file written");
                    }
                    last_error = None;
                    on_disk = Some(want.clone());
                }
            }
            report(&outcome);
        }
        // `changed` reports a value not seen yet even after the sender is gone (shutdown's
        // removal), and an error only once closed with nothing new: then the last wanted state
        // has been applied or tried once, and the writer stops.
        let closed = if on_disk.as_ref() == Some(&want) {
            backoff = RETRY_MIN;
            rx.changed().await.is_err()
        } else {
            tokio::select! {
                r = rx.changed() => r.is_err(),
                () = tokio::time::sleep(backoff) => {
                    backoff = (backoff * 2).min(RETRY_MAX);
                    false
                }
            }
        };
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_is_atomic_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slicelet");
        write_atomic(&path, "a=1\n").unwrap();
        write_atomic(&path, "a=2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=2\n");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["slicelet"]);
    }

    #[test]
    fn content_over_nfds_limit_is_refused_and_nothing_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slicelet");
        let at_limit = "x".repeat(MAX_FEATURE_FILE_BYTES);
        write_atomic(&path, &at_limit).unwrap();
        let over = "x".repeat(MAX_FEATURE_FILE_BYTES + 1);
        let e = write_atomic(&path, &over).unwrap_err();
        assert!(
            matches!(e, FileError::TooLarge { bytes, limit: 65536, .. } if bytes == 65537),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().len(),
            MAX_FEATURE_FILE_BYTES,
            "the file on disk is untouched"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn dot_files_and_directories_are_refused() {
        for bad in ["/etc/features.d/.slicelet", "/", "/etc/features.d/.."] {
            assert!(
                matches!(check_path(Path::new(bad)), Err(FileError::Name { .. })),
                "{bad}"
            );
        }
        check_path(Path::new(
            "/etc/kubernetes/node-feature-discovery/features.d/slicelet",
        ))
        .unwrap();
    }

    #[test]
    fn a_failed_write_names_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("slicelet");
        let e = write_atomic(&path, "a=1\n").unwrap_err();
        let text = crate::errors::chain(&e);
        assert!(text.contains("missing/slicelet"), "{text}");
        // The rename fails when the target is a directory: the temp file is cleaned up.
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), "x").unwrap();
        let e = write_atomic(&target, "a=1\n").unwrap_err();
        assert!(
            matches!(
                e,
                FileError::Io {
                    step: "writing",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn remove_is_fine_when_nothing_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slicelet");
        remove(&path).unwrap();
        std::fs::write(&path, "a=1\n").unwrap();
        remove(&path).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// The writer's outcomes, in order, through a channel (no sleeps).
    fn recorder() -> (Report, tokio::sync::mpsc::UnboundedReceiver<Outcome>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Arc::new(move |o: &Outcome| drop(tx.send(o.clone()))), rx)
    }

    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Outcome>) -> Outcome {
        tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("writer outcome")
            .expect("writer gone")
    }

    #[tokio::test]
    async fn writer_removes_a_stale_file_writes_changes_once_and_removes_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slicelet");
        std::fs::write(&path, "stale=1\n").unwrap();
        let (report, mut rx) = recorder();
        let w = Writer::spawn(path.clone(), report);
        assert_eq!(next(&mut rx).await, Outcome::Removed);
        assert!(
            !path.exists(),
            "a file from an earlier run is removed at start"
        );
        w.set("a=1\n".into());
        assert_eq!(next(&mut rx).await, Outcome::Written);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=1\n");
        w.set("a=1\n".into());
        w.set("a=2\n".into());
        assert_eq!(next(&mut rx).await, Outcome::Written);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=2\n");
        w.shutdown(Duration::from_secs(5)).await;
        assert_eq!(next(&mut rx).await, Outcome::Removed);
        assert!(!path.exists(), "shutdown removes the file");
        assert!(rx.recv().await.is_none(), "nothing else happened: {rx:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn writer_retries_a_failed_write_until_it_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let features = dir.path().join("features.d");
        let path = features.join("slicelet");
        let (report, mut rx) = recorder();
        let w = Writer::spawn(path.clone(), report);
        assert_eq!(next(&mut rx).await, Outcome::Removed);
        w.set("a=1\n".into());
        assert!(matches!(next(&mut rx).await, Outcome::Failed(e) if e.contains("features.d")));
        std::fs::create_dir(&features).unwrap();
        // The paused clock advances to the backoff's end once everything is idle.
        assert_eq!(next(&mut rx).await, Outcome::Written);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=1\n");
        w.shutdown(Duration::from_secs(5)).await;
        assert_eq!(next(&mut rx).await, Outcome::Removed);
    }
}
