//! Publishing this node's ResourceSlices through the Kubernetes API: a reconcile loop.
//!
//! On every new [`DraInput`] (the plan changed), on every (re)registration with the kubelet
//! (the kubelet deletes a node's slices when it starts and when a driver deregisters, so a
//! registration means "publish again"), and after an API error (retried with exponential
//! backoff, 0.5 s doubling to 30 s, forever), the loop:
//! 1. lists the slices with field selector `spec.nodeName=<node>,spec.driver=<driver>` (the
//!    only slices it ever touches; from the API server's watch cache, `resourceVersion=0`),
//!    unless it knows them: after a reconcile that succeeded it
//!    keeps the API server's answers to its own writes (and the listed copies it left alone),
//!    so a change costs only its writes. It lists again at the start, after any error (a
//!    conflict: somebody else wrote them) and after a registration (the kubelet may have
//!    deleted them);
//! 2. builds the wanted slices ([`super::slices::build_pool`] of the plan's DRA resources and
//!    dynamic MIG GPUs). The
//!    pool generation is bumped whenever the slices differ from what this loop published
//!    last, unless only one slice changes and every slice keeps its devices' names (a taint
//!    coming or going: one write, as Kubernetes' own resourceslice controller does it; the
//!    pool is consistent after that one write), and always starts above every generation
//!    listed (so a restarted daemon's slices win over a predecessor's leftovers);
//! 3. creates the missing slices, replaces the changed ones (with the listed
//!    `resourceVersion`, so a concurrent writer is a conflict, retried), and then deletes the
//!    extra ones (newest generation first in, old one out: the scheduler ignores a pool's
//!    older generation meanwhile).
//!
//! Unhealthy devices are published with a device taint ([`super::slices::taint`]). A taint's
//! `timeAdded` comes from the device's health record; a taint the listed slices already carry
//! for the device (same key, value and effect) keeps its listed `timeAdded`, so a restarted
//! daemon does not move it. An API server without device taints (before Kubernetes 1.37, or
//! with the `DRADeviceTaints` feature off) either drops the field silently or refuses the write
//! with a field error: when a slice written with taints comes back without them, or a write is
//! refused with 422 naming `taints`, the loop logs one WARN, says so in
//! [`PublishStatus::taints_refused`] (`/readyz` shows it, still 200; `slicelet_dra_device_taints`
//! 0) and from then on withdraws Unhealthy devices instead (until the daemon restarts).
//!
//! RBAC needed: `list`, `watch`, `create`, `update`, `delete` on `resourceslices`
//! (`resource.k8s.io`); the manifests limit writes to this node's slices with a
//! ValidatingAdmissionPolicy.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder as _;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::drift;
use super::slices::{self, SliceParams};
use super::DraInput;

/// The first retry delay after an API error.
pub const RETRY_MIN: Duration = Duration::from_millis(500);
/// The longest retry delay after API errors.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// A reconcile that failed; the loop retries it.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Listing this node's slices failed.
    #[error("listing the ResourceSlices of node {node}, driver {driver}")]
    List {
        /// The node.
        node: String,
        /// The driver.
        driver: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// Creating, replacing or deleting one slice failed.
    #[error("{op} ResourceSlice {name}")]
    Write {
        /// `creating`, `replacing` or `deleting`.
        op: &'static str,
        /// The slice's name.
        name: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
    /// The API server does not keep consumable-capacity devices (`allowMultipleAllocations`
    /// dropped, or the write refused naming it): Kubernetes before 1.34, or 1.34–1.35 without
    /// the `DRAConsumableCapacity` feature gate.
    #[error("the API server {how} the consumable-capacity device (allowMultipleAllocations) of ResourceSlice {name}: Kubernetes 1.36 or later (or the DRAConsumableCapacity feature gate) is needed for dra: capacity; use dra: true (one device per replica) on this cluster")]
    CapacityRefused {
        /// The slice's name.
        name: String,
        /// `dropped` or `refused`.
        how: &'static str,
    },
}

/// Whether any device of `slice` is a consumable-capacity device.
fn has_shared_devices(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .any(|d| d.allow_multiple_allocations == Some(true))
}

/// The API server's answer to a write of `sent` shows it does not keep consumable-capacity
/// devices: the stored copy lost `allowMultipleAllocations`, or a 422 names it.
fn capacity_lost(
    sent: &ResourceSlice,
    answer: &Result<ResourceSlice, kube::Error>,
) -> Option<PublishError> {
    if !has_shared_devices(sent) {
        return None;
    }
    let name = sent.metadata.name.clone().unwrap_or_default();
    match answer {
        Ok(stored) if !has_shared_devices(stored) => Some(PublishError::CapacityRefused {
            name,
            how: "dropped",
        }),
        Err(kube::Error::Api(s))
            if s.code == 422 && s.message.contains("allowMultipleAllocations") =>
        {
            Some(PublishError::CapacityRefused {
                name,
                how: "refused",
            })
        }
        _ => None,
    }
}

/// What the publisher has done, for `/status` and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishStatus {
    /// Reconciles that succeeded.
    pub reconciles: u64,
    /// The pool generation last published (0 before the first).
    pub generation: i64,
    /// How many devices the pool has.
    pub devices: usize,
    /// The last error, cleared by the next success.
    pub error: Option<String>,
    /// Why DRA is not ready: it is not serving (its start failed or a server ended; it is
    /// started again after a backoff), or it serves but cannot prepare claims (an unwritable
    /// `--cdi-output-dir`). `None` while it serves and can prepare.
    pub down: Option<String>,
    /// Whether the kubelet plugin's sockets serve now.
    pub serving: bool,
    /// Why Unhealthy devices are withdrawn instead of tainted: the API server dropped or
    /// refused the device taints. `None` while taints are published (or none was written
    /// yet).
    pub taints_refused: Option<String>,
    /// What the checkpoint says is prepared: published device name → the claims holding it
    /// ([`super::checkpoint::holders`]), after every prepare and unprepare; `None` until the
    /// checkpoint was loaded (a DRA that failed before loading it knows nothing, which is not
    /// "nothing prepared").
    pub prepared: Option<std::collections::BTreeMap<String, Vec<crate::in_use::Holder>>>,
    /// The placements the checkpoint's dynamic MIG records name, as (GPU UUID, first memory
    /// slice) ([`super::checkpoint::Checkpoint::dynamic_mig_holds`]): written with
    /// [`PublishStatus::prepared`], and before each create is asked for, so the daemon never
    /// plans an instance created for a claim as a static MIG device.
    pub dynamic_mig: std::collections::BTreeSet<(String, u32)>,
    /// Times the watch of this node's slices showed somebody else changed or deleted them and
    /// the publisher listed and published them again ([`super::drift`]).
    pub republished: u64,
    /// Why the watch of this node's slices fails (retried with backoff), cleared by its next
    /// answer: meanwhile a slice somebody else deletes is published again only at the next
    /// plan change or registration.
    pub slice_watch_error: Option<String>,
}

/// The publisher's memory between reconciles.
#[derive(Debug, Default)]
struct State {
    generation: i64,
    /// The slices last published: name and spec, generation zeroed.
    published: Option<Vec<(String, ResourceSliceSpec)>>,
    /// The API server's copies of this node's slices after the last reconcile that succeeded
    /// (its answers to the writes, the listed copies of the others), so that the next
    /// reconcile needs no LIST; `None`: list first (at the start, after an error, after a
    /// registration).
    stored: Option<Vec<ResourceSlice>>,
    /// Why taints are not used (the API server dropped or refused them); `None`: they are.
    taints_refused: Option<String>,
    /// The API server kept the taints of a write (a dry run first, until one did).
    taints_confirmed: bool,
}

/// How one reconcile ended.
enum Outcome {
    /// Published: the generation and the number of devices.
    Done(i64, usize),
    /// The API server dropped or refused the device taints (why); nothing else failed.
    TaintsRefused(String),
}

/// Whether any device of `slice` has a taint.
fn has_taints(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
}

/// Why a write with taints shows the API server does not keep them: the stored copy lost
/// them, or it answered 422 naming `taints`.
fn taints_lost(
    sent: &ResourceSlice,
    answer: &Result<ResourceSlice, kube::Error>,
) -> Option<String> {
    if !has_taints(sent) {
        return None;
    }
    match answer {
        Ok(stored) if !has_taints(stored) => Some(format!(
            "the API server dropped the device taints of ResourceSlice {} (no DRADeviceTaints: Kubernetes before 1.37, or the feature gate off)",
            sent.metadata.name.as_deref().unwrap_or_default()
        )),
        Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("taints") => Some(format!(
            "the API server refused the device taints of ResourceSlice {}: {}",
            sent.metadata.name.as_deref().unwrap_or_default(),
            s.message
        )),
        _ => None,
    }
}

/// Until the API server has kept the taints of one write: the write of `slice` (a replace, or
/// a create) as a dry run first (`dryRun=All`: the API server drops or refuses fields exactly
/// as for the real write, and stores nothing), so an Unhealthy device is never stored
/// untainted. `Some` when it dropped or refused them; a dry run that fails otherwise is left
/// to the real write.
async fn try_taints(
    api: &Api<ResourceSlice>,
    slice: &ResourceSlice,
    replace: bool,
    state: &mut State,
) -> Option<Outcome> {
    if state.taints_confirmed || !has_taints(slice) {
        return None;
    }
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let name = slice.metadata.name.clone().unwrap_or_default();
    let answer = if replace {
        api.replace(&name, &dry, slice).await
    } else {
        api.create(&dry, slice).await
    };
    if let Some(why) = taints_lost(slice, &answer) {
        return Some(Outcome::TaintsRefused(why));
    }
    state.taints_confirmed = answer.is_ok();
    None
}

/// The `timeAdded` of taints the listed slices already carry for the same device, key, value
/// and effect, put into `wanted` (so a restart or a rebuilt health record does not move it).
fn keep_listed_times(wanted: &mut slices::Slices, listed: &[ResourceSlice]) {
    let mut times = std::collections::BTreeMap::new();
    for d in listed.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        for t in d.taints.iter().flatten() {
            if let Some(at) = &t.time_added {
                times.insert(
                    (
                        d.name.clone(),
                        t.key.clone(),
                        t.value.clone(),
                        t.effect.clone(),
                    ),
                    at.clone(),
                );
            }
        }
    }
    for d in wanted
        .slices
        .iter_mut()
        .flat_map(|s| s.spec.devices.iter_mut().flatten())
    {
        for t in d.taints.iter_mut().flatten() {
            let key = (
                d.name.clone(),
                t.key.clone(),
                t.value.clone(),
                t.effect.clone(),
            );
            if let Some(at) = times.get(&key) {
                t.time_added = Some(at.clone());
            }
        }
    }
}

/// Each slice's name and spec, generation zeroed: what a change is compared on.
fn specs_of(s: &slices::Slices) -> Vec<(String, ResourceSliceSpec)> {
    s.slices
        .iter()
        .map(|x| {
            let mut spec = x.spec.clone();
            spec.pool.generation = 0;
            (x.metadata.name.clone().unwrap_or_default(), spec)
        })
        .collect()
}

/// Whether going from `prev` to `next` may keep the pool's generation: the same slices, each
/// with the same devices by name, and at most one of them changed (so the pool is consistent
/// after that one write; devices added, removed or moved between slices need a new
/// generation, which rewrites every slice).
fn keeps_generation(
    prev: &[(String, ResourceSliceSpec)],
    next: &[(String, ResourceSliceSpec)],
) -> bool {
    let names = |s: &ResourceSliceSpec| -> Vec<String> {
        s.devices.iter().flatten().map(|d| d.name.clone()).collect()
    };
    prev.len() == next.len()
        && prev
            .iter()
            .zip(next)
            .all(|((pn, ps), (nn, ns))| pn == nn && names(ps) == names(ns))
        && prev.iter().zip(next).filter(|(a, b)| a != b).count() <= 1
}

/// Reconciles: once with taints (unless the API server refused them before), and once more
/// withdrawing Unhealthy devices when this time it did (logged once, at WARN). A write that
/// finds the kept copies stale (409: somebody else wrote the slice; 404: deleted it) is
/// reconciled again at once from a LIST, once, before it counts as an error.
async fn reconcile(
    api: &Api<ResourceSlice>,
    params: &SliceParams,
    input: &DraInput,
    state: &mut State,
) -> Result<(i64, usize), PublishError> {
    let mut stale_once = false;
    loop {
        let kept = state.stored.is_some();
        let outcome = match reconcile_once(api, params, input, state).await {
            Err(PublishError::Write {
                source: kube::Error::Api(s),
                ..
            }) if kept && !stale_once && (s.code == 404 || s.code == 409) => {
                stale_once = true;
                tracing::debug!(
                    code = s.code,
                    "DRA: the kept copies of the ResourceSlices were stale; listing them again"
                );
                continue;
            }
            other => other?,
        };
        match outcome {
            Outcome::Done(generation, devices) => return Ok((generation, devices)),
            Outcome::TaintsRefused(why) => {
                tracing::warn!(reason = %why, "DRA: the API server does not keep device taints; Unhealthy devices are withdrawn from the ResourceSlices instead");
                state.taints_refused = Some(why);
            }
        }
    }
}

/// Lists, creates, replaces, deletes; stops at the first write that shows the API server
/// does not keep device taints.
async fn reconcile_once(
    api: &Api<ResourceSlice>,
    params: &SliceParams,
    input: &DraInput,
    state: &mut State,
) -> Result<Outcome, PublishError> {
    let listed = stored_or_listed(api, params, state).await?;
    let Wanted {
        slices: wanted,
        specs,
        generation,
    } = wanted_slices(params, input, state, &listed);
    for skipped in &wanted.skipped {
        tracing::warn!(device = %skipped, "DRA: a device of this name is published already; skipped");
    }
    let mut existing: std::collections::BTreeMap<String, ResourceSlice> = listed
        .into_iter()
        .filter_map(|s| Some((s.metadata.name.clone()?, s)))
        .collect();
    let count = wanted
        .slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let mut stored = Vec::with_capacity(wanted.slices.len());
    for slice in wanted.slices {
        let name = slice.metadata.name.clone().unwrap_or_default();
        match write_slice(api, slice, existing.remove(&name), state).await? {
            SliceWrite::Stored(s) => stored.push(*s),
            SliceWrite::TaintsRefused(refused) => return Ok(refused),
        }
    }
    delete_unwanted(api, existing.into_keys()).await?;
    state.generation = generation;
    state.published = Some(specs);
    state.stored = Some(stored);
    Ok(Outcome::Done(generation, count))
}

/// What the API server has: its answers to the last reconcile's writes, else a LIST. Taken:
/// a reconcile that fails or stops part way lists again.
///
/// # Errors
/// [`PublishError::List`].
async fn stored_or_listed(
    api: &Api<ResourceSlice>,
    params: &SliceParams,
    state: &mut State,
) -> Result<Vec<ResourceSlice>, PublishError> {
    if let Some(stored) = state.stored.take() {
        return Ok(stored);
    }
    let selector = format!(
        "spec.nodeName={},spec.driver={}",
        params.node, params.driver
    );
    // From the API server's watch cache (`resourceVersion=0`, any version): a quorum read
    // (the default) makes an API server without consistent reads from its cache (etcd
    // before 3.5.13) read every slice of the cluster from etcd, which a fleet starting
    // together multiplies by its nodes. A stale answer shows as a conflict at the write,
    // and the LIST after it is fresher.
    Ok(api
        .list(&ListParams::default().fields(&selector).match_any())
        .await
        .map_err(|source| PublishError::List {
            node: params.node.clone(),
            driver: params.driver.clone(),
            source,
        })?
        .items)
}

/// The slices one reconcile publishes.
struct Wanted {
    /// The slices, at `generation`.
    slices: slices::Slices,
    /// Their names and specs, generation zeroed ([`specs_of`]).
    specs: Vec<(String, ResourceSliceSpec)>,
    /// Their pool generation.
    generation: i64,
}

/// The slices to publish, with the listed taints' times kept, and their pool generation: the
/// last one, or one past it and past every `listed` one when the specs changed in a way that
/// needs a new generation or the API server has a newer one.
fn wanted_slices(
    params: &SliceParams,
    input: &DraInput,
    state: &State,
    listed: &[ResourceSlice],
) -> Wanted {
    let listed_max = listed
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    let resources = slices::dra_resources(&input.plan);
    let mut p = params.clone();
    p.generation = state.generation.max(1);
    p.driver_version.clone_from(&input.inventory.driver_version);
    p.unhealthy = if state.taints_refused.is_some() {
        slices::Unhealthy::Withdraw
    } else {
        slices::Unhealthy::Taint {
            xid_effect: input.xid_taint_effect,
        }
    };
    let mut wanted = slices::build_pool(
        resources,
        &input.plan.dynamic_mig,
        &input.inventory,
        &p,
        &input.health,
    );
    keep_listed_times(&mut wanted, listed);
    let specs = specs_of(&wanted);
    let changed = state.published.as_ref() != Some(&specs);
    let keep = state
        .published
        .as_ref()
        .is_some_and(|prev| keeps_generation(prev, &specs));
    if (changed && !keep) || listed_max > state.generation {
        let generation = state.generation.max(listed_max) + 1;
        for s in &mut wanted.slices {
            s.spec.pool.generation = generation;
        }
        p.generation = generation;
    }
    Wanted {
        slices: wanted,
        specs,
        generation: p.generation,
    }
}

/// What writing one slice came to.
enum SliceWrite {
    /// The API server's copy: the old one when it already says what we want, else its answer.
    Stored(Box<ResourceSlice>),
    /// The API server dropped or refused the device taints: the reconcile stops here.
    TaintsRefused(Outcome),
}

/// Writes `slice`: nothing when the API server's `old` copy says the same, a replace of
/// `old`, or a create when there is none.
///
/// # Errors
/// [`PublishError::Write`] for the failed replace or create; what [`capacity_lost`] finds.
async fn write_slice(
    api: &Api<ResourceSlice>,
    mut slice: ResourceSlice,
    old: Option<ResourceSlice>,
    state: &mut State,
) -> Result<SliceWrite, PublishError> {
    let name = slice.metadata.name.clone().unwrap_or_default();
    let replace = old.is_some();
    if let Some(old) = old {
        if same_spec(&old.spec, &slice.spec) {
            return Ok(SliceWrite::Stored(Box::new(old)));
        }
        slice.metadata.resource_version = old.metadata.resource_version;
    }
    if let Some(refused) = try_taints(api, &slice, replace, state).await {
        return Ok(SliceWrite::TaintsRefused(refused));
    }
    let answer = if replace {
        api.replace(&name, &PostParams::default(), &slice).await
    } else {
        api.create(&PostParams::default(), &slice).await
    };
    if let Some(why) = taints_lost(&slice, &answer) {
        return Ok(SliceWrite::TaintsRefused(Outcome::TaintsRefused(why)));
    }
    if let Some(e) = capacity_lost(&slice, &answer) {
        return Err(e);
    }
    answer
        .map(|s| SliceWrite::Stored(Box::new(s)))
        .map_err(|source| PublishError::Write {
            op: if replace { "replacing" } else { "creating" },
            name,
            source,
        })
}

/// Deletes the slices `names` (this node's, no longer wanted); one gone already (the kubelet
/// wipes slices too) is as good as deleted.
///
/// # Errors
/// [`PublishError::Write`] for the first delete that fails otherwise.
async fn delete_unwanted(
    api: &Api<ResourceSlice>,
    names: impl IntoIterator<Item = String>,
) -> Result<(), PublishError> {
    for name in names {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(PublishError::Write {
                    op: "deleting",
                    name,
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Whether the API's copy says what we want (fields we do not set may be defaulted by the
/// API server: compare only ours).
fn same_spec(have: &ResourceSliceSpec, want: &ResourceSliceSpec) -> bool {
    have.driver == want.driver
        && have.node_name == want.node_name
        && have.pool == want.pool
        && have.devices.as_deref().unwrap_or_default()
            == want.devices.as_deref().unwrap_or_default()
}

/// Runs the reconcile loop until `shutdown`: on every change of `inputs` (`None` until the
/// first plan), of `registrations` (bumped on each registration with the kubelet), when the
/// watch of this node's slices shows somebody else changed them ([`super::drift`]), and
/// retried with backoff after errors. Progress goes to `status`.
pub async fn run(
    client: Client,
    params: SliceParams,
    mut inputs: watch::Receiver<Option<Arc<DraInput>>>,
    mut registrations: watch::Receiver<u64>,
    status: watch::Sender<PublishStatus>,
    shutdown: CancellationToken,
) {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut drift = Drift::new(drift::watch(
        client,
        &params.node,
        &params.driver,
        shutdown.clone(),
    ));
    let mut state = State::default();
    let new_backoff = || {
        backon::ExponentialBuilder::default()
            .with_min_delay(RETRY_MIN)
            .with_max_delay(RETRY_MAX)
            .without_max_times()
            .build()
    };
    let mut backoff = new_backoff();
    let mut registered = *registrations.borrow_and_update();
    loop {
        let input = inputs.borrow_and_update().clone();
        // A registration: the kubelet may have deleted the slices (it does when it starts), so
        // what the API server has is listed again.
        let now_registered = *registrations.borrow_and_update();
        if now_registered != registered {
            registered = now_registered;
            state.stored = None;
        }
        let mut retry = None;
        if let Some(input) = input {
            match reconcile(&api, &params, &input, &mut state).await {
                Ok((generation, devices)) => {
                    backoff = new_backoff();
                    status.send_modify(|s| {
                        s.reconciles += 1;
                        s.generation = generation;
                        s.devices = devices;
                        s.error = None;
                        s.taints_refused.clone_from(&state.taints_refused);
                    });
                    tracing::debug!(generation, devices, "DRA: ResourceSlices published");
                }
                Err(e) => {
                    let error = crate::errors::chain(&e);
                    tracing::warn!(error = %error, "DRA: publishing ResourceSlices failed; retrying with backoff");
                    status.send_modify(|s| s.error = Some(error));
                    retry = backoff.next();
                }
            }
        }
        let wake = Wake {
            retry_at: retry.map(|d| tokio::time::Instant::now() + d),
            inputs: &mut inputs,
            registrations: &mut registrations,
            drift: &mut drift,
            status: &status,
            shutdown: &shutdown,
        };
        match wake.next(&state).await {
            Reason::Stop => return,
            Reason::Drifted => {
                tracing::info!(node = %params.node, driver = %params.driver, "DRA: somebody else changed or deleted this node's ResourceSlices; listing and publishing them again");
                state.stored = None;
                status.send_modify(|s| s.republished += 1);
            }
            Reason::Reconcile => {}
        }
    }
}

/// Why the loop reconciles next (or stops).
enum Reason {
    /// Shutdown, or an input channel closed.
    Stop,
    /// The plan or the registrations changed, or a retry is due.
    Reconcile,
    /// Somebody else changed the slices: list them again first.
    Drifted,
}

/// The publisher's side of the watch of its slices ([`super::drift`]).
struct Drift {
    /// The watch task's events (`None` once it ended).
    events: Option<tokio::sync::mpsc::Receiver<drift::Seen>>,
    view: drift::View,
    /// How long a disagreement may last: [`drift::AGREE_WITHIN`], doubled (to
    /// [`drift::AGREE_MAX`]) each time a disagreement outlasted it, reset by an agreement; so a
    /// watch that never agrees costs one LIST per 5 minutes at most, not one per 5 seconds.
    window: Duration,
    /// When the running disagreement counts as drift (kept across reconciles, so changes
    /// coming faster than the window do not put it off).
    lag_until: Option<tokio::time::Instant>,
}

impl Drift {
    fn new(events: tokio::sync::mpsc::Receiver<drift::Seen>) -> Drift {
        Drift {
            events: Some(events),
            view: drift::View::default(),
            window: drift::AGREE_WITHIN,
            lag_until: None,
        }
    }

    /// Follows verdict `v`: drift at once (true), or the lag deadline kept, started or
    /// cleared.
    fn follow(&mut self, v: drift::Verdict) -> bool {
        match v {
            drift::Verdict::Drifted => {
                self.lag_until = None;
                true
            }
            drift::Verdict::Lags => {
                let window = self.window;
                self.lag_until
                    .get_or_insert_with(|| tokio::time::Instant::now() + window);
                false
            }
            drift::Verdict::Agrees => {
                self.window = drift::AGREE_WITHIN;
                self.lag_until = None;
                false
            }
        }
    }

    /// The lag deadline passed: drift when the view still disagrees with `copies` (the window
    /// doubles), else nothing.
    fn expired(&mut self, copies: Option<&drift::Versions>) -> bool {
        self.lag_until = None;
        if self.view.judge(copies) == drift::Verdict::Agrees {
            self.window = drift::AGREE_WITHIN;
            return false;
        }
        self.window = (self.window * 2).min(drift::AGREE_MAX);
        true
    }
}

/// What the loop waits on between reconciles.
struct Wake<'a> {
    retry_at: Option<tokio::time::Instant>,
    inputs: &'a mut watch::Receiver<Option<Arc<DraInput>>>,
    registrations: &'a mut watch::Receiver<u64>,
    drift: &'a mut Drift,
    /// Where a failing watch is shown ([`PublishStatus::slice_watch_error`]).
    status: &'a watch::Sender<PublishStatus>,
    shutdown: &'a CancellationToken,
}

impl Wake<'_> {
    /// Waits for the next reason to reconcile, folding the slice watch's events into the view
    /// meanwhile: a view that shows somebody else changed the copies in `state`, or that
    /// disagrees with them longer than the window, is drift.
    async fn next(self, state: &State) -> Reason {
        let Wake {
            retry_at,
            inputs,
            registrations,
            drift,
            status,
            shutdown,
        } = self;
        let copies = state.stored.as_deref().map(drift::versions_of);
        if drift.follow(drift.view.judge(copies.as_ref())) {
            return Reason::Drifted;
        }
        loop {
            let retry = sleep_until(retry_at);
            let lagging = sleep_until(drift.lag_until);
            let event = async {
                match drift.events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return Reason::Stop,
                r = inputs.changed() => return if r.is_err() { Reason::Stop } else { Reason::Reconcile },
                r = registrations.changed() => return if r.is_err() { Reason::Stop } else { Reason::Reconcile },
                () = retry => return Reason::Reconcile,
                seen = event => {
                    let Some(seen) = seen else {
                        drift.events = None;
                        continue;
                    };
                    show_watch(status, &seen);
                    let verdict = drift.view.observe(seen, copies.as_ref());
                    if drift.follow(verdict) {
                        return Reason::Drifted;
                    }
                }
                () = lagging => {
                    if drift.expired(copies.as_ref()) {
                        return Reason::Drifted;
                    }
                }
            }
        }
    }
}

/// Shows a failing slice watch in `status`, and clears it at the watch's next answer.
fn show_watch(status: &watch::Sender<PublishStatus>, seen: &drift::Seen) {
    let error = match seen {
        drift::Seen::Broken(e) => Some(e.clone()),
        drift::Seen::Listing | drift::Seen::Listed(..) => return,
        _ => None,
    };
    status.send_if_modified(|s| {
        let changed = s.slice_watch_error != error;
        s.slice_watch_error.clone_from(&error);
        changed
    });
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod capacity_tests {
    use super::*;
    use k8s_openapi::api::resource::v1::Device;

    fn slice(shared: bool) -> ResourceSlice {
        let mut s = ResourceSlice::default();
        s.metadata.name = Some("node-1-gpu-slicelet-io-0".into());
        s.spec.devices = Some(vec![Device {
            name: "gpu-a".into(),
            allow_multiple_allocations: shared.then_some(true),
            ..Device::default()
        }]);
        s
    }

    /// An API server without consumable capacity is a clear error naming the fallback; one
    /// that keeps it, or a slice without shared devices, is not.
    #[test]
    fn an_api_server_without_consumable_capacity_is_named() {
        let dropped = capacity_lost(&slice(true), &Ok(slice(false))).unwrap();
        let msg = dropped.to_string();
        assert!(
            msg.contains("dropped") && msg.contains("use dra: true"),
            "{msg}"
        );
        let status = kube::core::Status {
            code: 422,
            message:
                "spec.devices[0].allowMultipleAllocations: Forbidden: disabled by feature gate"
                    .into(),
            ..Default::default()
        };
        let refused = capacity_lost(&slice(true), &Err(kube::Error::Api(Box::new(status))));
        assert!(refused.unwrap().to_string().contains("refused"));
        assert!(capacity_lost(&slice(true), &Ok(slice(true))).is_none());
        assert!(capacity_lost(&slice(false), &Ok(slice(false))).is_none());
    }
}
