//! 6. Memory of the real binary: at the first full list, idle (SETTLED later), and peak
//!    after 4,000 Allocates.

use std::time::Duration;

use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::KubeletEmulator;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let quick = b.quick;
    let tmp = &b.tmp;
    let client_rt = &b.client_rt;
    let bin_path = daemon_binary();
    let bin = bin_path.as_str();
    let three = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, rename: a, devices: [0, 1, 2], replicas: 16}\n      - {name: nvidia.com/gpu, rename: b, devices: [3, 4, 5], replicas: 16}\n      - {name: nvidia.com/gpu, rename: c, devices: [6, 7], replicas: 16}\n";
    let three_lists = vec![
        ("nvidia.com/a", 48),
        ("nvidia.com/b", 48),
        ("nvidia.com/c", 32),
    ];
    for (label, gpus, policy_text, resources, goal, node_watch) in [
        (
            "8 GPUs x 16 replicas, 3 resources",
            8u32,
            three.to_string(),
            three_lists.clone(),
            Some(8.0),
            false,
        ),
        (
            "the same, config chosen by Node label (API watch on)",
            8u32,
            three.to_string(),
            three_lists.clone(),
            Some(8.0),
            true,
        ),
        (
            "2,688 devices (8 GPUs x 7 MIG slices x 48)",
            56,
            MIG_POLICY.to_string(),
            vec![(MIG_RESOURCE, 2688)],
            None,
            false,
        ),
    ] {
        let dir = tmp.path().join(format!("rss-{gpus}-{node_watch}"));
        std::fs::create_dir_all(dir.join("policy")).unwrap();
        // With the Node watch: a directory of named configs ("any" and "three"), the
        // node's label choosing "three" through the Kubernetes API emulator.
        let (config, api) = if node_watch {
            std::fs::write(dir.join("policy/any"), "version: v1\n").unwrap();
            std::fs::write(dir.join("policy/three"), &policy_text).unwrap();
            let api = client_rt.block_on(KubeApi::start(
                "bench-node",
                &[("nvidia.com/device-plugin.config", "three")],
            ));
            (dir.join("policy"), Some(api))
        } else {
            std::fs::write(dir.join("policy/config.yaml"), &policy_text).unwrap();
            (dir.join("policy/config.yaml"), None)
        };
        let plugins = dir.join("plugins");
        let emu = client_rt
            .block_on(KubeletEmulator::start(&plugins))
            .unwrap();
        let sim = if gpus == 56 {
            let p = dir.join("mig-node.yaml");
            std::fs::write(&p, MIG_NODE).unwrap();
            p
        } else {
            sim_file(&dir, gpus)
        };
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["run", "--config"])
            .arg(&config)
            .arg("--device-plugin-path")
            .arg(&plugins)
            .arg("--simulate")
            .arg(&sim)
            .env("SLICELET_LOG", "warn")
            .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0")
            .env_remove("NODE_NAME")
            .env_remove("KUBECONFIG");
        if let Some(api) = &api {
            cmd.args(["--node-name", "bench-node", "--config-default", "any"])
                .arg("--kubeconfig")
                .arg(api.kubeconfig(&dir));
        }
        let mut child = cmd.spawn().unwrap();
        let state = client_rt
            .block_on(emu.wait_for(WAIT, |s| {
                resources.iter().all(|(r, n)| s.device_count(r) == Some(*n))
            }))
            .unwrap();
        let at_list = rss_kib(child.id(), "VmRSS");
        // Idle: nothing has changed for SETTLED, so the daemon has returned the free heap
        // pages its start used (`residency::settle`, RESIDENCY_SETTLE after the last change).
        std::thread::sleep(SETTLED);
        let idle = rss_kib(child.id(), "VmRSS");
        if gpus == 8 && !node_watch {
            // Idle CPU: nothing changes for a while; the daemon must not poll.
            let window = Duration::from_secs(if quick { 10 } else { 60 });
            let before = cpu_ticks(child.id());
            std::thread::sleep(window);
            let ticks = cpu_ticks(child.id()) - before;
            // Clock ticks are 10 ms (USER_HZ 100) on Linux.
            let pct = ticks as f64 * 10.0 / (window.as_secs_f64() * 1000.0) * 100.0;
            table.row(
                format!("6. idle CPU over {} s, {label}", window.as_secs()),
                format!("{pct:.3} % of one core ({ticks} ticks)"),
                "< 0.05 % (NVIDIA: 0.07-0.15 %)",
                Some(pct < 0.05),
            );
        }
        let (name, _) = resources[0];
        let ids: Vec<String> = state.resources[name]
            .devices
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let client = client_rt.block_on(emu.client(name)).unwrap();
        client_rt.block_on(allocate_round(&client, &ids, 16, 4_000, &mut hist()));
        let peak = rss_kib(child.id(), "VmHWM");
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let mib = |k: u64| k as f64 / 1024.0;
        table.row(
            format!("6. RSS idle, {label}"),
            format!(
                "{:.1} MiB (at the first full list {:.1}, peak after 4,000 Allocates {:.1})",
                mib(idle),
                mib(at_list),
                mib(peak)
            ),
            goal.map_or("(NVIDIA: 25 MiB idle)".to_string(), |g| {
                format!("< {g} MiB (NVIDIA: 25)")
            }),
            goal.map(|g| mib(idle) < g),
        );
    }
}
