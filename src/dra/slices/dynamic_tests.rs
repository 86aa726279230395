//! Dynamic MIG slices: the devices one GPU gets, the counters each consumes, that the
//! scheduler can allocate together exactly the combinations the driver can create, what a
//! static instance and an Unhealthy GPU remove, packing 8 GPUs within the API's limits, and a
//! mixed pool keeping its static devices as they were.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::inventory::{simulated, MigPlacement};
use crate::plan::dra_names::is_dns_label;
use crate::plan::{self, DynamicMigGpu};
use crate::policy::parse;

const H100: &str = "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n";
const A100_40GB: &str = "  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n";
const A30: &str = "  - model: NVIDIA A30\n    memoryMiB: 24576\n";

fn params() -> SliceParams {
    SliceParams {
        node: "node-1".to_string(),
        driver: "gpu.slicelet.io".to_string(),
        generation: 1,
        driver_version: Some("550.54.15".to_string()),
        unhealthy: Unhealthy::Taint {
            xid_effect: TaintEffect::NoSchedule,
        },
    }
}

fn node(text: &str) -> Inventory {
    simulated::parse(std::path::Path::new("dynamic"), text).unwrap()
}

/// `n` GPUs of `gpu` with MIG on and no instance.
fn empty_mig(gpu: &str, n: u32) -> Inventory {
    node(&format!(
        "gpus:\n{gpu}    count: {n}\n    mig:\n      devices: []\n"
    ))
}

/// The plan of `policy` on `inv`, and its slices.
fn built(policy: &str, inv: &Inventory) -> (plan::Plan, Slices) {
    let plan = plan::build(&parse(policy).unwrap(), inv).unwrap().plan;
    let slices = build_pool(
        dra_resources(&plan),
        &plan.dynamic_mig,
        inv,
        &params(),
        &HealthMap::new(),
    );
    (plan, slices)
}

const DYNAMIC_ALL: &str =
    "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: all\n";

fn devices(s: &Slices) -> Vec<&Device> {
    s.slices
        .iter()
        .flat_map(|x| x.spec.devices.iter().flatten())
        .collect()
}

fn sets(s: &Slices) -> Vec<&CounterSet> {
    s.slices
        .iter()
        .flat_map(|x| x.spec.shared_counters.iter().flatten())
        .collect()
}

fn attr<'a>(d: &'a Device, key: &str) -> &'a DeviceAttribute {
    d.attributes
        .as_ref()
        .and_then(|a| a.get(key))
        .unwrap_or_else(|| panic!("{}: no {key}", d.name))
}

fn int_attr(d: &Device, key: &str) -> u32 {
    u32::try_from(attr(d, key).int.unwrap()).unwrap()
}

fn value(c: &Counter) -> u64 {
    c.value.0.parse().unwrap()
}

/// What `d` consumes, counter by counter, and from which set.
fn consumed(d: &Device) -> (String, BTreeMap<String, u64>) {
    let c = d.consumes_counters.as_ref().unwrap();
    assert_eq!(c.len(), 1, "{}", d.name);
    let counters = c[0]
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect();
    (c[0].counter_set.clone(), counters)
}

fn placement(d: &Device) -> MigPlacement {
    MigPlacement {
        start: int_attr(d, "placementStart"),
        size: int_attr(d, "placementSize"),
    }
}

fn profile(d: &Device) -> &str {
    attr(d, "profile").string.as_deref().unwrap()
}

/// The `g` of a profile name: `3g.40gb` → 3.
fn g_of(profile: &str) -> u64 {
    profile.split_once('g').unwrap().0.parse().unwrap()
}

/// The H100 80GB's profiles with the starts of their placements (NVIDIA's MIG user guide).
const H100_PLACEMENTS: [(&str, &[u32]); 7] = [
    ("1g.10gb", &[0, 1, 2, 3, 4, 5, 6]),
    ("2g.20gb", &[0, 2, 4]),
    ("3g.40gb", &[0, 4]),
    ("4g.40gb", &[0]),
    ("7g.80gb", &[0]),
    ("1g.10gb+me", &[0, 1, 2, 3, 4, 5, 6]),
    ("1g.20gb", &[0, 2, 4, 6]),
];

#[test]
fn an_empty_h100_gets_one_device_per_placement_of_each_profile() {
    let inv = empty_mig(H100, 1);
    let (_, s) = built(DYNAMIC_ALL, &inv);
    let got: Vec<(String, String, u32)> = devices(&s)
        .iter()
        .map(|d| (d.name.clone(), profile(d).to_string(), placement(d).start))
        .collect();
    let want: Vec<(String, String, u32)> = H100_PLACEMENTS
        .iter()
        .flat_map(|(p, starts)| {
            starts.iter().map(move |&st| {
                let label = p.replace(['.', '+'], "-");
                (format!("gpu-0-mig-{label}-{st}"), p.to_string(), st)
            })
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 25, "devices per H100 (docs/mig.md)");

    let uuid = &inv.gpus[0].uuid;
    for d in devices(&s) {
        let p = profile(d);
        let at = placement(d);
        assert_eq!(attr(d, "type").string.as_deref(), Some("mig"), "{}", d.name);
        assert_eq!(attr(d, "sharing").string.as_deref(), Some("none"));
        assert_eq!(attr(d, "parentUUID").string.as_deref(), Some(uuid.as_str()));
        assert_eq!(attr(d, "index").int, Some(0));
        assert_eq!(attr(d, "dynamic").bool, Some(true));
        let attrs = d.attributes.as_ref().unwrap();
        assert!(!attrs.contains_key("uuid"), "{}: no MIG device yet", d.name);
        assert!(
            !attrs.contains_key("resource"),
            "{}: no device plugin resource",
            d.name
        );
        let size = if p.starts_with("7g") {
            8
        } else if p.starts_with("3g") || p.starts_with("4g") {
            4
        } else if p.starts_with("2g") || p == "1g.20gb" {
            2
        } else {
            1
        };
        assert_eq!(at.size, size, "{}", d.name);
        let memory = &d.capacity.as_ref().unwrap()[MEMORY].value.0;
        let row = inv.gpus[0]
            .mig_geometry
            .as_ref()
            .unwrap()
            .profiles
            .iter()
            .find(|r| r.profile == p)
            .unwrap();
        assert_eq!(memory, &format!("{}Mi", row.memory_mib), "{}", d.name);
        assert!(
            attrs.len() + d.capacity.as_ref().map_or(0, BTreeMap::len)
                <= MAX_ATTRIBUTES_AND_CAPACITIES,
            "{}",
            d.name
        );

        // Counters: 1 of each memory slice the placement covers, the profile's compute
        // slices, and 1 of the +me instances for a +me profile.
        let (set, counters) = consumed(d);
        assert_eq!(set, "gpu-0-mig");
        let mut want: BTreeMap<String, u64> = (at.start..at.start + at.size)
            .map(|i| (format!("memory-slice-{i}"), 1))
            .collect();
        want.insert("compute-slices".to_string(), g_of(p));
        if p.ends_with("+me") {
            want.insert("1g-10gb-me-instances".to_string(), 1);
        }
        assert_eq!(counters, want, "{}", d.name);
    }

    // The set: one counter per memory slice, the GPU's compute slices, one +me instance.
    let sets = sets(&s);
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].name, "gpu-0-mig");
    let mut want: BTreeMap<String, u64> =
        (0..8).map(|i| (format!("memory-slice-{i}"), 1)).collect();
    want.insert("compute-slices".to_string(), 7);
    want.insert("1g-10gb-me-instances".to_string(), 1);
    let have: BTreeMap<String, u64> = sets[0]
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect();
    assert_eq!(have, want);
    // Counter slices first, then device slices.
    assert_eq!(s.slices.len(), 2);
    assert!(s.slices[0].spec.devices.is_none());
    assert!(s.slices[1].spec.shared_counters.is_none());
}

#[test]
fn devices_per_gpu_of_the_other_tables() {
    // (node, devices: the sum of each profile's placements)
    let (_, s) = built(DYNAMIC_ALL, &empty_mig(A100_40GB, 1));
    assert_eq!(devices(&s).len(), 25, "devices per A100 40GB (docs/mig.md)");
    for gpu in [
        "  - model: NVIDIA A100-SXM4-80GB\n    memoryMiB: 81920\n",
        "  - model: NVIDIA H200\n    memoryMiB: 143771\n",
    ] {
        let (_, s) = built(DYNAMIC_ALL, &empty_mig(gpu, 1));
        assert_eq!(devices(&s).len(), 25, "{gpu} (docs/mig.md: as an H100)");
        assert_eq!(sets(&s)[0].counters.len(), 10, "{gpu}");
    }
    let (_, s) = built(DYNAMIC_ALL, &empty_mig(A30, 1));
    // 1g.6gb ×4, 2g.12gb ×2, 4g.24gb ×1, 1g.6gb+me ×4, 2g.12gb+me ×2.
    assert_eq!(devices(&s).len(), 13);
    let set = sets(&s)[0];
    let names: Vec<&str> = set.counters.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "1g-6gb-me-instances",
            "2g-12gb-me-instances",
            "compute-slices",
            "memory-slice-0",
            "memory-slice-1",
            "memory-slice-2",
            "memory-slice-3",
        ]
    );
}

/// Every set of `devices` (indices) for which `fits` holds, found depth first: `fits` must be
/// monotone (a set that does not fit has no superset that does), as both callers' are.
fn every_fitting_set(n: usize, fits: &dyn Fn(&[usize]) -> bool) -> BTreeSet<Vec<usize>> {
    fn go(
        from: usize,
        n: usize,
        chosen: &mut Vec<usize>,
        fits: &dyn Fn(&[usize]) -> bool,
        out: &mut BTreeSet<Vec<usize>>,
    ) {
        out.insert(chosen.clone());
        for i in from..n {
            chosen.push(i);
            if fits(chosen) {
                go(i + 1, n, chosen, fits, out);
            }
            chosen.pop();
        }
    }
    let mut out = BTreeSet::new();
    go(0, n, &mut Vec::new(), fits, &mut out);
    out
}

/// The scheduler's view: the devices' summed counters within the set's.
fn counters_fit(set: &CounterSet, devs: &[&Device], chosen: &[usize]) -> bool {
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    for &i in chosen {
        for (k, v) in consumed(devs[i]).1 {
            *used.entry(k).or_default() += v;
        }
    }
    used.iter()
        .all(|(k, v)| set.counters.get(k).is_some_and(|c| *v <= value(c)))
}

/// The driver's view, beside the GPU's existing instances: no two placements share a memory
/// slice, no profile above NVML's instance count, the compute slices within the GPU's.
fn driver_creates(inv: &Inventory, devs: &[&Device], chosen: &[usize]) -> bool {
    let gpu = &inv.gpus[0];
    let geometry = gpu.mig_geometry.as_ref().unwrap();
    let mut per_profile: BTreeMap<&str, u32> = BTreeMap::new();
    let mut compute = 0;
    for m in &gpu.mig_devices {
        *per_profile.entry(m.profile.as_str()).or_default() += 1;
        compute += u64::from(m.gpu_slices);
        if chosen
            .iter()
            .any(|&i| placement(devs[i]).overlaps(&m.placement.unwrap()))
        {
            return false;
        }
    }
    for (n, &i) in chosen.iter().enumerate() {
        let p = profile(devs[i]);
        *per_profile.entry(p).or_default() += 1;
        compute += g_of(p);
        for &j in &chosen[..n] {
            if placement(devs[i]).overlaps(&placement(devs[j])) {
                return false;
            }
        }
    }
    let within_counts = per_profile.iter().all(|(p, n)| {
        let row = geometry.profiles.iter().find(|r| r.profile == *p).unwrap();
        *n <= row.instance_count
    });
    within_counts && compute <= u64::from(geometry.compute_slices)
}

#[test]
fn the_scheduler_can_allocate_together_exactly_what_the_driver_can_create() {
    let with = |gpu: &str, statics: &[(&str, u32)]| {
        let devices: String = statics
            .iter()
            .map(|(p, st)| format!("        - profile: {p}\n          placementStart: {st}\n"))
            .collect();
        node(&format!("gpus:\n{gpu}    mig:\n      devices:\n{devices}"))
    };
    let cases = [
        ("H100", empty_mig(H100, 1)),
        ("A30", empty_mig(A30, 1)),
        ("H100, 3g.40gb at 4", with(H100, &[("3g.40gb", 4)])),
        ("H100, 1g.20gb at 6", with(H100, &[("1g.20gb", 6)])),
        ("H100, 2g.20gb at 2", with(H100, &[("2g.20gb", 2)])),
        ("H100, 1g.10gb+me at 3", with(H100, &[("1g.10gb+me", 3)])),
        ("A30, 2g.12gb+me at 2", with(A30, &[("2g.12gb+me", 2)])),
    ];
    for (name, inv) in cases {
        let (_, s) = built(DYNAMIC_ALL, &inv);
        let devs = devices(&s);
        let set = sets(&s)[0];
        let by_counters = every_fitting_set(devs.len(), &|c| counters_fit(set, &devs, c));
        // Every combination the counters admit has pairwise disjoint placements.
        for chosen in &by_counters {
            for (n, &i) in chosen.iter().enumerate() {
                for &j in &chosen[..n] {
                    assert!(
                        !placement(devs[i]).overlaps(&placement(devs[j])),
                        "{name}: {} and {} fit the counters together but overlap",
                        devs[i].name,
                        devs[j].name
                    );
                }
            }
        }
        // And they are exactly the combinations the driver creates: none lost, none more.
        let by_driver = every_fitting_set(devs.len(), &|c| driver_creates(&inv, &devs, c));
        assert_eq!(by_counters, by_driver, "{name}");
        assert!(
            by_counters.len() > devs.len(),
            "{name}: {}",
            by_counters.len()
        );
    }
}

#[test]
fn a_static_instance_removes_every_placement_it_overlaps() {
    let inv = node(&format!(
        "gpus:\n{H100}    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 4\n"
    ));
    let (plan, s) = built(DYNAMIC_ALL, &inv);
    assert_eq!(
        plan.dynamic_mig,
        [DynamicMigGpu {
            index: 0,
            uuid: inv.gpus[0].uuid.clone(),
            occupied: vec![MigPlacement { start: 4, size: 4 }],
            health: Health::Healthy,
        }]
    );
    let got: BTreeSet<String> = devices(&s).iter().map(|d| d.name.clone()).collect();
    let want: BTreeSet<String> = H100_PLACEMENTS
        .iter()
        .flat_map(|(p, starts)| {
            let size = inv.gpus[0]
                .mig_geometry
                .as_ref()
                .unwrap()
                .profiles
                .iter()
                .find(|r| r.profile == *p)
                .unwrap()
                .placements[0]
                .size;
            starts
                .iter()
                .filter(move |&&st| st + size <= 4)
                .map(move |st| format!("gpu-0-mig-{}-{st}", p.replace(['.', '+'], "-")))
        })
        .collect();
    assert_eq!(got, want);
    // 1g.10gb 0-3, 2g.20gb 0 and 2, 3g.40gb 0, 4g.40gb 0, 1g.10gb+me 0-3, 1g.20gb 0 and 2.
    assert_eq!(got.len(), 14);
    for d in devices(&s) {
        assert!(
            !placement(d).overlaps(&MigPlacement { start: 4, size: 4 }),
            "{}",
            d.name
        );
    }
    // The set keeps its shape: memory slices 4-7 stay, never consumed.
    assert_eq!(sets(&s)[0].counters.len(), 10);
}

#[test]
fn a_static_me_instance_uses_up_the_me_profile() {
    let inv = node(&format!(
        "gpus:\n{H100}    mig:\n      devices:\n        - profile: 1g.10gb+me\n          placementStart: 6\n"
    ));
    let (_, s) = built(DYNAMIC_ALL, &inv);
    assert!(
        devices(&s).iter().all(|d| !profile(d).ends_with("+me")),
        "{:?}",
        devices(&s).iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    assert_eq!(value(&sets(&s)[0].counters["1g-10gb-me-instances"]), 0);
    // 1g.10gb 0-5, 2g.20gb 0-4, 3g.40gb 0, 4g.40gb 0, 1g.20gb 0-4: 6 + 3 + 1 + 1 + 3.
    assert_eq!(devices(&s).len(), 14);
}

/// An unhealthy GPU with no taint in the health map (nothing to publish its devices with) is
/// withdrawn whole, its counter set with it; the tainted case is the next test's.
#[test]
fn an_unhealthy_gpu_without_a_recorded_taint_publishes_no_dynamic_device() {
    let inv = node(&format!(
        "gpus:\n{H100}    health: Unhealthy\n    mig:\n      devices: []\n{H100}    mig:\n      devices: []\n"
    ));
    let (plan, s) = built(DYNAMIC_ALL, &inv);
    assert_eq!(plan.dynamic_mig.len(), 2);
    let names: Vec<&str> = sets(&s).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gpu-1-mig"]);
    assert_eq!(devices(&s).len(), 25);
    assert!(devices(&s).iter().all(|d| d.name.starts_with("gpu-1-mig-")));

    // Unhealthy in the plan's inventory (an Xid the daemon folded in) while the discovered one
    // says Healthy: nothing either.
    let inv = empty_mig(H100, 2);
    let (mut plan, _) = built(DYNAMIC_ALL, &inv);
    plan.dynamic_mig[0].health = Health::Unhealthy;
    let s = build_pool(
        dra_resources(&plan),
        &plan.dynamic_mig,
        &inv,
        &params(),
        &HealthMap::new(),
    );
    let names: Vec<&str> = sets(&s).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gpu-1-mig"]);
    assert!(devices(&s).iter().all(|d| d.name.starts_with("gpu-1-mig-")));
}

#[test]
fn unhealthy_dynamic_devices_are_tainted_like_static_ones() {
    let inv = empty_mig(H100, 2);
    let (mut plan, _) = built(DYNAMIC_ALL, &inv);
    plan.dynamic_mig[0].health = Health::Unhealthy;
    let xid = |u: &str| (u == inv.gpus[0].uuid).then(|| (Cause::Xid(79), "xid 79".to_string()));
    let health = crate::dra::dynamic_health::fold_dynamic(
        &HealthMap::new(),
        &plan.dynamic_mig,
        &inv,
        &xid,
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000),
    );
    let s = build_pool(
        dra_resources(&plan),
        &plan.dynamic_mig,
        &inv,
        &params(),
        &health,
    );
    let names: Vec<&str> = sets(&s).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig", "gpu-1-mig"]);
    assert_eq!(devices(&s).len(), 50);
    for d in devices(&s) {
        let taints = d.taints.as_deref().unwrap_or_default();
        if d.name.starts_with("gpu-0-") {
            assert_eq!(taints.len(), 1, "{}", d.name);
            assert_eq!(taints[0].key, TAINT_KEY);
            assert_eq!(taints[0].value.as_deref(), Some("xid-79"));
            assert_eq!(taints[0].effect, "NoSchedule");
        } else {
            assert!(taints.is_empty(), "{}", d.name);
        }
    }
    // Where the API server has no device taints: withdrawn, and the GPU's set with them.
    let mut p = params();
    p.unhealthy = Unhealthy::Withdraw;
    let s = build_pool(dra_resources(&plan), &plan.dynamic_mig, &inv, &p, &health);
    let names: Vec<&str> = sets(&s).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["gpu-1-mig"]);
    assert_eq!(devices(&s).len(), 25);
}

/// Every `resource.k8s.io/v1` limit a slice of `s` must keep, and the pool's shape.
fn assert_within_api_limits(s: &Slices) {
    let count = s.slices.len() as i64;
    let mut names = BTreeSet::new();
    let mut set_names = BTreeMap::new();
    let mut seen_devices = false;
    for (n, slice) in s.slices.iter().enumerate() {
        let spec = &slice.spec;
        assert_eq!(spec.pool.resource_slice_count, count);
        let sets = spec.shared_counters.as_deref().unwrap_or_default();
        let devs = spec.devices.as_deref().unwrap_or_default();
        assert!(
            sets.is_empty() || devs.is_empty(),
            "slice {n}: both sets and devices"
        );
        if !sets.is_empty() {
            assert!(!seen_devices, "slice {n}: counters after a device slice");
        }
        seen_devices |= !devs.is_empty();
        assert!(
            sets.len() <= COUNTER_SETS_PER_SLICE,
            "slice {n}: {} sets",
            sets.len()
        );
        let counters: usize = sets.iter().map(|c| c.counters.len()).sum();
        assert!(
            counters <= MAX_COUNTERS_PER_SLICE,
            "slice {n}: {counters} counters"
        );
        for set in sets {
            assert!(is_dns_label(&set.name), "{}", set.name);
            assert!(set.counters.keys().all(|k| is_dns_label(k)), "{}", set.name);
            assert!(
                set_names.insert(set.name.clone(), set.clone()).is_none(),
                "{} twice",
                set.name
            );
        }
        let consuming = devs.iter().any(|d| d.consumes_counters.is_some());
        let max = if consuming || devs.iter().any(|d| d.taints.is_some()) {
            MAX_DEVICES_PER_SLICE_WITH_TAINTS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        assert!(devs.len() <= max, "slice {n}: {} devices", devs.len());
        let mut consumed_here = 0;
        for d in devs {
            assert!(is_dns_label(&d.name), "{}", d.name);
            assert!(names.insert(d.name.clone()), "{} twice", d.name);
            let c = d.consumes_counters.as_deref().unwrap_or_default();
            assert!(c.len() <= 2, "{}", d.name);
            for e in c {
                assert!(e.counters.len() <= 32, "{}", d.name);
                consumed_here += e.counters.len();
            }
            let n_attrs = d.attributes.as_ref().map_or(0, BTreeMap::len)
                + d.capacity.as_ref().map_or(0, BTreeMap::len);
            assert!(n_attrs <= MAX_ATTRIBUTES_AND_CAPACITIES, "{}", d.name);
        }
        assert!(
            consumed_here <= MAX_DEVICE_COUNTERS_PER_SLICE,
            "slice {n}: {consumed_here}"
        );
    }
    // Every consumption names a set of the pool and counters it has.
    for d in s
        .slices
        .iter()
        .flat_map(|x| x.spec.devices.iter().flatten())
    {
        for e in d.consumes_counters.iter().flatten() {
            let set = set_names
                .get(&e.counter_set)
                .unwrap_or_else(|| panic!("{}: no set {}", d.name, e.counter_set));
            for k in e.counters.keys() {
                assert!(
                    set.counters.contains_key(k),
                    "{}: {} has no {k}",
                    d.name,
                    set.name
                );
            }
        }
    }
}

#[test]
fn eight_dynamic_h100s_pack_within_every_api_limit() {
    let inv = empty_mig(H100, 8);
    let (_, s) = built(DYNAMIC_ALL, &inv);
    assert_eq!(devices(&s).len(), 200, "devices per 8 H100s (docs/mig.md)");
    assert_eq!(sets(&s).len(), 8);
    assert_within_api_limits(&s);
    // 10 counters a set: 3 sets a slice (30 of 32), so 3 counter slices; 200 devices at 64 a
    // slice: 4 device slices.
    let shape: Vec<(usize, usize)> = s
        .slices
        .iter()
        .map(|x| {
            (
                x.spec.shared_counters.as_ref().map_or(0, Vec::len),
                x.spec.devices.as_ref().map_or(0, Vec::len),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [(3, 0), (3, 0), (2, 0), (0, 64), (0, 64), (0, 64), (0, 8)]
    );
    assert_eq!(s.slices.len(), 7, "slices for 8 H100s (docs/mig.md)");
}

#[test]
fn a_mixed_pool_keeps_its_static_devices_as_they_were() {
    // GPUs 0-1 whole and time-sliced through DRA; GPU 2 with a static 3g.40gb at 4 (a DRA
    // resource) and dynamic; GPU 3 empty and dynamic.
    let inv = node(&format!(
        "gpus:\n{H100}    count: 2\n{H100}    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 4\n{H100}    mig:\n      devices: []\n"
    ));
    let base = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\ndra:\n  resources: [nvidia.com/mig-3g.40gb]\n";
    let (_, before) = built(base, &inv);
    let (plan, after) = built(&format!("{base}  dynamicMig:\n    devices: [2, 3]\n"), &inv);
    assert_eq!(
        plan.dynamic_mig.iter().map(|g| g.index).collect::<Vec<_>>(),
        [2, 3]
    );
    let statics = devices(&before);
    assert_eq!(statics.len(), 5, "4 replicas and the 3g.40gb");
    let all = devices(&after);
    // The static devices first, unchanged (names, attributes, counters), then the dynamic.
    assert_eq!(&all[..statics.len()], &statics[..]);
    assert!(all[statics.len()..]
        .iter()
        .all(|d| d.name.starts_with("gpu-2-mig-") || d.name.starts_with("gpu-3-mig-")));
    assert_eq!(all.len(), 5 + 14 + 25);
    // The static sets first, unchanged, then the dynamic ones.
    let (sb, sa) = (sets(&before), sets(&after));
    assert_eq!(&sa[..sb.len()], &sb[..]);
    let dynamic: Vec<&str> = sa[sb.len()..].iter().map(|c| c.name.as_str()).collect();
    assert_eq!(dynamic, ["gpu-2-mig", "gpu-3-mig"]);
    assert_within_api_limits(&after);
    // build is build_pool without dynamic GPUs.
    assert_eq!(
        build(dra_resources(&plan), &inv, &params(), &HealthMap::new()),
        before
    );
}
