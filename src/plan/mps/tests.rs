use std::collections::BTreeMap;

use super::*;
use crate::inventory::{test_mig, test_node};
use crate::plan::{build, build_with};
use crate::policy::parse;

fn mps_policy(extra: &str) -> Policy {
    parse(&format!(
        "version: v1\nflags:\n  mpsRoot: /tmp/mps\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-mps\n        replicas: 4\n{extra}"
    ))
    .unwrap()
}

#[test]
fn every_gpu_mps_x4_on_two_h100s() {
    let node = test_node(2);
    let built = build(&mps_policy(""), &node).unwrap();
    assert_eq!(built.plan.resources.len(), 1);
    let r = &built.plan.resources["nvidia.com/gpu-mps"];
    assert_eq!(r.strategy, Strategy::Mps);
    assert!(r.fail_requests_greater_than_one);
    let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
    let want: Vec<String> = node
        .gpus
        .iter()
        .flat_map(|g| (0..4).map(move |n| format!("{}::{n}", g.uuid)))
        .collect();
    assert_eq!(ids, want);
    let mps = r.mps.as_ref().unwrap();
    assert_eq!(mps.root, PathBuf::from("/tmp/mps"));
    assert!(!mps.exclusive_process);
    assert_eq!(mps.daemons.len(), 2);
    for g in &node.gpus {
        let d = &mps.daemons[&g.uuid];
        assert_eq!(d.gpu_index, g.index);
        assert_eq!(d.replicas, 4);
        assert!(!d.mig);
        // 81559 MiB / 4 = 20389.75, rounded down; 100 / 4 = 25.
        assert_eq!(
            d.limits,
            MpsLimits {
                active_thread_percentage: 25,
                pinned_memory_mib: 20389
            }
        );
    }
    assert_eq!(
        r.mps_daemon(&format!("{}::3", node.gpus[1].uuid))
            .unwrap()
            .uuid,
        node.gpus[1].uuid
    );
    let wanted = built.plan.mps_wanted();
    assert_eq!(wanted.daemons.len(), 2);
    assert_eq!(wanted.root, PathBuf::from("/tmp/mps"));
    let json = serde_json::to_value(built.plan.view()).unwrap();
    assert_eq!(json["resources"][0]["strategy"], "mps");
    assert_eq!(
        json["resources"][0]["mps"][0],
        serde_json::json!({"uuid": node.gpus[0].uuid, "replicas": 4, "activeThreadPercentage": 25, "pinnedDeviceMemoryLimitMiB": 20389})
    );
}

#[test]
fn memory_limits_must_fit_the_gpu() {
    let node = test_node(1);
    // (limit, fits) on an 81559 MiB GPU with 4 replicas.
    for (limit, fits) in [
        ("20000Mi", true),
        ("20389Mi", true),
        ("20390Mi", false),
        ("20Gi", false),
    ] {
        let p = mps_policy(&format!("        pinnedDeviceMemoryLimit: {limit}\n"));
        match build(&p, &node) {
            Ok(b) => {
                assert!(fits, "{limit} must not fit");
                let r = &b.plan.resources["nvidia.com/gpu-mps"];
                assert_eq!(
                    r.mps.as_ref().unwrap().daemons[&node.gpus[0].uuid]
                        .limits
                        .pinned_memory_mib,
                    p.mps.resources[0].pinned_device_memory_limit_mib.unwrap()
                );
            }
            Err(e) => {
                assert!(!fits, "{limit}: {e}");
                assert!(matches!(e, PlanError::MpsMemory { .. }), "{e}");
            }
        }
    }
    let e = build(
        &mps_policy("        pinnedDeviceMemoryLimit: 20Gi\n"),
        &node,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("sharing.mps.resources[0].pinnedDeviceMemoryLimit: ")
            && e.contains("4 replicas × 20480 MiB = 81920 MiB")
            && e.contains("81559 MiB")
            && e.contains(&node.gpus[0].uuid),
        "{e}"
    );
}

#[test]
fn client_limit_depends_on_compute_capability() {
    let mut node = test_node(2);
    node.gpus[1].compute_capability = Some((6, 0));
    let p = |replicas: u32| {
        parse(&format!(
            "sharing:\n  mps:\n    allowPreVolta: true\n    resources:\n      - name: gpu\n        replicas: {replicas}\n"
        ))
        .unwrap()
    };
    assert!(build(&p(16), &node).is_ok());
    let e = build(&p(17), &node).unwrap_err();
    assert!(
        matches!(
            &e,
            PlanError::MpsClientLimit {
                limit: 16,
                replicas: 17,
                gpu: 1,
                ..
            }
        ),
        "{e}"
    );
    assert!(e
        .to_string()
        .starts_with("sharing.mps.resources[0].replicas: 17 replicas exceed the 16 clients"));
    // Volta and newer (and unknown): 48, enforced by the policy already.
    node.gpus[1].compute_capability = None;
    assert!(build(&p(48), &node).is_ok());
}

#[test]
fn time_slicing_and_mps_on_one_node() {
    let node = test_node(4);
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        devices: [0]\n        replicas: 4\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1, 2]\n        replicas: 2\n";
    let built = build(&parse(text).unwrap(), &node).unwrap();
    let names: Vec<(&str, Strategy, usize)> = built
        .plan
        .resources
        .values()
        .map(|r| (r.name.as_str(), r.strategy, r.devices.len()))
        .collect();
    assert_eq!(
        names,
        [
            ("nvidia.com/gpu", Strategy::None, 1),
            ("nvidia.com/gpu-mps", Strategy::Mps, 4),
            ("nvidia.com/gpu-shared", Strategy::TimeSlicing, 4)
        ]
    );
    let mps = &built.plan.resources["nvidia.com/gpu-mps"];
    assert_eq!(
        mps.mps.as_ref().unwrap().daemons.keys().collect::<Vec<_>>(),
        [&node.gpus[1].uuid, &node.gpus[2].uuid]
    );
    assert!(built.plan.resources["nvidia.com/gpu-shared"].mps.is_none());

    // One GPU claimed by both: an error naming both entries.
    let both = text.replace("devices: [1, 2]", "devices: [2, 0]");
    let e = build(&parse(&both).unwrap(), &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::GpuClaimedTwice {
            gpu: 0,
            uuid: node.gpus[0].uuid.clone(),
            first: "sharing.timeSlicing.resources[0]".into(),
            second: "sharing.mps.resources[0]".into(),
        }
    );
    // Two MPS entries.
    let two = "sharing:\n  mps:\n    resources:\n      - name: gpu\n        rename: a\n        devices: [0, 1]\n        replicas: 2\n      - name: gpu\n        rename: b\n        devices: [1]\n        replicas: 4\n";
    let e = build(&parse(two).unwrap(), &node).unwrap_err().to_string();
    assert!(
        e.contains("sharing.mps.resources[1]")
            && e.contains("already claimed by sharing.mps.resources[0]"),
        "{e}"
    );
    // MPS advertised as nvidia.com/gpu while other GPUs stay whole under that name.
    let clash = "sharing:\n  mps:\n    resources:\n      - name: gpu\n        devices: [0]\n        replicas: 2\n";
    let e = build(&parse(clash).unwrap(), &node).unwrap_err();
    assert!(matches!(e, PlanError::NameCollision { .. }), "{e}");
}

#[test]
fn mps_on_mig_devices_runs_one_daemon_per_slice() {
    // GPU 0 in MIG mode with three 1g.10gb slices and one 3g.40gb; GPU 1 whole.
    let mut node = test_node(2);
    node.gpus[0].mig_enabled = true;
    node.gpus[0].mig_devices = test_mig(0, &[("1g.10gb", 3), ("3g.40gb", 1)]);
    let policy = parse("flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: mig-1g.10gb-mps\n        devices: [\"0:0\", \"0:2\"]\n        replicas: 2\n").unwrap();
    let built = build(&policy, &node).unwrap();
    let r = &built.plan.resources["nvidia.com/mig-1g.10gb-mps"];
    assert_eq!(r.strategy, Strategy::Mps);
    let slices = &node.gpus[0].mig_devices;
    let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            format!("{}::0", slices[0].uuid),
            format!("{}::1", slices[0].uuid),
            format!("{}::0", slices[2].uuid),
            format!("{}::1", slices[2].uuid)
        ]
    );
    // The container gets the MIG device; the daemon runs on it, with the slice's memory.
    assert_eq!(r.devices[0].gpu_uuid, slices[0].uuid);
    assert_eq!(
        r.devices[0].mig.as_ref().unwrap().parent_uuid,
        node.gpus[0].uuid
    );
    let mps = r.mps.as_ref().unwrap();
    assert_eq!(mps.daemons.len(), 2);
    let d = &mps.daemons[&slices[2].uuid];
    assert!(d.mig);
    assert_eq!(d.gpu_uuid, node.gpus[0].uuid);
    assert_eq!(d.limits.active_thread_percentage, 50);
    assert_eq!(d.limits.pinned_memory_mib, slices[2].memory_mib / 2);
    // The unshared slice stays whole under its profile's resource; compute mode is never set on
    // a GPU for its MIG devices.
    assert_eq!(
        built.plan.resources["nvidia.com/mig-1g.10gb"].devices[0].id,
        slices[1].uuid
    );
    let mut wanted = built.plan.mps_wanted();
    wanted.exclusive_process = true;
    assert!(wanted.exclusive_gpus().is_empty());

    // Two entries on one slice: an error naming both.
    let twice = parse("flags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: ts\n        devices: [\"0:1\"]\n        replicas: 2\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: mps\n        devices: [\"0:1\"]\n        replicas: 2\n").unwrap();
    let e = build(&twice, &node).unwrap_err();
    assert!(
        matches!(e, PlanError::MigClaimedTwice { gpu: 0, mig: 1, .. }),
        "{e}"
    );
    // Memory limits are checked against the slice.
    let big = parse("flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: m\n        replicas: 2\n        pinnedDeviceMemoryLimit: 6Gi\n").unwrap();
    let e = build(&big, &node).unwrap_err();
    assert!(matches!(e, PlanError::MpsMemory { .. }), "{e}");
    // Without MIG resources (migStrategy none) the entry is a warning, not an error.
    let none = parse("sharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n").unwrap();
    let built = build(&none, &test_node(1)).unwrap();
    assert!(built.warnings.iter().any(|w| w.contains("mig-1g.10gb")));
    // A MIG target built directly carries the slice.
    let t = MpsTarget::mig(&node.gpus[0], &slices[3]);
    assert_eq!(t.memory_mib, slices[3].memory_mib);
    assert_eq!(t.mig.unwrap().profile, "3g.40gb");
}

#[test]
fn daemon_readiness_folds_into_its_devices_only() {
    let node = test_node(3);
    let text = "flags:\n  mpsRoot: /tmp/mps\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        devices: [0]\n        replicas: 2\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1, 2]\n        replicas: 4\n";
    let policy = parse(text).unwrap();
    let built = build(&policy, &node).unwrap();
    let health = |p: &Plan, r: &str| -> Vec<bool> {
        p.resources[r]
            .devices
            .iter()
            .map(|d| d.health.is_healthy())
            .collect()
    };
    // The tracker holds every wanted daemon Unhealthy until it reports ready.
    let wanted: std::collections::BTreeSet<String> =
        built.plan.mps_wanted().daemons.keys().cloned().collect();
    assert_eq!(
        wanted,
        [node.gpus[1].uuid.clone(), node.gpus[2].uuid.clone()].into()
    );
    let mut tracker = crate::health_tracker::Tracker::new(None);
    let policy_x = crate::health_tracker::XidPolicy::default();
    let now = std::time::Instant::now();
    assert_eq!(tracker.set_mps_wanted(&wanted).len(), 2);
    let p = build(&policy, &tracker.effective(&node)).unwrap().plan;
    assert_eq!(health(&p, "nvidia.com/gpu-mps"), [false; 8]);
    assert_eq!(health(&p, "nvidia.com/gpu-shared"), [true; 2]);
    // GPU 1's daemon ready: exactly its 4 devices Healthy.
    let ready = crate::device_health::HealthEvent::MpsReady {
        uuid: node.gpus[1].uuid.clone(),
        ready: true,
    };
    assert!(tracker.apply(&policy_x, &ready, now).is_some());
    let p = build(&policy, &tracker.effective(&node)).unwrap().plan;
    assert_eq!(
        health(&p, "nvidia.com/gpu-mps"),
        [true, true, true, true, false, false, false, false]
    );
}

#[test]
fn pending_limits_are_advertised_and_over_commit_is_unhealthy() {
    let node = test_node(3);
    let text = "flags:\n  mpsRoot: /tmp/mps\nsharing:\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1, 2]\n        replicas: 4\n";
    let policy = parse(text).unwrap();
    let built = build(&policy, &node).unwrap();
    let health = |p: &Plan| -> Vec<bool> {
        p.resources["nvidia.com/gpu-mps"]
            .devices
            .iter()
            .map(|d| d.health.is_healthy())
            .collect()
    };
    let limits = built.plan.resources["nvidia.com/gpu-mps"]
        .mps
        .as_ref()
        .unwrap()
        .daemons[&node.gpus[1].uuid]
        .limits;
    // Daemons enforcing the planned limits: the plan is the same as without observations.
    let mut applied = BTreeMap::new();
    applied.insert(node.gpus[1].uuid.clone(), limits);
    let p = build_with(&policy, &node, &applied).unwrap().plan;
    assert_eq!(p, built.plan);
    // A pending change: the daemon still enforces old limits, and those are advertised.
    let old = MpsLimits {
        active_thread_percentage: 50,
        pinned_memory_mib: 40000,
    };
    applied.insert(node.gpus[2].uuid.clone(), old);
    let p = build_with(&policy, &node, &applied).unwrap().plan;
    let mps = p.resources["nvidia.com/gpu-mps"].mps.clone().unwrap();
    assert_eq!(mps.daemons[&node.gpus[2].uuid].limits, old);
    assert_eq!(mps.daemons[&node.gpus[1].uuid].limits, limits);
    // Regression: all 4 replicas of GPU 2 stayed allocatable at the old 40000 MiB each (an
    // over-commit of the GPU); only the 2 that fit the planned memory are.
    assert_eq!(
        health(&p),
        [true, true, true, true, true, true, false, false]
    );
}

#[test]
fn dirs_under_the_root() {
    let d = mps_dirs(Path::new("/run/nvidia/mps"), "GPU-x");
    assert_eq!(d.base, PathBuf::from("/run/nvidia/mps/GPU-x"));
    assert_eq!(d.pipe, PathBuf::from("/run/nvidia/mps/GPU-x/pipe"));
    assert_eq!(d.log, PathBuf::from("/run/nvidia/mps/GPU-x/log"));
    assert_eq!(
        d.shm,
        PathBuf::from("/run/nvidia/mps/shm"),
        "one shm shared with the daemons"
    );
    assert_eq!(container_pipe_dir("GPU-x"), "/mps/GPU-x/pipe");
}

// --- mutation-testing gaps ---

#[test]
fn memory_that_fills_the_gpu_exactly_fits() {
    // 1 replica × 81559 MiB on an 81559 MiB GPU: the whole GPU, not more.
    let node = test_node(1);
    let text = "sharing:\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        replicas: 1\n        pinnedDeviceMemoryLimit: 81559Mi\n";
    assert!(build(&parse(text).unwrap(), &node).is_ok());
    let over = text.replace("81559Mi", "81560Mi");
    assert!(matches!(
        build(&parse(&over).unwrap(), &node),
        Err(PlanError::MpsMemory { .. })
    ));
}

#[test]
fn volta_gets_the_full_client_limit() {
    // Compute capability 7.0 (Volta) is the first with 48 clients per daemon (NVIDIA's MPS
    // documentation); 6.x has 16.
    let mut node = test_node(1);
    node.gpus[0].compute_capability = Some((7, 0));
    let p = parse("sharing:\n  mps:\n    resources:\n      - name: gpu\n        replicas: 48\n")
        .unwrap();
    assert!(build(&p, &node).is_ok());
}

#[test]
fn an_unhealthy_mig_device_makes_only_its_mps_devices_unhealthy() {
    let mut node = test_node(1);
    node.gpus[0].mig_enabled = true;
    node.gpus[0].mig_devices = test_mig(0, &[("3g.40gb", 2)]);
    node.gpus[0].mig_devices[1].health = Health::Unhealthy;
    let policy = parse("flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-3g.40gb\n        rename: m\n        replicas: 2\n").unwrap();
    let built = build(&policy, &node).unwrap();
    let health: Vec<bool> = built.plan.resources["nvidia.com/m"]
        .devices
        .iter()
        .map(|d| d.health.is_healthy())
        .collect();
    assert_eq!(health, [true, true, false, false]);
}

#[test]
fn an_mps_list_over_the_kubelets_message_limit_is_refused() {
    // 48 replicas of GPUs with 220-character UUIDs: about 11 KB of ListAndWatch per GPU, so
    // 420 GPUs pass the 4 MiB the kubelet reads and 100 stay well under it.
    let long_uuids = |n: u32| {
        let mut node = test_node(n);
        for g in &mut node.gpus {
            g.uuid = format!("GPU-{:08}-{}", g.index, "a".repeat(207));
        }
        node
    };
    let policy = parse(
        "version: v1\nflags:\n  mpsRoot: /tmp/mps\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-mps\n        replicas: 48\n",
    )
    .unwrap();
    let built = build(&policy, &long_uuids(100)).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/gpu-mps"].devices.len(),
        4800
    );
    match build(&policy, &long_uuids(420)).unwrap_err() {
        PlanError::MessageTooLarge {
            resource,
            bytes,
            limit,
            ..
        } => {
            assert_eq!(resource, "nvidia.com/gpu-mps");
            assert_eq!(limit, MAX_LIST_BYTES);
            assert!(bytes > MAX_LIST_BYTES as u64, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
}
