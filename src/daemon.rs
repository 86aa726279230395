//! The supervisor: the one owner of mutable state, in three steps.
//!
//! 1. **Fold** (`fold`, pure): every source of change reports an input — the policy file read
//!    and parsed off the loop, the hardware actor's discoveries, health events and probe
//!    answers, the MPS daemons' readiness — and `State::fold` turns it into a new state and a
//!    list of actions.
//! 2. **Plan** (inside the fold): `plan::build_with(policy, effective inventory, MPS limits)`
//!    → `Arc<Plan>`, published through a `watch` channel; unchanged resources keep their `Arc`,
//!    so their ListAndWatch streams see nothing.
//! 3. **Reconcile**: the device-plugin servers against the plan (`servers`: start, stop,
//!    re-register once per kubelet restart), the MPS supervisor against the daemons the plan
//!    wants, the hardware actor against the compute modes, `/metrics` and `/readyz`, and the
//!    node labels' NFD feature file ([`crate::labels`], `--nfd-features-file`), written off the
//!    loop and removed on graceful shutdown.
//!
//! `slicelet run` and `slicelet mps` run this same loop; `slicelet mps` has no device-plugin
//! servers and owns the MPS daemons ([`Target::Mps`]).
//!
//! Failure rules:
//! - An invalid policy never loses state (see `fold`). Each rejection is logged once with the
//!   field path and shown by `/readyz`.
//! - NVML failing at start: `flags.failOnInitError` (default true) decides between exiting with
//!   an error and staying up advertising nothing while retrying discovery periodically.
//! - Nothing here calls NVML: the hardware actor ([`hardware`]) does, on its own
//!   thread, so a slow NVML call never stalls Allocate or ListAndWatch.
//! - Shutdown has one overall deadline for every server, registration and MPS daemon.

mod fold;
pub mod hardware;
mod servers;
mod supervisor;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::fold::{Action, HealthEnv, Input, State};
use crate::inventory::nvml::NvmlSource;
use crate::inventory::simulated::SimulatedSource;
use crate::inventory::{GpuSource, Inventory, InventoryError};
use crate::labels;
use crate::mps;
use crate::plan::Plan;
use crate::policy;
use crate::policy::select;
use crate::settings::Settings;
use crate::status::Metrics;
use crate::status::Status;
use crate::watch::WatchError;
use hardware::{Command, Hardware};

/// Debounce between a change in the policy directory and the re-read (a ConfigMap's `..data`
/// swap, the atomic writer's commit point, is read at once instead).
pub const POLICY_DEBOUNCE: Duration = Duration::from_millis(100);
/// The one overall deadline shutdown waits for servers, registrations and MPS daemons to stop
/// before aborting (servers) or killing (daemons) what is left.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(4);
/// How long the first plan waits for DRA's record of prepared claims when the DRA checkpoint
/// is missing or cannot be used (DRA rebuilds it from the API): long enough for a list of
/// ResourceClaims, short enough that an API that does not answer leaves the node served.
pub const DRA_RECORD_WAIT: Duration = Duration::from_secs(10);
/// How often resources whose socket could not be bound are tried again.
const BIND_RETRY: Duration = Duration::from_secs(1);
/// How long after an Allocate what is in use is read again (the kubelet records the devices
/// once Allocate answered; a burst of Allocates costs one read).
const ALLOCATE_SETTLE: Duration = Duration::from_millis(500);

/// How long the supervisor waits after the last change (a plan or policy applied or rejected,
/// a registration, a ListAndWatch stream opening) before it returns the free heap pages that
/// change used ([`crate::residency::settle`]; only in the daemon binary). Long
/// enough that a start or a kubelet restart settles once, short enough that the idle RSS is
/// reached within seconds.
pub const RESIDENCY_SETTLE: Duration = Duration::from_secs(1);

/// Capacity of the hardware actor's and the MPS supervisor's channels to the supervisor.
const CHANNEL_CAPACITY: usize = 256;
/// Longest a policy read and parse may take before it counts as a rejection (it runs off the
/// loop, so a slow one never stalls a kubelet restart).
pub const POLICY_READ_DEADLINE: Duration = Duration::from_secs(5);
/// How long a read of the CDI spec directories runs before it is reported slow (the last
/// answer stays in force until it finishes; no second read starts beside it).
pub const CDI_READ_DEADLINE: Duration = Duration::from_secs(5);

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
    /// The status endpoint could not listen.
    #[error("status endpoint on {address}")]
    Status {
        /// The address.
        address: std::net::SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The device-plugin directory could not be created.
    #[error("creating device-plugin directory {path}")]
    DevicePluginDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What the loop reconciles besides the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `slicelet run`: device-plugin servers, the status endpoint and (unless
    /// `--mps-external`) the MPS daemons and compute modes.
    DevicePlugin,
    /// `slicelet mps`: the MPS daemons and compute modes only.
    Mps,
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

/// Opens the configured GPU source and discovers the node's GPUs once (for `plan`/`validate`,
/// which block anyway; the daemon discovers on its hardware actor).
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
    run_target(settings, Target::DevicePlugin, shutdown, status).await
}

/// `slicelet mps --config FILE [--simulate NODE]`: the MPS supervisor alone, for a DaemonSet of
/// its own (with `slicelet run --mps-external` on the same node), so that rolling out the
/// device plugin never restarts running MPS servers. It is this same loop with
/// [`Target::Mps`]: the same policy reading, debounce, resync, SIGHUP, hardware actor and plan,
/// reconciled against the MPS control daemons and compute modes only (no device-plugin
/// servers, no status endpoint). An invalid policy keeps the daemons of the last good one. On
/// SIGTERM/SIGINT it sends `quit` to its daemons, removes their directories and restores
/// compute modes.
///
/// # Errors
/// As [`run`].
pub async fn run_mps(settings: Settings, shutdown: CancellationToken) -> Result<(), DaemonError> {
    run_target(
        settings,
        Target::Mps,
        shutdown,
        watch::channel(Status::default()).0,
    )
    .await
}

/// Reads and parses the policy (blocking; run off the loop) within the read limits
/// ([`policy::read_bounded`]: a regular file, 1 MiB, nesting checked before parsing, UTF-8), the
/// same path `slicelet validate` takes. A directory of named configs is narrowed to one first
/// ([`select`]: the node label's value `label`, the default, the fallbacks); a choice that
/// fails is an unreadable policy naming the keys that exist, so the last good one keeps
/// serving.
fn read_policy(
    path: &Path,
    config_dir: bool,
    force: bool,
    sel: &select::Selection,
    label: Option<&str>,
    overrides: &policy::FlagOverrides,
) -> Input {
    let file = match chosen_file(path, config_dir, sel, label) {
        Ok(Some(file)) => file,
        Ok(None) => {
            return Input::Policy {
                path: path.to_path_buf(),
                hash: Sha256::digest(b"").into(),
                force,
                parsed: policy::parse_with("", overrides).map(Box::new),
            }
        }
        Err(error) => {
            return Input::PolicyUnreadable {
                path: path.to_path_buf(),
                error,
            }
        }
    };
    match policy::read_bounded(&file, &policy::Limits::default()) {
        Ok(text) => Input::Policy {
            path: file,
            hash: Sha256::digest(text.as_bytes()).into(),
            force,
            parsed: policy::parse_with(&text, overrides).map(Box::new),
        },
        Err(e) => Input::PolicyUnreadable {
            path: file,
            error: crate::errors::chain(&e),
        },
    }
}

/// The file to read for `path`: itself, or the config chosen from a directory (`None`: the
/// `empty` fallback, no config).
///
/// # Errors
/// The directory cannot be listed, or no config can be chosen (the message names the keys).
///
/// Whether `path` is a directory of named configs is decided once, at start (`config_dir`): a
/// ConfigMap volume never turns into a file, so a directory replaced by a file (or removed) is
/// an error that keeps the last good config, and a file replaced by a directory is refused by
/// the read as any non-regular file is.
pub fn chosen_file(
    path: &Path,
    config_dir: bool,
    sel: &select::Selection,
    label: Option<&str>,
) -> Result<Option<PathBuf>, String> {
    if !config_dir {
        return Ok(Some(path.to_path_buf()));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "{} was a directory of named configs at start and is no longer a directory",
                path.display()
            ))
        }
        Err(e) => {
            return Err(format!(
                "reading the config directory {}: {e}",
                path.display()
            ))
        }
    }
    let keys = select::config_keys(path)
        .map_err(|e| format!("listing the configs in {}: {e}", path.display()))?;
    match select::choose(path, &keys, label, sel).map_err(|e| e.to_string())? {
        select::Choice::Named { name, by } => {
            tracing::debug!(config = %name, by = %by, "config chosen");
            Ok(Some(path.join(name)))
        }
        select::Choice::Empty => Ok(None),
    }
}

/// Runs `work` on a blocking thread within `deadline`; `Err` says what went wrong in words
/// that follow `what` ("reading the CDI specs failed: …", "reading the CDI specs took longer
/// than 5s"). The thread is not waited for past the deadline (a hung file system keeps it, never
/// the loop).
async fn blocking_within<T: Send + 'static>(
    what: &str,
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{what} failed: {e}")),
        Err(_) => Err(format!("{what} took longer than {deadline:?}")),
    }
}

/// Reads the policy on a blocking thread, within [`POLICY_READ_DEADLINE`].
async fn read_policy_off_loop(
    path: PathBuf,
    config_dir: bool,
    force: bool,
    sel: select::Selection,
    label: Option<String>,
    overrides: policy::FlagOverrides,
) -> Input {
    let p = path.clone();
    let what = format!("reading {}", path.display());
    blocking_within(&what, POLICY_READ_DEADLINE, move || {
        read_policy(&p, config_dir, force, &sel, label.as_deref(), &overrides)
    })
    .await
    .unwrap_or_else(|error| Input::PolicyUnreadable { path, error })
}

/// The supervisor's loop for `target` (`slicelet run` or `slicelet mps`).
///
/// # Errors
/// As [`run`].
pub async fn run_target(
    settings: Settings,
    target: Target,
    shutdown: CancellationToken,
    status: watch::Sender<Status>,
) -> Result<(), DaemonError> {
    let mut supervisor = supervisor::Supervisor::wire(settings, target, shutdown, status).await?;
    match supervisor.start().await {
        Ok(true) => {}
        Ok(false) => {
            supervisor.abort().await;
            return Ok(());
        }
        Err(e) => {
            supervisor.abort().await;
            return Err(e);
        }
    }
    supervisor.run().await;
    supervisor.stop().await;
    Ok(())
}

/// Carries out the fold's actions.
struct Shell {
    plans: watch::Sender<Arc<Plan>>,
    status: Arc<watch::Sender<Status>>,
    metrics: Arc<Metrics>,
    hardware: Hardware,
    mps: mps::Supervisor,
    owns_compute: bool,
    plugin_mode: bool,
    /// The NFD feature file's writer (`--nfd-features-file`).
    labels: Option<labels::file::Writer>,
    /// The feature file content last asked for.
    labels_content: Option<String>,
    cdi: CdiCheck,
    in_use: InUseReader,
    /// GPU use per container (`/metrics`, `/status`), from the samples and what is in use.
    usage: crate::usage::report::Usage,
    /// The last sampling error logged (each distinct one once).
    sample_error: Option<String>,
    /// The last checkpoint error logged (each distinct one once).
    checkpoint_error: Option<String>,
    /// Each published plan, for DRA (`--dra`).
    dra_inputs: Option<watch::Sender<Option<Arc<crate::dra::DraInput>>>>,
    /// Something changed since the last [`crate::residency::settle`] was scheduled.
    unsettled: bool,
    /// Where slicelet's memory-limit CDI spec goes and how its hooks run (`--memory-spec-dir`,
    /// device plugin mode only).
    memory_spec: Option<(PathBuf, crate::cdi::memory::HookConfig)>,
    /// The memory-limit spec last written (`Some(None)`: removed); `None` before the first.
    memory_spec_on_disk: Option<Option<String>>,
}

/// Reads of what is in use (pod-resources `List`) for [`Action::RefreshInUse`], the periodic
/// refresh and each Allocate: one at a time and at least [`podres::client::MIN_SPACING`]
/// apart (the kubelet's limit is 100 a second), a request while one runs queued once.
struct InUseReader {
    socket: Option<PathBuf>,
    tx: mpsc::Sender<Result<crate::in_use::InUse, String>>,
    busy: bool,
    again: bool,
    last: Option<Instant>,
}

impl InUseReader {
    fn start(&mut self) {
        let Some(socket) = self.socket.clone() else {
            return;
        };
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        // No socket, no request: answered at once (and not spaced, the kubelet's rate limit
        // counts requests).
        if std::fs::symlink_metadata(&socket).is_err() {
            let e = crate::podres::client::PodResourcesError::Missing { path: socket };
            let _ = self.tx.try_send(Err(crate::errors::chain(&e)));
            return;
        }
        let now = Instant::now();
        let at = self
            .last
            .map_or(now, |l| (l + crate::podres::client::MIN_SPACING).max(now));
        self.last = Some(at);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let answer = crate::podres::client::list(&socket)
                .await
                .map_err(|e| crate::errors::chain(&e));
            let _ = tx.send(answer).await;
        });
    }
}

/// Shows the node's config label and the API's last error in the [`Status`].
fn publish_label(status: &watch::Sender<Status>, v: &crate::k8s::LabelView) {
    status.send_modify(|s| {
        s.node_label.clone_from(&v.value);
        s.api_error.clone_from(&v.error);
    });
}

/// Folds the feature file writer's outcomes into the [`Status`] (`nfd_writes`, `nfd_error`).
fn labels_report(status: Arc<watch::Sender<Status>>) -> labels::file::Report {
    Arc::new(move |o: &labels::file::Outcome| {
        status.send_modify(|s| match o {
            labels::file::Outcome::Written => {
                s.nfd_writes += 1;
                s.nfd_error = None;
            }
            labels::file::Outcome::Removed => s.nfd_error = None,
            labels::file::Outcome::Failed(e) => s.nfd_error = Some(e.clone()),
        });
    })
}

/// What a read of the CDI spec directories reports: [`CdiAnswer::Slow`] once when it runs past
/// [`CDI_READ_DEADLINE`] (the last answer stays in force meanwhile), then
/// [`CdiAnswer::Done`].
#[derive(Debug)]
enum CdiAnswer {
    Slow,
    Done(crate::cdi::SpecIndex),
}

/// How the CDI spec directories are read (blocking); [`crate::cdi::read_specs`] but in tests.
type SpecReader = Arc<dyn Fn(&[PathBuf]) -> crate::cdi::SpecIndex + Send + Sync>;

/// Reads of the CDI spec directories for [`Action::CheckCdi`]: one at a time, on a blocking
/// thread, until it finishes (a read past its deadline is reported, never abandoned and
/// started again beside itself); a request while one runs is queued once.
struct CdiCheck {
    dirs: Vec<PathBuf>,
    tx: mpsc::Sender<CdiAnswer>,
    read: SpecReader,
    /// [`CDI_READ_DEADLINE`] but in tests.
    deadline: Duration,
    busy: bool,
    again: bool,
}

impl CdiCheck {
    fn new(dirs: Vec<PathBuf>, tx: mpsc::Sender<CdiAnswer>) -> Self {
        CdiCheck {
            dirs,
            tx,
            read: Arc::new(crate::cdi::read_specs),
            deadline: CDI_READ_DEADLINE,
            busy: false,
            again: false,
        }
    }

    fn start(&mut self) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        let dirs = self.dirs.clone();
        let tx = self.tx.clone();
        let read = Arc::clone(&self.read);
        let deadline = self.deadline;
        tokio::spawn(async move {
            let d = dirs.clone();
            let mut reading = tokio::task::spawn_blocking(move || read(&d));
            let done = tokio::select! {
                done = &mut reading => done,
                () = tokio::time::sleep(deadline) => {
                    let _ = tx.send(CdiAnswer::Slow).await;
                    reading.await
                }
            };
            let index = done.unwrap_or_else(|e| {
                crate::cdi::unreadable(&dirs, format!("reading the CDI specs failed: {e}"))
            });
            let _ = tx.send(CdiAnswer::Done(index)).await;
        });
    }
}

impl Shell {
    /// Writes (or removes) slicelet's memory-limit CDI spec for `plan`
    /// ([`crate::cdi::memory::spec`]) when it differs from what is on disk. A small file on
    /// the runtime's spec directory, written atomically in place; a failure is logged and the
    /// next plan tries again (the hooks of a device the runtime cannot find fail its
    /// container's creation, never start it unlimited).
    fn write_memory_spec(&mut self, plan: &Plan) {
        let Some((dir, hook)) = &self.memory_spec else {
            return;
        };
        let want = crate::cdi::memory::spec(plan, hook);
        if self.memory_spec_on_disk.as_ref() == Some(&want) {
            return;
        }
        let path = dir.join(crate::cdi::memory::SPEC_FILE);
        let result = match &want {
            Some(text) => crate::files::write_atomic(&path, text.as_bytes()),
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        match result {
            Ok(()) => {
                if want.is_some() {
                    tracing::info!(path = %path.display(), "memory-limit CDI spec written");
                }
                self.memory_spec_on_disk = Some(want);
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e,
                    "the memory-limit CDI spec could not be written; containers asking for memory-limited devices fail to start until it is");
                self.memory_spec_on_disk = None;
            }
        }
    }

    /// Re-discovers the GPUs (SIGHUP, the periodic resync) and, where Allocate hands out CDI
    /// names, re-reads the CDI specs (a toolkit upgrade may rewrite them without a plan change).
    fn rediscover(&mut self, state: &State) {
        self.hardware.send(Command::Discover);
        if self.plugin_mode && state.uses_cdi() {
            self.cdi.start();
        }
    }

    fn fold(&mut self, state: &mut State, input: Input, servers: &mut servers::Servers) {
        let actions = state.fold(input, Instant::now().into_std());
        // The labels depend on the plan and on the policy's migStrategy, which can change
        // without changing the plan.
        let relabel = actions
            .iter()
            .any(|a| matches!(a, Action::Publish(_) | Action::PolicyApplied(_)));
        self.unsettled |= actions.iter().any(|a| {
            matches!(
                a,
                Action::Publish(_) | Action::PolicyApplied(_) | Action::PolicyRejected
            )
        });
        let allocation = self.plugin_mode
            && actions
                .iter()
                .any(|a| matches!(a, Action::Publish(_) | Action::InUseChanged));
        for action in actions {
            match action {
                Action::Publish(plan) => {
                    self.plans.send_replace(Arc::clone(&plan));
                    self.send_dra_input(state, &plan);
                    self.metrics.set_plan(&plan);
                    if self.plugin_mode {
                        // Before the servers: Allocate may name a device only this spec has.
                        self.write_memory_spec(&plan);
                        servers.reconcile(&plan);
                    }
                }
                Action::WantMps(wanted) => self.mps.want(wanted),
                Action::ComputeModes(gpus) => {
                    if self.owns_compute {
                        self.hardware.send(Command::ComputeModes(gpus));
                    }
                }
                Action::Probe(uuids) => self.hardware.send(Command::Probe(uuids)),
                // Only the device plugin hands out CDI names (`slicelet mps` serves no Allocate).
                Action::CheckCdi if self.plugin_mode => self.cdi.start(),
                Action::CheckCdi => {}
                Action::RefreshInUse => self.in_use.start(),
                Action::InUseChanged => {}
                Action::Xid { uuid, xid } => self.metrics.xid(&uuid, xid),
                Action::Transition(t) => self.metrics.transition(&t.uuid, t.health),
                Action::PolicyApplied(g) => self.metrics.policy_applied(g),
                Action::PolicyRejected => self.metrics.policy_rejected(),
                // The same plan, other causes: DRA's taints and health stream follow.
                Action::Causes => {
                    let dra_started = self
                        .dra_inputs
                        .as_ref()
                        .is_some_and(|tx| tx.borrow().is_some());
                    if dra_started {
                        self.send_dra_input(state, &Arc::clone(&state.plan));
                    }
                }
            }
        }
        if relabel {
            self.relabel(state);
        }
        if allocation {
            self.usage
                .allocation(&state.plan, &state.in_use, &self.metrics.usage);
        }
        self.publish_status(state);
    }

    /// Hands DRA the input for `plan`: its devices' health folded over the last input's (so a
    /// taint's `timeAdded` stays put while its cause does), each Unhealthy device's cause from
    /// the tracker as it is now.
    fn send_dra_input(&self, state: &State, plan: &Arc<crate::plan::Plan>) {
        let Some(tx) = &self.dra_inputs else { return };
        let prev = tx.borrow().clone();
        let input = crate::dra::DraInput::new(
            Arc::clone(plan),
            Arc::new(state.inventory.clone().unwrap_or_default()),
            state
                .policy
                .as_ref()
                .map(|p| p.dra_xid_taint_effect)
                .unwrap_or_default(),
            &|res, d| Some(dra_cause(state, res, d)),
            prev.as_deref(),
            std::time::SystemTime::now(),
        );
        tx.send_replace(Some(Arc::new(input)));
    }

    /// A GPU use sample from the hardware actor: attributed to the containers holding the
    /// devices, into `/metrics` and `/status`.
    fn sampled(&mut self, sample: Result<crate::usage::Samples, String>, state: &State) {
        match sample {
            Ok(s) => {
                if self.sample_error.take().is_some() {
                    tracing::info!("GPU use sampling works again");
                }
                if s.checkpoint_error != self.checkpoint_error {
                    match &s.checkpoint_error {
                        Some(e) => tracing::warn!(error = %e, "the kubelet's device checkpoint is not usable: per-container GPU use is unknown and withheld (slicelet_attribution_up 0); GPU-level series only"),
                        None => tracing::info!("the kubelet's device checkpoint is usable again: GPU use is attributed to containers"),
                    }
                    self.checkpoint_error.clone_from(&s.checkpoint_error);
                }
                self.usage
                    .sampled(&s, &state.plan, &state.in_use, &self.metrics.usage);
                self.status.send_modify(|st| st.samples += 1);
            }
            Err(e) => {
                self.metrics.sample_failed();
                if self.sample_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, "GPU use sampling failed; the last figures stay");
                    self.sample_error = Some(e);
                }
            }
        }
    }

    /// Hands the labels of the applied plan to the feature file writer when they changed (the
    /// writer writes on a blocking thread; nothing here touches the disk).
    fn relabel(&mut self, state: &State) {
        let Some(writer) = &self.labels else { return };
        let empty = Inventory::default();
        let strategy = state
            .policy
            .as_ref()
            .map(|p| p.mig_strategy)
            .unwrap_or_default();
        let built = labels::node_labels(
            &state.plan,
            state.inventory.as_ref().unwrap_or(&empty),
            strategy,
        );
        let content = labels::render(&built.labels);
        if self.labels_content.as_deref() == Some(content.as_str()) {
            return;
        }
        for w in &built.warnings {
            tracing::warn!(warning = %w, "node labels");
        }
        tracing::debug!(labels = built.labels.len(), "node labels changed");
        writer.set(content.clone());
        self.labels_content = Some(content);
    }

    /// `/readyz` and the tests' view, derived from the state (the one copy of it).
    fn publish_status(&self, state: &State) {
        // Resources the device plugin serves (DRA's are not registered with it).
        let resources = state
            .plan
            .resources
            .iter()
            .filter(|(_, r)| !r.dra)
            .map(|(n, _)| n.clone())
            .collect();
        let ready = state.tracker.mps_ready().clone();
        let applied = state
            .mps_applied
            .iter()
            .filter(|(u, _)| ready.contains(*u))
            .map(|(u, l)| (u.clone(), *l))
            .collect();
        self.status.send_if_modified(|s| {
            let mut n = s.clone();
            n.generation = state.generation;
            n.policy_error.clone_from(&state.policy_error);
            n.discovery_error.clone_from(&state.discovery_error);
            n.resources = resources;
            n.registered.retain(|r| n.resources.contains(r));
            n.streaming.retain(|r| n.resources.contains(r));
            n.stalled.retain(|r| n.resources.contains(r));
            n.xid_events = state.xid_events;
            n.mps_ready = ready;
            n.mps_pending.clone_from(&state.mps_pending);
            n.mps_applied = applied;
            n.devices = state.plan.resources.values().map(|r| r.devices.len()).sum();
            n.healthy_devices = state
                .plan
                .resources
                .values()
                .map(|r| r.devices.iter().filter(|d| d.health.is_healthy()).count())
                .sum();
            n.unhealthy = unhealthy_reasons(state);
            n.retained = state
                .plan
                .drain
                .retained
                .iter()
                .flat_map(|(r, ids)| {
                    ids.iter().map(move |id| {
                        let holders: Vec<String> = state
                            .in_use
                            .holders(r, id)
                            .iter()
                            .map(ToString::to_string)
                            .collect();
                        (
                            format!("{r} {id}"),
                            format!("held by {}", holders.join(", ")),
                        )
                    })
                })
                .collect();
            n.in_use = state.in_use.len();
            n.in_use_error.clone_from(&state.in_use_error);
            let changed = n != *s;
            *s = n;
            changed
        });
    }
}

/// Every physical device (GPU or MIG UUID) the plan advertises Unhealthy, with the tracker's
/// reason (a MIG device held by its parent GPU gets the parent's).
fn unhealthy_reasons(state: &State) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for (name, r) in &state.plan.resources {
        for d in &r.devices {
            if d.health.is_healthy() || out.contains_key(&d.gpu_uuid) {
                continue;
            }
            let draining = state
                .plan
                .drain
                .draining
                .get(name)
                .and_then(|m| m.get(&d.id));
            let refused = r
                .memory
                .as_ref()
                .and_then(|m| crate::plan::memory::required_refusal(m, d));
            let reason = state
                .tracker
                .reason(&d.gpu_uuid)
                .or(draining.map(String::as_str))
                .or(refused.as_deref())
                .or_else(|| {
                    d.mig
                        .as_ref()
                        .and_then(|m| state.tracker.reason(&m.parent_uuid))
                })
                .unwrap_or("discovery reports it unusable");
            out.insert(d.gpu_uuid.clone(), reason.to_string());
        }
    }
    out
}

/// Why the plan holds DRA device `d` of `res` Unhealthy, as a cause (the device taint's value)
/// and a sentence: the tracker's condition on its unit, the drain rules' reason, its MIG
/// parent's condition, a unit no longer present (lost), else the drain rules (an MPS unit
/// whose replicas shrink while clients hold them).
fn dra_cause(
    state: &State,
    res: &crate::plan::ResourcePlan,
    d: &crate::plan::VirtualDevice,
) -> (crate::device_health::Cause, String) {
    use crate::device_health::Cause;
    let tracked = |uuid: &str| {
        let cause = state.tracker.cause(uuid)?;
        Some((
            cause,
            state.tracker.reason(uuid).unwrap_or_default().to_string(),
        ))
    };
    if let Some(c) = tracked(&d.gpu_uuid) {
        return c;
    }
    if let Some(why) = state
        .plan
        .drain
        .draining
        .get(res.name.as_str())
        .and_then(|m| m.get(&d.id))
    {
        return (Cause::Draining, why.clone());
    }
    if let Some(c) = d.mig.as_ref().and_then(|m| tracked(&m.parent_uuid)) {
        return c;
    }
    let present = state.inventory.as_ref().is_some_and(|inv| {
        inv.gpus
            .iter()
            .any(|g| g.uuid == d.gpu_uuid || g.mig_devices.iter().any(|m| m.uuid == d.gpu_uuid))
    });
    if present {
        (
            Cause::Draining,
            "held Unhealthy until its holders release the unit (drain rules)".to_string(),
        )
    } else {
        (Cause::Lost, "the unit is no longer present".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The daemon's policy read applies NVIDIA's overrides (`MIG_STRATEGY`, …) to the file it
    /// reads and to the `empty` fallback's no-config alike.
    #[test]
    fn the_policy_read_applies_the_flag_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
        let overrides = policy::FlagOverrides {
            mig_strategy: Some(policy::MigStrategy::Mixed),
            ..Default::default()
        };
        let sel = select::Selection::default();
        let strategy = |input: Input| match input {
            Input::Policy { parsed: Ok(p), .. } => p.mig_strategy,
            _ => panic!("not a parsed policy"),
        };
        let read = read_policy(&file, false, false, &sel, None, &overrides);
        assert_eq!(strategy(read), policy::MigStrategy::Mixed);
        let plain = read_policy(&file, false, false, &sel, None, &Default::default());
        assert_eq!(strategy(plain), policy::MigStrategy::None);
        // A directory whose fallback is `empty`: no config, the overrides still apply.
        let configs = dir.path().join("configs");
        std::fs::create_dir(&configs).unwrap();
        let empty = select::Selection {
            fallbacks: vec![select::Fallback::Empty],
            ..Default::default()
        };
        let none = read_policy(&configs, true, false, &empty, None, &overrides);
        assert_eq!(strategy(none), policy::MigStrategy::Mixed);
    }

    /// A read past [`CDI_READ_DEADLINE`] is reported slow once and then answered when it
    /// finishes; a request meanwhile starts no second read beside it (each timed-out read
    /// used to stay running while the next began: twelve 4 MiB specs took 757 MB).
    /// (Real time with a 1 ms deadline: tokio's paused clock does not advance while a blocking
    /// task runs. The order is fixed all the same: the read cannot end before it is released.)
    #[tokio::test]
    async fn a_slow_cdi_read_runs_alone_and_is_reported() {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let (tx, mut rx) = mpsc::channel(2);
        let mut cdi = CdiCheck::new(vec![PathBuf::from("/nonexistent/cdi")], tx);
        cdi.deadline = Duration::from_millis(1);
        cdi.read = Arc::new(move |dirs: &[PathBuf]| {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = release_rx.lock().unwrap().recv();
            crate::cdi::read_specs(dirs)
        });
        cdi.start();
        assert!(matches!(rx.recv().await, Some(CdiAnswer::Slow)));
        cdi.start();
        cdi.start();
        assert!(cdi.again, "a request while the read runs is queued");
        // `Slow` can come before the blocking thread has even started the read (a loaded
        // machine): at most one so far; exactly one once it is done (below).
        assert!(calls.load(Ordering::SeqCst) <= 1);
        release_tx.send(()).unwrap();
        match rx.recv().await {
            Some(CdiAnswer::Done(index)) => assert!(index.errors.is_empty(), "{index:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
