//! Unit tests of the per-container attribution: the table of cases, MIG holders, DRA
//! holders and memory limits.

use super::*;
use crate::device_health::Health;
use crate::inventory::sample::{CgroupLimits, LimitReading};
use crate::inventory::sample::{GpuSample, MigSample, ProcessSample};
use crate::plan::{MigInfo, ResourcePlan, Strategy};
use crate::policy::ResourceName;
use crate::usage::CheckpointEntry;
use std::sync::Arc;

pub(crate) const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
pub(crate) const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
pub(crate) const MIG0: &str = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
pub(crate) const MIB: u64 = 1024 * 1024;

pub(crate) fn replica(gpu: &str, index: u32, n: u32) -> VirtualDevice {
    VirtualDevice {
        id: crate::plan::replica_id(gpu, n),
        gpu_index: index,
        gpu_uuid: gpu.to_string(),
        gpu_minor: None,
        replica: Some(n),
        health: Health::Healthy,
        numa_node: None,
        mig: None,
    }
}

pub(crate) fn mig_device(parent: &str, index: u32, uuid: &str) -> VirtualDevice {
    VirtualDevice {
        id: uuid.to_string(),
        gpu_index: index,
        gpu_uuid: uuid.to_string(),
        gpu_minor: None,
        replica: None,
        health: Health::Healthy,
        numa_node: None,
        mig: Some(MigInfo {
            index: 0,
            parent_uuid: parent.to_string(),
            profile: "1g.10gb".to_string(),
            gi_id: 7,
            ci_id: 0,
            caps: None,
        }),
    }
}

pub(crate) fn resource(
    name: &str,
    strategy: Strategy,
    devices: Vec<VirtualDevice>,
) -> Arc<ResourcePlan> {
    Arc::new(ResourcePlan::new(
        ResourceName::parse(name).unwrap(),
        strategy,
        1,
        false,
        false,
        devices,
    ))
}

/// `nvidia.com/gpu-shared`: GPU0 (index 0) and GPU1 (index 1), ×4 each; `nvidia.com/mig-1g.10gb`:
/// MIG0 on GPU1.
pub(crate) fn plan() -> Plan {
    let mut devices: Vec<VirtualDevice> = (0..4).map(|n| replica(GPU0, 0, n)).collect();
    devices.extend((0..4).map(|n| replica(GPU1, 1, n)));
    let mut plan = Plan::default();
    plan.resources.insert(
        "nvidia.com/gpu-shared".into(),
        resource("nvidia.com/gpu-shared", Strategy::TimeSlicing, devices),
    );
    plan.resources.insert(
        "nvidia.com/mig-1g.10gb".into(),
        resource(
            "nvidia.com/mig-1g.10gb",
            Strategy::None,
            vec![mig_device(GPU1, 1, MIG0)],
        ),
    );
    plan
}

pub(crate) fn holder(ns: &str, pod: &str, container: &str) -> Holder {
    Holder {
        namespace: ns.into(),
        pod: pod.into(),
        container: container.into(),
    }
}

pub(crate) fn process(pid: u32, pod: Option<&str>, sm: u32, mib: u64) -> ProcessSample {
    ProcessSample {
        pid,
        sm_util_percent: Some(sm),
        memory_used_bytes: Some(mib * MIB),
        pod_uid: pod.map(str::to_string),
        container_id: None,
        cgroup: None,
    }
}

pub(crate) fn entry(pod: &str, container: &str, resource: &str, ids: &[&str]) -> CheckpointEntry {
    CheckpointEntry {
        pod_uid: pod.into(),
        container: container.into(),
        resource: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

/// A prepared claim of `namespace` reserved for `pods` (name, UID), holding `ids` of
/// `nvidia.com/gpu-shared` under their published names.
pub(crate) fn claim(namespace: &str, pods: &[(&str, &str)], ids: &[&str]) -> ClaimEntry {
    ClaimEntry {
        namespace: namespace.into(),
        pods: pods
            .iter()
            .map(|(name, uid)| crate::usage::ClaimPod {
                name: (*name).into(),
                uid: (*uid).into(),
            })
            .collect(),
        devices: ids
            .iter()
            .map(|id| crate::usage::ClaimDevice {
                name: crate::plan::dra_names::device_name(id),
                resource: SHARED.into(),
                id: (*id).into(),
            })
            .collect(),
    }
}

pub(crate) fn gpu(uuid: &str, index: u32, processes: Vec<ProcessSample>) -> GpuSample {
    GpuSample {
        uuid: uuid.into(),
        index,
        model: "NVIDIA H100 80GB HBM3".into(),
        utilization_percent: Some(40),
        memory_used_bytes: Some(3 * 1024 * MIB),
        memory_total_bytes: Some(80 * 1024 * MIB),
        processes,
        mig: Vec::new(),
        ..GpuSample::default()
    }
}

const SHARED: &str = "nvidia.com/gpu-shared";
const MIG: &str = "nvidia.com/mig-1g.10gb";

/// Two pods on `GPU0::0` and `GPU0::1`, a pod UID → checkpoint; the case the issue's "done
/// when" names.
pub(crate) fn two_pods() -> (Samples, InUse) {
    let r0 = crate::plan::replica_id(GPU0, 0);
    let r1 = crate::plan::replica_id(GPU0, 1);
    let mut in_use = InUse::default();
    in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
    in_use.insert(SHARED, &r1, holder("ml", "b", "main"));
    let samples = Samples {
        at_unix_ms: 1_000_000,
        gpus: vec![
            gpu(
                GPU0,
                0,
                vec![
                    process(100, Some("uid-a"), 30, 1024),
                    process(200, Some("uid-b"), 10, 512),
                ],
            ),
            gpu(GPU1, 1, vec![]),
        ],
        checkpoint: Some(vec![
            entry("uid-a", "main", SHARED, &[&r0]),
            entry("uid-b", "main", SHARED, &[&r1]),
        ]),
        checkpoint_error: None,
        claims: None,
        limits_not_cleared: 0,
    };
    (samples, in_use)
}

/// (namespace/pod/container, unit, SM %, MiB, processes) of each container on GPU `g`.
fn summary(f: &Figures, g: usize) -> Vec<(String, String, u32, u64, u32)> {
    f.gpus[g]
        .containers
        .iter()
        .map(|c| {
            (
                format!(
                    "{}/{}/{}",
                    c.holder.namespace, c.holder.pod, c.holder.container
                ),
                c.unit_uuid.clone(),
                c.sm_util_percent,
                c.memory_used_bytes / MIB,
                c.processes,
            )
        })
        .collect()
}

#[test]
fn cases() {
    let plan = plan();
    let r0 = crate::plan::replica_id(GPU0, 0);
    let r1 = crate::plan::replica_id(GPU0, 1);
    let r2 = crate::plan::replica_id(GPU0, 2);
    struct Case {
        name: &'static str,
        samples: Samples,
        in_use: InUse,
        /// Per container on GPU0.
        gpu0: Vec<(&'static str, &'static str, u32, u64, u32)>,
        unattributed: u32,
        /// `nvidia.com/gpu-shared` is served through DRA.
        dra: bool,
    }
    let (two, two_in_use) = two_pods();
    let mut stranger = two.clone();
    // A process of no pod (a host process) and one of a pod the checkpoint does not know.
    stranger.gpus[0].processes.push(process(300, None, 50, 100));
    stranger.gpus[0]
        .processes
        .push(process(301, Some("uid-z"), 5, 100));
    let mut no_checkpoint = two.clone();
    no_checkpoint.checkpoint = None;
    no_checkpoint.checkpoint_error = Some("missing".into());
    // One pod, two containers on GPU0 (`sidecar` on ::2, `main` on ::0): the process goes
    // to `main`, first in name order.
    let mut one_pod = Samples {
        gpus: vec![gpu(GPU0, 0, vec![process(100, Some("uid-a"), 20, 256)])],
        checkpoint: Some(vec![
            entry("uid-a", "sidecar", SHARED, &[&r2]),
            entry("uid-a", "main", SHARED, &[&r0]),
        ]),
        ..Samples::default()
    };
    one_pod.at_unix_ms = 5;
    let mut one_pod_in_use = InUse::default();
    one_pod_in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
    one_pod_in_use.insert(SHARED, &r2, holder("ml", "a", "sidecar"));
    // The checkpoint names a container pod-resources does not list yet: GPU level only.
    let mut unlisted = two.clone();
    let mut unlisted_in_use = InUse::default();
    unlisted_in_use.insert(SHARED, &r1, holder("ml", "b", "main"));
    unlisted.gpus[0].processes.truncate(1);
    // The checkpoint's device of that pod is on GPU1, the process on GPU0: GPU level.
    let mut elsewhere = two.clone();
    elsewhere.checkpoint = Some(vec![entry(
        "uid-a",
        "main",
        SHARED,
        &[&crate::plan::replica_id(GPU1, 0)],
    )]);
    elsewhere.gpus[0].processes.truncate(1);
    // One container with replicas on two GPUs (its checkpoint entry lists GPU1's first):
    // the process on GPU0 counts for its GPU0 entry.
    let g1r0 = crate::plan::replica_id(GPU1, 0);
    let mut two_gpus = two.clone();
    two_gpus.checkpoint = Some(vec![entry("uid-a", "main", SHARED, &[&g1r0, &r0])]);
    two_gpus.gpus[0].processes.truncate(1);
    let mut two_gpus_in_use = InUse::default();
    two_gpus_in_use.insert(SHARED, &g1r0, holder("ml", "a", "main"));
    two_gpus_in_use.insert(SHARED, &r0, holder("ml", "a", "main"));
    // DRA: the same two pods holding ::0 and ::1 through claims (pod-resources'
    // `dynamic_resources`, by published device name), no kubelet checkpoint at all (it
    // lists no claim); each claim records the pod it is reserved for.
    let name = crate::plan::dra_names::device_name;
    let mut dra_in_use = InUse::default();
    dra_in_use.insert_claimed(&name(&r0), holder("ml", "a", "main"));
    dra_in_use.insert_claimed(&name(&r1), holder("ml", "b", "main"));
    let mut dra = two.clone();
    dra.checkpoint = None;
    dra.checkpoint_error = Some("missing".into());
    dra.claims = Some(vec![
        claim("ml", &[("a", "uid-a")], &[&r0]),
        claim("ml", &[("b", "uid-b")], &[&r1]),
    ]);
    // The claim of b does not name its pod (prepared by a slicelet that did not record
    // pods, or b shares a claim prepared for another pod): b's use is unknown.
    let mut dra_unknown = dra.clone();
    dra_unknown.claims = Some(vec![
        claim("ml", &[("a", "uid-a")], &[&r0]),
        claim("ml", &[], &[&r1]),
    ]);
    // One claim on ::0 shared by pods a and b, both containers named `main`: b's process
    // goes to b's container, not to the first `main` holding the device.
    let mut shared_in_use = InUse::default();
    shared_in_use.insert_claimed(&name(&r0), holder("ml", "a", "main"));
    shared_in_use.insert_claimed(&name(&r0), holder("ml", "b", "main"));
    let mut shared = dra.clone();
    shared.gpus[0].processes.remove(0);
    shared.claims = Some(vec![claim("ml", &[("a", "uid-a"), ("b", "uid-b")], &[&r0])]);
    // A claim of another namespace naming a pod of the same name: not b's.
    let mut other_ns = dra.clone();
    other_ns.claims = Some(vec![
        claim("ml", &[("a", "uid-a")], &[&r0]),
        claim("web", &[("b", "uid-b")], &[&r1]),
    ]);
    let cases = vec![
        Case {
            name: "DRA: each pod's process to its container, through its claim",
            samples: dra,
            in_use: dra_in_use.clone(),
            gpu0: vec![
                ("ml/a/main", GPU0, 30, 1024, 1),
                ("ml/b/main", GPU0, 10, 512, 1),
            ],
            unattributed: 0,
            dra: true,
        },
        Case {
            name: "DRA: a claim that does not name the pod: unattributed, and withheld",
            samples: dra_unknown,
            in_use: dra_in_use.clone(),
            gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
            unattributed: 1,
            dra: true,
        },
        Case {
            name: "DRA: one claim shared by two pods",
            samples: shared,
            in_use: shared_in_use,
            gpu0: vec![
                ("ml/a/main", GPU0, 0, 0, 0),
                ("ml/b/main", GPU0, 10, 512, 1),
            ],
            unattributed: 0,
            dra: true,
        },
        Case {
            name: "DRA: a claim of another namespace names the pod",
            samples: other_ns,
            in_use: dra_in_use,
            gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
            unattributed: 1,
            dra: true,
        },
        Case {
            name: "one container on two GPUs",
            samples: two_gpus,
            in_use: two_gpus_in_use,
            gpu0: vec![("ml/a/main", GPU0, 30, 1024, 1)],
            unattributed: 0,
            dra: false,
        },
        Case {
            name: "two pods on two replicas",
            samples: two.clone(),
            in_use: two_in_use.clone(),
            gpu0: vec![
                ("ml/a/main", GPU0, 30, 1024, 1),
                ("ml/b/main", GPU0, 10, 512, 1),
            ],
            unattributed: 0,
            dra: false,
        },
        Case {
            name: "a process of no pod and one of an unknown pod",
            samples: stranger,
            in_use: two_in_use.clone(),
            gpu0: vec![
                ("ml/a/main", GPU0, 30, 1024, 1),
                ("ml/b/main", GPU0, 10, 512, 1),
            ],
            unattributed: 2,
            dra: false,
        },
        Case {
            name: "no checkpoint: unknown, so no container entries (not idle ones)",
            samples: no_checkpoint,
            in_use: two_in_use.clone(),
            gpu0: vec![],
            unattributed: 2,
            dra: false,
        },
        Case {
            name: "one pod, two containers: first in name order",
            samples: one_pod,
            in_use: one_pod_in_use,
            gpu0: vec![
                ("ml/a/main", GPU0, 20, 256, 1),
                ("ml/a/sidecar", GPU0, 0, 0, 0),
            ],
            unattributed: 0,
            dra: false,
        },
        Case {
            name: "pod-resources does not list the container",
            samples: unlisted,
            in_use: unlisted_in_use,
            gpu0: vec![("ml/b/main", GPU0, 0, 0, 0)],
            unattributed: 1,
            dra: false,
        },
        Case {
            name: "the pod's device is on another GPU",
            samples: elsewhere,
            in_use: two_in_use.clone(),
            gpu0: vec![("ml/a/main", GPU0, 0, 0, 0), ("ml/b/main", GPU0, 0, 0, 0)],
            unattributed: 1,
            dra: false,
        },
        Case {
            name: "nothing held, nothing sampled on it",
            samples: Samples {
                gpus: vec![gpu(GPU0, 0, vec![])],
                ..Samples::default()
            },
            in_use: InUse::default(),
            gpu0: vec![],
            unattributed: 0,
            dra: false,
        },
    ];
    let mut dra_plan = plan.clone();
    Arc::make_mut(dra_plan.resources.get_mut(SHARED).unwrap()).dra = true;
    for c in cases {
        let plan = if c.dra { &dra_plan } else { &plan };
        // As the report does: claims recorded under the device IDs they name.
        let in_use = crate::plan::dra_names::with_claims(plan, &c.in_use);
        let f = attribute(&c.samples, plan, &in_use);
        let want: Vec<_> = c
            .gpu0
            .iter()
            .map(|(h, u, sm, mib, n)| (h.to_string(), u.to_string(), *sm, *mib, *n))
            .collect();
        assert_eq!(summary(&f, 0), want, "{}", c.name);
        assert_eq!(
            f.gpus[0].unattributed_processes, c.unattributed,
            "{}",
            c.name
        );
        assert_eq!(
            f.unattributed_processes(),
            u64::from(c.unattributed),
            "{}: the node's total",
            c.name
        );
        assert_eq!(f.at_unix_ms, c.samples.at_unix_ms, "{}", c.name);
        assert_eq!(f.gpus[0].model, "NVIDIA H100 80GB HBM3", "{}", c.name);
        assert_eq!(f.gpus[0].utilization_percent, Some(40), "{}", c.name);
    }
    // Device IDs and resource come from pod-resources.
    let f = attribute(&two, &plan, &two_in_use);
    assert_eq!(f.gpus[0].containers[0].device_ids, vec![r0.clone()]);
    assert_eq!(f.gpus[0].containers[1].device_ids, vec![r1.clone()]);
    assert_eq!(f.gpus[0].containers[0].resource, SHARED);
    assert!(f.gpus[1].containers.is_empty());
}

#[test]
fn mig_devices_go_to_their_holder() {
    let plan = plan();
    let mut in_use = InUse::default();
    in_use.insert(MIG, MIG0, holder("ml", "m", "main"));
    let mut g1 = gpu(GPU1, 1, vec![]);
    g1.mig = vec![MigSample {
        uuid: MIG0.into(),
        utilization_percent: Some(55),
        memory_used_bytes: Some(2048 * MIB),
        memory_total_bytes: Some(10 * 1024 * MIB),
    }];
    let samples = Samples {
        at_unix_ms: 7,
        gpus: vec![gpu(GPU0, 0, vec![]), g1.clone()],
        // No checkpoint: MIG needs none.
        checkpoint: None,
        checkpoint_error: Some("missing".into()),
        claims: None,
        limits_not_cleared: 0,
    };
    let f = attribute(&samples, &plan, &in_use);
    assert!(f.gpus[0].containers.is_empty());
    assert_eq!(
        summary(&f, 1),
        vec![("ml/m/main".to_string(), MIG0.to_string(), 55, 2048, 0)]
    );
    assert_eq!(f.gpus[1].mig[0].profile.as_deref(), Some("1g.10gb"));
    assert_eq!(f.gpus[1].containers[0].resource, MIG);
    // Without GPM: memory only.
    let mut no_gpm = samples.clone();
    no_gpm.gpus[1].mig[0].utilization_percent = None;
    let f = attribute(&no_gpm, &plan, &in_use);
    assert_eq!(
        summary(&f, 1),
        vec![("ml/m/main".to_string(), MIG0.to_string(), 0, 2048, 0)]
    );
    // Not held: the MIG device's figures stay at GPU level.
    let f = attribute(&samples, &plan, &InUse::default());
    assert!(f.gpus[1].containers.is_empty());
    assert_eq!(f.gpus[1].mig[0].memory_used_bytes, Some(2048 * MIB));
}

/// `nvidia.com/gpu-shared` with `memory: {hard: 10 GiB, soft: 4 GiB}` per replica.
pub(crate) fn limited_plan(unenforced: bool) -> Plan {
    let mut plan = plan();
    let res = Arc::make_mut(plan.resources.get_mut(SHARED).unwrap());
    let mut planned = crate::plan::memory::PlannedMemory {
        entry: "sharing.timeSlicing.resources[0]".into(),
        limits: crate::policy::MemoryLimits {
            hard_mib: 10 * 1024,
            soft_mib: Some(4 * 1024),
            enforce: crate::policy::Enforce::BestEffort,
        },
        unenforced: Default::default(),
        name_tag: None,
    };
    if unenforced {
        planned.unenforced.insert(GPU0.into(), "cgroup v1".into());
    }
    res.memory = Some(planned);
    plan
}

fn limits(f: &Figures) -> Vec<Option<ContainerLimit>> {
    f.gpus[0]
        .containers
        .iter()
        .map(|c| c.memory_limit)
        .collect()
}

#[test]
fn memory_limits_are_the_policys_and_enforced_only_when_read_back() {
    let (mut samples, mut in_use) = two_pods();
    let r2 = crate::plan::replica_id(GPU0, 2);
    // Pod a holds two replicas: twice the limit.
    in_use.insert(SHARED, &r2, holder("ml", "a", "main"));
    if let Some(cp) = samples.checkpoint.as_mut() {
        cp[0].device_ids.push(r2.clone());
    }
    let g = &mut samples.gpus[0];
    g.memory_limits_supported = Some(true);
    g.processes[0].cgroup = Some("/kubepods/pod-a/ctr".into());
    g.processes[1].cgroup = Some("/kubepods/pod-b/ctr".into());
    let reading = |hard_gib: u64, soft_gib: u64| LimitReading {
        hard: hard_gib * 1024 * MIB,
        soft: soft_gib * 1024 * MIB,
        used: 0,
    };
    g.cgroup_limits = vec![
        CgroupLimits {
            cgroup: "/kubepods/pod-a/ctr".into(),
            reading: reading(20, 8),
        },
        // b's cgroup reads back another hard limit (a stale or foreign one).
        CgroupLimits {
            cgroup: "/kubepods/pod-b/ctr".into(),
            reading: reading(5, 4),
        },
    ];
    let held = |hard_gib: u64, soft_gib: u64, enforced| {
        Some(ContainerLimit {
            hard_bytes: hard_gib * 1024 * MIB,
            soft_bytes: Some(soft_gib * 1024 * MIB),
            enforced,
        })
    };
    let plan = limited_plan(false);
    let f = attribute(&samples, &plan, &in_use);
    assert_eq!(
        limits(&f),
        [held(20, 8, Some(true)), held(10, 4, Some(false))]
    );
    // No limit read back for b's cgroup at all: not enforced.
    let mut none = samples.clone();
    none.gpus[0].cgroup_limits.truncate(1);
    let f = attribute(&none, &plan, &in_use);
    assert_eq!(limits(&f)[1], held(10, 4, Some(false)));
    // No process on the GPU: not known yet.
    let mut idle = samples.clone();
    idle.gpus[0].processes.clear();
    let f = attribute(&idle, &plan, &in_use);
    assert_eq!(limits(&f), [held(20, 8, None), held(10, 4, None)]);
    // A process whose cgroup is unknown: not known either.
    let mut unknown = samples.clone();
    unknown.gpus[0].processes[1].cgroup = None;
    let f = attribute(&unknown, &plan, &in_use);
    assert_eq!(limits(&f)[1], held(10, 4, None));
    // The GPU takes no limits, or the plan serves it unenforced: not enforced, whatever
    // reads back.
    let mut unsupported = samples.clone();
    unsupported.gpus[0].memory_limits_supported = Some(false);
    let f = attribute(&unsupported, &plan, &in_use);
    assert_eq!(
        limits(&f),
        [held(20, 8, Some(false)), held(10, 4, Some(false))]
    );
    let f = attribute(&samples, &limited_plan(true), &in_use);
    assert_eq!(
        limits(&f),
        [held(20, 8, Some(false)), held(10, 4, Some(false))]
    );
    // Without memory limits in the plan: none.
    let f = attribute(&samples, &super::tests::plan(), &in_use);
    assert_eq!(limits(&f), [None, None]);
    assert_eq!(f.gpus[0].memory_limits_supported, Some(true));
}

/// A container holding two memory-limited resources on one GPU (`nvidia.com/gpu-a`, 10 GiB
/// with 4 GiB soft, and `nvidia.com/gpu-b`, 20 GiB) is limited by their two hooks to the sum,
/// 30 GiB (NVML keeps one limit per GPU and cgroup): that is what must read back for both,
/// each still shown with its own size. A cgroup reading back one resource's size alone is not
/// enforced.
#[test]
fn two_limited_resources_of_one_container_are_enforced_as_their_sum() {
    let mut plan = Plan::default();
    for (name, hard_gib, soft_gib) in [
        ("nvidia.com/gpu-a", 10, Some(4)),
        ("nvidia.com/gpu-b", 20, None),
    ] {
        let mut res = resource(
            name,
            Strategy::TimeSlicing,
            (0..2).map(|n| replica(GPU0, 0, n)).collect(),
        );
        Arc::make_mut(&mut res).memory = Some(crate::plan::memory::PlannedMemory {
            entry: format!("sharing.timeSlicing.resources[{name}]"),
            limits: crate::policy::MemoryLimits {
                hard_mib: hard_gib * 1024,
                soft_mib: soft_gib.map(|s: u64| s * 1024),
                enforce: crate::policy::Enforce::Required,
            },
            unenforced: Default::default(),
            name_tag: None,
        });
        plan.resources.insert(name.into(), res);
    }
    let r0 = crate::plan::replica_id(GPU0, 0);
    let r1 = crate::plan::replica_id(GPU0, 1);
    let mut in_use = InUse::default();
    in_use.insert("nvidia.com/gpu-a", &r0, holder("ml", "a", "main"));
    in_use.insert("nvidia.com/gpu-b", &r1, holder("ml", "a", "main"));
    let mut p = process(100, Some("uid-a"), 30, 1024);
    p.cgroup = Some("/kubepods/pod-a/ctr".into());
    let mut g = gpu(GPU0, 0, vec![p]);
    g.memory_limits_supported = Some(true);
    let reading = |hard_gib: u64, soft_gib: u64| LimitReading {
        hard: hard_gib * 1024 * MIB,
        soft: soft_gib * 1024 * MIB,
        used: 0,
    };
    g.cgroup_limits = vec![CgroupLimits {
        cgroup: "/kubepods/pod-a/ctr".into(),
        reading: reading(30, 4),
    }];
    let mut samples = Samples {
        at_unix_ms: 1_000_000,
        gpus: vec![g],
        checkpoint: Some(vec![
            entry("uid-a", "main", "nvidia.com/gpu-a", &[&r0]),
            entry("uid-a", "main", "nvidia.com/gpu-b", &[&r1]),
        ]),
        checkpoint_error: None,
        claims: None,
        limits_not_cleared: 0,
    };
    let held = |hard_gib: u64, soft_gib: Option<u64>, enforced| {
        Some(ContainerLimit {
            hard_bytes: hard_gib * 1024 * MIB,
            soft_bytes: soft_gib.map(|s| s * 1024 * MIB),
            enforced,
        })
    };
    let f = attribute(&samples, &plan, &in_use);
    assert_eq!(
        limits(&f),
        [held(10, Some(4), Some(true)), held(20, None, Some(true))]
    );
    // The last hook's size alone (20 GiB) is not the container's limit.
    samples.gpus[0].cgroup_limits[0].reading = reading(20, 0);
    let f = attribute(&samples, &plan, &in_use);
    assert_eq!(
        limits(&f),
        [held(10, Some(4), Some(false)), held(20, None, Some(false))]
    );
}
