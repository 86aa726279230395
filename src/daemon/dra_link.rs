//! DRA wiring (`--dra`): the DRA component spawned beside the loop, each published plan handed
//! to it as a [`crate::dra::DraInput`] (with the cause of every Unhealthy device), and its
//! task stopped at shutdown.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::fold::State;
use crate::settings::Settings;

/// DRA's MIG requests, as the supervisor receives them.
pub(super) type MigRequests = tokio::sync::mpsc::UnboundedReceiver<crate::dra::mig::MigRequest>;

/// The sender each plan goes to DRA on (`None` without `--dra`).
pub(super) struct DraLink {
    inputs: Option<watch::Sender<Option<Arc<crate::dra::DraInput>>>>,
}

impl DraLink {
    /// DRA (`--dra`, the device plugin only): the policy's DRA resources published as
    /// ResourceSlices and prepared for the kubelet's DRA manager, from the same plan; the link
    /// each plan goes to, the DRA component's handle and the MIG requests it sends (dynamic
    /// MIG), which the supervisor hands to the hardware actor.
    pub(super) fn spawn(
        settings: &Settings,
        plugin_mode: bool,
        shutdown: &CancellationToken,
    ) -> (DraLink, Option<crate::dra::DraHandle>, Option<MigRequests>) {
        let Some(dra) = settings.dra.clone().filter(|_| plugin_mode) else {
            return (DraLink { inputs: None }, None, None);
        };
        let (inputs, rx) = watch::channel(None::<Arc<crate::dra::DraInput>>);
        let (mig, requests) = crate::dra::mig::MigClient::channel();
        let handle = crate::dra::spawn(dra, rx, shutdown.child_token(), Some(mig));
        (
            DraLink {
                inputs: Some(inputs),
            },
            Some(handle),
            Some(requests),
        )
    }

    /// Hands DRA the input for `plan`: its devices' health folded over the last input's (so a
    /// taint's `timeAdded` stays put while its cause does), each Unhealthy device's cause from
    /// the tracker as it is now.
    pub(super) fn send(&self, state: &State, plan: &Arc<crate::plan::Plan>) {
        let Some(tx) = &self.inputs else { return };
        let prev = tx.borrow().clone();
        let input = dra_input(state, plan, prev.as_deref(), std::time::SystemTime::now());
        tx.send_replace(Some(Arc::new(input)));
    }

    /// The same plan with other causes: DRA's taints and health stream follow (once DRA has
    /// had a first input).
    pub(super) fn causes_changed(&self, state: &State) {
        let started = self.inputs.as_ref().is_some_and(|tx| tx.borrow().is_some());
        if started {
            self.send(state, &Arc::clone(&state.plan));
        }
    }
}

/// DRA's input for `plan` at `now`: its devices' health folded over `prev`'s, each Unhealthy
/// device's cause from the tracker as it is now (static devices by [`dra_cause`], dynamic MIG
/// devices by the conditions on their GPU and on the instance created for their claim).
pub(super) fn dra_input(
    state: &State,
    plan: &Arc<crate::plan::Plan>,
    prev: Option<&crate::dra::DraInput>,
    now: std::time::SystemTime,
) -> crate::dra::DraInput {
    crate::dra::DraInput::new(
        Arc::clone(plan),
        Arc::new(state.inventory.clone().unwrap_or_default()),
        state
            .policy
            .as_ref()
            .map(|p| p.dra_xid_taint_effect)
            .unwrap_or_default(),
        &crate::dra::Causes {
            of: &|res, d| Some(dra_cause(state, res, d)),
            tracked: &|uuid| tracked(state, uuid),
        },
        prev,
        now,
    )
}

/// Waits (at most [`super::SHUTDOWN_DEADLINE`]) for the DRA component to stop, logging how it
/// ended.
pub(super) async fn stop(dra: Option<crate::dra::DraHandle>) {
    let Some(d) = dra else {
        return;
    };
    match tokio::time::timeout(super::SHUTDOWN_DEADLINE, d.task).await {
        Ok(Ok(Err(e))) => {
            tracing::error!(error = %crate::errors::chain(&e), "DRA stopped with an error");
        }
        Err(_) => tracing::warn!("DRA did not stop in time"),
        _ => {}
    }
}

/// The tracker's condition on unit `uuid` (a GPU or MIG device): its cause and reason.
fn tracked(state: &State, uuid: &str) -> Option<(crate::device_health::Cause, String)> {
    let cause = state.tracker.cause(uuid)?;
    Some((
        cause,
        state.tracker.reason(uuid).unwrap_or_default().to_string(),
    ))
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
    let tracked = |uuid: &str| tracked(state, uuid);
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
