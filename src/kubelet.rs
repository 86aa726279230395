//! The registration client: tells the kubelet about one resource server, retrying with capped
//! exponential backoff while `kubelet.sock` is absent or refuses.
//!
//! Protocol (kubelet device manager): `RegisterRequest{version: "v1beta1", endpoint: <socket
//! file name>, resource_name, options}` on `<dir>/kubelet.sock`. The kubelet dials the endpoint
//! back (GetDevicePluginOptions, then ListAndWatch) before it answers, so the resource's server
//! must already be serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backon::BackoffBuilder;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::api::{self, registration_client::RegistrationClient};

/// First retry delay after a failed registration, ms. Small, so that a kubelet.sock that
/// refuses for a moment during a kubelet start costs milliseconds, not a second.
pub const BACKOFF_MIN: Duration = Duration::from_millis(2);
/// Longest delay between registration attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Deadline for one Register call (the kubelet dials back inside it).
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// A registration attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// kubelet.sock could not be reached.
    #[error("connecting to {path}")]
    Connect {
        /// The kubelet socket.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet refused the registration.
    #[error("kubelet refused registration of {resource}: {status}")]
    Refused {
        /// The resource.
        resource: String,
        /// The kubelet's status.
        status: tonic::Status,
    },
    /// `kubelet.sock` is not (or no longer) the socket of the kubelet this registration was
    /// meant for: that kubelet restarted, and the registration is not sent.
    #[error("registration of {resource} superseded: kubelet.sock changed")]
    Superseded {
        /// The resource.
        resource: String,
    },
    /// The call did not finish within [`REGISTER_TIMEOUT`].
    #[error("registration of {resource} timed out after {REGISTER_TIMEOUT:?}")]
    Timeout {
        /// The resource.
        resource: String,
    },
}

/// Opens a gRPC channel over the unix socket at `path`. The URI is a placeholder: tonic needs
/// one, the connector ignores it.
///
/// # Errors
/// The transport error when the socket is absent or refuses.
pub async fn connect(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// The identity of one `kubelet.sock`: one kubelet process's socket. A restarted kubelet
/// removes the old socket and binds a new one, so device, inode and change time (ns) differ;
/// the change time tells a new socket from an old one even when the file system reuses the
/// inode number at once (tmpfs does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KubeletId {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl KubeletId {
    /// The identity of the socket at `path` now, or `None` when there is none (the kubelet is
    /// down or restarting).
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = std::fs::symlink_metadata(path).ok()?;
        m.file_type().is_socket().then(|| KubeletId {
            dev: m.dev(),
            ino: m.ino(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        })
    }
}

/// One registration of `resource`, served on `endpoint` (a file name in the same directory as
/// `kubelet_socket`), sent only to the kubelet whose socket is `expected`: the socket is
/// checked before and after connecting, so a registration meant for a kubelet that has since
/// restarted is never delivered to its successor (which would then count two).
///
/// # Errors
/// [`RegisterError`] when the kubelet is unreachable, refuses, takes too long, or its socket
/// is no longer `expected` ([`RegisterError::Superseded`]).
pub async fn register(
    kubelet_socket: &Path,
    expected: KubeletId,
    endpoint: &str,
    resource: &str,
) -> Result<(), RegisterError> {
    let request = api::RegisterRequest {
        version: api::VERSION.to_string(),
        endpoint: endpoint.to_string(),
        resource_name: resource.to_string(),
        options: Some(api::device_plugin_options()),
    };
    let superseded = || RegisterError::Superseded {
        resource: resource.to_string(),
    };
    let call = async {
        if KubeletId::of(kubelet_socket) != Some(expected) {
            return Err(superseded());
        }
        let channel = connect(kubelet_socket)
            .await
            .map_err(|source| RegisterError::Connect {
                path: kubelet_socket.to_path_buf(),
                source,
            })?;
        if KubeletId::of(kubelet_socket) != Some(expected) {
            return Err(superseded());
        }
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|status| RegisterError::Refused {
                resource: resource.to_string(),
                status,
            })?;
        Ok(())
    };
    tokio::time::timeout(REGISTER_TIMEOUT, call)
        .await
        .map_err(|_| RegisterError::Timeout {
            resource: resource.to_string(),
        })?
}

fn backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Registers until it succeeds (returns the identity of the kubelet it registered with) or
/// `stop` is cancelled (returns `None`). It registers only with the kubelet `identity` names
/// (the supervisor's view of the current `kubelet.sock`; `None`: no kubelet yet, so it waits).
/// Between failed attempts it waits the next backoff delay ([`BACKOFF_MIN`] doubling up to
/// [`BACKOFF_MAX`], with jitter), or less when `identity` changes (a new kubelet, and a fresh
/// backoff). When the socket on disk is not the one `identity` names, `recheck` is notified
/// so the supervisor looks again (an event it may have missed), and the attempt waits.
pub async fn register_until_done(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    identity: &mut watch::Receiver<Option<KubeletId>>,
    recheck: &Notify,
    stop: &CancellationToken,
) -> Option<KubeletId> {
    let mut delays = backoff();
    let mut attempt = 0u32;
    loop {
        let Some(expected) = *identity.borrow_and_update() else {
            tokio::select! {
                _ = stop.cancelled() => return None,
                changed = identity.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    continue;
                }
            }
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return None,
            r = register(kubelet_socket, expected, endpoint, resource) => r,
        };
        attempt += 1;
        let delay = match result {
            Ok(()) => {
                tracing::info!(resource, endpoint, attempt, "registered with the kubelet");
                return Some(expected);
            }
            Err(RegisterError::Superseded { .. }) => {
                recheck.notify_one();
                delays.next().unwrap_or(BACKOFF_MAX)
            }
            Err(e) => {
                let delay = delays.next().unwrap_or(BACKOFF_MAX);
                // The first failures are expected while a kubelet starts; say it once, then
                // at every 10th attempt (the ones between are not logged).
                if attempt == 1 || attempt.is_multiple_of(10) {
                    tracing::warn!(resource, attempt, error = %crate::errors::chain(&e), retry_in = ?delay,
                        "registration failed; retrying (logged at attempt 1 and every 10th)");
                }
                delay
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
            changed = identity.changed() => {
                if changed.is_err() {
                    return None;
                }
                delays = backoff();
            }
        }
    }
}

#[cfg(test)]
#[path = "kubelet_tests.rs"]
mod tests;
