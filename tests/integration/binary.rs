//! The real `slicelet` binary: CLI exit codes and output, SIGTERM, and the NVML code path
//! through the fake NVML library (fixtures/fake-nvml).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use kubelet_emulator::{healthy, KubeletEmulator};
use slicelet::api::Device;
use tokio::process::{Child, Command};

use crate::common::*;

pub(crate) fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_slicelet")
}

/// The fake libnvidia-ml built as a dev-dependency: it sits in this test binary's `deps/`.
pub(crate) fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = deps.join("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} missing: fake-nvml is a dev-dependency",
        lib.display()
    );
    lib
}

/// The binary, with its status endpoint on an ephemeral port (tests run in parallel).
fn slicelet() -> Command {
    let mut c = Command::new(bin());
    c.env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0");
    c
}

pub(crate) async fn output(args: &[&str]) -> Output {
    slicelet().args(args).output().await.unwrap()
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn validate_accepts_and_rejects_with_field_paths() {
    let node = Node::new(&ts_policy(4));
    let sim = node_file("a100-40gb-x8.yaml");
    let out = output(&[
        "validate",
        "--config",
        node.policy().to_str().unwrap(),
        "--simulate",
        sim.to_str().unwrap(),
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let first = stdout.lines().next().unwrap();
    assert!(
        first.starts_with("valid: ") && first.contains("nvidia.com/gpu-shared ×32"),
        "{stdout}"
    );
    assert!(
        stdout.contains("notice: sharing.timeSlicing.resources[0].rename"),
        "{stdout}"
    );

    // A node file the user named must exist and be valid (regression: it was "skipped").
    for bad in ["/nonexistent/node.yaml", node.policy().to_str().unwrap()] {
        let out = output(&[
            "validate",
            "--config",
            node.policy().to_str().unwrap(),
            "--simulate",
            bad,
        ])
        .await;
        assert_eq!(out.status.code(), Some(1), "{bad}: {}", text(&out.stdout));
        assert!(
            text(&out.stderr).contains("simulated node"),
            "{}",
            text(&out.stderr)
        );
    }

    let cases: &[(&str, &str)] = &[
        ("replicas: 0", "sharing.timeSlicing.resources[0].replicas"),
        ("replicas: -1", "sharing.timeSlicing.resources[0].replicas"),
        (
            "replicas: \"4\"",
            "sharing.timeSlicing.resources[0].replicas",
        ),
        ("replicas: 4.5", "sharing.timeSlicing.resources[0].replicas"),
    ];
    for (replace, path) in cases {
        node.write_policy(&ts_policy(4).replace("replicas: 4", replace));
        let out = output(&["validate", "--config", node.policy().to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(1), "{replace}");
        let err = text(&out.stderr);
        assert!(
            err.contains(path) && err.contains("line 7"),
            "{replace}: {err}"
        );
    }
}

/// One name, one path per node (the migration bridge): `slicelet validate` refuses a policy
/// that serves nvidia.com/gpu-shared through DRA on GPUs 0-3 and through the device plugin on
/// GPUs 4-7, naming the name and both entries, with exit 1.
#[tokio::test]
async fn validate_refuses_one_name_through_dra_and_the_device_plugin() {
    let node = Node::new("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [4, 5, 6, 7]\n        replicas: 4\n");
    let sim = node_file("a100-40gb-x8.yaml");
    let out = output(&[
        "validate",
        "--config",
        node.policy().to_str().unwrap(),
        "--simulate",
        sim.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    for part in [
        "nvidia.com/gpu-shared",
        "sharing.timeSlicing.resources[0]",
        "sharing.timeSlicing.resources[1]",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
}

#[tokio::test]
async fn plan_json_has_the_documented_shape() {
    let sim = node_file("l4-x1.yaml");
    let policy = repo().join("config/policy.yaml");
    let out = output(&[
        "plan",
        "--config",
        policy.to_str().unwrap(),
        "--simulate",
        sim.to_str().unwrap(),
        "--output",
        "json",
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let uuid = &uuids(&sim)[0];
    let want = serde_json::json!({"resources": [{
        "name": "nvidia.com/gpu-shared",
        "strategy": "time-slicing",
        "replicas": 4,
        "devices": (0..4).map(|n| serde_json::json!({"id": format!("{uuid}::{n}"), "gpu": uuid, "health": "Healthy"})).collect::<Vec<_>>(),
    }], "warnings": []});
    assert_eq!(v, want);
}

/// Per-replica memory limits: GPU 0 shared by size (2 × 20 GiB and 1 × 38 GiB), the JSON
/// per device, `validate --strict` refusing the extension, and 3 × 30 GiB refused naming GPU 0
/// and its memory.
#[tokio::test]
async fn memory_limits_plan_validate_and_refuse() {
    let sim = node_file("h100-80gb-x8-r615.yaml");
    let policy = repo().join("config/policy-memory.yaml");
    let args = |cmd: &'static str, policy: &Path| {
        vec![
            cmd.to_string(),
            "--config".into(),
            policy.display().to_string(),
            "--simulate".into(),
            sim.display().to_string(),
        ]
    };
    let mut plan = args("plan", &policy);
    plan.extend(["--output".into(), "json".into()]);
    let plan: Vec<&str> = plan.iter().map(String::as_str).collect();
    let out = output(&plan).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hard: Vec<(String, u64)> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["devices"].as_array().unwrap().iter())
        .filter_map(|d| Some((d["id"].as_str()?.to_string(), d["memoryHardMiB"].as_u64()?)))
        .collect();
    let gpu0 = &uuids(&sim)[0];
    assert_eq!(
        hard,
        [
            (format!("{gpu0}::0"), 20480),
            (format!("{gpu0}::1"), 20480),
            (format!("{gpu0}::2"), 38912),
        ]
    );
    let mut strict = args("validate", &policy);
    strict.push("--strict".into());
    let strict: Vec<&str> = strict.iter().map(String::as_str).collect();
    let out = output(&strict).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("resources[0].memory"),
        "{}",
        text(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let over = dir.path().join("over.yaml");
    std::fs::write(
        &over,
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-30gb\n        devices: [0]\n        replicas: 3\n        memory: {hard: 30Gi}\n",
    )
    .unwrap();
    let validate = args("validate", &over);
    let validate: Vec<&str> = validate.iter().map(String::as_str).collect();
    let out = output(&validate).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("GPU 0 ({gpu0})")), "{err}");
    assert!(err.contains("81,559 MiB"), "{err}");
}

/// On a node discovered through NVML, the driver version and the cgroup hierarchy (read under
/// `--sysfs-root`) decide whether `enforce: required` limits can be planned.
#[tokio::test]
async fn memory_limits_follow_the_nvml_driver_and_the_cgroup_hierarchy() {
    let dir = tempfile::tempdir().unwrap();
    let mut inv = two_gpus();
    inv["driverVersion"] = serde_json::json!("615.20");
    let inventory = write_inventory(dir.path(), inv);
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-small\n        replicas: 2\n        memory: {hard: 4Gi}\n",
    )
    .unwrap();
    let sysfs = dir.path().join("sys");
    std::fs::create_dir_all(sysfs.join("fs/cgroup")).unwrap();
    let plan = || {
        Command::new(bin())
            .args(["plan", "--output", "json", "--config"])
            .arg(&policy)
            .arg("--nvml-library")
            .arg(fake_nvml())
            .arg("--sysfs-root")
            .arg(&sysfs)
            .env("FAKE_NVML_INVENTORY", &inventory)
            .output()
    };
    // No cgroup.controllers: cgroup v1.
    let out = plan().await.unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cgroup v1"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(sysfs.join("fs/cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    let out = plan().await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let enforced: Vec<bool> = v["resources"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["memoryEnforced"].as_bool().unwrap())
        .collect();
    assert_eq!(enforced, [true; 4], "{v}");
}

#[tokio::test]
async fn plan_json_carries_the_warnings_the_table_prints() {
    // GPU 3 is not on a 1-GPU node: a warning, not an error (one ConfigMap serves a fleet).
    let node = Node::new(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        devices: [0, 3]\n        replicas: 2\n",
    );
    let sim = node_file("l4-x1.yaml");
    let plan = |output: &'static str| {
        let policy = node.policy();
        let sim = sim.clone();
        async move {
            // --output from the environment, as a DaemonSet or CI job would set it.
            let out = slicelet()
                .args(["plan", "--config", policy.to_str().unwrap()])
                .args(["--simulate", sim.to_str().unwrap()])
                .env("SLICELET_OUTPUT", output)
                .output()
                .await
                .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            text(&out.stdout)
        }
    };
    let table: Vec<String> = plan("table")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("# warning: ").map(str::to_string))
        .collect();
    assert_eq!(table.len(), 1, "{table:?}");
    assert!(
        table[0].contains("sharing.timeSlicing.resources[0]"),
        "{table:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&plan("json").await).unwrap();
    assert_eq!(v["warnings"], serde_json::json!(table));
    assert_eq!(v["resources"][0]["replicas"], 2);
}

/// `plan` (its JSON `warnings` and its table's `# warning:` lines) warns of what `validate`
/// warns of, in the same order: an entry read as NVIDIA's plugin reads it (devices without a
/// rename), a key slicelet does not act on, a device listed twice. (Regression: both held
/// only what does not apply to the node, as `plan_json_carries_the_warnings_the_table_prints`.)
#[tokio::test]
async fn plan_warns_of_what_validate_warns_of() {
    let node = Node::new(
        "version: v1\nflags:\n  gdsEnabled: true\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        devices: [0, 0]\n        replicas: 2\n",
    );
    let sim = node_file("a100-40gb-x8.yaml");
    let args = |command: &'static str| {
        let policy = node.policy();
        let sim = sim.clone();
        async move {
            let out = slicelet()
                .args([command, "--config", policy.to_str().unwrap()])
                .args(["--simulate", sim.to_str().unwrap()])
                .args(if command == "plan" {
                    &["--output", "json"][..]
                } else {
                    &[]
                })
                .output()
                .await
                .unwrap();
            assert!(out.status.success(), "{command}: {}", text(&out.stderr));
            text(&out.stdout)
        }
    };
    let validate: Vec<String> = args("validate")
        .await
        .lines()
        .filter_map(|l| l.strip_prefix("warning: ").map(str::to_string))
        .collect();
    for what in ["rename", "flags.gdsEnabled", "listed twice"] {
        assert!(
            validate.iter().any(|w| w.contains(what)),
            "validate warns of no {what}: {validate:?}"
        );
    }
    let v: serde_json::Value = serde_json::from_str(&args("plan").await).unwrap();
    assert_eq!(v["warnings"], serde_json::json!(validate));
    let out = output(&[
        "plan",
        "--config",
        node.policy().to_str().unwrap(),
        "--simulate",
        sim.to_str().unwrap(),
    ])
    .await;
    let table: Vec<String> = text(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("# warning: ").map(str::to_string))
        .collect();
    assert_eq!(table, validate);
}

pub(crate) fn spawn_run(node: &Node, extra: &[&str], env: &[(&str, &Path)]) -> Child {
    let mut cmd = slicelet();
    cmd.args([
        "run",
        "--config",
        node.policy().to_str().unwrap(),
        "--device-plugin-path",
        node.plugins().to_str().unwrap(),
    ])
    .args(extra)
    .env("SLICELET_LOG", "info")
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Reads the child's log until a line contains `needle`; returns what it read.
pub(crate) async fn wait_for_log(child: &mut Child, needle: &str) -> String {
    wait_for_log_count(child, needle, 1).await
}

/// The status endpoint's address from the daemon's "serving /healthz" log line.
pub(crate) fn status_address(log: &str) -> std::net::SocketAddr {
    log.lines()
        .find(|l| l.contains("serving /healthz"))
        .and_then(|l| l.split("address=").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '.' && c != ':'))
        .unwrap()
        .parse()
        .unwrap()
}

pub(crate) async fn sigterm_and_wait(mut child: Child) -> (Option<i32>, String) {
    let pid = child.id().unwrap().to_string();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("slicelet must exit within 5 s of SIGTERM")
        .unwrap();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use tokio::io::AsyncReadExt;
        e.read_to_string(&mut err).await.unwrap();
    }
    (status.code(), err)
}

fn write_inventory(dir: &Path, json: serde_json::Value) -> PathBuf {
    let p = dir.join("nvml.json");
    std::fs::write(&p, serde_json::to_vec(&json).unwrap()).unwrap();
    p
}

fn two_gpus() -> serde_json::Value {
    serde_json::json!({"gpus": [
        {"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
         "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0"},
        {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
         "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:2A:00.0"}
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_nvml_registers_and_sigterm_cleans_up() {
    let node = Node::new(&ts_policy(2));
    let inv = write_inventory(node.tmp.path(), two_gpus());
    let sysfs = node.tmp.path().join("sys");
    let dev = sysfs.join("bus/pci/devices/0000:2a:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("numa_node"), "1\n").unwrap();
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let child = spawn_run(
        &node,
        &[
            "--nvml-library",
            lib.to_str().unwrap(),
            "--sysfs-root",
            sysfs.to_str().unwrap(),
        ],
        &[("FAKE_NVML_INVENTORY", &inv)],
    );
    let state = wait_lists(&emu, &[("nvidia.com/gpu-shared", 4)]).await;
    let devs = state.resources["nvidia.com/gpu-shared"]
        .devices
        .clone()
        .unwrap();
    let ids: Vec<&str> = devs.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "GPU-aaaaaaaa-0000-0000-0000-000000000000::0",
            "GPU-aaaaaaaa-0000-0000-0000-000000000000::1",
            "GPU-bbbbbbbb-0000-0000-0000-000000000000::0",
            "GPU-bbbbbbbb-0000-0000-0000-000000000000::1",
        ]
    );
    // NUMA from sysfs for GPU 1 only.
    assert!(devs[0].topology.is_none());
    assert_eq!(devs[2].topology.as_ref().unwrap().nodes[0].id, 1);

    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    emu.wait_for(WAIT, |s| !s.resources["nvidia.com/gpu-shared"].streaming)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !node
            .plugins()
            .join("slicelet-nvidia.com_gpu-shared.sock")
            .exists(),
        "{log}"
    );
}

#[tokio::test]
async fn nvml_init_failure_exits_1_unless_fail_on_init_error_is_false() {
    let node = Node::new(&ts_policy(2));
    let inv = write_inventory(
        node.tmp.path(),
        serde_json::json!({"initError": 9, "gpus": []}),
    );
    let lib = fake_nvml();
    let out = slicelet()
        .args([
            "run",
            "--config",
            node.policy().to_str().unwrap(),
            "--device-plugin-path",
            node.plugins().to_str().unwrap(),
            "--nvml-library",
            lib.to_str().unwrap(),
        ])
        .env("FAKE_NVML_INVENTORY", &inv)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("initialising NVML")
            && err.contains("NVIDIA driver is not loaded")
            && err.contains("failOnInitError"),
        "{err}"
    );

    // failOnInitError: false keeps the daemon up (advertising nothing) until SIGTERM.
    node.write_policy(&format!(
        "flags:\n  failOnInitError: false\n{}",
        ts_policy(2).trim_start_matches("version: v1\n")
    ));
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let mut child = spawn_run(
        &node,
        &["--nvml-library", lib.to_str().unwrap()],
        &[("FAKE_NVML_INVENTORY", &inv)],
    );
    let early = wait_for_log(&mut child, "failOnInitError is false").await;
    assert!(early.contains("NVIDIA driver is not loaded"), "{early}");
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{early}{log}");
    assert!(emu.state().resources.is_empty());
}

#[tokio::test]
async fn missing_nvml_library_is_a_clear_error() {
    let node = Node::new(&ts_policy(2));
    let out = output(&[
        "run",
        "--config",
        node.policy().to_str().unwrap(),
        "--device-plugin-path",
        node.plugins().to_str().unwrap(),
        "--nvml-library",
        "/nonexistent/libnvidia-ml.so.1",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("/nonexistent/libnvidia-ml.so.1"), "{err}");
}

// ---- MIG through NVML (the fake library) ----

const MIG_GPU: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";

fn mig_uuid(slot: u32) -> String {
    format!("MIG-aaaaaaaa-0000-0000-0000-00000000000{slot}")
}

/// GPU 0: MIG enabled, capacity 7, slots 0 (3g.40gb, GI 2), 2 (1g.10gb, GI 9, a name without
/// the profile: derived from its attributes) and 4 (1g.10gb, GI 10); slots 1 and 3 are `null`
/// and 5-6 lie past the list, all empty (NotFound). GPU 1: MIG disabled. GPU 2: no MIG
/// support (NotSupported).
fn mig_gpus() -> serde_json::Value {
    serde_json::json!({"gpus": [
        {"uuid": MIG_GPU, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
         "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0",
         "migMode": 1, "migDevices": [
            {"uuid": mig_uuid(0), "profile": "3g.40gb", "memoryMiB": 40320, "giId": 2, "ciId": 0},
            null,
            {"uuid": mig_uuid(2), "profile": "1g.10gb", "memoryMiB": 9856, "giId": 9, "ciId": 0,
             "name": "NVIDIA H100 80GB HBM3"},
            null,
            {"uuid": mig_uuid(4), "profile": "1g.10gb", "memoryMiB": 9856, "giId": 10, "ciId": 0}
         ]},
        {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
         "memoryMiB": 81559, "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:2A:00.0",
         "migMode": 0},
        {"uuid": "GPU-cccccccc-0000-0000-0000-000000000000", "name": "NVIDIA L4",
         "memoryMiB": 23034, "minor": 2, "computeCapability": [8, 9], "pciBusId": "00000000:3D:00.0"}
    ]})
}

async fn plan_with_nvml(node: &Node, inventory: &Path, output: &str) -> Output {
    let lib = fake_nvml();
    Command::new(bin())
        .args([
            "plan",
            "--config",
            node.policy().to_str().unwrap(),
            "--nvml-library",
            lib.to_str().unwrap(),
            "--output",
            output,
        ])
        .env("FAKE_NVML_INVENTORY", inventory)
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn nvml_mig_enumeration_skips_empty_slots_and_keeps_nvml_indices() {
    // "0:4" is NVML's MIG index 4 on GPU 0: the sparse slot numbering is kept.
    let node = Node::new(
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        rename: nvidia.com/mig-1g.10gb-shared\n        devices: [\"0:4\"]\n        replicas: 2\n",
    );
    let inv = write_inventory(node.tmp.path(), mig_gpus());
    let out = plan_with_nvml(&node, &inv, "json").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mig = |id: String, slot: u32, profile: &str| serde_json::json!({"id": id, "gpu": mig_uuid(slot), "health": "Healthy", "parent": MIG_GPU, "profile": profile});
    let whole = |uuid: &str| serde_json::json!({"id": uuid, "gpu": uuid, "health": "Healthy"});
    let want = serde_json::json!({"resources": [
        {"name": "nvidia.com/gpu", "strategy": "none", "replicas": 1, "devices": [
            whole("GPU-bbbbbbbb-0000-0000-0000-000000000000"),
            whole("GPU-cccccccc-0000-0000-0000-000000000000"),
        ]},
        {"name": "nvidia.com/mig-1g.10gb", "strategy": "none", "replicas": 1, "devices": [
            mig(mig_uuid(2), 2, "1g.10gb"),
        ]},
        {"name": "nvidia.com/mig-1g.10gb-shared", "strategy": "time-slicing", "replicas": 2, "devices": [
            mig(format!("{}::0", mig_uuid(4)), 4, "1g.10gb"),
            mig(format!("{}::1", mig_uuid(4)), 4, "1g.10gb"),
        ]},
        {"name": "nvidia.com/mig-3g.40gb", "strategy": "none", "replicas": 1, "devices": [
            mig(mig_uuid(0), 0, "3g.40gb"),
        ]},
    ]});
    assert_eq!(
        v["resources"],
        want["resources"],
        "{}",
        serde_json::to_string_pretty(&v).unwrap()
    );
    // Three GPUs: three pairs in the link matrix (the fake reports every pair as system).
    assert_eq!(v["links"].as_array().unwrap().len(), 3);

    // The table shows parent and profile too.
    let out = plan_with_nvml(&node, &inv, "table").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains(&format!("MIG 3g.40gb of {MIG_GPU}")),
        "{table}"
    );
}

#[tokio::test]
async fn nvml_mig_strategy_rules() {
    let node = Node::new("");
    let mut only_mig = mig_gpus();
    only_mig["gpus"].as_array_mut().unwrap().truncate(1);
    let mut empty = mig_gpus();
    empty["gpus"][0]["migDevices"] = serde_json::json!([null, null]);
    // (what, inventory, strategy, exit code, must appear in stdout or stderr)
    let cases: Vec<(&str, serde_json::Value, &str, i32, String)> = vec![
        (
            "single, modes differ",
            mig_gpus(),
            "single",
            1,
            "MIG is enabled on GPU 0 and disabled on GPUs 1,2".to_string(),
        ),
        (
            "single, two profiles",
            only_mig.clone(),
            "single",
            1,
            "1g.10gb on GPU 0; 3g.40gb on GPU 0".to_string(),
        ),
        (
            "single, empty MIG GPU",
            {
                let mut v = empty.clone();
                v["gpus"].as_array_mut().unwrap().truncate(1);
                v
            },
            "single",
            1,
            format!("GPU 0 ({MIG_GPU}) has MIG enabled and no MIG devices"),
        ),
        (
            "mixed, empty MIG GPU",
            empty.clone(),
            "mixed",
            0,
            format!("# warning: flags.migStrategy: GPU 0 ({MIG_GPU}) has MIG enabled and no MIG devices"),
        ),
        (
            "none, MIG GPU whole",
            mig_gpus(),
            "none",
            0,
            format!("# warning: flags.migStrategy: GPU 0 ({MIG_GPU}) has MIG enabled, but migStrategy is none"),
        ),
    ];
    for (what, inventory, strategy, code, needle) in cases {
        node.write_policy(&format!("flags:\n  migStrategy: {strategy}\n"));
        let inv = write_inventory(node.tmp.path(), inventory);
        let out = plan_with_nvml(&node, &inv, "table").await;
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(code), "{what}: {all}");
        assert!(all.contains(&needle), "{what}: {all}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_nvml_mig_allocates_mig_uuids_and_caps_device_specs() {
    let node = Node::new(
        "version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n    passDeviceSpecs: true\n",
    );
    let inv = write_inventory(node.tmp.path(), mig_gpus());
    // The driver's mig-minors under a temp proc root: GPU 0 GI 10 CI 0 are 93 and 94.
    let caps = node.tmp.path().join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&caps).unwrap();
    std::fs::write(
        caps.join("mig-minors"),
        slicelet::inventory::mig::standard_mig_minors(3),
    )
    .unwrap();
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let child = spawn_run(
        &node,
        &[
            "--nvml-library",
            lib.to_str().unwrap(),
            "--proc-root",
            node.tmp.path().to_str().unwrap(),
            "--dev-root",
            "/host",
        ],
        &[("FAKE_NVML_INVENTORY", &inv)],
    );
    let state = wait_lists(
        &emu,
        &[
            ("nvidia.com/gpu", 2),
            ("nvidia.com/mig-1g.10gb", 2),
            ("nvidia.com/mig-3g.40gb", 1),
        ],
    )
    .await;
    let ids: Vec<&str> = state.resources["nvidia.com/mig-1g.10gb"]
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(ids, [mig_uuid(2), mig_uuid(4)]);
    let mut client = emu.client("nvidia.com/mig-1g.10gb").await.unwrap();
    let resp = client
        .allocate(slicelet::api::AllocateRequest {
            container_requests: vec![slicelet::api::ContainerAllocateRequest {
                devices_ids: vec![mig_uuid(4)],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &resp.container_responses[0];
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], mig_uuid(4));
    assert_eq!(c.envs["CUDA_VISIBLE_DEVICES"], mig_uuid(4));
    let specs: Vec<(&str, &str)> = c
        .devices
        .iter()
        .map(|d| (d.container_path.as_str(), d.host_path.as_str()))
        .collect();
    assert_eq!(
        specs,
        [
            ("/dev/nvidia0", "/host/dev/nvidia0"),
            ("/dev/nvidiactl", "/host/dev/nvidiactl"),
            ("/dev/nvidia-uvm", "/host/dev/nvidia-uvm"),
            ("/dev/nvidia-uvm-tools", "/host/dev/nvidia-uvm-tools"),
            (
                "/dev/nvidia-caps/nvidia-cap93",
                "/host/dev/nvidia-caps/nvidia-cap93"
            ),
            (
                "/dev/nvidia-caps/nvidia-cap94",
                "/host/dev/nvidia-caps/nvidia-cap94"
            ),
        ]
    );
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
}

/// Appends an injected event line to the fake NVML's events file.
fn inject(events: &Path, line: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(events)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

fn unhealthy(state: &kubelet_emulator::State, resource: &str) -> Vec<String> {
    unhealthy_ids(
        state.resources[resource]
            .devices
            .as_deref()
            .unwrap_or_default(),
    )
}

/// The IDs of the Unhealthy devices in one list, in list order.
fn unhealthy_ids(devices: &[Device]) -> Vec<String> {
    devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_xid_events_mark_exactly_their_devices_and_recover() {
    // GPU 0: MIG (3g.40gb GI 2, 1g.10gb GI 9 and GI 10), GPU 1: whole, GPU 2: whole, but its Xid
    // event registration fails, so it is Unhealthy from the start and never recovers (fail
    // closed).
    let mut inv = mig_gpus();
    inv["gpus"][2]["eventRegisterError"] = serde_json::json!(999);
    let node =
        Node::new("version: v1\nflags:\n  migStrategy: mixed\nhealth:\n  recoverySeconds: 0.5\n");
    let inventory = write_inventory(node.tmp.path(), inv);
    let events = node.tmp.path().join("events");
    std::fs::write(&events, "").unwrap();
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let child = spawn_run(
        &node,
        &["--nvml-library", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_INVENTORY", &inventory),
            ("FAKE_NVML_EVENTS", &events),
        ],
    );
    let l4 = "GPU-cccccccc-0000-0000-0000-000000000000";
    emu.wait_for(WAIT, |s| {
        s.device_count("nvidia.com/mig-1g.10gb") == Some(2)
            && s.device_count("nvidia.com/mig-3g.40gb") == Some(1)
            && s.device_count("nvidia.com/gpu") == Some(2)
            && s.healthy_count("nvidia.com/gpu") == Some(1)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(unhealthy(&emu.state(), "nvidia.com/gpu"), [l4]);

    // An Xid on MIG device GI 9 / CI 0: only that slice, and back after the 0.5 s quiet
    // period. Every list is recorded, so the short Unhealthy phase cannot be missed.
    let small = "nvidia.com/mig-1g.10gb";
    let before = emu.lists(small).len();
    let before_big = emu.lists("nvidia.com/mig-3g.40gb").len();
    inject(&events, "0 79 9 0");
    let slice_down = |d: &[Device]| healthy(d) == 1 && unhealthy_ids(d) == [mig_uuid(2)];
    let slice_up = |d: &[Device]| d.len() == 2 && healthy(d) == 2;
    emu.wait_for_sequence_after(small, before, &[&slice_down, &slice_up], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The other slice's resource never went Unhealthy, and the L4 stays Unhealthy (its events
    // are not watched).
    for l in emu.lists("nvidia.com/mig-3g.40gb").iter().skip(before_big) {
        assert_eq!(healthy(&l.devices), 1, "mig-3g.40gb list {l:?}");
    }
    assert_eq!(unhealthy(&emu.state(), "nvidia.com/gpu"), [l4]);

    // An Xid for the whole of GPU 0 marks every slice of it; an application Xid (13) on GPU 1
    // changes nothing, a critical one marks GPU 1.
    inject(&events, "1 13");
    inject(&events, "0 48");
    emu.wait_for(WAIT, |s| {
        s.healthy_count("nvidia.com/mig-1g.10gb") == Some(0)
            && s.healthy_count("nvidia.com/mig-3g.40gb") == Some(0)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        emu.state().healthy_count("nvidia.com/gpu"),
        Some(1),
        "xid 13 is ignored"
    );
    // A failed event wait: the set is re-created and every GPU re-registered, nothing is
    // marked by the failure itself, and later Xids still arrive.
    inject(&events, "fail");
    inject(&events, "1 79");
    emu.wait_for(WAIT, |s| s.healthy_count("nvidia.com/gpu") == Some(0))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
}

/// Reads the child's log until `needle` appeared `n` times and the line of the `n`-th is
/// complete (its fields follow the message); returns what it read.
async fn wait_for_log_count(child: &mut Child, needle: &str, n: usize) -> String {
    use tokio::io::AsyncReadExt;
    let stderr = child.stderr.as_mut().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let complete = |seen: &str| {
        seen.match_indices(needle)
            .nth(n - 1)
            .is_some_and(|(at, _)| seen[at..].contains('\n'))
    };
    let read = async {
        while !complete(&seen) {
            let k = stderr.read(&mut buf).await.unwrap();
            assert!(k > 0, "exited before logging {needle:?} {n} times: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .unwrap_or_else(|_| panic!("{needle:?} not logged {n} times"));
    seen
}

/// Every daemon the journal saw start got `quit` and exited; none runs; directories removed.
fn assert_daemons_quit(root: &Path, gpus: &[String]) {
    let journal = fake_mps_control::read_journal(root);
    let pids: std::collections::BTreeSet<u32> = journal.iter().map(|l| l.pid).collect();
    assert!(!pids.is_empty());
    for pid in pids {
        let events: Vec<&str> = journal
            .iter()
            .filter(|l| l.pid == pid)
            .map(|l| l.event.as_str())
            .collect();
        assert!(
            events.contains(&"quit") && events.last() == Some(&"exit"),
            "daemon {pid}: {events:?}"
        );
    }
    for g in gpus {
        assert!(!slicelet::plan::mps_dirs(root, g).base.exists(), "{g}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_supervises_mps_daemons_and_quits_them_on_sigterm() {
    let node = Node::new("");
    let root = crate::mps::mps_root(&node);
    node.write_policy(&crate::mps::mps_policy(&root, 4));
    let sim = crate::mps::h100s(&node, 2);
    let gpus = uuids(&sim);
    let fake = fake_mps_control::binary();
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let child = spawn_run(
        &node,
        &[
            "--simulate",
            sim.to_str().unwrap(),
            "--mps-control-binary",
            fake.to_str().unwrap(),
        ],
        &[],
    );
    emu.wait_for(WAIT, |s| s.healthy_count("nvidia.com/gpu-mps") == Some(8))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    assert_daemons_quit(&root, &gpus);
}

/// An MPS control daemon that cannot start logs why (the spawn error's source, not only
/// "starting <binary>"), and a clean SIGTERM logs no error: a closed event channel at shutdown
/// is not a lost event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_daemon_that_cannot_start_says_why_and_sigterm_is_quiet() {
    let node = Node::new("");
    let root = crate::mps::mps_root(&node);
    node.write_policy(&crate::mps::mps_policy(&root, 4));
    let sim = crate::mps::h100s(&node, 2);
    let _emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let mut child = spawn_run(
        &node,
        &[
            "--simulate",
            sim.to_str().unwrap(),
            "--mps-control-binary",
            "/nonexistent/nvidia-cuda-mps-control",
        ],
        &[],
    );
    let seen = wait_for_log(&mut child, "restarting the MPS control daemon").await;
    let line = seen
        .lines()
        .find(|l| l.contains("restarting the MPS control daemon"))
        .unwrap();
    assert!(
        line.contains("/nonexistent/nvidia-cuda-mps-control") && line.contains("No such file"),
        "{line}"
    );
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
}

/// The split deployment: `slicelet mps` runs the daemons, `slicelet run --mps-external` only
/// checks them; stopping `run` leaves them running, stopping `mps` quits them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_subcommand_with_run_mps_external() {
    let node = Node::new("");
    let root = crate::mps::mps_root(&node);
    node.write_policy(&crate::mps::mps_policy(&root, 4));
    let sim = crate::mps::h100s(&node, 2);
    let gpus = uuids(&sim);
    let fake = fake_mps_control::binary();
    let mut mps = slicelet()
        .args([
            "mps",
            "--config",
            node.policy().to_str().unwrap(),
            "--simulate",
            sim.to_str().unwrap(),
            "--mps-control-binary",
            fake.to_str().unwrap(),
        ])
        .env("SLICELET_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for_log_count(&mut mps, "MPS control daemon ready", 2).await;
    for g in &gpus {
        let cmds = fake_mps_control::commands(&slicelet::plan::mps_dirs(&root, g).log);
        assert!(
            cmds.contains(&"set_default_active_thread_percentage 25".to_string()),
            "{g}: {cmds:?}"
        );
    }

    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let run = spawn_run(
        &node,
        &[
            "--simulate",
            sim.to_str().unwrap(),
            "--mps-control-binary",
            fake.to_str().unwrap(),
            "--mps-external",
            "--mps-check-seconds",
            "1",
        ],
        &[],
    );
    emu.wait_for(WAIT, |s| s.healthy_count("nvidia.com/gpu-mps") == Some(8))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (code, log) = sigterm_and_wait(run).await;
    assert_eq!(code, Some(0), "{log}");
    let journal = fake_mps_control::read_journal(&root);
    assert!(
        journal.iter().all(|l| l.event != "quit"),
        "run --mps-external must not stop the daemons: {journal:?}"
    );
    assert_eq!(journal.iter().filter(|l| l.event == "start").count(), 2);

    let (code, log) = sigterm_and_wait(mps).await;
    assert_eq!(code, Some(0), "{log}");
    assert_daemons_quit(&root, &gpus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lost_gpu_at_start_does_not_darken_the_node() {
    // Regression: a GPU that does not answer NVML at the first discovery failed the whole
    // discovery (exit 1 with failOnInitError, or nothing advertised).
    let mut inv = two_gpus();
    inv["gpus"][1]["lost"] = serde_json::json!(true);
    let node = Node::new(&ts_policy(2));
    let inventory = write_inventory(node.tmp.path(), inv);
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let child = spawn_run(
        &node,
        &["--nvml-library", lib.to_str().unwrap()],
        &[("FAKE_NVML_INVENTORY", &inventory)],
    );
    let state = wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    assert_eq!(state.healthy_count("nvidia.com/gpu-shared"), Some(2));
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("left out"), "{log}");
}

/// A policy the node cannot serve at start (two 50 GiB replicas on an 80 GB GPU) is rejected
/// without claiming a last good policy there is none of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_rejected_at_start_keeps_no_last_good_policy() {
    let policy = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-50gb\n        devices: [0]\n        replicas: 2\n        memory:\n          hard: 50Gi\n          enforce: best-effort\n";
    let node = Node::new(policy);
    let sim = crate::common::node_file("h100-80gb-x8.yaml");
    let child = spawn_run(&node, &["--simulate", sim.to_str().unwrap()], &[]);
    let mut child = child;
    let log = wait_for_log(&mut child, "policy rejected for this node").await;
    let line = log
        .lines()
        .find(|l| l.contains("policy rejected for this node"))
        .unwrap();
    assert!(!line.contains("keeping the last good policy"), "{line}");
    assert!(line.contains("nothing is advertised"), "{line}");
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
}

/// Five GPUs whose topology the fake NVML reports: 1-2 two NVLinks behind several PCIe
/// switches, 3 and 4 on NVSwitch ports (all-to-all) under one host bridge, 0-1 one PCIe switch,
/// 0-2's common-ancestor call failing and GPU 0's NVLink queries failing.
fn linked_gpus() -> serde_json::Value {
    let gpu = |i: u32, extra: serde_json::Value| {
        let mut g = serde_json::json!({
            "uuid": format!("GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-0000-0000-000000000000"),
            "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "minor": i,
            "computeCapability": [9, 0], "pciBusId": format!("00000000:{:02X}:00.0", 0x17 + i)});
        for (k, v) in extra.as_object().unwrap() {
            g[k] = v.clone();
        }
        g
    };
    serde_json::json!({
        "topology": [
            {"gpus": [0, 1], "level": 10},
            {"gpus": [2, 1], "level": 20},
            {"gpus": [3, 4], "level": 30},
            {"gpus": [0, 2], "error": 999}
        ],
        "gpus": [
            gpu(0, serde_json::json!({"nvLinkError": 999})),
            gpu(1, serde_json::json!({"nvLinks": ["00000000:19:00.0", null, "00000000:19:00.0"]})),
            gpu(2, serde_json::json!({"nvLinks": ["00000000:18:00.0", "00000000:18:00.0"]})),
            gpu(3, serde_json::json!({"nvLinks": ["00000000:C0:00.0", "00000000:C1:00.0"]})),
            gpu(4, serde_json::json!({"nvLinks": ["00000000:C0:00.0"]})),
        ]
    })
}

#[tokio::test]
async fn nvml_topology_reaches_plan_links() {
    let node = Node::new("version: v1\n");
    let inv = write_inventory(node.tmp.path(), linked_gpus());
    let out = plan_with_nvml(&node, &inv, "json").await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 10, "every pair of 5 GPUs");
    let pair = |a: u64, b: u64| {
        links
            .iter()
            .find(|l| l["gpus"] == serde_json::json!([a, b]))
            .unwrap_or_else(|| panic!("no pair {a}-{b} in {links:?}"))
    };
    let shape = |a, b| {
        let l = pair(a, b);
        (
            l["nvlinks"].as_u64().unwrap(),
            l["nvswitch"].as_bool().unwrap(),
            l["pcie"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(shape(0, 1), (0, false, "single".into()));
    assert_eq!(shape(1, 2), (2, false, "multiple".into()));
    assert_eq!(shape(3, 4), (0, true, "hostbridge".into()));
    // A failing call for one pair: that pair is unknown; the node is still planned.
    assert_eq!(shape(0, 2), (0, false, "unknown".into()));
    assert_eq!(shape(1, 3), (0, false, "system".into()));
    assert_eq!(pair(0, 2)["score"], 0);
    assert_eq!(v["resources"][0]["devices"].as_array().unwrap().len(), 5);
    let stderr = text(&out.stderr);
    assert_eq!(
        stderr
            .matches("nvmlDeviceGetTopologyCommonAncestor")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("nvmlDeviceGetNvLinkState"), "{stderr}");
    // The table draws the matrix.
    let out = plan_with_nvml(&node, &inv, "table").await;
    let table = text(&out.stdout);
    let row = table.lines().find(|l| l.starts_with("GPU1 ")).unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["GPU1", "PIX", "X", "NV2", "SYS", "SYS", "-"],
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_nvml_topology_answers_get_preferred_allocation_by_links() {
    let node = Node::new("version: v1\n");
    let inv = write_inventory(node.tmp.path(), linked_gpus());
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let mut child = spawn_run(
        &node,
        &["--nvml-library", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_INVENTORY", &inv),
            ("SLICELET_LOG", Path::new("slicelet=debug")),
        ],
    );
    let state = wait_lists(&emu, &[("nvidia.com/gpu", 5)]).await;
    let ids = ids_of(&state, "nvidia.com/gpu");
    let ask = async |available: Vec<String>, size: i32| {
        preferred(&emu, "nvidia.com/gpu", available, size).await
    };
    // NVSwitch (18 links) beats two NVLinks; the lowest index (0, 1) would share nothing.
    assert_eq!(ask(ids.clone(), 2).await, ids[3..5].to_vec());
    // GPU 3 taken: the NVLink pair.
    let rest: Vec<String> = [0, 1, 2, 4].iter().map(|&i| ids[i].clone()).collect();
    assert_eq!(ask(rest, 2).await, ids[1..3].to_vec());
    let log = wait_for_log(&mut child, "GetPreferredAllocation").await;
    assert!(log.contains("score="), "{log}");
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
}

/// A driver answering a UUID that is not in NVML's form (here one that would traverse a path):
/// that GPU is left out with an error naming the query (the other GPUs would still serve); the
/// string never reaches a path, a mount or the environment.
#[tokio::test]
async fn a_garbage_uuid_from_nvml_is_refused() {
    let node = Node::new(&ts_policy(2));
    let inv = write_inventory(
        node.tmp.path(),
        serde_json::json!({"gpus": [
            {"uuid": "GPU-/../../victim", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
             "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0"}
        ]}),
    );
    let out = plan_with_nvml(&node, &inv, "table").await;
    let err = text(&out.stderr);
    assert!(
        !text(&out.stdout).contains("victim"),
        "{}",
        text(&out.stdout)
    );
    assert!(err.contains("nvmlDeviceGetUUID"), "{err}");
    assert!(err.contains("is not a GPU or MIG UUID"), "{err}");
}

/// Regression (issue 15, D5): under `ulimit -n 128`, 200 idle TCP connections to the status
/// port made a kubelet restart fail to re-register ("Too many open files"). The status endpoint
/// now holds at most 64 connections, so the restart re-registers as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_status_connections_do_not_starve_a_kubelet_restart() {
    let node = Node::new(&ts_policy(2));
    let mut emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let sim = node_file("l4-x1.yaml");
    let mut child = Command::new("prlimit")
        .arg("--nofile=128:128")
        .arg("--")
        .arg(bin())
        .args([
            "run",
            "--config",
            node.policy().to_str().unwrap(),
            "--device-plugin-path",
            node.plugins().to_str().unwrap(),
            "--simulate",
            sim.to_str().unwrap(),
        ])
        .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0")
        .env("SLICELET_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let log = wait_for_log(&mut child, "serving /healthz").await;
    let address = status_address(&log);
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    let mut idle = Vec::new();
    for _ in 0..200 {
        // Connections beyond the limit wait in the listen backlog; connect may still succeed.
        if let Ok(Ok(c)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(address),
        )
        .await
        {
            idle.push(c);
        }
    }
    assert!(idle.len() >= 64, "only {} connections opened", idle.len());
    emu.restart().await.unwrap();
    emu.wait_for(WAIT, |s| {
        let r = &s.resources["nvidia.com/gpu-shared"];
        r.registrations >= 2 && r.streaming && s.device_count("nvidia.com/gpu-shared") == Some(2)
    })
    .await
    .unwrap();
    drop(idle);
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("Too many open files"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_writes_node_labels_from_nvml_and_sigterm_removes_them() {
    let node = Node::new(&ts_policy(2));
    let inv = write_inventory(node.tmp.path(), two_gpus());
    let features = node.tmp.path().join("features.d");
    std::fs::create_dir(&features).unwrap();
    let file = features.join("slicelet");
    let emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let lib = fake_nvml();
    let mut child = spawn_run(
        &node,
        &["--nvml-library", lib.to_str().unwrap()],
        &[
            ("FAKE_NVML_INVENTORY", &inv),
            ("SLICELET_NFD_FEATURES_FILE", &file),
        ],
    );
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 4)]).await;
    wait_for_log(&mut child, "NFD feature file written").await;
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        format!(
            "{}\n{}",
            slicelet::labels::HEADER,
            "nvidia.com/gpu-shared.count=2\nnvidia.com/gpu-shared.memory=81559\nnvidia.com/gpu-shared.product=NVIDIA-H100-80GB-HBM3\nnvidia.com/gpu-shared.replicas=2\nnvidia.com/gpu-shared.sharing-strategy=time-slicing\n"
        )
    );
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(!file.exists(), "{log}");

    // A dot-file would be ignored by NFD: refused at the command line.
    let out = slicelet()
        .args(["run", "--config", node.policy().to_str().unwrap()])
        .env("SLICELET_NFD_FEATURES_FILE", features.join(".slicelet"))
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("NFD ignores dot-files"),
        "{}",
        text(&out.stderr)
    );
}

/// The daemon settles after the last change (`residency::settle`, RESIDENCY_SETTLE later: the
/// heap's free pages returned, nothing else) and still answers Allocate and re-registers after
/// a kubelet restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_after_settling() {
    let node = Node::new(&ts_policy(2));
    let mut emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let sim = node_file("l4-x1.yaml");
    let log_filter = Path::new("info,slicelet::daemon=debug");
    let mut child = spawn_run(
        &node,
        &["--simulate", sim.to_str().unwrap()],
        &[("SLICELET_LOG", log_filter)],
    );
    let state = wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    // The settle is logged at debug level, with whether glibc returned pages.
    let log = wait_for_log(&mut child, "settled").await;
    assert!(log.contains("trimmed="), "{log}");
    let ids = ids_of(&state, "nvidia.com/gpu-shared");
    let answer = allocate(&emu, "nvidia.com/gpu-shared", &ids[..1]).await;
    assert!(answer.is_ok(), "Allocate after settling: {answer:?}");
    // Registration's code pages were let go too: a kubelet restart is answered as at start.
    emu.restart().await.unwrap();
    emu.wait_for(WAIT, |s| {
        let r = &s.resources["nvidia.com/gpu-shared"];
        r.registrations == 2 && r.streaming && s.device_count("nvidia.com/gpu-shared") == Some(2)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let (code, log) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0), "{log}");
}

/// NVIDIA's variables override the policy file's `flags` as in NVIDIA's plugin (its Helm chart
/// sets `MIG_STRATEGY` from the `migStrategy` value): the variable wins, `validate` says so,
/// and a value NVIDIA would refuse is refused naming the variable.
#[tokio::test]
async fn nvidia_flag_variables_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
    let sim = node_file("h100-80gb-x8-mig-mixed.yaml");
    let plan = |env: &[(&'static str, &'static str)], cmd: &'static str| {
        let mut c = slicelet();
        c.args([cmd, "--config", policy.to_str().unwrap()])
            .args(["--simulate", sim.to_str().unwrap()])
            .env("SLICELET_OUTPUT", "json");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output()
    };
    let names = |out: &Output| -> Vec<String> {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let file_only = names(&plan(&[], "plan").await.unwrap());
    assert_eq!(
        file_only,
        vec!["nvidia.com/gpu"],
        "migStrategy none: GPUs whole"
    );
    let overridden = names(&plan(&[("MIG_STRATEGY", "mixed")], "plan").await.unwrap());
    assert!(
        overridden.iter().any(|n| n.starts_with("nvidia.com/mig-")),
        "MIG_STRATEGY=mixed: {overridden:?}"
    );
    let out = plan(&[("MIG_STRATEGY", "mixed")], "validate")
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(
        report.contains(
            "notice: flags.migStrategy: the file says none; MIG_STRATEGY=mixed takes precedence"
        ),
        "{report}"
    );
    let out = plan(&[("MIG_STRATEGY", "bogus")], "validate")
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--mig-strategy") && err.contains("bogus"),
        "{err}"
    );
    // An empty variable is unset, as NVIDIA's chart leaves a null value.
    let out = plan(&[("MIG_STRATEGY", "")], "validate").await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("takes precedence"));
}
