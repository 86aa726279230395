//! 11. The sampler's CPU: the release daemon on the busy H100 node (two processes on GPU 0
//!     attributed to two pods through fake /proc cgroups, the checkpoint and pod-resources),
//!     sampling every 5 s (the default), over 60 s.

use std::path::PathBuf;
use std::time::Duration;

use kubelet_emulator::node_files;
use kubelet_emulator::KubeletEmulator;
use slicelet::daemon;
use slicelet::settings::Settings;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let quick = b.quick;
    let tmp = &b.tmp;
    let client_rt = &b.client_rt;
    let bin_path = daemon_binary();
    let bin = bin_path.as_str();
    let dir = tmp.path().join("sampler");
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    std::fs::write(dir.join("policy/config.yaml"), ts_policy(4)).unwrap();
    let plugins = dir.join("plugins");
    let node =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/nodes/h100-80gb-x8-busy.yaml");
    let gpu0 = daemon::discover(&Settings {
        simulate: Some(node.clone()),
        ..Settings::new("/nonexistent", "/nonexistent")
    })
    .unwrap()
    .0
    .gpus[0]
        .uuid
        .clone();
    let socket = dir.join("pod-resources/kubelet.sock");
    let pods = client_rt
        .block_on(kubelet_emulator::pod_resources::PodResources::start(
            &socket,
        ))
        .unwrap();
    let uids: Vec<String> = (0..2)
        .map(|i| format!("00000000-0000-4000-8000-{i:012}"))
        .collect();
    let ids: Vec<String> = (0..2).map(|i| format!("{gpu0}::{i}")).collect();
    for (i, pid) in [4242u32, 4343].into_iter().enumerate() {
        pods.hold(
            "bench",
            &format!("llm-{i}"),
            "server",
            "nvidia.com/gpu-shared",
            &[&ids[i]],
        );
        node_files::write_cgroup(
            &dir.join("host"),
            pid,
            node_files::Driver::Cgroupfs,
            Some("burstable"),
            &uids[i],
            &"b".repeat(64),
        )
        .unwrap();
    }
    let emu = client_rt
        .block_on(KubeletEmulator::start(&plugins))
        .unwrap();
    let entries: Vec<node_files::Entry<'_>> = uids
        .iter()
        .zip(&ids)
        .map(|(uid, id)| node_files::Entry {
            pod_uid: uid,
            container: "server",
            resource: "nvidia.com/gpu-shared",
            device_ids: std::slice::from_ref(id),
        })
        .collect();
    node_files::write_checkpoint(&plugins.join("kubelet_internal_checkpoint"), &entries).unwrap();
    let mut child = std::process::Command::new(bin)
        .args(["run", "--config"])
        .arg(dir.join("policy/config.yaml"))
        .arg("--device-plugin-path")
        .arg(&plugins)
        .arg("--simulate")
        .arg(&node)
        .arg("--proc-root")
        .arg(dir.join("host"))
        .arg("--pod-resources-socket")
        .arg(&socket)
        .env("SLICELET_LOG", "warn")
        .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0")
        .env_remove("SLICELET_SAMPLE_SECONDS")
        .spawn()
        .unwrap();
    client_rt
        .block_on(emu.wait_for(WAIT, |s| {
            s.device_count("nvidia.com/gpu-shared") == Some(32)
        }))
        .unwrap();
    let window = Duration::from_secs(if quick { 10 } else { 60 });
    let lists = pods.lists();
    let before = cpu_ticks(child.id());
    std::thread::sleep(window);
    let ticks = cpu_ticks(child.id()) - before;
    let reads = pods.lists() - lists;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let pct = ticks as f64 * 10.0 / (window.as_secs_f64() * 1000.0) * 100.0;
    table.row(
        format!(
            "11. CPU over {} s sampling every 5 s, 2 pods attributed ({reads} pod-resources reads)",
            window.as_secs()
        ),
        format!("{pct:.3} % of one core ({ticks} ticks)"),
        "< 0.5 %",
        Some(pct < 0.5),
    );
}
