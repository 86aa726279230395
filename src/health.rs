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
//!
//! Recovery: a device marked Unhealthy returns to Healthy once no critical event has arrived
//! for the quiet period (default 5 min; 0 = never) and NVML still answers for it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

pub use crate::device_health::{Health, HealthEvent};
use crate::inventory::Inventory;

/// Xids NVIDIA's plugin ignores by default (application errors, not hardware faults).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Default quiet period before an Unhealthy device may recover.
pub const DEFAULT_RECOVERY: Duration = Duration::from_secs(300);

/// An item of an environment variable that cannot be read as NVIDIA's format (skipped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: `{item}` is not an Xid number, `all` or `xids`")]
pub struct XidEnvError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// The item that is wrong.
    pub item: String,
}

/// Which Xids mark a device Unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    ignore_all: bool,
    critical_all: bool,
    ignored: BTreeSet<u64>,
    critical: BTreeSet<u64>,
    /// The policy file's `ignoredXids`: wins over everything from the environment, even
    /// `DP_ENABLE_HEALTHCHECKS=all`.
    policy_ignored: BTreeSet<u64>,
    /// Items of the environment variables that were not understood and skipped.
    pub skipped: Vec<XidEnvError>,
}

impl Default for XidPolicy {
    fn default() -> Self {
        XidPolicy {
            ignore_all: false,
            critical_all: false,
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            critical: BTreeSet::new(),
            policy_ignored: BTreeSet::new(),
            skipped: Vec::new(),
        }
    }
}

/// Reads one of NVIDIA's variables: Xid numbers and words, comma separated. Items that are
/// neither are skipped (and reported), as NVIDIA's plugin skips them.
fn parse_list(
    var: &'static str,
    value: &str,
    words: &[&str],
    skipped: &mut Vec<XidEnvError>,
) -> (bool, BTreeSet<u64>) {
    let mut all = false;
    let mut set = BTreeSet::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if words.contains(&item.to_ascii_lowercase().as_str()) {
            all = true;
        } else if let Ok(x) = item.parse::<u64>() {
            set.insert(x);
        } else {
            skipped.push(XidEnvError {
                var,
                value: value.to_string(),
                item: item.to_string(),
            });
        }
    }
    (all, set)
}

impl XidPolicy {
    /// Builds the policy from NVIDIA's environment variables (their raw values, if set) and the
    /// policy file's lists, which win over the environment. Items of the variables it cannot
    /// read are skipped, as NVIDIA's plugin skips them, and listed in [`XidPolicy::skipped`].
    pub fn new(
        disable_env: Option<&str>,
        enable_env: Option<&str>,
        policy_ignored: &[u64],
        policy_critical: &[u64],
    ) -> Self {
        let mut p = XidPolicy::default();
        let mut skipped = Vec::new();
        if let Some(v) = disable_env {
            let (all, set) =
                parse_list("DP_DISABLE_HEALTHCHECKS", v, &["all", "xids"], &mut skipped);
            p.ignore_all = all;
            p.ignored.extend(set);
        }
        if let Some(v) = enable_env {
            let (all, set) =
                parse_list("DP_ENABLE_HEALTHCHECKS", v, &["all", "xids"], &mut skipped);
            p.critical_all = all;
            p.critical.extend(set);
        }
        for x in policy_ignored {
            p.critical.remove(x);
            p.ignored.insert(*x);
            p.policy_ignored.insert(*x);
        }
        for x in policy_critical {
            p.ignored.remove(x);
            p.critical.insert(*x);
        }
        p.skipped = skipped;
        p
    }

    /// Whether Xid `xid` marks the device Unhealthy.
    pub fn is_critical(&self, xid: u64) -> bool {
        if self.policy_ignored.contains(&xid) {
            return false;
        }
        if self.critical_all || self.critical.contains(&xid) {
            return true;
        }
        !self.ignore_all && !self.ignored.contains(&xid)
    }
}

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
        self.track(uuid, |t| {
            t.sick.insert(
                uuid.to_string(),
                Sick {
                    last_event: now,
                    reason,
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
        self.fail(uuid, format!("xid {xid}"), now)
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
mod tests {
    use super::*;

    #[test]
    fn default_ignored_xids_match_nvidia() {
        let p = XidPolicy::default();
        for x in DEFAULT_IGNORED_XIDS {
            assert!(!p.is_critical(x), "{x}");
        }
        for x in [48, 62, 63, 64, 74, 79, 92, 94, 95, 119] {
            assert!(p.is_critical(x), "{x}");
        }
    }

    #[test]
    fn env_overrides() {
        type Case<'a> = (Option<&'a str>, Option<&'a str>, &'a [u64], &'a [u64]);
        let cases: &[Case] = &[
            // (DISABLE, ENABLE, critical, not critical)
            (Some("79,48"), None, &[62], &[79, 48, 13]),
            (Some("all"), None, &[], &[79, 48, 13]),
            (Some("xids"), None, &[], &[79]),
            (Some("all"), Some("79"), &[79], &[48, 13]),
            (None, Some("13"), &[13, 79], &[31]),
            (None, Some("all"), &[13, 31, 79], &[]),
            (Some(" 79 , 48 "), None, &[62], &[79, 48]),
        ];
        for (dis, en, crit, not) in cases {
            let p = XidPolicy::new(*dis, *en, &[], &[]);
            for x in *crit {
                assert!(p.is_critical(*x), "{dis:?} {en:?}: {x} critical");
            }
            for x in *not {
                assert!(!p.is_critical(*x), "{dis:?} {en:?}: {x} ignored");
            }
        }
        // Regression: a malformed item stopped slicelet; NVIDIA skips it.
        let p = XidPolicy::new(Some("79,xid48"), Some("xids"), &[], &[]);
        assert_eq!(p.skipped.len(), 1);
        assert_eq!(p.skipped[0].var, "DP_DISABLE_HEALTHCHECKS");
        assert_eq!(p.skipped[0].item, "xid48");
        assert!(
            p.is_critical(13),
            "xids in DP_ENABLE_HEALTHCHECKS means every Xid"
        );
    }

    #[test]
    fn policy_wins_over_env() {
        let p = XidPolicy::new(None, Some("79"), &[79], &[13]);
        assert!(!p.is_critical(79));
        assert!(p.is_critical(13));
        // Regression: DP_ENABLE_HEALTHCHECKS=all beat the policy's ignoredXids.
        let p = XidPolicy::new(None, Some("all"), &[79], &[]);
        assert!(!p.is_critical(79));
        assert!(p.is_critical(48));
    }

    #[test]
    fn recovery_after_quiet_period_on_virtual_time() {
        let t0 = Instant::now();
        let policy = XidPolicy::default();
        let mut t = Tracker::new(Some(Duration::from_secs(300)));
        assert_eq!(t.on_xid(&policy, "GPU-a", 13, t0), None, "ignored Xid");
        let tr = t.on_xid(&policy, "GPU-a", 79, t0).unwrap();
        assert!(tr.health == Health::Unhealthy && tr.reason == "xid 79");
        assert!(!t.is_healthy("GPU-a") && t.is_healthy("GPU-b"));
        // A second critical Xid restarts the quiet period but is not a new transition.
        assert_eq!(
            t.on_xid(&policy, "GPU-a", 48, t0 + Duration::from_secs(100)),
            None
        );
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_secs(400)));
        assert!(t
            .recover(t0 + Duration::from_secs(399), |_| true)
            .is_empty());
        // NVML does not answer: stays Unhealthy, new quiet period.
        assert!(t
            .recover(t0 + Duration::from_secs(400), |_| false)
            .is_empty());
        assert!(!t.is_healthy("GPU-a"));
        let back = t.recover(t0 + Duration::from_secs(700), |_| true);
        assert_eq!(back.len(), 1);
        assert!(back[0].health.is_healthy());
        assert!(t.is_healthy("GPU-a"));
    }

    #[test]
    fn zero_recovery_means_never() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Some(Duration::ZERO));
        t.fail("GPU-a", "lost".into(), t0);
        assert!(t
            .recover(t0 + Duration::from_secs(1_000_000), |_| true)
            .is_empty());
        assert_eq!(t.next_deadline(), None);
        assert!(!t.is_healthy("GPU-a"));
    }

    use crate::inventory::{test_mig, test_node};

    /// One operation on a tracker in the table tests below.
    enum Op {
        /// A health event at `t0 + s` seconds.
        Event(HealthEvent, u64),
        /// A discovery where "GPU-a" is usable or not, or absent (`None`).
        Discover(Option<bool>),
        /// The devices the plan runs MPS daemons for.
        Wanted(&'static [&'static str]),
        /// `due` at `t0 + s` lists exactly these.
        Due(u64, &'static [&'static str]),
        /// A probe answer for "GPU-a" at `t0 + s`.
        Probed(bool, u64),
    }

    fn xid(x: u64, at: u64) -> Op {
        Op::Event(
            HealthEvent::Xid {
                uuid: "GPU-a".into(),
                xid: x,
            },
            at,
        )
    }

    fn watched(failure: Option<&str>) -> Op {
        Op::Event(
            HealthEvent::Watched {
                uuid: "GPU-a".into(),
                failure: failure.map(str::to_string),
            },
            0,
        )
    }

    fn mps(ready: bool) -> Op {
        Op::Event(
            HealthEvent::MpsReady {
                uuid: "GPU-a".into(),
                ready,
            },
            0,
        )
    }

    /// Two GPUs, "GPU-a" (usable or not) and "GPU-b"; `None`: only "GPU-b".
    fn node(a: Option<bool>) -> Inventory {
        let mut inv = test_node(2);
        inv.gpus[0].uuid = "GPU-a".into();
        inv.gpus[1].uuid = "GPU-b".into();
        match a {
            Some(healthy) => inv.gpus[0].health = Health::from_bool(healthy),
            None => {
                inv.gpus.remove(0);
            }
        }
        inv
    }

    /// Each step: an operation, the transitions of "GPU-a" it must cause (`Some(health)`, or
    /// `None` for none), and the reason that must hold "GPU-a" afterwards (`None`: Healthy).
    type Step = (Op, Option<Health>, Option<&'static str>);

    fn run(name: &str, steps: Vec<Step>) {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let policy = XidPolicy::default();
        let mut t = Tracker::new(Some(Duration::from_secs(300)));
        for (n, (op, want, reason)) in steps.into_iter().enumerate() {
            let ts: Vec<Transition> = match op {
                Op::Event(ev, s) => t.apply(&policy, &ev, at(s)).into_iter().collect(),
                Op::Discover(a) => t.observe_discovery(&node(a)),
                Op::Wanted(w) => t.set_mps_wanted(&w.iter().map(|u| u.to_string()).collect()),
                Op::Due(s, want) => {
                    assert_eq!(t.due(at(s)), want, "{name}, step {n}: due");
                    Vec::new()
                }
                Op::Probed(ok, s) => t.probed("GPU-a", ok, at(s)).into_iter().collect(),
            };
            assert!(
                ts.iter().all(|tr| tr.uuid == "GPU-a"),
                "{name}, step {n}: only GPU-a changes: {ts:?}"
            );
            assert_eq!(
                ts.iter().map(|tr| tr.health).collect::<Vec<_>>(),
                want.into_iter().collect::<Vec<_>>(),
                "{name}, step {n}: transitions {ts:?}"
            );
            assert_eq!(t.reason("GPU-a"), reason, "{name}, step {n}: reason");
            assert_eq!(
                t.health("GPU-a"),
                Health::from_bool(reason.is_none()),
                "{name}, step {n}"
            );
            assert!(t.is_healthy("GPU-b"), "{name}, step {n}: GPU-b untouched");
        }
    }

    const LOST: &str = "discovery reports it unusable";
    const MPS: &str = "MPS control daemon not ready";
    use Health::{Healthy as Up, Unhealthy as Down};

    #[test]
    fn level_conditions_table() {
        let cases: Vec<(&str, Vec<Step>)> =
            vec![
            (
                "a watch failure holds exactly while it lasts",
                vec![
                    (watched(Some("NVML: event set")), Some(Down), Some("NVML: event set")),
                    // Another failure: still down, the latest reason, no new transition.
                    (watched(Some("NVML: again")), None, Some("NVML: again")),
                    (watched(None), Some(Up), None),
                    (watched(None), None, None),
                ],
            ),
            (
                "discovery holds a device it reports unusable until it reports it usable",
                vec![
                    (Op::Discover(Some(true)), None, None),
                    (Op::Discover(Some(false)), Some(Down), Some(LOST)),
                    (Op::Discover(Some(false)), None, Some(LOST)),
                    (Op::Discover(Some(true)), Some(Up), None),
                    (Op::Discover(Some(false)), Some(Down), Some(LOST)),
                    // A device no longer present drops its level conditions.
                    (Op::Discover(None), Some(Up), None),
                ],
            ),
            (
                "a device gone from discovery drops its watch failure too",
                vec![
                    (watched(Some("unwatched")), Some(Down), Some("unwatched")),
                    (Op::Discover(None), Some(Up), None),
                ],
            ),
            (
                "MPS readiness counts only while a daemon is wanted",
                vec![
                    // Ready (or not) for a device without a daemon: nothing.
                    (mps(false), None, None),
                    (Op::Wanted(&["GPU-a"]), Some(Down), Some(MPS)),
                    (mps(true), Some(Up), None),
                    (mps(false), Some(Down), Some(MPS)),
                    (mps(true), Some(Up), None),
                    // No longer wanted: healthy, and its readiness forgotten, so wanting it
                    // again holds it until the new daemon is ready.
                    (Op::Wanted(&[]), None, None),
                    (Op::Wanted(&["GPU-a"]), Some(Down), Some(MPS)),
                    (mps(true), Some(Up), None),
                ],
            ),
            (
                "several conditions: healthy only when all clear, the reason is the first holding",
                vec![
                    (Op::Wanted(&["GPU-a"]), Some(Down), Some(MPS)),
                    (xid(79, 0), None, Some("xid 79")),
                    (watched(Some("unwatched")), None, Some("unwatched")),
                    (Op::Discover(Some(false)), None, Some(LOST)),
                    // Order: discovery, watch failure, Xid, MPS.
                    (Op::Discover(Some(true)), None, Some("unwatched")),
                    (watched(None), None, Some("xid 79")),
                    (Op::Due(300, &["GPU-a"]), None, Some("xid 79")),
                    (Op::Probed(true, 300), None, Some(MPS)),
                    (mps(true), Some(Up), None),
                ],
            ),
            (
                "an Xid held with a level condition: the probe clears only the Xid",
                vec![
                    (xid(79, 0), Some(Down), Some("xid 79")),
                    (Op::Discover(Some(false)), None, Some(LOST)),
                    (Op::Probed(true, 300), None, Some(LOST)),
                    (Op::Due(1000, &[]), None, Some(LOST)),
                    (Op::Discover(Some(true)), Some(Up), None),
                ],
            ),
        ];
        for (name, steps) in cases {
            run(name, steps);
        }
    }

    #[test]
    fn xid_recovery_table() {
        let cases: Vec<(&str, Vec<Step>)> = vec![
            (
                "a probe after a new critical Xid since due listed the device is ignored",
                vec![
                    (xid(79, 0), Some(Down), Some("xid 79")),
                    (Op::Due(300, &["GPU-a"]), None, Some("xid 79")),
                    (xid(48, 301), None, Some("xid 48")),
                    (Op::Probed(true, 302), None, Some("xid 48")),
                    (Op::Due(600, &[]), None, Some("xid 48")),
                    (Op::Due(601, &["GPU-a"]), None, Some("xid 48")),
                    (Op::Probed(true, 601), Some(Up), None),
                ],
            ),
            (
                "a non-critical Xid neither fails a device nor restarts its quiet period",
                vec![
                    (xid(13, 0), None, None),
                    (xid(79, 0), Some(Down), Some("xid 79")),
                    (xid(13, 200), None, Some("xid 79")),
                    (Op::Due(300, &["GPU-a"]), None, Some("xid 79")),
                    (Op::Probed(true, 300), Some(Up), None),
                ],
            ),
            (
                "a failed probe starts a new quiet period",
                vec![
                    (xid(79, 0), Some(Down), Some("xid 79")),
                    (Op::Probed(false, 300), None, Some("xid 79")),
                    (Op::Due(599, &[]), None, Some("xid 79")),
                    // Too early: a probe answer before the period is ignored.
                    (Op::Probed(true, 599), None, Some("xid 79")),
                    (Op::Due(600, &["GPU-a"]), None, Some("xid 79")),
                    (Op::Probed(true, 600), Some(Up), None),
                    // A probe for a device nothing holds is nothing.
                    (Op::Probed(true, 900), None, None),
                ],
            ),
        ];
        for (name, steps) in cases {
            run(name, steps);
        }
    }

    #[test]
    fn effective_applies_to_gpus_and_mig_devices() {
        let t0 = Instant::now();
        let policy = XidPolicy::default();
        let mut inv = test_node(3);
        inv.gpus[1].mig_enabled = true;
        inv.gpus[1].mig_devices = test_mig(1, &[("3g.40gb", 2)]);
        inv.gpus[2].health = Health::Unhealthy; // discovery's own verdict is kept
        let gpu0 = inv.gpus[0].uuid.clone();
        let mig1 = inv.gpus[1].mig_devices[1].uuid.clone();
        let view = |inv: &Inventory| -> Vec<(bool, Vec<bool>)> {
            inv.gpus
                .iter()
                .map(|g| {
                    (
                        g.health.is_healthy(),
                        g.mig_devices
                            .iter()
                            .map(|m| m.health.is_healthy())
                            .collect(),
                    )
                })
                .collect()
        };
        let mut t = Tracker::new(Some(Duration::from_secs(300)));
        let gpu2 = t.observe_discovery(&inv);
        assert_eq!(gpu2.len(), 1);
        assert_eq!(gpu2[0].uuid, inv.gpus[2].uuid);
        assert_eq!(
            view(&t.effective(&inv)),
            [(true, vec![]), (true, vec![true, true]), (false, vec![])]
        );
        t.apply(
            &policy,
            &HealthEvent::Xid {
                uuid: gpu0.clone(),
                xid: 79,
            },
            t0,
        )
        .unwrap();
        t.apply(
            &policy,
            &HealthEvent::Watched {
                uuid: mig1.clone(),
                failure: Some("unwatched".into()),
            },
            t0,
        )
        .unwrap();
        assert_eq!(
            view(&t.effective(&inv)),
            [(false, vec![]), (true, vec![true, false]), (false, vec![])]
        );
        // The raw inventory is left alone.
        assert_eq!(
            view(&inv),
            [(true, vec![]), (true, vec![true, true]), (false, vec![])]
        );
        // A MIG device discovery reports unusable, then usable again.
        let mut sick = inv.clone();
        sick.gpus[1].mig_devices[0].health = Health::Unhealthy;
        let ts = t.observe_discovery(&sick);
        assert_eq!(ts.len(), 1);
        assert_eq!(ts[0].uuid, sick.gpus[1].mig_devices[0].uuid);
        assert_eq!(
            view(&t.effective(&inv)),
            [(false, vec![]), (true, vec![false, false]), (false, vec![])]
        );
        assert_eq!(t.observe_discovery(&inv).len(), 1);
        assert_eq!(
            view(&t.effective(&inv)),
            [(false, vec![]), (true, vec![true, false]), (false, vec![])]
        );
    }
}

#[cfg(test)]
mod mps_ready_tests {
    use super::*;

    /// The ready set is what `/readyz` and the status view publish: exactly the wanted
    /// daemons that reported ready.
    #[test]
    fn mps_ready_lists_exactly_the_ready_wanted_daemons() {
        let mut t = Tracker::new(None);
        let p = XidPolicy::default();
        let now = Instant::now();
        t.set_mps_wanted(&["GPU-a".to_string(), "GPU-b".to_string()].into());
        assert!(t.mps_ready().is_empty());
        let ready = |uuid: &str, ready| HealthEvent::MpsReady {
            uuid: uuid.into(),
            ready,
        };
        t.apply(&p, &ready("GPU-a", true), now);
        assert_eq!(
            t.mps_ready().iter().map(String::as_str).collect::<Vec<_>>(),
            ["GPU-a"]
        );
        t.apply(&p, &ready("GPU-a", false), now);
        t.apply(&p, &ready("GPU-b", true), now);
        assert_eq!(
            t.mps_ready().iter().map(String::as_str).collect::<Vec<_>>(),
            ["GPU-b"]
        );
    }
}

#[cfg(test)]
mod gone_tests {
    use super::*;
    use crate::inventory::test_node;

    /// Regression (review): an Xid on a device that discovery no longer reports (a MIG device
    /// configured away) stayed held and was probed every recovery period forever.
    #[test]
    fn a_device_gone_from_discovery_drops_its_xid() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Some(Duration::from_secs(60)));
        let inv = test_node(1);
        t.on_xid(&XidPolicy::default(), "MIG-gone", 79, t0);
        assert_eq!(t.due(t0 + Duration::from_secs(61)), ["MIG-gone"]);
        t.observe_discovery(&inv);
        assert!(t.due(t0 + Duration::from_secs(61)).is_empty());
        assert!(t.is_healthy("MIG-gone"));
    }

    #[test]
    fn an_unresolved_cdi_name_is_a_level_condition_with_its_reason() {
        let t0 = Instant::now();
        let p = XidPolicy::default();
        let mut t = Tracker::new(None);
        let inv = test_node(2);
        let (a, b) = (&inv.gpus[0].uuid, &inv.gpus[1].uuid);
        let cdi = |uuid: &str, failure: Option<&str>| HealthEvent::Cdi {
            uuid: uuid.to_string(),
            failure: failure.map(str::to_string),
        };
        let down = t
            .apply(&p, &cdi(a, Some("CDI device x is not defined")), t0)
            .unwrap();
        assert_eq!(down.health, Health::Unhealthy);
        assert_eq!(down.reason, "CDI device x is not defined");
        assert_eq!(t.reason(a), Some("CDI device x is not defined"));
        assert!(t.effective(&inv).gpus[0].health == Health::Unhealthy);
        // No recovery by time: only the next check releases it.
        assert!(t.due(t0 + Duration::from_secs(3600)).is_empty());
        let up = t.apply(&p, &cdi(a, None), t0).unwrap();
        assert_eq!(up.health, Health::Healthy);
        // A whole check's verdict: exactly these are held.
        let mut found = BTreeMap::new();
        found.insert(b.clone(), "missing".to_string());
        let ts = t.set_cdi_unresolved(&found);
        assert_eq!(ts.len(), 1);
        assert_eq!(
            (ts[0].uuid.as_str(), ts[0].health),
            (b.as_str(), Health::Unhealthy)
        );
        assert_eq!(t.cdi_unresolved().keys().collect::<Vec<_>>(), [b]);
        let ts = t.set_cdi_unresolved(&BTreeMap::new());
        assert_eq!(ts.len(), 1);
        assert!(t.is_healthy(b));
        // A device gone from discovery drops the condition.
        t.set_cdi_unresolved(&found);
        t.observe_discovery(&test_node(1));
        assert!(t.cdi_unresolved().is_empty());
    }
}
