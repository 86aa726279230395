//! The Xid classification policy: which Xids mark a device Unhealthy, from NVIDIA's defaults,
//! its environment variables and the policy file's lists (the rules are in the parent module's
//! documentation).

use std::collections::BTreeSet;

use crate::policy::{HealthPolicy, NvidiaXids, DEFAULT_IGNORED_XIDS};

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

    /// [`XidPolicy::new`] with the policy's `health`: slicelet's lists as there, or NVIDIA's
    /// keys as [`XidPolicy::nvidia`] reads them.
    pub fn for_policy(
        disable_env: Option<&str>,
        enable_env: Option<&str>,
        health: &HealthPolicy,
    ) -> Self {
        match &health.nvidia {
            Some(n) => XidPolicy::nvidia(disable_env, enable_env, n),
            None => XidPolicy::new(
                disable_env,
                enable_env,
                &health.ignored_xids,
                &health.critical_xids,
            ),
        }
    }

    /// NVIDIA's `health` keys as NVIDIA's plugin reads them: the file's classification in
    /// place of the defaults (an Xid is critical unless `off`, unless ignored, and, with a
    /// `criticalXIDs` list, only when listed); `DP_DISABLE_HEALTHCHECKS` adds to the ignored
    /// Xids (`all`/`xids`: none is critical), as there. `DP_ENABLE_HEALTHCHECKS` makes its
    /// Xids critical as without the keys, but for the file's ignored ones.
    pub fn nvidia(disable_env: Option<&str>, enable_env: Option<&str>, n: &NvidiaXids) -> Self {
        let mut skipped = Vec::new();
        let mut p = XidPolicy {
            ignore_all: n.off || n.critical.is_some(),
            critical_all: false,
            ignored: BTreeSet::new(),
            critical: n.critical.iter().flatten().copied().collect(),
            policy_ignored: n.ignored.iter().copied().collect(),
            skipped: Vec::new(),
        };
        if n.off {
            p.critical.clear();
        }
        if let Some(v) = disable_env {
            let (all, set) =
                parse_list("DP_DISABLE_HEALTHCHECKS", v, &["all", "xids"], &mut skipped);
            if all {
                p.ignore_all = true;
                p.critical.clear();
            }
            p.policy_ignored.extend(set);
        }
        if let Some(v) = enable_env {
            let (all, set) =
                parse_list("DP_ENABLE_HEALTHCHECKS", v, &["all", "xids"], &mut skipped);
            p.critical_all = all;
            p.critical.extend(set);
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
