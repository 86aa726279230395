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

/// Xids NVIDIA's plugin ignores by default (application errors, not hardware faults).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Default quiet period before an Unhealthy device may recover.
pub const DEFAULT_RECOVERY: Duration = Duration::from_secs(300);

/// An environment variable that cannot be read as NVIDIA's format.
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
    /// policy file's lists, which win over the environment.
    ///
    /// # Errors
    /// [`XidEnvError`] naming the variable and the item it cannot read.
    pub fn new(
        disable_env: Option<&str>,
        enable_env: Option<&str>,
        policy_ignored: &[u64],
        policy_critical: &[u64],
    ) -> Result<Self, XidEnvError> {
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
        Ok(p)
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
    pub healthy: bool,
    /// Why: `xid 79`, `NVML: GPU is lost`, `quiet for 300 s and NVML answers`.
    pub reason: String,
}

#[derive(Debug, Clone)]
struct Sick {
    last_event: Instant,
    reason: String,
}

/// Tracks Unhealthy devices and their recovery. Devices not tracked are Healthy.
#[derive(Debug, Clone)]
pub struct Tracker {
    recovery: Option<Duration>,
    sick: BTreeMap<String, Sick>,
}

impl Tracker {
    /// A tracker whose devices recover after `recovery` without critical events (`None` or
    /// zero: never).
    pub fn new(recovery: Option<Duration>) -> Self {
        Tracker {
            recovery: recovery.filter(|d| !d.is_zero()),
            sick: BTreeMap::new(),
        }
    }

    /// Changes the quiet period (policy reload).
    pub fn set_recovery(&mut self, recovery: Option<Duration>) {
        self.recovery = recovery.filter(|d| !d.is_zero());
    }

    /// Whether the device is Healthy as far as events go.
    pub fn is_healthy(&self, uuid: &str) -> bool {
        !self.sick.contains_key(uuid)
    }

    /// UUIDs currently Unhealthy.
    pub fn unhealthy(&self) -> impl Iterator<Item = &str> {
        self.sick.keys().map(String::as_str)
    }

    /// Marks the device Unhealthy (or restarts its quiet period) for `reason`. Returns the
    /// transition when it was Healthy.
    pub fn fail(&mut self, uuid: &str, reason: String, now: Instant) -> Option<Transition> {
        let was_healthy = self.is_healthy(uuid);
        self.sick.insert(
            uuid.to_string(),
            Sick {
                last_event: now,
                reason: reason.clone(),
            },
        );
        was_healthy.then(|| Transition {
            uuid: uuid.to_string(),
            healthy: false,
            reason,
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

    /// Recovers every device quiet for the recovery period for which `answers` (an NVML probe)
    /// is true. Devices whose probe fails stay Unhealthy and start a new quiet period.
    pub fn recover(
        &mut self,
        now: Instant,
        mut answers: impl FnMut(&str) -> bool,
    ) -> Vec<Transition> {
        let Some(period) = self.recovery else {
            return Vec::new();
        };
        let due: Vec<String> = self
            .sick
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.last_event) >= period)
            .map(|(u, _)| u.clone())
            .collect();
        let mut out = Vec::new();
        for uuid in due {
            if answers(&uuid) {
                let sick = self.sick.remove(&uuid).expect("listed above");
                out.push(Transition {
                    uuid,
                    healthy: true,
                    reason: format!(
                        "no critical event for {} s since {} and NVML answers",
                        period.as_secs_f64(),
                        sick.reason
                    ),
                });
            } else if let Some(s) = self.sick.get_mut(&uuid) {
                s.last_event = now;
            }
        }
        out
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
            let p = XidPolicy::new(*dis, *en, &[], &[]).unwrap();
            for x in *crit {
                assert!(p.is_critical(*x), "{dis:?} {en:?}: {x} critical");
            }
            for x in *not {
                assert!(!p.is_critical(*x), "{dis:?} {en:?}: {x} ignored");
            }
        }
        // Regression: a malformed item stopped slicelet; NVIDIA skips it.
        let p = XidPolicy::new(Some("79,xid48"), Some("xids"), &[], &[]).unwrap();
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
        let p = XidPolicy::new(None, Some("79"), &[79], &[13]).unwrap();
        assert!(!p.is_critical(79));
        assert!(p.is_critical(13));
        // Regression: DP_ENABLE_HEALTHCHECKS=all beat the policy's ignoredXids.
        let p = XidPolicy::new(None, Some("all"), &[79], &[]).unwrap();
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
        assert!(!tr.healthy && tr.reason == "xid 79");
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
        assert!(back[0].healthy);
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
}
