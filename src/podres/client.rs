//! The pod-resources client: one `List` over the kubelet's unix socket, bounded in time and
//! size, and spaced so slicelet never exceeds the kubelet's rate limit.
//!
//! The kubelet limits the pod-resources service to 100 requests a second with bursts of 10
//! (`pkg/kubelet/apis/podresources/server_v1.go`'s limiter) and answers `ResourceExhausted`
//! beyond. slicelet sends one request at a time (the shell never starts a second while one is
//! in flight) and at least [`MIN_SPACING`] apart, so it stays under 100 a second by
//! construction, whatever asks for a refresh (the timer, each Allocate, each change that would
//! withdraw devices).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::podresources::{
    pod_resources_lister_client::PodResourcesListerClient, ListPodResourcesRequest,
};

use crate::in_use::InUse;

/// Least time between two requests: 10 ms, the kubelet's sustained limit of 100 a second.
pub const MIN_SPACING: Duration = Duration::from_millis(10);
/// Longest one `List` (connect included) may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer accepted, bytes (the kubelet's own gRPC limit is 16 MiB; a node with 110
/// pods answers in a few KiB).
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// A pod-resources read failed.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket does not exist (the kubelet does not serve pod-resources, or the directory
    /// is not mounted into the pod).
    #[error("pod-resources socket {path} does not exist (mount /var/lib/kubelet/pod-resources)")]
    Missing {
        /// The socket.
        path: PathBuf,
    },
    /// Connecting failed.
    #[error("connecting to pod-resources at {path}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// `List` failed (`ResourceExhausted` when rate-limited).
    #[error("pod-resources List at {path}: {status}")]
    List {
        /// The socket.
        path: PathBuf,
        /// The gRPC status (code and message).
        status: Box<tonic::Status>,
    },
    /// No answer within [`TIMEOUT`].
    #[error("pod-resources at {path} did not answer within {TIMEOUT:?}")]
    Timeout {
        /// The socket.
        path: PathBuf,
    },
}

/// Asks the kubelet at `socket` which device IDs running containers hold.
///
/// # Errors
/// [`PodResourcesError`]: the socket is missing, the connection or `List` failed, or no
/// answer came within [`TIMEOUT`].
pub async fn list(socket: &Path) -> Result<InUse, PodResourcesError> {
    let path = socket.to_path_buf();
    match tokio::time::timeout(TIMEOUT, list_inner(&path)).await {
        Ok(r) => r,
        Err(_) => Err(PodResourcesError::Timeout { path }),
    }
}

async fn list_inner(path: &Path) -> Result<InUse, PodResourcesError> {
    if std::fs::symlink_metadata(path).is_err() {
        return Err(PodResourcesError::Missing {
            path: path.to_path_buf(),
        });
    }
    let channel =
        crate::kubelet::connect(path)
            .await
            .map_err(|source| PodResourcesError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
    let mut client =
        PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
    let answer = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|status| PodResourcesError::List {
            path: path.to_path_buf(),
            status: Box::new(status),
        })?;
    Ok(InUse::from_list(answer.get_ref()))
}
