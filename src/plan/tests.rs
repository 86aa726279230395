use super::*;
use crate::inventory::test_node;
use crate::policy::parse;

fn policy(ts: &str) -> Policy {
    parse(&format!("version: v1\nsharing:\n  timeSlicing:\n{ts}")).unwrap()
}

fn counts(built: &Built) -> Vec<(String, usize)> {
    built
        .plan
        .resources
        .values()
        .map(|r| (r.name.to_string(), r.devices.len()))
        .collect()
}

#[test]
fn table_of_policies_on_an_8_gpu_node() {
    let node = test_node(8);
    let cases: &[(&str, &[(&str, usize)])] = &[
        ("    resources: []\n", &[("nvidia.com/gpu", 8)]),
        (
            "    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n",
            &[("nvidia.com/gpu-shared", 32)],
        ),
        (
            "    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n",
            &[("nvidia.com/gpu", 32)],
        ),
        (
            "    renameByDefault: true\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 10\n",
            &[("nvidia.com/gpu.shared", 80)],
        ),
        (
            "    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        devices: [1]\n        replicas: 4\n",
            &[("nvidia.com/gpu", 7), ("nvidia.com/gpu-shared", 4)],
        ),
        (
            "    resources:\n      - name: nvidia.com/gpu\n        rename: small\n        devices: [0, 1]\n        replicas: 8\n      - name: nvidia.com/gpu\n        rename: medium\n        devices: [2, 3]\n        replicas: 2\n",
            &[("nvidia.com/gpu", 4), ("nvidia.com/medium", 4), ("nvidia.com/small", 16)],
        ),
        (
            "    resources:\n      - name: nvidia.com/gpu\n        rename: first3\n        devices: 3\n        replicas: 1\n",
            &[("nvidia.com/first3", 3), ("nvidia.com/gpu", 5)],
        ),
    ];
    for (ts, want) in cases {
        let built = build(&policy(ts), &node).unwrap_or_else(|e| panic!("{ts}: {e}"));
        let want: Vec<(String, usize)> = want.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        assert_eq!(counts(&built), want, "{ts}");
    }
}

#[test]
fn devices_list_shares_only_that_gpu() {
    let node = test_node(8);
    let built = build(
        &policy("    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        devices: [1]\n        replicas: 4\n"),
        &node,
    )
    .unwrap();
    let shared = &built.plan.resources["nvidia.com/gpu-shared"];
    let ids: Vec<&str> = shared.devices.iter().map(|d| d.id.as_str()).collect();
    let u = &node.gpus[1].uuid;
    assert_eq!(
        ids,
        [
            format!("{u}::0"),
            format!("{u}::1"),
            format!("{u}::2"),
            format!("{u}::3")
        ]
    );
    let whole = &built.plan.resources["nvidia.com/gpu"];
    let idx: Vec<u32> = whole.devices.iter().map(|d| d.gpu_index).collect();
    assert_eq!(idx, [0, 2, 3, 4, 5, 6, 7]);
    assert!(whole
        .devices
        .iter()
        .all(|d| d.id == node.gpus[d.gpu_index as usize].uuid));
}

#[test]
fn replicas_of_one_are_whole_ids_under_the_new_name() {
    let node = test_node(2);
    let built = build(&policy("    resources:\n      - name: nvidia.com/gpu\n        rename: big\n        replicas: 1\n"), &node).unwrap();
    let r = &built.plan.resources["nvidia.com/big"];
    assert_eq!(r.strategy, Strategy::TimeSlicing);
    assert_eq!(r.devices[0].id, node.gpus[0].uuid);
    assert_eq!(r.devices[0].replica, None);
}

#[test]
fn a_gpu_claimed_twice_is_rejected_naming_both_entries() {
    let node = test_node(4);
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [0, 1]\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [\"GPU-00000001-0000-0000-0000-000000000000\"]\n        replicas: 2\n");
    let e = build(&p, &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::GpuClaimedTwice {
            gpu: 1,
            uuid: node.gpus[1].uuid.clone(),
            first: "sharing.timeSlicing.resources[0]".into(),
            second: "sharing.timeSlicing.resources[1]".into(),
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("resources[0]") && msg.contains("resources[1]"),
        "{msg}"
    );
}

#[test]
fn a_rename_colliding_with_whole_gpus_is_rejected() {
    let node = test_node(4);
    let p = policy(
        "    resources:\n      - name: nvidia.com/gpu\n        devices: [0]\n        replicas: 2\n",
    );
    match build(&p, &node).unwrap_err() {
        PlanError::NameCollision {
            name,
            entry,
            unclaimed,
        } => {
            assert_eq!(name, "nvidia.com/gpu");
            assert_eq!(entry, "sharing.timeSlicing.resources[0]");
            assert_eq!(unclaimed, "1,2,3");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn entries_that_match_nothing_here_are_warnings() {
    let node = test_node(2);
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [5, \"GPU-nothere\"]\n        replicas: 2\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1, 7]\n        replicas: 2\n");
    let built = build(&p, &node).unwrap();
    assert_eq!(
        counts(&built),
        [
            ("nvidia.com/b".to_string(), 2),
            ("nvidia.com/gpu".to_string(), 1)
        ]
    );
    let w = built.warnings.join("\n");
    assert!(
        w.contains("resources[0].devices: this node has no GPU 5"),
        "{w}"
    );
    assert!(
        w.contains("resources[0].devices: this node has no GPU GPU-nothere"),
        "{w}"
    );
    assert!(w.contains("resources[0]: matches no GPU"), "{w}");
    assert!(
        w.contains("resources[1].name: nvidia.com/mig-1g.10gb"),
        "{w}"
    );
    assert!(
        w.contains("resources[2].devices: this node has no GPU 7"),
        "{w}"
    );
}

#[test]
fn mig_strategy_other_than_none_on_a_mig_node_is_an_error_until_mig_lands() {
    let mut node = test_node(2);
    let p = parse("flags:\n  migStrategy: mixed\n").unwrap();
    // No MIG-enabled GPU: whole GPUs, as NVIDIA's plugin falls back.
    assert_eq!(
        counts(&build(&p, &node).unwrap()),
        [("nvidia.com/gpu".to_string(), 2)]
    );
    node.gpus[1].mig_enabled = true;
    let e = build(&p, &node).unwrap_err();
    assert!(
        matches!(e, PlanError::MigUnsupported { gpu: 1, .. }),
        "{e:?}"
    );
    let none = parse("flags:\n  migStrategy: none\n").unwrap();
    assert_eq!(
        counts(&build(&none, &node).unwrap()),
        [("nvidia.com/gpu".to_string(), 2)]
    );
}

#[test]
fn health_and_numa_follow_the_physical_gpu() {
    let mut node = test_node(8);
    node.gpus[5].healthy = false;
    let built = build(
        &policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 3\n"),
        &node,
    )
    .unwrap();
    let r = &built.plan.resources["nvidia.com/gpu"];
    for d in &r.devices {
        assert_eq!(d.healthy, d.gpu_index != 5, "{}", d.id);
        assert_eq!(d.numa_node, Some(i64::from(d.gpu_index / 4)));
    }
    assert_eq!(r.devices.iter().filter(|d| !d.healthy).count(), 3);
}

#[test]
fn oversized_list_is_refused_before_allocating() {
    let node = test_node(8);
    let e = build(
        &policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 4000000\n"),
        &node,
    )
    .unwrap_err();
    match e {
        PlanError::MessageTooLarge {
            resource,
            devices,
            bytes,
            limit,
        } => {
            assert_eq!(resource, "nvidia.com/gpu");
            assert_eq!(devices, 32_000_000);
            assert!(bytes > limit as u64);
        }
        other => panic!("{other:?}"),
    }
    // 8 x 48 replicas (the MPS client limit) is far below the limit.
    assert!(build(
        &policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 48\n"),
        &node
    )
    .is_ok());
}

#[test]
fn rebuild_reuses_unchanged_resources() {
    let node = test_node(8);
    let p1 = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1]\n        replicas: 2\n");
    let p2 = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1]\n        replicas: 4\n");
    let old = build(&p1, &node).unwrap().plan;
    let mut new = build(&p2, &node).unwrap().plan;
    new.reuse_unchanged(&old);
    assert!(Arc::ptr_eq(
        &old.resources["nvidia.com/a"],
        &new.resources["nvidia.com/a"]
    ));
    assert!(!Arc::ptr_eq(
        &old.resources["nvidia.com/b"],
        &new.resources["nvidia.com/b"]
    ));
    assert!(Arc::ptr_eq(
        &old.resources["nvidia.com/gpu"],
        &new.resources["nvidia.com/gpu"]
    ));
}

#[test]
fn varints() {
    for (v, n) in [
        (0u64, 1u64),
        (127, 1),
        (128, 2),
        (16383, 2),
        (16384, 3),
        (u64::MAX, 10),
    ] {
        assert_eq!(varint_len(v), n, "{v}");
    }
    assert_eq!(physical_uuid("GPU-1::3"), "GPU-1");
    assert_eq!(physical_uuid("GPU-1"), "GPU-1");
}
