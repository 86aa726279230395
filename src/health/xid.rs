//! The Xid classification policy: which Xids mark a device Unhealthy, from NVIDIA's defaults,
//! its environment variables and the policy file's lists (the rules are in the parent module's
//! documentation).

use std::collections::BTreeSet;

/// Xids NVIDIA's plugin ignores by default (application errors, not hardware faults).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

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
