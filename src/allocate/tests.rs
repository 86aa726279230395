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
