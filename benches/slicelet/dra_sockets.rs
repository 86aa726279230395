//! 12. The real binary's DRA sockets under a flood (`ulimit -n 1024`, the usual default): 2,000
//!     silent connections to the DRA endpoint, 3,000 health streams asked for and never read;
//!     meanwhile a kubelet that connects anew (GetInfo, NodePrepareResources) and /metrics,
//!     against the same calls before the flood; RSS during and after it closes.

use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
use kubelet_emulator::dra::{DraKubelet, Version};
use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::KubeletEmulator;
use slicelet::api::drahealth::v1alpha1 as health;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::harness::*;

const NODE: &str = "bench-node";
const DRIVER: &str = "gpu.slicelet.io";
const POLICY: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n";

/// One round of what a restarted kubelet does, timed: GetInfo and NodePrepareResources on
/// fresh connections, then /metrics on a fresh TCP connection.
async fn round(
    registry: &Path,
    status: std::net::SocketAddr,
    dra: &mut Histogram<u64>,
    m: &mut Histogram<u64>,
) {
    let t = Instant::now();
    let k = DraKubelet::register(registry).await.unwrap();
    let answer = k
        .prepare(Version::V1, &[("ns", "one", "uid-one")])
        .await
        .unwrap();
    assert_eq!(answer["uid-one"].error, "");
    dra.record(t.elapsed().as_nanos() as u64).unwrap();
    let t = Instant::now();
    let mut c = tokio::net::TcpStream::connect(status).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = Vec::new();
    c.read_to_end(&mut body).await.unwrap();
    assert!(body.starts_with(b"HTTP/1.1 200"));
    m.record(t.elapsed().as_nanos() as u64).unwrap();
}

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let rt = &b.client_rt;
    let dir = b.tmp.path().join("dra-sockets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.yaml"), POLICY).unwrap();
    let api = rt.block_on(KubeApi::start(NODE, &[]));
    let plugins = dir.join("plugins");
    let _emu = rt.block_on(KubeletEmulator::start(&plugins)).unwrap();
    let registry = dir.join("registry");
    let dra_dir = dir.join("dra");
    let status = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = std::process::Command::new("prlimit")
        .arg("--nofile=1024:1024")
        .arg("--")
        .arg(daemon_binary())
        .arg("run")
        .arg("--config")
        .arg(dir.join("policy.yaml"))
        .arg("--device-plugin-path")
        .arg(&plugins)
        .arg("--simulate")
        .arg(sim_file(&dir, 8))
        .args(["--dra", "--node-name", NODE, "--kubeconfig"])
        .arg(api.kubeconfig(&dir))
        .arg("--dra-registry-dir")
        .arg(&registry)
        .arg("--dra-plugins-dir")
        .arg(&dra_dir)
        .arg("--cdi-output-dir")
        .arg(dir.join("cdi"))
        .arg("--status-address")
        .arg(status.to_string())
        .env("SLICELET_LOG", "warn")
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .spawn()
        .unwrap();
    rt.block_on(api.claim_first_device(DRIVER, NODE, ("ns", "one", "uid-one")));
    // The daemon's own process (prlimit execs it: the same pid).
    let pid = child.id();
    let rounds = if b.quick { 5 } else { 20 };
    let (mut dra_calm, mut m_calm) = (hist(), hist());
    rt.block_on(async {
        while !registry.join(format!("{DRIVER}-reg.sock")).exists() {
            tokio::task::yield_now().await;
        }
        for _ in 0..rounds {
            round(&registry, status, &mut dra_calm, &mut m_calm).await;
        }
    });
    let before = rss_kib(pid, "VmRSS");
    let endpoint = dra_dir.join(DRIVER).join("dra.sock");
    let (mut dra_flood, mut m_flood) = (hist(), hist());
    let (opened, peak) = rt.block_on(async {
        let mut idle = Vec::new();
        for _ in 0..2_000 {
            idle.push(tokio::net::UnixStream::connect(&endpoint).await.unwrap());
        }
        let mut streams = Vec::new();
        for _ in 0..100 {
            let Ok(ch) = slicelet::kubelet::connect(&endpoint).await else {
                continue;
            };
            let mut c = health::dra_resource_health_client::DraResourceHealthClient::new(ch);
            for _ in 0..30 {
                // Most are refused (RESOURCE_EXHAUSTED): the ones opened are held unread.
                if let Ok(s) = c
                    .node_watch_resources(health::NodeWatchResourcesRequest {})
                    .await
                {
                    streams.push(s.into_inner());
                }
            }
        }
        for _ in 0..rounds {
            round(&registry, status, &mut dra_flood, &mut m_flood).await;
        }
        let peak = rss_kib(pid, "VmRSS");
        (streams.len(), peak)
    });
    // The flood closed; the daemon returns its heap after a quiet while.
    std::thread::sleep(SETTLED);
    let after = rss_kib(pid, "VmRSS");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    let flood_max = ms(&dra_flood, 1.0).max(ms(&m_flood, 1.0));
    table.row(
        "12. GetInfo + prepare, /metrics under 2,000 idle conns + 3,000 health streams",
        format!(
            "{:.1} ms, {:.1} ms max (calm {:.1}, {:.1}); {opened} streams held",
            ms(&dra_flood, 1.0),
            ms(&m_flood, 1.0),
            ms(&dra_calm, 1.0),
            ms(&m_calm, 1.0)
        ),
        "< 100 ms",
        Some(flood_max < 100.0),
    );
    let mib = |k: u64| k as f64 / 1024.0;
    table.row(
        "12. RSS after the flood closed",
        format!(
            "{:.1} MiB (before {:.1}, during {:.1})",
            mib(after),
            mib(before),
            mib(peak)
        ),
        "< 32 MiB",
        Some(mib(after) < 32.0),
    );
}
