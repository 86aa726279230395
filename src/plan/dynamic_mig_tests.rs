//! Dynamic MIG in the plan (`dra.dynamicMig.devices`): which GPUs it resolves to, what each
//! one's static MIG devices occupy, the errors (MIG mode off, sharing, whole advertisement)
//! and warnings; and the device names `gpu-<i>-mig-<profile>-<start>` read back.

use super::dra_names::{dynamic_mig_name, is_dns_label, parse_dynamic_mig, DynamicMigDevice};
use super::*;
use crate::device_health::Health;
use crate::inventory::mig::table::TABLES;
use crate::inventory::{simulated, MigPlacement};
use crate::policy::parse;

const H100: &str = "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n";

/// GPU 0: MIG on with a static 3g.40gb at memory slice 4; GPU 1: MIG on, empty; GPU 2: MIG
/// off.
fn node() -> Inventory {
    let text = format!(
        "gpus:\n{H100}    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 4\n{H100}    mig:\n      devices: []\n{H100}"
    );
    simulated::parse(std::path::Path::new("dynamic"), &text).unwrap()
}

/// `n` H100s with MIG on and no instance.
fn empty_mig_node(n: u32) -> Inventory {
    let text = format!("gpus:\n{H100}    count: {n}\n    mig:\n      devices: []\n");
    simulated::parse(std::path::Path::new("empty-mig"), &text).unwrap()
}

/// A policy with `flags.migStrategy: <strategy>`, `extra` (a `sharing:` block or nothing) and
/// `dra.dynamicMig.devices: <devices>`.
fn policy(strategy: &str, extra: &str, devices: &str) -> Policy {
    parse(&format!(
        "version: v1\nflags:\n  migStrategy: {strategy}\n{extra}dra:\n  dynamicMig:\n    devices: {devices}\n"
    ))
    .unwrap()
}

fn indices(built: &Built) -> Vec<u32> {
    built.plan.dynamic_mig.iter().map(|g| g.index).collect()
}

#[test]
fn mig_mode_off_is_an_error_naming_the_gpu_and_the_nvidia_smi_step() {
    let inv = node();
    let uuid = inv.gpus[2].uuid.clone();
    for devices in ["[1, 2]", "all", "3", &format!("[{uuid}]")] {
        let e = build(&policy("mixed", "", devices), &inv).unwrap_err();
        assert_eq!(
            e,
            PlanError::DynamicMigModeOff {
                gpu: 2,
                uuid: uuid.clone()
            },
            "{devices}"
        );
        let text = e.to_string();
        assert!(text.contains("dra.dynamicMig.devices: GPU 2"), "{text}");
        assert!(text.contains(&uuid), "{text}");
        assert!(text.contains("`nvidia-smi -i 2 -mig 1`"), "{text}");
        assert!(text.contains("never enables MIG mode"), "{text}");
    }
    // The MIG-enabled GPUs alone: fine.
    let built = build(&policy("mixed", "", "[0, 1]"), &inv).unwrap();
    assert_eq!(indices(&built), [0, 1]);
}

#[test]
fn sharing_a_dynamic_gpu_is_refused_naming_how() {
    let inv = node();
    let entry = |section: &str, extra: &str| {
        format!("sharing:\n  {section}:\n    resources:\n      - name: nvidia.com/mig-3g.40gb\n        replicas: 2\n{extra}")
    };
    let cases = [
        (entry("timeSlicing", ""), "time-slicing"),
        (entry("mps", ""), "MPS"),
        (
            entry("timeSlicing", "        dra: capacity\n"),
            "consumable capacity",
        ),
    ];
    for (sharing, how) in cases {
        let e = build(&policy("mixed", &sharing, "[0, 1]"), &inv).unwrap_err();
        let PlanError::DynamicMigShared {
            gpu,
            uuid,
            resource,
            how: said,
        } = &e
        else {
            panic!("{how}: {e}");
        };
        assert_eq!((*gpu, uuid.as_str()), (0, inv.gpus[0].uuid.as_str()), "{e}");
        assert_eq!(resource, "nvidia.com/mig-3g.40gb", "{e}");
        assert_eq!(said, how, "{e}");
        assert!(e.to_string().contains("not supported"), "{e}");
        // The same sharing with GPU 0 left out of dynamic MIG: fine.
        let built = build(&policy("mixed", &sharing, "[1]"), &inv).unwrap();
        assert_eq!(indices(&built), [1], "{how}");
    }
    // Time-slicing whole GPUs (GPU 2, MIG off) beside dynamic GPUs: fine.
    let ts = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let built = build(&policy("mixed", ts, "[0, 1]"), &inv).unwrap();
    assert_eq!(indices(&built), [0, 1]);
}

#[test]
fn mig_strategy_none_with_a_dynamic_gpu_is_refused() {
    let inv = node();
    let e = build(&policy("none", "", "[1]"), &inv).unwrap_err();
    assert_eq!(
        e,
        PlanError::DynamicMigWhole {
            gpu: 1,
            uuid: inv.gpus[1].uuid.clone(),
            resource: "nvidia.com/gpu".to_string(),
        }
    );
    assert!(e.to_string().contains("migStrategy: mixed"), "{e}");
    // mixed advertises its MIG devices, never the GPU whole.
    assert_eq!(
        indices(&build(&policy("mixed", "", "[1]"), &inv).unwrap()),
        [1]
    );
}

#[test]
fn static_mig_devices_occupy_their_placements() {
    let inv = node();
    let built = build(&policy("mixed", "", "[0, 1]"), &inv).unwrap();
    assert_eq!(
        built.plan.dynamic_mig,
        [
            DynamicMigGpu {
                index: 0,
                uuid: inv.gpus[0].uuid.clone(),
                occupied: vec![MigPlacement { start: 4, size: 4 }],
                health: Health::Healthy,
            },
            DynamicMigGpu {
                index: 1,
                uuid: inv.gpus[1].uuid.clone(),
                occupied: Vec::new(),
                health: Health::Healthy,
            },
        ]
    );
    // The static device stays advertised as before.
    assert!(
        built.plan.resources.contains_key("nvidia.com/mig-3g.40gb"),
        "{:?}",
        built.plan.resources.keys()
    );
    assert!(built.warnings.is_empty(), "{:?}", built.warnings);
}

#[test]
fn each_gpu_carries_its_health_in_the_plans_inventory() {
    let mut inv = node();
    inv.gpus[1].health = Health::Unhealthy;
    let built = build(&policy("mixed", "", "[0, 1]"), &inv).unwrap();
    let health: Vec<(u32, Health)> = built
        .plan
        .dynamic_mig
        .iter()
        .map(|g| (g.index, g.health))
        .collect();
    assert_eq!(health, [(0, Health::Healthy), (1, Health::Unhealthy)]);
}

#[test]
fn an_unknown_placement_or_geometry_is_a_warning_and_nothing_dynamic() {
    let mut inv = node();
    inv.gpus[0].mig_devices[0].placement = None;
    let built = build(&policy("mixed", "", "[0, 1]"), &inv).unwrap();
    assert_eq!(indices(&built), [1]);
    assert!(
        built
            .warnings
            .iter()
            .any(|w| w.starts_with("dra.dynamicMig.devices: GPU 0")
                && w.contains("is unknown; nothing is published")),
        "{:?}",
        built.warnings
    );
    let mut inv = node();
    inv.gpus[1].mig_geometry = None;
    let built = build(&policy("mixed", "", "[0, 1]"), &inv).unwrap();
    assert_eq!(indices(&built), [0]);
    assert!(
        built
            .warnings
            .iter()
            .any(|w| w.starts_with("dra.dynamicMig.devices: GPU 1")
                && w.contains("profiles and placements are unknown")),
        "{:?}",
        built.warnings
    );
}

#[test]
fn every_form_of_devices_resolves_on_the_node() {
    let inv = empty_mig_node(4);
    let uuid = |i: usize| inv.gpus[i].uuid.clone();
    // (devices, GPUs, a warning containing)
    let cases: Vec<(String, Vec<u32>, Option<&str>)> = vec![
        ("all".into(), vec![0, 1, 2, 3], None),
        ("2".into(), vec![0, 1], None),
        (
            "6".into(),
            vec![0, 1, 2, 3],
            Some("asks for the first 6 GPUs, this node has 4"),
        ),
        ("[3, 1]".into(), vec![1, 3], None),
        (format!("[{}, {}]", uuid(2), uuid(0)), vec![0, 2], None),
        (format!("[{}, 2]", uuid(2)), vec![2], None),
        ("[1, 7]".into(), vec![1], Some("this node has no GPU 7")),
        (
            "[GPU-ffffffff-ffff-ffff-ffff-ffffffffffff]".into(),
            vec![],
            Some("this node has no GPU GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"),
        ),
    ];
    for (devices, want, warning) in cases {
        let built = build(&policy("mixed", "", &devices), &inv).unwrap();
        assert_eq!(indices(&built), want, "{devices}");
        for g in &built.plan.dynamic_mig {
            assert_eq!(g.uuid, inv.gpus[g.index as usize].uuid, "{devices}");
            assert!(g.occupied.is_empty(), "{devices}");
            // Its free space is published: no "nothing is advertised for it".
            let empty = format!(
                "GPU {} ({}) has MIG enabled and no MIG devices",
                g.index, g.uuid
            );
            assert!(
                !built.warnings.iter().any(|w| w.contains(&empty)),
                "{devices}: {:?}",
                built.warnings
            );
        }
        // The GPUs left out of dynamic MIG keep that warning.
        let warned_empty = built
            .warnings
            .iter()
            .filter(|w| w.contains("has MIG enabled and no MIG devices"))
            .count();
        assert_eq!(
            warned_empty,
            4 - want.len(),
            "{devices}: {:?}",
            built.warnings
        );
        let dynamic_warnings: Vec<&String> = built
            .warnings
            .iter()
            .filter(|w| w.starts_with("dra.dynamicMig.devices"))
            .collect();
        match warning {
            Some(w) => assert!(
                dynamic_warnings.len() == 1 && dynamic_warnings[0].contains(w),
                "{devices}: {:?}",
                built.warnings
            ),
            None => assert!(
                dynamic_warnings.is_empty(),
                "{devices}: {:?}",
                built.warnings
            ),
        }
    }
    // No dynamicMig key: nothing dynamic.
    let p = parse("version: v1\nflags:\n  migStrategy: mixed\n").unwrap();
    assert!(build(&p, &inv).unwrap().plan.dynamic_mig.is_empty());
}

// ---- names ----

/// GPUs 0-2 of `model` (MIG off on GPU 0, on and empty on GPUs 1 and 2).
fn table_node(model: &str, memory_mib: u64) -> Inventory {
    let gpu = format!("  - model: {model}\n    memoryMiB: {memory_mib}\n");
    let text = format!("gpus:\n{gpu}{gpu}    count: 2\n    mig:\n      devices: []\n");
    simulated::parse(std::path::Path::new("names"), &text).unwrap()
}

#[test]
fn every_placement_of_every_table_round_trips_through_its_name() {
    for (table, memory_mib) in TABLES {
        let inv = table_node(table.product, *memory_mib);
        let mut names = BTreeSet::new();
        for row in table.profiles {
            for &start in row.starts {
                let name = dynamic_mig_name(2, row.name, start)
                    .unwrap_or_else(|| panic!("{} {} {start}", table.product, row.name));
                assert!(is_dns_label(&name), "{name}");
                assert!(name.starts_with("gpu-2-mig-"), "{name}");
                assert!(names.insert(name.clone()), "{name} twice");
                assert_eq!(
                    parse_dynamic_mig(&name, &inv),
                    Some(DynamicMigDevice {
                        gpu_index: 2,
                        gpu_uuid: inv.gpus[2].uuid.clone(),
                        profile: row.name.to_string(),
                        placement: MigPlacement {
                            start,
                            size: row.size
                        },
                    }),
                    "{} {name}",
                    table.product
                );
                // GPU 0 has MIG mode off: no geometry, no device.
                let on_0 = dynamic_mig_name(0, row.name, start).unwrap();
                assert_eq!(parse_dynamic_mig(&on_0, &inv), None, "{on_0}");
            }
        }
    }
    assert_eq!(
        dynamic_mig_name(1, "1g.10gb+me", 6).as_deref(),
        Some("gpu-1-mig-1g-10gb-me-6")
    );
    assert_eq!(
        dynamic_mig_name(0, "3g.40gb", 4).as_deref(),
        Some("gpu-0-mig-3g-40gb-4")
    );
}

#[test]
fn other_forms_are_refused() {
    let inv = table_node("NVIDIA H100 80GB HBM3", 81559);
    assert!(parse_dynamic_mig("gpu-1-mig-1g-10gb-6", &inv).is_some());
    for name in [
        "gpu-1-mig-1g-10gb",             // no start
        "gpu-1-mig-1g-10gb-7",           // 1g.10gb has no placement at 7 on an H100
        "gpu-1-mig-3g-40gb-2",           // nor 3g.40gb at 2
        "gpu-1-mig-1g-10gb-07",          // a leading zero
        "gpu-01-mig-1g-10gb-6",          // a leading zero
        "gpu-+1-mig-1g-10gb-6",          // a sign u32's parse takes
        "gpu-1-mig-1g-10gb-+0",          // likewise in the start
        "gpu-1-mig-1g-10gb-00",          // a leading zero in the start
        "gpu-9-mig-1g-10gb-0",           // no GPU 9
        "gpu-1-mig-1g-5gb-0",            // an A100 profile
        "gpu-1-mig-1g.10gb-0",           // the profile as NVIDIA spells it
        "gpu-1-mig-1g-10gb+me-0",        // likewise
        "gpu-1-mig-1g-10gb--1",          // a negative start
        "gpu-1-mig-1g-10gb-0-r0",        // a replica suffix
        "gpu-x-mig-1g-10gb-0",           // no index
        "gpu--mig-1g-10gb-0",            // an empty index
        "GPU-1-mig-1g-10gb-0",           // upper case
        "gpu-1-MIG-1g-10gb-0",           // upper case
        "gpu-1-mig--0",                  // no profile
        "gpu-1-1g-10gb-0",               // no -mig-
        "mig-1-1g-10gb-0",               // not gpu-
        "gpu-1-mig-1g-10gb-99999999999", // a start past u32
        "",
    ] {
        assert_eq!(parse_dynamic_mig(name, &inv), None, "{name:?}");
    }
    // A profile that gives no DNS label has no name.
    assert_eq!(dynamic_mig_name(0, "1g_10gb", 0), None);
    assert_eq!(dynamic_mig_name(0, &"7g.".repeat(30), 0), None);
}
