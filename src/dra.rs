//! Dynamic Resource Allocation (`resource.k8s.io/v1`, GA in Kubernetes 1.34): the same plan the
//! device plugin serves, published as ResourceSlices and prepared through the kubelet's DRA
//! plugin API, beside the device plugin or alone.
//!
//! - [`health_map`] (pure): each device's health, cause and since when (device taints and the
//!   kubelet's health stream).
//! - [`slices`] (pure): a plan's DRA resources and the inventory → the node's ResourceSlices,
//!   Unhealthy devices tainted (or withdrawn where the API server has no device taints).
//! - [`publish`]: reconciles those slices through the Kubernetes API.
//! - [`prepare`] (pure): a ResourceClaim's allocation → the devices, CDI IDs and CDI spec.
//! - [`checkpoint`]: the prepared claims, on disk (with the dynamic MIG devices created for
//!   them).
//! - [`mig`]: the channel MIG devices are created and destroyed through (dynamic MIG; the
//!   daemon's hardware thread serves it).
//! - [`plugin`]: the kubelet plugin (registration, the DRA service v1 and v1beta1).
//! - [`health_service`]: the kubelet's DRAResourceHealth service (v1 and v1alpha1), on the same
//!   endpoint: every device's health, streamed.
//!
//! One policy, both paths: a resource is served by DRA exactly when the policy says so
//! (`dra.resources`, or a sharing entry's `dra: true`; [`crate::plan::ResourcePlan::dra`]); the
//! device plugin serves the others; a GPU in both is a plan error
//! ([`crate::plan::PlanError::DraOverlap`]). So no device is handed out by both.
//!
//! [`spawn`] runs it all for the daemon.

pub mod checkpoint;
pub mod drift;
pub mod dynamic_health;
pub mod health_map;
pub mod health_service;
pub mod mig;
pub mod plugin;
pub mod pool;
pub mod prepare;
pub mod publish;
pub mod slices;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::inventory::Inventory;
use crate::plan::Plan;

/// The default DRA driver name (`--dra-driver-name`).
pub const DEFAULT_DRIVER: &str = "gpu.slicelet.io";
/// The default CDI spec directory for claim specs (`--cdi-output-dir`).
pub const DEFAULT_CDI_OUTPUT_DIR: &str = "/var/run/cdi";

/// What DRA needs of each plan: the plan, the inventory it was built from (with the NVIDIA
/// driver version when known), each device's health and the policy's taint effect.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DraInput {
    /// The plan the device plugin serves too (DRA takes its `dra` resources).
    pub plan: Arc<Plan>,
    /// The inventory (models, memory, compute capabilities and the driver version for the
    /// slices' attributes).
    pub inventory: Arc<Inventory>,
    /// Every device of the pool: health, cause and since when ([`health_map::fold`]).
    pub health: health_map::HealthMap,
    /// The policy's `dra.xidTaintEffect`.
    pub xid_taint_effect: crate::policy::TaintEffect,
}

impl DraInput {
    /// The input for `plan`: the health of its DRA devices folded over `prev`'s (so `since`
    /// stays put for devices that did not change) at `now`, each Unhealthy device's cause
    /// from `cause.of`, and the health of its dynamic MIG devices
    /// ([`dynamic_health::fold_dynamic`]) from the conditions `cause.tracked` names.
    pub fn new(
        plan: Arc<Plan>,
        inventory: Arc<Inventory>,
        xid_taint_effect: crate::policy::TaintEffect,
        cause: &Causes<'_, '_>,
        prev: Option<&DraInput>,
        now: std::time::SystemTime,
    ) -> DraInput {
        let empty = health_map::HealthMap::new();
        let prev_health = prev.map_or(&empty, |p| &p.health);
        let mut health = health_map::fold(prev_health, slices::dra_resources(&plan), cause.of, now);
        health.extend(dynamic_health::fold_dynamic(
            prev_health,
            &plan.dynamic_mig,
            &inventory,
            cause.tracked,
            now,
        ));
        DraInput {
            plan,
            inventory,
            health,
            xid_taint_effect,
        }
    }
}

/// Why devices are Unhealthy, as [`DraInput::new`] asks: by the plan's device, and by UUID.
pub struct Causes<'a, 'b> {
    /// Why the plan holds a static device Unhealthy ([`health_map::CauseOf`]).
    pub of: &'a health_map::CauseOf<'b>,
    /// The tracker's condition on a GPU or MIG device by UUID ([`health_map::TrackedCause`]):
    /// what makes a dynamic MIG device Unhealthy.
    pub tracked: &'a health_map::TrackedCause<'b>,
}

/// Where DRA runs (the `--dra-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraSettings {
    /// `--dra-driver-name` (default `gpu.slicelet.io`).
    pub driver: String,
    /// `--node-name`: the slices' `spec.nodeName` and the pool's name.
    pub node: String,
    /// `--dra-registry-dir` (default `/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// `--dra-plugins-dir` (default `/var/lib/kubelet/plugins`).
    pub plugins_dir: PathBuf,
    /// `--cdi-output-dir` (default `/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// `--kubeconfig`; `None`: in-cluster or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// The host's `/dev` root for device nodes (as for Allocate; `/` on a node).
    pub dev_root: String,
    /// The GPU memory-limit hook for consumable-capacity shares (`--hook-binary` given: the
    /// hook is on the host); used on nodes whose driver partitions memory per cgroup.
    pub memory_hook: Option<crate::cdi::memory::HookConfig>,
}

/// DRA could not start.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The Kubernetes API client could not be built.
    #[error("DRA needs the Kubernetes API")]
    Client(#[source] crate::k8s::ClientError),
    /// The driver name cannot qualify a CDI kind.
    #[error("--dra-driver-name {driver}: not usable as a CDI vendor")]
    Driver {
        /// The name.
        driver: String,
        /// Why.
        #[source]
        source: crate::policy::cdi::NameError,
    },
    /// A socket could not be bound.
    #[error("binding {}: {message}", path.display())]
    Bind {
        /// The socket.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// The checkpoint cannot be used and the API did not answer for the claims allocated from
    /// this node (the file is kept; retried).
    #[error("checkpoint {}: cannot be used, and rebuilding it needs the claims allocated from this node (list resourceclaims)", path.display())]
    Rebuild {
        /// The checkpoint.
        path: PathBuf,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The unusable checkpoint could not be renamed aside.
    #[error("checkpoint {}: setting it aside", path.display())]
    SetAside {
        /// The checkpoint.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A gRPC server stopped with an error.
    #[error("serving {}", path.display())]
    Serve {
        /// The socket.
        path: PathBuf,
        /// tonic's error.
        #[source]
        source: tonic::transport::Error,
    },
}

/// A running DRA component.
pub struct DraHandle {
    /// Ends when `shutdown` is cancelled (sockets removed), or with the error that stopped it.
    pub task: JoinHandle<Result<(), DraError>>,
    /// The publisher's progress.
    pub status: watch::Receiver<publish::PublishStatus>,
}

/// Starts DRA on the current runtime: the publisher, the DRA service and then the
/// registration socket. `inputs` carries each new plan (`None` until the first); `mig`: where
/// dynamic MIG devices are created and destroyed (the daemon's hardware thread; `None`: a
/// claim for one fails); the component stops, removing its sockets, when `shutdown` is
/// cancelled.
pub fn spawn(
    settings: DraSettings,
    inputs: watch::Receiver<Option<Arc<DraInput>>>,
    shutdown: CancellationToken,
    mig: Option<mig::MigClient>,
) -> DraHandle {
    let (status_tx, status) = watch::channel(publish::PublishStatus::default());
    let task = tokio::spawn(supervise(settings, inputs, status_tx, shutdown, mig));
    DraHandle { task, status }
}

/// Whether claim specs can be written into `dir` (`--cdi-output-dir`): it is created if
/// missing and a temporary file is created and removed in it.
///
/// # Errors
/// A sentence naming the directory and the cause.
fn writable(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .and_then(|()| {
            tempfile::Builder::new()
                .prefix(".slicelet-probe.")
                .tempfile_in(dir)
        })
        .map(drop)
        .map_err(|e| {
            format!(
                "--cdi-output-dir {} cannot be written ({e}): no claim can be prepared",
                dir.display()
            )
        })
}

/// Shortest and longest wait before DRA is started again after it failed.
pub const RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(200);
/// See [`RETRY_MIN`].
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs DRA until `shutdown`, starting it again (capped exponential backoff with jitter,
/// [`RETRY_MIN`] to [`RETRY_MAX`]) whenever it fails: missing API credentials, a socket
/// another process still serves during a rollout, a server that ended. Each failure is logged
/// with its cause and shown in the status ([`publish::PublishStatus::down`]) until DRA serves
/// again.
async fn supervise(
    settings: DraSettings,
    inputs: watch::Receiver<Option<Arc<DraInput>>>,
    status: watch::Sender<publish::PublishStatus>,
    shutdown: CancellationToken,
    mig: Option<mig::MigClient>,
) -> Result<(), DraError> {
    use backon::BackoffBuilder as _;
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_MIN)
        .with_max_delay(RETRY_MAX)
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        let result = run(
            settings.clone(),
            inputs.clone(),
            status.clone(),
            shutdown.child_token(),
            mig.clone(),
        )
        .await;
        if shutdown.is_cancelled() {
            return result;
        }
        let cause = match result {
            Ok(()) => "not serving (retried): a DRA server ended".to_string(),
            Err(e) => format!("not serving (retried): {}", crate::errors::chain(&e)),
        };
        status.send_modify(|s| s.serving = false);
        let delay = delays.next().unwrap_or(RETRY_MAX);
        tracing::error!(error = %cause, retry_in = ?delay, "DRA is not serving; starting it again after a backoff");
        status.send_modify(|s| s.down = Some(cause));
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

async fn run(
    settings: DraSettings,
    inputs: watch::Receiver<Option<Arc<DraInput>>>,
    status: watch::Sender<publish::PublishStatus>,
    shutdown: CancellationToken,
    mig: Option<mig::MigClient>,
) -> Result<(), DraError> {
    crate::policy::cdi::parse_kind(&prepare::cdi_kind(&settings.driver)).map_err(|source| {
        DraError::Driver {
            driver: settings.driver.clone(),
            source,
        }
    })?;
    let client = crate::k8s::client(settings.kubeconfig.as_deref())
        .await
        .map_err(DraError::Client)?;
    let prepared = plugin::load_or_rebuild(&settings, &client).await?;
    let plugin = Arc::new(plugin::Plugin::new(
        settings.clone(),
        client.clone(),
        inputs.clone(),
        status.clone(),
        prepared,
        mig,
    ));
    // Before the kubelet can call: the MIG devices a restart left half made or half undone.
    plugin.reconcile_mig().await;
    let (dra_listener, dra_bound) = plugin::bind(&plugin::dra_socket(&settings))?;
    let (reg_listener, reg_bound) = plugin::bind(&plugin::registration_socket(&settings))?;
    let (reg_tx, reg_rx) = watch::channel(0u64);
    let params = slices::SliceParams {
        node: settings.node.clone(),
        driver: settings.driver.clone(),
        generation: 0,
        driver_version: None,
        unhealthy: slices::Unhealthy::default(),
    };
    let health =
        health_service::HealthService::new(settings.node.clone(), inputs.clone(), shutdown.clone());
    let publisher = tokio::spawn(publish::run(
        client,
        params,
        inputs,
        reg_rx,
        status.clone(),
        shutdown.child_token(),
    ));
    let dra_path = dra_bound.path.clone();
    let dra_server = spawn_dra_server(dra_listener, plugin::Service(plugin), health, &shutdown);
    let registrar = plugin::Registrar {
        driver: settings.driver.clone(),
        endpoint: dra_path.clone(),
        registrations: reg_tx,
    };
    let reg_path = reg_bound.path.clone();
    let reg_server = spawn_registration_server(reg_listener, registrar, &shutdown);
    tracing::info!(driver = %settings.driver, registration = %reg_path.display(), endpoint = %dra_path.display(), "DRA: kubelet plugin serving");
    mark_serving(&settings, &status);
    let servers = Servers {
        dra: (dra_server, dra_path),
        registration: (reg_server, reg_path),
        publisher,
    };
    let result = servers.until_one_ends(&shutdown).await;
    reg_bound.remove();
    dra_bound.remove();
    result
}

/// A gRPC server task: what its serve returned.
type ServerTask = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves the DRA plugin (v1 and v1beta1) and resource-health services (v1 and v1alpha1) on
/// `listener` until `shutdown`. The connection limits of every socket: listen.rs; any
/// `:authority` (the kubelet's plugin watcher sends the socket path): authority.rs.
fn spawn_dra_server(
    listener: tokio::net::UnixListener,
    service: plugin::Service,
    health: health_service::HealthService,
    shutdown: &CancellationToken,
) -> ServerTask {
    let stop = shutdown.clone();
    let listener = crate::listen::incoming(listener, crate::listen::Limits::default());
    tokio::spawn(async move {
        use crate::api::drahealth::{v1 as health_v1, v1alpha1 as health_v1alpha1};
        crate::listen::server()
            .add_service(
                crate::api::dra::v1::dra_plugin_server::DraPluginServer::new(service.clone()),
            )
            .add_service(crate::api::dra::v1beta1::dra_plugin_server::DraPluginServer::new(service))
            .add_service(
                health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone()),
            )
            .add_service(
                health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health),
            )
            .serve_with_incoming_shutdown(listener, stop.cancelled_owned())
            .await
    })
}

/// Serves the kubelet's plugin registration service on `listener` until `shutdown`.
fn spawn_registration_server(
    listener: tokio::net::UnixListener,
    registrar: plugin::Registrar,
    shutdown: &CancellationToken,
) -> ServerTask {
    let stop = shutdown.clone();
    let listener = crate::listen::incoming(listener, crate::listen::Limits::default());
    tokio::spawn(async move {
        crate::listen::server()
            .add_service(
                crate::api::pluginregistration::registration_server::RegistrationServer::new(
                    registrar,
                ),
            )
            .serve_with_incoming_shutdown(listener, stop.cancelled_owned())
            .await
    })
}

/// Marks DRA serving in `status`. Claims cannot be prepared where their CDI specs cannot be
/// written: a readiness failure named now, not at the first claim (unprepare works all the
/// same).
fn mark_serving(settings: &DraSettings, status: &watch::Sender<publish::PublishStatus>) {
    let unwritable = writable(&settings.cdi_dir).err();
    if let Some(e) = &unwritable {
        tracing::error!(error = %e, "DRA serves, but no claim can be prepared");
    }
    status.send_modify(|s| {
        s.down = unwritable;
        s.serving = true;
    });
}

/// DRA's running tasks: its two servers (with their socket paths) and the publisher.
struct Servers {
    dra: (ServerTask, PathBuf),
    registration: (ServerTask, PathBuf),
    publisher: tokio::task::JoinHandle<()>,
}

impl Servers {
    /// Waits for the first task to end, then cancels `shutdown` and waits for the others (a
    /// finished JoinHandle must not be awaited again).
    ///
    /// # Errors
    /// [`DraError::Serve`] when the first to end is a server whose serve failed.
    async fn until_one_ends(self, shutdown: &CancellationToken) -> Result<(), DraError> {
        let Servers {
            dra: (mut dra_server, dra_path),
            registration: (mut reg_server, reg_path),
            mut publisher,
        } = self;
        let served = |r: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>,
                      path: &PathBuf| match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(DraError::Serve {
                path: path.clone(),
                source,
            }),
            Err(_) => Ok(()),
        };
        let (result, ended) = tokio::select! {
            r = &mut dra_server => (served(r, &dra_path), 0),
            r = &mut reg_server => (served(r, &reg_path), 1),
            _ = &mut publisher => (Ok(()), 2),
        };
        shutdown.cancel();
        if ended != 0 {
            let _ = dra_server.await;
        }
        if ended != 1 {
            let _ = reg_server.await;
        }
        if ended != 2 {
            let _ = publisher.await;
        }
        result
    }
}
