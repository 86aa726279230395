//! Dynamic MIG through the DRA plugin (`dra::spawn` with a MIG channel): the kubelet emulator
//! prepares and unprepares claims for dynamic MIG devices, and a fake hardware path answers
//! the plugin's MIG requests from a simulated H100 (its real create/destroy and state file),
//! logging each call, failing or holding answers on demand. No sleeps: every wait is on a
//! channel or on state, under a timeout.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kubelet_emulator::dra::{DraKubelet, HealthVersion, Version};
use kubelet_emulator::kube_api::{AllocatedDevice, KubeApi};
use serde_json::Value;
use slicelet::device_health::Cause;
use slicelet::dra::checkpoint::{self, MigInstance, MigRecord, MigRecordState};
use slicelet::dra::health_map::TrackedCause;
use slicelet::dra::mig::{MigClient, MigRequest};
use slicelet::dra::prepare::ClaimRef;
use slicelet::dra::{self, DraHandle, DraInput, DraSettings};
use slicelet::inventory::{simulated::SimulatedSource, GpuSource, Inventory, InventoryError};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::common::WAIT;

const NODE: &str = "node-1";
const DRIVER: &str = "gpu.slicelet.io";
const POLICY: &str =
    "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: [0]\n";
/// One H100 with MIG mode on and no instances.
const H100: &str = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig: {}\n";
const UID_A: &str = "aaaaaaaa-0000-0000-0000-00000000000a";
const UID_B: &str = "bbbbbbbb-0000-0000-0000-00000000000b";
const DEVICE: &str = "gpu-0-mig-3g-40gb-0";

/// The fake hardware: the simulated node's source, what was asked, and what to do instead.
#[derive(Default)]
struct Fake {
    calls: Vec<String>,
    /// Answer every destroy with this error.
    fail_destroy: Option<String>,
    /// Create, but keep the answer (a restart between create and answer).
    hold_create: bool,
    held: Vec<oneshot::Sender<Result<slicelet::inventory::CreatedMig, InventoryError>>>,
    /// Take a destroy's request but neither run it nor answer (a restart between unprepare's
    /// mark and the destroy).
    hold_destroy: bool,
    held_destroys: Vec<oneshot::Sender<Result<(), InventoryError>>>,
}

struct Harness {
    dir: tempfile::TempDir,
    api: KubeApi,
    inputs: watch::Sender<Option<Arc<DraInput>>>,
    stop: CancellationToken,
    handle: Option<DraHandle>,
    mig: MigClient,
    fake: Arc<Mutex<Fake>>,
    calls: watch::Receiver<usize>,
}

/// Serves `rx` from the simulated node at `node` as the daemon's hardware actor does, in
/// order, logging each call to `fake` and counting them on `count`.
fn serve(
    node: PathBuf,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<MigRequest>,
    fake: Arc<Mutex<Fake>>,
    count: watch::Sender<usize>,
) {
    tokio::spawn(async move {
        let mut source = SimulatedSource::new(node);
        while let Some(r) = rx.recv().await {
            let mut f = fake.lock().unwrap();
            match r {
                MigRequest::Create {
                    gpu_uuid,
                    profile,
                    start,
                    reply,
                } => {
                    f.calls.push(format!("create {profile}@{start}"));
                    let r = source.create_mig(&gpu_uuid, &profile, start);
                    if f.hold_create {
                        f.held.push(reply);
                    } else {
                        let _ = reply.send(r);
                    }
                }
                MigRequest::Destroy {
                    gpu_uuid,
                    gi_id,
                    ci_id,
                    reply,
                } => {
                    f.calls.push(format!("destroy gi {gi_id}"));
                    if f.hold_destroy {
                        f.held_destroys.push(reply);
                        count.send_replace(f.calls.len());
                        continue;
                    }
                    let r = match &f.fail_destroy {
                        Some(reason) => Err(InventoryError::MigDestroy {
                            uuid: gpu_uuid,
                            gi_id,
                            ci_id,
                            reason: reason.clone(),
                        }),
                        None => source.destroy_mig(&gpu_uuid, gi_id, ci_id),
                    };
                    let _ = reply.send(r);
                }
                MigRequest::Inventory { reply } => {
                    f.calls.push("inventory".into());
                    let _ = reply.send(source.discover().ok());
                }
            }
            count.send_replace(f.calls.len());
        }
    });
}

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("node.yaml"), H100).unwrap();
        let api = KubeApi::start(NODE, &[]).await;
        let (mig, rx) = MigClient::channel();
        let fake = Arc::new(Mutex::new(Fake::default()));
        let (count, calls) = watch::channel(0);
        serve(dir.path().join("node.yaml"), rx, Arc::clone(&fake), count);
        let (inputs, _) = watch::channel(None);
        let h = Harness {
            dir,
            api,
            inputs,
            stop: CancellationToken::new(),
            handle: None,
            mig,
            fake,
            calls,
        };
        h.inputs.send_replace(Some(h.input()));
        h
    }

    fn node(&self) -> PathBuf {
        self.dir.path().join("node.yaml")
    }

    fn discover(&self) -> Inventory {
        SimulatedSource::new(self.node()).discover().unwrap()
    }

    /// The plan of [`POLICY`] on the node as it is now, nothing held against any unit.
    fn input(&self) -> Arc<DraInput> {
        self.input_with(&|_| None)
    }

    /// [`Harness::input`] with the health tracker's conditions `tracked` (by GPU or MIG UUID).
    /// As the daemon plans: an instance the component created for a claim (its status's
    /// `dynamic_mig`, GPU UUID and first memory slice) is no static MIG device, so its placement
    /// stays a published dynamic device, while the health fold sees the whole inventory.
    fn input_with(&self, tracked: &TrackedCause<'_>) -> Arc<DraInput> {
        let inv = self.discover();
        let holds = self
            .handle
            .as_ref()
            .map(|h| h.status.borrow().dynamic_mig.clone())
            .unwrap_or_default();
        let mut planned = inv.clone();
        for g in &mut planned.gpus {
            let uuid = g.uuid.clone();
            g.mig_devices.retain(|m| {
                m.placement
                    .is_none_or(|p| !holds.contains(&(uuid.clone(), p.start)))
            });
        }
        let policy = slicelet::policy::parse(POLICY).unwrap();
        let plan = slicelet::plan::build(&policy, &planned).unwrap().plan;
        Arc::new(DraInput::new(
            Arc::new(plan),
            Arc::new(inv),
            policy.dra_xid_taint_effect,
            &slicelet::dra::Causes {
                of: &|_, _| None,
                tracked,
            },
            None,
            std::time::SystemTime::now(),
        ))
    }

    fn settings(&self) -> DraSettings {
        DraSettings {
            driver: DRIVER.to_string(),
            node: NODE.to_string(),
            registry_dir: self.dir.path().join("plugins_registry"),
            plugins_dir: self.dir.path().join("plugins"),
            cdi_dir: self.dir.path().join("cdi"),
            kubeconfig: Some(self.api.kubeconfig(self.dir.path())),
            dev_root: "/".to_string(),
            memory_hook: None,
        }
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.settings()
            .plugins_dir
            .join(DRIVER)
            .join(checkpoint::FILE)
    }

    fn records(&self) -> Vec<MigRecord> {
        checkpoint::load(&self.checkpoint_path())
            .unwrap()
            .dynamic_mig
    }

    fn calls(&self) -> Vec<String> {
        self.fake.lock().unwrap().calls.clone()
    }

    /// Starts the component and waits for its first publish (its start's reconcile is done
    /// and its sockets are bound then).
    async fn spawn(&mut self) {
        self.stop = CancellationToken::new();
        let h = dra::spawn(
            self.settings(),
            self.inputs.subscribe(),
            self.stop.clone(),
            Some(self.mig.clone()),
        );
        let mut status = h.status.clone();
        tokio::time::timeout(WAIT, status.wait_for(|s| s.reconciles >= 1))
            .await
            .expect("DRA never published")
            .unwrap();
        self.handle = Some(h);
    }

    async fn stop_component(&mut self) {
        self.stop.cancel();
        let h = self.handle.take().unwrap();
        tokio::time::timeout(WAIT, h.task)
            .await
            .expect("DRA did not stop")
            .unwrap()
            .unwrap();
    }

    /// A started component with claim A prepared on [`DEVICE`] through a registered kubelet,
    /// its answer checked (no error, that device).
    async fn with_claim_a() -> (Harness, DraKubelet) {
        let mut h = Harness::new().await;
        h.spawn().await;
        h.api.set_claim("ns", "a", UID_A, &[alloc(DEVICE)]);
        let k = h.kubelet().await;
        let r = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await.unwrap();
        assert_eq!(r[UID_A].error, "");
        assert_eq!(r[UID_A].devices[0].device, DEVICE);
        (h, k)
    }

    async fn kubelet(&self) -> DraKubelet {
        DraKubelet::register(&self.settings().registry_dir)
            .await
            .unwrap()
    }

    /// Waits until the fake hardware has answered `n` calls.
    async fn wait_calls(&mut self, n: usize) {
        tokio::time::timeout(WAIT, self.calls.wait_for(|c| *c >= n))
            .await
            .expect("the MIG calls never came")
            .unwrap();
    }

    fn spec_env(&self, uid: &str) -> Vec<String> {
        let file = self
            .settings()
            .cdi_dir
            .join(format!("{DRIVER}-claim_{uid}.json"));
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        spec["devices"][0]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn alloc(device: &str) -> AllocatedDevice {
    AllocatedDevice {
        request: "mig".to_string(),
        driver: DRIVER.to_string(),
        pool: NODE.to_string(),
        device: device.to_string(),
        ..AllocatedDevice::default()
    }
}

/// Unprepares claim A through `k`, the answer checked (no error).
async fn unprepare_a(k: &DraKubelet) {
    let un = k
        .unprepare(Version::V1, &[("ns", "a", UID_A)])
        .await
        .unwrap();
    assert_eq!(un[UID_A], "");
}

/// The MIG devices of GPU 0 as (UUID, placement start).
fn instances(inv: &Inventory) -> Vec<(String, u32)> {
    inv.gpus[0]
        .mig_devices
        .iter()
        .map(|m| (m.uuid.clone(), m.placement.map_or(u32::MAX, |p| p.start)))
        .collect()
}

#[tokio::test]
async fn a_claim_creates_its_mig_device_and_unprepare_destroys_it() {
    let (h, k) = Harness::with_claim_a().await;
    let made = instances(&h.discover());
    assert_eq!(made.len(), 1);
    let (uuid, start) = &made[0];
    assert_eq!(*start, 0);
    let env = h.spec_env(UID_A);
    for key in ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"] {
        assert!(env.contains(&format!("{key}={uuid}")), "{env:?}");
    }
    let records = h.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state, MigRecordState::Created);
    assert_eq!(records[0].instance.as_ref().unwrap().uuid, *uuid);
    let holds = h
        .handle
        .as_ref()
        .unwrap()
        .status
        .borrow()
        .dynamic_mig
        .clone();
    assert!(holds.contains(&(h.discover().gpus[0].uuid.clone(), 0)));
    // The kubelet calls again: the checkpointed answer, nothing created again.
    let again = k
        .prepare(Version::V1beta1, &[("ns", "a", UID_A)])
        .await
        .unwrap();
    assert_eq!(again[UID_A].error, "");
    assert_eq!(h.calls(), vec!["create 3g.40gb@0"]);
    unprepare_a(&k).await;
    assert!(instances(&h.discover()).is_empty());
    assert!(h.records().is_empty());
    assert_eq!(h.calls(), vec!["create 3g.40gb@0", "destroy gi 1"]);
}

/// The kubelet's health stream (`NodeWatchResources` on the DRA socket) carries an Xid on the
/// instance a claim created against that claim's device alone, and Healthy again once the
/// tracker holds nothing against it.
#[tokio::test]
async fn an_xid_on_a_created_instance_reaches_the_health_stream_for_its_device_only() {
    let (h, k) = Harness::with_claim_a().await;
    let (mig_uuid, _) = instances(&h.discover())[0].clone();
    let watch = k.watch_health(HealthVersion::V1).await.unwrap();
    let has = |m: &[kubelet_emulator::dra::DeviceHealth], health: &str| {
        m.iter().any(|d| d.device == DEVICE && d.health == health)
    };
    let (_, first) = watch
        .wait_message(0, WAIT, |m| has(m, "Healthy"))
        .await
        .unwrap();
    assert!(first.iter().all(|d| d.health == "Healthy"), "{first:?}");
    let published = first.len();
    assert!(published > 1, "every placement of the GPU: {first:?}");

    let reason = format!("Xid 94 on {mig_uuid}");
    let sick = h.input_with(&|uuid| (uuid == mig_uuid).then(|| (Cause::Xid(94), reason.clone())));
    h.inputs.send_replace(Some(sick));
    let (at, sick) = watch
        .wait_message(0, WAIT, |m| has(m, "Unhealthy"))
        .await
        .unwrap();
    let unhealthy: Vec<(&str, &str)> = sick
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| (d.device.as_str(), d.message.as_str()))
        .collect();
    assert_eq!(unhealthy, [(DEVICE, reason.as_str())]);
    assert_eq!(sick.len(), published, "the others still reported");

    h.inputs.send_replace(Some(h.input()));
    let (_, well) = watch
        .wait_message(at + 1, WAIT, |m| has(m, "Healthy"))
        .await
        .unwrap();
    assert!(well.iter().all(|d| d.health == "Healthy"), "{well:?}");
}

#[tokio::test]
async fn a_failed_create_is_the_claims_error_with_the_drivers_reason() {
    let mut h = Harness::new().await;
    h.spawn().await;
    // Someone made an instance over slices 0-3 after the plan was published.
    let g0 = h.discover().gpus[0].uuid.clone();
    SimulatedSource::new(h.node())
        .create_mig(&g0, "1g.10gb", 2)
        .unwrap();
    h.api.set_claim("ns", "a", UID_A, &[alloc(DEVICE)]);
    let k = h.kubelet().await;
    let r = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await.unwrap();
    let e = &r[UID_A].error;
    assert!(e.contains("creating MIG device gpu-0-mig-3g-40gb-0"), "{e}");
    assert!(e.contains("Insufficient Resources"), "{e}");
    assert!(r[UID_A].devices.is_empty());
    assert!(h.records().is_empty(), "the intent is removed");
    assert!(h
        .handle
        .as_ref()
        .unwrap()
        .status
        .borrow()
        .dynamic_mig
        .is_empty());
}

#[tokio::test]
async fn a_destroy_refused_while_in_use_is_retried_by_the_next_unprepare() {
    let (h, k) = Harness::with_claim_a().await;
    h.fake.lock().unwrap().fail_destroy = Some("In use by another client".into());
    let un = k
        .unprepare(Version::V1, &[("ns", "a", UID_A)])
        .await
        .unwrap();
    assert!(
        un[UID_A].contains("In use by another client"),
        "{}",
        un[UID_A]
    );
    assert_eq!(h.records()[0].state, MigRecordState::Destroying);
    assert_eq!(instances(&h.discover()).len(), 1);
    h.fake.lock().unwrap().fail_destroy = None;
    unprepare_a(&k).await;
    assert!(instances(&h.discover()).is_empty());
    assert!(h.records().is_empty());
}

/// A restart between the create and its answer: the instance is there, the checkpoint says
/// `creating`. The restarted plugin adopts it (not destroyed, not made again), and the
/// kubelet's retried prepare gets it.
#[tokio::test]
async fn a_restart_between_create_and_answer_adopts_the_instance() {
    let mut h = Harness::new().await;
    h.spawn().await;
    h.api.set_claim("ns", "a", UID_A, &[alloc(DEVICE)]);
    h.fake.lock().unwrap().hold_create = true;
    let k = h.kubelet().await;
    let pending = tokio::spawn(async move {
        let _ = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await;
    });
    h.wait_calls(1).await;
    pending.abort();
    h.stop_component().await;
    let made = instances(&h.discover());
    assert_eq!(made.len(), 1, "the create ran");
    h.fake.lock().unwrap().hold_create = false;
    h.spawn().await;
    let records = h.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].state, MigRecordState::Created);
    assert_eq!(records[0].instance.as_ref().unwrap().uuid, made[0].0);
    let k = h.kubelet().await;
    let r = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await.unwrap();
    assert_eq!(r[UID_A].error, "");
    assert!(h
        .spec_env(UID_A)
        .contains(&format!("NVIDIA_VISIBLE_DEVICES={}", made[0].0)));
    assert_eq!(h.calls(), vec!["create 3g.40gb@0", "inventory"]);
    assert_eq!(instances(&h.discover()), made);
}

/// A restart between unprepare's mark and its destroy: the `destroying` record's instance is
/// destroyed once at start; an instance no record names is left alone, and an intent whose
/// create never happened is dropped.
#[tokio::test]
async fn a_restart_destroys_a_destroying_record_once_and_nothing_else() {
    let mut h = Harness::new().await;
    let inv = h.discover();
    let g0 = inv.gpus[0].uuid.clone();
    let mut source = SimulatedSource::new(h.node());
    let ours = source.create_mig(&g0, "3g.40gb", 0).unwrap().device;
    let theirs = source.create_mig(&g0, "1g.10gb", 4).unwrap().device;
    let record = |uid: &str, start: u32, state, instance: Option<MigInstance>| MigRecord {
        claim: ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: uid.into(),
        },
        device: format!("gpu-0-mig-3g-40gb-{start}"),
        gpu_uuid: g0.clone(),
        profile: "3g.40gb".into(),
        start,
        size: 4,
        state,
        instance,
    };
    let mut c = checkpoint::Checkpoint::new();
    c.dynamic_mig = vec![
        record(
            UID_A,
            0,
            MigRecordState::Destroying,
            Some(MigInstance {
                gi_id: ours.gi_id,
                ci_id: ours.ci_id,
                uuid: ours.uuid.clone(),
            }),
        ),
        record(UID_B, 4, MigRecordState::Creating, None),
    ];
    write_checkpoint(&h.checkpoint_path(), &c);
    h.spawn().await;
    assert_eq!(h.calls(), vec!["inventory", "destroy gi 1"]);
    let left = instances(&h.discover());
    assert_eq!(left, vec![(theirs.uuid.clone(), 4)]);
    assert!(h.records().is_empty());
    // Started again: nothing more to do, nothing asked.
    h.stop_component().await;
    h.spawn().await;
    assert_eq!(h.calls(), vec!["inventory", "destroy gi 1"]);
    assert_eq!(instances(&h.discover()), left);
}

/// A restart between unprepare's mark and the destroy it asked for: the instance still
/// exists and the checkpoint says `destroying`, so the restarted plugin destroys it before it
/// serves (the kubelet's retried unprepare then finds nothing to do), and another claim's
/// instance is left alone. With the mark saved only after the destroy, the record would
/// still read `created` and the instance would outlive its claim's unprepare.
#[tokio::test]
async fn a_restart_between_unprepare_and_destroy_destroys_the_instance_at_start() {
    let mut h = Harness::new().await;
    h.spawn().await;
    h.api.set_claim("ns", "a", UID_A, &[alloc(DEVICE)]);
    h.api
        .set_claim("ns", "b", UID_B, &[alloc("gpu-0-mig-1g-10gb-6")]);
    let k = h.kubelet().await;
    let r = k
        .prepare(Version::V1, &[("ns", "a", UID_A), ("ns", "b", UID_B)])
        .await
        .unwrap();
    assert_eq!((r[UID_A].error.as_str(), r[UID_B].error.as_str()), ("", ""));
    let made = instances(&h.discover());
    assert_eq!(made.len(), 2, "{made:?}");
    let b_instance = made.iter().find(|(_, start)| *start == 6).unwrap().clone();
    let calls = h.calls().len();
    h.fake.lock().unwrap().hold_destroy = true;
    let pending = tokio::spawn(async move {
        let _ = k.unprepare(Version::V1, &[("ns", "a", UID_A)]).await;
    });
    h.wait_calls(calls + 1).await;
    pending.abort();
    h.stop_component().await;
    assert_eq!(instances(&h.discover()).len(), 2, "the destroy never ran");
    h.fake.lock().unwrap().hold_destroy = false;
    h.spawn().await;
    assert_eq!(instances(&h.discover()), vec![b_instance]);
    let records = h.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].claim.uid, UID_B);
    unprepare_a(&h.kubelet().await).await;
    assert_eq!(instances(&h.discover()).len(), 1);
}

/// The checkpoint lost (deleted, say, by a node's disk cleanup) while claim A's MIG device
/// exists: the restarted plugin rebuilds A from the API and records the instance at A's
/// placement as A's (so the daemon keeps it off the static MIG devices: it is in the status's
/// `dynamic_mig`), destroys nothing at start, and A's unprepare destroys it. Without the
/// record the instance would outlive its claim and be offered to the next pod as a static
/// device while A's container still used it.
#[tokio::test]
async fn a_lost_checkpoint_keeps_a_claims_mig_device_recorded_and_unprepare_destroys_it() {
    let (mut h, k) = Harness::with_claim_a().await;
    drop(k);
    h.api.reserve_claim("ns", "a", &[("pa", "pod-uid-a")]);
    let made = instances(&h.discover());
    assert_eq!(made.len(), 1, "{made:?}");
    h.stop_component().await;
    std::fs::remove_file(h.checkpoint_path()).unwrap();
    let calls = h.calls().len();
    h.spawn().await;
    let records = h.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].claim.uid, UID_A);
    assert_eq!(records[0].state, MigRecordState::Created);
    assert_eq!(records[0].instance.as_ref().unwrap().uuid, made[0].0);
    let g0 = h.discover().gpus[0].uuid.clone();
    let status = h.handle.as_ref().unwrap().status.borrow().clone();
    assert!(
        status.dynamic_mig.contains(&(g0, made[0].1)),
        "{:?}",
        status.dynamic_mig
    );
    assert_eq!(
        h.calls()[calls..],
        ["inventory"],
        "nothing destroyed at start"
    );
    assert_eq!(instances(&h.discover()), made);
    unprepare_a(&h.kubelet().await).await;
    assert!(
        instances(&h.discover()).is_empty(),
        "destroyed at unprepare"
    );
    assert!(h.records().is_empty());
}

fn write_checkpoint(path: &Path, c: &checkpoint::Checkpoint) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    checkpoint::save(path, c).unwrap();
}
