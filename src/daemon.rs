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
//! One module per job: `supervisor` (the loop and its events), `wiring` (settings to parts),
//! `shell` (the parts the actions drive), `policy_source`, `in_use`, `cdi_check` and
//! `dra_link` (each a source that answers on a channel, or a part the shell calls), `fold`,
//! [`hardware`] and `servers`. A new input is a module of its own plus one arm of the loop.
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

mod cdi_check;
mod dra_link;
mod fold;
pub mod hardware;
mod in_use;
mod mig_source;
mod policy_source;
mod read_queue;
mod servers;
mod shell;
mod supervisor;
mod wiring;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use self::fold::{Action, HealthEnv, Input, State};
pub use self::policy_source::{chosen_file, ChoiceError};
use crate::inventory::{Inventory, InventoryError};
use crate::settings::Settings;
use crate::status::Status;
use crate::watch::WatchError;

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

/// Opens the configured GPU source and discovers the node's GPUs once (for `plan`/`validate`,
/// which block anyway; the daemon discovers on its hardware actor).
///
/// # Errors
/// [`InventoryError`] from NVML or the simulated node file.
pub fn discover(settings: &Settings) -> Result<(Inventory, String), InventoryError> {
    let mut source = wiring::open_source(settings)?;
    let inv = source.discover()?;
    Ok((inv, source.describe()))
}

/// The GPU source `settings` names, open: the simulated node file (`--simulate`) or NVML, as
/// the daemon opens it (`slicelet mig` creates and destroys MIG devices through it).
///
/// # Errors
/// [`InventoryError`] from NVML or the simulated node file.
pub fn open_source(
    settings: &Settings,
) -> Result<Box<dyn crate::inventory::GpuSource>, InventoryError> {
    wiring::open_source(settings)
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
