use std::collections::BTreeSet;

use super::*;
use crate::inventory::{simulated, test_node};
use crate::plan::dra_names::is_dns_label;
use crate::plan::{self, Plan};
use crate::policy::parse;

fn params(generation: i64) -> SliceParams {
    SliceParams {
        node: "node-1".to_string(),
        driver: "gpu.slicelet.io".to_string(),
        generation,
        driver_version: Some("550.54.15".to_string()),
        unhealthy: Unhealthy::Withdraw,
    }
}

fn plan_of(policy: &str, inv: &Inventory) -> Plan {
    plan::build(&parse(policy).unwrap(), inv).unwrap().plan
}

fn h100_ts_mig() -> Inventory {
    simulated::parse(
        std::path::Path::new("h100-ts-mig"),
        include_str!("../../../config/nodes/h100-80gb-x8-ts-mig-mixed.yaml"),
    )
    .unwrap()
}

fn all_devices(s: &Slices) -> Vec<&Device> {
    s.slices
        .iter()
        .flat_map(|x| x.spec.devices.iter().flatten())
        .collect()
}

fn attr<'a>(d: &'a Device, key: &str) -> Option<&'a DeviceAttribute> {
    d.attributes.as_ref()?.get(key)
}

fn str_attr<'a>(d: &'a Device, key: &str) -> Option<&'a str> {
    attr(d, key)?.string.as_deref()
}

/// (policy, node, devices, slices, sharing values seen); MIG devices allocated whole consume
/// their GPU's counters, which take a slice of their own.
#[test]
fn table_of_nodes() {
    const TS4: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
    const MPS2: &str = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    const MIXED_TS: &str = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
    // (name, policy, node, devices, slices, sharing values seen)
    type Case<'a> = (&'a str, &'a str, Inventory, usize, usize, &'a [&'a str]);
    let cases: [Case; 4] = [
        ("whole", "version: v1\n", test_node(8), 8, 1, &["none"]),
        ("time-sliced", TS4, test_node(8), 32, 1, &["time-slicing"]),
        ("mps", MPS2, test_node(2), 4, 1, &["mps"]),
        (
            "mig-mixed",
            MIXED_TS,
            h100_ts_mig(),
            16 + 16,
            2,
            &["none", "time-slicing"],
        ),
    ];
    for (name, policy, inv, devices, slices, sharings) in cases {
        let plan = plan_of(policy, &inv);
        let s = build(
            plan.resources.values().map(|r| &**r),
            &inv,
            &params(3),
            &HealthMap::new(),
        );
        let devs = all_devices(&s);
        assert_eq!(devs.len(), devices, "{name}");
        assert_eq!(s.slices.len(), slices, "{name}");
        let seen: BTreeSet<&str> = devs.iter().filter_map(|d| str_attr(d, "sharing")).collect();
        assert_eq!(seen, sharings.iter().copied().collect(), "{name}");
        for sl in &s.slices {
            assert_eq!(sl.spec.node_name.as_deref(), Some("node-1"), "{name}");
            assert_eq!(sl.spec.driver, "gpu.slicelet.io", "{name}");
            assert_eq!(sl.spec.pool.name, "node-1", "{name}");
            assert_eq!(sl.spec.pool.generation, 3, "{name}");
            assert_eq!(sl.spec.pool.resource_slice_count, slices as i64, "{name}");
        }
        // One to one with the plan: every device ID's name, in plan order.
        let want: Vec<String> = plan
            .resources
            .values()
            .flat_map(|r| r.devices.iter().map(|d| device_name(&d.id)))
            .collect();
        let got: Vec<String> = devs.iter().map(|d| d.name.clone()).collect();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn attributes_of_whole_replica_mps_and_mig_devices() {
    let inv = h100_ts_mig();
    let plan = plan_of(
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n",
        &inv,
    );
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(1),
        &HealthMap::new(),
    );
    let devs = all_devices(&s);
    let gpu0 = &inv.gpus[0];
    let r1 = devs
        .iter()
        .find(|d| d.name == device_name(&format!("{}::1", gpu0.uuid)))
        .unwrap();
    assert_eq!(str_attr(r1, "uuid"), Some(gpu0.uuid.as_str()));
    assert_eq!(str_attr(r1, "type"), Some("gpu"));
    assert_eq!(str_attr(r1, "sharing"), Some("time-slicing"));
    assert_eq!(str_attr(r1, "resource"), Some("nvidia.com/gpu"));
    assert_eq!(str_attr(r1, "productName"), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(str_attr(r1, "architecture"), Some("Hopper"));
    assert_eq!(attr(r1, "replica").unwrap().int, Some(1));
    assert_eq!(
        attr(r1, "cudaComputeCapability")
            .unwrap()
            .version
            .as_deref(),
        Some("9.0.0")
    );
    assert_eq!(
        attr(r1, "driverVersion").unwrap().version.as_deref(),
        Some("550.54.15")
    );
    assert!(attr(r1, "parentUUID").is_none());
    let mem = |d: &Device| d.capacity.as_ref().unwrap()["memory"].value.0.clone();
    assert_eq!(mem(r1), "81559Mi");

    let g4 = &inv.gpus[4];
    let mig = &g4.mig_devices[0];
    let m = devs
        .iter()
        .find(|d| d.name == device_name(&mig.uuid))
        .unwrap();
    assert_eq!(str_attr(m, "uuid"), Some(mig.uuid.as_str()));
    assert_eq!(str_attr(m, "parentUUID"), Some(g4.uuid.as_str()));
    assert_eq!(str_attr(m, "profile"), Some("3g.40gb"));
    assert_eq!(str_attr(m, "type"), Some("mig"));
    assert_eq!(str_attr(m, "sharing"), Some("none"));
    assert_eq!(str_attr(m, "resource"), Some("nvidia.com/mig-3g.40gb"));
    assert!(attr(m, "replica").is_none());
    assert_eq!(mem(m), format!("{}Mi", mig.memory_mib));
    assert!(d_count_within_limit(m));
    // Each MIG device of the GPU has its own memory (3g.40gb, 2g.20gb, 1g.10gb differ).
    for mig in &g4.mig_devices {
        let m = devs
            .iter()
            .find(|d| d.name == device_name(&mig.uuid))
            .unwrap();
        assert_eq!(mem(m), format!("{}Mi", mig.memory_mib), "{}", mig.uuid);
    }
    let sizes: BTreeSet<u64> = g4.mig_devices.iter().map(|m| m.memory_mib).collect();
    assert_eq!(
        sizes.len(),
        3,
        "the node file's MIG devices differ in memory"
    );

    // MPS: the client's pinned-memory limit is its memory.
    let inv = test_node(1);
    let plan = plan_of(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n",
        &inv,
    );
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(1),
        &HealthMap::new(),
    );
    let devs = all_devices(&s);
    assert_eq!(devs.len(), 2);
    assert_eq!(mem(devs[0]), format!("{}Mi", 81559 / 2));
    assert_eq!(str_attr(devs[0], "sharing"), Some("mps"));
    assert_eq!(attr(devs[1], "replica").unwrap().int, Some(1));
}

/// Attributes and capacities together: at most 32 per device (the API server's limit).
fn d_count_within_limit(d: &Device) -> bool {
    d.attributes.as_ref().map_or(0, |a| a.len()) + d.capacity.as_ref().map_or(0, |c| c.len()) <= 32
}

#[test]
fn many_devices_are_split_into_slices_of_128() {
    let inv = test_node(8);
    // 8 GPUs × 336 replicas = 2,688 devices → 21 slices of 128.
    let plan = plan_of(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 336\n",
        &inv,
    );
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(7),
        &HealthMap::new(),
    );
    assert_eq!(s.slices.len(), 21);
    let names: BTreeSet<String> = s
        .slices
        .iter()
        .map(|x| x.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names.len(), 21);
    for sl in &s.slices {
        assert_eq!(sl.spec.devices.as_ref().unwrap().len(), 128);
        assert_eq!(sl.spec.pool.resource_slice_count, 21);
        assert_eq!(sl.spec.pool.generation, 7);
    }
    let devs = all_devices(&s);
    assert_eq!(devs.len(), 2688);
    let unique: BTreeSet<&str> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(unique.len(), 2688, "names unique within the pool");
    for d in &devs {
        assert!(is_dns_label(&d.name), "{}", d.name);
        assert!(d_count_within_limit(d));
    }
    // 129 devices: 2 slices.
    let plan = plan_of(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        devices: [0]\n        rename: nvidia.com/gpu-shared\n        replicas: 122\n",
        &inv,
    );
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(1),
        &HealthMap::new(),
    );
    assert_eq!(all_devices(&s).len(), 129);
    assert_eq!(s.slices.len(), 2);
    assert_eq!(s.slices[1].spec.devices.as_ref().unwrap().len(), 1);
}

#[test]
fn unhealthy_devices_are_withdrawn() {
    let mut inv = test_node(4);
    inv.gpus[2].health = Health::Unhealthy;
    let plan = plan_of(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n",
        &inv,
    );
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(1),
        &HealthMap::new(),
    );
    let devs = all_devices(&s);
    assert_eq!(devs.len(), 6);
    assert!(devs
        .iter()
        .all(|d| str_attr(d, "uuid") != Some(inv.gpus[2].uuid.as_str())));
    // Every GPU unhealthy: one empty slice, the pool still there.
    for g in &mut inv.gpus {
        g.health = Health::Unhealthy;
    }
    let plan = plan_of("version: v1\n", &inv);
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &params(2),
        &HealthMap::new(),
    );
    assert_eq!(s.slices.len(), 1);
    assert!(s.slices[0].spec.devices.is_none());
    assert_eq!(s.slices[0].spec.pool.resource_slice_count, 1);
}

#[test]
fn device_names_table() {
    let cases = [
        (
            "GPU-DF942CA2-b7c5-e6fa-29b0-3e2134fef416",
            "gpu-df942ca2-b7c5-e6fa-29b0-3e2134fef416",
        ),
        (
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416::12",
            "gpu-df942ca2-b7c5-e6fa-29b0-3e2134fef416-r12",
        ),
        (
            "MIG-a165959f-c8d1-18d4-a5be-52d841eb82f9",
            "mig-a165959f-c8d1-18d4-a5be-52d841eb82f9",
        ),
        (
            "MIG-a165959f-c8d1-18d4-a5be-52d841eb82f9::0",
            "mig-a165959f-c8d1-18d4-a5be-52d841eb82f9-r0",
        ),
    ];
    for (id, want) in cases {
        assert_eq!(device_name(id), want, "{id}");
        assert_eq!(device_name(id), device_name(id), "stable");
    }
    // Not expressible as a label: a digest, still a label, still stable, distinct.
    let odd = [
        "GPU-x/y",
        "GPU-a::x",
        "GPU-0000000000000000000000000000000000000000000000000000000000000000",
        "-lead",
    ];
    let names: BTreeSet<String> = odd.iter().map(|id| device_name(id)).collect();
    assert_eq!(names.len(), odd.len());
    for n in &names {
        assert!(n.starts_with("dev-") && is_dns_label(n), "{n}");
    }
}

#[test]
fn dns_labels_table() {
    for (s, ok) in [
        ("gpu-0", true),
        ("a", true),
        ("", false),
        ("-a", false),
        ("a-", false),
        ("A", false),
        ("a.b", false),
        (&"a".repeat(63), true),
        (&"a".repeat(64), false),
    ] {
        assert_eq!(is_dns_label(s), ok, "{s:?}");
    }
}

#[test]
fn architectures_and_versions_table() {
    for (cc, arch) in [
        ((3, 5), Some("Kepler")),
        ((5, 2), Some("Maxwell")),
        ((6, 0), Some("Pascal")),
        ((6, 1), Some("Pascal")),
        ((7, 0), Some("Volta")),
        ((7, 5), Some("Turing")),
        ((8, 0), Some("Ampere")),
        ((8, 6), Some("Ampere")),
        ((8, 7), Some("Ampere")),
        ((8, 9), Some("Ada Lovelace")),
        ((9, 0), Some("Hopper")),
        ((10, 0), Some("Blackwell")),
        ((12, 0), Some("Blackwell")),
        ((8, 8), None),
        ((99, 0), None),
    ] {
        assert_eq!(architecture(cc), arch, "{cc:?}");
    }
    for (text, want) in [
        ("550.54.15", Some("550.54.15")),
        ("535.104.05", Some("535.104.5")),
        ("560", Some("560.0.0")),
        ("1.2.3.4", None),
        ("abc", None),
        ("1..2", None),
        // A sign is not a digit (Rust's parse would take it).
        ("550.+54", None),
        ("", None),
    ] {
        assert_eq!(semver(text).as_deref(), want, "{text:?}");
    }
}

#[test]
fn slice_names_are_deterministic_subdomains() {
    assert_eq!(
        slice_name("node-1", "gpu.slicelet.io", 0),
        "node-1-gpu-slicelet-io-0"
    );
    let long = "n".repeat(250);
    let a = slice_name(&long, "gpu.slicelet.io", 3);
    assert!(a.len() <= MAX_OBJECT_NAME, "{}", a.len());
    assert!(a.ends_with("-3"));
    assert_eq!(a, slice_name(&long, "gpu.slicelet.io", 3));
    assert_ne!(a, slice_name(&"m".repeat(250), "gpu.slicelet.io", 3));
}

#[test]
fn a_name_taken_twice_keeps_the_first_device() {
    let inv = test_node(1);
    let plan = plan_of("version: v1\n", &inv);
    let res = &**plan.resources.values().next().unwrap();
    // The same resource twice (as a drain can keep one unit in two resources).
    let s = build([res, res], &inv, &params(1), &HealthMap::new());
    assert_eq!(all_devices(&s).len(), 1);
    assert_eq!(
        s.skipped,
        vec![format!("nvidia.com/gpu/{}", inv.gpus[0].uuid)]
    );
}

/// One policy, both paths: (policy, node, DRA resources, device-plugin resources) or the
/// overlap error's GPU.
#[test]
fn one_policy_both_paths_table() {
    const TS_DRA_MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n";
    /// (DRA resources, device-plugin resources), or the GPU of the overlap error.
    type Want = Result<(&'static [&'static str], &'static [&'static str]), u32>;
    let cases: [(&str, &str, Inventory, Want); 5] = [
        (
            "all device plugin",
            "version: v1\n",
            test_node(2),
            Ok((&[], &["nvidia.com/gpu"])),
        ),
        (
            "shared GPU 0 through DRA, the rest whole through the device plugin",
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n        dra: true\n",
            test_node(2),
            Ok((&["nvidia.com/gpu-shared"], &["nvidia.com/gpu"])),
        ),
        (
            "MIG through DRA, time-sliced whole GPUs through the device plugin",
            TS_DRA_MIXED,
            h100_ts_mig(),
            Ok((
                &[
                    "nvidia.com/mig-1g.10gb",
                    "nvidia.com/mig-2g.20gb",
                    "nvidia.com/mig-3g.40gb",
                ],
                &["nvidia.com/gpu"],
            )),
        ),
        (
            "one GPU's MIG devices split between the paths",
            "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-1g.10gb]\n",
            h100_ts_mig(),
            Err(4),
        ),
        (
            "MPS through DRA",
            "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n",
            test_node(2),
            Ok((&["nvidia.com/gpu"], &[])),
        ),
    ];
    for (name, policy, inv, want) in cases {
        let built = plan::build(&parse(policy).unwrap(), &inv);
        match (built, want) {
            (Ok(b), Ok((dra, plugin))) => {
                let got_dra: Vec<&str> = dra_resources(&b.plan).map(|r| r.name.as_str()).collect();
                let got_plugin: Vec<&str> = b
                    .plan
                    .resources
                    .values()
                    .filter(|r| !r.dra)
                    .map(|r| r.name.as_str())
                    .collect();
                assert_eq!(
                    (got_dra.as_slice(), got_plugin.as_slice()),
                    (dra, plugin),
                    "{name}"
                );
                // No physical unit in both.
                let units = |want_dra: bool| -> BTreeSet<String> {
                    b.plan
                        .resources
                        .values()
                        .filter(|r| r.dra == want_dra)
                        .flat_map(|r| r.devices.iter().map(|d| d.gpu_uuid.clone()))
                        .collect()
                };
                assert!(units(true).is_disjoint(&units(false)), "{name}");
            }
            (
                Err(plan::PlanError::DraOverlap {
                    gpu, dra, plugin, ..
                }),
                Err(want_gpu),
            ) => {
                assert_eq!(gpu, want_gpu, "{name}");
                assert_eq!(dra, "nvidia.com/mig-1g.10gb", "{name}");
                assert!(plugin.starts_with("nvidia.com/mig-"), "{name}");
            }
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

/// `dra: capacity`: each GPU published once, shared (`allowMultipleAllocations`), with its
/// memory and 100 % of its cores as capacities whose default share is 1/replicas.
#[test]
fn a_capacity_resource_publishes_each_gpu_once_with_memory_and_cores() {
    let inv = simulated::parse(
        std::path::Path::new("h100"),
        include_str!("../../../config/nodes/h100-80gb-x8.yaml"),
    )
    .unwrap();
    for (mode, isolation) in [("mps", "mps"), ("timeSlicing", "none")] {
        let policy = format!("version: v1\nsharing:\n  {mode}:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0, 1]\n        replicas: 4\n        dra: capacity\n");
        let plan = plan_of(&policy, &inv);
        let s = build(dra_resources(&plan), &inv, &params(1), &HealthMap::new());
        let devices = all_devices(&s);
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                device_name(&inv.gpus[0].uuid),
                device_name(&inv.gpus[1].uuid)
            ],
            "{mode}"
        );
        let d = devices[0];
        assert_eq!(d.allow_multiple_allocations, Some(true));
        assert_eq!(str_attr(d, "memoryIsolation"), Some(isolation));
        assert!(attr(d, "replica").is_none(), "{mode}: a unit is no replica");
        let cap = d.capacity.as_ref().unwrap();
        let memory = &cap[MEMORY];
        assert_eq!(memory.value.0, "81559Mi");
        let policy = memory.request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().unwrap().0, "20389Mi");
        assert_eq!(policy.valid_range.as_ref().unwrap().min.0, "1Mi");
        let cores = &cap[CORES];
        assert_eq!(cores.value.0, "100");
        let policy = cores.request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().unwrap().0, "25");
        let range = policy.valid_range.as_ref().unwrap();
        assert_eq!(
            (
                range.min.0.as_str(),
                range.max.as_ref().unwrap().0.as_str(),
                range.step.as_ref().unwrap().0.as_str()
            ),
            ("1", "100", "1")
        );
    }
    // `dra: true` stays one device per replica, not shared.
    let plan = plan_of("version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n        dra: true\n", &inv);
    let s = build(dra_resources(&plan), &inv, &params(1), &HealthMap::new());
    let devices = all_devices(&s);
    assert_eq!(devices.len(), 4);
    assert!(devices
        .iter()
        .all(|d| d.allow_multiple_allocations.is_none()));
    assert!(devices
        .iter()
        .all(|d| !d.capacity.as_ref().unwrap().contains_key(CORES)));
}

/// MIG mixed on GPUs 4–7 through DRA: one counter set per GPU in a slice of its own (no
/// devices), each MIG device consuming its memory and GPU-instance slices from its GPU's set;
/// the sums never exceed the GPU's; within the API's limits (64 devices per slice with
/// counters, 32 counters per slice, one consumption per set per device).
#[test]
fn mig_devices_consume_their_gpus_counters() {
    let inv = h100_ts_mig();
    let plan = plan_of("version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-3g.40gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-1g.10gb]\n", &inv);
    let s = build(dra_resources(&plan), &inv, &params(1), &HealthMap::new());
    let counter_slice = &s.slices[0].spec;
    assert!(
        counter_slice.devices.is_none(),
        "counters in a slice of their own"
    );
    let sets = counter_slice.shared_counters.as_ref().unwrap();
    let names: Vec<&str> = sets.iter().map(|c| c.name.as_str()).collect();
    let mut want: Vec<String> = inv.gpus[4..]
        .iter()
        .map(|g| counter_set_name(&g.uuid))
        .collect();
    want.sort();
    assert_eq!(names, want);
    let total_counters: usize = s
        .slices
        .iter()
        .filter_map(|x| x.spec.shared_counters.as_ref())
        .flatten()
        .map(|c| c.counters.len())
        .sum();
    assert!(total_counters <= 32);
    for set in sets {
        assert_eq!(set.counters[COUNTER_MEMORY_SLICES].value.0, "8");
        assert_eq!(set.counters[COUNTER_COMPUTE_SLICES].value.0, "7");
    }
    let devices = all_devices(&s);
    assert_eq!(devices.len(), 16);
    let mut used: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for d in &devices {
        let c = d
            .consumes_counters
            .as_ref()
            .expect("a whole MIG device consumes");
        assert_eq!(c.len(), 1);
        let mem: u64 = c[0].counters[COUNTER_MEMORY_SLICES]
            .value
            .0
            .parse()
            .unwrap();
        let slices: u64 = c[0].counters[COUNTER_COMPUTE_SLICES]
            .value
            .0
            .parse()
            .unwrap();
        let e = used.entry(c[0].counter_set.clone()).or_default();
        e.0 += mem;
        e.1 += slices;
    }
    for (set, (mib, slices)) in &used {
        assert!(
            *mib <= 81559 && *slices <= 7,
            "{set}: {mib} MiB, {slices} slices"
        );
        // 3g.40gb + 2g.20gb + 2 × 1g.10gb: 3 + 2 + 1 + 1.
        assert_eq!(*slices, 7, "{set}");
    }
    for sl in &s.slices {
        assert!(sl.spec.devices.as_ref().map_or(0, Vec::len) <= MAX_DEVICES_PER_SLICE_WITH_TAINTS);
        assert_eq!(sl.spec.pool.resource_slice_count, s.slices.len() as i64);
    }
    // Time-sliced MIG devices (replicas) consume nothing: they share one device.
    let ts = plan_of("version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-3g.40gb, nvidia.com/mig-2g.20gb]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n        dra: true\n", &inv);
    let s = build(dra_resources(&ts), &inv, &params(1), &HealthMap::new());
    let replicas: Vec<&Device> = all_devices(&s)
        .into_iter()
        .filter(|d| attr(d, "replica").is_some())
        .collect();
    // 4 GPUs × 2 1g.10gb devices × 2 replicas.
    assert_eq!(replicas.len(), 4 * 2 * 2);
    assert!(replicas.iter().all(|d| d.consumes_counters.is_none()));
}

/// Memory slices of NVIDIA's profiles on the GPUs that have them (NVIDIA's MIG user guide).
#[test]
fn memory_slices_of_nvidias_profiles() {
    for (profile_gb, gpu_mib, total, want) in [
        (10, 81559, 8, 1),
        (20, 81559, 8, 2),
        (40, 81559, 8, 4),
        (80, 81559, 8, 8),
        (18, 143_771, 8, 1),
        (35, 143_771, 8, 2),
        (71, 143_771, 8, 4),
        (141, 143_771, 8, 8),
        (12, 95_830, 8, 1),
        (47, 95_830, 8, 4),
        (5, 40960, 8, 1),
        (20, 40960, 8, 4),
        (6, 24576, 4, 1),
        (12, 24576, 4, 2),
        (24, 24576, 4, 4),
    ] {
        assert_eq!(
            memory_slices(profile_gb, gpu_mib, total),
            want,
            "{profile_gb}gb of {gpu_mib} MiB"
        );
    }
    assert_eq!(gpu_slices("NVIDIA A30"), (4, 4));
    assert_eq!(gpu_slices("NVIDIA H100 80GB HBM3"), (7, 8));
}

fn tainting(generation: i64, xid_effect: TaintEffect) -> SliceParams {
    SliceParams {
        unhealthy: Unhealthy::Taint { xid_effect },
        ..params(generation)
    }
}

/// Time `secs` after the epoch, with a fraction (the taint keeps whole seconds).
fn at(secs: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(secs * 1000 + 250)
}

fn health_of(plan: &Plan, prev: &HealthMap, cause: Cause, now: u64) -> HealthMap {
    crate::dra::health_map::fold(
        prev,
        plan.resources.values().map(|r| &**r),
        &|_, _| Some((cause, cause.label())),
        at(now),
    )
}

fn taints_of<'a>(devs: &[&'a Device], uuid: &str) -> Vec<&'a DeviceTaint> {
    devs.iter()
        .filter(|d| str_attr(d, "uuid") == Some(uuid))
        .flat_map(|d| d.taints.iter().flatten())
        .collect()
}

/// A label value as the API server validates a taint's value: at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric.
fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// What the API server checks of every device's taints, and of slices that use them.
fn check_taint_limits(s: &Slices) {
    for sl in &s.slices {
        let n = sl.spec.devices.as_ref().map_or(0, Vec::len);
        let tainted = sl
            .spec
            .devices
            .iter()
            .flatten()
            .any(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()));
        if tainted {
            assert!(
                n <= MAX_DEVICES_PER_SLICE_WITH_TAINTS,
                "{n} devices in a slice with taints"
            );
        }
        for d in sl.spec.devices.iter().flatten() {
            let taints = d.taints.as_deref().unwrap_or_default();
            assert!(taints.len() <= MAX_TAINTS_PER_DEVICE, "{}", d.name);
            for t in taints {
                let (prefix, name) = t.key.split_once('/').unwrap();
                assert!(
                    prefix.len() <= 253 && prefix.split('.').all(is_dns_label),
                    "{}",
                    t.key
                );
                assert!(
                    !name.is_empty() && name.len() <= 63 && is_label_value(name),
                    "{}",
                    t.key
                );
                assert!(
                    is_label_value(t.value.as_deref().unwrap_or_default()),
                    "{t:?}"
                );
                assert!(
                    ["NoSchedule", "NoExecute"].contains(&t.effect.as_str()),
                    "{t:?}"
                );
                assert!(t.time_added.is_some(), "{t:?}");
            }
        }
    }
}

/// An Xid on GPU 1: its replicas stay published, each with one taint (key, value `xid-79`,
/// effect NoSchedule, timeAdded = when it turned Unhealthy, whole seconds); republished later
/// with the same health, timeAdded stays; recovered, the taint is gone.
#[test]
fn an_xid_taints_its_devices_until_it_recovers() {
    let mut inv = test_node(4);
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let healthy = plan_of(policy, &inv);
    let h0 = health_of(&healthy, &HealthMap::new(), Cause::Xid(79), 100);
    let s = build(
        healthy.resources.values().map(|r| &**r),
        &inv,
        &tainting(1, TaintEffect::NoSchedule),
        &h0,
    );
    assert!(all_devices(&s).iter().all(|d| d.taints.is_none()));
    inv.gpus[1].health = Health::Unhealthy;
    let sick = plan_of(policy, &inv);
    let h1 = health_of(&sick, &h0, Cause::Xid(79), 200);
    let s = build(
        sick.resources.values().map(|r| &**r),
        &inv,
        &tainting(2, TaintEffect::NoSchedule),
        &h1,
    );
    check_taint_limits(&s);
    let devs = all_devices(&s);
    assert_eq!(devs.len(), 8, "nothing withdrawn");
    let t = taints_of(&devs, &inv.gpus[1].uuid);
    assert_eq!(t.len(), 2, "one taint per replica");
    for t in &t {
        assert_eq!(t.key, "gpu.slicelet.io/unhealthy");
        assert_eq!(t.value.as_deref(), Some("xid-79"));
        assert_eq!(t.effect, "NoSchedule");
        assert_eq!(t.time_added.as_ref().unwrap().0.as_second(), 200);
        assert_eq!(t.time_added.as_ref().unwrap().0.subsec_nanosecond(), 0);
    }
    assert!(taints_of(&devs, &inv.gpus[0].uuid).is_empty());
    // Republished at 300, still Unhealthy for the same Xid: the same taint, the same time.
    let h2 = health_of(&sick, &h1, Cause::Xid(79), 300);
    let again = build(
        sick.resources.values().map(|r| &**r),
        &inv,
        &tainting(2, TaintEffect::NoSchedule),
        &h2,
    );
    assert_eq!(again, s);
    // Recovered: no taint left.
    inv.gpus[1].health = Health::Healthy;
    let well = plan_of(policy, &inv);
    let h3 = health_of(&well, &h2, Cause::Xid(79), 400);
    let s = build(
        well.resources.values().map(|r| &**r),
        &inv,
        &tainting(3, TaintEffect::NoSchedule),
        &h3,
    );
    assert!(all_devices(&s).iter().all(|d| d.taints.is_none()));
    // The same plan withdrawing (an API server without taints): GPU 1's replicas are left out.
    let s = build(sick.resources.values().map(|r| &**r), &inv, &params(4), &h1);
    assert_eq!(all_devices(&s).len(), 6);
}

/// The value and effect of each cause: NoExecute only for an Xid, and only when the policy
/// asks; every value a label value.
#[test]
fn taint_values_and_effects_table() {
    let causes = [
        (Cause::Xid(79), "xid-79"),
        (Cause::Xid(u64::MAX), "xid-18446744073709551615"),
        (Cause::Lost, "lost"),
        (Cause::Unwatched, "unwatched"),
        (Cause::CdiUnresolved, "cdi-unresolved"),
        (Cause::MpsNotReady, "mps-not-ready"),
        (Cause::Draining, "draining"),
        (Cause::Other, "unhealthy"),
    ];
    for (cause, value) in causes {
        for xid_effect in [TaintEffect::NoSchedule, TaintEffect::NoExecute] {
            let h = crate::dra::health_map::DeviceHealth {
                health: Health::Unhealthy,
                cause: Some(cause),
                message: String::new(),
                since: at(1_700_000_000),
            };
            let t = taint(&h, xid_effect);
            assert_eq!(t.value.as_deref(), Some(value));
            assert!(is_label_value(value), "{value}");
            let want = match cause {
                Cause::Xid(_) => xid_effect.as_str(),
                _ => "NoSchedule",
            };
            assert_eq!(t.effect, want, "{cause:?} {xid_effect:?}");
            assert_eq!(t.time_added.unwrap().0.as_second(), 1_700_000_000);
        }
    }
}

/// With taints in use a slice holds at most 64 devices (whether or not one is tainted now, so
/// a taint never moves devices between slices); withdrawing, 128.
#[test]
fn slices_hold_64_devices_when_taints_are_in_use() {
    let mut inv = test_node(8);
    // 8 × 40 = 320 devices: 5 slices of 64 with taints, 3 (128, 128, 64) without.
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 40\n";
    let plan = plan_of(policy, &inv);
    let h = health_of(&plan, &HealthMap::new(), Cause::Lost, 1);
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &tainting(1, TaintEffect::NoSchedule),
        &h,
    );
    assert_eq!(s.slices.len(), 5);
    for sl in &s.slices {
        assert_eq!(sl.spec.devices.as_ref().unwrap().len(), 64);
        assert_eq!(sl.spec.pool.resource_slice_count, 5);
    }
    let s = build(plan.resources.values().map(|r| &**r), &inv, &params(1), &h);
    assert_eq!(s.slices.len(), 3);
    // Every GPU Unhealthy: all 320 tainted, still 64 per slice, each device one taint.
    for g in &mut inv.gpus {
        g.health = Health::Unhealthy;
    }
    let plan = plan_of(policy, &inv);
    let h = health_of(&plan, &h, Cause::Xid(48), 2);
    let s = build(
        plan.resources.values().map(|r| &**r),
        &inv,
        &tainting(2, TaintEffect::NoExecute),
        &h,
    );
    check_taint_limits(&s);
    assert_eq!(s.slices.len(), 5);
    let devs = all_devices(&s);
    assert_eq!(devs.len(), 320);
    assert!(devs.iter().all(|d| d.taints.as_ref().unwrap().len() == 1));
    assert!(devs
        .iter()
        .all(|d| d.taints.as_ref().unwrap()[0].effect == "NoExecute"));
}

/// A unit the drain rules keep in two resources, Healthy in one and Unhealthy in the other:
/// the name goes to the Healthy device, tainted or not, and only Healthy duplicates are
/// reported.
#[test]
fn a_healthy_device_wins_its_name_over_an_unhealthy_one() {
    let inv = test_node(1);
    let plan = plan_of("version: v1\n", &inv);
    let res = &**plan.resources.values().next().unwrap();
    let mut sick = res.clone();
    sick.devices[0].health = Health::Unhealthy;
    let h = health_of(&plan, &HealthMap::new(), Cause::Draining, 1);
    for order in [[&sick, res], [res, &sick]] {
        let s = build(order, &inv, &tainting(1, TaintEffect::NoSchedule), &h);
        let devs = all_devices(&s);
        assert_eq!(devs.len(), 1);
        assert!(devs[0].taints.is_none(), "the Healthy copy is published");
        assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    }
}
