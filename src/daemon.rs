//! The supervisor: the one owner of mutable state. It loads the policy, discovers GPUs, builds
//! the plan, publishes plan snapshots through a `watch` channel, starts and stops one resource
//! server per advertised resource, re-binds and re-registers after a kubelet restart, reloads
//! the policy and the simulated node when their directories change, tracks GPU health, serves
//! the status endpoint, and drains on shutdown.
//!
//! Failure rules:
//! - An invalid policy never loses state: at start nothing is registered until the file becomes
//!   valid; on reload the last good policy keeps serving. Each rejection is logged once with the
//!   field path and shown by `/readyz`.
//! - NVML failing at start: `flags.failOnInitError` (default true) decides between exiting with
//!   an error and staying up advertising nothing while retrying NVML periodically.
//! - A critical Xid marks the device Unhealthy in every resource built on it; it recovers after
//!   the quiet period if NVML still answers for it.
//! - MPS: the supervisor runs (or, with `--mps-external`, only checks) one control daemon per
//!   GPU under MPS ([`crate::mps`]); a GPU's MPS devices are Healthy only while its daemon is
//!   ready, folded into every plan the way Xid health is folded into the inventory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::KUBELET_SOCKET;
use crate::health::{Tracker, Transition, XidPolicy, DEFAULT_RECOVERY};
use crate::inventory::nvml::NvmlSource;
use crate::inventory::simulated::SimulatedSource;
use crate::inventory::{DeviceEvent, EventSink, GpuSource, Inventory, InventoryError, XidEvent};
use crate::mps;
use crate::plan::{self, MpsObserved, Plan};
use crate::plugin::{self, StreamLost};
use crate::policy::{self, Policy};
pub use crate::status::Status;
use crate::status::{self as status_http, Metrics};
use crate::watch::{self as fswatch, Event, WatchError};

/// Debounce between a change in the policy directory and the re-read.
pub const POLICY_DEBOUNCE: Duration = Duration::from_millis(100);
/// How long shutdown waits for servers to stop before aborting them.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(4);
/// How long shutdown waits for MPS control daemons to quit before killing them.
pub const MPS_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(3);
/// First delay before registering again after the kubelet closed a stream; also a grace
/// period in which a kubelet restart (new kubelet.sock) supersedes it, so one restart costs one
/// registration.
const LOST_STREAM_MIN_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between re-registrations of a resource whose streams keep being closed.
const LOST_STREAM_MAX_DELAY: Duration = Duration::from_secs(30);
/// A stream that lasted this long resets the re-registration backoff.
const LOST_STREAM_RESET: Duration = Duration::from_secs(60);
/// How often resources whose socket could not be bound are tried again.
const BIND_RETRY: Duration = Duration::from_secs(1);
/// How long a restart waits for the previous server of a resource before aborting it.
const RESTART_DEADLINE: Duration = Duration::from_millis(200);

/// Everything the daemon needs, resolved from the command line once.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The policy file (a ConfigMap mounted as a directory).
    pub config: PathBuf,
    /// The kubelet's device-plugin directory.
    pub device_plugin_path: PathBuf,
    /// A simulated node file instead of NVML.
    pub simulate: Option<PathBuf>,
    /// Where to load libnvidia-ml.so.1 from (default: the dynamic loader's search path).
    pub nvml_library: Option<PathBuf>,
    /// Where sysfs is mounted (NUMA node lookup), default `/sys`.
    pub sysfs_root: PathBuf,
    /// The host root holding `/dev`, for device specs, default `/`.
    pub dev_root: String,
    /// The host root holding `/proc` (MIG nvidia-caps minors in
    /// `proc/driver/nvidia-caps/mig-minors`), default `/`.
    pub proc_root: PathBuf,
    /// How often to retry NVML when it failed at start with `failOnInitError: false`.
    pub nvml_retry_interval: Duration,
    /// How often to re-read the policy even without a file event (safety net).
    pub policy_resync_interval: Duration,
    /// How often to re-discover GPUs (MIG layout changes, GPUs that fell off the bus).
    pub inventory_resync_interval: Duration,
    /// Where `/healthz`, `/readyz` and `/metrics` listen; `None` disables them.
    pub status_address: Option<std::net::SocketAddr>,
    /// `DP_DISABLE_HEALTHCHECKS`, as NVIDIA's plugin reads it.
    pub disable_healthchecks: Option<String>,
    /// `DP_ENABLE_HEALTHCHECKS`, as NVIDIA's plugin reads it.
    pub enable_healthchecks: Option<String>,
    /// MPS control daemons: the binary, in-process or external, check interval, backoff.
    pub mps: mps::Config,
}

impl Settings {
    /// Settings with the defaults for everything but the policy file and directory.
    pub fn new(config: impl Into<PathBuf>, device_plugin_path: impl Into<PathBuf>) -> Self {
        Settings {
            config: config.into(),
            device_plugin_path: device_plugin_path.into(),
            simulate: None,
            nvml_library: None,
            sysfs_root: PathBuf::from("/sys"),
            dev_root: "/".to_string(),
            proc_root: PathBuf::from("/"),
            nvml_retry_interval: Duration::from_secs(30),
            policy_resync_interval: Duration::from_secs(60),
            inventory_resync_interval: Duration::from_secs(60),
            status_address: None,
            disable_healthchecks: None,
            enable_healthchecks: None,
            mps: mps::Config::default(),
        }
    }
}

/// The daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// GPU discovery failed and `failOnInitError` asks to fail (or the simulated node is
    /// invalid).
    #[error("GPU discovery failed (flags.failOnInitError is true; set it to false to keep running without GPUs)")]
    Inventory(#[source] InventoryError),
    /// The simulated node file is unusable.
    #[error(transparent)]
    Simulated(InventoryError),
    /// A directory could not be watched.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS` cannot be read.
    #[error(transparent)]
    HealthEnv(#[from] crate::health::XidEnvError),
    /// The status endpoint could not listen.
    #[error("status endpoint on {address}: {source}")]
    Status {
        /// The address.
        address: std::net::SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The device-plugin directory could not be created.
    #[error("creating device-plugin directory {path}: {source}")]
    DevicePluginDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

struct ResourceServer {
    epoch: u64,
    stop: CancellationToken,
    serve: JoinHandle<()>,
    register: JoinHandle<()>,
    path: PathBuf,
    id: (u64, u64),
}

struct Supervisor {
    settings: Settings,
    source: Option<Box<dyn GpuSource>>,
    inventory: Inventory,
    policy: Option<Policy>,
    policy_hash: Option<[u8; 32]>,
    generation: u64,
    plans: watch::Sender<Arc<Plan>>,
    servers: BTreeMap<String, ResourceServer>,
    kubelet_appeared: Arc<Notify>,
    shutdown: CancellationToken,
    status: Arc<watch::Sender<Status>>,
    metrics: Arc<Metrics>,
    tracker: Tracker,
    xid_policy: XidPolicy,
    epoch: u64,
    lost_tx: mpsc::UnboundedSender<StreamLost>,
    /// Resources whose socket could not be bound; retried every second and when a socket of
    /// ours disappears.
    unserved: std::collections::BTreeSet<String>,
    /// The last re-discovery error, so it is logged once until it changes or clears.
    discovery_error: Option<String>,
    /// Per resource: the backoff between re-registrations after lost streams, and when the
    /// last stream was lost (quiet for [`LOST_STREAM_RESET`] resets it).
    lost_backoff: BTreeMap<String, (backon::ExponentialBackoff, Instant)>,
    /// The MPS daemons' supervisor (None once shut down).
    mps: Option<mps::Supervisor>,
    /// What it last reported per GPU/MIG UUID.
    mps_observed: BTreeMap<String, MpsObserved>,
    /// Daemons with a limit change pending.
    mps_pending: std::collections::BTreeSet<String>,
    /// GPUs set to EXCLUSIVE_PROCESS for MPS, to restore.
    compute: mps::ComputeModes,
    events: EventSink,
}

pub(crate) fn open_source(settings: &Settings) -> Result<Box<dyn GpuSource>, InventoryError> {
    match &settings.simulate {
        Some(path) => Ok(Box::new(
            SimulatedSource::new(path).with_proc_root(&settings.proc_root),
        )),
        None => Ok(Box::new(
            NvmlSource::new(settings.nvml_library.as_deref(), Some(&settings.sysfs_root))?
                .with_proc_root(&settings.proc_root),
        )),
    }
}

/// Opens the configured GPU source and discovers the node's GPUs once (for `plan`/`validate`).
///
/// # Errors
/// [`InventoryError`] from NVML or the simulated node file.
pub fn discover(settings: &Settings) -> Result<(Inventory, String), InventoryError> {
    let mut source = open_source(settings)?;
    let inv = source.discover()?;
    Ok((inv, source.describe()))
}

/// Runs the daemon until `shutdown` is cancelled, then stops every server, ends every
/// ListAndWatch stream and removes its sockets.
///
/// # Errors
/// [`DaemonError`] when it cannot start: GPU discovery failing with `failOnInitError: true`,
/// an invalid simulated node, or an unwatchable directory. An invalid policy is not an error.
pub async fn run(settings: Settings, shutdown: CancellationToken) -> Result<(), DaemonError> {
    run_with_status(settings, shutdown, watch::channel(Status::default()).0).await
}

/// [`run`], publishing the supervisor's [`Status`] on `status`.
///
/// # Errors
/// As [`run`].
pub async fn run_with_status(
    settings: Settings,
    shutdown: CancellationToken,
    status: watch::Sender<Status>,
) -> Result<(), DaemonError> {
    std::fs::create_dir_all(&settings.device_plugin_path).map_err(|source| {
        DaemonError::DevicePluginDir {
            path: settings.device_plugin_path.clone(),
            source,
        }
    })?;
    let xid_env = XidPolicy::new(
        settings.disable_healthchecks.as_deref(),
        settings.enable_healthchecks.as_deref(),
        &[],
        &[],
    )?;
    for e in &xid_env.skipped {
        tracing::warn!(variable = e.var, item = %e.item, "not an Xid, `all` or `xids`; skipped");
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut _watches = fswatch::start(
        &settings.config,
        &settings.device_plugin_path,
        settings.simulate.as_deref(),
        tx.clone(),
    )?;
    let status = Arc::new(status);
    let metrics = Arc::new(Metrics::new());
    let status_server = match settings.status_address {
        Some(address) => {
            let (local, handle) = status_http::serve(
                address,
                status.subscribe(),
                Arc::clone(&metrics),
                shutdown.child_token(),
            )
            .await
            .map_err(|source| DaemonError::Status { address, source })?;
            tracing::info!(address = %local, "serving /healthz, /readyz and /metrics");
            status.send_modify(|s| s.address = Some(local));
            Some(handle)
        }
        None => None,
    };
    let (lost_tx, mut lost_rx) = mpsc::unbounded_channel();
    let (mps_tx, mut mps_rx) = mpsc::unbounded_channel();
    let mps = mps::Supervisor::spawn(settings.mps.clone(), mps_tx);
    let (event_tx, mut event_rx) = mpsc::unbounded_channel::<DeviceEvent>();
    let events: EventSink = Arc::new(move |e| {
        let _ = event_tx.send(e);
    });
    let (plans, _) = watch::channel(Arc::new(Plan::default()));
    let mut sup = Supervisor {
        source: None,
        inventory: Inventory::default(),
        policy: None,
        policy_hash: None,
        generation: 0,
        plans,
        servers: BTreeMap::new(),
        kubelet_appeared: Arc::new(Notify::new()),
        shutdown: shutdown.clone(),
        status,
        metrics,
        tracker: Tracker::new(Some(DEFAULT_RECOVERY)),
        xid_policy: xid_env,
        epoch: 0,
        lost_tx,
        unserved: Default::default(),
        discovery_error: None,
        lost_backoff: BTreeMap::new(),
        mps: Some(mps),
        mps_observed: BTreeMap::new(),
        mps_pending: Default::default(),
        compute: mps::ComputeModes::default(),
        events,
        settings,
    };
    // The policy decides failOnInitError, so read it first (an invalid one means the default).
    let first_policy = sup.read_policy().ok().flatten();
    let fail_on_init_error = first_policy.as_ref().is_none_or(|p| p.fail_on_init_error);
    sup.open_inventory(fail_on_init_error)?;
    sup.reload_policy(true);
    sup.take_source_events();

    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut policy_debounce: Option<Instant> = None;
    let mut node_debounce: Option<Instant> = None;
    let mut resync = tokio::time::interval(sup.settings.policy_resync_interval);
    resync.tick().await;
    let mut inventory_resync = tokio::time::interval(sup.settings.inventory_resync_interval);
    inventory_resync.tick().await;
    let mut nvml_retry = tokio::time::interval(sup.settings.nvml_retry_interval);
    nvml_retry.tick().await;
    let mut bind_retry = tokio::time::interval(BIND_RETRY);
    bind_retry.tick().await;
    loop {
        let recovery = sup.tracker.next_deadline().map(Instant::from_std);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(ev) = rx.recv() => {
                let mut restart = false;
                let mut next = Some(ev);
                while let Some(ev) = next {
                    match ev {
                        Event::PolicyDirChanged => {
                            policy_debounce.get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
                        }
                        Event::PolicyDirReplaced => {
                            match fswatch::start(&sup.settings.config, &sup.settings.device_plugin_path, sup.settings.simulate.as_deref(), tx.clone()) {
                                Ok(w) => {
                                    tracing::info!("the policy directory was replaced; watching the new one");
                                    _watches = w;
                                }
                                Err(e) => tracing::error!(error = %e, "re-watching the replaced policy directory failed; the periodic re-read still applies"),
                            }
                            policy_debounce.get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
                        }
                        Event::NodeDirChanged => {
                            node_debounce.get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
                        }
                        Event::KubeletSocketCreated => {
                            tracing::info!("kubelet.sock created: kubelet restart seen; re-registering every resource");
                            restart = true;
                        }
                        Event::PluginSocketRemoved(name) => {
                            restart |= sup.socket_lost(&name);
                            sup.retry_unserved();
                        }
                    }
                    next = rx.try_recv().ok();
                }
                if restart {
                    sup.restart_all().await;
                    sup.kubelet_appeared.notify_waiters();
                }
            }
            Some(lost) = lost_rx.recv() => sup.stream_lost(lost).await,
            Some(ev) = mps_rx.recv() => {
                let mut next = Some(ev);
                while let Some(ev) = next {
                    sup.note_mps(ev);
                    next = mps_rx.try_recv().ok();
                }
                sup.replan();
                sup.publish_mps_status();
            }
            Some(ev) = event_rx.recv() => sup.device_event(ev),
            _ = async { tokio::time::sleep_until(policy_debounce.expect("guarded")).await }, if policy_debounce.is_some() => {
                policy_debounce = None;
                sup.reload_policy(false);
            }
            _ = async { tokio::time::sleep_until(node_debounce.expect("guarded")).await }, if node_debounce.is_some() => {
                node_debounce = None;
                sup.resync_inventory();
            }
            _ = async { tokio::time::sleep_until(recovery.expect("guarded")).await }, if recovery.is_some() => {
                sup.recover();
            }
            Some(_) = async { hangup.as_mut()?.recv().await }, if hangup.is_some() => {
                tracing::info!("SIGHUP: re-reading the policy and re-discovering GPUs");
                sup.reload_policy(true);
                sup.resync_inventory();
            }
            _ = resync.tick() => sup.reload_policy(false),
            _ = inventory_resync.tick(), if sup.source.is_some() => sup.resync_inventory(),
            _ = nvml_retry.tick(), if sup.source.is_none() => sup.retry_inventory(),
            _ = bind_retry.tick(), if !sup.unserved.is_empty() => sup.retry_unserved(),
        }
    }
    // Stop serving and stop the MPS daemons together (each has its own deadline).
    let mps = sup.mps.take();
    tokio::join!(sup.stop_all(SHUTDOWN_DEADLINE), async {
        if let Some(m) = mps {
            m.shutdown(MPS_SHUTDOWN_DEADLINE).await;
        }
    });
    if let Some(source) = sup.source.as_mut() {
        sup.compute.restore_all(source.as_mut());
    }
    if let Some(h) = status_server {
        let _ = tokio::time::timeout(Duration::from_secs(1), h).await;
    }
    tracing::info!("stopped: every stream ended and every socket removed");
    Ok(())
}

impl Supervisor {
    fn kubelet_socket(&self) -> PathBuf {
        self.settings.device_plugin_path.join(KUBELET_SOCKET)
    }

    /// Reads and parses the policy file. Ok(None) when unreadable (logged).
    fn read_policy(&self) -> Result<Option<Policy>, policy::PolicyError> {
        match std::fs::read_to_string(&self.settings.config) {
            Ok(text) => policy::parse(&text).map(Some),
            Err(_) => Ok(None),
        }
    }

    fn open_inventory(&mut self, fail_on_init_error: bool) -> Result<(), DaemonError> {
        let simulated = self.settings.simulate.is_some();
        let result = open_source(&self.settings).and_then(|mut s| {
            let inv = s.discover()?;
            Ok((s, inv))
        });
        match result {
            Ok((source, inv)) => {
                tracing::info!(source = %source.describe(), gpus = inv.gpus.len(), "GPUs discovered");
                for g in &inv.gpus {
                    tracing::info!(gpu = g.index, uuid = %g.uuid, model = %g.model, memory_mib = g.memory_mib, numa = %g.numa_node.map_or("unknown".to_string(), |n| n.to_string()), mig = g.mig_enabled, "GPU");
                }
                self.source = Some(source);
                self.inventory = inv;
                self.status.send_modify(|s| s.discovery_error = None);
                if let Some(s) = self.source.as_mut() {
                    s.watch_events(Arc::clone(&self.events));
                }
                Ok(())
            }
            Err(e) if simulated => Err(DaemonError::Simulated(e)),
            Err(e) if fail_on_init_error => Err(DaemonError::Inventory(e)),
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?self.settings.nvml_retry_interval,
                    "GPU discovery failed; failOnInitError is false, so advertising nothing and retrying");
                self.status
                    .send_modify(|s| s.discovery_error = Some(e.to_string()));
                Ok(())
            }
        }
    }

    fn retry_inventory(&mut self) {
        if self.open_inventory(false).is_ok() && self.source.is_some() {
            self.take_source_events();
            self.inventory_changed();
        }
    }

    /// New GPUs: re-plan; a policy that was rejected for the old GPUs (a MIG strategy that did
    /// not fit the layout, say) is tried again, since it may fit now.
    fn inventory_changed(&mut self) {
        let rejected = self.status.borrow().policy_error.is_some();
        if rejected || self.policy.is_none() {
            self.reload_policy(true);
        } else {
            self.replan();
        }
    }

    /// Re-discovers GPUs (simulated node edited, periodic resync, SIGHUP) and re-plans when
    /// anything changed. A failed discovery keeps the last inventory.
    fn resync_inventory(&mut self) {
        let Some(source) = self.source.as_mut() else {
            return;
        };
        match source.discover() {
            Ok(inv) => {
                if inv != self.inventory {
                    tracing::info!(gpus = inv.gpus.len(), "GPU inventory changed; re-planning");
                    self.inventory = inv;
                    source.watch_events(Arc::clone(&self.events));
                    self.inventory_changed();
                }
            }
            Err(e) => {
                // Once per distinct error, not at every re-read.
                let text = e.to_string();
                if self.discovery_error.as_deref() != Some(&text) {
                    tracing::error!(error = %text, "GPU re-discovery failed; keeping the last inventory");
                    self.discovery_error = Some(text);
                }
                self.take_source_events();
                return;
            }
        }
        if self.discovery_error.take().is_some() {
            tracing::info!("GPU re-discovery succeeds again");
        }
        self.take_source_events();
    }

    fn take_source_events(&mut self) {
        let events = self
            .source
            .as_mut()
            .map(|s| s.take_events())
            .unwrap_or_default();
        // One re-plan for the whole batch (an edit can report Xids on many GPUs at once).
        let ts: Vec<Transition> = events.into_iter().filter_map(|ev| self.xid(ev)).collect();
        self.transitions(ts);
    }

    /// An Xid on a device: counted, and when critical the device goes Unhealthy everywhere.
    fn on_xid(&mut self, ev: XidEvent) {
        let t = self.xid(ev);
        self.transitions(t.into_iter().collect());
    }

    /// Counts and logs an Xid; returns the health transition it causes, if any.
    fn xid(&mut self, ev: XidEvent) -> Option<Transition> {
        self.metrics.xid(&ev.uuid, ev.xid);
        self.status.send_modify(|s| s.xid_events += 1);
        let critical = self.xid_policy.is_critical(ev.xid);
        tracing::warn!(gpu = %ev.uuid, xid = ev.xid, critical, "Xid event");
        let now = Instant::now().into_std();
        self.tracker.on_xid(&self.xid_policy, &ev.uuid, ev.xid, now)
    }

    /// An event from the GPU source's watcher.
    fn device_event(&mut self, ev: DeviceEvent) {
        match ev {
            DeviceEvent::Xid(x) => self.on_xid(x),
            DeviceEvent::Failed { uuid, reason } => {
                let now = Instant::now().into_std();
                if let Some(t) = self.tracker.fail(&uuid, reason, now) {
                    self.transitions(vec![t]);
                }
            }
        }
    }

    /// Devices whose quiet period has passed come back if the GPU source still answers.
    fn recover(&mut self) {
        let now = Instant::now().into_std();
        let source = &mut self.source;
        let back = self
            .tracker
            .recover(now, |uuid| source.as_mut().is_some_and(|s| s.probe(uuid)));
        self.transitions(back);
    }

    fn transitions(&mut self, ts: Vec<Transition>) {
        if ts.is_empty() {
            return;
        }
        for t in &ts {
            let to = if t.healthy { "Healthy" } else { "Unhealthy" };
            tracing::warn!(gpu = %t.uuid, to, reason = %t.reason, "device health changed");
            self.metrics.transition(&t.uuid, t.healthy);
        }
        self.replan();
    }

    /// The inventory with event-driven health applied: a GPU (or MIG device) is healthy when
    /// discovery says so and no critical event on its UUID holds it Unhealthy. A MIG device is
    /// advertised healthy only when its parent GPU is too (see `plan`).
    fn effective_inventory(&self) -> Inventory {
        let mut inv = self.inventory.clone();
        for g in &mut inv.gpus {
            g.healthy = g.healthy && self.tracker.is_healthy(&g.uuid);
            for m in &mut g.mig_devices {
                m.healthy = m.healthy && self.tracker.is_healthy(&m.uuid);
            }
        }
        inv
    }

    /// Tells the MPS supervisor which daemons the plan wants (and, with `exclusiveProcess`,
    /// sets the compute mode of their GPUs first). With `--mps-external` the daemons belong to
    /// `slicelet mps`, which also owns the compute mode.
    fn want_mps(&mut self, plan: &Plan) {
        let wanted = plan.mps_wanted();
        if !self.settings.mps.external {
            if let Some(source) = self.source.as_mut() {
                self.compute.sync(source.as_mut(), &wanted.exclusive_gpus());
            }
        }
        if let Some(m) = &self.mps {
            m.want(wanted);
        }
    }

    /// Records what the MPS supervisor reported about one daemon.
    fn note_mps(&mut self, ev: mps::Event) {
        if ev.removed {
            self.mps_observed.remove(&ev.uuid);
        } else {
            self.mps_observed.insert(
                ev.uuid.clone(),
                MpsObserved {
                    ready: ev.ready,
                    applied: ev.applied,
                },
            );
        }
        if ev.pending.is_some() && !ev.removed {
            self.mps_pending.insert(ev.uuid);
        } else {
            self.mps_pending.remove(&ev.uuid);
        }
    }

    /// Publishes the MPS daemons' state in [`Status`] (after the plan that reflects it).
    fn publish_mps_status(&self) {
        let ready = self
            .mps_observed
            .iter()
            .filter(|(_, o)| o.ready)
            .map(|(u, _)| u.clone())
            .collect();
        let pending = self.mps_pending.clone();
        let applied = self
            .mps_observed
            .iter()
            .filter(|(_, o)| o.ready)
            .filter_map(|(u, o)| Some((u.clone(), o.applied?)))
            .collect();
        self.status.send_modify(|s| {
            s.mps_ready = ready;
            s.mps_pending = pending;
            s.mps_applied = applied;
        });
    }

    /// Re-reads the policy; applies it when valid and changed (or `force`).
    fn reload_policy(&mut self, force: bool) {
        let path = self.settings.config.clone();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) => {
                if force {
                    tracing::error!(policy = %path.display(), error = %e, "cannot read the policy; nothing is advertised until it is readable");
                }
                return;
            }
        };
        let hash: [u8; 32] = Sha256::digest(&text).into();
        if !force && self.policy_hash == Some(hash) {
            return;
        }
        self.policy_hash = Some(hash);
        let hash_hex: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
        let text = String::from_utf8_lossy(&text);
        let parsed = match policy::parse(&text) {
            Ok(p) => p,
            Err(e) => {
                let keeping = if self.policy.is_some() {
                    "keeping the last good policy"
                } else {
                    "nothing is advertised until it is fixed"
                };
                tracing::error!(policy = %path.display(), field = %e.path, error = %e, hash = %hash_hex, "policy rejected; {keeping}");
                self.status
                    .send_modify(|s| s.policy_error = Some(e.to_string()));
                self.metrics.policy_rejected();
                return;
            }
        };
        let xid_policy = XidPolicy::new(
            self.settings.disable_healthchecks.as_deref(),
            self.settings.enable_healthchecks.as_deref(),
            &parsed.health.ignored_xids,
            &parsed.health.critical_xids,
        );
        let xid_policy = match xid_policy {
            Ok(p) => p,
            Err(e) => {
                // Checked at start; cannot change while running.
                tracing::error!(error = %e, "health environment");
                return;
            }
        };
        match plan::build(&parsed, &self.effective_inventory()) {
            Ok(built) => {
                for key in &parsed.ignored_keys {
                    tracing::warn!(key = %key, "policy key is recognised (NVIDIA config v1) but slicelet does not act on it yet; ignored");
                }
                for n in &parsed.notices {
                    tracing::info!(notice = %n, "policy notice");
                }
                for w in &built.warnings {
                    tracing::warn!(warning = %w, "policy does not match this node fully");
                }
                self.generation += 1;
                tracing::info!(generation = self.generation, hash = %hash_hex, policy = %path.display(), "policy applied");
                self.tracker
                    .set_recovery(Some(parsed.health.recovery.unwrap_or(DEFAULT_RECOVERY)));
                self.xid_policy = xid_policy;
                self.metrics.policy_applied(self.generation);
                self.policy = Some(parsed);
                self.apply(built.plan);
                let generation = self.generation;
                self.status.send_modify(|s| {
                    s.generation = generation;
                    s.policy_error = None;
                });
            }
            Err(e) => {
                tracing::error!(policy = %path.display(), error = %e, hash = %hash_hex, "policy rejected for this node; keeping the last good policy");
                self.status
                    .send_modify(|s| s.policy_error = Some(e.to_string()));
                self.metrics.policy_rejected();
            }
        }
    }

    fn replan(&mut self) {
        let Some(policy) = &self.policy else { return };
        match plan::build(policy, &self.effective_inventory()) {
            Ok(built) => self.apply(built.plan),
            Err(e) => {
                tracing::error!(error = %e, "plan rejected for the current GPUs; keeping the last plan")
            }
        }
    }

    /// Publishes `plan` and starts/stops servers for resources that appeared/disappeared.
    /// Unchanged resources keep their `Arc`, so their streams see no change.
    fn apply(&mut self, mut plan: Plan) {
        self.want_mps(&plan);
        plan.apply_mps_observations(&self.mps_observed);
        let old = Arc::clone(&self.plans.borrow());
        plan.reuse_unchanged(&old);
        for (name, res) in &plan.resources {
            match old.resources.get(name) {
                None => {
                    tracing::info!(resource = %name, devices = res.devices.len(), "resource added")
                }
                Some(prev) if !Arc::ptr_eq(prev, res) => {
                    let now: std::collections::HashSet<&str> =
                        res.devices.iter().map(|d| d.id.as_str()).collect();
                    let gone: Vec<&str> = prev
                        .devices
                        .iter()
                        .map(|d| d.id.as_str())
                        .filter(|id| !now.contains(id))
                        .collect();
                    tracing::info!(resource = %name, devices = res.devices.len(), removed = gone.len(), removed_ids = ?gone,
                        "resource changed (running pods keep the devices they were given)");
                }
                Some(_) => {}
            }
        }
        let plan = Arc::new(plan);
        self.plans.send_replace(Arc::clone(&plan));
        self.metrics.set_plan(&plan);
        self.status.send_modify(|s| {
            s.resources = plan.resources.keys().cloned().collect();
            s.registered.retain(|r| plan.resources.contains_key(r));
        });
        let removed: Vec<String> = self
            .servers
            .keys()
            .filter(|n| !plan.resources.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            tracing::info!(resource = %name, "resource removed; stopping its server");
            if let Some(s) = self.servers.remove(&name) {
                // Streams end at once; the server task drains on its own.
                s.stop.cancel();
                s.register.abort();
                plugin::remove_if_ours(&s.path, s.id);
            }
        }
        for name in plan.resources.keys() {
            if !self.servers.contains_key(name) {
                self.start_server(name);
            }
        }
    }

    fn start_server(&mut self, name: &str) {
        self.start_server_after(name, Duration::ZERO);
    }

    /// Binds and serves `name`, registering after `register_after`. A socket that cannot be
    /// bound (another live process holds it, a non-socket file is in the way) is retried.
    fn start_server_after(&mut self, name: &str, register_after: Duration) {
        let dir = &self.settings.device_plugin_path;
        let socket = match plugin::bind(dir, name) {
            Ok(s) => s,
            Err(e) => {
                if self.unserved.insert(name.to_string()) {
                    tracing::error!(resource = %name, error = %e, retry_every = ?BIND_RETRY, "cannot serve resource; retrying");
                }
                return;
            }
        };
        if self.unserved.remove(name) {
            tracing::info!(resource = %name, "socket bound after earlier failures");
        }
        self.epoch += 1;
        let stop = self.shutdown.child_token();
        let path = socket.path.clone();
        let id = socket.id;
        let endpoint = socket.endpoint.clone();
        let service = plugin::Service::new(
            name,
            self.plans.subscribe(),
            stop.clone(),
            self.settings.dev_root.clone(),
        )
        .report_lost_streams(self.lost_tx.clone(), self.epoch);
        let serve = plugin::serve(socket, service, stop.clone());
        let kubelet = self.kubelet_socket();
        let appeared = Arc::clone(&self.kubelet_appeared);
        let resource = name.to_string();
        let rstop = stop.clone();
        let status = Arc::clone(&self.status);
        let metrics = Arc::clone(&self.metrics);
        let register = tokio::spawn(async move {
            if !register_after.is_zero() {
                tokio::select! {
                    _ = rstop.cancelled() => return,
                    _ = tokio::time::sleep(register_after) => {}
                }
            }
            let done = crate::kubelet::register_until_done(
                &kubelet, &endpoint, &resource, &appeared, &rstop,
            )
            .await;
            if done {
                metrics.registered(&resource);
                status.send_modify(|s| {
                    s.registered.insert(resource);
                });
            }
        });
        tracing::debug!(resource = %name, socket = %path.display(), "serving");
        self.servers.insert(
            name.to_string(),
            ResourceServer {
                epoch: self.epoch,
                stop,
                serve,
                register,
                path,
                id,
            },
        );
    }

    /// True when `name` is the socket of one of our servers and our file is gone.
    fn socket_lost(&self, name: &std::ffi::OsStr) -> bool {
        self.servers.values().any(|s| {
            s.path.file_name() == Some(name)
                && std::fs::symlink_metadata(&s.path)
                    .map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        (m.dev(), m.ino()) != s.id
                    })
                    .unwrap_or(true)
        })
    }

    /// Stops `servers` (ending their streams), waits up to `deadline` for each, removes their
    /// sockets, and marks them unregistered.
    fn stop_servers(
        &self,
        servers: Vec<(String, ResourceServer)>,
        deadline: Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let status = Arc::clone(&self.status);
        stop_servers(status, servers, deadline)
    }
}

/// Stops `servers` (ending their streams), waits up to `deadline` for each, removes their
/// sockets, and marks them unregistered.
async fn stop_servers(
    status: Arc<watch::Sender<Status>>,
    servers: Vec<(String, ResourceServer)>,
    deadline: Duration,
) {
    {
        for (_, s) in &servers {
            s.stop.cancel();
            s.register.abort();
        }
        for (name, s) in servers {
            let mut serve = s.serve;
            if tokio::time::timeout(deadline, &mut serve).await.is_err() {
                tracing::warn!(resource = %name, "server did not stop in time; aborting it");
                serve.abort();
                let _ = serve.await;
            }
            plugin::remove_if_ours(&s.path, s.id);
            status.send_modify(|st| {
                st.registered.remove(&name);
            });
        }
    }
}

impl Supervisor {
    /// Stops every server.
    async fn stop_all(&mut self, deadline: Duration) {
        let servers = std::mem::take(&mut self.servers).into_iter().collect();
        self.stop_servers(servers, deadline).await;
    }

    /// After a kubelet restart: stop every server first (its old stream must end before the
    /// new registration, or kubelet 1.32 drops the new one), then bind, serve and register
    /// every resource again.
    async fn restart_all(&mut self) {
        self.lost_backoff.clear();
        self.stop_all(RESTART_DEADLINE).await;
        let names: Vec<String> = self.plans.borrow().resources.keys().cloned().collect();
        for name in names {
            self.start_server(&name);
        }
    }

    /// The kubelet closed a resource's ListAndWatch stream while we still serve it (kubelet
    /// stopped, or dropped the stream): serve it afresh and register again with backoff.
    async fn stream_lost(&mut self, lost: StreamLost) {
        let current = self.servers.get(&lost.resource).map(|s| s.epoch);
        if current != Some(lost.epoch) {
            return; // a server we already replaced
        }
        let now = Instant::now();
        let entry = self
            .lost_backoff
            .entry(lost.resource.clone())
            .or_insert_with(|| (lost_stream_backoff(), now));
        if now.duration_since(entry.1) > LOST_STREAM_RESET {
            entry.0 = lost_stream_backoff();
        }
        entry.1 = now;
        let delay = entry.0.next().unwrap_or(LOST_STREAM_MAX_DELAY);
        tracing::warn!(resource = %lost.resource, register_in = ?delay, "the kubelet closed the ListAndWatch stream; registering again");
        if let Some(s) = self.servers.remove(&lost.resource) {
            self.stop_servers(vec![(lost.resource.clone(), s)], RESTART_DEADLINE)
                .await;
        }
        if self.plans.borrow().resources.contains_key(&lost.resource) {
            self.start_server_after(&lost.resource, delay);
        }
    }

    /// Tries again to serve resources whose socket could not be bound.
    fn retry_unserved(&mut self) {
        let wanted: Vec<String> = self
            .unserved
            .iter()
            .filter(|n| self.plans.borrow().resources.contains_key(*n))
            .cloned()
            .collect();
        self.unserved.retain(|n| wanted.contains(n));
        for name in wanted {
            if !self.servers.contains_key(&name) {
                self.start_server(&name);
            }
        }
    }
}

fn lost_stream_backoff() -> backon::ExponentialBackoff {
    backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default()
            .with_min_delay(LOST_STREAM_MIN_DELAY)
            .with_max_delay(LOST_STREAM_MAX_DELAY)
            .without_max_times(),
    )
}

/// The socket path a resource is served on in `dir` (for tests and tools).
pub fn socket_path(dir: &Path, resource: &str) -> PathBuf {
    dir.join(plugin::socket_name(dir, resource))
}
