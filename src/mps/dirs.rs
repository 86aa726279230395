//! Creating, chmodding and removing a daemon's directories under `mpsRoot` without following
//! symlinks and without leaving the root (issue 15 D2, D3).
//!
//! `<mpsRoot>` itself must be a directory (it may be reached through symlinks: it is the
//! administrator's hostPath). Below it nothing is followed: every existing component of
//! `<mpsRoot>/<uuid>/{pipe,log}` and `<mpsRoot>/shm` is looked at with
//! [`std::fs::symlink_metadata`] before it is created, chmodded or removed, and a symlink (or
//! any non-directory) there is refused with [`DirError::NotADirectory`] without touching what
//! it points to. The `<uuid>` component is checked by [`join_under`].

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use crate::plan::MpsDirs;

/// A directory operation under `mpsRoot` was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A path component from outside (a UUID) is not one plain path component.
    #[error("`{}` is not a single path component under {}", crate::uuid::truncate_id(component), root.display())]
    Escapes {
        /// The root.
        root: PathBuf,
        /// The refused component.
        component: String,
    },
    /// Something that is not a plain directory (a symlink, a file) sits where a directory of
    /// ours belongs; it is left alone.
    #[error("{} is a {kind}, not a directory; refusing to follow or change it", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// A file-system call failed.
    #[error("{op} {}", path.display())]
    Io {
        /// The operation: `creating`, `chmodding`, `removing`, `inspecting`.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// `root/component`, when `component` is exactly one normal path component: not empty, no
/// `/`, not `.` or `..`, no NUL. A UUID validated by [`crate::uuid::Uuid`] always passes.
///
/// # Errors
/// [`DirError::Escapes`] otherwise.
pub fn join_under(root: &Path, component: &str) -> Result<PathBuf, DirError> {
    let mut parts = Path::new(component).components();
    let one = matches!(parts.next(), Some(Component::Normal(c)) if c == component)
        && parts.next().is_none();
    if !one || component.contains('\0') || component.contains('/') {
        return Err(DirError::Escapes {
            root: root.to_path_buf(),
            component: component.to_string(),
        });
    }
    Ok(root.join(component))
}

/// What is at `path`, not following a symlink: Ok(true) a directory, Ok(false) nothing.
fn plain_dir(path: &Path) -> Result<bool, DirError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => Ok(true),
        Ok(m) => Err(DirError::NotADirectory {
            path: path.to_path_buf(),
            kind: if m.file_type().is_symlink() {
                "symlink"
            } else {
                "file"
            },
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(DirError::Io {
            op: "inspecting",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Creates `root/rel` one component at a time, refusing any existing component that is not
/// a plain directory, then sets `mode` on the last one (checked again just before).
fn make_under(root: &Path, rel: &[&str], mode: u32) -> Result<(), DirError> {
    let mut path = root.to_path_buf();
    for part in rel {
        path = join_under(&path, part)?;
        if !plain_dir(&path)? {
            match std::fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    plain_dir(&path)?;
                }
                Err(source) => {
                    return Err(DirError::Io {
                        op: "creating",
                        path,
                        source,
                    })
                }
            }
        }
    }
    plain_dir(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        DirError::Io {
            op: "chmodding",
            path: path.clone(),
            source,
        }
    })
}

/// The root and the daemon's component of `dirs` (`dirs.base` = root/component), checked.
fn split(dirs: &MpsDirs) -> Result<(&Path, &str), DirError> {
    let escapes = || DirError::Escapes {
        root: dirs.shm.parent().unwrap_or(Path::new("/")).to_path_buf(),
        component: dirs.base.display().to_string(),
    };
    let root = dirs.base.parent().ok_or_else(escapes)?;
    let component = dirs
        .base
        .file_name()
        .and_then(|c| c.to_str())
        .ok_or_else(escapes)?;
    if dirs.shm != root.join("shm")
        || dirs.pipe != dirs.base.join("pipe")
        || dirs.log != dirs.base.join("log")
    {
        return Err(escapes());
    }
    join_under(root, component)?;
    Ok((root, component))
}

/// Creates `<root>/<uuid>/pipe` and `log` (0755) and the shared `<root>/shm` (1777), as the
/// MPS daemon needs them, without following a symlink below the root.
///
/// # Errors
/// [`DirError`] naming the path: a symlink or file in the way, a component that escapes the
/// root, or an I/O error.
pub fn create(dirs: &MpsDirs) -> Result<(), DirError> {
    let (root, uuid) = split(dirs)?;
    std::fs::create_dir_all(root).map_err(|source| DirError::Io {
        op: "creating",
        path: root.to_path_buf(),
        source,
    })?;
    make_under(root, &[uuid, "pipe"], 0o755)?;
    make_under(root, &[uuid, "log"], 0o755)?;
    make_under(root, &["shm"], 0o1777)
}

/// Removes `<root>/<uuid>` and what is in it. A symlink there is refused (and left alone);
/// symlinks inside are removed, never followed. Ok(false) when there was nothing.
///
/// # Errors
/// [`DirError`] naming the path.
pub fn remove(dirs: &MpsDirs) -> Result<bool, DirError> {
    split(dirs)?;
    if !plain_dir(&dirs.base)? {
        return Ok(false);
    }
    std::fs::remove_dir_all(&dirs.base).map_err(|source| DirError::Io {
        op: "removing",
        path: dirs.base.clone(),
        source,
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests;
