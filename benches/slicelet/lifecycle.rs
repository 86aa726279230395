//! 5. start -> registered, kubelet restart -> re-registered, ConfigMap swap -> new list.

use std::time::Instant;

use hdrhistogram::Histogram;
use kubelet_emulator::KubeletEmulator;
use slicelet::daemon;
use slicelet::settings::Settings;
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let quick = b.quick;
    let tmp = &b.tmp;
    let server_rt = &b.server_rt;
    let client_rt = &b.client_rt;
    let dir = tmp.path().join("life");
    let plugins = dir.join("plugins");
    let cm = dir.join("cm");
    std::fs::create_dir_all(&cm).unwrap();
    configmap_write(&cm, 1, &ts_policy(4));
    let sim = sim_file(&dir, 8);
    let mut emu = client_rt
        .block_on(KubeletEmulator::start(&plugins))
        .unwrap();
    let (mut start, mut restart, mut reload) = (hist(), hist(), hist());
    let runs = if quick { 3 } else { 10 };
    for run in 0..runs {
        let mut settings = Settings::new(cm.join("config.yaml"), &plugins);
        settings.simulate = Some(sim.clone());
        let token = CancellationToken::new();
        let t = Instant::now();
        let d = server_rt.spawn(daemon::run(settings, token.clone()));
        client_rt
            .block_on(emu.wait_for(WAIT, |s| {
                s.resources.get("nvidia.com/gpu-shared").is_some_and(|r| {
                    r.streaming && r.devices.as_ref().is_some_and(|d| !d.is_empty())
                })
            }))
            .unwrap();
        start.record(t.elapsed().as_nanos() as u64).unwrap();

        let regs = emu.state().resources["nvidia.com/gpu-shared"].registrations;
        client_rt.block_on(emu.restart()).unwrap();
        let t = Instant::now();
        client_rt
            .block_on(emu.wait_for(WAIT, |s| {
                let r = &s.resources["nvidia.com/gpu-shared"];
                r.registrations > regs && r.devices.as_ref().is_some_and(|d| !d.is_empty())
            }))
            .unwrap();
        restart.record(t.elapsed().as_nanos() as u64).unwrap();

        let current = emu.state().device_count("nvidia.com/gpu-shared").unwrap();
        let next = if current == 32 { 8 } else { 4 };
        let t = Instant::now();
        configmap_write(&cm, 100 + run, &ts_policy(next));
        client_rt
            .block_on(emu.wait_for(WAIT, |s| {
                s.device_count("nvidia.com/gpu-shared") == Some(next as usize * 8)
            }))
            .unwrap();
        reload.record(t.elapsed().as_nanos() as u64).unwrap();

        token.cancel();
        server_rt.block_on(d).unwrap().unwrap();
        configmap_write(&cm, 200 + run, &ts_policy(4));
        client_rt.block_on(emu.restart()).unwrap();
    }
    let ms = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64 / 1e6;
    table.row(
        "5. start -> full device list at the kubelet (median)",
        format!("{:.2} ms", ms(&start)),
        "< 10 ms (NVIDIA: 17 ms)",
        Some(ms(&start) < 10.0),
    );
    table.row(
        "5. kubelet restart -> full list again (median)",
        format!("{:.2} ms", ms(&restart)),
        "< 2 ms (NVIDIA: 6.7 ms)",
        Some(ms(&restart) < 2.0),
    );
    table.row(
        "5. ConfigMap ..data swap -> new list (median)",
        format!("{:.1} ms", ms(&reload)),
        "< 20 ms (the swap is read at once)",
        Some(ms(&reload) < 20.0),
    );
}
