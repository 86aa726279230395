//! slicelet's hot paths, measured side by side with the physical floor in one run.
//!
//! `cargo bench --bench slicelet` prints one table. Latencies are measured with hdrhistogram;
//! ratios compare slicelet with a bare tonic server on a unix socket that answers the same
//! unary call with a response of the same size and does no work (the floor). These machines
//! are shared and noisy, so the two are measured in alternating rounds and the ratio matters
//! more than the absolute figure. `--quick` runs fewer iterations; `--only 6,11` runs those figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::node_files;
use kubelet_emulator::KubeletEmulator;
use slicelet::api::{self, device_plugin_client::DevicePluginClient, device_plugin_server};
use slicelet::daemon::{self, Settings};
use slicelet::plan;
use slicelet::{allocate, kubelet, plugin, policy};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Counts heap allocations, for "plan build: allocations".
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
// SAFETY: every method forwards its arguments unchanged to the system allocator, so the
// `GlobalAlloc` contract is the one `System` already keeps; counting touches only an atomic.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's `Layout` is passed through as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` was allocated by `System` (every allocation goes through it) with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for dealloc; `n` is the caller's new size, passed through.
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

const WAIT: Duration = Duration::from_secs(30);

/// How long the RSS rows leave the daemon alone before they read its idle RSS: three times
/// `daemon::RESIDENCY_SETTLE` (the quiet time after which it lets go of its start-up pages).
const SETTLED: Duration = daemon::RESIDENCY_SETTLE.saturating_mul(3);

struct Table(Vec<[String; 4]>);

impl Table {
    fn row(
        &mut self,
        what: impl Into<String>,
        value: impl Into<String>,
        goal: impl Into<String>,
        verdict: Option<bool>,
    ) {
        let v = match verdict {
            Some(true) => "ok",
            Some(false) => "MISSED",
            None => "",
        };
        let r = [what.into(), value.into(), goal.into(), v.to_string()];
        println!("{:<58} {:<44} {:<22} {}", r[0], r[1], r[2], r[3]);
        self.0.push(r);
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// 8× H100 80GB, each in MIG mode with 7× 1g.10gb: 56 MIG devices.
const MIG_NODE: &str = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 8\n    numaNode: 0\n    mig:\n      devices:\n        - profile: 1g.10gb\n          count: 7\n";

/// Every 1g.10gb slice time-sliced 48 ways: 8 × 7 × 48 = 2,688 devices.
const MIG_POLICY: &str = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 48\n";

/// The resource of the 2,688-device node.
const MIG_RESOURCE: &str = "nvidia.com/mig-1g.10gb";

fn ts_policy(replicas: u32) -> String {
    format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: {replicas}\n")
}

fn sim_file(dir: &Path, gpus: u32) -> PathBuf {
    let p = dir.join(format!("node-{gpus}.yaml"));
    std::fs::write(&p, format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: {gpus}\n    numaNode: 0\n")).unwrap();
    p
}

/// The floor: a DevicePlugin that answers Allocate with a fixed response and does no work.
#[derive(Clone)]
struct Floor(Arc<api::AllocateResponse>);

#[tonic::async_trait]
impl device_plugin_server::DevicePlugin for Floor {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin::options()))
    }
    type ListAndWatchStream = tokio_stream::Empty<Result<api::ListAndWatchResponse, Status>>;
    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        Ok(Response::new(tokio_stream::empty()))
    }
    async fn get_preferred_allocation(
        &self,
        _: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn allocate(
        &self,
        _: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        Ok(Response::new((*self.0).clone()))
    }
    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

async fn allocate_round(
    client: &DevicePluginClient<Channel>,
    ids: &[String],
    callers: usize,
    calls: usize,
    h: &mut Histogram<u64>,
) {
    let per = calls / callers;
    let mut tasks = Vec::new();
    for c in 0..callers {
        let mut client = client.clone();
        let ids = ids.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut local = hist();
            for i in 0..per {
                let id = ids[(c * 7 + i) % ids.len()].clone();
                let req = api::AllocateRequest {
                    container_requests: vec![api::ContainerAllocateRequest {
                        devices_ids: vec![id],
                    }],
                };
                let t = Instant::now();
                client.allocate(req).await.unwrap();
                local.record(t.elapsed().as_nanos() as u64).unwrap();
            }
            local
        }));
    }
    for t in tasks {
        h.add(t.await.unwrap()).unwrap();
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `--only 6,11`: just those figures (the number before the dot of each row).
    let only: Option<Vec<u32>> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect());
    let wanted = |n: u32| only.as_ref().is_none_or(|o| o.contains(&n));
    let scale = if quick { 10 } else { 1 };
    println!(
        "slicelet benchmarks on {} ({} CPUs){}",
        hostname(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if quick { ", --quick" } else { "" }
    );
    println!("{:<58} {:<44} GOAL", "FIGURE", "VALUE");
    let mut table = Table(Vec::new());
    let tmp = tempfile::tempdir().unwrap();
    let server_rt = runtime(2);
    let client_rt = runtime(2);

    // 1. Allocate latency, slicelet vs the floor, alternating rounds.
    if wanted(1) {
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
        let ids = shared_ids(&client_rt, &emu);
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
        let floor =
            DevicePluginClient::new(client_rt.block_on(kubelet::connect(&floor_sock)).unwrap());
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

    // 2. GetPreferredAllocation over 2,688 available IDs (8 GPUs x 7 MIG slices x 48 replicas).
    let big_policy = policy::parse(MIG_POLICY).unwrap();
    let big_node = slicelet::inventory::simulated::parse(Path::new("mig-node"), MIG_NODE).unwrap();
    let big = plan::build(&big_policy, &big_node).unwrap().plan;
    let big_res = big.resources[MIG_RESOURCE].clone();
    assert_eq!(big_res.devices.len(), 2688);
    if wanted(2) {
        let mut avail: Vec<String> = big_res.devices.iter().map(|d| d.id.clone()).collect();
        shuffle(&mut avail);
        for size in [1usize, 4, 8] {
            let mut h = hist();
            for _ in 0..(2_000 / scale) {
                let t = Instant::now();
                let got = allocate::preferred(&big_res, &avail, &[], size);
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                assert_eq!(got.len(), size);
            }
            table.row(
                format!("2. GetPreferredAllocation, 2,688 available, size {size}"),
                format!(
                    "p50 {:.0} us, p99 {:.0} us",
                    us(h.value_at_quantile(0.5)),
                    us(h.value_at_quantile(0.99))
                ),
                "",
                None,
            );
        }
    }

    // 2. GetPreferredAllocation for whole GPUs by topology: DGX-1 (8 GPUs, NVLink cube-mesh)
    // and a 16-GPU node (NVLink pairs, two NUMA nodes); sizes 1, 2, 4, 8 with two GPUs taken,
    // in one histogram per node (size 8 of 16 is the exact search's worst case, 12,870 sets).
    if wanted(2) {
        let mut sixteen = "gpus:\n".to_string();
        for numa in 0..2 {
            sixteen.push_str(&format!("  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 8\n    numaNode: {numa}\n"));
        }
        sixteen.push_str("links:\n");
        for a in 0..16u32 {
            for b in a + 1..16 {
                if a / 2 == b / 2 {
                    sixteen.push_str(&format!(
                        "  - gpus: [{a}, {b}]\n    nvlinks: 4\n    pcie: single\n"
                    ));
                } else if a / 4 == b / 4 {
                    sixteen.push_str(&format!("  - gpus: [{a}, {b}]\n    pcie: hostbridge\n"));
                }
            }
        }
        let nodes = [
            (
                8,
                include_str!("../config/nodes/v100-16gb-x8-dgx1.yaml").to_string(),
            ),
            (16, sixteen),
        ];
        for (n, text) in nodes {
            let inv = slicelet::inventory::simulated::parse(Path::new("node"), &text).unwrap();
            let built = plan::build(&policy::Policy::default(), &inv).unwrap().plan;
            let res = built.resources["nvidia.com/gpu"].clone();
            assert_eq!(res.devices.len(), n);
            let mut avail: Vec<String> = res.devices.iter().map(|d| d.id.clone()).collect();
            avail.remove(5);
            avail.remove(2);
            shuffle(&mut avail);
            let mut h = hist();
            for _ in 0..(500 / scale) {
                for size in [1usize, 2, 4, 8] {
                    let t = Instant::now();
                    let got = allocate::preferred(&res, &avail, &[], size);
                    h.record(t.elapsed().as_nanos() as u64).unwrap();
                    assert_eq!(got.len(), size.min(avail.len()));
                }
            }
            let p99 = h.value_at_quantile(0.99);
            table.row(
                format!("2. GetPreferredAllocation whole GPUs, {n} GPUs (sizes 1-8)"),
                format!(
                    "p50 {:.0} us, p99 {:.0} us",
                    us(h.value_at_quantile(0.5)),
                    us(p99)
                ),
                "p99 < 1 ms",
                Some(p99 < 1_000_000),
            );
        }
    }

    // 3. ListAndWatch: plan change -> full 2,688-device list received over the socket.
    if wanted(3) {
        let bytes = prost::Message::encoded_len(&plugin::list_response(&big_res));
        let dir = tmp.path().join("law");
        std::fs::create_dir_all(&dir).unwrap();
        let (tx, rx) = watch::channel(Arc::new(big.clone()));
        let stop = CancellationToken::new();
        let socket = server_rt
            .block_on(async { plugin::bind(&dir, MIG_RESOURCE) })
            .unwrap();
        let path = socket.path.clone();
        let svc = plugin::Service::new(MIG_RESOURCE, rx, stop.clone(), "/");
        let _srv = {
            let _guard = server_rt.enter();
            plugin::serve(socket, svc, stop.clone())
        };
        let mut h = hist();
        client_rt.block_on(async {
            let mut client = DevicePluginClient::new(kubelet::connect(&path).await.unwrap())
                .max_decoding_message_size(api::KUBELET_MAX_MESSAGE_BYTES);
            let mut stream = client
                .list_and_watch(api::Empty {})
                .await
                .unwrap()
                .into_inner();
            stream.message().await.unwrap().unwrap();
            let mut node = big_node.clone();
            for i in 0..(200 / scale) {
                let was = node.gpus[i % 8].health;
                node.gpus[i % 8].health = slicelet::health::Health::from_bool(!was.is_healthy());
                let next = plan::build(&big_policy, &node).unwrap().plan;
                let t = Instant::now();
                tx.send_replace(Arc::new(next));
                let msg = stream.message().await.unwrap().unwrap();
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                assert_eq!(msg.devices.len(), 2688);
            }
        });
        stop.cancel();
        table.row(
            "3. ListAndWatch, 2,688 devices: change -> client has list",
            format!(
                "p50 {:.0} us, p99 {:.0} us",
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99))
            ),
            "",
            None,
        );
        table.row(
            "3. ListAndWatch message size, 2,688 devices",
            format!(
                "{bytes} bytes ({:.1}% of 4 MiB)",
                bytes as f64 * 100.0 / api::KUBELET_MAX_MESSAGE_BYTES as f64
            ),
            "far below 4 MiB",
            Some(bytes * 10 < api::KUBELET_MAX_MESSAGE_BYTES),
        );
    }

    // 4. plan build for the 2,688-device node: time and allocations.
    if wanted(4) {
        let mut h = hist();
        for _ in 0..(200 / scale) {
            let t = Instant::now();
            let p = plan::build(&big_policy, &big_node).unwrap();
            h.record(t.elapsed().as_nanos() as u64).unwrap();
            std::hint::black_box(p);
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        let p = plan::build(&big_policy, &big_node).unwrap();
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        drop(p);
        table.row(
            "4. plan build, 2,688 devices",
            format!(
                "p50 {:.0} us, {allocs} allocations",
                us(h.value_at_quantile(0.5))
            ),
            "",
            None,
        );
    }

    // 5. start -> registered, kubelet restart -> re-registered, ConfigMap swap -> new list.
    if wanted(5) {
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

    // 6. Memory of the real binary: at the first full list, idle (SETTLED later), and peak
    //    after 4,000 Allocates.
    if wanted(6) {
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
    // 7. A slow NVML: memory queries delayed 400 ms, re-discovery (SIGHUP) every 200 ms for
    //    10 s, while one caller measures Allocate over the socket; the same without the delay.
    if wanted(7) {
        let bin_path = daemon_binary();
        let bin = bin_path.as_str();
        let lib = fake_nvml();
        let secs = if quick { 3 } else { 10 };
        let mut p99 = Vec::new();
        for delay_ms in [0u64, 400] {
            let dir = tmp.path().join(format!("slow-nvml-{delay_ms}"));
            std::fs::create_dir_all(dir.join("policy")).unwrap();
            std::fs::write(dir.join("policy/config.yaml"), ts_policy(4)).unwrap();
            let inventory = dir.join("nvml.json");
            std::fs::write(&inventory, fake_nvml_inventory(8, delay_ms)).unwrap();
            let plugins = dir.join("plugins");
            let emu = client_rt
                .block_on(KubeletEmulator::start(&plugins))
                .unwrap();
            let mut child = std::process::Command::new(bin)
                .args(["run", "--config"])
                .arg(dir.join("policy/config.yaml"))
                .arg("--device-plugin-path")
                .arg(&plugins)
                .arg("--nvml-library")
                .arg(&lib)
                .env("FAKE_NVML_INVENTORY", &inventory)
                .env("SLICELET_LOG", "error")
                .env("SLICELET_STATUS_ADDRESS", "")
                .spawn()
                .unwrap();
            let ids = shared_ids(&client_rt, &emu);
            let client = client_rt
                .block_on(emu.client("nvidia.com/gpu-shared"))
                .unwrap();
            let pid = child.id().to_string();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let hup = {
                let stop = Arc::clone(&stop);
                let pid = pid.clone();
                std::thread::spawn(move || {
                    let mut sent = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        let _ = std::process::Command::new("kill")
                            .args(["-HUP", &pid])
                            .status();
                        sent += 1;
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    sent
                })
            };
            let mut h = hist();
            let until = Instant::now() + Duration::from_secs(secs);
            client_rt.block_on(async {
                while Instant::now() < until {
                    allocate_round(&client, &ids, 1, 200, &mut h).await;
                }
            });
            stop.store(true, Ordering::Relaxed);
            let hups = hup.join().unwrap();
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status();
            let _ = child.wait();
            table.row(
                format!("7. Allocate, NVML memory query +{delay_ms} ms, {hups} SIGHUPs"),
                format!(
                    "p50 {:.1} us, p99 {:.1} us ({} calls)",
                    us(h.value_at_quantile(0.5)),
                    us(h.value_at_quantile(0.99)),
                    h.len()
                ),
                "",
                None,
            );
            p99.push(h.value_at_quantile(0.99));
        }
        let ratio = p99[1] as f64 / p99[0] as f64;
        table.row(
            "7. Allocate p99, slow NVML / normal NVML",
            format!("{ratio:.2}"),
            "<= 2",
            Some(ratio <= 2.0),
        );
    }

    // 8. A hostile policy (400 KB, nested 200,000 deep inside a typed field) written as a
    //    ConfigMap update: time until the daemon reports it rejected.
    if wanted(8) {
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
        let (tx, mut status) = watch::channel(daemon::Status::default());
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

    // 9. Per-node configs: the node's nvidia.com/device-plugin.config label changed through the
    //    Kubernetes API (emulator, real kube client) -> the kubelet has the new list.
    if wanted(9) {
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

    // 10. GPU use: `/metrics` rendered with 2,688 devices and 500 containers holding them
    //     (every GPU-use series filled), one attribution pass (a sample) and the /status view.
    if wanted(10) {
        use slicelet::usage::report::{synthetic_node, Usage};
        let metrics = slicelet::status::Metrics::new();
        let (plan, in_use, samples) = synthetic_node(8, 336, 500);
        let mut usage = Usage::new();
        usage.allocation(&plan, &in_use, metrics.usage());
        usage.sampled(&samples, &plan, &in_use, metrics.usage());
        metrics.set_plan(&plan);
        let rounds = if quick { 50 } else { 500 };
        let (mut render, mut sample, mut view) = (hist(), hist(), hist());
        let mut bytes = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let text = std::hint::black_box(metrics.encode());
            render.record(t.elapsed().as_nanos() as u64).unwrap();
            bytes = text.len();
            let t = Instant::now();
            usage.sampled(&samples, &plan, &in_use, metrics.usage());
            sample.record(t.elapsed().as_nanos() as u64).unwrap();
            let t = Instant::now();
            std::hint::black_box(usage.view(&plan, &in_use));
            view.record(t.elapsed().as_nanos() as u64).unwrap();
        }
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e6;
        table.row(
            "10. /metrics render, 2,688 devices, 500 containers",
            format!(
                "p50 {:.2} ms, p99 {:.2} ms ({} KiB)",
                ms(&render, 0.5),
                ms(&render, 0.99),
                bytes / 1024
            ),
            "< 5 ms",
            Some(ms(&render, 0.99) < 5.0),
        );
        table.row(
            "10. one sample attributed (Usage::sampled) / /status view",
            format!("p50 {:.2} / {:.2} ms", ms(&sample, 0.5), ms(&view, 0.5)),
            "",
            None,
        );
    }

    // 11. The sampler's CPU: the release daemon on the busy H100 node (two processes on GPU 0
    //     attributed to two pods through fake /proc cgroups, the checkpoint and pod-resources),
    //     sampling every 5 s (the default), over 60 s.
    if wanted(11) {
        let bin_path = daemon_binary();
        let bin = bin_path.as_str();
        let dir = tmp.path().join("sampler");
        std::fs::create_dir_all(dir.join("policy")).unwrap();
        std::fs::write(dir.join("policy/config.yaml"), ts_policy(4)).unwrap();
        let plugins = dir.join("plugins");
        let node =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/nodes/h100-80gb-x8-busy.yaml");
        let gpu0 = daemon::discover(&Settings {
            simulate: Some(node.clone()),
            ..Settings::new("/nonexistent", "/nonexistent")
        })
        .unwrap()
        .0
        .gpus[0]
            .uuid
            .clone();
        let socket = dir.join("pod-resources/kubelet.sock");
        let pods = client_rt
            .block_on(kubelet_emulator::pod_resources::PodResources::start(
                &socket,
            ))
            .unwrap();
        let uids: Vec<String> = (0..2)
            .map(|i| format!("00000000-0000-4000-8000-{i:012}"))
            .collect();
        let ids: Vec<String> = (0..2).map(|i| format!("{gpu0}::{i}")).collect();
        for (i, pid) in [4242u32, 4343].into_iter().enumerate() {
            pods.hold(
                "bench",
                &format!("llm-{i}"),
                "server",
                "nvidia.com/gpu-shared",
                &[&ids[i]],
            );
            node_files::write_cgroup(
                &dir.join("host"),
                pid,
                node_files::Driver::Cgroupfs,
                Some("burstable"),
                &uids[i],
                &"b".repeat(64),
            )
            .unwrap();
        }
        let emu = client_rt
            .block_on(KubeletEmulator::start(&plugins))
            .unwrap();
        let entries: Vec<node_files::Entry<'_>> = uids
            .iter()
            .zip(&ids)
            .map(|(uid, id)| node_files::Entry {
                pod_uid: uid,
                container: "server",
                resource: "nvidia.com/gpu-shared",
                device_ids: std::slice::from_ref(id),
            })
            .collect();
        node_files::write_checkpoint(&plugins.join("kubelet_internal_checkpoint"), &entries)
            .unwrap();
        let mut child = std::process::Command::new(bin)
            .args(["run", "--config"])
            .arg(dir.join("policy/config.yaml"))
            .arg("--device-plugin-path")
            .arg(&plugins)
            .arg("--simulate")
            .arg(&node)
            .arg("--proc-root")
            .arg(dir.join("host"))
            .arg("--pod-resources-socket")
            .arg(&socket)
            .env("SLICELET_LOG", "warn")
            .env("SLICELET_STATUS_ADDRESS", "127.0.0.1:0")
            .env_remove("SLICELET_SAMPLE_SECONDS")
            .spawn()
            .unwrap();
        client_rt
            .block_on(emu.wait_for(WAIT, |s| {
                s.device_count("nvidia.com/gpu-shared") == Some(32)
            }))
            .unwrap();
        let window = Duration::from_secs(if quick { 10 } else { 60 });
        let lists = pods.lists();
        let before = cpu_ticks(child.id());
        std::thread::sleep(window);
        let ticks = cpu_ticks(child.id()) - before;
        let reads = pods.lists() - lists;
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let pct = ticks as f64 * 10.0 / (window.as_secs_f64() * 1000.0) * 100.0;
        table.row(
            format!(
                "11. CPU over {} s sampling every 5 s, 2 pods attributed ({reads} pod-resources reads)",
                window.as_secs()
            ),
            format!("{pct:.3} % of one core ({ticks} ticks)"),
            "< 0.5 %",
            Some(pct < 0.5),
        );
    }

    let missed: Vec<&str> = table
        .0
        .iter()
        .filter(|r| r[3] == "MISSED")
        .map(|r| r[0].as_str())
        .collect();
    if !missed.is_empty() {
        println!("\nmissed goals: {}", missed.join("; "));
    }
}

/// The daemon binary the process rows (6, 7, 11) run: `SLICELET_BENCH_BIN` when set (the
/// release build, `cargo build --release`, as shipped), else the bench-profile build of this
/// run (`cargo bench` compiles the binary together with the dev-dependencies, whose features
/// make it larger than the shipped one).
fn daemon_binary() -> String {
    std::env::var("SLICELET_BENCH_BIN")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_slicelet").to_string())
}

/// Writes a policy the way the kubelet's atomic writer updates a ConfigMap volume: a new
/// `..<ts>` directory, a `..data_tmp` symlink renamed over `..data`, and `config.yaml ->
/// ..data/config.yaml`.
fn configmap_write(dir: &Path, generation: u32, text: &str) {
    let ts = format!("..2026_11_30_{generation:06}");
    std::fs::create_dir_all(dir.join(&ts)).unwrap();
    std::fs::write(dir.join(&ts).join("config.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if !dir.join("config.yaml").exists() {
        std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml")).unwrap();
    }
    if let Some(old) = old {
        if old != Path::new(&ts) {
            let _ = std::fs::remove_dir_all(dir.join(old));
        }
    }
}

/// Waits until the emulator sees the 32 `nvidia.com/gpu-shared` replicas of an 8-GPU ×4 node;
/// returns their IDs.
fn shared_ids(rt: &Runtime, emu: &KubeletEmulator) -> Vec<String> {
    let state = rt
        .block_on(emu.wait_for(WAIT, |s| {
            s.device_count("nvidia.com/gpu-shared") == Some(32)
        }))
        .unwrap();
    state.resources["nvidia.com/gpu-shared"]
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect()
}

/// The fake libnvidia-ml (a dev-dependency): it sits next to this benchmark binary in `deps/`.
fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libfake_nvml.so");
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

/// A fake NVML inventory of `gpus` H100s whose memory queries take `delay_ms`.
fn fake_nvml_inventory(gpus: u32, delay_ms: u64) -> String {
    let gpus: Vec<String> = (0..gpus)
        .map(|i| {
            format!(
                r#"{{"uuid": "GPU-{i:08x}-1111-2222-3333-444444444444", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "minor": {i}, "computeCapability": [9, 0], "pciBusId": "00000000:{:02x}:00.0"}}"#,
                0x10 + i
            )
        })
        .collect();
    format!(
        r#"{{"gpus": [{}], "delayMs": {{"nvmlDeviceGetMemoryInfo": {delay_ms}, "nvmlDeviceGetMemoryInfo_v2": {delay_ms}}}}}"#,
        gpus.join(", ")
    )
}

/// CPU time (user + system) of process `pid`, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is index 0, utime 11, stime 12.
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(11) + get(12)
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Deterministic Fisher-Yates (xorshift), so runs compare.
fn shuffle<T>(v: &mut [T]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}
