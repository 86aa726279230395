use std::collections::BTreeMap;

use super::*;
use crate::inventory::test_node;
use crate::plan::build;
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
            "sharing:\n  mps:\n    resources:\n      - name: gpu\n        replicas: {replicas}\n"
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
fn mps_on_a_mig_device_gets_the_slice_memory() {
    let node = test_node(1);
    let g = &node.gpus[0];
    let slice = MigDevice {
        index: 0,
        uuid: "MIG-11111111-2222-3333-4444-555555555555".into(),
        profile: "1g.10gb".into(),
        memory_mib: 9728,
    };
    let policy = parse("sharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n").unwrap();
    let entry = &policy.mps.resources[0];
    let target = MpsTarget::mig(g, &slice);
    assert_eq!(target.memory_mib, 9728);
    let r = mps_resource(&entry.shared.advertised, entry, &[target], &policy).unwrap();
    let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [format!("{}::0", slice.uuid), format!("{}::1", slice.uuid)]
    );
    assert!(r.devices.iter().all(|d| d.gpu_uuid == g.uuid));
    let d = &r.mps.as_ref().unwrap().daemons[&slice.uuid];
    assert!(d.mig);
    assert_eq!(d.gpu_uuid, g.uuid);
    assert_eq!(d.limits.pinned_memory_mib, 4864);
    assert_eq!(d.limits.active_thread_percentage, 50);
    // On a node without MIG resources the entry is a warning, not an error.
    let built = build(&policy, &node).unwrap();
    assert!(built.warnings.iter().any(|w| w.contains("mig-1g.10gb")));
}

#[test]
fn daemon_health_folds_into_its_devices_only() {
    let node = test_node(3);
    let text = "flags:\n  mpsRoot: /tmp/mps\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        devices: [0]\n        replicas: 2\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1, 2]\n        replicas: 4\n";
    let built = build(&parse(text).unwrap(), &node).unwrap();
    let health = |p: &Plan, r: &str| -> Vec<bool> {
        p.resources[r].devices.iter().map(|d| d.healthy).collect()
    };
    // Nothing observed yet: every MPS device Unhealthy, time-sliced ones untouched.
    let mut p = built.plan.clone();
    p.apply_mps_observations(&BTreeMap::new());
    assert_eq!(health(&p, "nvidia.com/gpu-mps"), [false; 8]);
    assert_eq!(health(&p, "nvidia.com/gpu-shared"), [true; 2]);
    assert!(Arc::ptr_eq(
        &p.resources["nvidia.com/gpu-shared"],
        &built.plan.resources["nvidia.com/gpu-shared"]
    ));
    // GPU 1's daemon ready: exactly its 4 devices Healthy.
    let limits = built.plan.resources["nvidia.com/gpu-mps"]
        .mps
        .as_ref()
        .unwrap()
        .daemons[&node.gpus[1].uuid]
        .limits;
    let mut observed = BTreeMap::new();
    observed.insert(
        node.gpus[1].uuid.clone(),
        MpsObserved {
            ready: true,
            applied: Some(limits),
        },
    );
    let mut p = built.plan.clone();
    p.apply_mps_observations(&observed);
    assert_eq!(
        health(&p, "nvidia.com/gpu-mps"),
        [true, true, true, true, false, false, false, false]
    );
    // Both ready with their planned limits: the plan is unchanged (same Arc).
    observed.insert(
        node.gpus[2].uuid.clone(),
        MpsObserved {
            ready: true,
            applied: None,
        },
    );
    let mut p = built.plan.clone();
    p.apply_mps_observations(&observed);
    assert!(Arc::ptr_eq(
        &p.resources["nvidia.com/gpu-mps"],
        &built.plan.resources["nvidia.com/gpu-mps"]
    ));
    // A pending change: the daemon still enforces old limits, and those are advertised.
    let old = MpsLimits {
        active_thread_percentage: 50,
        pinned_memory_mib: 40000,
    };
    observed.get_mut(&node.gpus[2].uuid).unwrap().applied = Some(old);
    let mut p = built.plan.clone();
    p.apply_mps_observations(&observed);
    let mps = p.resources["nvidia.com/gpu-mps"].mps.clone().unwrap();
    assert_eq!(mps.daemons[&node.gpus[2].uuid].limits, old);
    assert_eq!(mps.daemons[&node.gpus[1].uuid].limits, limits);
    assert_eq!(health(&p, "nvidia.com/gpu-mps"), [true; 8]);
}

#[test]
fn dirs_under_the_root() {
    let d = mps_dirs(Path::new("/run/nvidia/mps"), "GPU-x");
    assert_eq!(d.base, PathBuf::from("/run/nvidia/mps/GPU-x"));
    assert_eq!(d.pipe, PathBuf::from("/run/nvidia/mps/GPU-x/pipe"));
    assert_eq!(d.log, PathBuf::from("/run/nvidia/mps/GPU-x/log"));
    assert_eq!(d.shm, PathBuf::from("/run/nvidia/mps/GPU-x/shm"));
    assert_eq!(container_pipe_dir("GPU-x"), "/mps/GPU-x/pipe");
}
