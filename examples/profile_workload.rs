//! The workload behind `link/symbol-order.txt` (see `scripts/symbol-order.sh`): runs a
//! `slicelet run` command line given after `--` (the script puts it under valgrind's callgrind,
//! which records every function executed) against the kubelet emulator and the Kubernetes API
//! emulator, through what an idle daemon does in production: start, register, ListAndWatch,
//! Allocate and GetPreferredAllocation, a policy reload, a node label change, `/readyz` and
//! `/metrics`; then SIGTERM.
//!
//! ```text
//! cargo run --release --example profile_workload -- valgrind --tool=callgrind target/release/slicelet
//! ```

use std::path::Path;
use std::time::Duration;

use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::KubeletEmulator;
use slicelet::api;

const WAIT: Duration = Duration::from_secs(300);
const LABEL: &str = "nvidia.com/device-plugin.config";

fn ts(replicas: u32) -> String {
    format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: {replicas}\n")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let command: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(!command.is_empty(), "usage: profile_workload -- COMMAND…");
    let tmp = tempfile::tempdir()?;
    let configs = tmp.path().join("configs");
    std::fs::create_dir_all(&configs)?;
    std::fs::write(configs.join("ts4"), ts(4))?;
    std::fs::write(configs.join("ts2"), ts(2))?;
    let plugins = tmp.path().join("plugins");
    let emu = KubeletEmulator::start(&plugins).await?;
    let api = KubeApi::start("profile-node", &[(LABEL, "ts4")]).await;
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodes/a100-40gb-x8.yaml");
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .args(["run", "--config"])
        .arg(&configs)
        .arg("--device-plugin-path")
        .arg(&plugins)
        .arg("--simulate")
        .arg(&node)
        .args(["--node-name", "profile-node", "--kubeconfig"])
        .arg(api.kubeconfig(tmp.path()))
        .arg("--nfd-features-file")
        .arg(tmp.path().join("slicelet-features"))
        .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:18089")
        .env("SLICELET_LOG", "info")
        .spawn()?;
    let count =
        |n| move |s: &kubelet_emulator::State| s.device_count("nvidia.com/gpu-shared") == Some(n);
    emu.wait_for(WAIT, count(32)).await?;
    let mut client = emu.client("nvidia.com/gpu-shared").await?;
    let ids: Vec<String> = emu.state().resources["nvidia.com/gpu-shared"]
        .devices
        .iter()
        .flatten()
        .map(|d| d.id.clone())
        .collect();
    for i in 0..50 {
        client
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec![ids[i % ids.len()].clone()],
                }],
            })
            .await?;
        client
            .get_preferred_allocation(api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: ids.clone(),
                    must_include_device_i_ds: vec![],
                    allocation_size: 2,
                }],
            })
            .await?;
    }
    for path in ["/readyz", "/metrics", "/healthz"] {
        let mut s = tokio::net::TcpStream::connect("127.0.0.1:18089").await?;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
    }
    // A policy change (the chosen key rewritten), then a label change.
    std::fs::write(configs.join("ts4"), ts(3))?;
    emu.wait_for(WAIT, count(24)).await?;
    api.set_label(LABEL, "ts2");
    emu.wait_for(WAIT, count(16)).await?;
    let pid = child.id().expect("running");
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    child.wait().await?;
    Ok(())
}
