//! Shared helpers: a temp node (device-plugin dir, policy dir), the emulator, the daemon in
//! process, and ConfigMap-style policy writes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kubelet_emulator::{KubeletEmulator, State};
use slicelet::api;
use slicelet::daemon;
use slicelet::settings::Settings;
use slicelet::status::Status;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for any wait; generous because CI machines are shared and slow.
pub const WAIT: Duration = Duration::from_secs(20);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn node_file(name: &str) -> PathBuf {
    repo().join("config/nodes").join(name)
}

/// A test input under the repository's `fixtures/` (`models/gpu-models.yaml`,
/// `policies/ts-per-gpu.yaml`, …); see fixtures/README.md for where they came from.
pub fn fixture(rel: &str) -> PathBuf {
    repo().join("fixtures").join(rel)
}

/// Reads a test input, failing with its path named (not a bare `NotFound`).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading test input {}: {e}", path.display()))
}

/// Reads `fixtures/<rel>`, failing with its path named.
pub fn read_fixture(rel: &str) -> String {
    read(&fixture(rel))
}

/// A temp directory holding `plugins/` (the device-plugin dir) and `policy/config.yaml`.
pub struct Node {
    pub tmp: tempfile::TempDir,
}

impl Node {
    pub fn new(policy: &str) -> Node {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("plugins")).unwrap();
        std::fs::create_dir_all(tmp.path().join("policy")).unwrap();
        let node = Node { tmp };
        node.write_policy(policy);
        node
    }

    pub fn plugins(&self) -> PathBuf {
        self.tmp.path().join("plugins")
    }

    pub fn policy(&self) -> PathBuf {
        self.tmp.path().join("policy/config.yaml")
    }

    /// Replaces the policy the way the kubelet updates a ConfigMap volume ([`write_configmap`]).
    pub fn write_policy(&self, text: &str) {
        write_configmap(&self.tmp.path().join("policy"), &[("config.yaml", text)]);
    }

    /// Where this node's kubelet serves pod-resources (nobody, unless a test starts
    /// [`kubelet_emulator::pod_resources::PodResources`] there).
    pub fn pod_resources(&self) -> PathBuf {
        self.tmp.path().join("pod-resources/kubelet.sock")
    }

    pub fn settings(&self, simulate: &Path) -> Settings {
        let mut s = Settings::new(self.policy(), self.plugins());
        s.simulate = Some(simulate.to_path_buf());
        s.pod_resources_socket = Some(self.pod_resources());
        s
    }
}

/// Writes `keys` into `dir` as the kubelet's atomic writer updates a ConfigMap volume: a new
/// `..<timestamp>` directory with the files, a `..data_tmp` symlink renamed over `..data`, one
/// `key -> ..data/key` link per key, and the old directory removed.
pub fn write_configmap(dir: &Path, keys: &[(&str, &str)]) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static GENERATION: AtomicU32 = AtomicU32::new(0);
    std::fs::create_dir_all(dir).unwrap();
    let ts = format!(
        "..2026_11_30_09_00_00.{:09}",
        GENERATION.fetch_add(1, Ordering::Relaxed)
    );
    std::fs::create_dir(dir.join(&ts)).unwrap();
    for (k, v) in keys {
        std::fs::write(dir.join(&ts).join(k), v).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for (k, _) in keys {
        if std::fs::symlink_metadata(dir.join(k)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{k}"), dir.join(k)).unwrap();
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// The daemon running in this process.
pub struct Daemon {
    pub token: CancellationToken,
    pub handle: JoinHandle<Result<(), daemon::DaemonError>>,
    pub status: tokio::sync::watch::Receiver<Status>,
}

impl Daemon {
    pub fn start(settings: Settings) -> Daemon {
        let token = CancellationToken::new();
        let (tx, status) = tokio::sync::watch::channel(Status::default());
        let handle = tokio::spawn(daemon::run_with_status(settings, token.clone(), tx));
        Daemon {
            token,
            handle,
            status,
        }
    }

    /// Waits until the supervisor's status satisfies `pred`.
    pub async fn wait_status(&mut self, pred: impl FnMut(&Status) -> bool) -> Status {
        tokio::time::timeout(WAIT, self.status.wait_for(pred))
            .await
            .expect("timed out waiting for the daemon status")
            .expect("daemon gone")
            .clone()
    }

    /// SIGTERM equivalent: cancel and wait (bounded) for a clean exit.
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.handle)
            .await
            .expect("daemon must stop within 5 s")
            .expect("daemon task panicked")
            .expect("daemon returned an error");
    }
}

pub async fn emulator(node: &Node) -> KubeletEmulator {
    KubeletEmulator::start(&node.plugins()).await.unwrap()
}

/// Waits until every (resource, count) has a list of that many devices.
pub async fn wait_lists(emu: &KubeletEmulator, want: &[(&str, usize)]) -> State {
    emu.wait_for(WAIT, |s| {
        want.iter().all(|(r, n)| s.device_count(r) == Some(*n))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

pub fn ts_policy(replicas: u32) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: {replicas}\n"
    )
}

/// The simulated node's GPU UUIDs, by index.
pub fn uuids(node_file: &Path) -> Vec<String> {
    let (inv, _) = daemon::discover(&Settings {
        simulate: Some(node_file.to_path_buf()),
        ..Settings::new("/nonexistent", "/nonexistent")
    })
    .unwrap();
    inv.gpus.into_iter().map(|g| g.uuid).collect()
}

/// Allocate of `ids` for one container, as the kubelet calls it: the one container response,
/// or the gRPC status.
pub async fn allocate(
    emu: &KubeletEmulator,
    resource: &str,
    ids: &[String],
) -> Result<api::ContainerAllocateResponse, tonic::Status> {
    let mut client = emu.client(resource).await.unwrap();
    client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        })
        .await
        .map(|r| {
            let mut resp = r.into_inner();
            assert_eq!(resp.container_responses.len(), 1, "one container asked for");
            resp.container_responses.remove(0)
        })
}

/// The device IDs the kubelet emulator lists for resource `r`.
pub fn ids_of(state: &State, r: &str) -> Vec<String> {
    state.resources[r]
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect()
}

/// GetPreferredAllocation of `size` devices out of `available` for one container, as the
/// kubelet calls it: the IDs the plugin prefers.
pub async fn preferred(
    emu: &KubeletEmulator,
    resource: &str,
    available: Vec<String>,
    size: i32,
) -> Vec<String> {
    let mut client = emu.client(resource).await.unwrap();
    client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
        .await
        .unwrap()
        .into_inner()
        .container_responses
        .remove(0)
        .device_i_ds
}
