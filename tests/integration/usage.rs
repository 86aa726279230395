//! GPU use per container through the whole daemon: a simulated node with processes, fake
//! `/proc/<pid>/cgroup` files, the kubelet's device checkpoint and the emulated pod-resources
//! API → `/metrics`, `/status` and `slicelet top --once` (the real binary).

use std::path::Path;

use kubelet_emulator::node_files::{self, write_cgroup, Driver, Entry};
use kubelet_emulator::pod_resources::{ClaimedDevice, PodResources};

use crate::common::*;
use crate::live::get;

const GPU: &str = "nvidia.com/gpu";
const UID_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const UID_B: &str = "11111111-2222-4333-8444-555555555555";

fn ts4() -> String {
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n".to_string()
}

/// The busy node (GPU 0 runs PIDs 4242 at `a` % and 4343 at `b` %).
fn write_node(path: &Path, a: u32, b: u32) {
    let text = read(&node_file("h100-80gb-x8-busy.yaml"))
        .replace("smUtil: 30", &format!("smUtil: {a}"))
        .replace("smUtil: 10", &format!("smUtil: {b}"));
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `<root>/proc/<pid>/cgroup` for a containerd container of pod A (systemd driver, burstable)
/// and of pod B (cgroupfs driver, Guaranteed), as the kubelet lays them out.
fn write_proc(root: &Path) {
    let id = "a".repeat(64);
    write_cgroup(root, 4242, Driver::Systemd, Some("burstable"), UID_A, &id).unwrap();
    write_cgroup(root, 4343, Driver::Cgroupfs, None, UID_B, &id).unwrap();
}

fn write_checkpoint(path: &Path, gpu0: &str) {
    let ids = [format!("{gpu0}::0"), format!("{gpu0}::1")];
    let entry = |pod_uid, id| Entry {
        pod_uid,
        container: "server",
        resource: GPU,
        device_ids: id,
    };
    node_files::write_checkpoint(path, &[entry(UID_A, &ids[..1]), entry(UID_B, &ids[1..])])
        .unwrap();
}

/// `slicelet top --once`, the real binary, against the daemon's `/status` at `addr`: its
/// stdout (it must succeed).
async fn top_once(addr: std::net::SocketAddr) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_slicelet"))
        .args(["top", "--once", "--address", &format!("http://{addr}")])
        .output()
        .await
        .unwrap();
    let top = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{top}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    top
}

/// The value of the one series of `name` whose labels include every `k="v"` of `labels`.
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The Done-when: 8× H100 time-sliced ×4, two pods on `::0` and `::1` of GPU 0 with
/// processes at 30 % and 10 % SM → two different per-container values with their pod labels,
/// `slicelet top --once` shows both under GPU 0, and at 0 % `last_active` stops advancing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_on_one_gpu_get_their_own_figures() {
    let node = Node::new(&ts4());
    let sim = node.tmp.path().join("node.yaml");
    write_node(&sim, 30, 10);
    let uuids = uuids(&sim);
    let proc_root = node.tmp.path().join("host");
    write_proc(&proc_root);
    write_checkpoint(
        &node.plugins().join("kubelet_internal_checkpoint"),
        &uuids[0],
    );
    let pr = PodResources::start(&node.pod_resources()).await.unwrap();
    pr.hold("ml", "llm-a", "server", GPU, &[&format!("{}::0", uuids[0])]);
    pr.hold("ml", "llm-b", "server", GPU, &[&format!("{}::1", uuids[0])]);
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.proc_root = proc_root;
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    settings.sample_interval = Some(std::time::Duration::from_millis(200));
    let mut d = Daemon::start(settings);
    wait_lists(&emu, &[(GPU, 32)]).await;
    let s = d.wait_status(|s| s.in_use == 2 && s.samples >= 1).await;
    // A sample after pod-resources answered (the first may predate it).
    let n = s.samples;
    d.wait_status(|s| s.samples > n).await;
    let addr = s.address.unwrap();
    let (_, text) = get(addr, "/metrics").await;
    let sm = |text: &str, pod: &str| {
        series(
            text,
            "slicelet_container_gpu_sm_util_percent",
            &[
                ("pod", pod),
                ("namespace", "ml"),
                ("container", "server"),
                ("UUID", &uuids[0]),
                ("resource", GPU),
            ],
        )
    };
    assert_eq!(sm(&text, "llm-a"), Some(30.0), "{text}");
    assert_eq!(sm(&text, "llm-b"), Some(10.0), "{text}");
    assert_eq!(
        series(
            &text,
            "slicelet_allocation_info",
            &[("pod", "llm-a"), ("device", &format!("{}::0", uuids[0]))]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "slicelet_resource_allocated_devices",
            &[("resource", GPU)]
        ),
        Some(2.0)
    );
    assert_eq!(
        series(
            &text,
            "slicelet_resource_free_devices",
            &[("resource", GPU)]
        ),
        Some(30.0)
    );

    // slicelet top --once, the real binary, against the daemon's /status.
    let top = top_once(addr).await;
    let gpu0 = top
        .find(&uuids[0])
        .unwrap_or_else(|| panic!("no GPU 0 in\n{top}"));
    let gpu1 = top
        .find(&uuids[1])
        .unwrap_or_else(|| panic!("no GPU 1 in\n{top}"));
    for pod in ["ml/llm-a/server", "ml/llm-b/server"] {
        let at = top
            .find(pod)
            .unwrap_or_else(|| panic!("{pod} not in\n{top}"));
        assert!(at > gpu0 && at < gpu1, "{pod} not under GPU 0:\n{top}");
    }
    top_through_the_pod_proxy(&node, addr, &uuids[0]).await;

    // 0 % on GPU 0: last_active stops advancing while samples go on.
    let last = |text: &str, pod: &str| {
        series(
            text,
            "slicelet_container_gpu_last_active_timestamp_seconds",
            &[("pod", pod), ("UUID", &uuids[0])],
        )
        .unwrap_or_else(|| panic!("no last_active for {pod}:\n{text}"))
    };
    write_node(&sim, 0, 10);
    let mut idle_since = None;
    for _ in 0..3 {
        let n = d.status.borrow().samples;
        d.wait_status(|s| s.samples > n).await;
        let (_, text) = get(addr, "/metrics").await;
        if sm(&text, "llm-a") == Some(0.0) {
            let t = last(&text, "llm-a");
            if let Some(before) = idle_since {
                assert_eq!(t, before, "last_active moved at 0 %");
            }
            idle_since = Some(t);
        }
    }
    let before = idle_since.expect("the 0 % sample was never seen");
    // Two more samples: still the same for llm-a, while llm-b (10 %) keeps advancing.
    let (_, text) = get(addr, "/metrics").await;
    let b0 = last(&text, "llm-b");
    let n = d.status.borrow().samples;
    d.wait_status(|s| s.samples >= n + 2).await;
    let (_, text) = get(addr, "/metrics").await;
    assert_eq!(last(&text, "llm-a"), before);
    assert!(last(&text, "llm-b") > b0, "{text}");
    d.stop().await;
}

/// `slicelet top --node` and `--all-nodes`, the real binary, reaching the daemon at `addr`
/// only through the API emulator's `pods/proxy` subresource (a pod on `gpu-a` whose IP and
/// `status` port are the daemon's), with a second node whose daemon does not answer.
async fn top_through_the_pod_proxy(node: &Node, addr: std::net::SocketAddr, gpu0: &str) {
    use kubelet_emulator::kube_api::KubeApi;
    let api = KubeApi::start("gpu-a", &[]).await;
    let labels = [
        ("app.kubernetes.io/name", "slicelet"),
        ("app.kubernetes.io/component", "device-plugin"),
    ];
    api.add_pod(
        "slicelet-system",
        "slicelet-x1",
        "gpu-a",
        &labels,
        addr.ip(),
        addr.port(),
    );
    // A closed port: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    api.add_pod(
        "slicelet-system",
        "slicelet-y2",
        "gpu-b",
        &labels,
        closed.ip(),
        closed.port(),
    );
    // Not slicelet's: another namespace, and another label.
    api.add_pod(
        "default",
        "slicelet-z3",
        "gpu-a",
        &labels,
        addr.ip(),
        addr.port(),
    );
    api.add_pod(
        "slicelet-system",
        "other",
        "gpu-a",
        &[("app", "x")],
        addr.ip(),
        addr.port(),
    );
    let kubeconfig = api.kubeconfig(node.tmp.path());
    let top = |args: &'static [&'static str]| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_slicelet"))
            .args([
                "top",
                "--once",
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
            ])
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
    };
    let out = top(&["--node", "gpu-a"]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with("node gpu-a  pod slicelet-system/slicelet-x1\n"),
        "{text}"
    );
    assert!(
        text.contains(gpu0) && text.contains("ml/llm-a/server"),
        "{text}"
    );
    assert_eq!(
        api.counters().proxied,
        1,
        "the view came through pods/proxy"
    );

    let out = top(&["--all-nodes"]).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.contains("gpu-a") && l.contains("ml/llm-a,ml/llm-b"))
        .unwrap_or_else(|| panic!("no gpu-a row with both holders:\n{text}"));
    assert!(
        row.split_whitespace().nth(1) == Some("0"),
        "GPU 0's row: {row}"
    );
    let down = text
        .lines()
        .find(|l| l.contains("gpu-b"))
        .unwrap_or_else(|| panic!("no gpu-b row:\n{text}"));
    // The API server answers 503 for a pod that does not answer; kube's client retries 503
    // itself, so the bounded fetch gives up at its deadline.
    assert!(
        down.contains("HTTP 503") || down.contains("no answer within"),
        "{down}"
    );
    assert!(
        text.contains("2 nodes, 8 GPUs, 2 of 32 devices held"),
        "{text}"
    );

    let out = top(&["--node", "gpu-c"]).await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no pod with app.kubernetes.io/name=slicelet runs on node gpu-c"),
        "{err}"
    );
}

/// GPU memory limits per container, read back: GPU 0 of an A100 node on an R615 driver shared
/// as two 16 GiB replicas (`nvidia.com/gpu-16gb`, soft 8 GiB). The driver (the node file's
/// `memoryLimits`) holds pod A's limit for its container's cgroup and none for pod B's: the
/// metrics give both their limits, A enforced and B not, and `slicelet top` says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limits_are_read_back_per_container() {
    const RES: &str = "nvidia.com/gpu-16gb";
    let node = Node::new(
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-16gb\n        devices: [0]\n        replicas: 2\n        memory: {hard: 16Gi, soft: 8Gi}\n",
    );
    let id = "a".repeat(64);
    let cgroup_a = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        UID_A.replace('-', "_")
    );
    let gpu =
        "  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    computeCapability: \"8.0\"\n";
    let sim = node.tmp.path().join("a100-r615.yaml");
    std::fs::write(
        &sim,
        format!(
            "gpus:\n{gpu}    numaNode: 0\n    processes:\n      - {{pid: 4242, smUtil: 30, memoryMiB: 4096}}\n      - {{pid: 4343, smUtil: 10, memoryMiB: 2048}}\n    memoryLimits:\n      - {{cgroup: \"{cgroup_a}\", hardMiB: 16384, softMiB: 8192}}\n{gpu}    numaNode: 0\n    count: 3\n{gpu}    numaNode: 1\n    count: 4\ndriverVersion: \"615.20\"\n"
        ),
    )
    .unwrap();
    let uuids = uuids(&sim);
    let proc_root = node.tmp.path().join("host");
    write_proc(&proc_root);
    let ids = [format!("{}::0", uuids[0]), format!("{}::1", uuids[0])];
    let entry = |pod_uid, id| Entry {
        pod_uid,
        container: "server",
        resource: RES,
        device_ids: id,
    };
    node_files::write_checkpoint(
        &node.plugins().join("kubelet_internal_checkpoint"),
        &[entry(UID_A, &ids[..1]), entry(UID_B, &ids[1..])],
    )
    .unwrap();
    let pr = PodResources::start(&node.pod_resources()).await.unwrap();
    pr.hold("ml", "llm-a", "server", RES, &[&ids[0]]);
    pr.hold("ml", "llm-b", "server", RES, &[&ids[1]]);
    let emu = emulator(&node).await;
    let spec_out = node.tmp.path().join("cdi-out");
    std::fs::create_dir_all(&spec_out).unwrap();
    let mut settings = node.settings(&sim);
    settings.proc_root = proc_root;
    settings.cdi_spec_dirs = vec![fixture("cdi/a100-40gb-x8")];
    settings.memory_spec_dir = Some(spec_out);
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    settings.sample_interval = Some(std::time::Duration::from_millis(200));
    let mut d = Daemon::start(settings);
    wait_lists(&emu, &[(RES, 2)]).await;
    let s = d.wait_status(|s| s.in_use == 2 && s.samples >= 1).await;
    let n = s.samples;
    d.wait_status(|s| s.samples > n).await;
    let addr = s.address.unwrap();
    let (_, text) = get(addr, "/metrics").await;
    let labels = |pod: &'static str| {
        [
            ("pod", pod),
            ("namespace", "ml"),
            ("container", "server"),
            ("resource", RES),
        ]
    };
    let limit = |pod, kind| {
        let mut l = labels(pod).to_vec();
        l.push(("kind", kind));
        series(&text, "slicelet_container_gpu_memory_limit_bytes", &l)
    };
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    for pod in ["llm-a", "llm-b"] {
        assert_eq!(limit(pod, "hard"), Some(16.0 * GIB), "{pod}:\n{text}");
        assert_eq!(limit(pod, "soft"), Some(8.0 * GIB), "{pod}:\n{text}");
    }
    let enforced = |pod| {
        series(
            &text,
            "slicelet_container_gpu_memory_limit_enforced",
            &labels(pod),
        )
    };
    assert_eq!(enforced("llm-a"), Some(1.0), "{text}");
    assert_eq!(enforced("llm-b"), Some(0.0), "{text}");
    assert_eq!(
        series(
            &text,
            "slicelet_gpu_memory_limits_supported",
            &[("UUID", &uuids[0])]
        ),
        Some(1.0),
        "{text}"
    );

    let top = top_once(addr).await;
    assert!(top.contains("LIMIT MiB"), "{top}");
    let row = |pod: &str| {
        top.lines()
            .find(|l| l.contains(pod))
            .unwrap_or_else(|| panic!("{pod} not in\n{top}"))
            .to_string()
    };
    assert!(row("ml/llm-a/server").ends_with("16384 enforced"), "{top}");
    assert!(
        row("ml/llm-b/server").ends_with("16384 NOT enforced"),
        "{top}"
    );
    d.stop().await;
}

/// GPU use of a DRA pod, through the whole daemon with `--dra`: GPU 0 is two time-sliced
/// replicas served through DRA; a claim on replica 0, reserved for pod `ml/llm-a` (UID A),
/// is prepared through the DRA kubelet emulator, and pod-resources lists it for container
/// `server`. The process in pod A's cgroup on GPU 0 (30 % SM) is that container's: `/metrics`
/// has its `slicelet_container_gpu_*` series and `slicelet top --once` shows it under GPU 0,
/// with no kubelet device checkpoint at all (it never lists claims). Pod B's process, whose
/// pod no claim names, stays unattributed. (Both counted as unattributed before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_pods_process_is_attributed_through_its_claim() {
    use crate::dra::{daemon_dra, DRIVER, NODE};
    use kubelet_emulator::dra::{DraKubelet, Version};
    use kubelet_emulator::kube_api::{AllocatedDevice, KubeApi};
    const RES: &str = "nvidia.com/gpu-dra";
    const CLAIM_UID: &str = "c1a1c1a1-0000-4000-8000-000000000001";
    let node = Node::new(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0]\n        replicas: 2\n        dra: true\n",
    );
    let sim = node.tmp.path().join("node.yaml");
    write_node(&sim, 30, 10);
    let uuids = uuids(&sim);
    let r0 = slicelet::plan::dra_names::device_name(&format!("{}::0", uuids[0]));
    let proc_root = node.tmp.path().join("host");
    write_proc(&proc_root);
    let pr = PodResources::start(&node.pod_resources()).await.unwrap();
    let claimed = ClaimedDevice {
        driver: DRIVER,
        pool: NODE,
        device: &r0,
    };
    pr.hold_claim("ml", "llm-a", "server", "llm-a-gpu", &[claimed]);
    let api = KubeApi::start(NODE, &[]).await;
    let _emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.proc_root = proc_root;
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    settings.sample_interval = Some(std::time::Duration::from_millis(200));
    settings.dra = Some(daemon_dra(&node, &api));
    let registry = node.tmp.path().join("plugins_registry");
    let mut d = Daemon::start(settings);
    let s = d.wait_status(|s| s.ready().is_ok() && s.dra_serving).await;
    let addr = s.address.unwrap();
    api.wait_slices(|s| {
        s.iter()
            .filter_map(|x| x["spec"]["devices"].as_array())
            .map(Vec::len)
            .sum::<usize>()
            == 2
    })
    .await;
    api.set_claim(
        "ml",
        "llm-a-gpu",
        CLAIM_UID,
        &[AllocatedDevice {
            request: "gpu".into(),
            driver: DRIVER.into(),
            pool: NODE.into(),
            device: r0.clone(),
            ..AllocatedDevice::default()
        }],
    );
    api.reserve_claim("ml", "llm-a-gpu", &[("llm-a", UID_A)]);
    let k = DraKubelet::register(&registry).await.unwrap();
    let answer = k
        .prepare(Version::V1, &[("ml", "llm-a-gpu", CLAIM_UID)])
        .await
        .unwrap();
    assert_eq!(answer[CLAIM_UID].error, "");

    let labels = [
        ("pod", "llm-a"),
        ("namespace", "ml"),
        ("container", "server"),
        ("UUID", uuids[0].as_str()),
        ("resource", RES),
    ];
    // A sample taken after the claim was prepared (one in flight may predate it).
    let mut text = String::new();
    for _ in 0..10 {
        let n = d.status.borrow().samples;
        d.wait_status(|s| s.samples > n).await;
        text = get(addr, "/metrics").await.1;
        if series(&text, "slicelet_container_gpu_sm_util_percent", &labels) == Some(30.0) {
            break;
        }
    }
    assert_eq!(
        series(&text, "slicelet_container_gpu_sm_util_percent", &labels),
        Some(30.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "slicelet_container_gpu_memory_used_bytes", &labels),
        Some(20480.0 * 1024.0 * 1024.0),
        "{text}"
    );
    assert!(
        series(
            &text,
            "slicelet_container_gpu_last_active_timestamp_seconds",
            &labels
        )
        .is_some(),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "slicelet_unattributed_processes",
            &[("UUID", &uuids[0])]
        ),
        Some(1.0),
        "pod B's process: {text}"
    );
    assert_eq!(
        series(
            &text,
            "slicelet_allocation_info",
            &[("pod", "llm-a"), ("device", &format!("{}::0", uuids[0]))]
        ),
        Some(1.0),
        "{text}"
    );

    let top = top_once(addr).await;
    let gpu0 = top
        .find(&uuids[0])
        .unwrap_or_else(|| panic!("no GPU 0 in\n{top}"));
    let gpu1 = top
        .find(&uuids[1])
        .unwrap_or_else(|| panic!("no GPU 1 in\n{top}"));
    let row = top
        .lines()
        .find(|l| l.contains("ml/llm-a/server"))
        .unwrap_or_else(|| panic!("ml/llm-a/server not in\n{top}"));
    let at = top.find(row).unwrap();
    assert!(at > gpu0 && at < gpu1, "not under GPU 0:\n{top}");
    assert!(
        row.split_whitespace().any(|w| w == "30" || w == "30%"),
        "its 30 % SM: {row}\n{top}"
    );
    d.stop().await;
}
