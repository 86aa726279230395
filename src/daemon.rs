//! The supervisor: the one owner of mutable state. It loads the policy, discovers GPUs, builds
//! the plan, publishes plan snapshots through a `watch` channel, starts and stops one resource
//! server per advertised resource, re-binds and re-registers after a kubelet restart, reloads
//! the policy when its directory changes, and drains on shutdown.
//!
//! Failure rules:
//! - An invalid policy never loses state: at start nothing is registered until the file becomes
//!   valid; on reload the last good policy keeps serving. Each rejection is logged once with the
//!   field path.
//! - NVML failing at start: `flags.failOnInitError` (default true) decides between exiting with
//!   an error and staying up advertising nothing while retrying NVML periodically.

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
use crate::inventory::nvml::NvmlSource;
use crate::inventory::simulated::SimulatedSource;
use crate::inventory::{GpuSource, Inventory, InventoryError};
use crate::plan::{self, Plan};
use crate::plugin;
use crate::policy::{self, Policy};
use crate::watch::{self as fswatch, Event, WatchError};

/// Debounce between a change in the policy directory and the re-read.
pub const POLICY_DEBOUNCE: Duration = Duration::from_millis(100);
/// How long shutdown waits for servers to stop before aborting them.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(4);
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
    /// How often to retry NVML when it failed at start with `failOnInitError: false`.
    pub nvml_retry_interval: Duration,
    /// How often to re-read the policy even without a file event (safety net).
    pub policy_resync_interval: Duration,
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
            nvml_retry_interval: Duration::from_secs(30),
            policy_resync_interval: Duration::from_secs(60),
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

/// What the supervisor reports about itself (for readiness and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Generation of the applied policy (0: none applied yet).
    pub generation: u64,
    /// The last policy rejection, cleared when a policy is applied.
    pub policy_error: Option<String>,
}

struct ResourceServer {
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
    status: watch::Sender<Status>,
}

fn open_source(settings: &Settings) -> Result<Box<dyn GpuSource>, InventoryError> {
    match &settings.simulate {
        Some(path) => Ok(Box::new(SimulatedSource::new(path))),
        None => Ok(Box::new(NvmlSource::new(
            settings.nvml_library.as_deref(),
            Some(&settings.sysfs_root),
        )?)),
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
    let (tx, mut rx) = mpsc::unbounded_channel();
    let _watches = fswatch::start(&settings.config, &settings.device_plugin_path, tx)?;

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
        settings,
    };
    // The policy decides failOnInitError, so read it first (an invalid one means the default).
    let first_policy = sup.read_policy().ok().flatten();
    let fail_on_init_error = first_policy.as_ref().is_none_or(|p| p.fail_on_init_error);
    sup.open_inventory(fail_on_init_error)?;
    sup.reload_policy(true);

    let mut debounce: Option<Instant> = None;
    let mut resync = tokio::time::interval(sup.settings.policy_resync_interval);
    resync.tick().await;
    let mut nvml_retry = tokio::time::interval(sup.settings.nvml_retry_interval);
    nvml_retry.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(ev) = rx.recv() => {
                let mut restart = false;
                let mut next = Some(ev);
                while let Some(ev) = next {
                    match ev {
                        Event::PolicyDirChanged => {
                            debounce.get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
                        }
                        Event::KubeletSocketCreated => {
                            tracing::info!("kubelet.sock created: kubelet restart seen; re-registering every resource");
                            restart = true;
                        }
                        Event::PluginSocketRemoved(name) => restart |= sup.socket_lost(&name),
                    }
                    next = rx.try_recv().ok();
                }
                if restart {
                    sup.restart_all().await;
                    sup.kubelet_appeared.notify_waiters();
                }
            }
            _ = async { tokio::time::sleep_until(debounce.expect("guarded")).await }, if debounce.is_some() => {
                debounce = None;
                sup.reload_policy(false);
            }
            _ = resync.tick() => sup.reload_policy(false),
            _ = nvml_retry.tick(), if sup.source.is_none() => sup.retry_inventory(),
        }
    }
    sup.stop_all(SHUTDOWN_DEADLINE).await;
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
                    tracing::info!(gpu = g.index, uuid = %g.uuid, model = %g.model, memory_mib = g.memory_mib, numa = ?g.numa_node, mig = g.mig_enabled, "GPU");
                }
                self.source = Some(source);
                self.inventory = inv;
                Ok(())
            }
            Err(e) if simulated => Err(DaemonError::Simulated(e)),
            Err(e) if fail_on_init_error => Err(DaemonError::Inventory(e)),
            Err(e) => {
                tracing::error!(error = %e, retry_in = ?self.settings.nvml_retry_interval,
                    "GPU discovery failed; failOnInitError is false, so advertising nothing and retrying");
                Ok(())
            }
        }
    }

    fn retry_inventory(&mut self) {
        if self.open_inventory(false).is_ok() && self.source.is_some() {
            self.replan();
        }
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
                return;
            }
        };
        match plan::build(&parsed, &self.inventory) {
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
            }
        }
    }

    fn replan(&mut self) {
        let Some(policy) = &self.policy else { return };
        match plan::build(policy, &self.inventory) {
            Ok(built) => self.apply(built.plan),
            Err(e) => {
                tracing::error!(error = %e, "plan rejected for the current GPUs; keeping the last plan")
            }
        }
    }

    /// Publishes `plan` and starts/stops servers for resources that appeared/disappeared.
    /// Unchanged resources keep their `Arc`, so their streams see no change.
    fn apply(&mut self, mut plan: Plan) {
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
        let removed: Vec<String> = self
            .servers
            .keys()
            .filter(|n| !plan.resources.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            tracing::info!(resource = %name, "resource removed; stopping its server");
            if let Some(s) = self.servers.remove(&name) {
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
        let dir = &self.settings.device_plugin_path;
        let socket = match plugin::bind(dir, name) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(resource = %name, error = %e, "cannot serve resource");
                return;
            }
        };
        let stop = self.shutdown.child_token();
        let path = socket.path.clone();
        let id = socket.id;
        let endpoint = socket.endpoint.clone();
        let service = plugin::Service::new(
            name,
            self.plans.subscribe(),
            stop.clone(),
            self.settings.dev_root.clone(),
        );
        let serve = plugin::serve(socket, service, stop.clone());
        let kubelet = self.kubelet_socket();
        let appeared = Arc::clone(&self.kubelet_appeared);
        let resource = name.to_string();
        let rstop = stop.clone();
        let register = tokio::spawn(async move {
            crate::kubelet::register_until_done(&kubelet, &endpoint, &resource, &appeared, &rstop)
                .await;
        });
        tracing::debug!(resource = %name, socket = %path.display(), "serving");
        self.servers.insert(
            name.to_string(),
            ResourceServer {
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

    /// Stops every server (ending its streams) and waits up to `deadline` for each.
    async fn stop_all(&mut self, deadline: Duration) {
        let servers = std::mem::take(&mut self.servers);
        for s in servers.values() {
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
        }
    }

    /// After a kubelet restart: stop every server first (its old stream must end before the
    /// new registration, or kubelet 1.32 drops the new one), then bind, serve and register
    /// every resource again.
    async fn restart_all(&mut self) {
        self.stop_all(RESTART_DEADLINE).await;
        let names: Vec<String> = self.plans.borrow().resources.keys().cloned().collect();
        for name in names {
            self.start_server(&name);
        }
    }
}

/// The socket path a resource is served on in `dir` (for tests and tools).
pub fn socket_path(dir: &Path, resource: &str) -> PathBuf {
    dir.join(plugin::socket_name(dir, resource))
}
