//! The supervisor's state and its pure step: `fold(state, input, now) → actions`.
//!
//! No I/O, no async: inputs are what the outside reported (a policy read and parsed off the
//! loop, a discovery, a health event, a probe answer, an MPS daemon's state), outputs are what
//! the shell must do (publish a plan, tell the MPS supervisor and the hardware actor, probe,
//! count). Time is passed in, so tables of (state, input) → (state, actions) test it.
//!
//! Rules:
//! - An invalid policy never loses state: the last good one keeps serving; at start nothing is
//!   advertised until a valid one is read. A policy rejected for this node (a MIG strategy that
//!   does not fit the layout) is tried again when the GPUs change.
//! - A failed re-discovery keeps the last inventory (logged once per distinct error).
//! - Health has one owner, the [`Tracker`]: discovery, Xids, watch failures and MPS readiness
//!   are folded there, and the plan is built from [`Tracker::effective`]; nothing patches a
//!   plan after it is built.
//! - CDI: while a `cdi-*` `deviceListStrategy` is in use, every published plan asks the shell
//!   to read the node's CDI specs ([`Action::CheckCdi`], off the loop); the answer
//!   ([`Input::CdiSpecs`]) is checked against the current plan and folded into the tracker,
//!   so a device whose CDI name does not resolve is Unhealthy (with the reason) in the next
//!   plan. Without a `cdi-*` strategy the condition is cleared.
//! - MPS: the devices of every daemon the plan wants are Unhealthy until that daemon reports
//!   ready; the limits a daemon still enforces while a change is pending are an input of
//!   [`plan::build_with`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::cdi;
use crate::device_health::HealthEvent;
use crate::health_tracker::{Tracker, Transition, XidPolicy, DEFAULT_RECOVERY};
use crate::in_use::InUse;
use crate::inventory::{Inventory, InventoryError};
use crate::mps;
use crate::plan::{self, MpsLimits, MpsWanted, Plan};
use crate::podres::client::PodResourcesError;
use crate::policy::{Policy, PolicyError};

/// How long a probe may go unanswered (its report lost, or the hardware thread stuck) before
/// the recovery is tried again.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the outside reported.
#[derive(Debug)]
pub enum Input {
    /// What the DRA checkpoint says is prepared (the book of record for DRA holders, whatever
    /// the kubelet's version): published device name → the claims holding it. Read from the
    /// file at start, before the first plan, then from the DRA component after each change.
    DraPrepared(BTreeMap<String, Vec<crate::in_use::Holder>>),
    /// The placements the DRA checkpoint's dynamic MIG records hold, as (GPU UUID, first
    /// memory slice) ([`crate::dra::checkpoint::Checkpoint::dynamic_mig_holds`]); read with
    /// [`Input::DraPrepared`].
    DraDynamicMig(BTreeSet<(String, u32)>),
    /// The policy file was read (off the loop) and parsed.
    Policy {
        /// The file.
        path: PathBuf,
        /// SHA-256 of its bytes.
        hash: [u8; 32],
        /// Apply even if the bytes did not change (start, SIGHUP).
        force: bool,
        /// The parsed policy (boxed: it is the largest input by far), or why it is invalid.
        parsed: Result<Box<Policy>, PolicyError>,
    },
    /// The policy file could not be read.
    PolicyUnreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: String,
    },
    /// A discovery finished: the inventory and the source's description, or the error.
    Discovered(Result<(Inventory, String), InventoryError>),
    /// A health event from the hardware.
    Health(HealthEvent),
    /// Probe answers for devices due to recover: (UUID, answers).
    Probed(Vec<(String, bool)>),
    /// An MPS control daemon's state changed.
    Mps(mps::Event),
    /// The earliest recovery deadline ([`State::next_deadline`]) has passed.
    RecoveryDue,
    /// The node's CDI specs were read (after [`Action::CheckCdi`]; an index whose read failed
    /// holds only the error, so every name is unresolved).
    CdiSpecs(cdi::SpecIndex),
    /// What is in use, as the kubelet's pod-resources API answered (after
    /// [`Action::RefreshInUse`], the periodic refresh, or an Allocate), or why it could not be
    /// read.
    InUse(Result<InUse, PodResourcesError>),
    /// The MIG layouts file (`--mig-config-file`) was read: the file and the SHA-256 of its
    /// bytes, or why it is unusable (naming the file and the field; the last good one stays).
    MigLayouts(Result<(Arc<crate::policy::MigPartedFile>, [u8; 32]), mig::LayoutsFileError>),
    /// The MIG layout asked for (`nvidia.com/mig.config`, or `--mig-config`); `None`: none.
    MigLayoutName(Option<String>),
    /// The hardware actor changed a GPU's MIG instances for a layout (after
    /// [`Action::MigApply`]; the discovery that followed was reported first), or the driver's
    /// reason it failed.
    MigApplied(Result<(), String>),
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish this plan (it differs from the last one published) and reconcile servers.
    Publish(Arc<Plan>),
    /// The MPS control daemons to run now.
    WantMps(MpsWanted),
    /// Compute mode EXCLUSIVE_PROCESS on exactly these GPUs.
    ComputeModes(BTreeSet<String>),
    /// Probe these devices and report [`Input::Probed`].
    Probe(Vec<String>),
    /// Read the node's CDI spec directories (off the loop) and report [`Input::CdiSpecs`].
    CheckCdi,
    /// Ask pod-resources what is in use now and report [`Input::InUse`]: a plan that would
    /// withdraw or re-purpose devices waits for the answer.
    RefreshInUse,
    /// What is in use was read again (metrics: allocations, free devices).
    InUseChanged,
    /// Count an Xid (metrics).
    Xid {
        /// The device.
        uuid: String,
        /// The Xid.
        xid: u64,
    },
    /// Count a health transition (metrics).
    Transition(Transition),
    /// A policy was applied with this generation (metrics).
    PolicyApplied(u64),
    /// A policy was rejected (metrics).
    PolicyRejected,
    /// Why a device is Unhealthy changed while the plan did not (a later Xid of another
    /// number, another condition taking over): rebuild what shows the cause (DRA's device
    /// taints and health stream) from the last plan.
    Causes,
    /// Destroy and create this GPU's MIG instances (a layout; nothing holds the GPU any more
    /// and its devices are withdrawn), then discover, then report [`Input::MigApplied`].
    MigApply(crate::plan::mig_layout::GpuChange),
    /// The layout's state changed ([`State::mig`]'s `state`): the node label, `/readyz`,
    /// `/metrics`.
    MigState,
}

/// The environment the state is built with: NVIDIA's health variables, as read at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthEnv {
    /// `DP_DISABLE_HEALTHCHECKS`.
    pub disable: Option<String>,
    /// `DP_ENABLE_HEALTHCHECKS`.
    pub enable: Option<String>,
}

/// Everything the supervisor knows.
#[derive(Debug)]
pub struct State {
    env: HealthEnv,
    /// The applied policy, if any.
    pub policy: Option<Policy>,
    /// Generation of the applied policy (0: none).
    pub generation: u64,
    policy_hash: Option<[u8; 32]>,
    /// Why the last policy read was rejected (cleared when one is applied).
    pub policy_error: Option<String>,
    /// A valid policy that did not fit this node's GPUs, tried again when they change.
    rejected_for_node: Option<Policy>,
    /// The last good discovery (raw: health not folded in).
    pub inventory: Option<Inventory>,
    /// Why discovery failed while there is no inventory (`failOnInitError: false`).
    pub discovery_error: Option<String>,
    /// Why the last re-discovery failed while an earlier inventory keeps serving (cleared by
    /// the next good one); a note under `/readyz`, not a readiness failure.
    pub rediscovery_error: Option<String>,
    /// The one owner of device health.
    pub tracker: Tracker,
    xid_policy: XidPolicy,
    /// Per MPS daemon (GPU or MIG UUID): the limits it enforces, when known.
    pub mps_applied: BTreeMap<String, MpsLimits>,
    /// Daemons with a limit change waiting for their clients to leave.
    pub mps_pending: BTreeSet<String>,
    /// The last plan published.
    pub plan: Arc<Plan>,
    mps_wanted: MpsWanted,
    exclusive: BTreeSet<String>,
    /// Since when a probe is in flight (its answer may be lost: after [`PROBE_TIMEOUT`] the
    /// recovery is tried again).
    probing: Option<Instant>,
    /// Xid events seen since start (critical or not).
    pub xid_events: u64,
    /// The node's CDI kind (`--cdi-kind`) every applied policy's CDI names are qualified with.
    cdi_kind: String,
    /// The spec problems of the last CDI check (logged when they change).
    cdi_errors: Vec<String>,
    /// What running containers hold (pod-resources), as last read.
    pub in_use: InUse,
    /// DRA devices prepared for claims (the DRA checkpoint), by published device name.
    pub dra_prepared: BTreeMap<String, Vec<crate::in_use::Holder>>,
    /// The placements DRA's dynamic MIG records hold ([`Input::DraDynamicMig`]): the MIG
    /// devices there are left out of the inventory plans are built on ([`State::planned`]).
    pub dra_dynamic_mig: BTreeSet<(String, u32)>,
    /// Whether anybody is asked what is in use (`--pod-resources-socket`); without it no plan
    /// waits for an answer.
    in_use_source: bool,
    /// Why the last pod-resources read failed (logged once per distinct error).
    pub in_use_error: Option<String>,
    /// A plan that withdraws or re-purposes devices waits for a fresh [`Input::InUse`].
    in_use_wanted: bool,
    /// The next plan may withdraw devices: what is in use was read after the change.
    in_use_fresh: bool,
    /// The tracker's causes and reasons when last published ([`Tracker::conditions`]).
    conditions: BTreeMap<String, (crate::device_health::Cause, String)>,
    /// The MIG layouts (mig-parted file, layout name, the GPU being changed).
    pub mig: mig::MigLayouts,
}

impl State {
    /// An empty state: no policy, no GPUs, nothing advertised.
    pub fn new(env: HealthEnv) -> Self {
        let xid_policy = XidPolicy::new(env.disable.as_deref(), env.enable.as_deref(), &[], &[]);
        State {
            env,
            policy: None,
            generation: 0,
            policy_hash: None,
            policy_error: None,
            rejected_for_node: None,
            inventory: None,
            discovery_error: None,
            rediscovery_error: None,
            tracker: Tracker::new(Some(DEFAULT_RECOVERY)),
            xid_policy,
            mps_applied: BTreeMap::new(),
            mps_pending: BTreeSet::new(),
            plan: Arc::new(Plan::default()),
            mps_wanted: MpsWanted::default(),
            exclusive: BTreeSet::new(),
            probing: None,
            xid_events: 0,
            cdi_kind: crate::policy::cdi::DEFAULT_KIND.to_string(),
            cdi_errors: Vec::new(),
            in_use: InUse::default(),
            dra_prepared: BTreeMap::new(),
            dra_dynamic_mig: BTreeSet::new(),
            in_use_source: false,
            in_use_error: None,
            in_use_wanted: false,
            in_use_fresh: false,
            conditions: BTreeMap::new(),
            mig: mig::MigLayouts::default(),
        }
    }

    /// The same state asking pod-resources what is in use before a plan withdraws or
    /// re-purposes devices (`--pod-resources-socket` set).
    pub fn with_in_use_source(mut self) -> Self {
        self.in_use_source = true;
        self
    }

    /// The same state qualifying CDI names with `kind` (the node's `--cdi-kind`, checked by
    /// [`crate::policy::cdi::parse_kind`]) instead of [`crate::policy::cdi::DEFAULT_KIND`].
    pub fn with_cdi_kind(mut self, kind: &str) -> Self {
        kind.clone_into(&mut self.cdi_kind);
        self
    }

    /// Whether the applied policy hands devices out by CDI name (so the specs are checked).
    pub fn uses_cdi(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.delivery.strategies.uses_cdi())
    }

    /// When the shell should report [`Input::RecoveryDue`] (none while a probe is in flight).
    pub fn next_deadline(&self) -> Option<Instant> {
        if let Some(since) = self.probing {
            return Some(since + PROBE_TIMEOUT);
        }
        self.tracker.next_deadline()
    }

    /// Folds one input at `now`; returns what the shell must do.
    pub fn fold(&mut self, input: Input, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match input {
            Input::Policy {
                path,
                hash,
                force,
                parsed,
            } => self.policy_read(&path, hash, force, parsed, &mut out),
            Input::PolicyUnreadable { path, error } => self.policy_unreadable(&path, error),
            Input::Discovered(result) => self.discovered(result, &mut out),
            Input::Health(ev) => self.health_event(&ev, now, &mut out),
            Input::Probed(answers) => self.probed(answers, now, &mut out),
            Input::RecoveryDue => self.recovery_due(now, &mut out),
            Input::CdiSpecs(index) => self.cdi_specs(&index, &mut out),
            Input::InUse(result) => self.in_use_read(result, &mut out),
            Input::DraPrepared(prepared) => {
                if prepared != self.dra_prepared {
                    self.dra_prepared = prepared;
                    self.replan(&mut out);
                }
            }
            Input::DraDynamicMig(holds) => {
                if holds != self.dra_dynamic_mig {
                    self.dra_dynamic_mig = holds;
                    self.replan(&mut out);
                }
            }
            Input::Mps(ev) => self.mps_event(ev, now, &mut out),
            Input::MigLayouts(read) => self.mig_file(read),
            Input::MigLayoutName(name) => self.mig.name = name,
            Input::MigApplied(result) => {
                let skip = self.mig_skip();
                let next = self.mig.applied(result, self.inventory.as_ref(), &skip);
                self.mig_carry_out(next, &mut out);
            }
        }
        self.mig_step(&mut out);
        // A plan is published with the causes of now; without one, say when they changed.
        let conditions = self.tracker.conditions();
        if conditions != self.conditions {
            self.conditions = conditions;
            if !out.iter().any(|a| matches!(a, Action::Publish(_))) {
                out.push(Action::Causes);
            }
        }
        out
    }

    /// The policy could not be read: said once per distinct error; the last good one stays.
    fn policy_unreadable(&mut self, path: &std::path::Path, error: String) {
        if self.policy_error.as_deref() != Some(error.as_str()) {
            let keeping = if self.policy.is_some() {
                "keeping the last good policy"
            } else {
                "nothing is advertised until it is readable"
            };
            tracing::error!(policy = %path.display(), error = %error, "cannot read the policy; {keeping}");
        }
        self.policy_hash = None;
        self.rejected_for_node = None;
        self.policy_error = Some(error);
    }

    /// An Xid or another health event: an Xid is counted and reported, then the tracker's
    /// transitions are applied.
    fn health_event(&mut self, ev: &HealthEvent, now: Instant, out: &mut Vec<Action>) {
        if let HealthEvent::Xid { uuid, xid } = ev {
            self.xid_events += 1;
            let critical = self.xid_policy.is_critical(*xid);
            tracing::warn!(gpu = %uuid, xid, critical, "Xid event");
            out.push(Action::Xid {
                uuid: uuid.clone(),
                xid: *xid,
            });
        }
        let t = self.tracker.apply(&self.xid_policy, ev, now);
        self.transitions(t.into_iter().collect(), out);
    }

    /// The answers of a recovery probe.
    fn probed(&mut self, answers: Vec<(String, bool)>, now: Instant, out: &mut Vec<Action>) {
        self.probing = None;
        let ts = answers
            .into_iter()
            .filter_map(|(u, ok)| self.tracker.probed(&u, ok, now))
            .collect();
        self.transitions(ts, out);
    }

    /// A recovery deadline passed: probe what is due (again, when a probe got no answer
    /// within [`PROBE_TIMEOUT`]).
    fn recovery_due(&mut self, now: Instant, out: &mut Vec<Action>) {
        let due = self.tracker.due(now);
        if self
            .probing
            .is_some_and(|since| now.saturating_duration_since(since) >= PROBE_TIMEOUT)
        {
            tracing::warn!(timeout = ?PROBE_TIMEOUT, "a probe got no answer; probing again");
            self.probing = None;
        }
        if !due.is_empty() && self.probing.is_none() {
            self.probing = Some(now);
            out.push(Action::Probe(due));
        }
    }

    /// The CDI specs were read: skipped specs said once, unresolved names marked Unhealthy.
    fn cdi_specs(&mut self, index: &cdi::SpecIndex, out: &mut Vec<Action>) {
        let errors: Vec<String> = index.errors.iter().map(ToString::to_string).collect();
        if errors != self.cdi_errors {
            for e in &errors {
                tracing::warn!(error = %e, "CDI spec skipped");
            }
            self.cdi_errors = errors;
        }
        let found = if self.uses_cdi() {
            cdi::unresolved(&self.plan, index)
        } else {
            BTreeMap::new()
        };
        let ts = self.tracker.set_cdi_unresolved(&found);
        self.transitions(ts, out);
    }

    /// An MPS control daemon's state: the limits it applies, whether a change is pending,
    /// and its readiness (a health input); then a new plan.
    fn mps_event(&mut self, ev: mps::Event, now: Instant, out: &mut Vec<Action>) {
        if ev.removed {
            self.mps_applied.remove(&ev.uuid);
        } else if let Some(l) = ev.applied {
            self.mps_applied.insert(ev.uuid.clone(), l);
        } else {
            self.mps_applied.remove(&ev.uuid);
        }
        if ev.pending.is_some() && !ev.removed {
            self.mps_pending.insert(ev.uuid.clone());
        } else {
            self.mps_pending.remove(&ev.uuid);
        }
        let ready = HealthEvent::MpsReady {
            uuid: ev.uuid,
            ready: ev.ready && !ev.removed,
        };
        let t = self.tracker.apply(&self.xid_policy, &ready, now);
        note(t, out);
        self.replan(out);
    }

    fn in_use_read(&mut self, result: Result<InUse, PodResourcesError>, out: &mut Vec<Action>) {
        let waited = std::mem::take(&mut self.in_use_wanted);
        match result {
            Ok(u) => {
                if self.in_use_error.take().is_some() {
                    tracing::info!("pod-resources answers again");
                }
                if u == self.in_use && !waited {
                    return;
                }
                self.in_use = u;
            }
            Err(e) => {
                let e = crate::errors::chain(&e);
                if self.in_use_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, "cannot read what is in use from the kubelet's pod-resources API; running pods are protected by the last answer only, and GPU use has no pod labels");
                    self.in_use_error = Some(e);
                }
                if !waited {
                    return;
                }
            }
        }
        // The answer came after the change was asked for: the plan may withdraw what nobody
        // holds.
        self.in_use_fresh = true;
        self.replan(out);
        self.in_use_fresh = false;
        out.push(Action::InUseChanged);
    }

    fn transitions(&mut self, ts: Vec<Transition>, out: &mut Vec<Action>) {
        if ts.is_empty() {
            return;
        }
        note(ts, out);
        self.replan(out);
    }

    fn discovered(
        &mut self,
        result: Result<(Inventory, String), InventoryError>,
        out: &mut Vec<Action>,
    ) {
        match result {
            Ok((inv, describe)) => {
                let first = self.inventory.is_none();
                if first {
                    tracing::info!(source = %describe, gpus = inv.gpus.len(), "GPUs discovered");
                    for g in &inv.gpus {
                        tracing::info!(gpu = g.index, uuid = %g.uuid, model = %g.model, memory_mib = g.memory_mib, numa = %g.numa_node.map_or("unknown".to_string(), |n| n.to_string()), mig = g.mig_enabled, "GPU");
                    }
                }
                if self.rediscovery_error.take().is_some() {
                    tracing::info!("GPU re-discovery succeeds again");
                }
                self.discovery_error = None;
                if self.inventory.as_ref() == Some(&inv) {
                    return;
                }
                if !first {
                    tracing::info!(gpus = inv.gpus.len(), "GPU inventory changed; re-planning");
                }
                note(self.tracker.observe_discovery(&inv), out);
                self.inventory = Some(inv);
                // A policy rejected for the old GPUs may fit the new ones.
                let applied = match self.rejected_for_node.take() {
                    Some(p) => self.try_apply(p, "", out),
                    None => false,
                };
                if !applied {
                    self.replan(out);
                }
            }
            Err(e) => {
                let e = crate::errors::chain(&e);
                if self.inventory.is_none() {
                    if self.discovery_error.as_deref() != Some(e.as_str()) {
                        tracing::error!(error = %e, "GPU discovery failed; advertising nothing and retrying");
                    }
                    self.discovery_error = Some(e);
                } else if self.rediscovery_error.as_deref() != Some(e.as_str()) {
                    tracing::error!(error = %e, "GPU re-discovery failed; keeping the last inventory");
                    self.rediscovery_error = Some(e);
                }
            }
        }
    }

    fn policy_read(
        &mut self,
        path: &std::path::Path,
        hash: [u8; 32],
        force: bool,
        parsed: Result<Box<Policy>, PolicyError>,
        out: &mut Vec<Action>,
    ) {
        if !force && self.policy_hash == Some(hash) {
            return;
        }
        self.policy_hash = Some(hash);
        let hash_hex: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
        match parsed {
            Ok(mut p) => {
                self.rejected_for_node = None;
                p.delivery = p.delivery.with_cdi_kind(&self.cdi_kind);
                if self.try_apply(*p, &hash_hex, out) {
                    tracing::info!(generation = self.generation, hash = %hash_hex, policy = %path.display(), "policy applied");
                }
            }
            Err(e) => {
                self.rejected_for_node = None;
                let keeping = if self.policy.is_some() {
                    "keeping the last good policy"
                } else {
                    "nothing is advertised until it is fixed"
                };
                tracing::error!(policy = %path.display(), field = %e.path, error = %e, hash = %hash_hex, "policy rejected; {keeping}");
                self.policy_error = Some(e.to_string());
                out.push(Action::PolicyRejected);
            }
        }
    }

    /// The inventory plans are built on: `inv` with health folded in ([`Tracker::effective`])
    /// and without the MIG devices DRA created (or is creating, or destroys) for claims
    /// ([`without_dynamic_mig`]).
    fn planned(&self, inv: &Inventory) -> Inventory {
        without_dynamic_mig(self.tracker.effective(inv), &self.dynamic_holds(inv))
    }

    /// The placements DRA's claims hold on `inv`: its dynamic MIG records', and those of
    /// every prepared dynamic MIG device by name (a record rebuilt from the API after the
    /// checkpoint was lost holds its device by name only).
    fn dynamic_holds(&self, inv: &Inventory) -> BTreeSet<(String, u32)> {
        let mut holds = self.dra_dynamic_mig.clone();
        holds.extend(self.dra_prepared.keys().filter_map(|name| {
            let d = plan::dra_names::parse_dynamic_mig(name, inv)?;
            Some((d.gpu_uuid, d.placement.start))
        }));
        holds
    }

    /// Plans `policy` on the current GPUs and applies it when it fits; true when applied.
    fn try_apply(&mut self, policy: Policy, hash_hex: &str, out: &mut Vec<Action>) -> bool {
        let xid_policy = XidPolicy::for_policy(
            self.env.disable.as_deref(),
            self.env.enable.as_deref(),
            &policy.health,
        );
        let empty = Inventory::default();
        let inv = self.inventory.as_ref().unwrap_or(&empty);
        match plan::memory::build_serving(&policy, &self.planned(inv), &self.mps_applied) {
            Ok(built) => {
                for key in &policy.ignored_keys {
                    tracing::warn!(key = %key, "policy key is recognised (NVIDIA config v1) but slicelet does not act on it yet; ignored");
                }
                for n in &policy.notices {
                    tracing::info!(notice = %n, "policy notice");
                }
                for l in &policy.lenient {
                    tracing::warn!(warning = %l, "policy accepted as NVIDIA's plugin accepts it");
                }
                for w in &built.warnings {
                    tracing::warn!(warning = %w, "policy does not match this node fully");
                }
                for f in &built.fallbacks {
                    tracing::warn!(warning = %f, "policy read as NVIDIA's plugin reads it");
                }
                self.generation += 1;
                self.tracker
                    .set_recovery(Some(policy.health.recovery.unwrap_or(DEFAULT_RECOVERY)));
                self.xid_policy = xid_policy;
                self.policy = Some(policy);
                self.policy_error = None;
                out.push(Action::PolicyApplied(self.generation));
                self.replan(out);
                true
            }
            Err(e) => {
                let keeping = if self.policy.is_some() {
                    "keeping the last good policy"
                } else {
                    "nothing is advertised until it fits this node"
                };
                tracing::error!(error = %e, hash = %hash_hex, "policy rejected for this node; {keeping}");
                self.policy_error = Some(e.to_string());
                self.rejected_for_node = Some(policy);
                out.push(Action::PolicyRejected);
                false
            }
        }
    }

    /// `wanted` plus the MPS daemons wanted so far whose clients still hold a replica (the
    /// drain rules keep such a replica advertised; its daemon must keep serving it).
    fn keep_held_mps(&self, mut wanted: MpsWanted) -> MpsWanted {
        for (resource, id, _) in self.in_use.iter() {
            let Some(d) = self
                .plan
                .resources
                .get(resource)
                .filter(|r| r.strategy == plan::Strategy::Mps)
                .and_then(|r| r.device(id))
            else {
                continue;
            };
            if wanted.daemons.contains_key(&d.gpu_uuid) {
                continue;
            }
            if let Some(old) = self.mps_wanted.daemons.get(&d.gpu_uuid) {
                if wanted.daemons.is_empty() {
                    wanted.root.clone_from(&self.mps_wanted.root);
                    wanted.exclusive_process = self.mps_wanted.exclusive_process;
                }
                wanted.daemons.insert(d.gpu_uuid.clone(), old.clone());
            }
        }
        wanted
    }

    /// Tells the hardware which GPUs `wanted` puts in exclusive-process mode, and the MPS
    /// supervisor which daemons it wants, when either changed.
    fn want_mps(&mut self, wanted: MpsWanted, out: &mut Vec<Action>) {
        let exclusive = wanted.exclusive_gpus();
        if exclusive != self.exclusive {
            self.exclusive = exclusive.clone();
            out.push(Action::ComputeModes(exclusive));
        }
        if wanted != self.mps_wanted {
            self.mps_wanted = wanted.clone();
            out.push(Action::WantMps(wanted));
        }
    }

    /// What is held: pod-resources' answer, and the claims the DRA checkpoint has prepared
    /// (pod-resources lists claims only from kubelet 1.34 on).
    fn holders(&self) -> std::borrow::Cow<'_, InUse> {
        if self.dra_prepared.is_empty() {
            return std::borrow::Cow::Borrowed(&self.in_use);
        }
        let mut u = self.in_use.clone();
        for (name, holders) in &self.dra_prepared {
            for h in holders {
                u.insert_claimed(name, h.clone());
            }
        }
        std::borrow::Cow::Owned(u)
    }

    /// Builds the plan from the applied policy and the effective inventory; publishes it and
    /// tells the MPS supervisor and the hardware what changed.
    fn replan(&mut self, out: &mut Vec<Action>) {
        if self.policy.is_some() && !self.uses_cdi() && !self.tracker.cdi_unresolved().is_empty() {
            note(self.tracker.set_cdi_unresolved(&BTreeMap::new()), out);
        }
        let Some(policy) = &self.policy else { return };
        let empty = Inventory::default();
        let inv = self.inventory.as_ref().unwrap_or(&empty);
        let holds = self.dynamic_holds(inv);
        let build = |tracker: &Tracker| {
            let planned = without_dynamic_mig(tracker.effective(inv), &holds);
            plan::memory::build_serving(policy, &planned, &self.mps_applied)
        };
        let mut built = match build(&self.tracker) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "plan rejected for the current GPUs; keeping the last plan");
                return;
            }
        };
        // Which daemons the plan wants does not depend on health; the devices of a daemon that
        // is newly wanted are held Unhealthy until it is ready, so build again when that
        // changed anything.
        let wanted = self.keep_held_mps(built.mps_wanted.clone());
        let ts = self
            .tracker
            .set_mps_wanted(&wanted.daemons.keys().cloned().collect());
        if !ts.is_empty() {
            out.extend(ts.into_iter().map(Action::Transition));
            match build(&self.tracker) {
                Ok(b) => built = b,
                Err(e) => {
                    tracing::error!(error = %e, "plan rejected for the current GPUs; keeping the last plan");
                    return;
                }
            }
        }
        let mut plan = built.plan;
        if let Some(gpu) = self.mig.withdrawn() {
            plan::drain::withdraw_gpu(&mut plan, gpu, &self.planned(inv));
        }
        let holders = self.holders();
        plan::drain::apply(&mut plan, &self.plan, &holders, &self.planned(inv));
        drop(holders);
        self.want_mps(wanted, out);
        if self.in_use_source && !self.in_use_fresh && withdraws(&self.plan, &plan) {
            // Ask the kubelet what is held now; this plan is built again with the answer.
            if !self.in_use_wanted {
                self.in_use_wanted = true;
                tracing::debug!("the new plan withdraws or re-purposes devices: asking pod-resources what is in use first");
                out.push(Action::RefreshInUse);
            }
            return;
        }
        plan.reuse_unchanged(&self.plan);
        if plan == *self.plan {
            return;
        }
        log_drain(&self.plan.drain, &plan.drain, &self.in_use);
        log_changes(&self.plan, &plan);
        self.plan = Arc::new(plan);
        out.push(Action::Publish(Arc::clone(&self.plan)));
        if self.uses_cdi() {
            out.push(Action::CheckCdi);
        }
    }
}

impl State {
    /// The GPUs a layout leaves alone: those DRA partitions on demand (`dra.dynamicMig`).
    fn mig_skip(&self) -> BTreeSet<u32> {
        match (&self.policy, &self.inventory) {
            (Some(p), Some(inv)) => plan::mig_layout::dynamic_gpus(p, inv),
            _ => BTreeSet::new(),
        }
    }

    /// The layouts file was read: logged when it is refused (the last good one stays).
    fn mig_file(
        &mut self,
        read: Result<(Arc<crate::policy::MigPartedFile>, [u8; 32]), mig::LayoutsFileError>,
    ) {
        match &read {
            Err(e) if self.mig.file_error.as_deref() != Some(e.to_string().as_str()) => {
                tracing::error!(error = %e, "MIG layouts file refused; keeping the last good one");
            }
            Ok(_) if self.mig.file_error.is_some() => {
                tracing::info!("MIG layouts file read again");
            }
            _ => {}
        }
        self.mig.set_file(read);
    }

    /// Takes the layouts one step on: decides, withdraws a GPU (a new plan), or asks the
    /// hardware to change the withdrawn GPU once nothing holds it. Bounded: a withdrawal
    /// re-plans once, and the step after it either applies or waits.
    fn mig_step(&mut self, out: &mut Vec<Action>) {
        // The GPUs DRA partitions on demand are known once a policy is applied.
        if self.policy.is_none() {
            return;
        }
        for _ in 0..3 {
            let skip = self.mig_skip();
            let busy = self.in_use_wanted;
            let plan = Arc::clone(&self.plan);
            let free = |gpu: u32| {
                !busy
                    && !plan
                        .resources
                        .values()
                        .any(|r| r.devices.iter().any(|d| d.gpu_index == gpu))
            };
            let next = self.mig.next(self.inventory.as_ref(), &skip, free);
            let again = next.replan;
            self.mig_carry_out(next, out);
            if !again {
                return;
            }
        }
    }

    fn mig_carry_out(&mut self, next: mig::Next, out: &mut Vec<Action>) {
        if next.state_changed {
            match &self.mig.state {
                Some(mig::MigConfigState::Failed(why)) => {
                    tracing::error!(reason = %why, "nvidia.com/mig.config.state=failed");
                }
                Some(s) => {
                    tracing::info!(layout = ?self.mig.name, "nvidia.com/mig.config.state={}", s.as_str())
                }
                None => {}
            }
            out.push(Action::MigState);
        }
        if next.replan {
            self.replan(out);
        }
        if let Some(change) = next.apply {
            tracing::info!(gpu = change.index, uuid = %change.uuid, destroy = change.destroy.len(), create = change.create.len(), "MIG layout: changing the GPU's instances (nothing holds it)");
            out.push(Action::MigApply(change));
        }
    }
}

/// `inv` without the MIG devices at `holds` (GPU UUID, first memory slice): the instances
/// DRA created for claims (dynamic MIG). A GPU is never held by two holders, so such an
/// instance is never a static device (device plugin or static DRA), and its placement stays
/// free in [`Plan::dynamic_mig`]'s `occupied`, so the dynamic device it was created for stays
/// published (the scheduler keeps counting its counters while the claim holds it). DRA's
/// prepare still sees the whole inventory ([`crate::dra::DraInput::inventory`]).
pub fn without_dynamic_mig(mut inv: Inventory, holds: &BTreeSet<(String, u32)>) -> Inventory {
    if holds.is_empty() {
        return inv;
    }
    for g in &mut inv.gpus {
        g.mig_devices.retain(|m| {
            m.placement
                .is_none_or(|p| !holds.contains(&(g.uuid.clone(), p.start)))
        });
    }
    inv
}

/// Logs each health transition and counts it (an action for the metrics).
fn note(ts: impl IntoIterator<Item = Transition>, out: &mut Vec<Action>) {
    for t in ts {
        tracing::warn!(gpu = %t.uuid, to = %t.health, reason = %t.reason, "device health changed");
        out.push(Action::Transition(t));
    }
}

/// Whether `new` withdraws a device `old` advertises, or serves one of its devices with another
/// strategy, replica count or path (DRA or the device plugin): a holder of it would be pulled
/// from under or re-purposed.
fn withdraws(old: &Plan, new: &Plan) -> bool {
    old.resources
        .iter()
        .any(|(name, res)| match new.resources.get(name) {
            None => !res.devices.is_empty(),
            Some(n) => {
                (n.strategy, n.replicas, n.dra) != (res.strategy, res.replicas, res.dra)
                    || res.devices.iter().any(|d| n.device(&d.id).is_none())
            }
        })
}

/// One WARN line per drain case that `new` has and `old` had not: a held device kept only for
/// its holders, and the devices of a re-purposed GPU held Unhealthy (with the pods).
fn log_drain(old: &plan::Drain, new: &plan::Drain, in_use: &InUse) {
    for (resource, ids) in &new.retained {
        for id in ids {
            if !old.retained.get(resource).is_some_and(|o| o.contains(id)) {
                let pods: BTreeSet<String> = in_use
                    .holders(resource, id)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                tracing::warn!(resource = %resource, device = %id, held_by = ?pods,
                    "the policy no longer has this device, but a running container holds it: it stays advertised until released");
            }
        }
    }
    for (resource, ids) in &new.draining {
        let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, reason) in ids {
            if old.draining.get(resource).and_then(|o| o.get(id)) != Some(reason) {
                by_reason.entry(reason).or_default().push(id);
            }
        }
        for (reason, ids) in by_reason {
            tracing::warn!(resource = %resource, devices = ?ids, reason = %reason,
                "a re-purposed GPU is still held the old way: its new devices are Unhealthy until the holders are gone");
        }
    }
}

fn log_changes(old: &Plan, new: &Plan) {
    for (name, res) in &new.resources {
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
}

pub mod mig;
#[cfg(test)]
mod tests;
