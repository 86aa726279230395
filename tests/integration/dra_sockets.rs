//! The real binary's DRA sockets under floods of idle connections and unread health streams,
//! with few file descriptors: the kubelet is still served.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use kubelet_emulator::dra::{DraKubelet, Version};
use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::KubeletEmulator;
use slicelet::api::drahealth::v1alpha1 as health;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

use crate::binary::{bin, sigterm_and_wait, status_address, wait_for_log};
use crate::common::{node_file, Node, WAIT};

const NODE: &str = "node-1";
const DRIVER: &str = "gpu.slicelet.io";
const POLICY: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n";
/// How long one connection or call of the flood may take (a server that stopped accepting
/// fails the test in minutes, not hours).
const CALL: std::time::Duration = std::time::Duration::from_secs(5);
/// Descriptors the daemon may open: far fewer than the connections below.
const NOFILE: u32 = 256;

/// Opens up to `per_conn` health streams on each of `conns` new connections to `endpoint` and
/// never reads them: (streams opened, refused with RESOURCE_EXHAUSTED, connections refused).
async fn unread_health_streams(
    endpoint: &Path,
    conns: usize,
    per_conn: usize,
    held: &mut Vec<tonic::Streaming<health::NodeWatchResourcesResponse>>,
) -> (usize, usize, usize) {
    let (mut opened, mut exhausted, mut refused) = (0, 0, 0);
    for _ in 0..conns {
        let Ok(Ok(ch)) = tokio::time::timeout(CALL, slicelet::kubelet::connect(endpoint)).await
        else {
            refused += 1;
            continue;
        };
        let mut c = health::dra_resource_health_client::DraResourceHealthClient::new(ch);
        for _ in 0..per_conn {
            let call = c.node_watch_resources(health::NodeWatchResourcesRequest {});
            let Ok(answer) = tokio::time::timeout(CALL, call).await else {
                refused += 1;
                break;
            };
            match answer {
                Ok(s) => {
                    opened += 1;
                    held.push(s.into_inner());
                }
                Err(s) if s.code() == tonic::Code::ResourceExhausted => exhausted += 1,
                Err(_) => {
                    refused += 1;
                    break;
                }
            }
        }
    }
    (opened, exhausted, refused)
}

/// Regression: the DRA endpoint and the registration socket had no connection limit, no
/// preface timeout and no cap on health streams. With 1,024 descriptors, 1,100 idle
/// connections made every prepare fail with "Too many open files" and GetInfo and /metrics
/// with it, while the accept loop spun. Now, under `ulimit -n 256`: 2,000 silent connections
/// to each socket, 64 that send one byte, and 1,200 health streams nobody reads, then a
/// kubelet that registers anew (GetInfo), prepares a claim and reads /metrics, each served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_floods_and_unread_health_streams_leave_a_new_kubelet_served() {
    let node = Node::new(POLICY);
    let api = KubeApi::start(NODE, &[]).await;
    let _emu = KubeletEmulator::start(&node.plugins()).await.unwrap();
    let registry = node.tmp.path().join("plugins_registry");
    let plugins = node.tmp.path().join("dra-plugins");
    let sim = node_file("h100-80gb-x8.yaml");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(bin())
        .args(["run", "--config", &path(&node.policy())])
        .args(["--device-plugin-path", &path(&node.plugins())])
        .args(["--simulate", &path(&sim), "--dra", "--node-name", NODE])
        .args(["--kubeconfig", &path(&api.kubeconfig(node.tmp.path()))])
        .args(["--dra-registry-dir", &path(&registry)])
        .args(["--dra-plugins-dir", &path(&plugins)])
        .args(["--cdi-output-dir", &path(&node.tmp.path().join("cdi"))])
        .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0")
        .env("SLICELET_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG")
        .env_remove("NODE_NAME")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut log = wait_for_log(&mut child, "serving /healthz").await;
    let status = status_address(&log);
    log += &wait_for_log(&mut child, "DRA: kubelet plugin serving").await;
    api.claim_first_device(DRIVER, NODE, ("ns", "one", "uid-one"))
        .await;
    let endpoint: PathBuf = plugins.join(DRIVER).join("dra.sock");
    let registration = registry.join(format!("{DRIVER}-reg.sock"));

    let mut idle = Vec::new();
    for socket in [&endpoint, &registration] {
        for _ in 0..2_000 {
            let c = tokio::time::timeout(WAIT, tokio::net::UnixStream::connect(socket))
                .await
                .expect("connect waited on a full backlog")
                .unwrap();
            idle.push(c);
        }
        for _ in 0..64 {
            let mut c = tokio::time::timeout(WAIT, tokio::net::UnixStream::connect(socket))
                .await
                .expect("connect waited on a full backlog")
                .unwrap();
            c.write_all(b"P").await.unwrap();
            idle.push(c);
        }
    }
    let mut held = Vec::new();
    let (opened, exhausted, refused) = unread_health_streams(&endpoint, 40, 30, &mut held).await;
    assert!(
        opened >= 1,
        "no health stream opened ({exhausted} exhausted, {refused} refused)"
    );
    assert!(
        opened <= 8,
        "{opened} health streams open at once; the rest: {exhausted} exhausted, {refused} refused"
    );

    // A kubelet that (re)starts now: GetInfo on a fresh connection, then NodePrepareResources.
    let k = tokio::time::timeout(WAIT, DraKubelet::register(&registry))
        .await
        .expect("GetInfo was not answered")
        .unwrap();
    let answer = tokio::time::timeout(WAIT, k.prepare(Version::V1, &[("ns", "one", "uid-one")]))
        .await
        .expect("NodePrepareResources was not answered")
        .unwrap();
    assert_eq!(answer["uid-one"].error, "", "{answer:?}");
    let (code, _) = tokio::time::timeout(WAIT, crate::live::get(status, "/metrics"))
        .await
        .expect("/metrics was not answered");
    assert_eq!(code, 200);

    drop(held);
    drop(idle);
    let (code, rest) = sigterm_and_wait(child).await;
    log += &rest;
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("Too many open files"), "{log}");
}
