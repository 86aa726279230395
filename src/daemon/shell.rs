//! The shell: the parts the fold's actions drive (the plan's watch channel, the hardware actor,
//! the MPS supervisor, the CDI and in-use readers, DRA, the labels' file, the memory-limit
//! CDI spec, `/metrics` and `/readyz`), behind methods the supervisor calls.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::cdi_check::CdiCheck;
use super::dra_link::DraLink;
use super::fold::{Action, Input, State};
use super::hardware::{Command, Hardware, SampleError};
use super::in_use::{self, InUseReader};
use super::servers::Servers;
use crate::inventory::Inventory;
use crate::labels;
use crate::mps;
use crate::plan::Plan;
use crate::status::{Metrics, Status};
use crate::usage::Samples;

/// What the shell is built from (see [`Shell`]'s fields).
pub(super) struct ShellParts {
    /// Where each plan is published (the device-plugin servers subscribe).
    pub plans: watch::Sender<Arc<Plan>>,
    /// The supervisor's [`Status`].
    pub status: Arc<watch::Sender<Status>>,
    /// `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The hardware actor.
    pub hardware: Hardware,
    /// The MPS supervisor.
    pub mps: mps::Supervisor,
    /// Whether slicelet owns the GPUs' compute modes (not with `--mps-external`).
    pub owns_compute: bool,
    /// `slicelet run` (not `slicelet mps`).
    pub plugin_mode: bool,
    /// The NFD feature file's writer (`--nfd-features-file`).
    pub labels: Option<labels::file::Writer>,
    /// The CDI spec reads.
    pub cdi: CdiCheck,
    /// The in-use reads.
    pub in_use: InUseReader,
    /// DRA's link.
    pub dra: DraLink,
    /// Where the memory-limit CDI spec goes and how its hooks run (`--memory-spec-dir`).
    pub memory_spec: Option<(PathBuf, crate::cdi::memory::HookConfig)>,
}

/// Carries out the fold's actions.
pub(super) struct Shell {
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
    dra: DraLink,
    /// Something changed since the last [`crate::residency::settle`] was scheduled.
    unsettled: bool,
    /// Where slicelet's memory-limit CDI spec goes and how its hooks run (`--memory-spec-dir`,
    /// device plugin mode only).
    memory_spec: Option<(PathBuf, crate::cdi::memory::HookConfig)>,
    /// The memory-limit spec last written (`Some(None)`: removed); `None` before the first.
    memory_spec_on_disk: Option<Option<String>>,
}

/// Shows the node's config label and the API's last error in the [`Status`].
pub(super) fn publish_label(status: &watch::Sender<Status>, v: &crate::k8s::LabelView) {
    status.send_modify(|s| {
        s.node_label.clone_from(&v.value);
        s.api_error.clone_from(&v.error);
    });
}

/// Folds the feature file writer's outcomes into the [`Status`] (`nfd_writes`, `nfd_error`).
pub(super) fn labels_report(status: Arc<watch::Sender<Status>>) -> labels::file::Report {
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
    pub(super) fn rediscover(&mut self, state: &State) {
        self.hardware.send(Command::Discover);
        if self.plugin_mode && state.uses_cdi() {
            self.cdi.start();
        }
    }

    /// Folds `input` into `state` and carries out the actions (the servers reconciled against
    /// a published plan).
    pub(super) fn fold(&mut self, state: &mut State, input: Input, servers: &mut Servers) {
        let actions = state.fold(input, Instant::now().into_std());
        // The labels depend on the plan and on the policy's migStrategy, which can change
        // without changing the plan.
        let relabel = actions.iter().any(|a| {
            matches!(
                a,
                Action::Publish(_) | Action::PolicyApplied(_) | Action::MigState
            )
        });
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
                    self.dra.send(state, &plan);
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
                Action::Causes => self.dra.causes_changed(state),
                Action::MigApply(change) => self.hardware.send(Command::MigLayout(change)),
                Action::MigState => {
                    self.metrics
                        .set_mig_config_state(state.mig.state.as_ref().map(|s| s.as_str()));
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

    /// A GPU use sample from the hardware actor: attributed to the containers holding the
    /// devices, into `/metrics` and `/status`.
    pub(super) fn sampled(&mut self, sample: Result<Samples, SampleError>, state: &State) {
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
                let e = e.to_string();
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
        let mut all = built.labels;
        if let Some(s) = &state.mig.state {
            all.insert(
                labels::MIG_CONFIG_STATE_LABEL.to_string(),
                s.as_str().to_string(),
            );
        }
        let content = labels::render(&all);
        if self.labels_content.as_deref() == Some(content.as_str()) {
            return;
        }
        for w in &built.warnings {
            tracing::warn!(warning = %w, "node labels");
        }
        tracing::debug!(labels = all.len(), "node labels changed");
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
            n.rediscovery_error.clone_from(&state.rediscovery_error);
            n.mig_config_error = mig_config_note(state);
            n.mig_config_state = state.mig.state.as_ref().map(|m| m.as_str());
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

/// `/readyz`'s note on the MIG layouts: why the layout failed, or why the file is refused
/// (the last good one kept).
fn mig_config_note(state: &State) -> Option<String> {
    let failed = match &state.mig.state {
        Some(super::fold::mig::MigConfigState::Failed(why))
            if state.mig.file_error.as_ref() != Some(why) =>
        {
            Some(why.clone())
        }
        _ => None,
    };
    let file = state
        .mig
        .file_error
        .as_ref()
        .map(|e| format!("MIG layouts file refused (the last good one is kept): {e}"));
    match (failed, file) {
        (Some(a), Some(b)) if a != b.as_str() => Some(format!("{a}; {b}")),
        (Some(a), _) => Some(a),
        (None, b) => b,
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

impl Shell {
    /// The shell of `parts`, nothing written or logged yet.
    pub(super) fn new(parts: ShellParts) -> Shell {
        Shell {
            plans: parts.plans,
            status: parts.status,
            metrics: parts.metrics,
            hardware: parts.hardware,
            mps: parts.mps,
            owns_compute: parts.owns_compute,
            plugin_mode: parts.plugin_mode,
            labels: parts.labels,
            labels_content: None,
            cdi: parts.cdi,
            in_use: parts.in_use,
            usage: crate::usage::report::Usage::new(),
            sample_error: None,
            checkpoint_error: None,
            dra: parts.dra,
            unsettled: false,
            memory_spec: parts.memory_spec,
            memory_spec_on_disk: None,
        }
    }

    /// Sends the hardware actor `command`.
    pub(super) fn tell_hardware(&self, command: Command) {
        self.hardware.send(command);
    }

    /// Starts a read of what is in use (queued behind one that runs).
    pub(super) fn refresh_in_use(&mut self) {
        self.in_use.start();
    }

    /// Whether there is a pod-resources socket to read what is in use from.
    pub(super) fn has_in_use_source(&self) -> bool {
        self.in_use.has_source()
    }

    /// Whether an in-use read runs.
    pub(super) fn in_use_busy(&self) -> bool {
        self.in_use.is_busy()
    }

    /// An in-use read answered: the answer to fold, or `None` (see [`InUseReader::answered`]).
    pub(super) fn in_use_answered(&mut self, answer: in_use::Answer) -> Option<in_use::Answer> {
        self.in_use.answered(answer)
    }

    /// The in-use read asked at start answered (see [`InUseReader::answered_first`]).
    pub(super) fn in_use_answered_first(&mut self) {
        self.in_use.answered_first();
    }

    /// A CDI read finished: the one queued behind it starts.
    pub(super) fn cdi_answered(&mut self) {
        self.cdi.answered();
    }

    /// Something changed that used heap pages (a registration, a stream opening).
    pub(super) fn mark_unsettled(&mut self) {
        self.unsettled = true;
    }

    /// Whether something changed since the last call (the settle deadline is armed then).
    pub(super) fn take_unsettled(&mut self) -> bool {
        std::mem::take(&mut self.unsettled)
    }

    /// `/status`'s view of GPU use, built from `state` at this moment.
    pub(super) fn view(&self, state: &State) -> crate::usage::view::NodeView {
        self.usage.view(&state.plan, &state.in_use)
    }

    /// Stops the MPS daemons and removes the labels' file (graceful shutdown: slicelet
    /// advertises nothing once it stops, so NFD must drop the labels; a crash leaves it for the
    /// next start) alongside `others`, then the hardware thread restores compute modes in what
    /// is left of the deadline that started at `started`.
    pub(super) async fn stop(mut self, others: impl Future<Output = ()>, started: Instant) {
        let deadline = started + super::SHUTDOWN_DEADLINE;
        let labels = self.labels.take();
        tokio::join!(others, self.mps.shutdown(super::SHUTDOWN_DEADLINE), async {
            if let Some(w) = labels {
                w.shutdown(super::SHUTDOWN_DEADLINE).await;
            }
        });
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(500));
        self.hardware.shutdown(left).await;
    }

    /// Stops the hardware actor and the MPS supervisor when the start did not get far enough
    /// for [`Shell::stop`].
    pub(super) async fn abort(self) {
        self.hardware.shutdown(super::SHUTDOWN_DEADLINE).await;
        self.mps.shutdown(super::SHUTDOWN_DEADLINE).await;
    }
}
