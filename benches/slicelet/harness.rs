//! The benchmark's shared harness: the results table, histograms and runtimes, the counting
//! allocator, the floor server and Allocate rounds, the nodes and policies the rows use, and
//! the daemon, ConfigMap, fake-NVML and /proc helpers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kubelet_emulator::KubeletEmulator;
use slicelet::api::{self, device_plugin_client::DevicePluginClient, device_plugin_server};
use slicelet::daemon;
use slicelet::inventory::Inventory;
use slicelet::plan::{self, Plan, ResourcePlan};
use slicelet::policy;
use tokio::runtime::Runtime;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// What every row runs with: the options, a scratch directory and the two runtimes.
pub struct Bench {
    /// `--quick`: fewer iterations.
    pub quick: bool,
    /// Iterations are divided by this (10 with `--quick`).
    pub scale: usize,
    /// Scratch directory, removed at the end.
    pub tmp: tempfile::TempDir,
    /// The runtime the daemons and servers run on.
    pub server_rt: Runtime,
    /// The runtime the clients run on.
    pub client_rt: Runtime,
}

/// The 2,688-device node (8 GPUs x 7 MIG slices x 48 replicas) rows 2-4 measure.
pub struct MigNode {
    /// [`MIG_POLICY`], parsed.
    pub policy: policy::Policy,
    /// [`MIG_NODE`], parsed.
    pub node: Inventory,
    /// The plan for them.
    pub plan: Plan,
    /// Its [`MIG_RESOURCE`].
    pub res: Arc<ResourcePlan>,
}

impl MigNode {
    /// Builds the node and its plan, checking it has 2,688 devices.
    pub fn new() -> Self {
        let big_policy = policy::parse(MIG_POLICY).unwrap();
        let big_node =
            slicelet::inventory::simulated::parse(Path::new("mig-node"), MIG_NODE).unwrap();
        let big = plan::build(&big_policy, &big_node).unwrap().plan;
        let big_res = big.resources[MIG_RESOURCE].clone();
        assert_eq!(big_res.devices.len(), 2688);
        MigNode {
            policy: big_policy,
            node: big_node,
            plan: big,
            res: big_res,
        }
    }
}

/// Counts heap allocations, for "plan build: allocations".
struct Counting;
pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
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

pub const WAIT: Duration = Duration::from_secs(30);

/// How long the RSS rows leave the daemon alone before they read its idle RSS: three times
/// `daemon::RESIDENCY_SETTLE` (the quiet time after which it lets go of its start-up pages).
pub const SETTLED: Duration = daemon::RESIDENCY_SETTLE.saturating_mul(3);

pub struct Table(pub Vec<[String; 4]>);

impl Table {
    pub fn row(
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

pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

/// The value at quantile `q` (0..=1) of a histogram of nanoseconds, in milliseconds.
pub fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e6
}

pub fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

pub fn runtime(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// 8× H100 80GB, each in MIG mode with 7× 1g.10gb: 56 MIG devices.
pub const MIG_NODE: &str = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 8\n    numaNode: 0\n    mig:\n      devices:\n        - profile: 1g.10gb\n          count: 7\n";

/// Every 1g.10gb slice time-sliced 48 ways: 8 × 7 × 48 = 2,688 devices.
pub const MIG_POLICY: &str = "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 48\n";

/// The resource of the 2,688-device node.
pub const MIG_RESOURCE: &str = "nvidia.com/mig-1g.10gb";

pub fn ts_policy(replicas: u32) -> String {
    format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: {replicas}\n")
}

pub fn sim_file(dir: &Path, gpus: u32) -> PathBuf {
    let p = dir.join(format!("node-{gpus}.yaml"));
    std::fs::write(&p, format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: {gpus}\n    numaNode: 0\n")).unwrap();
    p
}

/// The floor: a DevicePlugin that answers Allocate with a fixed response and does no work.
#[derive(Clone)]
pub struct Floor(pub Arc<api::AllocateResponse>);

#[tonic::async_trait]
impl device_plugin_server::DevicePlugin for Floor {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::device_plugin_options()))
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

pub async fn allocate_round(
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

/// The daemon binary the process rows (6, 7, 11) run: `SLICELET_BENCH_BIN` when set (the
/// release build, `cargo build --release`, as shipped), else the bench-profile build of this
/// run (`cargo bench` compiles the binary together with the dev-dependencies, whose features
/// make it larger than the shipped one).
pub fn daemon_binary() -> String {
    std::env::var("SLICELET_BENCH_BIN")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_slicelet").to_string())
}

/// Writes a policy the way the kubelet's atomic writer updates a ConfigMap volume: a new
/// `..<ts>` directory, a `..data_tmp` symlink renamed over `..data`, and `config.yaml ->
/// ..data/config.yaml`.
pub fn configmap_write(dir: &Path, generation: u32, text: &str) {
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
pub fn shared_ids(rt: &Runtime, emu: &KubeletEmulator) -> Vec<String> {
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
pub fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libfake_nvml.so");
    assert!(lib.exists(), "{} missing", lib.display());
    lib
}

/// A fake NVML inventory of `gpus` H100s whose memory queries take `delay_ms`.
pub fn fake_nvml_inventory(gpus: u32, delay_ms: u64) -> String {
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
pub fn cpu_ticks(pid: u32) -> u64 {
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

pub fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Deterministic Fisher-Yates (xorshift), so runs compare.
pub fn shuffle<T>(v: &mut [T]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}
