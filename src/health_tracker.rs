//! GPU health: which Xids are critical, and when an Unhealthy device may return to Healthy.
//! Pure: no I/O, time passed in, so tests run on virtual time.
//!
//! Xid rules (NVIDIA's k8s-device-plugin, kept compatible):
//! - Xids 13, 31, 43, 45, 68 and 109 are application errors (graphics engine exception, GPU
//!   memory page fault, GPU stopped processing, preemptive cleanup, video processor exception,
//!   context switch timeout) and are ignored by default; every other Xid is critical.
//! - `DP_DISABLE_HEALTHCHECKS`: a comma list of more Xids to ignore, or `all` / `xids` to
//!   ignore every Xid.
//! - `DP_ENABLE_HEALTHCHECKS`: a comma list of Xids that are critical even when ignored by
//!   default or by `DP_DISABLE_HEALTHCHECKS=all`, or `all` to make every Xid critical.
//! - slicelet's policy extension `health.ignoredXids` / `health.criticalXids` is applied last:
//!   policy over environment.
//! - NVIDIA's policy keys `health.ignoredXIDs` / `criticalXIDs` / `disabled` / `eventTypes`
//!   replace the defaults, as in NVIDIA's plugin ([`XidPolicy::nvidia`]).
//!
//! Recovery: a device marked Unhealthy returns to Healthy once no critical event has arrived
//! for the quiet period (default 5 min; 0 = never) and NVML still answers for it.
//!
//! The Xid classification policy ([`XidPolicy`]) lives in `xid`; this file holds the health
//! [`Tracker`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::device_health::{Cause, Health, HealthEvent};
use crate::inventory::Inventory;

mod xid;

pub use xid::{XidEnvError, XidPolicy};

/// Default quiet period before an Unhealthy device may recover.
pub const DEFAULT_RECOVERY: Duration = Duration::from_secs(300);

/// A health change of one physical device (GPU or MIG device), for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The device's UUID.
    pub uuid: String,
    /// The new state.
    pub health: Health,
    /// Why: `xid 79`, `NVML: GPU is lost`, `quiet for 300 s and NVML answers`.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Sick {
    last_event: Instant,
    reason: String,
    /// The Xid that made it sick, if one did ([`Tracker::on_xid`]).
    xid: Option<u64>,
}

/// The one owner of device health. It folds every source — discovery (a GPU lost or a
/// simulated `health: Unhealthy`), Xid events with their recovery, event-watch failures, CDI
/// names that do not resolve and MPS daemon readiness — into one verdict per UUID; [`Tracker::effective`] applies it to an
/// inventory before the plan is built. Devices nothing holds Unhealthy are Healthy.
///
/// Conditions, by kind:
/// - Xid (edge): held until [`Tracker::due`] lists it after the quiet period and a probe
///   answers ([`Tracker::probed`]); a failed probe restarts the quiet period.
/// - discovery, watch failure, unresolved CDI name, MPS not ready (level): held exactly while
///   the source says so.
#[derive(Debug, Clone)]
pub struct Tracker {
    recovery: Option<Duration>,
    sick: BTreeMap<String, Sick>,
    lost: BTreeMap<String, String>,
    unwatched: BTreeMap<String, String>,
    cdi: BTreeMap<String, String>,
    mps_wanted: BTreeSet<String>,
    mps_ready: BTreeSet<String>,
}

impl Tracker {
    /// A tracker whose devices recover after `recovery` without critical events (`None` or
    /// zero: never).
    pub fn new(recovery: Option<Duration>) -> Self {
        Tracker {
            recovery: recovery.filter(|d| !d.is_zero()),
            sick: BTreeMap::new(),
            lost: BTreeMap::new(),
            unwatched: BTreeMap::new(),
            cdi: BTreeMap::new(),
            mps_wanted: BTreeSet::new(),
            mps_ready: BTreeSet::new(),
        }
    }

    /// Changes the quiet period (policy reload).
    pub fn set_recovery(&mut self, recovery: Option<Duration>) {
        self.recovery = recovery.filter(|d| !d.is_zero());
    }

    /// Why the device is Unhealthy (the first condition holding it), or `None` when Healthy.
    pub fn reason(&self, uuid: &str) -> Option<&str> {
        if let Some(r) = self.lost.get(uuid) {
            return Some(r);
        }
        if let Some(r) = self.unwatched.get(uuid) {
            return Some(r);
        }
        if let Some(r) = self.cdi.get(uuid) {
            return Some(r);
        }
        if let Some(s) = self.sick.get(uuid) {
            return Some(&s.reason);
        }
        (self.mps_wanted.contains(uuid) && !self.mps_ready.contains(uuid))
            .then_some("MPS control daemon not ready")
    }

    /// Why the device is Unhealthy as a kind (the condition [`Tracker::reason`] names), or
    /// `None` when Healthy.
    pub fn cause(&self, uuid: &str) -> Option<Cause> {
        if self.lost.contains_key(uuid) {
            return Some(Cause::Lost);
        }
        if self.unwatched.contains_key(uuid) {
            return Some(Cause::Unwatched);
        }
        if self.cdi.contains_key(uuid) {
            return Some(Cause::CdiUnresolved);
        }
        if let Some(s) = self.sick.get(uuid) {
            return Some(s.xid.map_or(Cause::Other, Cause::Xid));
        }
        (self.mps_wanted.contains(uuid) && !self.mps_ready.contains(uuid))
            .then_some(Cause::MpsNotReady)
    }

    /// Every Unhealthy device's cause and reason ([`Tracker::cause`], [`Tracker::reason`]), by
    /// UUID: what DRA's device taints and health stream show, which may change while the
    /// device stays Unhealthy (a later Xid of another number, another condition taking over).
    pub fn conditions(&self) -> BTreeMap<String, (Cause, String)> {
        self.lost
            .keys()
            .chain(self.unwatched.keys())
            .chain(self.cdi.keys())
            .chain(self.sick.keys())
            .chain(self.mps_wanted.iter())
            .filter_map(|u| Some((u.clone(), (self.cause(u)?, self.reason(u)?.to_string()))))
            .collect()
    }

    /// The device's health as far as every source goes.
    pub fn health(&self, uuid: &str) -> Health {
        Health::from_bool(self.reason(uuid).is_none())
    }

    /// Whether the device is Healthy as far as every source goes.
    pub fn is_healthy(&self, uuid: &str) -> bool {
        self.health(uuid).is_healthy()
    }

    /// Runs `change` and returns the transition of `uuid` it caused, if any.
    fn track(&mut self, uuid: &str, change: impl FnOnce(&mut Self)) -> Option<Transition> {
        let before = self.health(uuid);
        change(self);
        let after = self.health(uuid);
        (before != after).then(|| Transition {
            uuid: uuid.to_string(),
            health: after,
            reason: self
                .reason(uuid)
                .unwrap_or("no condition holds it")
                .to_string(),
        })
    }

    /// Marks the device Unhealthy (or restarts its quiet period) for `reason`. Returns the
    /// transition when it was Healthy.
    pub fn fail(&mut self, uuid: &str, reason: String, now: Instant) -> Option<Transition> {
        self.fail_with(uuid, reason, None, now)
    }

    fn fail_with(
        &mut self,
        uuid: &str,
        reason: String,
        xid: Option<u64>,
        now: Instant,
    ) -> Option<Transition> {
        self.track(uuid, |t| {
            t.sick.insert(
                uuid.to_string(),
                Sick {
                    last_event: now,
                    reason,
                    xid,
                },
            );
        })
    }

    /// Records Xid `xid` on the device: critical ones fail it, others are ignored.
    pub fn on_xid(
        &mut self,
        policy: &XidPolicy,
        uuid: &str,
        xid: u64,
        now: Instant,
    ) -> Option<Transition> {
        if !policy.is_critical(xid) {
            return None;
        }
        self.fail_with(uuid, format!("xid {xid}"), Some(xid), now)
    }

    /// Folds one [`HealthEvent`]; returns the transition it caused, if any.
    pub fn apply(
        &mut self,
        policy: &XidPolicy,
        event: &HealthEvent,
        now: Instant,
    ) -> Option<Transition> {
        match event {
            HealthEvent::Xid { uuid, xid } => self.on_xid(policy, uuid, *xid, now),
            HealthEvent::Watched { uuid, failure } => self.track(uuid, |t| match failure {
                Some(reason) => {
                    t.unwatched.insert(uuid.clone(), reason.clone());
                }
                None => {
                    t.unwatched.remove(uuid);
                }
            }),
            HealthEvent::Cdi { uuid, failure } => self.cdi_event(uuid, failure.clone()),
            HealthEvent::MpsReady { uuid, ready } => self.track(uuid, |t| {
                if *ready {
                    t.mps_ready.insert(uuid.clone());
                } else {
                    t.mps_ready.remove(uuid);
                }
            }),
        }
    }

    /// Takes discovery's verdict: the devices `inventory` reports unusable (a GPU lost, a
    /// simulated `health: Unhealthy`) are held Unhealthy until a discovery reports them usable
    /// again; devices no longer present drop every condition, an Xid too (a MIG device configured
    /// away is not probed forever).
    pub fn observe_discovery(&mut self, inventory: &Inventory) -> Vec<Transition> {
        let mut present = BTreeMap::new();
        for g in &inventory.gpus {
            present.insert(g.uuid.clone(), g.health.is_healthy());
            for m in &g.mig_devices {
                present.insert(m.uuid.clone(), m.health.is_healthy());
            }
        }
        let gone: Vec<String> = self
            .lost
            .keys()
            .chain(self.unwatched.keys())
            .chain(self.cdi.keys())
            .chain(self.sick.keys())
            .filter(|u| !present.contains_key(*u))
            .cloned()
            .collect();
        let mut out = Vec::new();
        for uuid in gone {
            out.extend(self.track(&uuid, |t| {
                t.lost.remove(&uuid);
                t.unwatched.remove(&uuid);
                t.cdi.remove(&uuid);
                t.sick.remove(&uuid);
            }));
        }
        for (uuid, healthy) in present {
            out.extend(self.track(&uuid, |t| {
                if healthy {
                    t.lost.remove(&uuid);
                } else {
                    t.lost
                        .insert(uuid.clone(), "discovery reports it unusable".to_string());
                }
            }));
        }
        out
    }

    /// The devices the plan runs an MPS control daemon for: each is Unhealthy until its
    /// daemon reports ready ([`HealthEvent::MpsReady`]); others are not held by MPS.
    pub fn set_mps_wanted(&mut self, wanted: &BTreeSet<String>) -> Vec<Transition> {
        let touched: BTreeSet<String> = self.mps_wanted.union(wanted).cloned().collect();
        let mut out = Vec::new();
        for uuid in touched {
            out.extend(self.track(&uuid, |t| {
                if wanted.contains(&uuid) {
                    t.mps_wanted.insert(uuid.clone());
                } else {
                    t.mps_wanted.remove(&uuid);
                    t.mps_ready.remove(&uuid);
                }
            }));
        }
        out
    }

    fn cdi_event(&mut self, uuid: &str, failure: Option<String>) -> Option<Transition> {
        self.track(uuid, |t| match failure {
            Some(reason) => {
                t.cdi.insert(uuid.to_string(), reason);
            }
            None => {
                t.cdi.remove(uuid);
            }
        })
    }

    /// Takes a whole CDI check's verdict: exactly the devices in `unresolved` (UUID → reason)
    /// are held Unhealthy by CDI, every other device is released from that condition (an empty
    /// map when no `cdi-*` strategy is in use). Each device changes as a
    /// [`HealthEvent::Cdi`] would change it.
    pub fn set_cdi_unresolved(&mut self, unresolved: &BTreeMap<String, String>) -> Vec<Transition> {
        let touched: BTreeSet<String> = self.cdi.keys().chain(unresolved.keys()).cloned().collect();
        touched
            .into_iter()
            .filter_map(|uuid| {
                let failure = unresolved.get(&uuid).cloned();
                self.cdi_event(&uuid, failure)
            })
            .collect()
    }

    /// The devices held Unhealthy because their CDI name does not resolve, with the reason.
    pub fn cdi_unresolved(&self) -> &BTreeMap<String, String> {
        &self.cdi
    }

    /// MPS daemons the tracker knows to be ready.
    pub fn mps_ready(&self) -> &BTreeSet<String> {
        &self.mps_ready
    }

    /// The inventory with every condition applied: a GPU or MIG device is healthy when no
    /// source holds it Unhealthy (its discovery flag included).
    pub fn effective(&self, inventory: &Inventory) -> Inventory {
        let mut inv = inventory.clone();
        for g in &mut inv.gpus {
            g.health = g.health.and(self.health(&g.uuid));
            for m in &mut g.mig_devices {
                m.health = m.health.and(self.health(&m.uuid));
            }
        }
        inv
    }

    /// Devices held by an Xid whose quiet period has passed at `now`: probe each and report
    /// the answer with [`Tracker::probed`].
    pub fn due(&self, now: Instant) -> Vec<String> {
        let Some(period) = self.recovery else {
            return Vec::new();
        };
        self.sick
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.last_event) >= period)
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// A probe of `uuid` answered (`answers`) at `now`: a device still due recovers from its
    /// Xid condition; one whose probe failed starts a new quiet period. A device that had a
    /// new critical Xid since [`Tracker::due`] listed it is left alone.
    pub fn probed(&mut self, uuid: &str, answers: bool, now: Instant) -> Option<Transition> {
        let period = self.recovery?;
        let last = self.sick.get(uuid)?.last_event;
        if now.saturating_duration_since(last) < period {
            return None;
        }
        if !answers {
            if let Some(s) = self.sick.get_mut(uuid) {
                s.last_event = now;
            }
            return None;
        }
        let reason = self.sick.get(uuid).map(|s| s.reason.clone())?;
        let mut t = self.track(uuid, |t| {
            t.sick.remove(uuid);
        })?;
        if t.health.is_healthy() {
            t.reason = format!(
                "no critical event for {} s since {reason} and NVML answers",
                period.as_secs_f64()
            );
        }
        Some(t)
    }

    /// Recovers every due device for which `answers` (a probe) is true, in one step (for
    /// callers that can probe synchronously, and tests).
    pub fn recover(
        &mut self,
        now: Instant,
        mut answers: impl FnMut(&str) -> bool,
    ) -> Vec<Transition> {
        let due = self.due(now);
        due.into_iter()
            .filter_map(|u| {
                let a = answers(&u);
                self.probed(&u, a, now)
            })
            .collect()
    }

    /// When the next device could recover, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let period = self.recovery?;
        self.sick.values().map(|s| s.last_event + period).min()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod mps_ready_tests;

#[cfg(test)]
mod gone_tests;
