//! 8. A hostile policy (400 KB, nested 200,000 deep inside a typed field) written as a
//!    ConfigMap update: time until the daemon reports it rejected.

use std::time::Instant;

use kubelet_emulator::KubeletEmulator;
use slicelet::daemon;
use slicelet::settings::Settings;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let tmp = &b.tmp;
    let server_rt = &b.server_rt;
    let client_rt = &b.client_rt;
    let dir = tmp.path().join("hostile");
    let plugins = dir.join("plugins");
    let cm = dir.join("cm");
    std::fs::create_dir_all(&cm).unwrap();
    configmap_write(&cm, 1, &ts_policy(4));
    let emu = client_rt
        .block_on(KubeletEmulator::start(&plugins))
        .unwrap();
    let mut settings = Settings::new(cm.join("config.yaml"), &plugins);
    settings.simulate = Some(sim_file(&dir, 8));
    let token = CancellationToken::new();
    let (tx, mut status) = watch::channel(slicelet::status::Status::default());
    let d = server_rt.spawn(daemon::run_with_status(settings, token.clone(), tx));
    client_rt
        .block_on(emu.wait_for(WAIT, |s| {
            s.device_count("nvidia.com/gpu-shared") == Some(32)
        }))
        .unwrap();
    let depth = 200_000;
    let hostile = format!(
        "flags:\n  gfd: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let t = Instant::now();
    configmap_write(&cm, 2, &hostile);
    client_rt
        .block_on(async {
            tokio::time::timeout(WAIT, status.wait_for(|s| s.policy_error.is_some()))
                .await
                .map(|r| r.is_ok())
        })
        .unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    table.row(
        format!(
            "8. {} KB nested policy: written -> rejected",
            hostile.len() / 1000
        ),
        format!("{ms:.1} ms"),
        "< 100 ms (was 203 s of CPU)",
        Some(ms < 100.0),
    );
    token.cancel();
    server_rt.block_on(d).unwrap().unwrap();
}
