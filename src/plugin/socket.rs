//! Unix socket files of the resource servers in the device-plugin directory.
//!
//! Names are `slicelet-<resource>.sock` with the `/` of the resource name turned into `_`.
//! That is injective: the prefix of an extended resource name is a DNS subdomain, which has no
//! `_`, so the first `_` is always the separator. A path longer than the 108-byte `sun_path`
//! limit (107 bytes plus NUL) falls back to `slicelet-<sha256 prefix>.sock`.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::net::UnixListener;

/// Longest socket path that fits `sockaddr_un.sun_path` (108 bytes with the NUL), bytes.
pub const MAX_SOCKET_PATH: usize = 107;

/// Binding a resource socket failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another live process serves on this path: we never remove it.
    #[error("socket {path} is served by another live process; is a second slicelet running?")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists and is not a socket.
    #[error("{path} exists and is not a socket; refusing to remove it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Even the hashed name does not fit `sun_path`.
    #[error("socket path {path} is {len} bytes, over the {MAX_SOCKET_PATH}-byte unix socket limit; use a shorter --device-plugin-path")]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// Binding or removing failed.
    #[error("binding {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The socket file name for `resource` inside `dir`.
pub fn socket_name(dir: &Path, resource: &str) -> String {
    let plain = format!("slicelet-{}.sock", resource.replace('/', "_"));
    if dir.join(&plain).as_os_str().len() <= MAX_SOCKET_PATH {
        return plain;
    }
    let h = Sha256::digest(resource.as_bytes());
    let hex: String = h.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("slicelet-{hex}.sock")
}

/// A bound listener and the identity of its socket file, so that only this file is removed
/// later (not a newer socket another process bound at the same path).
#[derive(Debug)]
pub struct BoundSocket {
    /// The listener.
    pub listener: UnixListener,
    /// Full path of the socket file.
    pub path: PathBuf,
    /// File name (the `endpoint` sent at registration).
    pub endpoint: String,
    /// (device, inode) of the socket file.
    pub id: (u64, u64),
}

/// Binds the socket for `resource` in `dir`. A stale socket of ours (nobody accepts on it) is
/// removed first; a live one is [`SocketError::InUse`].
///
/// # Errors
/// [`SocketError`] naming the path.
pub fn bind(dir: &Path, resource: &str) -> Result<BoundSocket, SocketError> {
    let endpoint = socket_name(dir, resource);
    let path = dir.join(&endpoint);
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(SocketError::TooLong { path, len });
    }
    let io = |source| SocketError::Io {
        path: path.clone(),
        source,
    };
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(SocketError::InUse { path });
            }
            // The kubelet may wipe the directory at the same moment: gone is as good as removed.
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
                _ => {}
            }
        }
        Ok(_) => return Err(SocketError::NotASocket { path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let listener = UnixListener::bind(&path).map_err(io)?;
    let meta = std::fs::symlink_metadata(&path).map_err(io)?;
    Ok(BoundSocket {
        listener,
        path,
        endpoint,
        id: (meta.dev(), meta.ino()),
    })
}

/// Removes the socket file at `path` if it is still the one identified by `id`.
pub fn remove_if_ours(path: &Path, id: (u64, u64)) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if (meta.dev(), meta.ino()) == id {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_injective_and_fit() {
        let dir = Path::new("/var/lib/kubelet/device-plugins");
        assert_eq!(
            socket_name(dir, "nvidia.com/gpu-shared"),
            "slicelet-nvidia.com_gpu-shared.sock"
        );
        assert_ne!(
            socket_name(dir, "nvidia.com/gpu.shared"),
            socket_name(dir, "nvidia.com/gpu_shared")
        );
        let long = format!("example.com/{}", "a".repeat(63));
        let name = socket_name(dir, &long);
        assert!(
            dir.join(&name).as_os_str().len() <= MAX_SOCKET_PATH,
            "{name}"
        );
        assert_ne!(
            name,
            socket_name(dir, &format!("example.com/{}", "b".repeat(63)))
        );
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_live_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = bind(dir.path(), "nvidia.com/gpu").unwrap();
        // Live: someone accepts on it.
        match bind(dir.path(), "nvidia.com/gpu") {
            Err(SocketError::InUse { .. }) => {}
            other => panic!("expected InUse, got {other:?}"),
        }
        let path = first.path.clone();
        drop(first); // listener closed, file left behind: stale
        assert!(path.exists());
        let second = bind(dir.path(), "nvidia.com/gpu").unwrap();
        assert_eq!(second.path, path);
        // A regular file is never removed.
        std::fs::write(dir.path().join("slicelet-x.io_y.sock"), b"").unwrap();
        assert!(matches!(
            bind(dir.path(), "x.io/y"),
            Err(SocketError::NotASocket { .. })
        ));
    }

    #[test]
    fn remove_only_our_inode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, b"").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        remove_if_ours(&p, (meta.dev(), meta.ino() + 1));
        assert!(p.exists());
        remove_if_ours(&p, (meta.dev(), meta.ino()));
        assert!(!p.exists());
    }
}
