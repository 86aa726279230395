use super::*;
use crate::inventory::simulated;
use crate::plan::{build, PlanView};
use crate::policy::parse;

const R615: &str = include_str!("../../../config/nodes/h100-80gb-x8-r615.yaml");
const R550: &str = include_str!("../../../config/nodes/h100-80gb-x8.yaml");
const MIXED: &str = include_str!("../../../config/nodes/h100-80gb-x8-mig-mixed.yaml");
const POLICY: &str = include_str!("../../../config/policy-memory.yaml");

fn node(text: &str) -> Inventory {
    simulated::parse(std::path::Path::new("node.yaml"), text).unwrap()
}

fn with_driver(text: &str, version: &str) -> Inventory {
    let mut inv = node(text);
    inv.driver_version = Some(version.to_string());
    inv
}

/// One time-slicing entry on GPU 0 with `memory` as given (YAML flow mapping).
fn entry(name: &str, replicas: u32, memory: &str) -> String {
    format!(
        "      - name: nvidia.com/gpu\n        rename: {name}\n        devices: [0]\n        replicas: {replicas}\n        memory: {memory}\n"
    )
}

fn policy(strategy: &str, entries: &[String]) -> crate::policy::Policy {
    parse(&format!(
        "version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n    deviceListStrategy: {strategy}\nsharing:\n  timeSlicing:\n    resources:\n{}",
        entries.concat()
    ))
    .unwrap()
}

/// `(id, hard MiB, enforced)` of every device of `resource` in the plan's view.
fn limits(view: &PlanView, resource: &str) -> Vec<(String, Option<u64>, Option<bool>)> {
    view.resources
        .iter()
        .find(|r| r.name == resource)
        .unwrap_or_else(|| panic!("no {resource}"))
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.memory_hard_mib, d.memory_enforced))
        .collect()
}

#[test]
fn two_entries_share_gpu_0_by_size_with_their_own_limits() {
    let inv = node(R615);
    let built = build(&parse(POLICY).unwrap(), &inv).unwrap();
    let view = built.plan.view();
    let gpu0 = &inv.gpus[0].uuid;
    assert_eq!(
        limits(&view, "nvidia.com/gpu-20gb"),
        [
            (format!("{gpu0}::0"), Some(20480), Some(true)),
            (format!("{gpu0}::1"), Some(20480), Some(true)),
        ]
    );
    assert_eq!(
        limits(&view, "nvidia.com/gpu-38gb"),
        [(format!("{gpu0}::2"), Some(38912), Some(true))]
    );
    // GPUs 1-7 stay whole, without limits.
    let whole = limits(&view, "nvidia.com/gpu");
    assert_eq!(whole.len(), 7);
    assert!(whole
        .iter()
        .all(|(_, hard, e)| hard.is_none() && e.is_none()));
    assert!(built.warnings.is_empty(), "{:?}", built.warnings);
    // The JSON carries the documented keys.
    let json = serde_json::to_value(&view).unwrap();
    let dev = &json["resources"].as_array().unwrap()[1]["devices"][0];
    assert_eq!(dev["memoryHardMiB"], 20480, "{json}");
    assert_eq!(dev["memoryEnforced"], true);
    assert!(dev.get("memorySoftMiB").is_none());
}

#[test]
fn limits_over_the_gpus_memory_are_refused_naming_the_gpu_and_its_memory() {
    let inv = node(R615);
    let one = policy(
        "cdi-cri",
        &[entry("nvidia.com/gpu-30gb", 3, "{hard: 30Gi}")],
    );
    let e = build(&one, &inv).unwrap_err();
    assert!(
        matches!(&e, PlanError::MemoryOversubscribed { unit, .. } if unit == "GPU 0"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains("81,559 MiB"), "{text}");
    assert!(text.contains("92,160 MiB"), "{text}");
    assert!(
        text.contains("sharing.timeSlicing.resources[0]: 3 × 30,720 MiB"),
        "{text}"
    );
    // Summed across entries too: 2 × 30 GiB + 1 × 30 GiB.
    let two = policy(
        "cdi-cri",
        &[
            entry("nvidia.com/gpu-a", 2, "{hard: 30Gi}"),
            entry("nvidia.com/gpu-b", 1, "{hard: 30Gi}"),
        ],
    );
    let text = build(&two, &inv).unwrap_err().to_string();
    assert!(text.contains("resources[1]: 1 × 30,720 MiB"), "{text}");
    // Exactly the GPU's memory fits.
    let full = policy(
        "cdi-cri",
        &[entry("nvidia.com/gpu-full", 1, "{hard: 81559Mi}")],
    );
    build(&full, &inv).unwrap();
}

#[test]
fn required_limits_are_refused_where_they_cannot_be_enforced() {
    let one = policy(
        "cdi-cri",
        &[entry("nvidia.com/gpu-20gb", 2, "{hard: 20Gi}")],
    );
    // A driver before R615.
    let e = build(&one, &with_driver(R550, "550.54.15"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("driver 550.54.15 is older than R615"), "{e}");
    assert!(e.contains("sharing.timeSlicing.resources[0].memory"), "{e}");
    assert!(e.contains("GPU 0"), "{e}");
    let e = build(&one, &with_driver(R615, "614.99"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("older than R615"), "{e}");
    build(&one, &with_driver(R615, "615")).unwrap();
    // No driver version known.
    let mut inv = node(R615);
    inv.driver_version = None;
    assert!(build(&one, &inv)
        .unwrap_err()
        .to_string()
        .contains("unknown"));
    // cgroup v1.
    let mut inv = node(R615);
    inv.cgroup_v2 = false;
    assert!(build(&one, &inv)
        .unwrap_err()
        .to_string()
        .contains("cgroup v1"));
    // No CDI, so no hook.
    let env = policy("envvar", &[entry("nvidia.com/gpu-20gb", 2, "{hard: 20Gi}")]);
    let e = build(&env, &node(R615)).unwrap_err().to_string();
    assert!(e.contains("deviceListStrategy"), "{e}");
    // Through DRA a replica claim gets the hook only as a cdi-cri CDI device (annotations are
    // dropped): envvar and cdi-annotations cannot enforce it, cdi-cri can.
    let dra = |strategy: &str| {
        policy(
            strategy,
            &[entry("nvidia.com/gpu-20gb", 2, "{hard: 20Gi}")
                .replace("        memory:", "        dra: true\n        memory:")],
        )
    };
    for strategy in ["envvar", "cdi-annotations"] {
        let e = build(&dra(strategy), &node(R615)).unwrap_err().to_string();
        assert!(e.contains("has no cdi-cri"), "{strategy}: {e}");
    }
    build(&dra("cdi-cri"), &node(R615)).unwrap();
    // A MIG device (GPU 0 of the mixed node is 7x 1g.10gb).
    let mig = parse(
        "version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: nvidia.com/mig-1g.10gb-shared\n        replicas: 2\n        memory: {hard: 4Gi}\n",
    )
    .unwrap();
    let e = build(&mig, &with_driver(MIXED, "615.20"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("MIG device 0:0"), "{e}");
}

#[test]
fn best_effort_serves_and_marks_the_replicas_unenforced() {
    let one = policy(
        "cdi-cri",
        &[entry(
            "nvidia.com/gpu-20gb",
            2,
            "{hard: 20Gi, soft: 16Gi, enforce: best-effort}",
        )],
    );
    let built = build(&one, &with_driver(R550, "550.54.15")).unwrap();
    let view = built.plan.view();
    let gpu0 = &node(R550).gpus[0].uuid;
    assert_eq!(
        limits(&view, "nvidia.com/gpu-20gb"),
        [
            (format!("{gpu0}::0"), Some(20480), Some(false)),
            (format!("{gpu0}::1"), Some(20480), Some(false)),
        ]
    );
    assert_eq!(view.resources[1].devices[0].memory_soft_mib, Some(16384));
    assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
    assert!(built.warnings[0].contains("not enforced on GPU 0"));
    // Even best-effort limits must fit the GPU.
    let over = policy(
        "cdi-cri",
        &[entry(
            "nvidia.com/gpu-x",
            3,
            "{hard: 30Gi, enforce: best-effort}",
        )],
    );
    assert!(build(&over, &node(R550)).is_err());
}

/// A `dra: true` entry's limit under a list strategy without `cdi-cri`: its replica claims get
/// no hook, so `plan` shows them unenforced with a warning saying why (under `best-effort`;
/// `required` refuses it, above).
#[test]
fn a_dra_replica_without_cdi_cri_is_shown_unenforced() {
    let dra = policy(
        "envvar",
        &[entry(
            "nvidia.com/gpu-20gb",
            2,
            "{hard: 20Gi, enforce: best-effort}",
        )
        .replace("        memory:", "        dra: true\n        memory:")],
    );
    let built = build(&dra, &node(R615)).unwrap();
    let view = built.plan.view();
    let gpu0 = &node(R615).gpus[0].uuid;
    assert_eq!(
        limits(&view, "nvidia.com/gpu-20gb"),
        [
            (format!("{gpu0}::0"), Some(20480), Some(false)),
            (format!("{gpu0}::1"), Some(20480), Some(false)),
        ]
    );
    assert_eq!(built.warnings.len(), 1, "{:?}", built.warnings);
    let w = &built.warnings[0];
    assert!(
        w.starts_with("sharing.timeSlicing.resources[0].memory: not enforced on GPU 0"),
        "{w}"
    );
    assert!(w.contains("has no cdi-cri"), "{w}");
    // The JSON `slicelet plan` prints.
    let json = serde_json::to_value(&view).unwrap();
    let dev = &json["resources"].as_array().unwrap()[1]["devices"][0];
    assert_eq!(dev["memoryEnforced"], false, "{json}");
}

#[test]
fn a_gpu_is_shared_by_entries_only_when_each_sets_memory() {
    let inv = node(R615);
    let plain = "      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-plain\n        devices: [0]\n        replicas: 2\n".to_string();
    for entries in [
        [entry("nvidia.com/gpu-a", 1, "{hard: 10Gi}"), plain.clone()],
        [plain.clone(), entry("nvidia.com/gpu-a", 1, "{hard: 10Gi}")],
    ] {
        let e = build(&policy("cdi-cri", &entries), &inv).unwrap_err();
        assert!(
            matches!(e, PlanError::GpuClaimedTwice { gpu: 0, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("memory.hard"), "{e}");
    }
    // Two MPS entries never share a GPU (one control daemon per GPU), limits or not.
    let mps = parse("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-a\n        devices: [0]\n        replicas: 2\n        memory: {hard: 10Gi}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-b\n        devices: [0]\n        replicas: 2\n        memory: {hard: 10Gi}\n").unwrap();
    assert!(matches!(
        build(&mps, &inv).unwrap_err(),
        PlanError::GpuClaimedTwice { .. }
    ));
}

#[test]
fn an_mps_entry_s_hard_limit_is_its_clients_pinned_memory_floor() {
    let mps = parse("version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-mps\n        devices: [0]\n        replicas: 2\n        memory: {hard: 20Gi}\n").unwrap();
    let built = build(&mps, &node(R615)).unwrap();
    let res = &built.plan.resources["nvidia.com/gpu-mps"];
    let daemon = res.mps.as_ref().unwrap().daemons.values().next().unwrap();
    assert_eq!(daemon.limits.pinned_memory_mib, 20480);
    assert_eq!(res.memory.as_ref().unwrap().limits.hard_mib, 20480);
}

#[test]
fn thousands_separators() {
    for (n, s) in [
        (0, "0"),
        (999, "999"),
        (1000, "1,000"),
        (81559, "81,559"),
        (1234567, "1,234,567"),
    ] {
        assert_eq!(thousands(n), s);
    }
}

/// The daemon's build: a `required` limit a GPU cannot enforce (driver 550) holds that GPU's
/// sized replicas Unhealthy with the reason, serves the other GPUs, and says so once per GPU;
/// `build` (`slicelet plan`, `validate`) still refuses the policy; best-effort entries and a
/// node that can enforce are untouched.
#[test]
fn build_serving_fails_closed_per_gpu_under_required() {
    let p = parse(POLICY).unwrap();
    let inv = node(R550);
    assert!(matches!(
        build(&p, &inv),
        Err(PlanError::MemoryNotEnforceable { .. })
    ));
    let built = build_serving(&p, &inv, &BTreeMap::new()).unwrap();
    let res = &built.plan.resources;
    for name in ["nvidia.com/gpu-20gb", "nvidia.com/gpu-38gb"] {
        let r = &res[name];
        let m = r.memory.as_ref().unwrap();
        assert_eq!(m.limits.enforce, Enforce::Required);
        for d in &r.devices {
            assert!(!d.health.is_healthy(), "{name} {}", d.id);
            let why = required_refusal(m, d).unwrap();
            assert!(why.contains("R615"), "{why}");
        }
    }
    assert!(res["nvidia.com/gpu"]
        .devices
        .iter()
        .all(|d| d.health.is_healthy()));
    assert_eq!(res["nvidia.com/gpu"].devices.len(), 7);
    let said: Vec<&String> = built
        .warnings
        .iter()
        .filter(|w| w.contains("advertised Unhealthy (enforce: required)"))
        .collect();
    assert_eq!(said.len(), 2, "{:?}", built.warnings);
    assert!(!built
        .warnings
        .iter()
        .any(|w| w.contains("served under enforce: best-effort")));
    // Where it can be enforced: the same plan as `build`.
    let r615 = node(R615);
    assert_eq!(
        build_serving(&p, &r615, &BTreeMap::new()).unwrap().plan,
        build(&p, &r615).unwrap().plan
    );
}
