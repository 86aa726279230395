//! MPS end to end with the fake control binary (fixtures/fake-mps-control): the daemon in
//! process against the kubelet emulator, supervising one control daemon per GPU.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_mps_control::{commands, read_journal, set_clients, JournalLine};
use kubelet_emulator::{KubeletEmulator, State};
use slicelet::api;
use slicelet::plan::mps_dirs;
use slicelet::settings::Settings;

use crate::common::*;

const MPS: &str = "nvidia.com/gpu-mps";

/// The MPS root of a test node (the fake's journal lives there).
pub fn mps_root(node: &Node) -> PathBuf {
    node.tmp.path().join("mps")
}

/// A node file of `n` H100 80GB GPUs in the node's own directory.
pub fn h100s(node: &Node, n: usize) -> PathBuf {
    let dir = node.tmp.path().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("node.yaml");
    std::fs::write(
        &path,
        format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: {n}\n"),
    )
    .unwrap();
    path
}

/// The MPS policy fixture (every GPU MPS ×`replicas` as nvidia.com/gpu-mps) with the
/// MPS root moved into the test's temp dir.
pub fn mps_policy(root: &Path, replicas: u32) -> String {
    read_fixture("policies/mps-equal.yaml")
        .replace("/run/nvidia/mps", root.to_str().unwrap())
        .replace("replicas: 4", &format!("replicas: {replicas}"))
}

/// Settings with the fake control binary and short intervals.
pub fn mps_settings(node: &Node, sim: &Path) -> Settings {
    let mut s = node.settings(sim);
    s.mps.control_binary = fake_mps_control::binary();
    s.mps.check_interval = Duration::from_millis(100);
    s.mps.restart_min = Duration::from_millis(50);
    s.mps.restart_max = Duration::from_millis(500);
    s
}

fn devices(s: &State, resource: &str) -> Vec<api::Device> {
    s.resources
        .get(resource)
        .and_then(|r| r.devices.clone())
        .unwrap_or_default()
}

/// (healthy, unhealthy) device counts of `gpu` in the latest list.
fn health_of(s: &State, resource: &str, gpu: &str) -> (usize, usize) {
    let devs: Vec<api::Device> = devices(s, resource)
        .into_iter()
        .filter(|d| d.id.starts_with(gpu))
        .collect();
    let healthy = devs.iter().filter(|d| d.health == api::HEALTHY).count();
    (healthy, devs.len() - healthy)
}

fn starts(journal: &[JournalLine], gpu: &str) -> Vec<u32> {
    journal
        .iter()
        .filter(|l| l.uuid == gpu && l.event == "start")
        .map(|l| l.pid)
        .collect()
}

fn alive(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn kill9(pid: u32) {
    let st = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

/// Waits until `pred` holds, failing at once if any state seen on the way breaks `invariant`.
async fn wait_keeping(
    emu: &KubeletEmulator,
    what: &str,
    mut invariant: impl FnMut(&State) -> Result<(), String>,
    mut pred: impl FnMut(&State) -> bool,
) -> State {
    let mut broken = None;
    let result = emu
        .wait_for(WAIT, |s| {
            if let Err(e) = invariant(s) {
                broken = Some(e);
                return true;
            }
            pred(s)
        })
        .await;
    if let Some(e) = broken {
        panic!("{what}: invariant broken: {e}");
    }
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The "Done when": two 80 GB H100s, every GPU MPS ×4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_h100s_every_gpu_mps_x4() {
    let node = Node::new("");
    let root = mps_root(&node);
    node.write_policy(&mps_policy(&root, 4));
    let sim = h100s(&node, 2);
    let gpus = uuids(&sim);
    let emu = emulator(&node).await;
    let d = Daemon::start(mps_settings(&node, &sim));

    // 8 devices, Healthy only once each GPU's daemon answered and received its defaults.
    let defaults_sent = |gpu: &str| {
        let cmds = commands(&mps_dirs(&root, gpu).log);
        cmds.iter()
            .any(|c| c == "set_default_active_thread_percentage 25")
            && cmds
                .iter()
                .any(|c| c == "set_default_device_pinned_mem_limit 0 20389M")
    };
    wait_keeping(
        &emu,
        "8 Healthy MPS devices",
        |s| {
            for dev in devices(s, MPS) {
                let gpu = dev.id.split("::").next().unwrap();
                if dev.health == api::HEALTHY && !defaults_sent(gpu) {
                    return Err(format!(
                        "{} Healthy before its daemon got its defaults",
                        dev.id
                    ));
                }
            }
            Ok(())
        },
        |s| s.device_count(MPS) == Some(8) && s.healthy_count(MPS) == Some(8),
    )
    .await;
    let journal = read_journal(&root);
    for g in &gpus {
        assert_eq!(starts(&journal, g).len(), 1, "{journal:?}");
        let cmds = commands(&mps_dirs(&root, g).log);
        let pct = cmds
            .iter()
            .position(|c| c == "set_default_active_thread_percentage 25")
            .unwrap();
        assert!(
            cmds[..pct].iter().any(|c| c == "get_server_list"),
            "answered before the defaults: {cmds:?}"
        );
    }
    let mode = std::fs::metadata(mps_dirs(&root, &gpus[0]).pipe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o755);
    assert!(mps_dirs(&root, &gpus[0]).shm.is_dir());

    // Allocate one replica: the pipe mount, the shm mount, the limits, no CUDA_VISIBLE_DEVICES.
    let resp = allocate(&emu, MPS, &[format!("{}::2", gpus[1])])
        .await
        .unwrap();
    let pipe = format!("/mps/{}/pipe", gpus[1]);
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], gpus[1]);
    assert_eq!(resp.envs["CUDA_MPS_PIPE_DIRECTORY"], pipe);
    assert_eq!(resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20389M");
    assert!(!resp.envs.contains_key("CUDA_VISIBLE_DEVICES"));
    let mounts: Vec<(&str, String)> = resp
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.clone()))
        .collect();
    assert_eq!(
        mounts,
        [
            (
                pipe.as_str(),
                mps_dirs(&root, &gpus[1]).pipe.display().to_string()
            ),
            (
                "/dev/shm",
                mps_dirs(&root, &gpus[1]).shm.display().to_string()
            ),
        ]
    );
    // Replicas of two GPUs in one container: INVALID_ARGUMENT naming both.
    let status = allocate(
        &emu,
        MPS,
        &[format!("{}::0", gpus[1]), format!("{}::0", gpus[0])],
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains(&gpus[0]) && status.message().contains(&gpus[1]),
        "{}",
        status.message()
    );
    // GetPreferredAllocation packs a multi-replica request onto one GPU.
    let mut client = emu.client(MPS).await.unwrap();
    let available: Vec<String> = devices(&emu.state(), MPS)
        .into_iter()
        .map(|d| d.id)
        .filter(|id| id != &format!("{}::0", gpus[0]))
        .collect();
    let got = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.into_iter().rev().collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 3,
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0)
        .device_i_ds;
    assert_eq!(
        got,
        (1..4)
            .map(|n| format!("{}::{n}", gpus[0]))
            .collect::<Vec<_>>()
    );

    // Kill GPU 1's daemon: exactly its 4 devices go Unhealthy, then Healthy after the restart.
    let first = starts(&read_journal(&root), &gpus[1])[0];
    kill9(first);
    let gpu0_stays = |s: &State| match health_of(s, MPS, &gpus[0]) {
        (4, 0) => Ok(()),
        other => Err(format!("GPU 0 devices (healthy, unhealthy) = {other:?}")),
    };
    wait_keeping(&emu, "GPU 1 Unhealthy", gpu0_stays, |s| {
        health_of(s, MPS, &gpus[1]) == (0, 4)
    })
    .await;
    wait_keeping(&emu, "GPU 1 Healthy again", gpu0_stays, |s| {
        health_of(s, MPS, &gpus[1]) == (4, 0)
    })
    .await;
    let journal = read_journal(&root);
    let restarted = starts(&journal, &gpus[1]);
    assert_eq!(restarted.len(), 2, "{journal:?}");
    assert_ne!(restarted[1], first);
    assert_eq!(starts(&journal, &gpus[0]).len(), 1);
    let pct_sets = commands(&mps_dirs(&root, &gpus[1]).log)
        .iter()
        .filter(|c| *c == "set_default_active_thread_percentage 25")
        .count();
    assert_eq!(pct_sets, 2, "defaults set again after the restart");

    // Shutdown: quit to every daemon, none left running, directories removed.
    d.stop().await;
    let journal = read_journal(&root);
    for g in &gpus {
        let last = *starts(&journal, g).last().unwrap();
        let events: Vec<&str> = journal
            .iter()
            .filter(|l| l.pid == last)
            .map(|l| l.event.as_str())
            .collect();
        assert_eq!(events.last(), Some(&"exit"), "{g}: {events:?}");
        assert!(events.contains(&"quit"), "{g}: {events:?}");
        assert!(!mps_dirs(&root, g).base.exists());
    }
    for l in &journal {
        assert!(!alive(l.pid), "daemon {} still running", l.pid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_changes_wait_until_no_client_is_connected() {
    let node = Node::new("");
    let root = mps_root(&node);
    node.write_policy(&mps_policy(&root, 4));
    let sim = h100s(&node, 1);
    let gpu = uuids(&sim).remove(0);
    let dirs = mps_dirs(&root, &gpu);
    let emu = emulator(&node).await;
    let mut d = Daemon::start(mps_settings(&node, &sim));
    wait_lists(&emu, &[(MPS, 4)]).await;
    d.wait_status(|s| s.mps_ready.contains(&gpu)).await;

    // A client is connected; the policy goes from 4 to 2 replicas (25 % → 50 %).
    set_clients(&dirs.pipe, &[4242]);
    node.write_policy(&mps_policy(&root, 2));
    d.wait_status(|s| s.mps_pending.contains(&gpu) && s.mps_ready.contains(&gpu))
        .await;
    wait_lists(&emu, &[(MPS, 2)]).await;
    let resp = allocate(&emu, MPS, &[format!("{gpu}::1")]).await.unwrap();
    assert_eq!(
        resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25",
        "the limits the daemon enforces stay advertised"
    );
    assert_eq!(resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20389M");
    let journal = read_journal(&root);
    assert_eq!(
        starts(&journal, &gpu).len(),
        1,
        "not restarted: {journal:?}"
    );
    assert!(!commands(&dirs.log).contains(&"set_default_active_thread_percentage 50".to_string()));

    // The GPU drains: the next check restarts the daemon with the new limits.
    set_clients(&dirs.pipe, &[]);
    let pct =
        |s: &slicelet::status::Status| s.mps_applied.get(&gpu).map(|l| l.active_thread_percentage);
    d.wait_status(|s| s.mps_pending.is_empty() && pct(s) == Some(50))
        .await;
    let journal = read_journal(&root);
    assert_eq!(starts(&journal, &gpu).len(), 2, "{journal:?}");
    let cmds = commands(&dirs.log);
    assert!(cmds.contains(&"set_default_active_thread_percentage 50".to_string()));
    assert!(cmds.contains(&"set_default_device_pinned_mem_limit 0 40779M".to_string()));
    let resp = allocate(&emu, MPS, &[format!("{gpu}::1")]).await.unwrap();
    assert_eq!(resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    assert_eq!(resp.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=40779M");

    // Without clients a change applies at once.
    node.write_policy(&mps_policy(&root, 4));
    d.wait_status(|s| s.generation == 3 && s.mps_pending.is_empty() && pct(s) == Some(25))
        .await;
    assert_eq!(starts(&read_journal(&root), &gpu).len(), 3);
    let resp = allocate(&emu, MPS, &[format!("{gpu}::3")]).await.unwrap();
    assert_eq!(resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_external_only_checks_health() {
    let node = Node::new("");
    let root = mps_root(&node);
    node.write_policy(&mps_policy(&root, 4));
    let sim = h100s(&node, 2);
    let gpus = uuids(&sim);
    // GPU 0's daemon is run by someone else (slicelet mps); GPU 1 has none.
    let start_external = || {
        let dirs = mps_dirs(&root, &gpus[0]);
        std::fs::create_dir_all(&dirs.pipe).unwrap();
        std::fs::create_dir_all(&dirs.log).unwrap();
        tokio::process::Command::new(fake_mps_control::binary())
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", &gpus[0])
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut external = start_external();
    let emu = emulator(&node).await;
    let mut settings = mps_settings(&node, &sim);
    settings.mps.external = true;
    let d = Daemon::start(settings);
    let state = emu
        .wait_for(WAIT, |s| {
            health_of(s, MPS, &gpus[0]) == (4, 0) && health_of(s, MPS, &gpus[1]) == (0, 4)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(state.device_count(MPS), Some(8));

    // The external daemon dies: its devices go Unhealthy; it comes back: Healthy.
    external.kill().await.unwrap();
    emu.wait_for(WAIT, |s| health_of(s, MPS, &gpus[0]) == (0, 4))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut external = start_external();
    emu.wait_for(WAIT, |s| health_of(s, MPS, &gpus[0]) == (4, 0))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // Stopping `run` leaves the external daemon alone: never configured, never quit.
    d.stop().await;
    let events: Vec<String> = read_journal(&root).into_iter().map(|l| l.event).collect();
    assert!(
        events
            .iter()
            .all(|e| e == "start" || e == "get_server_list"),
        "{events:?}"
    );
    assert!(external.try_wait().unwrap().is_none(), "still running");
    assert!(mps_dirs(&root, &gpus[0]).pipe.is_dir());
    assert!(!mps_dirs(&root, &gpus[1]).base.exists(), "nothing created");
    external.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_health_never_touches_time_sliced_devices() {
    let node = Node::new("");
    let root = mps_root(&node);
    node.write_policy(&format!(
        "flags:\n  mpsRoot: {}\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        devices: [0]\n        replicas: 2\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1]\n        replicas: 2\n",
        root.display()
    ));
    let sim = h100s(&node, 2);
    let gpus = uuids(&sim);
    let emu = emulator(&node).await;
    let d = Daemon::start(mps_settings(&node, &sim));
    let ts_healthy = |s: &State| match s.healthy_count("nvidia.com/gpu-shared") {
        None | Some(2) => Ok(()),
        Some(n) => Err(format!("{n} of 2 time-sliced devices Healthy")),
    };
    wait_keeping(&emu, "both resources Healthy", ts_healthy, |s| {
        s.healthy_count("nvidia.com/gpu-shared") == Some(2) && s.healthy_count(MPS) == Some(2)
    })
    .await;
    let pid = starts(&read_journal(&root), &gpus[1])[0];
    kill9(pid);
    wait_keeping(&emu, "MPS Unhealthy", ts_healthy, |s| {
        s.healthy_count(MPS) == Some(0)
    })
    .await;
    wait_keeping(&emu, "MPS Healthy again", ts_healthy, |s| {
        s.healthy_count(MPS) == Some(2)
    })
    .await;
    assert!(read_journal(&root).iter().all(|l| l.uuid == gpus[1]));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_control_binary_keeps_the_devices_unhealthy() {
    let node = Node::new("");
    let root = mps_root(&node);
    node.write_policy(&mps_policy(&root, 2));
    let sim = h100s(&node, 1);
    let emu = emulator(&node).await;
    let mut settings = mps_settings(&node, &sim);
    settings.mps.control_binary = node.tmp.path().join("no-such-nvidia-cuda-mps-control");
    let mut d = Daemon::start(settings);
    // Registered and listed, but never Healthy: no daemon enforces the limits.
    let state = wait_lists(&emu, &[(MPS, 2)]).await;
    assert_eq!(state.healthy_count(MPS), Some(0));
    let status = d.wait_status(|s| s.generation == 1).await;
    assert!(status.mps_ready.is_empty());
    d.stop().await;
    assert!(!mps_dirs(&root, &uuids(&sim)[0]).base.exists());
}
