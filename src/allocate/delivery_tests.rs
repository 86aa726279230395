//! Allocate per `deviceListStrategy` and `deviceIDStrategy` (issue 12): whole GPUs, replicas
//! (collapsed to their GPU, deduplicated), MIG devices and MPS replicas.

use super::*;
use crate::inventory::{test_mig, test_node, Inventory};
use crate::plan::build;
use crate::policy::parse;

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

fn replica(gpu: u32, n: u32) -> String {
    format!("{}::{n}", uuid(gpu))
}

/// `flags.plugin` lines for a strategy and an ID strategy.
fn plugin(strategy: &str, ids: &str) -> String {
    format!("  plugin:\n    deviceListStrategy: {strategy}\n    deviceIDStrategy: {ids}\n")
}

/// The resource `name` of `sharing` under `flags` on `node`.
fn resource(
    flags: &str,
    sharing: &str,
    node: &Inventory,
    name: &str,
) -> std::sync::Arc<ResourcePlan> {
    let p = parse(&format!("flags:\n{flags}{sharing}")).unwrap();
    build(&p, node).unwrap().plan.resources[name].clone()
}

const TS4: &str = "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        replicas: 4\n";

fn shared(strategy: &str, ids: &str) -> std::sync::Arc<ResourcePlan> {
    resource(
        &plugin(strategy, ids),
        TS4,
        &test_node(8),
        "nvidia.com/gpu-shared",
    )
}

/// Two replicas of GPU 3 and one of GPU 1, in the kubelet's random order.
fn three_replicas() -> Vec<String> {
    vec![replica(3, 2), replica(1, 0), replica(3, 0)]
}

#[test]
fn envvar_lists_each_gpu_once_by_uuid_or_index() {
    let a = allocate(&shared("envvar", "uuid"), &three_replicas(), "/").unwrap();
    let want = format!("{},{}", uuid(1), uuid(3));
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], want);
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], want);
    assert!(a.mounts.is_empty() && a.annotations.is_empty() && a.cdi_devices.is_empty());
    // index: the runtime gets indices, CUDA keeps UUIDs.
    let a = allocate(&shared("envvar", "index"), &three_replicas(), "/").unwrap();
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], "1,3");
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], want);
}

#[test]
fn volume_mounts_mount_dev_null_per_gpu() {
    for (ids, names) in [
        ("uuid", vec![uuid(1), uuid(3)]),
        ("index", vec!["1".to_string(), "3".to_string()]),
    ] {
        let a = allocate(&shared("volume-mounts", ids), &three_replicas(), "/").unwrap();
        assert_eq!(
            a.envs[NVIDIA_VISIBLE_DEVICES],
            "/var/run/nvidia-container-devices"
        );
        let want: Vec<MountSpec> = names
            .iter()
            .map(|n| MountSpec {
                container_path: format!("/var/run/nvidia-container-devices/{n}"),
                host_path: "/dev/null".into(),
                read_only: true,
            })
            .collect();
        assert_eq!(a.mounts, want, "{ids}");
        assert!(a.cdi_devices.is_empty() && a.annotations.is_empty());
    }
    // With envvar too, the mounts' value wins (NVIDIA's order).
    let a = allocate(
        &shared("[envvar, volume-mounts]", "uuid"),
        &three_replicas(),
        "/",
    )
    .unwrap();
    assert_eq!(
        a.envs[NVIDIA_VISIBLE_DEVICES],
        "/var/run/nvidia-container-devices"
    );
    assert_eq!(a.mounts.len(), 2);
}

#[test]
fn cdi_cri_names_each_gpu_once_and_sets_no_visible_devices() {
    let two_of_gpu3 = [replica(3, 1), replica(3, 0)];
    let a = allocate(&shared("[cdi-cri]", "uuid"), &two_of_gpu3, "/").unwrap();
    assert_eq!(a.cdi_devices, vec![format!("nvidia.com/gpu={}", uuid(3))]);
    assert!(!a.envs.contains_key(NVIDIA_VISIBLE_DEVICES), "{:?}", a.envs);
    assert_eq!(a.envs[CUDA_VISIBLE_DEVICES], uuid(3));
    assert!(a.annotations.is_empty() && a.mounts.is_empty());
    let a = allocate(&shared("cdi-cri", "index"), &three_replicas(), "/").unwrap();
    assert_eq!(a.cdi_devices, vec!["nvidia.com/gpu=1", "nvidia.com/gpu=3"]);
    // The node's --cdi-kind qualifies the names.
    let p = parse(&format!("flags:\n{}{TS4}", plugin("cdi-cri", "index"))).unwrap();
    let mut p = p;
    p.delivery = p.delivery.with_cdi_kind("example.com/gpu");
    let r = build(&p, &test_node(8)).unwrap().plan.resources["nvidia.com/gpu-shared"].clone();
    let a = allocate(&r, &two_of_gpu3, "/").unwrap();
    assert_eq!(a.cdi_devices, vec!["example.com/gpu=3"]);
}

#[test]
fn envvar_with_cdi_annotations_returns_both() {
    let r = shared("[envvar, cdi-annotations]", "uuid");
    let a = allocate(&r, &three_replicas(), "/").unwrap();
    let names = vec![
        format!("nvidia.com/gpu={}", uuid(1)),
        format!("nvidia.com/gpu={}", uuid(3)),
    ];
    assert_eq!(
        a.envs[NVIDIA_VISIBLE_DEVICES],
        format!("{},{}", uuid(1), uuid(3))
    );
    let key = annotation_key("cdi.k8s.io/", "nvidia.com/gpu-shared", &names);
    assert_eq!(
        a.annotations.iter().collect::<Vec<_>>(),
        vec![(&key, &names.join(","))]
    );
    assert!(a.cdi_devices.is_empty());
    // Deterministic, and the kubelet's request order does not matter.
    let mut reversed = three_replicas();
    reversed.reverse();
    assert_eq!(allocate(&r, &reversed, "/").unwrap(), a);
}

#[test]
fn annotation_keys_fit_kubernetes_and_cdi_grammar() {
    let long_prefix = format!("{}.example.com/", "a".repeat(60));
    for prefix in ["cdi.k8s.io/", long_prefix.as_str()] {
        let names = vec!["nvidia.com/gpu=GPU-00000003-0000-0000-0000-000000000000".to_string()];
        let key = annotation_key(prefix, "nvidia.com/gpu-shared", &names);
        let name = key.strip_prefix(prefix).unwrap();
        assert!(name.len() <= MAX_ANNOTATION_NAME, "{name}");
        assert_eq!(name.len(), ANNOTATION_NAME_PREFIX.len() + 32);
        assert!(name.starts_with("slicelet_"), "{name}");
        assert!(
            name.chars().next().unwrap().is_ascii_alphanumeric()
                && name.chars().last().unwrap().is_ascii_alphanumeric()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
            "{name}"
        );
    }
    // Two resources in one container get two keys; other devices another key.
    let n = |s: &str| vec![s.to_string()];
    let a = annotation_key("cdi.k8s.io/", "nvidia.com/a", &n("nvidia.com/gpu=0"));
    assert_ne!(
        a,
        annotation_key("cdi.k8s.io/", "nvidia.com/b", &n("nvidia.com/gpu=0"))
    );
    assert_ne!(
        a,
        annotation_key("cdi.k8s.io/", "nvidia.com/a", &n("nvidia.com/gpu=1"))
    );
    // The prefix comes from flags.plugin.cdiAnnotationPrefix.
    let flags = format!(
        "{}    cdiAnnotationPrefix: example.com/\n",
        plugin("cdi-annotations", "index")
    );
    let r = resource(&flags, TS4, &test_node(8), "nvidia.com/gpu-shared");
    let a = allocate(&r, &[replica(2, 0)], "/").unwrap();
    let (k, v) = a.annotations.iter().next().unwrap();
    assert!(k.starts_with("example.com/slicelet_"), "{k}");
    assert_eq!(v, "nvidia.com/gpu=2");
}

#[test]
fn only_cdi_strategies_return_no_device_specs() {
    let specs = "  plugin:\n    passDeviceSpecs: true\n";
    let r = resource(
        &format!("{specs}    deviceListStrategy: [cdi-cri, cdi-annotations]\n"),
        TS4,
        &test_node(8),
        "nvidia.com/gpu-shared",
    );
    let a = allocate(&r, &[replica(3, 0)], "/").unwrap();
    assert!(a.device_nodes.is_empty(), "{:?}", a.device_nodes);
    assert!(!a.envs.contains_key(NVIDIA_VISIBLE_DEVICES));
    assert_eq!(a.cdi_devices.len(), 1);
    assert_eq!(a.annotations.len(), 1);
    // With envvar beside CDI, the device specs come back.
    let r = resource(
        &format!("{specs}    deviceListStrategy: [envvar, cdi-cri]\n"),
        TS4,
        &test_node(8),
        "nvidia.com/gpu-shared",
    );
    let a = allocate(&r, &[replica(3, 0)], "/").unwrap();
    assert!(a
        .device_nodes
        .iter()
        .any(|d| d.container_path == "/dev/nvidia3"));
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], uuid(3));
}

#[test]
fn whole_gpus_are_named_like_replicas() {
    let r = resource(
        &plugin("[volume-mounts, cdi-cri]", "index"),
        "",
        &test_node(4),
        "nvidia.com/gpu",
    );
    let a = allocate(&r, &[uuid(2), uuid(0)], "/").unwrap();
    assert_eq!(a.cdi_devices, vec!["nvidia.com/gpu=0", "nvidia.com/gpu=2"]);
    let paths: Vec<&str> = a.mounts.iter().map(|m| m.container_path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/var/run/nvidia-container-devices/0",
            "/var/run/nvidia-container-devices/2"
        ]
    );
    assert_eq!(
        a.envs[CUDA_VISIBLE_DEVICES],
        format!("{},{}", uuid(0), uuid(2))
    );
}

fn mig_node() -> Inventory {
    let mut node = test_node(2);
    node.gpus[1].mig_enabled = true;
    node.gpus[1].mig_devices = test_mig(1, &[("1g.10gb", 3)]);
    node
}

#[test]
fn mig_devices_are_named_by_mig_uuid_or_gpu_colon_mig() {
    let sharing = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n";
    let node = mig_node();
    let migs: Vec<String> = node.gpus[1]
        .mig_devices
        .iter()
        .map(|m| m.uuid.clone())
        .collect();
    // Replicas of MIG devices 1:2 and 1:0, one of them twice.
    let req = vec![
        format!("{}::1", migs[2]),
        format!("{}::0", migs[0]),
        format!("{}::0", migs[2]),
    ];
    let flags = |s: &str, ids: &str| format!("  migStrategy: mixed\n{}", plugin(s, ids));
    let r = resource(
        &flags("[envvar, cdi-cri]", "index"),
        sharing,
        &node,
        "nvidia.com/mig-1g.10gb",
    );
    let a = allocate(&r, &req, "/").unwrap();
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], "1:0,1:2");
    assert_eq!(
        a.cdi_devices,
        vec!["nvidia.com/gpu=1:0", "nvidia.com/gpu=1:2"]
    );
    assert_eq!(
        a.envs[CUDA_VISIBLE_DEVICES],
        format!("{},{}", migs[0], migs[2])
    );
    let r = resource(
        &flags("volume-mounts", "uuid"),
        sharing,
        &node,
        "nvidia.com/mig-1g.10gb",
    );
    let a = allocate(&r, &req, "/").unwrap();
    let paths: Vec<String> = a.mounts.iter().map(|m| m.container_path.clone()).collect();
    assert_eq!(
        paths,
        vec![
            format!("/var/run/nvidia-container-devices/{}", migs[0]),
            format!("/var/run/nvidia-container-devices/{}", migs[2])
        ]
    );
}

#[test]
fn mps_clients_get_their_environment_and_mounts_whatever_the_strategy() {
    let sharing = "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        replicas: 4\n";
    let req = [replica(1, 3), replica(1, 0)];
    for (strategy, ids) in [
        ("envvar", "uuid"),
        ("envvar", "index"),
        ("volume-mounts", "index"),
        ("[cdi-cri]", "uuid"),
        ("[cdi-annotations, cdi-cri]", "index"),
    ] {
        let r = resource(
            &plugin(strategy, ids),
            sharing,
            &test_node(2),
            "nvidia.com/gpu-mps",
        );
        let a = allocate(&r, &req, "/").unwrap();
        let what = format!("{strategy} {ids}");
        assert_eq!(
            a.envs[CUDA_MPS_PIPE_DIRECTORY],
            format!("/mps/{}/pipe", uuid(1)),
            "{what}"
        );
        assert!(
            a.envs.contains_key(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
            "{what}"
        );
        assert!(
            a.envs.contains_key(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT),
            "{what}"
        );
        assert!(!a.envs.contains_key(CUDA_VISIBLE_DEVICES), "{what}");
        assert!(
            a.mounts.iter().any(|m| m.container_path == "/dev/shm")
                && a.mounts
                    .iter()
                    .any(|m| m.container_path == format!("/mps/{}/pipe", uuid(1))),
            "{what}: {:?}",
            a.mounts
        );
        let id = if ids == "index" {
            "1".to_string()
        } else {
            uuid(1)
        };
        match strategy {
            "envvar" => assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], id, "{what}"),
            "volume-mounts" => {
                assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], VOLUME_MOUNTS_ROOT, "{what}");
                assert!(a
                    .mounts
                    .iter()
                    .any(|m| m.container_path == format!("{VOLUME_MOUNTS_ROOT}/{id}")));
            }
            _ => {
                assert!(!a.envs.contains_key(NVIDIA_VISIBLE_DEVICES), "{what}");
                assert_eq!(
                    a.cdi_devices,
                    vec![format!("nvidia.com/gpu={id}")],
                    "{what}"
                );
            }
        }
    }
}
