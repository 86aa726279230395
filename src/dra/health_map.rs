//! The health of each device of the DRA pool, and since when it has had it: what the device
//! taints ([`super::slices`]) and the kubelet's health stream (`NodeWatchResources`,
//! [`super::health_service`]) both say. Pure: time is passed in.
//!
//! Every device of the pool is here, Healthy or not, by its name in the pool
//! ([`super::pool::pool_devices`]). An Unhealthy device carries its [`Cause`] (the taint
//! value) and a sentence for people (the stream's `message`). `since` is when the device last
//! changed health or cause, in whole seconds (what the API server stores in a taint's
//! `timeAdded`, and the stream's `last_updated_time`); it stays put while nothing changes, so
//! republishing never moves it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::device_health::{Cause, Health};
use crate::plan::{ResourcePlan, VirtualDevice};

/// One device's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Healthy or Unhealthy (the plan's verdict for the device).
    pub health: Health,
    /// Why it is Unhealthy; `None` when Healthy.
    pub cause: Option<Cause>,
    /// Why, for people (`xid 79`, `MPS control daemon not ready`); empty when Healthy.
    pub message: String,
    /// Since when it has this health and cause: Unix time, whole seconds.
    pub since: SystemTime,
}

/// Every device of the pool by its name in the pool.
pub type HealthMap = BTreeMap<String, DeviceHealth>;

/// Why the plan holds a device Unhealthy: its [`Cause`] and a sentence for people; `None`
/// when the caller cannot say.
pub type CauseOf<'a> = dyn Fn(&ResourcePlan, &VirtualDevice) -> Option<(Cause, String)> + 'a;

/// The tracker's condition on a unit by UUID (a GPU's `GPU-…` or a MIG device's `MIG-…`):
/// its cause and a sentence; `None` when the tracker holds nothing against it.
pub type TrackedCause<'a> = dyn Fn(&str) -> Option<(Cause, String)> + 'a;

/// `t` cut to whole seconds (the API server's `metav1.Time` precision).
pub fn whole_seconds(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Unix seconds of `t` (0 before 1970).
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The health of every device of `resources` (in pool order, each name once), taking `since`
/// from `prev` for a device whose health and cause did not change, `now` otherwise.
/// `cause_of` says why an Unhealthy device is (cause and sentence); one it has no answer for
/// is [`Cause::Other`].
pub fn fold<'a>(
    prev: &HealthMap,
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
    cause_of: &CauseOf<'_>,
    now: SystemTime,
) -> HealthMap {
    let now = whole_seconds(now);
    super::pool::pool_devices(resources)
        .into_iter()
        .map(|(p, res, d)| {
            let (cause, message) = if d.health.is_healthy() {
                (None, String::new())
            } else {
                let (c, m) = cause_of(res, d).unwrap_or((Cause::Other, "Unhealthy".to_string()));
                (Some(c), m)
            };
            let since = prev
                .get(&p.name)
                .filter(|old| old.health == d.health && old.cause == cause)
                .map_or(now, |old| old.since);
            (
                p.name,
                DeviceHealth {
                    health: d.health,
                    cause,
                    message,
                    since,
                },
            )
        })
        .collect()
}

/// The entry of one device: `cause` (`None`: Healthy) at `now`, keeping `prev`'s `since`
/// for the device `name` when its health and cause did not change.
pub(super) fn entry(
    prev: &HealthMap,
    name: &str,
    cause: Option<(Cause, String)>,
    now: SystemTime,
) -> DeviceHealth {
    let (health, cause, message) = match cause {
        None => (Health::Healthy, None, String::new()),
        Some((c, m)) => (Health::Unhealthy, Some(c), m),
    };
    let since = prev
        .get(name)
        .filter(|old| old.health == health && old.cause == cause)
        .map_or(now, |old| old.since);
    DeviceHealth {
        health,
        cause,
        message,
        since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::test_node;
    use crate::plan;
    use crate::policy::parse;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(secs * 1000 + 700)
    }

    #[test]
    fn since_moves_only_when_health_or_cause_changes() {
        let mut inv = test_node(2);
        let policy = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
        let plan_of = |inv: &crate::inventory::Inventory| plan::build(&policy, inv).unwrap().plan;
        let xid =
            |_: &ResourcePlan, _: &VirtualDevice| Some((Cause::Xid(79), "xid 79".to_string()));
        let p = plan_of(&inv);
        let h1 = fold(
            &HealthMap::new(),
            p.resources.values().map(|r| &**r),
            &xid,
            at(100),
        );
        assert_eq!(h1.len(), 2);
        for h in h1.values() {
            assert_eq!(h.health, Health::Healthy);
            assert_eq!(h.cause, None);
            assert!(h.message.is_empty());
            assert_eq!(unix_seconds(h.since), 100, "whole seconds");
        }
        // GPU 1 turns Unhealthy at 200: only its entry moves.
        inv.gpus[1].health = Health::Unhealthy;
        let p = plan_of(&inv);
        let h2 = fold(&h1, p.resources.values().map(|r| &**r), &xid, at(200));
        let name0 = crate::plan::dra_names::device_name(&inv.gpus[0].uuid);
        let name1 = crate::plan::dra_names::device_name(&inv.gpus[1].uuid);
        assert_eq!(unix_seconds(h2[&name0].since), 100);
        assert_eq!(unix_seconds(h2[&name1].since), 200);
        assert_eq!(h2[&name1].cause, Some(Cause::Xid(79)));
        assert_eq!(h2[&name1].message, "xid 79");
        // Republished at 300, nothing changed: nothing moves.
        let h3 = fold(&h2, p.resources.values().map(|r| &**r), &xid, at(300));
        assert_eq!(h3, h2);
        // Another cause at 400: a new since.
        let lost = |_: &ResourcePlan, _: &VirtualDevice| Some((Cause::Lost, "lost".to_string()));
        let h4 = fold(&h3, p.resources.values().map(|r| &**r), &lost, at(400));
        assert_eq!(unix_seconds(h4[&name1].since), 400);
        // Recovered at 500; without an answer an Unhealthy device is `Other`.
        let none = |_: &ResourcePlan, _: &VirtualDevice| None;
        inv.gpus[1].health = Health::Healthy;
        inv.gpus[0].health = Health::Unhealthy;
        let p = plan_of(&inv);
        let h5 = fold(&h4, p.resources.values().map(|r| &**r), &none, at(500));
        assert_eq!(h5[&name1].health, Health::Healthy);
        assert_eq!(unix_seconds(h5[&name1].since), 500);
        assert_eq!(h5[&name0].cause, Some(Cause::Other));
    }
}
