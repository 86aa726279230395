//! Settings to parts: the watches, the status endpoint, the health checks' environment, the
//! hardware actor, the MPS supervisor, the device-plugin servers, DRA and the shell, each built
//! from [`Settings`] and handed to the supervisor with the receivers they report on.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::cdi_check::{CdiAnswer, CdiCheck};
use super::dra_link::DraLink;
use super::fold::HealthEnv;
use super::hardware::{Hardware, Report};
use super::in_use::{self, InUseReader};
use super::servers::{self, Servers};
use super::shell::{labels_report, Shell, ShellParts};
use super::DaemonError;
use crate::inventory::nvml::NvmlSource;
use crate::inventory::simulated::SimulatedSource;
use crate::inventory::{GpuSource, InventoryError};
use crate::mps;
use crate::plan::Plan;
use crate::settings::Settings;
use crate::status::{self as status_http, Metrics, Status};
use crate::watch::{self as fswatch, Inbox, WatchError};

/// The receivers every source of change reports on.
pub(super) struct Inputs {
    /// The hardware actor's reports.
    pub reports: mpsc::Receiver<Report>,
    /// The MPS supervisor's events.
    pub mps_events: mpsc::Receiver<mps::Event>,
    /// The in-use reads' answers.
    pub in_use_answers: mpsc::Receiver<in_use::Answer>,
    /// The CDI reads' answers.
    pub cdi_specs: mpsc::Receiver<CdiAnswer>,
    /// `/status` asking for its view.
    pub view_requests: mpsc::Receiver<crate::status::ViewRequest>,
    /// The device-plugin servers' events.
    pub server: servers::ServerEvents,
    /// DRA's MIG requests, for the hardware actor (`None` without `--dra`).
    pub mig_requests: Option<super::dra_link::MigRequests>,
}

/// The watches of the policy directory (and, for the device plugin, the kubelet's directory and
/// the MIG layouts file's).
pub(super) fn watch_all(
    settings: &Settings,
    plugin_mode: bool,
    inbox: &Inbox,
) -> Result<fswatch::Watches, WatchError> {
    let watches = if plugin_mode {
        fswatch::start(
            &settings.config,
            &settings.device_plugin_path,
            settings.simulate.as_deref(),
            inbox,
        )?
    } else {
        fswatch::start_policy(&settings.config, settings.simulate.as_deref(), inbox)?
    };
    match settings.mig_config_file.as_deref().filter(|_| plugin_mode) {
        Some(file) => Ok(watches.with(fswatch::start_file(file, inbox, |p| {
            p.mig_layouts = true;
        })?)),
        None => Ok(watches),
    }
}

/// Opens the configured GPU source: the simulated node file (`--simulate`) or NVML.
///
/// # Errors
/// [`InventoryError`] from NVML or the simulated node file.
pub(super) fn open_source(settings: &Settings) -> Result<Box<dyn GpuSource>, InventoryError> {
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

/// The health checks' environment (`DP_DISABLE_HEALTHCHECKS`, `DP_ENABLE_HEALTHCHECKS`), each
/// item that is not an Xid, `all` or `xids` logged once.
pub(super) fn health_env(settings: &Settings) -> HealthEnv {
    let env = HealthEnv {
        disable: settings.disable_healthchecks.clone(),
        enable: settings.enable_healthchecks.clone(),
    };
    for e in crate::health_tracker::XidPolicy::new(
        env.disable.as_deref(),
        env.enable.as_deref(),
        &[],
        &[],
    )
    .skipped
    {
        tracing::warn!(variable = e.var, item = %e.item, "not an Xid, `all` or `xids`; skipped");
    }
    env
}

/// `/healthz`, `/readyz`, `/metrics` and `/status` on `--status-address` (the device plugin
/// only).
pub(super) async fn serve_status(
    settings: &Settings,
    plugin_mode: bool,
    status: &Arc<watch::Sender<Status>>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Result<Option<JoinHandle<()>>, DaemonError> {
    let Some(address) = settings.status_address.filter(|_| plugin_mode) else {
        return Ok(None);
    };
    let (local, handle) = status_http::serve(
        address,
        status.subscribe(),
        Arc::clone(metrics),
        shutdown.child_token(),
    )
    .await
    .map_err(|source| DaemonError::Status { address, source })?;
    tracing::info!(address = %local, "serving /healthz, /readyz and /metrics");
    status.send_modify(|s| s.address = Some(local));
    Ok(Some(handle))
}

/// The shell (the hardware actor, the MPS supervisor, the readers and writers the fold's
/// actions drive), the receivers they report on, the device-plugin servers and DRA.
pub(super) fn wire_shell(
    settings: &Settings,
    plugin_mode: bool,
    shutdown: &CancellationToken,
    status: &Arc<watch::Sender<Status>>,
    metrics: &Arc<Metrics>,
) -> (Shell, Inputs, Servers, Option<crate::dra::DraHandle>) {
    let (hardware, reports, mps, mps_events, owns_compute) = spawn_actors(settings, plugin_mode);
    let (plans, _) = watch::channel(Arc::new(Plan::default()));
    let (servers, server) = Servers::new(
        settings.device_plugin_path.clone(),
        settings.dev_root.clone(),
        plans.subscribe(),
        shutdown.clone(),
        Arc::clone(status),
        Arc::clone(metrics),
        settings.stream_grace,
    );
    let (dra, dra_handle, mig_requests) = DraLink::spawn(settings, plugin_mode, shutdown);
    let (in_use_tx, in_use_answers) = mpsc::channel(1);
    let (cdi_tx, cdi_specs) = mpsc::channel(2);
    // /status asks for its view; the answer is built from the state at that moment.
    let (view_tx, view_requests) = mpsc::channel::<crate::status::ViewRequest>(8);
    if plugin_mode {
        metrics.answer_views(view_tx);
    }
    let labels = settings
        .nfd_features_file
        .clone()
        .filter(|_| plugin_mode)
        .map(|path| crate::labels::file::Writer::spawn(path, labels_report(Arc::clone(status))));
    let in_use_socket = settings
        .pod_resources_socket
        .clone()
        .filter(|_| plugin_mode);
    let shell = Shell::new(ShellParts {
        plans,
        status: Arc::clone(status),
        metrics: Arc::clone(metrics),
        hardware,
        mps,
        owns_compute,
        plugin_mode,
        labels,
        cdi: CdiCheck::new(settings.cdi_spec_dirs.clone(), cdi_tx),
        in_use: InUseReader::new(in_use_socket, in_use_tx),
        dra,
        memory_spec: settings
            .memory_spec_dir
            .clone()
            .filter(|_| plugin_mode)
            .map(|dir| (dir, settings.memory_hook.clone())),
    });
    let inputs = Inputs {
        reports,
        mps_events,
        in_use_answers,
        cdi_specs,
        view_requests,
        server,
        mig_requests,
    };
    (shell, inputs, servers, dra_handle)
}

/// The hardware actor (every NVML call happens on its thread) and the MPS supervisor, with the
/// channels they report on; whether slicelet owns the GPUs' compute modes (not with
/// `--mps-external`).
fn spawn_actors(
    settings: &Settings,
    plugin_mode: bool,
) -> (
    Hardware,
    mpsc::Receiver<Report>,
    mps::Supervisor,
    mpsc::Receiver<mps::Event>,
    bool,
) {
    let (report_tx, reports) = mpsc::channel(super::CHANNEL_CAPACITY);
    let opener_settings = settings.clone();
    let hardware = Hardware::spawn(Box::new(move || open_source(&opener_settings)), report_tx);
    let (mps_tx, mps_events) = mpsc::channel(super::CHANNEL_CAPACITY);
    let mut mps_config = settings.mps.clone();
    if !plugin_mode {
        mps_config.external = false;
    }
    let owns_compute = !mps_config.external;
    let mps = mps::Supervisor::spawn(mps_config, mps_tx);
    (hardware, reports, mps, mps_events, owns_compute)
}
