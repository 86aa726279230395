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

use crate::health::Health;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::plan::Plan;
use crate::usage::metrics::{ResourceLabels, UsageMetrics};
use crate::usage::view::NodeView;

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
}

impl Status {
    /// Ok when ready, else the reason (for `/readyz`).
    ///
    /// # Errors
    /// A sentence saying what is missing.
    pub fn ready(&self) -> Result<(), String> {
        if let Some(e) = &self.discovery_error {
            return Err(format!("GPU discovery failed: {e}"));
        }
        if let Some(e) = &self.policy_error {
            return Err(format!("policy rejected: {e}"));
        }
        if self.generation == 0 {
            return Err("no policy applied yet".to_string());
        }
        if let Some(e) = &self.dra_down {
            return Err(format!("DRA {e}"));
        }
        let missing: Vec<&str> = self
            .resources
            .difference(&self.registered)
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "not registered with the kubelet: {}",
                missing.join(", ")
            ));
        }
        if !self.stalled.is_empty() {
            let names: Vec<&str> = self.stalled.iter().map(String::as_str).collect();
            return Err(format!(
                "registered, but the kubelet opened no ListAndWatch stream for: {}",
                names.join(", ")
            ));
        }
        if self.healthy_devices == 0 {
            return Err(format!(
                "no device is Healthy ({} advertised): every GPU is lost, Unhealthy or waiting for its MPS daemon",
                self.devices
            ));
        }
        if let Some(e) = &self.nfd_error {
            return Err(format!("node labels may be stale: {e}"));
        }
        Ok(())
    }
}

impl Status {
    /// One line per Unhealthy device, `Unhealthy <uuid>: <reason>`, then one per retained
    /// device, `Retained <resource> <id>: held by ns/pod`, for `/readyz`'s body (empty when
    /// every device is Healthy and nothing is retained).
    pub fn unhealthy_lines(&self) -> String {
        let unhealthy = self
            .unhealthy
            .iter()
            .map(|(uuid, reason)| format!("Unhealthy {uuid}: {reason}\n"));
        let retained = self
            .retained
            .iter()
            .map(|(device, reason)| format!("Retained {device}: {reason}\n"));
        unhealthy.chain(retained).collect()
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    health: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    xid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    gpu: String,
    to: String,
}

/// A `/status` request to the supervisor: it sends the view back on this.
pub type ViewRequest = tokio::sync::oneshot::Sender<NodeView>;

/// Longest `/status` waits for the supervisor's view before serving the last one set.
pub const VIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// slicelet's Prometheus metrics, and the latest `/status` view.
pub struct Metrics {
    registry: Registry,
    devices: Family<DeviceLabels, Gauge>,
    registrations: Family<ResourceLabels, Counter>,
    policy_generation: Gauge,
    /// `slicelet_dra_up`: 1 while `--dra` serves, 0 while it is down (and retried).
    dra_up: Gauge,
    policy_reload_failures: Counter,
    xid_events: Family<XidLabels, Counter>,
    health_transitions: Family<TransitionLabels, Counter>,
    pub(crate) usage: UsageMetrics,
    /// The latest `/status` body (without the node-level fields, filled per request). A
    /// `std` lock held only to clone or swap the `Arc`, never across `.await`.
    view: std::sync::RwLock<Arc<NodeView>>,
    /// Where `/status` asks the supervisor for the view, built per request from its state
    /// (so no copy of it is kept between requests); `None`: the view set last is served.
    views: std::sync::RwLock<Option<tokio::sync::mpsc::Sender<ViewRequest>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The GPU-use families, for [`crate::usage::report::Usage`] to write.
    pub fn usage(&self) -> &UsageMetrics {
        &self.usage
    }

    /// A registry with every slicelet metric, prefixed `slicelet_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("slicelet");
        let devices = Family::<DeviceLabels, Gauge>::default();
        registry.register(
            "devices",
            "Devices advertised, by resource and health",
            devices.clone(),
        );
        let registrations = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "registrations",
            "Successful registrations with the kubelet, by resource",
            registrations.clone(),
        );
        let policy_generation = Gauge::default();
        registry.register(
            "policy_generation",
            "Generation of the applied policy",
            policy_generation.clone(),
        );
        let dra_up = Gauge::default();
        registry.register(
            "dra_up",
            "1 while the DRA kubelet plugin serves (with --dra), 0 while it is down and retried",
            dra_up.clone(),
        );
        let policy_reload_failures = Counter::default();
        registry.register(
            "policy_reload_failures",
            "Policy reads that were rejected",
            policy_reload_failures.clone(),
        );
        let xid_events = Family::<XidLabels, Counter>::default();
        registry.register(
            "xid_events",
            "NVML Xid events, by GPU UUID and Xid",
            xid_events.clone(),
        );
        let health_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "health_transitions",
            "Device health transitions, by UUID and new state",
            health_transitions.clone(),
        );
        let usage = UsageMetrics::register(&mut registry);
        Metrics {
            registry,
            devices,
            registrations,
            policy_generation,
            dra_up,
            policy_reload_failures,
            xid_events,
            health_transitions,
            usage,
            view: std::sync::RwLock::new(Arc::new(NodeView::default())),
            views: std::sync::RwLock::new(None),
        }
    }

    /// Counts a GPU use sample that could not be taken (an NVML error on the hardware actor);
    /// `slicelet_sample_failures_total`. Successful samples are counted by
    /// [`crate::usage::report::Usage::sampled`].
    pub fn sample_failed(&self) {
        self.usage.sample_failures.inc();
    }

    /// Replaces what `/status` serves ([`crate::usage::report::Usage`] does it after each
    /// sample and each allocation change).
    pub fn set_view(&self, view: Arc<NodeView>) {
        // A poisoned lock only means a panic elsewhere while swapping an Arc: the value is
        // whole either way.
        *self
            .view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
    }

    /// Makes `/status` ask `requests` for the view: the supervisor answers each request with
    /// one built from its state at that moment.
    pub fn answer_views(&self, requests: tokio::sync::mpsc::Sender<ViewRequest>) {
        *self
            .views
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(requests);
    }

    /// The view `/status` serves: the supervisor's answer (within [`VIEW_TIMEOUT`]), else the
    /// view set last ([`Metrics::set_view`]).
    pub async fn current_view(&self) -> NodeView {
        let requests = self
            .views
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(tx) = requests {
            // The whole exchange is bounded: a supervisor that is busy (its queue full) or
            // slow to answer costs `/status` at most VIEW_TIMEOUT.
            let ask = async {
                let (answer, view) = tokio::sync::oneshot::channel();
                tx.send(answer).await.ok()?;
                view.await.ok()
            };
            if let Ok(Some(v)) = tokio::time::timeout(VIEW_TIMEOUT, ask).await {
                return v;
            }
        }
        (*self.view()).clone()
    }

    /// What `/status` serves now (node-level `generation`/`ready` are filled per request).
    pub fn view(&self) -> Arc<NodeView> {
        Arc::clone(
            &self
                .view
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Sets the device gauges from a plan.
    pub fn set_plan(&self, plan: &Plan) {
        self.devices.clear();
        for (name, r) in &plan.resources {
            let healthy = r.devices.iter().filter(|d| d.health.is_healthy()).count() as i64;
            let total = r.devices.len() as i64;
            for (health, n) in [
                (Health::Healthy.as_str(), healthy),
                (Health::Unhealthy.as_str(), total - healthy),
            ] {
                self.devices
                    .get_or_create(&DeviceLabels {
                        resource: name.clone(),
                        health: health.to_string(),
                    })
                    .set(n);
            }
        }
    }

    /// Counts a registration.
    pub fn registered(&self, resource: &str) {
        self.registrations
            .get_or_create(&ResourceLabels {
                resource: resource.to_string(),
            })
            .inc();
    }

    /// Records an applied policy generation.
    pub fn policy_applied(&self, generation: u64) {
        self.policy_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    /// Counts a rejected policy read.
    pub fn policy_rejected(&self) {
        self.policy_reload_failures.inc();
    }

    /// Sets `slicelet_dra_up` (1 serving, 0 down).
    pub fn set_dra_up(&self, up: bool) {
        self.dra_up.set(i64::from(up));
    }

    /// Counts an Xid event.
    pub fn xid(&self, gpu: &str, xid: u64) {
        self.xid_events
            .get_or_create(&XidLabels {
                gpu: gpu.to_string(),
                xid: xid.to_string(),
            })
            .inc();
    }

    /// Counts a health transition.
    pub fn transition(&self, gpu: &str, to: Health) {
        let to = to.as_str();
        self.health_transitions
            .get_or_create(&TransitionLabels {
                gpu: gpu.to_string(),
                to: to.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Parses `--status-address`: empty disables it, `:8080` means every interface (as Go's
/// net.Listen), otherwise `host:port`.
///
/// # Errors
/// The text when it is not an address.
pub fn parse_address(s: &str) -> Result<Option<SocketAddr>, String> {
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
    full.parse()
        .map(Some)
        .map_err(|_| format!("`{s}` is not an address like :8080 or 127.0.0.1:8080"))
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

/// `/status`: the latest [`NodeView`] (see [`crate::usage::view`] for the shape), with the
/// node-level `generation`, `ready` and `ready_reason` taken from the supervisor's status now.
async fn status_json(State(s): State<AppState>) -> impl IntoResponse {
    let mut view = s.metrics.current_view().await;
    {
        let status = s.status.borrow();
        view.generation = status.generation;
        view.ready_reason = status.ready().err();
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
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_address("").unwrap(), None);
        assert_eq!(
            // Regression: `:8080` bound IPv4 only, so probes failed on IPv6-only clusters.
            parse_address(":8080").unwrap(),
            Some("[::]:8080".parse().unwrap())
        );
        assert_eq!(
            parse_address("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert!(parse_address("8080").is_err());
    }

    #[test]
    fn readiness() {
        let mut s = Status::default();
        assert!(s.ready().unwrap_err().contains("no policy"));
        s.generation = 1;
        s.resources.insert("nvidia.com/a".into());
        assert!(s.ready().unwrap_err().contains("nvidia.com/a"));
        s.registered.insert("nvidia.com/a".into());
        // Regression: with every GPU lost at start, nothing usable was advertised but /readyz
        // said ready.
        s.devices = 8;
        assert!(s
            .ready()
            .unwrap_err()
            .contains("no device is Healthy (8 advertised)"));
        s.healthy_devices = 1;
        assert!(s.ready().is_ok());
        // Regression: registered, but the kubelet never opened ListAndWatch: was ready.
        s.stalled.insert("nvidia.com/a".into());
        assert!(s
            .ready()
            .unwrap_err()
            .contains("opened no ListAndWatch stream for: nvidia.com/a"));
        s.stalled.clear();
        assert!(s.ready().is_ok());
        // A feature file that cannot be written leaves stale node labels: not ready.
        s.nfd_error = Some("writing /x/.slicelet.tmp: read-only file system".into());
        assert!(s
            .ready()
            .unwrap_err()
            .contains("node labels may be stale: writing /x/.slicelet.tmp"));
        s.nfd_error = None;
        assert!(s.ready().is_ok());
        s.policy_error = Some("x: bad".into());
        assert!(s.ready().unwrap_err().contains("x: bad"));
        // Regression: running without GPUs (failOnInitError: false) reported ready.
        s.policy_error = None;
        s.discovery_error = Some("initialising NVML: driver not loaded".into());
        assert!(s.ready().unwrap_err().contains("driver not loaded"));
    }

    #[test]
    fn metrics_text() {
        let m = Metrics::new();
        m.registered("nvidia.com/a");
        m.xid("GPU-1", 79);
        m.transition("GPU-1", Health::Unhealthy);
        m.policy_applied(3);
        let text = m.encode();
        for want in [
            "slicelet_registrations_total{resource=\"nvidia.com/a\"} 1",
            "slicelet_xid_events_total{gpu=\"GPU-1\",xid=\"79\"} 1",
            "slicelet_health_transitions_total{gpu=\"GPU-1\",to=\"Unhealthy\"} 1",
            "slicelet_policy_generation 3",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }

    /// A supervisor whose view queue is full (it is busy) costs `/status` VIEW_TIMEOUT at
    /// most, and the view set last is served (the send used to wait without bound).
    #[tokio::test(start_paused = true)]
    async fn a_busy_supervisor_costs_status_the_view_timeout_at_most() {
        let metrics = Metrics::new();
        let mut set = NodeView::default();
        set.free.insert("nvidia.com/gpu".into(), 3);
        metrics.set_view(Arc::new(set.clone()));
        let (tx, _rx) = tokio::sync::mpsc::channel::<ViewRequest>(1);
        let (queued, _) = tokio::sync::oneshot::channel();
        tx.try_send(queued).unwrap();
        metrics.answer_views(tx);
        let started = tokio::time::Instant::now();
        let view = tokio::time::timeout(VIEW_TIMEOUT * 2, metrics.current_view())
            .await
            .expect("/status waited past its view timeout on a full queue");
        assert_eq!(view, set);
        assert_eq!(started.elapsed(), VIEW_TIMEOUT);
    }
}

#[cfg(test)]
mod hostile_tests;
