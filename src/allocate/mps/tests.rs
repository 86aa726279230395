use super::*;
use crate::allocate::{allocate, preferred, NVIDIA_VISIBLE_DEVICES};
use crate::inventory::test_node;
use crate::plan::{build, Strategy};
use crate::policy::parse;

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

fn resource(extra: &str, gpus: u32) -> std::sync::Arc<ResourcePlan> {
    let p = parse(&format!(
        "flags:\n  mpsRoot: /run/nvidia/mps\n{extra}sharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-mps\n        replicas: 4\n"
    ))
    .unwrap();
    let built = build(&p, &test_node(gpus)).unwrap();
    let r = built.plan.resources["nvidia.com/gpu-mps"].clone();
    assert_eq!(r.strategy, Strategy::Mps);
    r
}

#[test]
fn one_replica_gets_the_daemon_pipe_shm_and_limits() {
    let r = resource("", 2);
    let a = allocate(&r, &[format!("{}::2", uuid(1))], "/").unwrap();
    let envs: Vec<(&str, &str)> = a
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let pipe = format!("/mps/{}/pipe", uuid(1));
    assert_eq!(
        envs,
        [
            (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, "25"),
            (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, "0=20389M"),
            (CUDA_MPS_PIPE_DIRECTORY, pipe.as_str()),
            (NVIDIA_VISIBLE_DEVICES, uuid(1).as_str()),
        ]
    );
    assert!(!a.envs.contains_key(CUDA_VISIBLE_DEVICES));
    assert_eq!(
        a.mounts,
        [
            MountSpec {
                container_path: pipe.clone(),
                host_path: format!("/run/nvidia/mps/{}/pipe", uuid(1)),
                read_only: false,
            },
            MountSpec {
                container_path: "/dev/shm".into(),
                host_path: "/run/nvidia/mps/shm".to_string(),
                read_only: false,
            },
        ]
    );
    assert!(a.device_nodes.is_empty());
    // Stateless: asking again (init container, then app container) gives the same answer.
    assert_eq!(allocate(&r, &[format!("{}::2", uuid(1))], "/").unwrap(), a);
}

#[test]
fn device_specs_still_come_with_pass_device_specs() {
    let r = resource("  plugin:\n    passDeviceSpecs: true\n", 2);
    let a = allocate(&r, &[format!("{}::0", uuid(1))], "/host").unwrap();
    let paths: Vec<&str> = a
        .device_nodes
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/host/dev/nvidia1",
            "/host/dev/nvidiactl",
            "/host/dev/nvidia-uvm",
            "/host/dev/nvidia-uvm-tools"
        ]
    );
}

#[test]
fn two_gpus_in_one_request_are_refused_naming_both() {
    let r = resource("", 3);
    for fail_gt_one in [true, false] {
        let r = if fail_gt_one {
            r.clone()
        } else {
            let p = parse("sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        replicas: 4\n").unwrap();
            build(&p, &test_node(3)).unwrap().plan.resources["nvidia.com/gpu-mps"].clone()
        };
        let e = allocate(
            &r,
            &[format!("{}::1", uuid(2)), format!("{}::0", uuid(0))],
            "/",
        )
        .unwrap_err();
        assert_eq!(
            e,
            AllocateError::MpsSpansDevices {
                resource: "nvidia.com/gpu-mps".into(),
                uuids: format!("{}, {}", uuid(0), uuid(2)),
            }
        );
        assert!(e.to_string().contains(&uuid(0)) && e.to_string().contains(&uuid(2)));
    }
}

#[test]
fn fail_requests_greater_than_one_is_the_default() {
    let r = resource("", 1);
    let two = [format!("{}::0", uuid(0)), format!("{}::1", uuid(0))];
    assert_eq!(
        allocate(&r, &two, "/").unwrap_err(),
        AllocateError::TooManyReplicas {
            resource: "nvidia.com/gpu-mps".into(),
            count: 2
        }
    );
    // The same ID twice is one replica.
    let same = [format!("{}::0", uuid(0)), format!("{}::0", uuid(0))];
    assert!(allocate(&r, &same, "/").is_ok());
    let p = parse("sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        replicas: 4\n").unwrap();
    let r = build(&p, &test_node(1)).unwrap().plan.resources["nvidia.com/gpu-mps"].clone();
    let a = allocate(&r, &two, "/").unwrap();
    assert_eq!(a.envs[NVIDIA_VISIBLE_DEVICES], uuid(0));
}

fn ids(gpu: u32, replicas: &[u32]) -> Vec<String> {
    replicas
        .iter()
        .map(|n| format!("{}::{n}", uuid(gpu)))
        .collect()
}

#[test]
fn preferred_allocation_packs_onto_one_gpu() {
    let r = resource("", 3);
    // GPU 0: 3 free (1 in use), GPU 1: 4 free, GPU 2: 2 free.
    let mut available: Vec<String> =
        [ids(0, &[1, 2, 3]), ids(1, &[0, 1, 2, 3]), ids(2, &[0, 3])].concat();
    available.reverse();
    // (size, must_include, want)
    let cases: Vec<(usize, Vec<String>, Vec<String>)> = vec![
        // One replica: the least-loaded GPU, like time-slicing.
        (1, vec![], ids(1, &[0])),
        // Two: the GPU with the fewest free replicas that holds both (best fit).
        (2, vec![], ids(2, &[0, 3])),
        (3, vec![], ids(0, &[1, 2, 3])),
        (4, vec![], ids(1, &[0, 1, 2, 3])),
        // must_include decides the GPU.
        (2, ids(1, &[3]), ids(1, &[0, 3])),
        (3, ids(0, &[2]), ids(0, &[1, 2, 3])),
        // must_include outside `available` is left out (the kubelet takes only available IDs).
        (3, ids(0, &[0]), ids(0, &[1, 2, 3])),
        // No GPU holds 5: the fullest-fitting first, then the next, exactly 5 IDs.
        (5, vec![], [ids(1, &[0, 1, 2, 3]), ids(0, &[1])].concat()),
    ];
    for (size, must, want) in cases {
        let got = preferred(&r, &available, &must, size);
        let mut want = want.clone();
        want.sort_by_key(|id| r.position(id));
        assert_eq!(got, want, "size {size}, must_include {must:?}");
        // Deterministic whatever the order of `available`.
        let mut shuffled = available.clone();
        shuffled.rotate_left(3);
        assert_eq!(preferred(&r, &shuffled, &must, size), got);
    }
    // Unknown IDs are skipped, never an error.
    let got = preferred(
        &r,
        &["GPU-gone::0".to_string(), ids(2, &[0])[0].clone()],
        &[],
        1,
    );
    assert_eq!(got, ids(2, &[0]));
}
