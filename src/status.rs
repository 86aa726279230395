//! What an operator can see: `/healthz`, `/readyz` and `/metrics` (Prometheus text through
//! prometheus-client) on `--status-address`, for DaemonSet probes and scraping.
//!
//! - `/healthz`: 200 while the process serves HTTP.
//! - `/readyz`: 200 when a policy is applied, the last policy read was valid, and every
//!   advertised resource is registered with the kubelet (and, with `--nfd-features-file`, the
//!   node labels' feature file is up to date); 503 with the reason otherwise.
//! - `/metrics`: devices per resource and health, registrations per resource, policy
//!   generation and reload failures, Xid events per GPU and Xid, health transitions; and GPU
//!   use (issue 13, written by [`crate::usage::report::Usage`]): `allocation_info`, GPU, MIG
//!   and per-container utilisation/memory/last-active gauges, allocated/free/draining devices
//!   per resource, unattributed processes, samples taken and failed.
//! - `/status`: the node as JSON ([`crate::usage::view::NodeView`]), for `slicelet top`.
//!
//! This file holds the supervisor's [`Status`], readiness and the HTTP server; the metrics
//! registry and the `/status` view are [`Metrics`], in `metrics`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod metrics;

pub use metrics::{Metrics, ViewRequest, VIEW_TIMEOUT};

/// What the supervisor reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Generation of the applied policy (0: none applied yet).
    pub generation: u64,
    /// The last policy rejection, cleared when a policy is applied.
    pub policy_error: Option<String>,
    /// Resources the applied plan advertises.
    pub resources: BTreeSet<String>,
    /// Resources currently registered with the kubelet.
    pub registered: BTreeSet<String>,
    /// Resources with an open ListAndWatch stream (the kubelet got their full list).
    pub streaming: BTreeSet<String>,
    /// Registered resources whose kubelet opened no ListAndWatch stream within the grace
    /// period (10 s) after registration.
    pub stalled: BTreeSet<String>,
    /// Where the status endpoint listens, once bound.
    pub address: Option<SocketAddr>,
    /// Xid events processed since start (critical or not).
    pub xid_events: u64,
    /// Why GPU discovery failed, while slicelet runs without GPUs (`failOnInitError: false`).
    pub discovery_error: Option<String>,
    /// Why GPU re-discovery fails while the last good inventory keeps serving (not a
    /// readiness failure: a note under `/readyz`'s first line).
    pub rediscovery_error: Option<String>,
    /// The node's MIG layout state (`nvidia.com/mig.config.state`: `pending`, `success`,
    /// `failed`); `None` while no layout is asked for.
    pub mig_config_state: Option<&'static str>,
    /// Why the node's MIG layout failed or its file is refused (`--mig-config-file`; a note
    /// under `/readyz`'s first line, not a readiness failure).
    pub mig_config_error: Option<String>,
    /// GPUs (or MIG devices) whose MPS control daemon is ready.
    pub mps_ready: BTreeSet<String>,
    /// GPUs with an MPS limit change pending until their clients are gone.
    pub mps_pending: BTreeSet<String>,
    /// The limits each ready MPS control daemon enforces (when known).
    pub mps_applied: std::collections::BTreeMap<String, crate::plan::MpsLimits>,
    /// Devices the applied plan advertises, over all resources.
    pub devices: usize,
    /// Of those, the Healthy ones.
    pub healthy_devices: usize,
    /// The node's config-selection label value, when it is watched (`--node-name` with a
    /// directory of configs); `None` also when the label is not set.
    pub node_label: Option<String>,
    /// The last Kubernetes API error while watching the node's label (not a readiness
    /// failure: the chosen config keeps serving).
    pub api_error: Option<String>,
    /// Contents written to the NFD feature file (`--nfd-features-file`) since start.
    pub nfd_writes: u64,
    /// Why the NFD feature file could not be updated (cleared by the next success); its labels
    /// may be stale meanwhile.
    pub nfd_error: Option<String>,
    /// Each physical device (GPU or MIG UUID) advertised Unhealthy, and why (an Xid, a lost
    /// GPU, an unresolved CDI name, …); `/readyz` lists them after its first line.
    pub unhealthy: std::collections::BTreeMap<String, String>,
    /// Devices advertised only because a running container holds them (the policy no longer
    /// has them), as `resource device` → `held by ns/pod`; `/readyz` lists them too.
    pub retained: std::collections::BTreeMap<String, String>,
    /// Device IDs running containers hold, as pod-resources last said.
    pub in_use: usize,
    /// Why pod-resources could not be read (not a readiness failure: the last answer keeps
    /// protecting running pods).
    pub in_use_error: Option<String>,
    /// GPU use samples taken since start (`--sample-seconds`), failed ones not counted.
    pub samples: u64,
    /// Why DRA (`--dra`) is not ready: not serving (it is started again after a backoff), or
    /// unable to prepare claims; a readiness failure.
    pub dra_down: Option<String>,
    /// Whether the DRA kubelet plugin's sockets serve (`--dra`).
    pub dra_serving: bool,
    /// Why DRA withdraws Unhealthy devices instead of tainting them (the API server dropped or
    /// refused device taints): not a readiness failure, a note under `/readyz`'s first line.
    pub dra_taints_refused: Option<String>,
    /// Why DRA's watch of this node's ResourceSlices fails (retried): not a readiness failure
    /// (publishing works), a note under `/readyz`'s first line.
    pub dra_slice_watch_error: Option<String>,
    /// Times DRA published its ResourceSlices again because somebody else changed or deleted
    /// them (`slicelet_dra_slices_republished_total`).
    pub dra_slices_republished: u64,
}

impl Status {
    /// Ok when ready, else the reason (for `/readyz`).
    ///
    /// # Errors
    /// [`ReadyError`]: the first of the checks, in this order, that fails.
    pub fn ready(&self) -> Result<(), ReadyError> {
        if let Some(e) = &self.discovery_error {
            return Err(ReadyError::Discovery { reason: e.clone() });
        }
        if let Some(e) = &self.policy_error {
            return Err(ReadyError::Policy { reason: e.clone() });
        }
        if self.generation == 0 {
            return Err(ReadyError::NoPolicy);
        }
        if let Some(e) = &self.dra_down {
            return Err(ReadyError::Dra { reason: e.clone() });
        }
        let missing: Vec<String> = self
            .resources
            .difference(&self.registered)
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ReadyError::NotRegistered { resources: missing });
        }
        if !self.stalled.is_empty() {
            return Err(ReadyError::NoStream {
                resources: self.stalled.iter().cloned().collect(),
            });
        }
        if self.healthy_devices == 0 {
            return Err(ReadyError::NoHealthyDevice {
                advertised: self.devices,
            });
        }
        if let Some(e) = &self.nfd_error {
            return Err(ReadyError::StaleLabels { reason: e.clone() });
        }
        Ok(())
    }
}

/// Why the node is not ready ([`Status::ready`]); its text is `/readyz`'s first line and
/// `/status`'s `ready_reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadyError {
    /// GPU discovery failed ([`Status::discovery_error`]).
    #[error("GPU discovery failed: {reason}")]
    Discovery {
        /// Why, in words.
        reason: String,
    },
    /// The policy was rejected ([`Status::policy_error`]).
    #[error("policy rejected: {reason}")]
    Policy {
        /// Why, in words.
        reason: String,
    },
    /// No policy applied yet (generation 0).
    #[error("no policy applied yet")]
    NoPolicy,
    /// DRA is down or cannot prepare claims ([`Status::dra_down`]).
    #[error("DRA {reason}")]
    Dra {
        /// Why, in words.
        reason: String,
    },
    /// Resources not registered with the kubelet.
    #[error("not registered with the kubelet: {}", resources.join(", "))]
    NotRegistered {
        /// The resource names, in order.
        resources: Vec<String>,
    },
    /// Registered resources the kubelet opened no ListAndWatch stream for.
    #[error("registered, but the kubelet opened no ListAndWatch stream for: {}", resources.join(", "))]
    NoStream {
        /// The resource names, in order.
        resources: Vec<String>,
    },
    /// No advertised device is Healthy.
    #[error("no device is Healthy ({advertised} advertised): every GPU is lost, Unhealthy or waiting for its MPS daemon")]
    NoHealthyDevice {
        /// The devices advertised.
        advertised: usize,
    },
    /// The node labels could not be written ([`Status::nfd_error`]).
    #[error("node labels may be stale: {reason}")]
    StaleLabels {
        /// Why, in words.
        reason: String,
    },
}

impl Status {
    /// One line per Unhealthy device, `Unhealthy <uuid>: <reason>`, then one per retained
    /// device, `Retained <resource> <id>: held by ns/pod`, then `DRA device taints refused:
    /// <why>; Unhealthy devices are withdrawn instead` when the API server has no device
    /// taints, then `DRA ResourceSlice watch failing: <why>; …` while DRA's watch of its
    /// slices fails, then `GPU re-discovery failing: <why>; the last inventory keeps serving`, then
    /// `MIG layout: <why>` when the node's MIG layout failed or its file is refused, for
    /// `/readyz`'s body (empty when every device is Healthy, nothing is retained, taints work,
    /// re-discovery succeeds and the MIG layout, if any, is fine).
    pub fn unhealthy_lines(&self) -> String {
        let unhealthy = self
            .unhealthy
            .iter()
            .map(|(uuid, reason)| format!("Unhealthy {uuid}: {reason}\n"));
        let retained = self
            .retained
            .iter()
            .map(|(device, reason)| format!("Retained {device}: {reason}\n"));
        let taints = self.dra_taints_refused.iter().map(|why| {
            format!("DRA device taints refused: {why}; Unhealthy devices are withdrawn from the ResourceSlices instead\n")
        });
        let slice_watch = self.dra_slice_watch_error.iter().map(|why| {
            format!("DRA ResourceSlice watch failing: {why}; slices somebody else deletes are published again only at the next change or registration\n")
        });
        let rediscovery = self.rediscovery_error.iter().map(|why| {
            format!("GPU re-discovery failing: {why}; the last inventory keeps serving\n")
        });
        let mig = self
            .mig_config_error
            .iter()
            .map(|why| format!("MIG layout: {why}\n"));
        unhealthy
            .chain(retained)
            .chain(taints)
            .chain(slice_watch)
            .chain(rediscovery)
            .chain(mig)
            .collect()
    }
}

/// A `--status-address` that is not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not an address like :8080 or 127.0.0.1:8080")]
pub struct AddressError {
    /// The text given, trimmed.
    pub text: String,
}

/// Parses `--status-address`: empty disables it, `:8080` means every interface (as Go's
/// net.Listen), otherwise `host:port`.
///
/// # Errors
/// [`AddressError`] naming the text when it is not an address.
pub fn parse_address(s: &str) -> Result<Option<SocketAddr>, AddressError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    // `:8080` means every interface, IPv6 and IPv4 (a dual-stack socket, as Go's); `serve`
    // falls back to IPv4 where the node has no IPv6.
    let full = if s.starts_with(':') {
        format!("[::]{s}")
    } else {
        s.to_string()
    };
    full.parse().map(Some).map_err(|_| AddressError {
        text: s.to_string(),
    })
}

#[derive(Clone)]
struct AppState {
    status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let status = s.status.borrow().clone();
    let (code, mut body) = match status.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    };
    body.push_str(&status.unhealthy_lines());
    (code, body)
}

async fn metrics_text(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// `/status`: the latest [`NodeView`](crate::usage::view::NodeView) (see [`crate::usage::view`]
/// for the shape), with the node-level `generation`, `ready` and `ready_reason` taken from the
/// supervisor's status now.
async fn status_json(State(s): State<AppState>) -> impl IntoResponse {
    let mut view = s.metrics.current_view().await;
    {
        let status = s.status.borrow();
        view.generation = status.generation;
        view.ready_reason = status.ready().err().map(|e| e.to_string());
        view.ready = view.ready_reason.is_none();
    }
    match serde_json::to_string(&view) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        ),
        // Only a non-string map key could fail; NodeView has none.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding /status: {e}\n"),
        ),
    }
}

/// Connections the status endpoint serves at once; more wait in the kernel's listen backlog
/// (holding no file descriptor of ours) until one closes.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send a request's headers before it is closed (hyper's
/// `header_read_timeout`), so idle or slowloris connections free their slot.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds `addr` and serves the status endpoints until `stop` is cancelled. Returns the bound
/// address (useful with port 0).
///
/// Connection hygiene (HTTP/1.1 through hyper): at most [`MAX_CONNECTIONS`] at once, each must
/// send its headers within [`HEADER_READ_TIMEOUT`], and a connection serves one request
/// (no keep-alive, so no connection idles between requests). Probes and Prometheus open a
/// connection per scrape, so nothing is lost; 200 idle connections cannot exhaust file
/// descriptors or starve a probe for longer than the header timeout.
///
/// # Errors
/// The bind error.
pub async fn serve(
    addr: SocketAddr,
    status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Err(_) if addr.ip() == std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) => {
            tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, addr.port())).await?
        }
        other => other?,
    };
    let local = listener.local_addr()?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/status", get(status_json))
        .with_state(AppState { status, metrics });
    let handle = tokio::spawn(accept_loop(listener, app, stop));
    Ok((local, handle))
}

async fn accept_loop(listener: tokio::net::TcpListener, app: Router, stop: CancellationToken) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false);
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        let (io, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "status endpoint accept");
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(HEADER_READ_TIMEOUT, conn).await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile_tests;
