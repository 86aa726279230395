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
use tokio::sync::Notify;
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
    #[error("connecting to {path}: {source}")]
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

/// One registration of `resource`, served on `endpoint` (a file name in the same directory as
/// `kubelet_socket`).
///
/// # Errors
/// [`RegisterError`] when the kubelet is unreachable, refuses, or takes too long.
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
) -> Result<(), RegisterError> {
    let request = api::RegisterRequest {
        version: api::VERSION.to_string(),
        endpoint: endpoint.to_string(),
        resource_name: resource.to_string(),
        options: Some(crate::plugin::options()),
    };
    let call = async {
        let channel = connect(kubelet_socket)
            .await
            .map_err(|source| RegisterError::Connect {
                path: kubelet_socket.to_path_buf(),
                source,
            })?;
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

/// The error and its sources on one line ("transport error: No such file or directory").
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = s.source();
    }
    out
}

fn backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(BACKOFF_MIN)
        .with_max_delay(BACKOFF_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Registers until it succeeds or `stop` is cancelled (then returns false). Between attempts it
/// waits the next backoff delay ([`BACKOFF_MIN`] doubling up to [`BACKOFF_MAX`], with jitter), or
/// less when `kubelet_appeared` is notified (a new kubelet.sock was created).
pub async fn register_until_done(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
    kubelet_appeared: &Notify,
    stop: &CancellationToken,
) -> bool {
    let mut delays = backoff();
    let mut attempt = 0u32;
    loop {
        // Subscribe before trying, so a kubelet.sock created during the attempt is not missed.
        let appeared = kubelet_appeared.notified();
        tokio::pin!(appeared);
        appeared.as_mut().enable();
        let result = tokio::select! {
            _ = stop.cancelled() => return false,
            r = register(kubelet_socket, endpoint, resource) => r,
        };
        attempt += 1;
        match result {
            Ok(()) => {
                tracing::info!(resource, endpoint, attempt, "registered with the kubelet");
                return true;
            }
            Err(e) => {
                let delay = delays.next().unwrap_or(BACKOFF_MAX);
                // The first failures are expected while a kubelet starts; say it once, then
                // at every 10th attempt (the ones between are not logged).
                if attempt == 1 || attempt.is_multiple_of(10) {
                    tracing::warn!(resource, attempt, error = %chain(&e), retry_in = ?delay,
                        "registration failed; retrying (logged at attempt 1 and every 10th)");
                }
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(delay) => {}
                    _ = appeared => {
                        delays = backoff();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "kubelet_tests.rs"]
mod tests;
