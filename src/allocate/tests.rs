use super::*;
use crate::inventory::test_node;
use crate::plan::build;
use crate::policy::parse;

fn resource(ts: &str, gpus: u32) -> std::sync::Arc<ResourcePlan> {
    let p = parse(&format!("sharing:\n  timeSlicing:\n{ts}")).unwrap();
    let built = build(&p, &test_node(gpus)).unwrap();
    built.plan.resources.values().next().unwrap().clone()
}

fn shared(replicas: u32, gpus: u32) -> std::sync::Arc<ResourcePlan> {
    resource(
        &format!("    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"),
        gpus,
    )
}

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

fn ids(v: &[String]) -> Vec<String> {
    v.to_vec()
}

#[test]
fn three_replicas_of_one_gpu_give_one_uuid() {
    let r = shared(4, 8);
    let req = vec![
        format!("{}::2", uuid(3)),
        format!("{}::0", uuid(3)),
        format!("{}::1", uuid(3)),
    ];
    let a = allocate(&r, &req, "/").unwrap();
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], uuid(3));
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], uuid(3));
    assert!(a.device_nodes.is_empty());
}

#[test]
fn uuids_are_ordered_by_gpu_index_not_request_order() {
    let r = shared(2, 8);
    let req = vec![
        format!("{}::1", uuid(6)),
        format!("{}::0", uuid(1)),
        format!("{}::0", uuid(4)),
    ];
    let a = allocate(&r, &req, "/").unwrap();
    let want = format!("{},{},{}", uuid(1), uuid(4), uuid(6));
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], want);
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], want);
}

#[test]
fn unknown_ids_are_refused_by_name() {
    let r = shared(2, 2);
    let cases = [
        format!("{}::2", uuid(0)),
        uuid(0),
        "GPU-unknown::0".to_string(),
        String::new(),
    ];
    for id in cases {
        let e = allocate(&r, &[format!("{}::0", uuid(1)), id.clone()], "/").unwrap_err();
        assert_eq!(
            e,
            AllocateError::UnknownDevice {
                resource: "nvidia.com/gpu".into(),
                id: id.clone()
            }
        );
        assert!(e.to_string().contains(&format!("{id:?}")));
    }
    assert!(matches!(
        allocate(&r, &[], "/"),
        Err(AllocateError::Empty { .. })
    ));
}

#[test]
fn fail_requests_greater_than_one() {
    let r = resource(
        "    failRequestsGreaterThanOne: true\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n",
        2,
    );
    assert!(allocate(&r, &[format!("{}::0", uuid(0))], "/").is_ok());
    let e = allocate(
        &r,
        &[format!("{}::0", uuid(0)), format!("{}::1", uuid(1))],
        "/",
    )
    .unwrap_err();
    assert_eq!(
        e,
        AllocateError::TooManyReplicas {
            resource: "nvidia.com/gpu".into(),
            count: 2
        }
    );
    // The same ID twice is still one replica.
    assert!(allocate(
        &r,
        &[format!("{}::0", uuid(0)), format!("{}::0", uuid(0))],
        "/"
    )
    .is_ok());
}

#[test]
fn allocate_is_stateless_for_overlapping_calls() {
    let r = shared(4, 2);
    let first = allocate(&r, &[format!("{}::0", uuid(0))], "/").unwrap();
    let second = allocate(
        &r,
        &[format!("{}::0", uuid(0)), format!("{}::1", uuid(1))],
        "/",
    )
    .unwrap();
    let again = allocate(&r, &[format!("{}::0", uuid(0))], "/").unwrap();
    assert_eq!(first, again);
    assert_eq!(
        second.envs[NVIDIA_VISIBLE_DEVICES],
        format!("{},{}", uuid(0), uuid(1))
    );
}

#[test]
fn device_specs_with_pass_device_specs() {
    let p = parse("flags:\n  plugin:\n    passDeviceSpecs: true\n").unwrap();
    let built = build(&p, &test_node(4)).unwrap();
    let r = &built.plan.resources["nvidia.com/gpu"];
    let a = allocate(r, &[uuid(2), uuid(0)], "/host/").unwrap();
    let paths: Vec<(&str, &str)> = a
        .device_nodes
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            ("/dev/nvidia0", "/host/dev/nvidia0"),
            ("/dev/nvidia2", "/host/dev/nvidia2"),
            ("/dev/nvidiactl", "/host/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/host/dev/nvidia-uvm"),
            ("/dev/nvidia-uvm-tools", "/host/dev/nvidia-uvm-tools"),
        ]
    );
    assert!(a.device_nodes.iter().all(|d| d.permissions == "rw"));
}

fn all_ids(r: &ResourcePlan) -> Vec<String> {
    r.devices.iter().map(|d| d.id.clone()).collect()
}

fn gpus_of(r: &ResourcePlan, chosen: &[String]) -> Vec<u32> {
    chosen
        .iter()
        .map(|id| r.device(id).unwrap().gpu_index)
        .collect()
}

#[test]
fn preferred_spreads_over_distinct_gpus_first() {
    let r = shared(4, 8);
    let mut avail = all_ids(&r);
    avail.reverse(); // the kubelet sends no particular order
    let got = preferred(&r, &avail, &[], 4);
    assert_eq!(got.len(), 4);
    let g = gpus_of(&r, &got);
    let distinct: BTreeSet<u32> = g.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "{got:?}");
    // Same NUMA node (GPUs 0-3 are NUMA 0) and deterministic.
    assert_eq!(g, [0, 1, 2, 3]);
    assert_eq!(preferred(&r, &avail, &[], 4), got);
}

#[test]
fn preferred_picks_the_least_loaded_gpu() {
    let r = shared(4, 3);
    // GPU 0: 3 replicas in use, GPU 1: 1 in use, GPU 2: 2 in use.
    let avail = ids(&[
        format!("{}::3", uuid(0)),
        format!("{}::1", uuid(1)),
        format!("{}::2", uuid(1)),
        format!("{}::3", uuid(1)),
        format!("{}::2", uuid(2)),
        format!("{}::3", uuid(2)),
    ]);
    let got = preferred(&r, &avail, &[], 1);
    assert_eq!(got, [format!("{}::1", uuid(1))]);
    let got = preferred(&r, &avail, &[], 2);
    assert_eq!(gpus_of(&r, &got), [1, 2]);
    let got = preferred(&r, &avail, &[], 6);
    assert_eq!(got.len(), 6);
}

#[test]
fn preferred_honours_must_include_and_size() {
    let r = shared(4, 4);
    let avail = all_ids(&r);
    let must = vec![format!("{}::2", uuid(3))];
    let got = preferred(&r, &avail, &must, 3);
    assert_eq!(got.len(), 3);
    assert!(got.contains(&must[0]));
    // The rest avoid GPU 3 (already used by this container) and each other.
    let g: BTreeSet<u32> = gpus_of(&r, &got).into_iter().collect();
    assert_eq!(g.len(), 3, "{got:?}");
    assert!(got.iter().all(|id| avail.contains(id)));
}

/// A must_include replica is the container's own: its GPU is neither loaded by it nor a new
/// GPU for the container, so the next pick goes to another GPU even when that one is busier.
#[test]
fn preferred_counts_must_include_as_the_containers_own_not_as_load() {
    let r = shared(4, 2);
    // GPU 1 has two replicas in use; the container already holds GPU 0's ::0 (counted as in
    // use, GPU 0 would look less loaded than GPU 1 and be picked again).
    let busy = [format!("{}::2", uuid(1)), format!("{}::3", uuid(1))];
    let avail: Vec<String> = all_ids(&r)
        .into_iter()
        .filter(|id| !busy.contains(id))
        .collect();
    let must = vec![format!("{}::0", uuid(0))];
    let got = preferred(&r, &avail, &must, 2);
    assert_eq!(got, [format!("{}::0", uuid(0)), format!("{}::0", uuid(1))]);
}

#[test]
fn preferred_never_fails_on_absent_or_foreign_ids() {
    let r = shared(2, 2);
    let avail = vec![
        "GPU-gone::0".to_string(),
        format!("{}::1", uuid(1)),
        "garbage".to_string(),
        format!("{}::0", uuid(0)),
    ];
    let got = preferred(&r, &avail, &["GPU-gone::1".to_string()], 2);
    assert_eq!(got, [format!("{}::0", uuid(0)), format!("{}::1", uuid(1))]);
    // Asking for more than is available returns what there is.
    assert_eq!(preferred(&r, &avail, &[], 5).len(), 2);
    assert!(preferred(&r, &avail, &[], 0).is_empty());
}

#[test]
fn preferred_for_whole_gpus_stays_on_one_numa_node() {
    let p = parse("").unwrap();
    let built = build(&p, &test_node(8)).unwrap();
    let r = &built.plan.resources["nvidia.com/gpu"];
    // GPUs 2..7 available; must include GPU 5 (NUMA 1): the other picks stay on NUMA 1.
    let avail: Vec<String> = (2..8).map(uuid).collect();
    let got = preferred(r, &avail, &[uuid(5)], 3);
    assert_eq!(gpus_of(r, &got), [4, 5, 6]);
}

#[test]
fn preferred_ranks_load_before_numa() {
    // GPU 0 (NUMA 0) has 2 replicas in use; GPU 4 (NUMA 1) is idle; the container already has
    // a replica of GPU 1 (NUMA 0). The idle GPU wins over the nearer, busier one.
    let r = shared(4, 8);
    let mut avail = vec![format!("{}::0", uuid(1))];
    avail.extend((2..4).map(|n| format!("{}::{n}", uuid(0))));
    avail.extend((0..4).map(|n| format!("{}::{n}", uuid(4))));
    let got = preferred(&r, &avail, &[format!("{}::0", uuid(1))], 2);
    assert_eq!(got, [format!("{}::0", uuid(1)), format!("{}::0", uuid(4))]);
}

// ---- MIG ----

/// GPU 0: 3x 2g.20gb; GPU 1: 2x 1g.10gb + 1x 2g.20gb; GPUs 2-3 whole. caps: GI access
/// 100 + 10 * gpu + gi, CI access 200 + 10 * gpu + gi.
fn mig_node() -> crate::inventory::Inventory {
    use crate::inventory::{test_mig, MigCaps};
    let mut node = test_node(4);
    node.gpus[0].mig_enabled = true;
    node.gpus[0].mig_devices = test_mig(0, &[("2g.20gb", 3)]);
    node.gpus[1].mig_enabled = true;
    node.gpus[1].mig_devices = test_mig(1, &[("1g.10gb", 2), ("2g.20gb", 1)]);
    for g in &mut node.gpus {
        let gi = g.index;
        for m in &mut g.mig_devices {
            m.caps = Some(MigCaps {
                gi_access: 100 + 10 * gi + m.gi_id,
                ci_access: 200 + 10 * gi + m.gi_id,
            });
        }
    }
    node
}

fn mig_uuid(gpu: u32, m: u32) -> String {
    format!("MIG-{gpu:04}{m:04}-0000-0000-0000-000000000000")
}

fn mig_resource(flags: &str, ts: &str, name: &str) -> std::sync::Arc<ResourcePlan> {
    let sharing = if ts.is_empty() {
        String::new()
    } else {
        format!("sharing:\n  timeSlicing:\n{ts}")
    };
    let p = parse(&format!("flags:\n  migStrategy: mixed\n{flags}{sharing}")).unwrap();
    build(&p, &mig_node()).unwrap().plan.resources[name].clone()
}

#[test]
fn mig_allocation_env_carries_mig_uuids_in_gpu_then_mig_order() {
    let r = mig_resource("", "", "nvidia.com/mig-2g.20gb");
    let cases: &[(&[String], String)] = &[
        (&[mig_uuid(0, 1)], mig_uuid(0, 1)),
        (
            &[mig_uuid(1, 2), mig_uuid(0, 2), mig_uuid(0, 0)],
            format!("{},{},{}", mig_uuid(0, 0), mig_uuid(0, 2), mig_uuid(1, 2)),
        ),
    ];
    for (req, want) in cases {
        let a = allocate(&r, req, "/").unwrap();
        assert_eq!(&a.envs[NVIDIA_VISIBLE_DEVICES], want);
        assert_eq!(&a.envs[CUDA_VISIBLE_DEVICES], want);
        assert!(a.device_nodes.is_empty());
    }
    // A GPU UUID is not a device of a MIG resource.
    assert!(matches!(
        allocate(&r, &[uuid(0)], "/"),
        Err(AllocateError::UnknownDevice { .. })
    ));
}

#[test]
fn time_sliced_mig_replicas_of_two_slices_on_one_gpu_are_two_uuids() {
    let r = mig_resource(
        "",
        "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 3\n",
        "nvidia.com/mig-1g.10gb",
    );
    let req = vec![
        format!("{}::2", mig_uuid(1, 1)),
        format!("{}::0", mig_uuid(1, 0)),
        format!("{}::1", mig_uuid(1, 1)),
    ];
    let a = allocate(&r, &req, "/").unwrap();
    let want = format!("{},{}", mig_uuid(1, 0), mig_uuid(1, 1));
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], want);
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], want);
}

#[test]
fn mig_device_specs_include_the_parent_and_the_caps_nodes() {
    let r = mig_resource(
        "  plugin:\n    passDeviceSpecs: true\n",
        "",
        "nvidia.com/mig-2g.20gb",
    );
    // Two MIG devices of GPU 0 and one of GPU 1: /dev/nvidia0 and /dev/nvidia1 once each.
    let a = allocate(
        &r,
        &[mig_uuid(1, 2), mig_uuid(0, 2), mig_uuid(0, 0)],
        "/host",
    )
    .unwrap();
    let paths: Vec<(&str, &str)> = a
        .device_nodes
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            ("/dev/nvidia0", "/host/dev/nvidia0"),
            ("/dev/nvidia1", "/host/dev/nvidia1"),
            ("/dev/nvidiactl", "/host/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/host/dev/nvidia-uvm"),
            ("/dev/nvidia-uvm-tools", "/host/dev/nvidia-uvm-tools"),
            // GPU 0, MIG 0: GI 1; GPU 0, MIG 2: GI 3; GPU 1, MIG 2: GI 3.
            (
                "/dev/nvidia-caps/nvidia-cap101",
                "/host/dev/nvidia-caps/nvidia-cap101"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap201",
                "/host/dev/nvidia-caps/nvidia-cap201"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap103",
                "/host/dev/nvidia-caps/nvidia-cap103"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap203",
                "/host/dev/nvidia-caps/nvidia-cap203"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap113",
                "/host/dev/nvidia-caps/nvidia-cap113"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap213",
                "/host/dev/nvidia-caps/nvidia-cap213"
            ),
        ]
    );
    // Whole GPUs on the same node: no caps nodes.
    let p = parse("flags:\n  migStrategy: mixed\n  plugin:\n    passDeviceSpecs: true\n").unwrap();
    let built = build(&p, &mig_node()).unwrap();
    let whole = &built.plan.resources["nvidia.com/gpu"];
    let a = allocate(whole, &[uuid(3)], "/").unwrap();
    assert_eq!(a.device_nodes.len(), 4);
    assert!(a.device_nodes.iter().all(|d| !d.host_path.contains("caps")));
}

#[test]
fn mig_device_specs_without_known_caps_skip_the_caps_nodes() {
    let p = parse("flags:\n  migStrategy: mixed\n  plugin:\n    passDeviceSpecs: true\n").unwrap();
    let mut node = mig_node();
    node.gpus[0].mig_devices[1].caps = None;
    let built = build(&p, &node).unwrap();
    let r = &built.plan.resources["nvidia.com/mig-2g.20gb"];
    let a = allocate(r, &[mig_uuid(0, 1)], "/").unwrap();
    let paths: Vec<&str> = a
        .device_nodes
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools"
        ]
    );
}

#[test]
fn preferred_treats_mig_slices_of_one_gpu_as_distinct_units() {
    let r = mig_resource(
        "",
        "    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 4\n",
        "nvidia.com/mig-1g.10gb",
    );
    // Both 1g.10gb slices are on GPU 1: two replicas go to two slices, not one.
    let mut avail = all_ids(&r);
    avail.reverse();
    let got = preferred(&r, &avail, &[], 2);
    assert_eq!(
        got,
        [
            format!("{}::0", mig_uuid(1, 0)),
            format!("{}::0", mig_uuid(1, 1))
        ]
    );
    // Least-loaded slice: slice 0 has 3 replicas in use, slice 1 has 1.
    let avail = vec![
        format!("{}::3", mig_uuid(1, 0)),
        format!("{}::1", mig_uuid(1, 1)),
        format!("{}::2", mig_uuid(1, 1)),
        format!("{}::3", mig_uuid(1, 1)),
    ];
    assert_eq!(
        preferred(&r, &avail, &[], 1),
        [format!("{}::1", mig_uuid(1, 1))]
    );
    // must_include on slice 1: the next pick is on slice 0.
    let avail = all_ids(&r);
    let must = vec![format!("{}::2", mig_uuid(1, 1))];
    let got = preferred(&r, &avail, &must, 2);
    assert_eq!(got, [format!("{}::0", mig_uuid(1, 0)), must[0].clone()]);
}

#[test]
fn fail_requests_greater_than_one_counts_replicas_only() {
    // Regression: `replicas: 1` advertises whole GPUs under a new name; a pod asking for two of
    // them was refused as "2 replicas".
    let r = resource(
        "    failRequestsGreaterThanOne: true\n    resources:\n      - name: nvidia.com/gpu\n        rename: whole\n        replicas: 1\n",
        2,
    );
    let a = allocate(&r, &[uuid(1), uuid(0)], "/").unwrap();
    assert_eq!(
        a.envs[NVIDIA_VISIBLE_DEVICES],
        format!("{},{}", uuid(0), uuid(1))
    );
}

// --- mutation-testing gaps ---

#[test]
fn must_include_counts_as_this_containers_devices() {
    // GPU 0: the container already has replica 0 (must_include); GPU 1: replica 3 in use by
    // another pod. must_include is this container's own, so GPU 0 has load 0 but already one
    // device of this container: the next pick is a distinct unit (GPU 1), even though GPU 1
    // is busier. Were must_include not counted per unit, GPU 0 would look as loaded as GPU 1
    // and win the tie by index.
    let r = shared(4, 2);
    let must = vec![format!("{}::0", uuid(0))];
    let mut avail: Vec<String> = (0..4).map(|n| format!("{}::{n}", uuid(0))).collect();
    avail.extend((0..3).map(|n| format!("{}::{n}", uuid(1))));
    let got = preferred(&r, &avail, &must, 2);
    assert_eq!(got, [format!("{}::0", uuid(0)), format!("{}::0", uuid(1))]);
}

#[test]
fn must_include_larger_than_the_rest_of_its_unit() {
    // The init container got replicas 0 and 1 of GPU 0; only replica 2 of GPU 0 is still free
    // besides them. Load = devices in use by others = 4 - (1 free + 2 mine) = 1 on GPU 0,
    // 0 on GPU 1, and GPU 1 has none of this container's devices: the third pick is GPU 1.
    let r = shared(4, 2);
    let must = vec![format!("{}::0", uuid(0)), format!("{}::1", uuid(0))];
    let mut avail: Vec<String> = (0..3).map(|n| format!("{}::{n}", uuid(0))).collect();
    avail.extend((0..4).map(|n| format!("{}::{n}", uuid(1))));
    let got = preferred(&r, &avail, &must, 3);
    assert_eq!(
        got,
        [
            format!("{}::0", uuid(0)),
            format!("{}::1", uuid(0)),
            format!("{}::0", uuid(1))
        ]
    );
}
