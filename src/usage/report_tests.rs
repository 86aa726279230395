//! [`Usage`]: last active times, the metric series it writes and removes, `/status`.

use super::*;
use crate::plan::replica_id;
use crate::status::Metrics;
use crate::usage::attribute::tests::{holder, plan, two_pods, GPU0, GPU1, MIB};

const SHARED: &str = "nvidia.com/gpu-shared";
const MIG: &str = "nvidia.com/mig-1g.10gb";

/// The usage series of `text` (no comments, no series of other metrics), sorted.
fn usage_series(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            [
                "slicelet_allocation_info",
                "slicelet_gpu_",
                "slicelet_mig_",
                "slicelet_container_",
                "slicelet_resource_",
                "slicelet_draining_",
                "slicelet_unattributed_",
                "slicelet_samples",
                "slicelet_sample_failures",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

fn container_series(
    metric: &str,
    ns: &str,
    pod: &str,
    uuid: &str,
    resource: &str,
    v: &str,
) -> String {
    format!(
        "slicelet_{metric}{{pod=\"{pod}\",namespace=\"{ns}\",container=\"main\",UUID=\"{uuid}\",resource=\"{resource}\"}} {v}"
    )
}

fn gpu_series(metric: &str, uuid: &str, index: u32, v: u64) -> String {
    format!(
        "slicelet_{metric}{{UUID=\"{uuid}\",gpu=\"{index}\",modelName=\"NVIDIA H100 80GB HBM3\"}} {v}"
    )
}

#[test]
fn last_active_advances_only_while_busy_and_is_forgotten() {
    let plan = plan();
    let (mut samples, in_use) = two_pods();
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    let a = holder("ml", "a", "main");
    let b = holder("ml", "b", "main");
    // (at ms, SM of a, SM of b) → (last active of a, of b), seconds.
    let steps = [
        ((10_000, 30, 10), (10.0, 10.0)), // first seen: both start now
        ((15_000, 30, 0), (15.0, 10.0)),  // b idles
        ((20_000, 0, 0), (15.0, 10.0)),   // a too: neither advances
        ((25_000, 0, 5), (15.0, 25.0)),   // b busy again
    ];
    for ((at, sm_a, sm_b), (want_a, want_b)) in steps {
        samples.at_unix_ms = at;
        samples.gpus[0].processes[0].sm_util_percent = Some(sm_a);
        samples.gpus[0].processes[1].sm_util_percent = Some(sm_b);
        usage.sampled(&samples, &plan, &in_use, metrics.usage());
        assert_eq!(usage.last_active(&a, GPU0), Some(want_a), "a at {at}");
        assert_eq!(usage.last_active(&b, GPU0), Some(want_b), "b at {at}");
        let text = metrics.encode();
        for (pod, want) in [("a", want_a), ("b", want_b)] {
            let line = container_series(
                "container_gpu_last_active_timestamp_seconds",
                "ml",
                pod,
                GPU0,
                SHARED,
                &format!("{want:?}"),
            );
            assert!(text.contains(&line), "{line} at {at} in\n{text}");
        }
    }
    // The idle seconds of `/status` are measured to the sample: a idle 10 s, b 0 s.
    let view = usage.view(&plan, &in_use);
    let idle: Vec<_> = view.gpus[0]
        .devices
        .iter()
        .filter_map(|d| Some((d.holder.clone()?.pod, d.idle_seconds?)))
        .collect();
    assert_eq!(idle, vec![("a".to_string(), 10.0), ("b".to_string(), 0.0)]);

    // b's pod is gone: forgotten at the allocation change, and stays so.
    let mut without_b = InUse::default();
    without_b.insert(SHARED, &replica_id(GPU0, 0), a.clone());
    usage.allocation(&plan, &without_b, metrics.usage());
    assert_eq!(usage.last_active(&b, GPU0), None);
    assert_eq!(usage.last_active(&a, GPU0), Some(15.0));
    // Back after a while: it starts over from when it is first seen again.
    samples.at_unix_ms = 30_000;
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    assert_eq!(usage.last_active(&b, GPU0), Some(30.0));
    // Gone from a sample (pod-resources not yet refreshed): forgotten too.
    samples.at_unix_ms = 35_000;
    usage.sampled(&samples, &plan, &without_b, metrics.usage());
    assert_eq!(usage.last_active(&b, GPU0), None);
}

#[test]
fn metrics_text_and_stale_series() {
    let plan = plan();
    let (samples, in_use) = two_pods();
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    let (r0, r1) = (replica_id(GPU0, 0), replica_id(GPU0, 1));
    let alloc = |id: &str, pod: &str| {
        format!(
            "slicelet_allocation_info{{resource=\"{SHARED}\",device=\"{id}\",UUID=\"{GPU0}\",pod=\"{pod}\",namespace=\"ml\",container=\"main\"}} 1"
        )
    };
    let per_resource = |metric: &str, shared: u64, mig: u64| {
        [
            format!("slicelet_{metric}{{resource=\"{SHARED}\"}} {shared}"),
            format!("slicelet_{metric}{{resource=\"{MIG}\"}} {mig}"),
        ]
    };
    let gpu = |uuid: &str, index: u32| {
        let s = &samples.gpus[index as usize];
        [
            gpu_series(
                "gpu_utilization_percent",
                uuid,
                index,
                u64::from(s.utilization_percent.unwrap()),
            ),
            gpu_series(
                "gpu_memory_used_bytes",
                uuid,
                index,
                s.memory_used_bytes.unwrap(),
            ),
            gpu_series(
                "gpu_memory_total_bytes",
                uuid,
                index,
                s.memory_total_bytes.unwrap(),
            ),
            format!("slicelet_unattributed_processes{{UUID=\"{uuid}\"}} 0"),
        ]
    };
    let container = |pod: &str, sm: u32, mib: u64| {
        [
            container_series(
                "container_gpu_sm_util_percent",
                "ml",
                pod,
                GPU0,
                SHARED,
                &sm.to_string(),
            ),
            container_series(
                "container_gpu_memory_used_bytes",
                "ml",
                pod,
                GPU0,
                SHARED,
                &(mib * MIB).to_string(),
            ),
            container_series(
                "container_gpu_last_active_timestamp_seconds",
                "ml",
                pod,
                GPU0,
                SHARED,
                "1000.0",
            ),
        ]
    };
    let mut want: Vec<String> = vec![alloc(&r0, "a"), alloc(&r1, "b")];
    want.extend(per_resource("resource_allocated_devices", 2, 0));
    // 8 shared replicas, 2 held; the MIG device is free.
    want.extend(per_resource("resource_free_devices", 6, 1));
    want.extend(per_resource("draining_devices", 0, 0));
    want.extend(gpu(GPU0, 0));
    want.extend(gpu(GPU1, 1));
    want.extend(container("a", 30, 1024));
    want.extend(container("b", 10, 512));
    want.push("slicelet_samples_total 1".into());
    want.push("slicelet_sample_failures_total 0".into());
    want.push("slicelet_gpu_memory_limits_not_cleared_total 0".into());
    want.sort();
    assert_eq!(usage_series(&metrics.encode()), want);

    // b is gone and GPU1 is no longer sampled: their series go, nothing else changes.
    let mut without_b = InUse::default();
    without_b.insert(SHARED, &r0, holder("ml", "a", "main"));
    usage.allocation(&plan, &without_b, metrics.usage());
    let mut one_gpu = samples.clone();
    one_gpu.gpus.truncate(1);
    one_gpu.gpus[0].processes.truncate(1);
    usage.sampled(&one_gpu, &plan, &without_b, metrics.usage());
    metrics.sample_failed();
    let mut want: Vec<String> = vec![alloc(&r0, "a")];
    want.extend(per_resource("resource_allocated_devices", 1, 0));
    want.extend(per_resource("resource_free_devices", 7, 1));
    want.extend(per_resource("draining_devices", 0, 0));
    want.extend(gpu(GPU0, 0));
    want.extend(container("a", 30, 1024));
    want.push("slicelet_samples_total 2".into());
    want.push("slicelet_sample_failures_total 1".into());
    want.push("slicelet_gpu_memory_limits_not_cleared_total 0".into());
    want.sort();
    assert_eq!(usage_series(&metrics.encode()), want);

    // A figure NVML stops giving loses its series; a draining device is counted.
    let mut no_util = one_gpu.clone();
    no_util.gpus[0].utilization_percent = None;
    usage.sampled(&no_util, &plan, &without_b, metrics.usage());
    let text = metrics.encode();
    assert!(
        !text.contains("slicelet_gpu_utilization_percent{"),
        "{text}"
    );
    let mut draining = plan.clone();
    draining
        .drain
        .draining
        .entry(SHARED.into())
        .or_default()
        .insert(replica_id(GPU1, 0), "draining: held by ml/x".into());
    usage.allocation(&draining, &without_b, metrics.usage());
    assert!(metrics.encode().contains(&format!(
        "slicelet_draining_devices{{resource=\"{SHARED}\"}} 1"
    )));
}

#[test]
fn status_view_and_json_round_trip() {
    let plan = plan();
    let (samples, in_use) = two_pods();
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    // Before any sample: GPUs from the plan, no figures.
    let view = usage.view(&plan, &in_use);
    assert_eq!(view.gpus.len(), 2);
    assert_eq!(view.gpus[0].model, None);
    assert_eq!(view.gpus[0].devices[0].sm_util_percent, None);
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    let view = usage.view(&plan, &in_use);
    let g0 = &view.gpus[0];
    assert_eq!((g0.index, g0.uuid.as_str()), (0, GPU0));
    assert_eq!(g0.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(g0.devices.len(), 4);
    let rows: Vec<_> = g0
        .devices
        .iter()
        .map(|d| {
            (
                d.id.clone(),
                d.replica,
                d.holder.as_ref().map(ToString::to_string),
                d.sm_util_percent,
                d.memory_used_bytes.map(|b| b / MIB),
            )
        })
        .collect();
    let r = |n| replica_id(GPU0, n);
    assert_eq!(
        rows,
        vec![
            (
                r(0),
                Some(0),
                Some("ml/a/main".into()),
                Some(30),
                Some(1024)
            ),
            (r(1), Some(1), Some("ml/b/main".into()), Some(10), Some(512)),
            (r(2), Some(2), None, None, None),
            (r(3), Some(3), None, None, None),
        ]
    );
    // GPU1: four replicas and its MIG device (resource order: gpu-shared, then mig).
    let g1 = &view.gpus[1];
    assert_eq!(g1.devices.len(), 5);
    assert_eq!(g1.devices[4].mig_profile.as_deref(), Some("1g.10gb"));
    assert_eq!(view.free.get(SHARED), Some(&6));
    assert_eq!(view.free.get(MIG), Some(&1));
    let json = serde_json::to_string(&view).unwrap();
    let back: NodeView = serde_json::from_str(&json).unwrap();
    assert_eq!(back, view);
    // The documented field names.
    for key in [
        "\"sampled_at_unix_ms\":1000000",
        "\"idle_seconds\":0.0",
        "\"holder\":null",
        "\"free\":{",
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
}

#[test]
fn a_large_node_renders_every_series() {
    // 2,688 devices (84 GPUs × 32 replicas) and 500 containers on replicas, spread over the
    // GPUs, each with one process; the benchmark times the same render (Metrics::encode).
    const GPUS: u32 = 84;
    const REPLICAS: u32 = 32;
    const CONTAINERS: u32 = 500;
    let (plan, in_use, samples) = synthetic_node(GPUS, REPLICAS, CONTAINERS);
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    let series = usage_series(&metrics.encode());
    let count = |prefix: &str| series.iter().filter(|l| l.starts_with(prefix)).count();
    let c = CONTAINERS as usize;
    let g = GPUS as usize;
    assert_eq!(count("slicelet_allocation_info{"), c);
    assert_eq!(count("slicelet_container_gpu_sm_util_percent{"), c);
    assert_eq!(count("slicelet_container_gpu_memory_used_bytes{"), c);
    assert_eq!(
        count("slicelet_container_gpu_last_active_timestamp_seconds{"),
        c
    );
    assert_eq!(count("slicelet_gpu_utilization_percent{"), g);
    assert_eq!(count("slicelet_gpu_memory_used_bytes{"), g);
    assert_eq!(count("slicelet_gpu_memory_total_bytes{"), g);
    assert_eq!(count("slicelet_unattributed_processes{"), g);
    assert!(series.contains(&format!(
        "slicelet_resource_free_devices{{resource=\"{SHARED}\"}} {}",
        GPUS * REPLICAS - CONTAINERS
    )));
    // Every process was attributed, and the view lists every device.
    assert_eq!(usage.figures().unwrap().unattributed_processes(), 0);
    let view = usage.view(&plan, &in_use);
    assert_eq!(
        view.gpus.iter().map(|g| g.devices.len()).sum::<usize>(),
        2688
    );
}

/// A device a DRA claim holds (pod-resources' `dynamic_resources`, by published device name)
/// counts as held, exactly as a device-plugin holder: in `slicelet_allocation_info`, the
/// allocated and free counts and the `/status` holder (it counted as free before).
#[test]
fn dra_claims_are_holders() {
    let mut plan = plan();
    let shared = plan.resources.get_mut("nvidia.com/gpu-shared").unwrap();
    std::sync::Arc::make_mut(shared).dra = true;
    let id = replica_id(GPU0, 2);
    let mut in_use = InUse::default();
    in_use.claimed.insert(
        crate::plan::dra_names::device_name(&id),
        vec![holder("ml", "dra-pod", "main")],
    );
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    let text = metrics.encode();
    assert!(
        text.lines()
            .any(|l| l.starts_with("slicelet_allocation_info{")
                && l.contains(&format!("device=\"{id}\""))
                && l.contains("pod=\"dra-pod\"")),
        "{text}"
    );
    assert!(
        text.contains("slicelet_resource_allocated_devices{resource=\"nvidia.com/gpu-shared\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("slicelet_resource_free_devices{resource=\"nvidia.com/gpu-shared\"} 7"),
        "{text}"
    );
    let view = usage.view(&plan, &in_use);
    let device = view
        .gpus
        .iter()
        .flat_map(|g| &g.devices)
        .find(|d| d.id == id)
        .unwrap();
    assert_eq!(device.holder.as_ref().unwrap().pod, "dra-pod");
    assert_eq!(view.free["nvidia.com/gpu-shared"], 7);
}

/// When the kubelet's device checkpoint stops being usable, the per-container series go (the
/// use is unknown: 0 % would read as idle and let the KEDA example scale a busy Deployment to
/// zero) and `slicelet_attribution_up` says so; they come back with the checkpoint.
#[test]
fn an_unusable_checkpoint_withholds_the_container_series() {
    let plan = plan();
    let (samples, in_use) = two_pods();
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    let series = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("slicelet_container_gpu_sm_util_percent{"))
            .count()
    };
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    let text = metrics.encode();
    assert_eq!(series(&text), 2, "{text}");
    assert!(text.contains("slicelet_attribution_up 1"), "{text}");
    let mut broken = samples.clone();
    broken.checkpoint = None;
    broken.checkpoint_error = Some("a format this parser does not know".into());
    usage.sampled(&broken, &plan, &in_use, metrics.usage());
    let text = metrics.encode();
    assert_eq!(series(&text), 0, "{text}");
    assert!(
        !text.contains("slicelet_container_gpu_last_active_timestamp_seconds{"),
        "{text}"
    );
    assert!(text.contains("slicelet_attribution_up 0"), "{text}");
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    assert_eq!(series(&metrics.encode()), 2);
}

/// The memory-limit series: each container's hard and soft limit, its enforcement once read
/// back, the GPU's support and the not-cleared count; a container's go with it.
#[test]
fn memory_limit_series_follow_the_containers() {
    use crate::inventory::sample::{CgroupLimits, LimitReading};
    use crate::usage::attribute::tests::limited_plan;
    let plan = limited_plan(false);
    let (mut samples, in_use) = two_pods();
    let g = &mut samples.gpus[0];
    g.memory_limits_supported = Some(true);
    g.processes[0].cgroup = Some("/a".into());
    g.cgroup_limits = vec![CgroupLimits {
        cgroup: "/a".into(),
        reading: LimitReading {
            soft: 4 << 30,
            hard: 10 << 30,
            used: 0,
        },
    }];
    samples.gpus[1].memory_limits_supported = Some(false);
    samples.limits_not_cleared = 2;
    let metrics = Metrics::new();
    let mut usage = Usage::new();
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    let limit_series = |text: &str| -> Vec<String> {
        usage_series(text)
            .into_iter()
            .filter(|l| l.contains("limit"))
            .collect()
    };
    let limit = |pod: &str, kind: &str, v: u64| {
        format!("slicelet_container_gpu_memory_limit_bytes{{pod=\"{pod}\",namespace=\"ml\",container=\"main\",UUID=\"{GPU0}\",resource=\"{SHARED}\",kind=\"{kind}\"}} {v}")
    };
    let mut want = vec![
        limit("a", "hard", 10 << 30),
        limit("a", "soft", 4 << 30),
        limit("b", "hard", 10 << 30),
        limit("b", "soft", 4 << 30),
        // a's cgroup reads back its limit; b has no process with a known cgroup yet.
        container_series(
            "container_gpu_memory_limit_enforced",
            "ml",
            "a",
            GPU0,
            SHARED,
            "1",
        ),
        gpu_series("gpu_memory_limits_supported", GPU0, 0, 1),
        gpu_series("gpu_memory_limits_supported", GPU1, 1, 0),
        "slicelet_gpu_memory_limits_not_cleared_total 2".to_string(),
    ];
    want.sort();
    assert_eq!(limit_series(&metrics.encode()), want);
    let view = usage.view(&plan, &in_use);
    let a = &view.gpus[0].devices[0];
    assert_eq!(
        (a.memory_limit_bytes, a.memory_limit_enforced),
        (Some(10 << 30), Some(true))
    );
    assert_eq!(view.gpus[0].memory_limits_supported, Some(true));

    // b is gone: its limit series go at the allocation change.
    let mut without_b = InUse::default();
    without_b.insert(SHARED, &replica_id(GPU0, 0), holder("ml", "a", "main"));
    usage.allocation(&plan, &without_b, metrics.usage());
    want.retain(|l| !l.contains("pod=\"b\""));
    assert_eq!(limit_series(&metrics.encode()), want);
}
