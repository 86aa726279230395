//! Table tests of the pure fold: each scenario is a list of steps (time, input) → (actions,
//! state), run from an empty [`State`] on a simulated inventory. Time is passed in
//! (`t0 + seconds`); nothing sleeps.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::*;
use crate::device_health::{Cause, Health};
use crate::inventory::{test_mig, test_node};

/// The UUID of `test_node`'s GPU `i`.
fn gpu(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

/// A policy read of `text` (hash of its bytes, parsed as the shell parses it).
fn policy(text: &str, force: bool) -> Input {
    Input::Policy {
        path: PathBuf::from("/etc/slicelet/config.yaml"),
        hash: Sha256::digest(text.as_bytes()).into(),
        force,
        parsed: crate::policy::parse(text).map(Box::new),
    }
}

fn discovered(inv: Inventory) -> Input {
    Input::Discovered(Ok((inv, "test node".to_string())))
}

fn xid(uuid: &str, xid: u64) -> Input {
    Input::Health(HealthEvent::Xid {
        uuid: uuid.to_string(),
        xid,
    })
}

fn mps_ready(uuid: &str, ready: bool) -> Input {
    Input::Mps(mps::Event {
        uuid: uuid.to_string(),
        ready,
        applied: None,
        pending: None,
        removed: false,
    })
}

/// Every GPU time-sliced 2 ways as `nvidia.com/gpu-shared`.
const TS2: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 2\n";
/// [`TS2`] with a 100 s quiet period before recovery.
const TS2_RECOVER_100: &str = "version: v1\nhealth:\n  recoverySeconds: 100\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 2\n";
/// Every GPU shared by 2 MPS clients.
const MPS2: &str = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-mps\n        replicas: 2\n";
const MIG_SINGLE: &str = "version: v1\nflags:\n  migStrategy: single\n";
/// Not a policy: `replica` is not a field.
const TYPO: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replica: 2\n";

/// Two GPUs: GPU 0 with MIG (two 3g.40gb), GPU 1 with MIG disabled (or enabled, `both`).
fn mig_node(both: bool) -> Inventory {
    let mut inv = test_node(2);
    let gpus = if both { 0..2 } else { 0..1 };
    for i in gpus {
        let g = &mut inv.gpus[i as usize];
        g.mig_enabled = true;
        g.mig_devices = test_mig(i, &[("3g.40gb", 2)]);
    }
    inv
}

/// The actions, one short line each, for exact comparison.
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Publish(_) => "Publish".to_string(),
            Action::WantMps(w) => format!("WantMps({:?})", w.daemons.keys().collect::<Vec<_>>()),
            Action::ComputeModes(g) => format!("ComputeModes({g:?})"),
            Action::Probe(u) => format!("Probe({u:?})"),
            Action::CheckCdi => "CheckCdi".to_string(),
            Action::RefreshInUse => "RefreshInUse".to_string(),
            Action::InUseChanged => "InUseChanged".to_string(),
            Action::Xid { uuid, xid } => format!("Xid({uuid}, {xid})"),
            Action::Transition(t) => format!("Transition({}, {})", t.uuid, t.health),
            Action::PolicyApplied(g) => format!("PolicyApplied({g})"),
            Action::PolicyRejected => "PolicyRejected".to_string(),
            Action::Causes => "Causes".to_string(),
            Action::MigApply(c) => format!("MigApply({})", c.index),
            Action::MigState => "MigState".to_string(),
        })
        .collect()
}

/// `(resource, devices, unhealthy units)` of the plan: the units are the GPU/MIG UUIDs of
/// the Unhealthy devices, each once, in device order.
fn plan_view(state: &State) -> Vec<(String, usize, Vec<String>)> {
    state
        .plan
        .resources
        .iter()
        .map(|(name, r)| {
            let mut sick: Vec<String> = r
                .devices
                .iter()
                .filter(|d| !d.health.is_healthy())
                .map(|d| d.gpu_uuid.clone())
                .collect();
            sick.dedup();
            (name.clone(), r.devices.len(), sick)
        })
        .collect()
}

/// One step of a scenario: fold `input` at `t0 + at` seconds, expect exactly `actions`, then
/// `check` the state (given the plan before the step).
struct Step {
    at: u64,
    input: Input,
    actions: Vec<String>,
    check: fn(&State, &Arc<Plan>),
}

fn step(at: u64, input: Input, actions: &[&str], check: fn(&State, &Arc<Plan>)) -> Step {
    Step {
        at,
        input,
        actions: actions.iter().map(|s| s.to_string()).collect(),
        check,
    }
}

fn nothing(_: &State, _: &Arc<Plan>) {}

/// The plan is the one from before the step (the same `Arc`).
fn plan_kept(s: &State, before: &Arc<Plan>) {
    assert!(
        Arc::ptr_eq(&s.plan, before),
        "plan changed: {:?}",
        plan_view(s)
    );
}

fn all_healthy_ts2(s: &State, _: &Arc<Plan>) {
    assert_eq!(
        plan_view(s),
        [("nvidia.com/gpu-shared".to_string(), 4, vec![])]
    );
}

fn gpu1_down_ts2(s: &State, _: &Arc<Plan>) {
    assert_eq!(
        plan_view(s),
        [("nvidia.com/gpu-shared".to_string(), 4, vec![gpu(1)])]
    );
}

fn run(name: &str, steps: Vec<Step>) {
    let t0 = Instant::now();
    let mut state = State::new(HealthEnv::default());
    for (n, s) in steps.into_iter().enumerate() {
        let before = Arc::clone(&state.plan);
        let at = s.at;
        let input = format!("{:?}", s.input);
        let got = summary(&state.fold(s.input, t0 + Duration::from_secs(at)));
        assert_eq!(got, s.actions, "{name}, step {n} at {at} s: {input:.200}");
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (s.check)(&state, &before)));
        if let Err(e) = caught {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|m| m.to_string()))
                .unwrap_or_default();
            panic!("{name}, step {n} at {at} s: {msg}");
        }
    }
}

/// The first discovery and the first policy of a 2-GPU node with [`TS2`].
fn started(policy_text: &'static str) -> Vec<Step> {
    vec![
        step(0, discovered(test_node(2)), &[], |s, _| {
            assert!(s.inventory.is_some() && s.policy.is_none());
            assert!(s.plan.resources.is_empty(), "nothing without a policy");
        }),
        step(
            0,
            policy(policy_text, true),
            &["PolicyApplied(1)", "Publish"],
            |s, _| {
                assert_eq!(s.generation, 1);
                assert_eq!(s.policy_error, None);
                all_healthy_ts2(s, &Arc::default());
            },
        ),
    ]
}

fn with(mut steps: Vec<Step>, more: Vec<Step>) -> Vec<Step> {
    steps.extend(more);
    steps
}

#[test]
fn policy_table() {
    let cases: Vec<(&str, Vec<Step>)> = vec![
        ("first discovery and first policy", started(TS2)),
        (
            "the same bytes again without force change nothing; with force, a new generation and the same plan",
            with(
                started(TS2),
                vec![
                    step(5, policy(TS2, false), &[], |s, before| {
                        assert_eq!(s.generation, 1);
                        plan_kept(s, before);
                    }),
                    step(6, policy(TS2, true), &["PolicyApplied(2)"], |s, before| {
                        assert_eq!(s.generation, 2);
                        plan_kept(s, before);
                    }),
                ],
            ),
        ),
        (
            "a parse error is rejected, the plan and generation kept",
            with(
                started(TS2),
                vec![
                    step(5, policy(TYPO, false), &["PolicyRejected"], |s, before| {
                        let e = s.policy_error.as_deref().expect("policy_error set");
                        assert!(e.contains("replica"), "{e}");
                        assert_eq!(s.generation, 1);
                        assert!(s.policy.is_some());
                        plan_kept(s, before);
                    }),
                    // The same broken bytes again: nothing new to say.
                    step(6, policy(TYPO, false), &[], plan_kept),
                    // A good one clears the error.
                    step(7, policy(TS2, false), &["PolicyApplied(2)"], |s, before| {
                        assert_eq!(s.policy_error, None);
                        plan_kept(s, before);
                    }),
                ],
            ),
        ),
        (
            "an unreadable policy keeps the last good one; readable again, it applies",
            with(
                started(TS2),
                vec![
                    step(
                        5,
                        Input::PolicyUnreadable {
                            path: PathBuf::from("/etc/slicelet/config.yaml"),
                            error: "reading /etc/slicelet/config.yaml: permission denied".into(),
                        },
                        &[],
                        |s, before| {
                            assert!(s.policy_error.as_deref().unwrap().contains("permission"));
                            assert_eq!(s.generation, 1);
                            assert!(s.policy.is_some());
                            plan_kept(s, before);
                        },
                    ),
                    // The same bytes as before the failure are read again (not skipped as
                    // "unchanged"), so the error clears.
                    step(6, policy(TS2, false), &["PolicyApplied(2)"], |s, before| {
                        assert_eq!(s.policy_error, None);
                        plan_kept(s, before);
                    }),
                ],
            ),
        ),
        (
            "a policy rejected for this node is kept and applied when a discovery fits",
            vec![
                step(0, discovered(mig_node(false)), &[], nothing),
                step(0, policy(TS2, true), &["PolicyApplied(1)", "Publish"], |s, _| {
                    assert_eq!(s.plan.resources.len(), 1);
                }),
                step(5, policy(MIG_SINGLE, false), &["PolicyRejected"], |s, before| {
                    let e = s.policy_error.as_deref().unwrap();
                    assert!(e.contains("migStrategy: single"), "{e}");
                    assert_eq!(s.generation, 1);
                    assert_eq!(
                        s.policy.as_ref().map(|p| p.mig_strategy),
                        Some(crate::policy::MigStrategy::None)
                    );
                    plan_kept(s, before);
                }),
                // The same node again: still does not fit, nothing happens.
                step(6, discovered(mig_node(false)), &[], plan_kept),
                step(
                    7,
                    discovered(mig_node(true)),
                    &["PolicyApplied(2)", "Publish"],
                    |s, _| {
                        assert_eq!(s.generation, 2);
                        assert_eq!(s.policy_error, None);
                        assert_eq!(
                            s.policy.as_ref().map(|p| p.mig_strategy),
                            Some(crate::policy::MigStrategy::Single)
                        );
                        // Every MIG device as nvidia.com/gpu.
                        assert_eq!(
                            plan_view(s),
                            [("nvidia.com/gpu".to_string(), 4, vec![])]
                        );
                    },
                ),
            ],
        ),
    ];
    for (name, steps) in cases {
        run(name, steps);
    }
}

#[test]
fn health_table() {
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "a critical Xid turns exactly that GPU's replicas Unhealthy",
            with(
                started(TS2),
                vec![step(
                    10,
                    xid(&gpu(1), 79),
                    &[
                        &format!("Xid({}, 79)", gpu(1)),
                        &format!("Transition({}, Unhealthy)", gpu(1)),
                        "Publish",
                    ],
                    |s, _| {
                        gpu1_down_ts2(s, &Arc::default());
                        assert_eq!(s.xid_events, 1);
                    },
                )],
            ),
        ),
        (
            "a non-critical Xid is counted only",
            with(
                started(TS2),
                vec![step(
                    10,
                    xid(&gpu(1), 13),
                    &[&format!("Xid({}, 13)", gpu(1))],
                    |s, before| {
                        plan_kept(s, before);
                        assert_eq!(s.xid_events, 1);
                        assert!(s.tracker.is_healthy(&gpu(1)));
                    },
                )],
            ),
        ),
        (
            "recovery: nothing before the quiet period, one probe after, healthy when it answers",
            with(
                started(TS2_RECOVER_100),
                vec![
                    step(
                        10,
                        xid(&gpu(1), 79),
                        &[
                            &format!("Xid({}, 79)", gpu(1)),
                            &format!("Transition({}, Unhealthy)", gpu(1)),
                            "Publish",
                        ],
                        |s, _| {
                            assert!(s.next_deadline().is_some());
                        },
                    ),
                    step(109, Input::RecoveryDue, &[], gpu1_down_ts2),
                    step(
                        110,
                        Input::RecoveryDue,
                        &[&format!("Probe([{:?}])", gpu(1))],
                        |s, _| {
                            // While probing, the only deadline is the probe's timeout.
                            assert!(s.next_deadline().is_some_and(|t| {
                                t > Instant::now() + PROBE_TIMEOUT - Duration::from_secs(120)
                            }));
                        },
                    ),
                    // Not again while the probe is in flight.
                    step(111, Input::RecoveryDue, &[], gpu1_down_ts2),
                    step(
                        112,
                        Input::Probed(vec![(gpu(1), true)]),
                        &[&format!("Transition({}, Healthy)", gpu(1)), "Publish"],
                        |s, _| {
                            all_healthy_ts2(s, &Arc::default());
                            assert_eq!(s.next_deadline(), None);
                        },
                    ),
                ],
            ),
        ),
        (
            "a probe that fails keeps the GPU Unhealthy and starts a new quiet period",
            with(
                started(TS2_RECOVER_100),
                vec![
                    step(
                        10,
                        xid(&gpu(1), 79),
                        &[
                            &format!("Xid({}, 79)", gpu(1)),
                            &format!("Transition({}, Unhealthy)", gpu(1)),
                            "Publish",
                        ],
                        nothing,
                    ),
                    step(
                        110,
                        Input::RecoveryDue,
                        &[&format!("Probe([{:?}])", gpu(1))],
                        nothing,
                    ),
                    step(
                        111,
                        Input::Probed(vec![(gpu(1), false)]),
                        &[],
                        |s, before| {
                            plan_kept(s, before);
                            gpu1_down_ts2(s, before);
                            assert!(!s.tracker.is_healthy(&gpu(1)));
                        },
                    ),
                    step(210, Input::RecoveryDue, &[], nothing),
                    step(
                        211,
                        Input::RecoveryDue,
                        &[&format!("Probe([{:?}])", gpu(1))],
                        nothing,
                    ),
                ],
            ),
        ),
        (
            "a later Xid of another number while Unhealthy: no new plan, the cause follows it",
            with(
                started(TS2),
                vec![
                    step(
                        10,
                        xid(&gpu(1), 79),
                        &[
                            &format!("Xid({}, 79)", gpu(1)),
                            &format!("Transition({}, Unhealthy)", gpu(1)),
                            "Publish",
                        ],
                        |s, _| {
                            assert_eq!(s.tracker.cause(&gpu(1)), Some(Cause::Xid(79)));
                        },
                    ),
                    step(
                        20,
                        xid(&gpu(1), 48),
                        &[&format!("Xid({}, 48)", gpu(1)), "Causes"],
                        |s, before| {
                            plan_kept(s, before);
                            assert_eq!(s.tracker.cause(&gpu(1)), Some(Cause::Xid(48)));
                            assert_eq!(s.tracker.reason(&gpu(1)), Some("xid 48"));
                        },
                    ),
                    // The same Xid again changes no cause.
                    step(
                        30,
                        xid(&gpu(1), 48),
                        &[&format!("Xid({}, 48)", gpu(1))],
                        plan_kept,
                    ),
                ],
            ),
        ),
        (
            "a failed re-discovery keeps the inventory",
            with(
                started(TS2),
                vec![
                    step(
                        10,
                        Input::Discovered(Err(InventoryError::NvmlCount(
                            "driver not loaded".into(),
                        ))),
                        &[],
                        |s, before| {
                            plan_kept(s, before);
                            assert_eq!(s.inventory.as_ref(), Some(&test_node(2)));
                            assert_eq!(s.discovery_error, None, "an inventory is there");
                            let why = s.rediscovery_error.as_deref().unwrap_or_default();
                            assert!(why.contains("driver not loaded"), "{why:?}");
                        },
                    ),
                    // The same inventory again clears the note and changes nothing else.
                    step(20, discovered(test_node(2)), &[], |s, before| {
                        plan_kept(s, before);
                        assert_eq!(s.rediscovery_error, None);
                    }),
                ],
            ),
        ),
        (
            "discovery marking a GPU unusable turns its devices Unhealthy, and back",
            with(
                started(TS2),
                vec![
                    step(
                        10,
                        discovered({
                            let mut inv = test_node(2);
                            inv.gpus[1].health = Health::Unhealthy;
                            inv
                        }),
                        &[&format!("Transition({}, Unhealthy)", gpu(1)), "Publish"],
                        gpu1_down_ts2,
                    ),
                    step(
                        20,
                        discovered(test_node(2)),
                        &[&format!("Transition({}, Healthy)", gpu(1)), "Publish"],
                        all_healthy_ts2,
                    ),
                ],
            ),
        ),
        (
            "an MPS policy wants the daemons; their devices are Unhealthy until each is ready",
            vec![
                step(0, discovered(test_node(2)), &[], nothing),
                step(
                    0,
                    policy(MPS2, true),
                    &[
                        "PolicyApplied(1)",
                        &format!("Transition({}, Unhealthy)", gpu(0)),
                        &format!("Transition({}, Unhealthy)", gpu(1)),
                        &format!("WantMps([{:?}, {:?}])", gpu(0), gpu(1)),
                        "Publish",
                    ],
                    |s, _| {
                        assert_eq!(
                            plan_view(s),
                            [("nvidia.com/gpu-mps".to_string(), 4, vec![gpu(0), gpu(1)])]
                        );
                    },
                ),
                step(
                    1,
                    mps_ready(&gpu(0), true),
                    &[&format!("Transition({}, Healthy)", gpu(0)), "Publish"],
                    |s, _| {
                        assert_eq!(
                            plan_view(s),
                            [("nvidia.com/gpu-mps".to_string(), 4, vec![gpu(1)])]
                        );
                        assert_eq!(s.tracker.health(&gpu(1)), Health::Unhealthy);
                    },
                ),
                step(
                    2,
                    mps_ready(&gpu(1), true),
                    &[&format!("Transition({}, Healthy)", gpu(1)), "Publish"],
                    |s, _| {
                        assert_eq!(
                            plan_view(s),
                            [("nvidia.com/gpu-mps".to_string(), 4, vec![])]
                        );
                    },
                ),
                // A daemon that stops being ready takes its devices down again.
                step(
                    3,
                    mps_ready(&gpu(1), false),
                    &[&format!("Transition({}, Unhealthy)", gpu(1)), "Publish"],
                    |s, _| {
                        assert_eq!(
                            plan_view(s),
                            [("nvidia.com/gpu-mps".to_string(), 4, vec![gpu(1)])]
                        );
                    },
                ),
            ],
        ),
    ];
    for (name, steps) in cases {
        run(name, steps);
    }
}

/// Regression (review): a policy waiting for other GPUs made a discovery skip the re-plan, so a
/// GPU discovery reported unusable stayed advertised Healthy.
#[test]
fn a_waiting_policy_does_not_stop_the_plan_from_following_the_gpus() {
    let t0 = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(mig_node(false)), t0);
    s.fold(policy(TS2, true), t0);
    s.fold(policy(MIG_SINGLE, false), t0);
    assert!(s.rejected_for_node.is_some());
    let mut inv = mig_node(false);
    inv.gpus[1].health = Health::Unhealthy;
    s.fold(discovered(inv), t0);
    let sick: Vec<_> = plan_view(&s).into_iter().flat_map(|(_, _, u)| u).collect();
    assert!(sick.contains(&gpu(1)), "{:?}", plan_view(&s));
}

/// Regression (review): a policy that did not fit, replaced in the file by a broken one (or
/// the file deleted), was applied when the GPUs later changed.
#[test]
fn a_policy_no_longer_in_the_file_is_never_applied() {
    let t0 = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(mig_node(false)), t0);
    s.fold(policy(TS2, true), t0);
    s.fold(policy(MIG_SINGLE, false), t0);
    s.fold(policy(TYPO, false), t0);
    s.fold(
        Input::PolicyUnreadable {
            path: "/etc/slicelet/config.yaml".into(),
            error: "gone".into(),
        },
        t0,
    );
    s.fold(discovered(mig_node(true)), t0);
    assert_eq!(
        s.policy.as_ref().map(|p| p.mig_strategy),
        Some(crate::policy::MigStrategy::None)
    );
    assert!(s.policy_error.is_some());
}

/// Regression (review): a probe answer that never arrived (its report dropped) left `probing`
/// set, so no device recovered again. After the probe timeout the recovery is tried again.
#[test]
fn a_lost_probe_answer_is_retried_after_the_timeout() {
    let t0 = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(crate::inventory::test_node(2)), t0);
    s.fold(policy(TS2, true), t0);
    let uuid = s.inventory.as_ref().unwrap().gpus[1].uuid.clone();
    s.fold(
        Input::Health(HealthEvent::Xid {
            uuid: uuid.clone(),
            xid: 79,
        }),
        t0,
    );
    let due = t0 + crate::health_tracker::DEFAULT_RECOVERY;
    let probe = |a: &[Action]| a.iter().any(|a| matches!(a, Action::Probe(_)));
    assert!(probe(&s.fold(Input::RecoveryDue, due)));
    assert!(!probe(
        &s.fold(Input::RecoveryDue, due + Duration::from_secs(1))
    ));
    assert_eq!(s.next_deadline(), Some(due + PROBE_TIMEOUT));
    assert!(probe(&s.fold(Input::RecoveryDue, due + PROBE_TIMEOUT)));
}

/// [`TS2`] handed out as CDI names (`cdi-cri`).
const TS2_CDI: &str = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 2\n";

/// A CDI spec index of kind `nvidia.com/gpu` naming `test_node`'s GPUs `gpus` by UUID.
fn cdi_specs(gpus: &[u32]) -> Input {
    let dir = PathBuf::from("/var/run/cdi");
    let mut index = cdi::SpecIndex::new(std::slice::from_ref(&dir));
    let spec = cdi::Spec {
        kind: "nvidia.com/gpu".into(),
        devices: gpus.iter().map(|&i| gpu(i)).collect(),
    };
    index.add(0, &dir.join("nvidia.yaml"), &spec);
    Input::CdiSpecs(index)
}

#[test]
fn a_cdi_name_that_does_not_resolve_holds_its_device_unhealthy() {
    run(
        "cdi",
        vec![
            step(0, discovered(test_node(2)), &[], nothing),
            // Every published plan asks for a CDI check while a cdi-* strategy is on.
            step(
                0,
                policy(TS2_CDI, true),
                &["PolicyApplied(1)", "Publish", "CheckCdi"],
                all_healthy_ts2,
            ),
            step(1, cdi_specs(&[0, 1]), &[], plan_kept),
            // GPU 1's name is gone from the spec: Unhealthy with the reason, and checked again
            // with the new plan.
            step(
                2,
                cdi_specs(&[0]),
                &[
                    &format!("Transition({}, Unhealthy)", gpu(1)),
                    "Publish",
                    "CheckCdi",
                ],
                |s, _| {
                    gpu1_down_ts2(s, &Arc::default());
                    let reason = s.tracker.reason(&gpu(1)).unwrap();
                    assert!(
                        reason.contains(&format!("nvidia.com/gpu={} is not defined", gpu(1))),
                        "{reason}"
                    );
                },
            ),
            step(3, cdi_specs(&[0]), &[], plan_kept),
            // Back in the spec: Healthy again.
            step(
                4,
                cdi_specs(&[0, 1]),
                &[
                    &format!("Transition({}, Healthy)", gpu(1)),
                    "Publish",
                    "CheckCdi",
                ],
                all_healthy_ts2,
            ),
            step(
                5,
                cdi_specs(&[]),
                &[
                    &format!("Transition({}, Unhealthy)", gpu(0)),
                    &format!("Transition({}, Unhealthy)", gpu(1)),
                    "Publish",
                    "CheckCdi",
                ],
                nothing,
            ),
            // A policy without cdi-* releases the condition and asks for no more checks.
            step(
                6,
                policy(TS2, false),
                &[
                    "PolicyApplied(2)",
                    &format!("Transition({}, Healthy)", gpu(0)),
                    &format!("Transition({}, Healthy)", gpu(1)),
                    "Publish",
                ],
                all_healthy_ts2,
            ),
            // A late answer for the old policy changes nothing.
            step(7, cdi_specs(&[]), &[], plan_kept),
        ],
    );
}

#[test]
fn cdi_names_use_the_nodes_kind() {
    let t0 = Instant::now();
    let mut state = State::new(HealthEnv::default()).with_cdi_kind("example.com/gpu");
    state.fold(discovered(test_node(2)), t0);
    state.fold(policy(TS2_CDI, true), t0);
    let res = &state.plan.resources["nvidia.com/gpu-shared"];
    assert_eq!(res.delivery.cdi_kind, "example.com/gpu");
    // The spec names nvidia.com/gpu devices: none of this kind resolves.
    let got = summary(&state.fold(cdi_specs(&[0, 1]), t0));
    assert_eq!(
        got.iter().filter(|a| a.contains("Unhealthy")).count(),
        2,
        "{got:?}"
    );
}

/// Four replicas per GPU of `nvidia.com/gpu`.
const TS4_GPU: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
/// Two replicas per GPU of `nvidia.com/gpu`.
const TS2_GPU: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";

fn holding(ids: &[&str]) -> crate::in_use::InUse {
    let mut u = crate::in_use::InUse::default();
    for id in ids {
        u.insert(
            "nvidia.com/gpu",
            id,
            crate::in_use::Holder {
                namespace: "ml".into(),
                pod: "llm-0".into(),
                container: "main".into(),
            },
        );
    }
    u
}

fn ids(s: &State) -> Vec<(String, &'static str)> {
    s.plan.resources["nvidia.com/gpu"]
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.as_str()))
        .collect()
}

/// A reload that would withdraw devices waits for a fresh pod-resources answer, then keeps
/// what it says is held; the periodic answer that the holder is gone withdraws it.
#[test]
fn a_withdrawing_reload_asks_what_is_in_use_first() {
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default()).with_in_use_source();
    s.fold(discovered(test_node(1)), t);
    let held3 = format!("{}::3", gpu(0));
    assert_eq!(
        summary(&s.fold(Input::InUse(Ok(holding(&[&held3]))), t)),
        ["InUseChanged"]
    );
    assert_eq!(
        summary(&s.fold(policy(TS4_GPU, true), t)),
        ["PolicyApplied(1)", "Publish"]
    );
    let four = Arc::clone(&s.plan);
    // 4 → 2: the plan withdraws ::2 and ::3, so it waits for an answer (asked once).
    assert_eq!(
        summary(&s.fold(policy(TS2_GPU, false), t)),
        ["PolicyApplied(2)", "RefreshInUse"]
    );
    assert!(
        Arc::ptr_eq(&s.plan, &four),
        "nothing published before the answer"
    );
    // A health change meanwhile does not ask twice.
    assert_eq!(
        summary(&s.fold(xid(&gpu(0), 13), t)),
        [format!("Xid({}, 13)", gpu(0))]
    );
    // The answer: ::3 is still held.
    assert_eq!(
        summary(&s.fold(Input::InUse(Ok(holding(&[&held3]))), t)),
        ["Publish", "InUseChanged"]
    );
    assert_eq!(
        ids(&s),
        [
            (format!("{}::0", gpu(0)), "Unhealthy"),
            (format!("{}::1", gpu(0)), "Unhealthy"),
            (held3.clone(), "Healthy"),
        ]
    );
    // The same answer again (the periodic refresh): nothing to do.
    assert!(s.fold(Input::InUse(Ok(holding(&[&held3]))), t).is_empty());
    // Released: withdrawn at once (the answer is the fresh read).
    assert_eq!(
        summary(&s.fold(Input::InUse(Ok(holding(&[]))), t)),
        ["Publish", "InUseChanged"]
    );
    assert_eq!(
        ids(&s),
        [
            (format!("{}::0", gpu(0)), "Healthy"),
            (format!("{}::1", gpu(0)), "Healthy"),
        ]
    );
}

/// The error a read of a missing pod-resources socket answers.
fn socket_missing() -> crate::podres::client::PodResourcesError {
    crate::podres::client::PodResourcesError::Missing {
        path: "/pr.sock".into(),
    }
}

/// pod-resources failing while a plan waits: the last answer decides (no deadlock), and the
/// error is kept for `/readyz` and the logs.
#[test]
fn a_failed_read_applies_the_plan_with_the_last_answer() {
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default()).with_in_use_source();
    s.fold(discovered(test_node(1)), t);
    s.fold(policy(TS4_GPU, true), t);
    assert_eq!(
        summary(&s.fold(policy(TS2_GPU, false), t)),
        ["PolicyApplied(2)", "RefreshInUse"]
    );
    assert_eq!(
        summary(&s.fold(Input::InUse(Err(socket_missing())), t)),
        ["Publish", "InUseChanged"]
    );
    assert_eq!(ids(&s).len(), 2);
    assert_eq!(
        s.in_use_error.as_deref(),
        Some("pod-resources socket /pr.sock does not exist (mount /var/lib/kubelet/pod-resources)")
    );
    // Not waiting: a failed periodic read changes nothing.
    assert!(s.fold(Input::InUse(Err(socket_missing())), t).is_empty());
}

/// Without a pod-resources socket nothing waits: the reload applies at once.
#[test]
fn without_a_source_nothing_waits() {
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(test_node(1)), t);
    s.fold(policy(TS4_GPU, true), t);
    assert_eq!(
        summary(&s.fold(policy(TS2_GPU, false), t)),
        ["PolicyApplied(2)", "Publish"]
    );
}

// ---- regression tests for defects a hostile review found (each failed before its fix; the
// comments say what went wrong then) ----

#[test]
fn moving_a_resource_from_the_device_plugin_to_dra_withdraws_its_devices() {
    // The device-plugin servers skip DRA resources: the same devices with `dra` set are
    // withdrawn from the kubelet, so the plan must wait for pod-resources first.
    let inv = test_node(1);
    let dp = crate::plan::build(&crate::policy::parse("version: v1\n").unwrap(), &inv)
        .unwrap()
        .plan;
    let dra = crate::plan::build(
        &crate::policy::parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap(),
        &inv,
    )
    .unwrap()
    .plan;
    assert!(dra.resources["nvidia.com/gpu"].dra);
    assert!(
        withdraws(&dp, &dra),
        "nvidia.com/gpu leaves the device plugin, yet the plan does not ask what is in use"
    );
}

#[test]
fn an_mps_daemon_stays_wanted_while_a_client_holds_one_of_its_replicas() {
    // nvidia.com/gpu shared by 2 MPS clients, GPU 0's ::0 held. The policy drops MPS (whole
    // GPUs). The drain rules keep ::0 advertised for its holder, but the fold tells the MPS
    // supervisor at once (before even asking pod-resources) that GPU 0's daemon is no longer
    // wanted, and the supervisor `quit`s it and removes its pipe directory: the running
    // client loses its MPS server.
    const MPS2_GPU: &str = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default()).with_in_use_source();
    s.fold(discovered(test_node(1)), t);
    let held0 = format!("{}::0", gpu(0));
    s.fold(Input::InUse(Ok(holding(&[&held0]))), t);
    let first = summary(&s.fold(policy(MPS2_GPU, true), t));
    assert!(
        first.contains(&format!("WantMps([{:?}])", gpu(0))),
        "{first:?}"
    );
    let mut all = summary(&s.fold(policy("version: v1\n", false), t));
    all.extend(summary(&s.fold(Input::InUse(Ok(holding(&[&held0]))), t)));
    assert!(
        s.plan.resources["nvidia.com/gpu"].device(&held0).is_some(),
        "the held MPS replica is retained"
    );
    assert!(
        !all.iter().any(|a| a == "WantMps([])"),
        "GPU 0's MPS daemon is stopped while its client runs: {all:?}"
    );
}

/// A kubelet before 1.34 reports no claims, so the DRA checkpoint is the only record of DRA
/// holders: with it folded in, time-slicing → MPS under a time-sliced claim drains GPU 0's
/// new devices (without it, no holder was known and an MPS claim could be prepared there).
#[test]
fn the_dra_checkpoint_is_the_record_of_claim_holders() {
    const TS2_DRA: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n";
    const MPS2_DRA: &str = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n";
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(test_node(1)), t);
    s.fold(policy(TS2_DRA, true), t);
    let held0 = format!("{}::0", gpu(0));
    let holder = crate::in_use::Holder {
        namespace: "ns".into(),
        pod: "claim:one".into(),
        container: String::new(),
    };
    s.fold(
        Input::DraPrepared(std::collections::BTreeMap::from([(
            crate::plan::dra_names::device_name(&held0),
            vec![holder],
        )])),
        t,
    );
    s.fold(policy(MPS2_DRA, false), t);
    // (Both are Unhealthy until GPU 0's MPS daemon is ready; ::1 also drains.)
    assert_eq!(
        s.plan.drain.draining["nvidia.com/gpu"].len(),
        1,
        "{:?}",
        s.plan.drain
    );
    assert_eq!(
        s.plan.drain.draining["nvidia.com/gpu"][&format!("{}::1", gpu(0))],
        "draining: held by ns/claim:one"
    );
}

#[test]
fn an_mps_limit_change_is_pending_only_while_its_daemon_reports_one() {
    let t = Instant::now();
    let mut s = State::new(HealthEnv::default());
    s.fold(discovered(test_node(1)), t);
    s.fold(policy(MPS2, true), t);
    let limits = |threads| crate::plan::MpsLimits {
        active_thread_percentage: threads,
        pinned_memory_mib: 0,
    };
    let event = |pending: Option<crate::plan::MpsLimits>, removed: bool| {
        Input::Mps(mps::Event {
            uuid: gpu(0),
            ready: true,
            applied: Some(limits(50)),
            pending,
            removed,
        })
    };
    s.fold(event(Some(limits(25)), false), t);
    assert!(
        s.mps_pending.contains(&gpu(0)),
        "the change waits for clients"
    );
    s.fold(event(None, false), t);
    assert!(s.mps_pending.is_empty(), "applied, nothing pending");
    s.fold(event(Some(limits(25)), false), t);
    s.fold(event(Some(limits(25)), true), t);
    assert!(
        s.mps_pending.is_empty(),
        "a removed daemon has nothing pending"
    );
    assert!(!s.mps_applied.contains_key(&gpu(0)));
}

#[test]
fn a_resource_the_new_plan_drops_is_withdrawn_only_when_it_advertised_devices() {
    let plan = |text: &str, gpus: u32| {
        crate::plan::build(&crate::policy::parse(text).unwrap(), &test_node(gpus))
            .unwrap()
            .plan
    };
    let shared = plan(TS2, 1);
    let whole = plan("version: v1\n", 1);
    assert!(!shared.resources["nvidia.com/gpu-shared"].devices.is_empty());
    assert!(
        withdraws(&shared, &whole),
        "nvidia.com/gpu-shared's replicas are gone from the new plan"
    );
    let mut empty = shared.clone();
    for res in empty.resources.values_mut() {
        Arc::make_mut(res).devices.clear();
    }
    assert!(
        !withdraws(&empty, &whole),
        "a resource with no devices withdraws nothing"
    );
}

/// An H100 in MIG mode with a 3g.40gb at slice 0 and a 1g.10gb at slice 4, partitioned on
/// demand, its MIG devices served as static ones (`migStrategy: mixed`) too.
fn dynamic_mig_state() -> (State, Inventory) {
    let text = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 0\n        - profile: 1g.10gb\n          placementStart: 4\n";
    let inv = crate::inventory::simulated::parse(std::path::Path::new("n.yaml"), text).unwrap();
    let mut s = State::new(HealthEnv::default());
    let now = Instant::now();
    s.fold(discovered(inv.clone()), now);
    s.fold(
        policy(
            "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: [0]\n",
            true,
        ),
        now,
    );
    (s, inv)
}

/// An instance DRA's records hold (created for a claim) is never a static device and its
/// placement stays free for the dynamic device; one held by a prepared claim's device name
/// alone (a record rebuilt from the API) too; the others stay static.
#[test]
fn instances_dra_created_for_claims_are_never_static_devices() {
    let (mut s, inv) = dynamic_mig_state();
    let g0 = inv.gpus[0].uuid.clone();
    let static_resources =
        |s: &State| -> Vec<String> { s.plan.resources.keys().map(|r| r.to_string()).collect() };
    assert_eq!(
        static_resources(&s),
        vec!["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
    );
    let occupied = |s: &State| -> Vec<u32> {
        s.plan.dynamic_mig[0]
            .occupied
            .iter()
            .map(|p| p.start)
            .collect()
    };
    assert_eq!(occupied(&s), vec![0, 4]);
    let now = Instant::now();
    let out = s.fold(Input::DraDynamicMig([(g0.clone(), 0)].into()), now);
    assert!(out.iter().any(|a| matches!(a, Action::Publish(_))));
    assert_eq!(static_resources(&s), vec!["nvidia.com/mig-1g.10gb"]);
    assert_eq!(occupied(&s), vec![4]);
    // A rediscovery keeps it out.
    s.fold(discovered(inv.clone()), now);
    assert_eq!(static_resources(&s), vec!["nvidia.com/mig-1g.10gb"]);
    // Held by name only (the checkpoint rebuilt from the API).
    s.fold(Input::DraDynamicMig(BTreeSet::new()), now);
    let holder = crate::in_use::Holder {
        namespace: "ns".into(),
        pod: "claim:c".into(),
        container: String::new(),
    };
    s.fold(
        Input::DraPrepared([("gpu-0-mig-1g-10gb-4".to_string(), vec![holder])].into()),
        now,
    );
    assert_eq!(occupied(&s), vec![0]);
    assert_eq!(static_resources(&s), vec!["nvidia.com/mig-3g.40gb"]);
}

/// A MIG layout on a held GPU: the GPU's devices are withdrawn (a fresh pod-resources answer
/// first, as for any withdrawing change), the held one stays, and the hardware is asked to
/// change the GPU only once the holder is gone; its answer after the discovery ends `success`.
#[test]
fn a_mig_layout_waits_for_the_holder_then_asks_the_hardware() {
    const BIG: &str = "nvidia.com/mig-3g.40gb";
    let t = Instant::now();
    let mut inv = test_node(1);
    inv.gpus[0].mig_enabled = true;
    inv.gpus[0].mig_geometry =
        crate::inventory::MigGeometry::from_table(&inv.gpus[0].model, inv.gpus[0].memory_mib);
    inv.gpus[0].mig_devices = test_mig(0, &[("3g.40gb", 2)]);
    let held = inv.gpus[0].mig_devices[0].uuid.clone();
    let mut holds = crate::in_use::InUse::default();
    holds.insert(
        BIG,
        &held,
        crate::in_use::Holder {
            namespace: "ml".into(),
            pod: "train-0".into(),
            container: "main".into(),
        },
    );
    let mut s = State::new(HealthEnv::default()).with_in_use_source();
    s.fold(discovered(inv.clone()), t);
    s.fold(Input::InUse(Ok(holds.clone())), t);
    s.fold(
        policy("version: v1\nflags:\n  migStrategy: mixed\n", true),
        t,
    );
    assert_eq!(s.plan.resources[BIG].devices.len(), 2);
    let file = crate::policy::parse_mig_parted(
        "version: v1\nmig-configs:\n  small:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n",
    )
    .unwrap();
    assert!(s
        .fold(Input::MigLayouts(Ok((Arc::new(file), [7; 32]))), t)
        .is_empty());
    assert_eq!(
        summary(&s.fold(Input::MigLayoutName(Some("small".into())), t)),
        ["MigState", "RefreshInUse"]
    );
    // Still held: the free instance is withdrawn, the held one kept; nothing is changed.
    assert_eq!(
        summary(&s.fold(Input::InUse(Ok(holds.clone())), t)),
        ["Publish", "InUseChanged"]
    );
    let left: Vec<&str> = s.plan.resources[BIG]
        .devices
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(left, [held.as_str()]);
    assert!(s.fold(Input::InUse(Ok(holds)), t).is_empty());
    // Released: withdrawn, then the hardware is asked.
    assert_eq!(
        summary(&s.fold(Input::InUse(Ok(Default::default())), t)),
        ["Publish", "InUseChanged", "MigApply(0)"]
    );
    let mut after = inv;
    after.gpus[0].mig_devices = test_mig(0, &[("1g.10gb", 7)]);
    s.fold(discovered(after), t);
    assert_eq!(
        summary(&s.fold(Input::MigApplied(Ok(())), t)),
        ["MigState", "Publish"]
    );
    assert_eq!(s.mig.state, Some(mig::MigConfigState::Success));
    assert_eq!(s.plan.resources["nvidia.com/mig-1g.10gb"].devices.len(), 7);
}

/// A critical Xid on the instance DRA created for a claim makes the dynamic device the claim
/// holds Unhealthy in DRA's input (taint and health stream), that device only; one on the GPU
/// makes every dynamic device of the GPU Unhealthy, published with its taint.
#[test]
fn an_xid_on_a_dynamic_instance_reaches_the_device_its_claim_holds() {
    let (mut s, inv) = dynamic_mig_state();
    let g0 = inv.gpus[0].uuid.clone();
    let created = inv.gpus[0].mig_devices[0].uuid.clone();
    let now = Instant::now();
    s.fold(Input::DraDynamicMig([(g0.clone(), 0)].into()), now);
    s.fold(xid(&created, 79), now);
    let at = std::time::SystemTime::now();
    let plan = Arc::clone(&s.plan);
    let input = super::super::dra_link::dra_input(&s, &plan, None, at);
    let sick: Vec<(&String, Option<Cause>)> = input
        .health
        .iter()
        .filter(|(_, h)| !h.health.is_healthy())
        .map(|(n, h)| (n, h.cause))
        .collect();
    assert_eq!(
        sick,
        [(&"gpu-0-mig-3g-40gb-0".to_string(), Some(Cause::Xid(79)))]
    );
    // An Xid on the GPU: every dynamic device of it, each published with a taint.
    s.fold(xid(&g0, 48), now);
    let plan = Arc::clone(&s.plan);
    let input = super::super::dra_link::dra_input(&s, &plan, Some(&input), at);
    let dynamic: Vec<_> = input
        .health
        .iter()
        .filter(|(n, _)| n.starts_with("gpu-0-mig-"))
        .collect();
    assert!(!dynamic.is_empty());
    assert!(
        dynamic.iter().all(|(_, h)| h.cause == Some(Cause::Xid(48))),
        "{dynamic:?}"
    );
}
