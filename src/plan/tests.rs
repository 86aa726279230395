use super::*;
use crate::inventory::{simulated, test_mig, test_node};
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

/// The fallback widens the entry the collision names, not an earlier entry that also lists
/// `devices` (here a renamed 1g.10gb entry on another resource, which keeps its one GPU).
#[test]
fn the_devices_fallback_widens_the_colliding_entry_only() {
    let node = h100_mixed();
    let p = mig_policy(
        "mixed",
        "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: nvidia.com/small\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/gpu\n        devices: [3]\n        replicas: 2\n",
    );
    let built = build(&p, &node).unwrap();
    let on_gpu0 = node.gpus[0]
        .mig_devices
        .iter()
        .filter(|m| m.profile == "1g.10gb")
        .count();
    let whole = node.gpus.iter().filter(|g| !g.mig_enabled).count();
    let r = &built.plan.resources;
    assert_eq!(r["nvidia.com/small"].devices.len(), on_gpu0 * 2);
    assert_eq!(r["nvidia.com/gpu"].devices.len(), whole * 2);
    assert_eq!(built.fallbacks.len(), 1, "{:?}", built.fallbacks);
    assert!(
        built.fallbacks[0].starts_with("sharing.timeSlicing.resources[1].devices: "),
        "{:?}",
        built.fallbacks
    );
}

#[test]
fn devices_without_rename_share_every_gpu_as_nvidia_does_with_a_fallback_warning() {
    let node = test_node(4);
    // NVIDIA's own test file: devices given, no rename. Honouring devices would leave GPUs
    // 1,2,3 whole under the very name the replicas use.
    let p = policy(
        "    resources:\n      - name: nvidia.com/gpu\n        devices: [0]\n        replicas: 2\n",
    );
    let built = build(&p, &node).unwrap();
    let r = &built.plan.resources["nvidia.com/gpu"];
    assert_eq!(built.plan.resources.len(), 1);
    assert_eq!(r.devices.len(), 8);
    assert_eq!(r.strategy, Strategy::TimeSlicing);
    assert_eq!(
        built.fallbacks,
        vec!["sharing.timeSlicing.resources[0].devices: sharing only the listed GPUs as nvidia.com/gpu would leave GPUs 1,2,3 whole under the same name; like NVIDIA's plugin (which ignores devices), slicelet shares every device of nvidia.com/gpu; add rename: nvidia.com/gpu-shared to share only these GPUs".to_string()]
    );
    assert!(built.warnings.is_empty(), "{:?}", built.warnings);
    // With a rename, devices are honoured and nothing falls back.
    let p = policy(
        "    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 2\n",
    );
    let built = build(&p, &node).unwrap();
    assert!(built.fallbacks.is_empty());
    assert_eq!(
        built.plan.resources["nvidia.com/gpu-shared"].devices.len(),
        2
    );
    assert_eq!(built.plan.resources["nvidia.com/gpu"].devices.len(), 3);
    // devices covering every GPU: no collision, no fallback.
    let p = policy(
        "    resources:\n      - name: nvidia.com/gpu\n        devices: 4\n        replicas: 2\n",
    );
    assert!(build(&p, &node).unwrap().fallbacks.is_empty());
}

#[test]
fn a_collision_the_fallback_cannot_mend_is_rejected() {
    let node = test_node(4);
    // Sharing every GPU under nvidia.com/gpu would claim GPU 1 twice: the collision stays
    // the error.
    let p = policy(
        "    resources:\n      - name: nvidia.com/gpu\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1]\n        replicas: 2\n",
    );
    match build(&p, &node).unwrap_err() {
        PlanError::NameCollision {
            name,
            entry,
            unclaimed,
        } => {
            assert_eq!(name, "nvidia.com/gpu");
            assert_eq!(entry, "sharing.timeSlicing.resources[0]");
            assert_eq!(unclaimed, "2,3");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn entries_that_match_nothing_here_are_warnings() {
    let node = test_node(2);
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [5, \"GPU-0000dead-0000-0000-0000-000000000000\"]\n        replicas: 2\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1, 7]\n        replicas: 2\n");
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
        w.contains(
            "resources[0].devices: this node has no GPU GPU-0000dead-0000-0000-0000-000000000000"
        ),
        "{w}"
    );
    assert!(
        w.contains("resources[0]: matches no device on this node"),
        "{w}"
    );
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
fn health_and_numa_follow_the_physical_gpu() {
    let mut node = test_node(8);
    node.gpus[5].health = Health::Unhealthy;
    let built = build(
        &policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 3\n"),
        &node,
    )
    .unwrap();
    let r = &built.plan.resources["nvidia.com/gpu"];
    for d in &r.devices {
        assert_eq!(d.health.is_healthy(), d.gpu_index != 5, "{}", d.id);
        assert_eq!(d.numa_node, Some(i64::from(d.gpu_index / 4)));
    }
    assert_eq!(
        r.devices.iter().filter(|d| !d.health.is_healthy()).count(),
        3
    );
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

// ---- MIG ----

fn shipped_node(name: &str, text: &str) -> Inventory {
    simulated::parse(std::path::Path::new(name), text).unwrap()
}

/// config/nodes/h100-80gb-x8-mig-mixed.yaml: GPU 0 7x 1g.10gb, GPU 1 3x 2g.20gb + 1g.10gb,
/// GPU 2 2x 3g.40gb, GPUs 3-7 whole.
fn h100_mixed() -> Inventory {
    shipped_node(
        "h100-mixed",
        include_str!("../../config/nodes/h100-80gb-x8-mig-mixed.yaml"),
    )
}

/// config/nodes/a100-40gb-x8-mig-single.yaml: 8 GPUs, each 7x 1g.5gb.
fn a100_single() -> Inventory {
    shipped_node(
        "a100-single",
        include_str!("../../config/nodes/a100-40gb-x8-mig-single.yaml"),
    )
}

fn mig_policy(strategy: &str, ts: &str) -> Policy {
    let sharing = if ts.is_empty() {
        String::new()
    } else {
        format!("sharing:\n  timeSlicing:\n{ts}")
    };
    parse(&format!(
        "version: v1\nflags:\n  migStrategy: {strategy}\n{sharing}"
    ))
    .unwrap()
}

const TS_1G_10GB: &str =
    "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n";

#[test]
fn table_of_mig_strategies_on_the_shipped_nodes() {
    type Want = Result<&'static [(&'static str, usize)], &'static str>;
    let h100 = h100_mixed();
    let a100 = a100_single();
    let plain = test_node(8);
    let cases: &[(&str, &Inventory, &str, &str, Want)] = &[
        ("h100 none", &h100, "none", "", Ok(&[("nvidia.com/gpu", 8)])),
        (
            "h100 single",
            &h100,
            "single",
            "",
            Err("flags.migStrategy: single needs every GPU in the same MIG mode, but MIG is enabled on GPUs 0,1,2 and disabled on GPUs 3,4,5,6,7;"),
        ),
        (
            "h100 mixed",
            &h100,
            "mixed",
            "",
            Ok(&[
                ("nvidia.com/gpu", 5),
                ("nvidia.com/mig-1g.10gb", 8),
                ("nvidia.com/mig-2g.20gb", 3),
                ("nvidia.com/mig-3g.40gb", 2),
            ]),
        ),
        (
            "h100 mixed, 1g.10gb time-sliced 2 ways",
            &h100,
            "mixed",
            TS_1G_10GB,
            Ok(&[
                ("nvidia.com/gpu", 5),
                ("nvidia.com/mig-1g.10gb", 16),
                ("nvidia.com/mig-2g.20gb", 3),
                ("nvidia.com/mig-3g.40gb", 2),
            ]),
        ),
        (
            "h100 mixed, whole GPUs and 3g.40gb shared",
            &h100,
            "mixed",
            "    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n      - name: nvidia.com/mig-3g.40gb\n        rename: mig-3g.40gb-shared\n        replicas: 3\n",
            Ok(&[
                ("nvidia.com/gpu-shared", 20),
                ("nvidia.com/mig-1g.10gb", 8),
                ("nvidia.com/mig-2g.20gb", 3),
                ("nvidia.com/mig-3g.40gb-shared", 6),
            ]),
        ),
        ("a100 none", &a100, "none", "", Ok(&[("nvidia.com/gpu", 8)])),
        ("a100 single", &a100, "single", "", Ok(&[("nvidia.com/gpu", 56)])),
        (
            "a100 single, time-sliced 2 ways",
            &a100,
            "single",
            "    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 2\n",
            Ok(&[("nvidia.com/gpu-shared", 112)]),
        ),
        ("a100 mixed", &a100, "mixed", "", Ok(&[("nvidia.com/mig-1g.5gb", 56)])),
        // No MIG-enabled GPU: single and mixed fall back to whole GPUs, as NVIDIA's plugin does.
        ("plain none", &plain, "none", "", Ok(&[("nvidia.com/gpu", 8)])),
        ("plain single", &plain, "single", "", Ok(&[("nvidia.com/gpu", 8)])),
        ("plain mixed", &plain, "mixed", "", Ok(&[("nvidia.com/gpu", 8)])),
        (
            "plain mixed, MIG entry matches nothing here",
            &plain,
            "mixed",
            TS_1G_10GB,
            Ok(&[("nvidia.com/gpu", 8)]),
        ),
    ];
    for (what, node, strategy, ts, want) in cases {
        let got = build(&mig_policy(strategy, ts), node);
        match (got, want) {
            (Ok(built), Ok(want)) => {
                let want: Vec<(String, usize)> =
                    want.iter().map(|(n, c)| (n.to_string(), *c)).collect();
                assert_eq!(counts(&built), want, "{what}");
            }
            (Err(e), Err(msg)) => assert!(e.to_string().starts_with(msg), "{what}: {e}"),
            (got, _) => panic!("{what}: {got:?}"),
        }
    }
}

#[test]
fn single_errors_name_the_gpus() {
    // A GPU with another profile.
    let mut node = a100_single();
    node.gpus[3].mig_devices = test_mig(3, &[("3g.20gb", 2)]);
    let e = build(&mig_policy("single", ""), &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::MigSingleProfiles {
            profiles: "1g.5gb on GPUs 0,1,2,4,5,6,7; 3g.20gb on GPU 3".into()
        }
    );
    // Two profiles on one GPU.
    let mut node = a100_single();
    node.gpus[6].mig_devices = test_mig(6, &[("1g.5gb", 2), ("2g.10gb", 1)]);
    let e = build(&mig_policy("single", ""), &node)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("1g.5gb on GPUs 0,1,2,3,4,5,6,7; 2g.10gb on GPU 6"),
        "{e}"
    );
    // A MIG-enabled GPU without MIG devices.
    let mut node = a100_single();
    node.gpus[5].mig_devices.clear();
    let e = build(&mig_policy("single", ""), &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::MigSingleNoDevices {
            gpu: 5,
            uuid: node.gpus[5].uuid.clone()
        }
    );
    assert!(e.to_string().contains("GPU 5 ("), "{e}");
    // MIG-enabled and MIG-disabled GPUs.
    let mut node = a100_single();
    node.gpus[2].mig_enabled = false;
    node.gpus[2].mig_devices.clear();
    let e = build(&mig_policy("single", ""), &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::MigSingleModesDiffer {
            enabled: "0,1,3,4,5,6,7".into(),
            disabled: "2".into()
        }
    );
    assert!(
        e.to_string()
            .contains("enabled on GPUs 0,1,3,4,5,6,7 and disabled on GPU 2;"),
        "{e}"
    );
}

#[test]
fn an_empty_mig_gpu_under_mixed_is_a_warning_and_the_rest_is_advertised() {
    let mut node = h100_mixed();
    node.gpus[2].mig_devices.clear();
    let built = build(&mig_policy("mixed", TS_1G_10GB), &node).unwrap();
    assert_eq!(
        counts(&built),
        [
            ("nvidia.com/gpu".to_string(), 5),
            ("nvidia.com/mig-1g.10gb".to_string(), 16),
            ("nvidia.com/mig-2g.20gb".to_string(), 3),
        ]
    );
    let w = built.warnings.join("\n");
    assert!(
        w.contains(&format!(
            "GPU 2 ({}) has MIG enabled and no MIG devices",
            node.gpus[2].uuid
        )),
        "{w}"
    );
    // Every MIG GPU empty: the whole GPUs are still advertised.
    for g in &mut node.gpus {
        g.mig_devices.clear();
    }
    let built = build(&mig_policy("mixed", ""), &node).unwrap();
    assert_eq!(counts(&built), [("nvidia.com/gpu".to_string(), 5)]);
    assert_eq!(built.warnings.len(), 3, "{:?}", built.warnings);
}

#[test]
fn none_advertises_mig_gpus_whole_with_a_warning() {
    let node = h100_mixed();
    let built = build(&mig_policy("none", TS_1G_10GB), &node).unwrap();
    let whole = &built.plan.resources["nvidia.com/gpu"];
    assert!(whole.devices.iter().all(|d| d.mig.is_none()));
    assert_eq!(whole.devices[0].gpu_uuid, node.gpus[0].uuid);
    let w = built.warnings.join("\n");
    for g in 0..3 {
        assert!(
            w.contains(&format!(
                "GPU {g} ({}) has MIG enabled, but migStrategy is none",
                node.gpus[g].uuid
            )),
            "{w}"
        );
    }
    assert!(
        w.contains("resources[0].name: nvidia.com/mig-1g.10gb is not a resource of this node (here: nvidia.com/gpu); MIG profiles are resources only under migStrategy mixed"),
        "{w}"
    );
}

#[test]
fn mig_devices_carry_their_mig_uuid_parent_and_order() {
    let node = h100_mixed();
    let built = build(&mig_policy("mixed", ""), &node).unwrap();
    let r = &built.plan.resources["nvidia.com/mig-1g.10gb"];
    assert_eq!(r.strategy, Strategy::None);
    let got: Vec<(u32, u32, &str)> = r
        .devices
        .iter()
        .map(|d| (d.gpu_index, d.mig.as_ref().unwrap().index, d.id.as_str()))
        .collect();
    let mut want: Vec<(u32, u32, &str)> = node.gpus[0]
        .mig_devices
        .iter()
        .map(|m| (0, m.index, m.uuid.as_str()))
        .collect();
    let m13 = &node.gpus[1].mig_devices[3];
    want.push((1, 3, m13.uuid.as_str()));
    assert_eq!(got, want);
    let d = &r.devices[7];
    assert_eq!(d.gpu_uuid, m13.uuid);
    assert!(d.gpu_uuid.starts_with("MIG-"));
    assert_eq!(d.gpu_minor, node.gpus[1].minor);
    assert_eq!(d.numa_node, Some(0));
    assert_eq!(
        d.mig,
        Some(MigInfo {
            index: 3,
            parent_uuid: node.gpus[1].uuid.clone(),
            profile: "1g.10gb".into(),
            gi_id: m13.gi_id,
            ci_id: 0,
            caps: None,
        })
    );
    // The view: parent and profile for MIG devices only.
    let v = serde_json::to_value(built.plan.view()).unwrap();
    let res = v["resources"].as_array().unwrap();
    let gpu = res.iter().find(|r| r["name"] == "nvidia.com/gpu").unwrap();
    assert_eq!(
        gpu["devices"][0],
        serde_json::json!({"id": node.gpus[3].uuid, "gpu": node.gpus[3].uuid, "health": "Healthy"})
    );
    let mig = res
        .iter()
        .find(|r| r["name"] == "nvidia.com/mig-3g.40gb")
        .unwrap();
    let m = &node.gpus[2].mig_devices[1];
    assert_eq!(
        mig["devices"][1],
        serde_json::json!({"id": m.uuid, "gpu": m.uuid, "health": "Healthy", "parent": node.gpus[2].uuid, "profile": "3g.40gb"})
    );
}

#[test]
fn time_sliced_mig_replicas_use_the_mig_uuid() {
    let node = h100_mixed();
    let built = build(&mig_policy("mixed", TS_1G_10GB), &node).unwrap();
    let r = &built.plan.resources["nvidia.com/mig-1g.10gb"];
    assert_eq!(r.strategy, Strategy::TimeSlicing);
    assert_eq!(r.replicas, 2);
    let m0 = &node.gpus[0].mig_devices[0].uuid;
    let m13 = &node.gpus[1].mig_devices[3].uuid;
    let ids: Vec<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids[0], format!("{m0}::0"));
    assert_eq!(ids[1], format!("{m0}::1"));
    assert_eq!(ids[14], format!("{m13}::0"));
    assert_eq!(ids[15], format!("{m13}::1"));
    assert!(r.devices[15].gpu_uuid == *m13 && r.devices[15].replica == Some(1));
    // replicas: 1 under a new name: the plain MIG UUID.
    let built = build(
        &mig_policy(
            "mixed",
            "    resources:\n      - name: nvidia.com/mig-3g.40gb\n        rename: big-slice\n        replicas: 1\n",
        ),
        &node,
    )
    .unwrap();
    let r = &built.plan.resources["nvidia.com/big-slice"];
    assert_eq!(r.devices[0].id, node.gpus[2].mig_devices[0].uuid);
    assert!(!built.plan.resources.contains_key("nvidia.com/mig-3g.40gb"));
}

/// `devices` naming MIG device `i` of GPU `g` in the legacy `MIG-GPU-<uuid>/<gi>/<ci>` form.
fn legacy(node: &Inventory, g: usize, i: usize) -> String {
    let d = &node.gpus[g].mig_devices[i];
    format!("[\"MIG-{}/{}/{}\"]", node.gpus[g].uuid, d.gi_id, d.ci_id)
}

#[test]
fn devices_select_mig_devices_by_index_mig_index_and_uuid() {
    let node = h100_mixed();
    let m = |g: usize, i: usize| node.gpus[g].mig_devices[i].uuid.clone();
    let entry = |devices: &str| {
        mig_policy(
            "mixed",
            &format!("    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: small\n        devices: {devices}\n        replicas: 2\n"),
        )
    };
    let cases: Vec<(String, Vec<String>, Vec<&str>)> = vec![
        ("[\"0:1\", \"1:3\"]".into(), vec![m(0, 1), m(1, 3)], vec![]),
        ("[1]".into(), vec![m(1, 3)], vec![]),
        (
            format!("[\"{}\"]", node.gpus[0].uuid),
            (0..7).map(|i| m(0, i)).collect(),
            vec![],
        ),
        (
            format!("[\"{}\", 0]", m(0, 4)),
            (0..7).map(|i| m(0, i)).collect(),
            vec![],
        ),
        (
            format!("[\"1:3\", \"{}\"]", m(1, 3)),
            vec![m(1, 3)],
            vec!["names devices listed already"],
        ),
        (
            "[\"0:1\", \"1:0\", \"0:9\", 3]".into(),
            vec![m(0, 1)],
            vec![
                "devices: 1:0 matches no device of nvidia.com/mig-1g.10gb on this node",
                "devices: 0:9 matches no device",
                "devices: 3 matches no device",
            ],
        ),
        ("2".into(), vec![m(0, 0), m(0, 1)], vec![]),
        // The MIG-GPU-<uuid>/<gi>/<ci> form of drivers before R470: the MIG device with that
        // parent and those instance ids, whatever UUID NVML gives it now.
        (legacy(&node, 1, 3), vec![m(1, 3)], vec![]),
        (
            format!(
                "[\"0:1\", \"MIG-{}/{}/0\"]",
                node.gpus[0].uuid,
                node.gpus[0]
                    .mig_devices
                    .iter()
                    .map(|d| d.gi_id)
                    .max()
                    .unwrap()
                    + 1
            ),
            vec![m(0, 1)],
            vec!["matches no device of nvidia.com/mig-1g.10gb on this node"],
        ),
    ];
    for (devices, want, warns) in cases {
        let built = build(&entry(&devices), &node).unwrap_or_else(|e| panic!("{devices}: {e}"));
        let small = &built.plan.resources["nvidia.com/small"];
        let got: Vec<String> = small
            .devices
            .iter()
            .filter(|d| d.replica == Some(0))
            .map(|d| d.gpu_uuid.clone())
            .collect();
        assert_eq!(got, want, "{devices}");
        let w = built.warnings.join("\n");
        for expected in warns {
            assert!(w.contains(expected), "{devices}: {w}");
        }
        // The unshared 1g.10gb slices stay whole under their own name.
        let rest = built
            .plan
            .resources
            .get("nvidia.com/mig-1g.10gb")
            .map_or(0, |r| r.devices.len());
        assert_eq!(rest, 8 - want.len(), "{devices}");
    }
}

#[test]
fn mig_claims_and_name_collisions_are_rejected_naming_both() {
    let node = h100_mixed();
    let p = mig_policy(
        "mixed",
        "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: a\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/mig-1g.10gb\n        rename: b\n        devices: [\"0:2\"]\n        replicas: 2\n",
    );
    let e = build(&p, &node).unwrap_err();
    assert_eq!(
        e,
        PlanError::MigClaimedTwice {
            gpu: 0,
            mig: 2,
            uuid: node.gpus[0].mig_devices[2].uuid.clone(),
            first: "sharing.timeSlicing.resources[0]".into(),
            second: "sharing.timeSlicing.resources[1]".into(),
        }
    );
    assert!(e.to_string().contains("MIG device 0:2"), "{e}");
    // Sharing some 1g.10gb slices under their own name while others stay whole: read as
    // NVIDIA's plugin reads it, every 1g.10gb slice is shared, with the fix in a fallback.
    let p = mig_policy(
        "mixed",
        "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        devices: [0]\n        replicas: 2\n",
    );
    let built = build(&p, &node).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/mig-1g.10gb"].devices.len(),
        16
    );
    assert!(
        built.fallbacks[0].contains("MIG devices 1:3 whole")
            && built.fallbacks[0].contains("add rename: nvidia.com/mig-1g.10gb-shared"),
        "{:?}",
        built.fallbacks
    );
    // A rename onto another profile's resource.
    let p = mig_policy(
        "mixed",
        "    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/mig-2g.20gb\n        replicas: 2\n",
    );
    assert_eq!(
        build(&p, &node).unwrap_err(),
        PlanError::NameCollision {
            name: "nvidia.com/mig-2g.20gb".into(),
            entry: "sharing.timeSlicing.resources[0]".into(),
            unclaimed: "1:0,1:1,1:2".into(),
        }
    );
}

#[test]
fn mig_health_follows_the_device_and_its_parent() {
    let mut node = h100_mixed();
    node.gpus[0].health = Health::Unhealthy;
    node.gpus[1].mig_devices[3].health = Health::Unhealthy;
    let built = build(&mig_policy("mixed", TS_1G_10GB), &node).unwrap();
    let r = &built.plan.resources["nvidia.com/mig-1g.10gb"];
    assert_eq!(
        r.devices.iter().filter(|d| d.health.is_healthy()).count(),
        0
    );
    let r = &built.plan.resources["nvidia.com/mig-2g.20gb"];
    assert!(r.devices.iter().all(|d| d.health.is_healthy()));
}

#[test]
fn pass_device_specs_warns_when_mig_caps_are_unknown() {
    let mut node = h100_mixed();
    let p = parse("flags:\n  migStrategy: mixed\n  plugin:\n    passDeviceSpecs: true\n").unwrap();
    for g in &mut node.gpus {
        for m in &mut g.mig_devices {
            m.caps = Some(MigCaps {
                gi_access: 100 + m.gi_id,
                ci_access: 200 + m.gi_id,
            });
        }
    }
    node.gpus[2].mig_devices[1].caps = None;
    let built = build(&p, &node).unwrap();
    let w = built.warnings.join("\n");
    assert!(
        w.contains(
            "flags.plugin.passDeviceSpecs: the nvidia-caps minors of MIG devices 2:1 are unknown"
        ),
        "{w}"
    );
    let r = &built.plan.resources["nvidia.com/mig-3g.40gb"];
    assert_eq!(
        r.devices[0].mig.as_ref().unwrap().caps,
        Some(MigCaps {
            gi_access: 101,
            ci_access: 201
        })
    );
    // Without passDeviceSpecs nobody needs them.
    assert!(build(&mig_policy("mixed", ""), &node)
        .unwrap()
        .warnings
        .is_empty());
}

#[test]
fn plus_profiles_become_dotted_resource_names() {
    let mut node = test_node(2);
    node.gpus[1].mig_enabled = true;
    node.gpus[1].mig_devices = test_mig(1, &[("1g.10gb+me", 1), ("1g.10gb", 2)]);
    let built = build(&mig_policy("mixed", ""), &node).unwrap();
    assert_eq!(
        counts(&built),
        [
            ("nvidia.com/gpu".to_string(), 1),
            ("nvidia.com/mig-1g.10gb".to_string(), 2),
            ("nvidia.com/mig-1g.10gb.me".to_string(), 1),
        ]
    );
}

#[test]
fn a_huge_replica_count_is_refused_at_once() {
    // Regression: the error message summed the size of every device (3.2e10 steps for this
    // policy), freezing the daemon and `validate` for minutes.
    let node = test_node(8);
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 4000000000\n");
    match build(&p, &node).unwrap_err() {
        PlanError::MessageTooLarge { devices, bytes, .. } => {
            assert_eq!(devices, 32_000_000_000);
            // 8 GPUs x 4e9 replicas x at least 60 bytes each.
            assert!(bytes > 8 * 4_000_000_000 * 60, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn closed_form_size_matches_the_encoded_message() {
    for replicas in [1u32, 2, 9, 10, 11, 99, 100, 101, 1000] {
        let node = test_node(3);
        let p = policy(&format!(
            "    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
        ));
        let built = build(&p, &node).unwrap();
        let r = &built.plan.resources["nvidia.com/gpu"];
        let units: Vec<Unit<'_>> = node
            .gpus
            .iter()
            .map(|g| Unit { gpu: g, mig: None })
            .collect();
        let by_device: u64 = r
            .devices
            .iter()
            .map(|d| framed(device_encoded_len(d.id.len(), d.health, d.numa_node)))
            .sum();
        assert_eq!(
            encoded_size(&units, replicas),
            by_device,
            "replicas {replicas}"
        );
    }
}

#[test]
fn an_empty_devices_list_is_accepted_and_claims_nothing() {
    // NVIDIA's plugin accepts `devices: []`; slicelet used to reject the file.
    let node = test_node(2);
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        rename: none-here\n        devices: []\n        replicas: 2\n");
    let built = build(&p, &node).unwrap();
    assert_eq!(counts(&built), [("nvidia.com/gpu".to_string(), 2)]);
    assert!(
        built.warnings.iter().any(|w| w.contains("resources[0]")),
        "{:?}",
        built.warnings
    );
}

// --- mutation-testing gaps ---

#[test]
fn the_list_limit_is_the_kubelets_4_mib() {
    // The kubelet's gRPC receive limit is 4 MiB: the largest replica count whose message fits
    // is accepted, one more is refused.
    const KUBELET_LIMIT: u64 = 4 * 1024 * 1024;
    let node = test_node(1);
    let units = [Unit {
        gpu: &node.gpus[0],
        mig: None,
    }];
    let (mut lo, mut hi) = (1u32, 1_000_000u32);
    assert!(encoded_size(&units, hi) > KUBELET_LIMIT);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if encoded_size(&units, mid) <= KUBELET_LIMIT {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let ts = |r: u32| {
        policy(&format!(
            "    resources:\n      - name: nvidia.com/gpu\n        replicas: {r}\n"
        ))
    };
    let built = build(&ts(lo), &node).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/gpu"].devices.len(),
        lo as usize
    );
    match build(&ts(hi), &node).unwrap_err() {
        PlanError::MessageTooLarge { bytes, limit, .. } => {
            assert_eq!(limit as u64, KUBELET_LIMIT);
            assert!(bytes > KUBELET_LIMIT, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_mig_hint_only_for_mig_names_outside_mixed() {
    let hint = "MIG profiles are resources only under migStrategy mixed";
    let entry = |name: &str| {
        format!("    resources:\n      - name: {name}\n        rename: x\n        replicas: 2\n")
    };
    // (strategy, node, entry name, hint expected)
    let h100 = h100_mixed();
    let plain = test_node(2);
    let cases: &[(&str, &Inventory, &str, Option<&str>)] = &[
        (
            "none",
            &plain,
            "nvidia.com/mig-1g.10gb",
            Some("(this policy: none)"),
        ),
        (
            "single",
            &plain,
            "nvidia.com/mig-1g.10gb",
            Some("(this policy: single)"),
        ),
        // Mixed, but this node has no such profile: the hint would be wrong.
        ("mixed", &h100, "nvidia.com/mig-7g.80gb", None),
        // Not a MIG name.
        ("none", &plain, "example.com/fpga", None),
    ];
    for (strategy, node, name, want) in cases {
        let built = build(&mig_policy(strategy, &entry(name)), node).unwrap();
        let w = built.warnings.join("\n");
        assert!(
            w.contains(&format!(
                "resources[0].name: {name} is not a resource of this node"
            )),
            "{strategy} {name}: {w}"
        );
        match want {
            Some(policy) => assert!(
                w.contains(hint) && w.contains(policy),
                "{strategy} {name}: {w}"
            ),
            None => assert!(!w.contains(hint), "{strategy} {name}: {w}"),
        }
    }
}

#[test]
fn a_count_warns_only_above_the_devices_present() {
    let node = test_node(2);
    let entry = |devices: &str| {
        policy(&format!("    resources:\n      - name: nvidia.com/gpu\n        rename: x\n        devices: {devices}\n        replicas: 2\n"))
    };
    // (count, warned, devices shared)
    for (count, warned, shared) in [(1, false, 2), (2, false, 4), (3, true, 4)] {
        let built = build(&entry(&count.to_string()), &node).unwrap();
        let w = built.warnings.join("\n");
        let want = format!(
            "resources[0].devices: asks for the first {count} GPUs of nvidia.com/gpu, this node has 2"
        );
        assert_eq!(w.contains(&want), warned, "devices: {count}: {w}");
        assert_eq!(
            built.plan.resources["nvidia.com/x"].devices.len(),
            shared,
            "devices: {count}"
        );
    }
}

#[test]
fn a_device_listed_twice_warns_and_distinct_ones_do_not() {
    let node = test_node(3);
    let entry = |devices: &str| {
        policy(&format!("    resources:\n      - name: nvidia.com/gpu\n        rename: x\n        devices: {devices}\n        replicas: 2\n"))
    };
    let u1 = &node.gpus[1].uuid;
    // (devices, warning expected, devices shared: 2 replicas per distinct GPU)
    let cases = [
        ("[0, 1]".to_string(), None, 4),
        (
            format!("[1, \"{u1}\"]"),
            Some(format!("{u1} names a GPU listed already")),
            2,
        ),
        (
            format!("[\"{u1}\", 1]"),
            Some("1 names a GPU listed already".to_string()),
            2,
        ),
    ];
    for (devices, want, shared) in cases {
        let built = build(&entry(&devices), &node).unwrap();
        let w = built.warnings.join("\n");
        match want {
            Some(m) => assert!(
                w.contains(&format!("resources[0].devices: {m}")),
                "{devices}: {w}"
            ),
            None => assert!(!w.contains("listed already"), "{devices}: {w}"),
        }
        assert_eq!(
            built.plan.resources["nvidia.com/x"].devices.len(),
            shared,
            "{devices}"
        );
    }
}

#[test]
fn a_message_of_exactly_4_mib_is_still_accepted() {
    // gRPC refuses a message *larger* than the receive limit; exactly 4 MiB is delivered.
    // Find a UUID length whose largest fitting replica count makes exactly 4 MiB.
    const KUBELET_LIMIT: u64 = 4 * 1024 * 1024;
    let mut node = test_node(1);
    let exact = (8..400).find_map(|len| {
        node.gpus[0].uuid = format!("GPU-{}", "a".repeat(len));
        let units = [Unit {
            gpu: &node.gpus[0],
            mig: None,
        }];
        let (mut lo, mut hi) = (1u32, 2_000_000u32);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if encoded_size(&units, mid) <= KUBELET_LIMIT {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (encoded_size(&units, lo) == KUBELET_LIMIT).then_some((len, lo))
    });
    let (len, replicas) = exact.expect("some UUID length hits 4 MiB exactly");
    node.gpus[0].uuid = format!("GPU-{}", "a".repeat(len));
    let ts = |r: u32| {
        policy(&format!(
            "    resources:\n      - name: nvidia.com/gpu\n        replicas: {r}\n"
        ))
    };
    let built = build(&ts(replicas), &node).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/gpu"].devices.len(),
        replicas as usize
    );
    assert!(matches!(
        build(&ts(replicas + 1), &node),
        Err(PlanError::MessageTooLarge { .. })
    ));
}

#[test]
fn id_len_is_the_length_of_the_id_a_device_gets() {
    // With more than one replica the ID is `<uuid>::<n>` (replica_id), else the plain UUID.
    let uuid = "GPU-00000001-0000-0000-0000-000000000000";
    for replicas in [0u32, 1, 2, 10, 48, 1000] {
        for n in [0u32, 1, 9, 10, 47, 99, 100, 999, u32::MAX] {
            let want = if replicas > 1 {
                replica_id(uuid, n).len()
            } else {
                uuid.len()
            };
            assert_eq!(
                id_len(uuid, replicas, n),
                want,
                "replicas {replicas}, n {n}"
            );
        }
    }
}

/// A resource's Debug shows its ID index as a count, not the table it holds (plans print in
/// assertion messages and debug logs).
#[test]
fn a_resource_prints_its_id_index_as_a_count() {
    let p = policy("    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n");
    let built = build(&p, &test_node(4)).unwrap();
    let text = format!("{:?}", built.plan.resources["nvidia.com/gpu"]);
    assert!(text.contains("by_id: IdIndex(8 IDs)"), "{text}");
}
