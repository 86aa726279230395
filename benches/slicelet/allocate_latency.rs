//! 1. Allocate latency, slicelet vs the floor, alternating rounds.

use std::sync::Arc;

use kubelet_emulator::KubeletEmulator;
use slicelet::api::{self, device_plugin_client::DevicePluginClient, device_plugin_server};
use slicelet::daemon;
use slicelet::kubelet;
use slicelet::settings::Settings;
use tokio_util::sync::CancellationToken;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let scale = b.scale;
    let tmp = &b.tmp;
    let server_rt = &b.server_rt;
    let client_rt = &b.client_rt;
    let dir = tmp.path().join("alloc");
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    let policy_file = dir.join("policy/config.yaml");
    std::fs::write(&policy_file, ts_policy(4)).unwrap();
    let plugins = dir.join("plugins");
    let emu = client_rt
        .block_on(KubeletEmulator::start(&plugins))
        .unwrap();
    let mut settings = Settings::new(&policy_file, &plugins);
    settings.simulate = Some(sim_file(&dir, 8));
    let token = CancellationToken::new();
    let d = server_rt.spawn(daemon::run(settings, token.clone()));
    let ids = shared_ids(client_rt, &emu);
    let slicelet = client_rt
        .block_on(emu.client("nvidia.com/gpu-shared"))
        .unwrap();
    // The floor answers with slicelet's own response for the first ID (same size).
    let sample = client_rt
        .block_on(slicelet.clone().allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![ids[0].clone()],
            }],
        }))
        .unwrap()
        .into_inner();
    let floor_sock = dir.join("floor.sock");
    let listener = server_rt
        .block_on(async { tokio::net::UnixListener::bind(&floor_sock) })
        .unwrap();
    let floor_stop = CancellationToken::new();
    let fs = floor_stop.clone();
    let floor_srv = Floor(Arc::new(sample));
    server_rt.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(device_plugin_server::DevicePluginServer::new(floor_srv))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                fs.cancelled(),
            )
            .await
            .unwrap();
    });
    let floor = DevicePluginClient::new(client_rt.block_on(kubelet::connect(&floor_sock)).unwrap());
    for callers in [1usize, 4, 16] {
        let (mut ha, mut hb) = (hist(), hist());
        let calls = 20_000 / scale;
        let rounds = 10;
        client_rt.block_on(async {
            // Warm-up both.
            allocate_round(
                &slicelet,
                &ids,
                callers,
                1_000 / scale + callers,
                &mut hist(),
            )
            .await;
            allocate_round(&floor, &ids, callers, 1_000 / scale + callers, &mut hist()).await;
            for _ in 0..rounds {
                allocate_round(&slicelet, &ids, callers, calls / rounds, &mut ha).await;
                allocate_round(&floor, &ids, callers, calls / rounds, &mut hb).await;
            }
        });
        for (q, name) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p99.9")] {
            let (a, b) = (ha.value_at_quantile(q), hb.value_at_quantile(q));
            let ratio = a as f64 / b as f64;
            let goal = if name == "p99" {
                "ratio <= 1.15"
            } else {
                "(NVIDIA: ~1.5 p50, ~1.7 p99)"
            };
            let verdict = (name == "p99").then_some(ratio <= 1.15);
            table.row(
                format!("1. Allocate {name}, {callers} caller(s): slicelet / floor"),
                format!("{:.1} us / {:.1} us = {ratio:.2}", us(a), us(b)),
                goal,
                verdict,
            );
        }
    }
    floor_stop.cancel();
    token.cancel();
    server_rt.block_on(d).unwrap().unwrap();
}
