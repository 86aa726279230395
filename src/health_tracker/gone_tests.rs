//! Unit tests of devices gone from discovery and unresolved CDI names in the tracker.

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
