//! 9. Per-node configs: the node's nvidia.com/device-plugin.config label changed through the
//!    Kubernetes API (emulator, real kube client) -> the kubelet has the new list.

use std::time::Instant;

use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::KubeletEmulator;
use slicelet::daemon;
use slicelet::settings::Settings;
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let scale = b.scale;
    let tmp = &b.tmp;
    let server_rt = &b.server_rt;
    let client_rt = &b.client_rt;
    let dir = tmp.path().join("label");
    let plugins = dir.join("plugins");
    let cm = dir.join("cm");
    std::fs::create_dir_all(&cm).unwrap();
    std::fs::write(cm.join("any"), "version: v1\n").unwrap();
    let ts4 = ts_policy(4).replace("        rename: nvidia.com/gpu-shared\n", "");
    std::fs::write(cm.join("a100-ts4"), ts4).unwrap();
    let emu = client_rt
        .block_on(KubeletEmulator::start(&plugins))
        .unwrap();
    let api = client_rt.block_on(KubeApi::start("bench-node", &[]));
    let mut settings = Settings::new(&cm, &plugins);
    settings.simulate = Some(sim_file(&dir, 8));
    settings.selection.default = Some("any".to_string());
    settings.label_watch = Some(slicelet::k8s::LabelWatch {
        node: "bench-node".to_string(),
        kubeconfig: Some(api.kubeconfig(&dir)),
    });
    let token = CancellationToken::new();
    let d = server_rt.spawn(daemon::run(settings, token.clone()));
    client_rt
        .block_on(emu.wait_for(WAIT, |s| s.device_count("nvidia.com/gpu") == Some(8)))
        .unwrap();
    let mut h = hist();
    for run in 0..(40 / scale).max(4) {
        let (want, set) = if run % 2 == 0 { (32, true) } else { (8, false) };
        let t = Instant::now();
        if set {
            api.set_label("nvidia.com/device-plugin.config", "a100-ts4");
        } else {
            api.remove_label("nvidia.com/device-plugin.config");
        }
        client_rt
            .block_on(emu.wait_for(WAIT, |s| s.device_count("nvidia.com/gpu") == Some(want)))
            .unwrap();
        h.record(t.elapsed().as_nanos() as u64).unwrap();
    }
    let ms = h.value_at_quantile(0.5) as f64 / 1e6;
    let max = h.max() as f64 / 1e6;
    table.row(
        "9. Node label changed -> new list at the kubelet (median)",
        format!("{ms:.2} ms (max {max:.2} ms)"),
        "< 1 s",
        Some(max < 1000.0),
    );
    token.cancel();
    server_rt.block_on(d).unwrap().unwrap();
}
