//! The supervisor's loop, in named steps: [`Supervisor::wire`] builds every part and returns
//! them as one struct, [`Supervisor::start`] folds the first policy and discovery,
//! [`Supervisor::run`] waits for the next [`Event`] and hands it to its `on_*` method (each
//! folds, then acts), and [`Supervisor::stop`] shuts everything down within one deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval};
use tokio_util::sync::CancellationToken;

use super::cdi_check::CdiAnswer;
use super::fold::{Input, State};
use super::hardware::{Command, Report, SampleRequest};
use super::in_use;
use super::policy_source::PolicySource;
use super::servers;
use super::shell::{publish_label, Shell};
use super::wiring::{self, Inputs};
use super::{
    dra_link, DaemonError, Target, ALLOCATE_SETTLE, BIND_RETRY, DRA_RECORD_WAIT, POLICY_DEBOUNCE,
    RESIDENCY_SETTLE, SHUTDOWN_DEADLINE,
};
use crate::inventory::InventoryError;
use crate::k8s::LabelView;
use crate::mps;
use crate::settings::Settings;
use crate::status::{Metrics, Status};
use crate::watch::{self as fswatch, Inbox};

/// The periodic timers. None catches up on ticks missed while its arm was disabled or the loop
/// was busy (a bind retry disabled for an hour would otherwise fire 3,600 times at once).
struct Timers {
    resync: Interval,
    inventory_resync: Interval,
    bind_retry: Interval,
    in_use_refresh: Interval,
    sample: Interval,
}

impl Timers {
    fn new(settings: &Settings, sampling: Option<Duration>, discovered: bool) -> Timers {
        Timers {
            resync: timer(settings.policy_resync_interval),
            inventory_resync: timer(if discovered {
                settings.inventory_resync_interval
            } else {
                settings.nvml_retry_interval
            }),
            bind_retry: timer(BIND_RETRY),
            in_use_refresh: timer(settings.pod_resources_interval),
            sample: timer(sampling.unwrap_or(Duration::from_secs(3600))),
        }
    }
}

fn timer(period: Duration) -> Interval {
    let mut t = tokio::time::interval_at(Instant::now() + period, period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

/// One-shot deadlines the loop waits for (`None`: not armed).
#[derive(Default)]
struct Deadlines {
    policy_debounce: Option<Instant>,
    node_debounce: Option<Instant>,
    allocate_settle: Option<Instant>,
    residency_settle: Option<Instant>,
}

/// What woke the loop: one variant per source.
enum Event {
    Shutdown,
    Files,
    PolicyRead(Input),
    MigLayoutsRead(Input),
    Report(Option<Report>),
    Label(bool),
    Dra(bool),
    Mps(mps::Event),
    ViewRequest(oneshot::Sender<crate::usage::view::NodeView>),
    Cdi(CdiAnswer),
    Registered(servers::Registered),
    Stream(crate::plugin::StreamEvent),
    SettleDue,
    StreamDeadline,
    Recheck,
    Allocated,
    AllocateSettled,
    InUse(in_use::Answer),
    InUseRefresh,
    SampleDue,
    Reaped,
    PolicyDebounced,
    NodeDebounced,
    RecoveryDue,
    Hangup,
    Resync,
    InventoryResync,
    BindRetry,
    /// DRA asks the hardware for a MIG device (dynamic MIG).
    Mig(crate::dra::mig::MigRequest),
}

/// Everything the supervisor owns (see the module docs).
pub(super) struct Supervisor {
    settings: Settings,
    shutdown: CancellationToken,
    plugin_mode: bool,
    state: State,
    shell: Shell,
    servers: servers::Servers,
    inputs: Inputs,
    timers: Timers,
    deadlines: Deadlines,
    policy: PolicySource,
    /// The MIG layouts file's reads (`--mig-config-file`).
    mig_source: super::mig_source::MigSource,
    inbox: Inbox,
    watches: fswatch::Watches,
    status: Arc<watch::Sender<Status>>,
    /// `/metrics` (DRA's state goes there).
    metrics: Arc<Metrics>,
    status_server: Option<JoinHandle<()>>,
    dra: Option<crate::dra::DraHandle>,
    /// DRA's status, folded into [`Status::dra_down`] and `slicelet_dra_up`.
    dra_status: Option<watch::Receiver<crate::dra::publish::PublishStatus>>,
    node_label: Option<watch::Receiver<LabelView>>,
    label_value: Option<String>,
    /// The node's `nvidia.com/mig.config` label, while watched and set.
    mig_label: Option<String>,
    hangup: Option<tokio::signal::unix::Signal>,
    hardware_gone: bool,
    sampling: Option<Duration>,
}

impl Supervisor {
    /// Builds every part: watches, the status server, the hardware actor, the MPS supervisor,
    /// the device-plugin servers, DRA, the in-use, CDI and label readers.
    ///
    /// # Errors
    /// [`DaemonError`]: the device-plugin directory, a watch or the status address.
    pub(super) async fn wire(
        settings: Settings,
        target: Target,
        shutdown: CancellationToken,
        status: watch::Sender<Status>,
    ) -> Result<Supervisor, DaemonError> {
        let plugin_mode = target == Target::DevicePlugin;
        if plugin_mode {
            std::fs::create_dir_all(&settings.device_plugin_path).map_err(|source| {
                DaemonError::DevicePluginDir {
                    path: settings.device_plugin_path.clone(),
                    source,
                }
            })?;
        }
        let env = wiring::health_env(&settings);
        let inbox = Inbox::default();
        let watches = wiring::watch_all(&settings, plugin_mode, &inbox)?;
        let status = Arc::new(status);
        let metrics = Arc::new(Metrics::new());
        let status_server =
            wiring::serve_status(&settings, plugin_mode, &status, &metrics, &shutdown).await?;
        let (shell, inputs, servers, dra) =
            wiring::wire_shell(&settings, plugin_mode, &shutdown, &status, &metrics);
        let mut state = State::new(env).with_cdi_kind(&settings.cdi_kind);
        if shell.has_in_use_source() {
            state = state.with_in_use_source();
        }
        let sampling = settings.sample_interval.filter(|_| plugin_mode);
        let timers = Timers::new(&settings, sampling, true);
        let policy = PolicySource::new(&settings);
        let mig_source = super::mig_source::MigSource::new(
            settings.mig_config_file.clone().filter(|_| plugin_mode),
        );
        Ok(Supervisor {
            mig_source,
            mig_label: None,
            settings,
            shutdown,
            plugin_mode,
            state,
            shell,
            servers,
            inputs,
            timers,
            deadlines: Deadlines::default(),
            policy,
            inbox,
            watches,
            status,
            metrics,
            status_server,
            dra_status: dra.as_ref().map(|d| d.status.clone()),
            dra,
            node_label: None,
            label_value: None,
            hangup: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
            hardware_gone: false,
            sampling,
        })
    }

    /// The first fold: what is in use (asked at once, so the first plan keeps what running
    /// containers hold), the node's config label (waited for, bounded), the policy (it decides
    /// `failOnInitError`) and the first discovery. `Ok(false)`: shut down before it finished.
    ///
    /// # Errors
    /// [`DaemonError`]: discovery failed where that ends the daemon.
    pub(super) async fn start(&mut self) -> Result<bool, DaemonError> {
        self.shell.refresh_in_use();
        self.shell.tell_hardware(Command::Discover);
        self.wait_for_label().await;
        let first_policy = self.policy.read(true, self.label_value.clone()).await;
        let fail_on_init_error = match &first_policy {
            Input::Policy { parsed: Ok(p), .. } => p.fail_on_init_error,
            _ => true,
        };
        let Some(first) = self.first_discovery().await else {
            return Ok(false);
        };
        let first = match first {
            Ok(x) => Ok(x),
            Err(e) if self.settings.simulate.is_some() => return Err(DaemonError::Simulated(e)),
            Err(e) if fail_on_init_error => return Err(DaemonError::Inventory(e)),
            Err(e) => {
                tracing::error!(error = %crate::errors::chain(&e), retry_in = ?self.settings.nvml_retry_interval,
                    "GPU discovery failed; failOnInitError is false, so advertising nothing and retrying");
                Err(e)
            }
        };
        let discovered = first.is_ok();
        self.first_in_use().await;
        self.first_dra_prepared().await;
        self.fold(Input::Discovered(first));
        self.fold(first_policy);
        if let Some(read) = self.mig_source.read() {
            let layouts = read.await;
            self.fold(layouts);
            self.fold(Input::MigLayoutName(self.mig_name()));
        }
        // The periods count from here (discovery is retried sooner while it fails).
        self.timers = Timers::new(&self.settings, self.sampling, discovered);
        if self.sampling.is_some() && discovered {
            self.shell.tell_hardware(self.sample_request());
        }
        Ok(true)
    }

    /// The node's config label, when a directory of configs is chosen from by label: waited
    /// for (bounded, and not past the first API error), so that a restart does not serve the
    /// default config for a moment.
    async fn wait_for_label(&mut self) {
        let wanted = self.policy.is_config_dir() || self.mig_source.is_configured();
        self.node_label = match &self.settings.label_watch {
            Some(w) if wanted => Some(crate::k8s::watch_label(
                w.clone(),
                self.settings.selection.label.clone(),
                self.shutdown.child_token(),
            )),
            Some(w) => {
                tracing::info!(node = %w.node, config = %self.settings.config.display(), "--config is a file, not a directory of named configs: the node label is not watched");
                None
            }
            None => None,
        };
        let Some(rx) = self.node_label.as_mut() else {
            return;
        };
        let wait = self.settings.label_start_wait;
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            r = tokio::time::timeout(wait, rx.wait_for(|v| v.synced || v.error.is_some())) => {
                if r.is_err() {
                    tracing::warn!(waited = ?wait, "the Kubernetes API gave no node label in time; choosing the config without it until it does");
                }
            }
        }
        let v = rx.borrow_and_update().clone();
        self.label_value.clone_from(&v.value);
        self.mig_label.clone_from(&v.mig_config);
        publish_label(&self.status, &v);
    }

    /// The MIG layout asked for: the node label `nvidia.com/mig.config` when it is watched and
    /// set, else `--mig-config`.
    fn mig_name(&self) -> Option<String> {
        self.mig_label
            .clone()
            .or_else(|| self.settings.mig_config.clone())
    }

    /// Waits for the first discovery, folding health and probe reports that come before it.
    /// `None`: shut down meanwhile.
    async fn first_discovery(
        &mut self,
    ) -> Option<Result<(crate::inventory::Inventory, String), InventoryError>> {
        loop {
            let report = tokio::select! {
                // SIGTERM while the first NVML initialisation or discovery hangs.
                _ = self.shutdown.cancelled() => return None,
                r = self.inputs.reports.recv() => r,
            };
            match report {
                Some(Report::Discovered(r)) => return Some(r),
                Some(Report::Health(e)) => self.fold(Input::Health(e)),
                Some(Report::Probed(p)) => self.fold(Input::Probed(p)),
                Some(Report::Sampled(r)) => self.shell.sampled(r, &self.state),
                Some(Report::MigApplied(r)) => self.fold(Input::MigApplied(r)),
                None => {
                    return Some(Err(InventoryError::NvmlCount(
                        "hardware thread ended".into(),
                    )))
                }
            }
        }
    }

    /// The answer to the in-use read asked at start, when one is running (bounded by the
    /// client's own timeout, 5 s; a missing socket answers at once).
    async fn first_in_use(&mut self) {
        if !self.shell.in_use_busy() {
            return;
        }
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            Some(answer) = self.inputs.in_use_answers.recv() => {
                self.shell.in_use_answered_first();
                self.fold(Input::InUse(answer));
            }
        }
    }

    /// What the DRA checkpoint says is prepared, read from the file before the first plan (the
    /// DRA component reports changes later): after a restart a claim's device keeps its path
    /// and shape while the claim runs, on any kubelet, and with DRA off this run
    /// ([`Settings::dra_checkpoint`], read only). With DRA on and the file missing or not
    /// usable, the first plan waits (at most [`DRA_RECORD_WAIT`]) for DRA's record, rebuilt
    /// from the API, so the device plugin never hands out a running claim's device meanwhile.
    async fn first_dra_prepared(&mut self) {
        let Some(path) = self.settings.dra_checkpoint_path() else {
            return;
        };
        let loaded = if path.exists() {
            crate::dra::checkpoint::load(&path)
        } else {
            Err(crate::dra::checkpoint::CheckpointError::Invalid {
                path: path.clone(),
                message: "missing".to_string(),
            })
        };
        let error = match loaded {
            Ok(c) => {
                let holds = c.dynamic_mig_holds();
                if !holds.is_empty() {
                    self.fold(Input::DraDynamicMig(holds));
                }
                let prepared = crate::dra::checkpoint::holders(&c);
                if !prepared.is_empty() {
                    self.fold(Input::DraPrepared(prepared));
                }
                return;
            }
            Err(e) => e,
        };
        if self.settings.dra.is_none() {
            if path.exists() {
                tracing::warn!(error = %crate::errors::chain(&error), "the DRA checkpoint cannot be read and DRA is off: the devices of claims prepared before are not known to be held");
            }
            return;
        }
        let Some(rx) = self.dra_status.as_mut() else {
            return;
        };
        let wait = rx.wait_for(|s| s.prepared.is_some() || s.down.is_some());
        let recorded = tokio::select! {
            _ = self.shutdown.cancelled() => return,
            r = tokio::time::timeout(DRA_RECORD_WAIT, wait) => matches!(r, Ok(Ok(s)) if s.prepared.is_some()),
        };
        if !recorded {
            tracing::warn!(checkpoint = %path.display(), "no usable DRA checkpoint and DRA has no record of prepared claims yet: the first plan knows no DRA holders");
        }
        self.on_dra(false);
    }

    /// Runs until shutdown: each turn waits for the next [`Event`] and handles it.
    pub(super) async fn run(&mut self) {
        loop {
            self.before_wait();
            match self.next_event().await {
                Event::Shutdown => break,
                Event::Files => self.on_fs_event(),
                Event::PolicyRead(input) | Event::MigLayoutsRead(input) => self.fold(input),
                Event::Report(report) => self.on_report(report),
                Event::Label(ended) => self.on_label(ended),
                Event::Dra(ended) => self.on_dra(ended),
                Event::Mps(ev) => self.fold(Input::Mps(ev)),
                Event::ViewRequest(answer) => self.on_view_request(answer),
                Event::Cdi(index) => self.on_cdi(index),
                Event::Registered(r) => self.on_registered(r),
                Event::Stream(ev) => self.on_stream(ev),
                Event::SettleDue => self.on_settle(),
                Event::StreamDeadline => self.servers.check_streams(),
                Event::Recheck => self.servers.kubelet_dir_changed(),
                Event::Allocated => self.on_allocated(),
                Event::AllocateSettled => self.on_allocate_settled(),
                Event::InUse(answer) => self.on_in_use(answer),
                Event::InUseRefresh => self.shell.refresh_in_use(),
                Event::SampleDue => self.shell.tell_hardware(self.sample_request()),
                Event::Reaped => {}
                Event::PolicyDebounced => self.on_policy_debounced(),
                Event::NodeDebounced => self.on_node_debounced(),
                Event::RecoveryDue => self.fold(Input::RecoveryDue),
                Event::Hangup => self.on_hangup(),
                Event::Resync => {
                    self.want_policy(false);
                    self.mig_source.want();
                }
                Event::InventoryResync => self.shell.rediscover(&self.state),
                Event::BindRetry => self.servers.retry_unserved(),
                Event::Mig(request) => self
                    .shell
                    .tell_hardware(Command::Mig(super::hardware::MigCall(request))),
            }
        }
    }

    /// Arms what the last turn asked for: the settle deadline, a queued policy read.
    fn before_wait(&mut self) {
        if self.shell.take_unsettled() {
            self.deadlines.residency_settle = Some(Instant::now() + RESIDENCY_SETTLE);
        }
        self.policy.start_queued(self.label_value.clone());
        self.mig_source.start_queued();
    }

    /// Waits for whichever source reports first.
    async fn next_event(&mut self) -> Event {
        let recovery = self.state.next_deadline().map(Instant::from_std);
        let stream_deadline = self.servers.next_stream_deadline();
        let in_use_source = self.shell.has_in_use_source();
        let sample_due = self.sampling.is_some() && self.state.inventory.is_some();
        let unserved = self.servers.has_unserved();
        let hardware_gone = self.hardware_gone;
        let Supervisor {
            shutdown,
            inbox,
            policy,
            mig_source,
            inputs,
            node_label,
            dra_status,
            deadlines,
            servers,
            timers,
            hangup,
            ..
        } = self;
        let until = |at: Option<Instant>| async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => Event::Shutdown,
            () = inbox.changed() => Event::Files,
            input = policy.done(), if policy.is_running() => Event::PolicyRead(input),
            input = mig_source.done(), if mig_source.is_running() => Event::MigLayoutsRead(input),
            report = inputs.reports.recv(), if !hardware_gone => Event::Report(report),
            changed = async { node_label.as_mut().expect("guarded").changed().await }, if node_label.is_some() => Event::Label(changed.is_err()),
            changed = async { dra_status.as_mut().expect("guarded").changed().await }, if dra_status.is_some() => Event::Dra(changed.is_err()),
            Some(ev) = inputs.mps_events.recv() => Event::Mps(ev),
            Some(answer) = inputs.view_requests.recv() => Event::ViewRequest(answer),
            Some(index) = inputs.cdi_specs.recv() => Event::Cdi(index),
            Some(r) = inputs.server.registered.recv() => Event::Registered(r),
            Some(request) = async { inputs.mig_requests.as_mut()?.recv().await }, if inputs.mig_requests.is_some() => Event::Mig(request),
            Some(ev) = inputs.server.streams.recv() => Event::Stream(ev),
            () = until(deadlines.residency_settle), if deadlines.residency_settle.is_some() => Event::SettleDue,
            () = until(stream_deadline), if stream_deadline.is_some() => Event::StreamDeadline,
            () = inputs.server.recheck.notified() => Event::Recheck,
            () = inputs.server.allocated.notified() => Event::Allocated,
            () = until(deadlines.allocate_settle), if deadlines.allocate_settle.is_some() => Event::AllocateSettled,
            Some(answer) = inputs.in_use_answers.recv() => Event::InUse(answer),
            _ = timers.in_use_refresh.tick(), if in_use_source => Event::InUseRefresh,
            _ = timers.sample.tick(), if sample_due => Event::SampleDue,
            () = servers.reap() => Event::Reaped,
            () = until(deadlines.policy_debounce), if deadlines.policy_debounce.is_some() => Event::PolicyDebounced,
            () = until(deadlines.node_debounce), if deadlines.node_debounce.is_some() => Event::NodeDebounced,
            () = until(recovery), if recovery.is_some() => Event::RecoveryDue,
            Some(_) = async { hangup.as_mut()?.recv().await }, if hangup.is_some() => Event::Hangup,
            _ = timers.resync.tick() => Event::Resync,
            _ = timers.inventory_resync.tick() => Event::InventoryResync,
            _ = timers.bind_retry.tick(), if unserved => Event::BindRetry,
        }
    }

    fn fold(&mut self, input: Input) {
        self.shell.fold(&mut self.state, input, &mut self.servers);
    }

    fn want_policy(&mut self, force: bool) {
        self.policy.want(force);
    }

    fn sample_request(&self) -> Command {
        Command::Sample(SampleRequest {
            proc_root: self.settings.proc_root.clone(),
            checkpoint: self.settings.checkpoint_path(),
            dra_checkpoint: self.settings.dra_checkpoint_path(),
        })
    }

    /// A change in a watched directory: the policy (debounced, or read at once at a
    /// ConfigMap's commit), the simulated node, the kubelet's directory.
    fn on_fs_event(&mut self) {
        let p = self.inbox.take();
        if p.policy_dir_replaced {
            match wiring::watch_all(&self.settings, self.plugin_mode, &self.inbox) {
                Ok(w) => {
                    tracing::info!("the policy directory was replaced; watching the new one");
                    self.watches = w;
                }
                Err(e) => {
                    tracing::error!(error = %crate::errors::chain(&e), "re-watching the replaced policy directory failed; the periodic re-read still applies")
                }
            }
        }
        if p.policy_commit {
            self.deadlines.policy_debounce = None;
            self.want_policy(false);
        } else if p.policy || p.policy_dir_replaced {
            self.deadlines
                .policy_debounce
                .get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
        }
        if p.node {
            self.deadlines
                .node_debounce
                .get_or_insert_with(|| Instant::now() + POLICY_DEBOUNCE);
        }
        if p.kubelet || p.plugin_removed {
            self.servers.kubelet_dir_changed();
        }
        if p.mig_layouts {
            self.mig_source.want();
        }
    }

    /// The hardware actor's reports: this one and every one already queued behind it.
    fn on_report(&mut self, report: Option<Report>) {
        let Some(report) = report else {
            tracing::error!(
                "the hardware thread ended: no more discoveries, probes or compute-mode changes"
            );
            self.hardware_gone = true;
            return;
        };
        let mut next = Some(report);
        while let Some(r) = next {
            let input = match r {
                Report::Discovered(r) => {
                    self.sync_dra();
                    Input::Discovered(r)
                }
                Report::Health(e) => Input::Health(e),
                Report::Probed(p) => Input::Probed(p),
                Report::MigApplied(r) => Input::MigApplied(r),
                Report::Sampled(r) => {
                    self.shell.sampled(r, &self.state);
                    next = self.inputs.reports.try_recv().ok();
                    continue;
                }
            };
            self.fold(input);
            next = self.inputs.reports.try_recv().ok();
        }
        let period = self.settings.inventory_resync_interval;
        if self.state.inventory.is_some() && self.timers.inventory_resync.period() != period {
            self.timers.inventory_resync = timer(period);
        }
    }

    /// DRA's status, when it changed since last read: folded before each discovery, so that a
    /// MIG device DRA created for a claim (its placement published before the create was
    /// asked for) is never planned as a static device, whichever channel the supervisor
    /// happens to read first.
    fn sync_dra(&mut self) {
        let changed = self
            .dra_status
            .as_ref()
            .is_some_and(|rx| rx.has_changed().unwrap_or(false));
        if changed {
            self.on_dra(false);
        }
    }

    /// The node's config label changed (or its watch ended: the last value stays).
    fn on_label(&mut self, ended: bool) {
        let Some(rx) = self.node_label.as_mut() else {
            return;
        };
        let v = rx.borrow_and_update().clone();
        if ended {
            self.node_label = None;
        }
        publish_label(&self.status, &v);
        if v.mig_config != self.mig_label {
            self.mig_label = v.mig_config;
            self.fold(Input::MigLayoutName(self.mig_name()));
        }
        if v.value != self.label_value {
            self.label_value = v.value;
            self.want_policy(false);
        }
    }

    /// DRA's status changed: whether it serves goes into `/readyz` and `slicelet_dra_up`,
    /// whether it taints Unhealthy devices into `/readyz`'s notes and
    /// `slicelet_dra_device_taints`, a failing watch of its ResourceSlices into `/readyz`'s
    /// notes, the slices it published again into `slicelet_dra_slices_republished_total`.
    fn on_dra(&mut self, ended: bool) {
        let Some(rx) = self.dra_status.as_mut() else {
            return;
        };
        let (down, serving, prepared, taints_refused, dynamic_mig, republished, watch_error) = {
            let s = rx.borrow_and_update();
            (
                s.down.clone(),
                s.serving,
                s.prepared.clone(),
                s.taints_refused.clone(),
                s.dynamic_mig.clone(),
                s.republished,
                s.slice_watch_error.clone(),
            )
        };
        if ended {
            self.dra_status = None;
        }
        self.metrics.set_dra_up(down.is_none());
        self.metrics
            .set_dra_device_taints(serving && taints_refused.is_none());
        self.metrics.set_dra_slices_republished(republished);
        self.status.send_modify(|s| {
            s.dra_down = down;
            s.dra_serving = serving;
            s.dra_taints_refused = taints_refused;
            s.dra_slice_watch_error = watch_error;
            s.dra_slices_republished = republished;
        });
        // Only once DRA has loaded its checkpoint: before that it knows nothing, and folding
        // an empty map would drop the holders read from the file at start.
        if let Some(prepared) = prepared {
            self.fold(Input::DraDynamicMig(dynamic_mig));
            self.fold(Input::DraPrepared(prepared));
        }
    }

    /// `/status` asks for its view: built from the state at this moment.
    fn on_view_request(&mut self, answer: oneshot::Sender<crate::usage::view::NodeView>) {
        let _ = answer.send(self.shell.view(&self.state));
    }

    fn on_cdi(&mut self, answer: CdiAnswer) {
        let index = match answer {
            CdiAnswer::Slow => {
                tracing::warn!(dirs = ?self.settings.cdi_spec_dirs, deadline = ?super::CDI_READ_DEADLINE,
                    "reading the CDI specs takes longer than its deadline; the last answer stays until it finishes");
                return;
            }
            CdiAnswer::Done(index) => index,
        };
        // The read that ran is done (a queued one starts) before the fold may ask for another.
        self.shell.cdi_answered();
        self.fold(Input::CdiSpecs(index));
    }

    fn on_registered(&mut self, r: servers::Registered) {
        self.servers.registered(r);
        self.shell.mark_unsettled();
    }

    fn on_stream(&mut self, ev: crate::plugin::StreamEvent) {
        self.servers.stream_event(ev);
        self.shell.mark_unsettled();
    }

    fn on_settle(&mut self) {
        self.deadlines.residency_settle = None;
        let trimmed = crate::residency::settle();
        tracing::debug!(
            trimmed,
            "settled: the free heap pages of the last change returned"
        );
    }

    /// An Allocate answered: what is in use is read once the burst settled.
    fn on_allocated(&mut self) {
        self.deadlines
            .allocate_settle
            .get_or_insert_with(|| Instant::now() + ALLOCATE_SETTLE);
    }

    fn on_allocate_settled(&mut self) {
        self.deadlines.allocate_settle = None;
        // Allocates from now on signal again; this read covers those before.
        self.inputs.server.allocated.rearm();
        self.shell.refresh_in_use();
    }

    fn on_in_use(&mut self, answer: in_use::Answer) {
        if let Some(answer) = self.shell.in_use_answered(answer) {
            self.fold(Input::InUse(answer));
        }
    }

    fn on_policy_debounced(&mut self) {
        self.deadlines.policy_debounce = None;
        self.want_policy(false);
    }

    fn on_node_debounced(&mut self) {
        self.deadlines.node_debounce = None;
        self.shell.tell_hardware(Command::Discover);
    }

    fn on_hangup(&mut self) {
        tracing::info!("SIGHUP: re-reading the policy and re-discovering GPUs");
        self.want_policy(true);
        self.mig_source.want();
        self.shell.rediscover(&self.state);
    }

    /// One overall deadline: servers, MPS daemons, the labels' file, the status endpoint and
    /// DRA stop together, then the hardware thread restores compute modes in what is left.
    /// Nobody reads reports any more: the channels are dropped first, so a hardware thread
    /// never waits for room.
    pub(super) async fn stop(self) {
        let started = Instant::now();
        let Supervisor {
            inputs,
            shell,
            servers,
            status_server,
            dra,
            ..
        } = self;
        let Inputs {
            reports,
            mps_events,
            ..
        } = inputs;
        drop(reports);
        drop(mps_events);
        let others = async {
            tokio::join!(
                servers.shutdown(SHUTDOWN_DEADLINE),
                async {
                    if let Some(h) = status_server {
                        let _ = tokio::time::timeout(Duration::from_secs(1), h).await;
                    }
                },
                dra_link::stop(dra),
            );
        };
        shell.stop(others, started).await;
        tracing::info!("stopped: every stream ended and every socket removed");
    }

    /// Stops the hardware actor and the MPS supervisor when the start did not get far enough
    /// for [`Supervisor::stop`].
    pub(super) async fn abort(self) {
        let Supervisor { inputs, shell, .. } = self;
        drop(inputs);
        shell.abort().await;
    }
}
