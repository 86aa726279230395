//! Unit tests of the Xid policy and the health tracker: environment and policy lists, recovery
//! on virtual time, the level conditions and Xid recovery tables, the effective inventory.

use super::*;
use crate::policy::DEFAULT_IGNORED_XIDS;

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

/// NVIDIA's `health` keys classify as NVIDIA's plugin's `Health.IsCritical` does (its own
/// test cases), and `DP_DISABLE_HEALTHCHECKS` adds to the file's ignored Xids as there.
#[test]
fn nvidias_health_keys_classify_as_nvidias_plugin() {
    use crate::policy::NvidiaXids;
    let n = |off, ignored: &[u64], critical: Option<&[u64]>| NvidiaXids {
        off,
        ignored: ignored.to_vec(),
        critical: critical.map(<[u64]>::to_vec),
    };
    type Case<'a> = (NvidiaXids, Option<&'a str>, &'a [u64], &'a [u64]);
    let cases: Vec<Case> = vec![
        // (keys, DP_DISABLE_HEALTHCHECKS, critical, not critical)
        (n(true, &[], None), None, &[], &[48, 79, 13]),
        (
            n(false, &[13, 31, 43], None),
            None,
            &[48, 45, 68],
            &[31, 13],
        ),
        (n(false, &[], Some(&[48, 79])), None, &[48, 79], &[94, 13]),
        (n(false, &[], None), None, &[94, 13, 31], &[]),
        (n(false, &[13], None), Some("79"), &[48, 31], &[13, 79]),
        (n(false, &[], Some(&[48])), Some("48"), &[], &[48, 79]),
        (n(false, &[], None), Some("all"), &[], &[48, 13]),
    ];
    for (keys, dis, crit, not) in &cases {
        let p = XidPolicy::nvidia(*dis, None, keys);
        for x in *crit {
            assert!(p.is_critical(*x), "{keys:?} {dis:?}: {x} critical");
        }
        for x in *not {
            assert!(!p.is_critical(*x), "{keys:?} {dis:?}: {x} ignored");
        }
    }
    // for_policy picks NVIDIA's reading when the policy has the keys.
    let health = crate::policy::HealthPolicy {
        nvidia: Some(n(false, &[], None)),
        ..Default::default()
    };
    assert!(XidPolicy::for_policy(None, None, &health).is_critical(13));
    assert!(!XidPolicy::for_policy(None, None, &Default::default()).is_critical(13));
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
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "a watch failure holds exactly while it lasts",
            vec![
                (
                    watched(Some("NVML: event set")),
                    Some(Down),
                    Some("NVML: event set"),
                ),
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

/// The cause names the condition `reason` names, one per kind, `None` once Healthy.
#[test]
fn cause_follows_the_condition_that_holds_the_device() {
    let p = XidPolicy::default();
    let now = Instant::now();
    let mut t = Tracker::new(Some(Duration::from_secs(1)));
    assert_eq!(t.cause("GPU-a"), None);
    t.on_xid(&p, "GPU-a", 79, now);
    assert_eq!(t.cause("GPU-a"), Some(Cause::Xid(79)));
    assert_eq!(t.reason("GPU-a"), Some("xid 79"));
    t.fail("GPU-b", "probe failed".to_string(), now);
    assert_eq!(t.cause("GPU-b"), Some(Cause::Other));
    t.apply(
        &p,
        &HealthEvent::Watched {
            uuid: "GPU-a".to_string(),
            failure: Some("no events".to_string()),
        },
        now,
    );
    assert_eq!(
        t.cause("GPU-a"),
        Some(Cause::Unwatched),
        "as reason: watch first"
    );
    t.apply(
        &p,
        &HealthEvent::Cdi {
            uuid: "GPU-c".to_string(),
            failure: Some("nvidia.com/gpu=x".to_string()),
        },
        now,
    );
    assert_eq!(t.cause("GPU-c"), Some(Cause::CdiUnresolved));
    t.set_mps_wanted(&["GPU-d".to_string()].into_iter().collect());
    assert_eq!(t.cause("GPU-d"), Some(Cause::MpsNotReady));
    assert_eq!(Cause::MpsNotReady.label(), "mps-not-ready");
    let mut inv = crate::inventory::test_node(1);
    inv.gpus[0].health = Health::Unhealthy;
    t.observe_discovery(&inv);
    assert_eq!(t.cause(&inv.gpus[0].uuid), Some(Cause::Lost));
    inv.gpus[0].health = Health::Healthy;
    t.observe_discovery(&inv);
    assert_eq!(t.cause(&inv.gpus[0].uuid), None);
}
