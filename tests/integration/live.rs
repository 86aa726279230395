//! Live operations: GPU health from Xid events (through simulated-node edits), recovery,
//! stream loss, and the status endpoint.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use kubelet_emulator::healthy;
use slicelet::api::Device;

use crate::common::*;

pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .unwrap();
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&body).into_owned())
}

/// A node of `n` single-GPU entries (so one GPU can be edited), GPU `i` with `extra` lines.
fn write_node(path: &Path, n: usize, extra: &[(usize, &str)]) {
    let mut text = String::from("gpus:\n");
    for i in 0..n {
        text.push_str(&format!(
            "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    uuid: GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd\n"
        ));
        for (g, line) in extra {
            if *g == i {
                text.push_str(&format!("    {line}\n"));
            }
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn uuid(i: usize) -> String {
    format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd")
}

/// The GPUs (replica IDs' UUIDs) with an Unhealthy device in `devices`, in list order.
fn unhealthy_gpus(devices: &[Device]) -> Vec<String> {
    let mut v: Vec<String> = devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| d.id.split("::").next().unwrap().to_string())
        .collect();
    v.dedup();
    v
}

fn node_dir(node: &Node) -> PathBuf {
    let d = node.tmp.path().join("node");
    std::fs::create_dir_all(&d).unwrap();
    d.join("node.yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xid_79_turns_exactly_its_replicas_unhealthy_and_back() {
    let policy = format!("{}health:\n  recoverySeconds: 0.5\n", ts_policy(4));
    let node = Node::new(&policy);
    let sim = node_dir(&node);
    write_node(&sim, 4, &[]);
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    let mut d = Daemon::start(settings);
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 16)]).await;

    // An application Xid (13) is counted but changes nothing.
    write_node(&sim, 4, &[(2, "xid: 13")]);
    let addr = d
        .wait_status(|s| s.address.is_some())
        .await
        .address
        .unwrap();
    d.wait_status(|s| s.xid_events == 1).await;
    let (_, text) = get(addr, "/metrics").await;
    assert!(
        text.contains(&format!(
            "slicelet_xid_events_total{{gpu=\"{}\",xid=\"13\"}} 1",
            uuid(2)
        )),
        "{text}"
    );
    assert_eq!(emu.state().healthy_count("nvidia.com/gpu-shared"), Some(16));

    // Xid 79 (fallen off the bus) on GPU 1: exactly its 4 replicas go Unhealthy, and back
    // after the 0.5 s quiet period (NVML-equivalent probe answers). The emulator records every
    // list, so the short Unhealthy phase is seen however late this test looks.
    let before = emu.lists("nvidia.com/gpu-shared").len();
    write_node(&sim, 4, &[(1, "xid: 79")]);
    let gpu1_down = |d: &[Device]| healthy(d) == 12 && unhealthy_gpus(d) == [uuid(1)];
    let all_up = |d: &[Device]| d.len() == 16 && healthy(d) == 16;
    emu.wait_for_sequence_after(
        "nvidia.com/gpu-shared",
        before,
        &[&gpu1_down, &all_up],
        WAIT,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let (_, text) = get(addr, "/metrics").await;
    assert!(
        text.contains(&format!(
            "slicelet_health_transitions_total{{gpu=\"{}\",to=\"Unhealthy\"}} 1",
            uuid(1)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "slicelet_health_transitions_total{{gpu=\"{}\",to=\"Healthy\"}} 1",
            uuid(1)
        )),
        "{text}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_node_edits_change_the_inventory_live() {
    let node = Node::new(&ts_policy(2));
    let sim = node_dir(&node);
    write_node(&sim, 2, &[]);
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&sim));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 4)]).await;
    write_node(&sim, 3, &[(0, "health: Unhealthy")]);
    let state = emu
        .wait_for(WAIT, |s| {
            s.device_count("nvidia.com/gpu-shared") == Some(6)
                && s.healthy_count("nvidia.com/gpu-shared") == Some(4)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let devices = state.resources["nvidia.com/gpu-shared"].devices.as_deref();
    assert_eq!(unhealthy_gpus(devices.unwrap_or_default()), [uuid(0)]);
    assert_eq!(
        state.resources["nvidia.com/gpu-shared"].registrations, 1,
        "same stream"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_registration_and_policy_errors() {
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let mut settings = node.settings(&node_file("l4-x1.yaml"));
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    let mut d = Daemon::start(settings);
    let addr = d
        .wait_status(|s| s.address.is_some() && s.ready().is_ok())
        .await
        .address
        .unwrap();
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await, (200, "ready\n".to_string()));
    // Ready is registered; the kubelet's first list may still be on its way (a loaded machine).
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    node.write_policy(&ts_policy(2).replace("replicas: 2", "replicas: 0"));
    d.wait_status(|s| s.policy_error.is_some()).await;
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("sharing.timeSlicing.resources[0].replicas"),
        "{body}"
    );
    // The last good policy keeps serving.
    assert_eq!(emu.state().device_count("nvidia.com/gpu-shared"), Some(2));
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(
        metrics.contains("slicelet_policy_reload_failures_total 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("slicelet_devices{resource=\"nvidia.com/gpu-shared\",health=\"Healthy\"} 2"),
        "{metrics}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_kubelet_drops_is_registered_again() {
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    emu.drop_streams();
    emu.wait_for(WAIT, |s| {
        let r = &s.resources["nvidia.com/gpu-shared"];
        r.registrations == 2 && r.devices.is_some()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_rejected_for_the_node_is_retried_when_the_node_changes() {
    // Regression: `migStrategy: single` on a node whose GPUs mix MIG and non-MIG is rejected;
    // after the layout became uniform (mig-parted) the node stayed dark until SIGHUP.
    let node = Node::new("version: v1\nflags:\n  migStrategy: single\n");
    let sim = node_dir(&node);
    let mig = "    mig:\n      devices:\n        - profile: 1g.10gb\n          count: 7\n";
    let gpu = |i: usize, with_mig: bool| {
        format!(
            "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    uuid: GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd\n{}",
            if with_mig { mig } else { "" }
        )
    };
    let write = |text: String| {
        let tmp = sim.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &sim).unwrap();
    };
    write(format!("gpus:\n{}{}", gpu(0, true), gpu(1, false)));
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&sim));
    let st = d.wait_status(|s| s.policy_error.is_some()).await;
    assert!(st.policy_error.unwrap().contains("GPU"), "names the GPUs");
    write(format!("gpus:\n{}{}", gpu(0, true), gpu(1, true)));
    wait_lists(&emu, &[("nvidia.com/gpu", 14)]).await;
    assert!(d.wait_status(|s| s.policy_error.is_none()).await.generation >= 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_policy_directory_is_watched_again() {
    // Regression: after the policy's directory was renamed away and created anew, the watch
    // stayed on the old directory and later edits waited for the 60 s re-read.
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    let dir = node.tmp.path().join("policy");
    std::fs::rename(&dir, node.tmp.path().join("policy.old")).unwrap();
    let staging = node.tmp.path().join("policy.new");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("config.yaml"), ts_policy(3)).unwrap();
    std::fs::rename(&staging, &dir).unwrap();
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 3)]).await;
    // A later edit inside the new directory is seen too.
    let tmp = dir.join(".config.yaml.tmp");
    std::fs::write(&tmp, ts_policy(5)).unwrap();
    std::fs::rename(&tmp, dir.join("config.yaml")).unwrap();
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 5)]).await;
    d.stop().await;
}
