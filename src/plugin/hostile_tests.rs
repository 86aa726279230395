//! Hostile clients and withdrawn resources over real unix sockets (issue 15 D5, D8, D13).

use std::time::Duration;

use tokio_stream::StreamExt as _;

use super::*;
use crate::api::device_plugin_client::DevicePluginClient;
use crate::inventory::test_node;
use crate::plan::build;
use crate::policy::parse;

const RESOURCE: &str = "nvidia.com/gpu";

fn plan(replicas: u32) -> Arc<Plan> {
    let p = parse(&format!(
        "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: {replicas}\n"
    ))
    .unwrap();
    Arc::new(build(&p, &test_node(8)).unwrap().plan)
}

struct Served {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    plans: watch::Sender<Arc<Plan>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(replicas: u32) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = bind(dir.path(), RESOURCE).unwrap();
    let path = socket.path.clone();
    let (plans, rx) = watch::channel(plan(replicas));
    let stop = CancellationToken::new();
    let svc = Service::new(RESOURCE, rx, stop.clone(), "/");
    let task = serve(socket, svc, stop.clone());
    Served {
        _dir: dir,
        path,
        plans,
        stop,
        task,
    }
}

async fn client(path: &std::path::Path) -> DevicePluginClient<tonic::transport::Channel> {
    DevicePluginClient::new(crate::kubelet::connect(path).await.unwrap())
}

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_64kib_unknown_id_is_invalid_argument_with_a_short_message() {
    let s = start(2);
    let mut c = client(&s.path).await;
    let status = c
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec!["G".repeat(64 * 1024)],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().len() < 400, "{}", status.message().len());
    assert!(
        status.message().contains("(65536 bytes)"),
        "{}",
        status.message()
    );
    s.stop.cancel();
}

#[tokio::test]
async fn a_withdrawn_resource_sends_an_empty_list_before_its_stream_ends() {
    let s = start(2);
    let mut c = client(&s.path).await;
    let mut stream = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.devices.len(), 16);
    // As the supervisor withdraws a resource: publish the plan without it, then stop.
    s.plans.send_replace(Arc::new(Plan::default()));
    s.stop.cancel();
    let mut rest = Vec::new();
    while let Some(m) = tokio::time::timeout(DEADLINE, stream.next()).await.unwrap() {
        match m {
            Ok(m) => rest.push(m.devices.len()),
            Err(_) => break,
        }
    }
    assert_eq!(rest, [0], "the last list before the end is empty");
}

#[tokio::test]
async fn a_client_that_never_reads_does_not_keep_the_server_from_stopping() {
    // 8 GPUs × 600 replicas: each list is about 60 KB, so a few fill the HTTP/2 window.
    let s = start(600);
    let mut c = client(&s.path).await;
    let stream = c.list_and_watch(api::Empty {}).await.unwrap().into_inner();
    for replicas in 601..620 {
        s.plans.send_replace(plan(replicas));
        tokio::task::yield_now().await;
    }
    s.stop.cancel();
    tokio::time::timeout(DEADLINE, s.task)
        .await
        .expect("server did not stop while a client ignored its stream")
        .unwrap();
    drop(stream);
}

#[tokio::test]
async fn idle_connections_beyond_the_limit_wait_and_the_kubelet_is_still_served() {
    let s = start(2);
    // Idle clients that never speak HTTP/2 take every permit...
    let mut idle = Vec::new();
    for _ in 0..listen::MAX_CONNECTIONS + 50 {
        idle.push(tokio::net::UnixStream::connect(&s.path).await.unwrap());
    }
    // ...but never hold a slot (the newest evict the oldest, and any is closed for saying
    // nothing within the preface timeout): a real client is served.
    idle.truncate(listen::MAX_CONNECTIONS - 1);
    let mut c = client(&s.path).await;
    let opts = tokio::time::timeout(DEADLINE, c.get_device_plugin_options(api::Empty {}))
        .await
        .expect("not served")
        .unwrap();
    assert!(opts.into_inner().get_preferred_allocation_available);
    // A connection that never speaks is closed by the server.
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt as _;
        idle[0].read(&mut buf).await
    })
    .await
    .expect("a silent connection stayed open")
    .unwrap_or(0);
    assert_eq!(n, 0);
    s.stop.cancel();
    tokio::time::timeout(DEADLINE, s.task)
        .await
        .unwrap()
        .unwrap();
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A measurement, not a check (RSS is process-wide and other tests run alongside): run alone
/// with `cargo test --lib rss_with_idle -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn rss_with_idle_unix_connections() {
    // Before issue 15 (no limit, every connection handed to tonic at once), then now.
    for (label, limits) in [
        (
            "none",
            listen::Limits {
                max_connections: 100_000,
                max_pending: 100_000,
                preface_timeout: None,
            },
        ),
        ("slicelet's", listen::Limits::default()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let socket = bind(dir.path(), RESOURCE).unwrap();
        let path = socket.path.clone();
        let (_plans, rx) = watch::channel(plan(4));
        let stop = CancellationToken::new();
        let task = serve_limited(
            socket,
            Service::new(RESOURCE, rx, stop.clone(), "/"),
            stop.clone(),
            limits,
        );
        let before = rss_kib();
        let mut idle = Vec::new();
        for _ in 0..1000 {
            idle.push(tokio::net::UnixStream::connect(&path).await.unwrap());
        }
        // Let the server accept and set up what it will (a measurement: a settle time, not a
        // synchronisation).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = rss_kib();
        drop(idle);
        stop.cancel();
        let _ = tokio::time::timeout(DEADLINE, task).await;
        println!(
            "limits {label}: RSS {before} KiB before, {during} KiB with 1,000 idle connections (+{} KiB)",
            during.saturating_sub(before)
        );
    }
}
