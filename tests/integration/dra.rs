//! DRA through real sockets and the real `kube` client: `dra::spawn` against the Kubernetes
//! API emulator (ResourceSlices, ResourceClaims) and the DRA kubelet emulator (registration,
//! NodePrepareResources / NodeUnprepareResources in v1 and v1beta1).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kubelet_emulator::dra::{Answer, DraKubelet, Version};
use kubelet_emulator::kube_api::{AllocatedDevice, KubeApi};
use serde_json::Value;
use slicelet::device_health::Cause;
use slicelet::dra::{self, DraHandle, DraInput, DraSettings};
use slicelet::inventory::{simulated, Inventory};
use slicelet::plan;
use slicelet::plan::dra_names::device_name;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::common::{node_file, WAIT};

pub(crate) const NODE: &str = "node-1";
pub(crate) const DRIVER: &str = "gpu.slicelet.io";

/// The done-when policy: GPUs 0-3 time-sliced x4 and every MIG profile, all through DRA.
const DONE_WHEN: &str = "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        dra: true\n";

/// `--dra` for the whole daemon on `node`: the driver's directories under the node's temp
/// dir (`plugins_registry/`, `dra-plugins/`, `cdi/`) and the API emulator's kubeconfig.
pub(crate) fn daemon_dra(node: &crate::common::Node, api: &KubeApi) -> DraSettings {
    DraSettings {
        driver: DRIVER.to_string(),
        node: NODE.to_string(),
        registry_dir: node.tmp.path().join("plugins_registry"),
        plugins_dir: node.tmp.path().join("dra-plugins"),
        cdi_dir: node.tmp.path().join("cdi"),
        kubeconfig: Some(api.kubeconfig(node.tmp.path())),
        dev_root: "/".to_string(),
        memory_hook: None,
    }
}

fn inventory(node: &str) -> Inventory {
    let path = node_file(node);
    simulated::parse(&path, &crate::common::read(&path)).unwrap()
}

fn input_of(policy: &str, inv: &Inventory) -> Arc<DraInput> {
    input_with(
        policy,
        inv,
        None,
        Cause::Xid(79),
        std::time::SystemTime::now(),
    )
}

/// The input for `policy` on `inv`: every Unhealthy device for `cause`, its health folded over
/// `prev`'s at `now`.
fn input_with(
    policy: &str,
    inv: &Inventory,
    prev: Option<&DraInput>,
    cause: Cause,
    now: std::time::SystemTime,
) -> Arc<DraInput> {
    let policy = slicelet::policy::parse(policy).unwrap();
    let built = plan::build(&policy, inv).unwrap();
    let mut inventory = inv.clone();
    inventory.driver_version = Some("550.54.15".to_string());
    Arc::new(DraInput::new(
        Arc::new(built.plan),
        Arc::new(inventory),
        policy.dra_xid_taint_effect,
        &slicelet::dra::Causes {
            of: &|_, _| Some((cause, cause.label())),
            tracked: &|_| Some((cause, cause.label())),
        },
        prev,
        now,
    ))
}

struct Dra {
    dir: tempfile::TempDir,
    /// `--cdi-output-dir` (default `<dir>/cdi`).
    cdi: Option<PathBuf>,
    api: KubeApi,
    inputs: watch::Sender<Option<Arc<DraInput>>>,
    stop: CancellationToken,
    handle: Option<DraHandle>,
}

impl Dra {
    async fn start(input: Arc<DraInput>) -> Dra {
        let dir = tempfile::tempdir().unwrap();
        let api = KubeApi::start(NODE, &[]).await;
        let (inputs, _) = watch::channel(Some(input));
        let mut d = Dra {
            dir,
            cdi: None,
            api,
            inputs,
            stop: CancellationToken::new(),
            handle: None,
        };
        d.spawn().await;
        d
    }

    fn settings(&self) -> DraSettings {
        DraSettings {
            driver: DRIVER.to_string(),
            node: NODE.to_string(),
            registry_dir: self.dir.path().join("plugins_registry"),
            plugins_dir: self.dir.path().join("plugins"),
            cdi_dir: self
                .cdi
                .clone()
                .unwrap_or_else(|| self.dir.path().join("cdi")),
            kubeconfig: Some(self.api.kubeconfig(self.dir.path())),
            dev_root: "/".to_string(),
            memory_hook: None,
        }
    }

    /// Starts the component and waits for its first publish (its sockets are bound then).
    async fn spawn(&mut self) {
        self.stop = CancellationToken::new();
        let h = dra::spawn(
            self.settings(),
            self.inputs.subscribe(),
            self.stop.clone(),
            None,
        );
        let mut status = h.status.clone();
        tokio::time::timeout(WAIT, status.wait_for(|s| s.reconciles >= 1))
            .await
            .expect("DRA never published")
            .unwrap();
        self.handle = Some(h);
    }

    async fn restart(&mut self) {
        self.stop_component().await;
        self.spawn().await;
    }

    /// Stops the component and waits until its sockets are gone.
    async fn stop_component(&mut self) {
        self.stop.cancel();
        let h = self.handle.take().unwrap();
        tokio::time::timeout(WAIT, h.task)
            .await
            .expect("DRA did not stop")
            .unwrap()
            .unwrap();
        assert!(!self
            .settings()
            .registry_dir
            .join("gpu.slicelet.io-reg.sock")
            .exists());
    }

    async fn kubelet(&self) -> DraKubelet {
        DraKubelet::register(&self.settings().registry_dir)
            .await
            .unwrap()
    }

    fn cdi_dir(&self) -> PathBuf {
        self.settings().cdi_dir
    }

    /// Waits until the API holds slices of generation `gen` (or newer) with `devices` devices.
    async fn wait_slices(&self, min_gen: i64, devices: usize) -> Vec<ResourceSlice> {
        let v = self
            .api
            .wait_slices(|s| {
                let slices = parse(s);
                !slices.is_empty()
                    && slices.iter().all(|x| x.spec.pool.generation >= min_gen)
                    && count(&slices) == devices
            })
            .await;
        parse(&v)
    }
}

impl Drop for Dra {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn parse(v: &[Value]) -> Vec<ResourceSlice> {
    v.iter()
        .map(|x| serde_json::from_value(x.clone()).unwrap())
        .collect()
}

fn count(slices: &[ResourceSlice]) -> usize {
    slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum()
}

fn names(slices: &[ResourceSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect()
}

fn check_shape(slices: &[ResourceSlice]) {
    let n = slices.len() as i64;
    let gens: std::collections::BTreeSet<i64> =
        slices.iter().map(|s| s.spec.pool.generation).collect();
    assert_eq!(gens.len(), 1, "one generation: {gens:?}");
    for s in slices {
        assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
        assert_eq!(s.spec.driver, DRIVER);
        assert_eq!(s.spec.pool.name, NODE);
        assert_eq!(s.spec.pool.resource_slice_count, n);
        // 64, not 128: Unhealthy devices are published with taints (the API server's limit
        // for slices whose devices have taints).
        assert!(s.spec.devices.as_ref().map_or(0, Vec::len) <= 64);
    }
}

fn alloc(request: &str, pool: &str, device: &str) -> AllocatedDevice {
    AllocatedDevice {
        request: request.to_string(),
        driver: DRIVER.to_string(),
        pool: pool.to_string(),
        device: device.to_string(),
        ..AllocatedDevice::default()
    }
}

const TS4: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        dra: true\n";

/// (case, policy, node file, devices, slices)
#[tokio::test]
async fn slices_for_whole_time_sliced_mps_and_mig_nodes() {
    let cases: [(&str, &str, &str, usize, usize); 5] = [
        ("whole", "version: v1\ndra:\n  resources: [nvidia.com/gpu]\n", "h100-80gb-x8.yaml", 8, 1),
        ("time-sliced", TS4, "h100-80gb-x8.yaml", 32, 1),
        ("time-sliced x20", &TS4.replace("replicas: 4", "replicas: 20"), "h100-80gb-x8.yaml", 160, 3),
        ("mps", "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        dra: true\n", "h100-80gb-x8.yaml", 32, 1),
        // The MIG devices' counter sets take a slice of their own.
        ("mig mixed", DONE_WHEN, "h100-80gb-x8-ts-mig-mixed.yaml", 16 + 16, 2),
    ];
    for (name, policy, node, devices, want_slices) in cases {
        let inv = inventory(node);
        let d = Dra::start(input_of(policy, &inv)).await;
        let slices = d.wait_slices(1, devices).await;
        check_shape(&slices);
        assert_eq!(slices.len(), want_slices, "{name}");
        let selectors = d.api.selectors();
        assert!(
            selectors.contains(&format!("spec.nodeName={NODE},spec.driver={DRIVER}")),
            "{name}: {selectors:?}"
        );
    }
}

#[tokio::test]
async fn a_policy_change_bumps_the_generation_and_taints_unhealthy_devices() {
    let mut inv = inventory("h100-80gb-x8.yaml");
    let d = Dra::start(input_of(TS4, &inv)).await;
    let first = d.wait_slices(1, 32).await;
    let g1 = first[0].spec.pool.generation;
    // The same plan again: reconciled, nothing rewritten, same generation.
    let writes = d.api.counters().slice_writes;
    let mut status = d.handle.as_ref().unwrap().status.clone();
    let done = status.borrow_and_update().reconciles;
    d.inputs.send_replace(Some(input_of(TS4, &inv)));
    let s = tokio::time::timeout(WAIT, status.wait_for(|s| s.reconciles > done))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!(s.generation, g1);
    assert_eq!(s.devices, 32);
    assert_eq!(d.api.counters().slice_writes, writes, "nothing rewritten");
    // A policy change: replicas 2 → a newer generation, 16 devices.
    d.inputs.send_replace(Some(input_of(
        &TS4.replace("replicas: 4", "replicas: 2"),
        &inv,
    )));
    let second = d.wait_slices(g1 + 1, 16).await;
    check_shape(&second);
    // GPU 3 Unhealthy: its two replicas tainted (not withdrawn); the one slice rewritten with
    // its generation kept (every device keeps its name).
    inv.gpus[3].health = slicelet::device_health::Health::Unhealthy;
    d.inputs.send_replace(Some(input_of(
        &TS4.replace("replicas: 4", "replicas: 2"),
        &inv,
    )));
    let third = parse(&d.api.wait_slices(|s| tainted(&parse(s)).len() == 2).await);
    assert_eq!(
        third[0].spec.pool.generation,
        second[0].spec.pool.generation
    );
    let u3 = &inv.gpus[3].uuid;
    assert_eq!(
        tainted(&third),
        [0, 1].map(|n| (device_name(&format!("{u3}::{n}")), "xid-79".to_string()))
    );
    // Growing over 64 devices adds slices (64 each: taints are in use); shrinking deletes
    // them again.
    d.inputs.send_replace(Some(input_of(
        &TS4.replace("replicas: 4", "replicas: 20"),
        &inv,
    )));
    let big = d.wait_slices(1, 160).await;
    assert_eq!(big.len(), 3);
    check_shape(&big);
    d.inputs.send_replace(Some(input_of(TS4, &inv)));
    let small = d.wait_slices(1, 32).await;
    assert_eq!(small.len(), 1, "the extra slices are deleted");
    check_shape(&small);
}

/// What a change costs the API server on a node of two slices (8 GPUs x 16 replicas, 128
/// devices): the publisher keeps the API server's answers to its writes, so no change after
/// the first publish lists the slices again, and a taint coming or going on one GPU (its 16
/// replicas are in the first slice) is one write, the pool's generation kept, as Kubernetes'
/// own resourceslice controller does it (devices changing their names still get a new
/// generation, every slice rewritten). A registration lists again (the kubelet may have
/// wiped the slices), and a slice somebody else deleted is found at the next write and
/// written again at once.
#[tokio::test]
async fn a_taint_is_one_slice_write_and_no_change_lists_again() {
    let mut inv = inventory("h100-80gb-x8.yaml");
    let ts16 = TS4.replace("replicas: 4", "replicas: 16");
    let d = Dra::start(input_of(&ts16, &inv)).await;
    let first = d.wait_slices(1, 128).await;
    assert_eq!(first.len(), 2);
    let g = first[0].spec.pool.generation;
    let before = d.api.counters();
    // A start with no claim of this node (the checkpoint rebuilt from the claims' list) lists
    // the slices once, for the publisher, from the API server's watch cache (not a quorum
    // read: on an etcd without consistent reads from the cache, 1,000 nodes starting together
    // grew etcd to 15 GiB in the fleet bench and the kernel killed it).
    assert_eq!(before.slice_lists, 1);
    assert_eq!(
        d.api.slice_list_versions(),
        [(Some("0".to_string()), Some("NotOlderThan".to_string()))]
    );
    let gpu0: Vec<(String, String)> = (0..16)
        .map(|n| {
            let id = format!("{}::{n}", inv.gpus[0].uuid);
            (device_name(&id), "xid-79".to_string())
        })
        .collect();
    // GPU 0 Unhealthy, then Healthy again: one write each (the first taint's dry run aside),
    // the generation kept, nothing listed.
    inv.gpus[0].health = slicelet::device_health::Health::Unhealthy;
    d.inputs.send_replace(Some(input_of(&ts16, &inv)));
    let sick = parse(&d.api.wait_slices(|s| tainted(&parse(s)).len() == 16).await);
    assert_eq!(tainted(&sick), gpu0);
    assert!(
        sick.iter().all(|s| s.spec.pool.generation == g),
        "generation kept"
    );
    inv.gpus[0].health = slicelet::device_health::Health::Healthy;
    d.inputs.send_replace(Some(input_of(&ts16, &inv)));
    let well = parse(
        &d.api
            .wait_slices(|s| !parse(s).is_empty() && tainted(&parse(s)).is_empty())
            .await,
    );
    assert!(
        well.iter().all(|s| s.spec.pool.generation == g),
        "generation kept"
    );
    let c = d.api.counters();
    assert_eq!(
        c.slice_lists, before.slice_lists,
        "no LIST after the first publish"
    );
    // Stored writes: the emulator counts a dry run apart (it stores nothing).
    let writes: Vec<String> = d
        .api
        .slice_writes()
        .iter()
        .skip(2)
        .map(|w| {
            w["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(
        writes,
        ["node-1-gpu-slicelet-io-0", "node-1-gpu-slicelet-io-0"],
        "one write of the first slice per event"
    );
    // Devices renamed (16 -> 8 replicas, 64 devices in one slice): a new generation, still
    // without a LIST.
    d.inputs.send_replace(Some(input_of(
        &TS4.replace("replicas: 4", "replicas: 8"),
        &inv,
    )));
    let smaller = d.wait_slices(g + 1, 64).await;
    assert_eq!(smaller.len(), 1);
    assert_eq!(d.api.counters().slice_lists, before.slice_lists);
    // Somebody else deletes the slice: the next change finds it gone (404) and lists again
    // at once, and the slice is back.
    d.api.delete_node_slices(NODE);
    d.inputs.send_replace(Some(input_of(&ts16, &inv)));
    d.wait_slices(g + 2, 128).await;
    assert_eq!(d.api.counters().slice_lists, before.slice_lists + 1);
    // A registration (its GetInfo and its status, each a reason to publish) lists again.
    let _k = d.kubelet().await;
    d.api
        .wait(|c| c.slice_lists >= before.slice_lists + 2)
        .await;
}

/// The tainted devices of `slices` (name, taint value), in order.
fn tainted(slices: &[ResourceSlice]) -> Vec<(String, String)> {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .flat_map(|d| {
            d.taints
                .iter()
                .flatten()
                .map(|t| (d.name.clone(), t.value.clone().unwrap_or_default()))
        })
        .collect()
}

/// A starting kubelet deletes its node's slices once it can read its Node object, retried
/// with backoff: on a slow start that is after the plugin registered again and the slices
/// were published. The watch of the node's slices sees the deletion, and the publisher lists
/// and writes them again with no plan change and no registration; a slice another writer
/// replaces is written back the same way. Each counts in `republished`.
#[tokio::test]
async fn slices_somebody_else_deletes_or_rewrites_are_published_again() {
    let inv = inventory("h100-80gb-x8.yaml");
    let d = Dra::start(input_of(TS4, &inv)).await;
    let first = d.wait_slices(1, 32).await;
    d.api.wait(|c| c.slice_watches >= 1).await;
    let lists = d.api.counters().slice_lists;
    let mut status = d.handle.as_ref().unwrap().status.clone();
    assert_eq!(status.borrow().republished, 0);

    d.api.delete_node_slices(NODE);
    let back = d.wait_slices(1, 32).await;
    check_shape(&back);
    assert_eq!(back[0].spec.devices, first[0].spec.devices);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.republished == 1))
        .await
        .expect("the deletion was never counted")
        .unwrap();
    assert_eq!(
        d.api.counters().slice_lists,
        lists + 1,
        "one LIST per drift"
    );

    // Another writer empties the slice: written back.
    let mut rewritten = d.api.slices()[0].clone();
    rewritten["spec"]["devices"] = serde_json::json!([]);
    d.api.put_slice(rewritten);
    let back = d.wait_slices(1, 32).await;
    assert_eq!(back[0].spec.devices, first[0].spec.devices);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.republished == 2))
        .await
        .expect("the rewrite was never counted")
        .unwrap();

    // The API server goes away (the watch fails) and the slices are deleted meanwhile: no
    // event says so. The watch's LIST when the API server is back shows them gone, which
    // disagrees with the publisher's copies for longer than the window: published again.
    d.api.set_unavailable(true);
    tokio::time::timeout(WAIT, status.wait_for(|s| s.slice_watch_error.is_some()))
        .await
        .expect("the failing watch was never shown")
        .unwrap();
    d.api.delete_node_slices(NODE);
    d.api.set_unavailable(false);
    let back = d.wait_slices(1, 32).await;
    assert_eq!(back[0].spec.devices, first[0].spec.devices);
    let s = tokio::time::timeout(WAIT, status.wait_for(|s| s.republished == 3))
        .await
        .expect("the deletion behind the outage was never counted")
        .unwrap()
        .clone();
    assert_eq!(s.slice_watch_error, None, "the watch answers again");
}

#[tokio::test]
async fn republishes_after_the_kubelet_wipes_slices_and_after_api_errors() {
    let inv = inventory("h100-80gb-x8.yaml");
    let d = Dra::start(input_of(TS4, &inv)).await;
    d.wait_slices(1, 32).await;
    // A leftover of a predecessor with a newer generation: the next publish (on the next
    // registration) goes above it and deletes it.
    let mut leftover = d.api.slices()[0].clone();
    leftover["metadata"]["name"] = "node-1-gpu-slicelet-io-9".into();
    leftover["spec"]["pool"]["generation"] = 7.into();
    d.api.put_slice(leftover);
    let _k = d.kubelet().await;
    let above = d
        .api
        .wait_slices(|s| {
            let s = parse(s);
            s.len() == 1 && s[0].spec.pool.generation == 8
        })
        .await;
    check_shape(&parse(&above));
    // The kubelet starts: wipes the node's slices, then registers the plugin again.
    d.api.delete_node_slices(NODE);
    assert!(d.api.slices().is_empty());
    let _k = d.kubelet().await;
    let back = d.wait_slices(8, 32).await;
    check_shape(&back);
    // The API down while the plan changes: retried with backoff until it answers.
    d.api.set_unavailable(true);
    d.inputs.send_replace(Some(input_of(
        &TS4.replace("replicas: 4", "replicas: 3"),
        &inv,
    )));
    d.api.wait(|c| c.refused >= 1).await;
    d.api.set_unavailable(false);
    let after = d.wait_slices(1, 24).await;
    check_shape(&after);
}

fn spec_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

const UID_A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
const UID_B: &str = "bbbbbbbb-0000-0000-0000-000000000002";

#[tokio::test]
async fn done_when_slices_match_the_plan_and_two_replicas_prepare_gpu_0_once() {
    let inv = inventory("h100-80gb-x8-ts-mig-mixed.yaml");
    let mut d = Dra::start(input_of(DONE_WHEN, &inv)).await;
    let slices = d.wait_slices(1, 32).await;
    check_shape(&slices);
    // One to one with `slicelet plan`: every device of the plan, by its name, in order.
    let policy = d.dir.path().join("policy.yaml");
    std::fs::write(&policy, DONE_WHEN).unwrap();
    let out = crate::binary::output(&[
        "plan",
        "--config",
        policy.to_str().unwrap(),
        "--simulate",
        node_file("h100-80gb-x8-ts-mig-mixed.yaml")
            .to_str()
            .unwrap(),
        "--output",
        "json",
    ])
    .await;
    assert!(out.status.success(), "{}", crate::binary::text(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut want: Vec<(String, String, String)> = Vec::new();
    for r in view["resources"].as_array().unwrap() {
        assert_eq!(r["dra"], true, "every resource is DRA's here: {r}");
        for dev in r["devices"].as_array().unwrap() {
            let id = dev["id"].as_str().unwrap();
            want.push((
                device_name(id),
                r["name"].as_str().unwrap().to_string(),
                dev["gpu"].as_str().unwrap().to_string(),
            ));
        }
    }
    let got: Vec<(String, String, String)> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|dev| {
            let a = dev.attributes.as_ref().unwrap();
            (
                dev.name.clone(),
                a["resource"].string.clone().unwrap(),
                a["uuid"].string.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, want);

    // A claim allocated two replicas of GPU 0.
    let g0 = inv.gpus[0].uuid.clone();
    let r0 = device_name(&format!("{g0}::0"));
    let r1 = device_name(&format!("{g0}::1"));
    d.api.set_claim(
        "ns",
        "two",
        UID_A,
        &[alloc("gpu", NODE, &r0), alloc("gpu", NODE, &r1)],
    );
    let k = d.kubelet().await;
    assert_eq!(k.info.name, DRIVER);
    assert_eq!(
        k.info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    assert_eq!(
        k.info.endpoint,
        d.settings()
            .plugins_dir
            .join(DRIVER)
            .join("dra.sock")
            .to_string_lossy()
    );
    let claim = [("ns", "two", UID_A)];
    let first = k.prepare(Version::V1, &claim).await.unwrap();
    let a = &first[UID_A];
    assert_eq!(a.error, "");
    let names: Vec<&str> = a.devices.iter().map(|x| x.device.as_str()).collect();
    assert_eq!(names, [r0.as_str(), r1.as_str()]);
    assert_eq!(
        a.devices[0].cdi_ids,
        [format!("gpu.slicelet.io/claim={UID_A}")]
    );
    assert!(a
        .devices
        .iter()
        .all(|x| x.pool == NODE && x.requests == ["gpu"]));
    // The CDI spec names GPU 0 once per variable, and no other GPU.
    let file = d
        .cdi_dir()
        .join(format!("gpu.slicelet.io-claim_{UID_A}.json"));
    let spec: Value = serde_json::from_str(&crate::common::read(&file)).unwrap();
    assert_eq!(spec["kind"], "gpu.slicelet.io/claim");
    assert_eq!(spec["devices"][0]["name"], UID_A);
    let env: Vec<&str> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        env,
        [
            format!("CUDA_VISIBLE_DEVICES={g0}"),
            format!("NVIDIA_VISIBLE_DEVICES={g0}")
        ]
    );
    // Repeated, in both versions: the same answers.
    assert_eq!(k.prepare(Version::V1, &claim).await.unwrap(), first);
    assert_eq!(k.prepare(Version::V1beta1, &claim).await.unwrap(), first);
    // Across a restart of the DRA component: the checkpoint answers the kubelet's repeat.
    d.restart().await;
    let k = d.kubelet().await;
    assert_eq!(k.prepare(Version::V1beta1, &claim).await.unwrap(), first);
    // Unprepare removes the spec; twice is fine.
    for v in [Version::V1, Version::V1beta1] {
        let un = k.unprepare(v, &claim).await.unwrap();
        assert_eq!(un[UID_A], "", "{v:?}");
        assert!(!file.exists());
    }
    assert!(spec_files(&d.cdi_dir()).is_empty());
}

#[tokio::test]
async fn prepare_refuses_other_pools_unknown_unhealthy_and_held_devices() {
    let mut inv = inventory("h100-80gb-x8.yaml");
    inv.gpus[1].health = slicelet::device_health::Health::Unhealthy;
    let mut d = Dra::start(input_of(TS4, &inv)).await;
    // GPU 1's replicas are published tainted; a claim that tolerates the taint and gets one
    // is still refused (a device slicelet holds Unhealthy is never prepared).
    assert_eq!(tainted(&d.wait_slices(1, 32).await).len(), 4);
    let (g0, g1) = (inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone());
    let r0 = device_name(&format!("{g0}::0"));
    let cases = [
        (
            "other-pool",
            "cccccccc-0000-0000-0000-000000000001",
            alloc("gpu", "node-2", &r0),
            "is in pool node-2, not this node's pool node-1",
        ),
        (
            "unknown",
            "cccccccc-0000-0000-0000-000000000002",
            alloc("gpu", NODE, "gpu-nope"),
            "device gpu-nope is not a device",
        ),
        (
            "unhealthy",
            "cccccccc-0000-0000-0000-000000000003",
            alloc("gpu", NODE, &device_name(&format!("{g1}::2"))),
            "is Unhealthy",
        ),
    ];
    let k = d.kubelet().await;
    for (name, uid, dev, msg) in &cases {
        d.api.set_claim("ns", name, uid, std::slice::from_ref(dev));
        for v in [Version::V1, Version::V1beta1] {
            let r = k.prepare(v, &[("ns", name, uid)]).await.unwrap();
            assert!(r[*uid].error.contains(msg), "{name} {v:?}: {:?}", r[*uid]);
            assert!(r[*uid].devices.is_empty());
        }
    }
    // A name that would leave the claims' API path: refused before any request.
    let gets = d.api.counters().claim_gets;
    let r = k
        .prepare(
            Version::V1,
            &[("ns", "../../../api/v1/nodes/node-1", UID_B)],
        )
        .await
        .unwrap();
    assert!(
        r[UID_B].error.contains("not a Kubernetes namespace"),
        "{:?}",
        r[UID_B]
    );
    assert_eq!(d.api.counters().claim_gets, gets);
    // A claim the API does not have, and one whose UID differs.
    let r = k
        .prepare(Version::V1, &[("ns", "missing", UID_B)])
        .await
        .unwrap();
    assert!(r[UID_B].error.contains("not found"), "{:?}", r[UID_B]);
    d.api.set_claim(
        "ns",
        "recreated",
        "dddddddd-0000-0000-0000-000000000009",
        &[alloc("gpu", NODE, &r0)],
    );
    let r = k
        .prepare(Version::V1, &[("ns", "recreated", UID_B)])
        .await
        .unwrap();
    assert!(
        r[UID_B].error.contains("has UID dddddddd"),
        "{:?}",
        r[UID_B]
    );

    // Held: A prepares replica 0; B asks for it too (and for replica 1) and is refused.
    d.api
        .set_claim("ns", "a", UID_A, &[alloc("gpu", NODE, &r0)]);
    d.api.set_claim(
        "ns",
        "b",
        UID_B,
        &[
            alloc("gpu", NODE, &device_name(&format!("{g0}::1"))),
            alloc("gpu", NODE, &r0),
        ],
    );
    let both = k
        .prepare(Version::V1, &[("ns", "a", UID_A), ("ns", "b", UID_B)])
        .await
        .unwrap();
    assert_eq!(both[UID_A].error, "");
    assert!(
        both[UID_B].error.contains("is held by prepared claim ns/a"),
        "{:?}",
        both[UID_B]
    );
    // Still held after a restart (the checkpoint).
    d.restart().await;
    let k = d.kubelet().await;
    let r = k
        .prepare(Version::V1beta1, &[("ns", "b", UID_B)])
        .await
        .unwrap();
    assert!(
        r[UID_B].error.contains("is held by prepared claim ns/a"),
        "{:?}",
        r[UID_B]
    );
    // A is deleted from the API; unprepare still succeeds and frees the device for B.
    d.api.delete_claim("ns", "a");
    let un = k
        .unprepare(Version::V1, &[("ns", "a", UID_A)])
        .await
        .unwrap();
    assert_eq!(un[UID_A], "");
    let r = k.prepare(Version::V1, &[("ns", "b", UID_B)]).await.unwrap();
    assert_eq!(r[UID_B].error, "", "{:?}", r[UID_B]);
    let b_devices: Vec<&str> = r[UID_B].devices.iter().map(|x| x.device.as_str()).collect();
    assert_eq!(b_devices.len(), 2);
    // Only B's spec is left.
    assert_eq!(
        spec_files(&d.cdi_dir()),
        [format!("gpu.slicelet.io-claim_{UID_B}.json")]
    );
    let _: &Answer = &r[UID_B];
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = crate::common::read(path);
    text.split("\n---")
        .filter_map(|d| yaml_serde::from_str::<Value>(d).ok())
        .filter(|v| !v.is_null())
        .collect()
}

/// The overlay's DeviceClasses select what slicelet publishes: the driver, the `type` and
/// `sharing` values the slices carry, one class per MIG profile the chart lists too.
#[test]
fn device_classes_select_published_attributes() {
    use slicelet::dra::slices::sharing;
    use slicelet::plan::Strategy;
    let docs = yaml_docs(&crate::common::repo().join("manifests/overlays/dra/deviceclasses.yaml"));
    let sharings: Vec<&str> = [Strategy::None, Strategy::TimeSlicing, Strategy::Mps]
        .into_iter()
        .map(sharing)
        .collect();
    let mut profiles = Vec::new();
    for d in &docs {
        assert_eq!(d["kind"], "DeviceClass");
        let name = d["metadata"]["name"].as_str().unwrap();
        let expr = d["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        assert!(
            expr.starts_with(&format!("device.driver == \"{DRIVER}\"")),
            "{name}: {expr}"
        );
        for (key, allowed) in [("sharing", sharings.clone()), ("type", vec!["gpu", "mig"])] {
            let pat = format!("device.attributes[\"{DRIVER}\"].{key} == \"");
            for part in expr.split(&pat).skip(1) {
                let value = part.split('"').next().unwrap();
                assert!(allowed.contains(&value), "{name}: {key} {value}");
            }
        }
        if let Some(p) = name
            .strip_prefix("mig-")
            .and_then(|n| n.strip_suffix(&format!(".{DRIVER}")))
        {
            slicelet::inventory::mig::Profile::parse(p).unwrap();
            assert!(
                expr.ends_with(&format!(".profile == \"{p}\"")),
                "{name}: {expr}"
            );
            profiles.push(p.to_string());
        }
    }
    assert!(docs.len() >= 4 + 20, "{} classes", docs.len());
    let values: Value = yaml_serde::from_str(&crate::common::read(
        &crate::common::repo().join("deployments/helm/slicelet/values.yaml"),
    ))
    .unwrap();
    let chart: Vec<String> = values["dra"]["migProfiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        profiles, chart,
        "the overlay and the chart class the same profiles"
    );
}

/// What one conjunct of a DeviceClass selector gives for a device, as CEL evaluates it:
/// reading an attribute the device lacks is an error (the scheduler then fails the whole
/// allocation, it does not skip the device).
fn cel_term(term: &str, d: &k8s_openapi::api::resource::v1::Device) -> Result<bool, String> {
    let attrs = format!("device.attributes[\"{DRIVER}\"].");
    let attr = |name: &str| d.attributes.as_ref().and_then(|a| a.get(name));
    let term = term.trim();
    if let Some(v) = term.strip_prefix("device.driver == ") {
        return Ok(v.trim_matches('"') == DRIVER);
    }
    if let Some(name) = term
        .strip_prefix(&format!("has({attrs}"))
        .and_then(|t| t.strip_suffix(')'))
    {
        return Ok(attr(name).is_some());
    }
    let (name, value) = term
        .strip_prefix(&attrs)
        .and_then(|t| t.split_once(" == "))
        .unwrap_or_else(|| panic!("a selector term this test cannot read: {term}"));
    match attr(name).map(|a| a.string.as_deref()) {
        None => Err(format!("no such key: {name}")),
        Some(None) => Err(format!("{name} is no string")),
        Some(Some(s)) => Ok(s == value.trim_matches('"')),
    }
}

/// A selector of `&&`-joined terms, with CEL's `&&`: false if any term is false, else an
/// error if any is one, else true.
fn cel_selects(expr: &str, d: &k8s_openapi::api::resource::v1::Device) -> Result<bool, String> {
    let results: Vec<Result<bool, String>> = expr.split(" && ").map(|t| cel_term(t, d)).collect();
    if results.iter().any(|r| r == &Ok(false)) {
        return Ok(false);
    }
    results
        .into_iter()
        .collect::<Result<Vec<bool>, String>>()
        .map(|_| true)
}

/// The overlay's DeviceClasses on a pool of static devices (time-sliced replicas, a MIG
/// device) and dynamic MIG devices: no selector errors on any device; each dynamic device is
/// selected by `mig.<driver>` and its profile's class, and by no class of static devices
/// (whole GPUs, replicas, the bridge's).
#[test]
fn device_classes_select_dynamic_mig_devices_and_never_error() {
    use slicelet::dra::slices;
    let repo = crate::common::repo();
    let mut classes = yaml_docs(&repo.join("manifests/overlays/dra/deviceclasses.yaml"));
    classes.extend(yaml_docs(
        &repo.join("manifests/overlays/dra-bridge/bridge-deviceclass.yaml"),
    ));
    let gpu = "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n";
    let inv = simulated::parse(
        Path::new("classes"),
        &format!("gpus:\n{gpu}{gpu}    mig:\n      devices:\n        - profile: 3g.40gb\n          placementStart: 4\n"),
    )
    .unwrap();
    let policy = slicelet::policy::parse(
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 2\n        dra: true\ndra:\n  resources: [nvidia.com/mig-3g.40gb]\n  dynamicMig:\n    devices: [1]\n",
    )
    .unwrap();
    let plan = plan::build(&policy, &inv).unwrap().plan;
    let params = slices::SliceParams {
        node: "node-1".to_string(),
        driver: DRIVER.to_string(),
        generation: 1,
        driver_version: None,
        unhealthy: slices::Unhealthy::default(),
    };
    let built = slices::build_pool(
        slices::dra_resources(&plan),
        &plan.dynamic_mig,
        &inv,
        &params,
        &dra::health_map::HealthMap::new(),
    );
    let devices: Vec<_> = built
        .slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    let dynamic = devices
        .iter()
        .filter(|d| d.name.starts_with("gpu-1-mig-"))
        .count();
    assert_eq!((devices.len() - dynamic, dynamic), (3, 14));
    let mut by_profile_class = 0;
    for d in &devices {
        let profile = d
            .attributes
            .as_ref()
            .unwrap()
            .get("profile")
            .and_then(|a| a.string.clone());
        let is_dynamic = d.name.starts_with("gpu-1-mig-");
        for c in &classes {
            let name = c["metadata"]["name"].as_str().unwrap();
            let expr = c["spec"]["selectors"][0]["cel"]["expression"]
                .as_str()
                .unwrap();
            let selected = cel_selects(expr, d)
                .unwrap_or_else(|e| panic!("class {name} on device {}: CEL error {e}", d.name));
            if !is_dynamic {
                continue;
            }
            let want = name == format!("mig.{DRIVER}")
                || Some(name.to_string()) == profile.as_ref().map(|p| format!("mig-{p}.{DRIVER}"));
            assert_eq!(selected, want, "class {name} on dynamic device {}", d.name);
            by_profile_class += usize::from(selected && name.starts_with("mig-"));
        }
    }
    // Every dynamic profile but 1g.10gb+me (no class: `+` makes no name) has its class.
    assert_eq!(by_profile_class, dynamic - 4);
}

/// The overlay's RBAC grants what the publisher and the plugin call, and the admission policy
/// binds slice writes to the token's node.
#[test]
fn dra_rbac_and_admission_policy() {
    let docs = yaml_docs(&crate::common::repo().join("manifests/overlays/dra/rbac.yaml"));
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let verbs = |res: &str| -> Vec<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"].as_array().unwrap().iter().any(|x| x == res))
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
            })
            .collect()
    };
    for v in ["list", "create", "update", "delete"] {
        assert!(verbs("resourceslices").contains(&v.to_string()), "{v}");
    }
    assert_eq!(verbs("resourceclaims"), ["get", "list"]);
    let vap = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy")
        .unwrap();
    let text = vap.to_string();
    assert!(text.contains("authentication.kubernetes.io/node-name"));
    assert!(text.contains("system:serviceaccount:slicelet-system:slicelet"));
    assert_eq!(vap["spec"]["failurePolicy"], "Fail");
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .unwrap();
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
}

/// The whole daemon with `--dra`: GPUs 0–3 time-sliced ×4 through DRA, GPUs 4–7 whole through
/// the device plugin. The kubelet's device manager never sees the DRA resource, the API
/// emulator holds exactly its 16 replicas as slices, and `/readyz` is ready without the DRA
/// resource registering with the device plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_each_resource_through_exactly_one_path() {
    use crate::common::{emulator, uuids, wait_lists, Daemon, Node};
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n";
    let node = Node::new(policy);
    let sim = node_file("h100-80gb-x8.yaml");
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let mut d = Daemon::start(settings);
    let state = wait_lists(&emu, &[("nvidia.com/gpu", 4)]).await;
    let slices = parse(&api.wait_slices(|s| count(&parse(s)) == 16).await);
    check_shape(&slices);
    let uuids = uuids(&sim);
    let published: Vec<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|dev| dev.name.clone())
        .collect();
    for g in &uuids[..4] {
        for n in 0..4 {
            assert!(
                published.contains(&device_name(&format!("{g}::{n}"))),
                "{g}::{n}"
            );
        }
    }
    // The device plugin serves GPUs 4–7 whole, and nothing of GPUs 0–3.
    let whole = crate::common::ids_of(&state, "nvidia.com/gpu");
    assert_eq!(whole, uuids[4..].to_vec());
    assert!(!state.resources.contains_key("nvidia.com/gpu-dra"));
    let s = d.wait_status(|s| s.ready().is_ok()).await;
    assert!(
        !s.resources.contains("nvidia.com/gpu-dra"),
        "{:?}",
        s.resources
    );
    // Registrations with the device plugin happen before ready; none ever named it.
    assert!(emu
        .wait_for(WAIT, |st| st.resources.contains_key("nvidia.com/gpu"))
        .await
        .is_ok());
    assert_eq!(emu.register_calls("nvidia.com/gpu-dra"), 0);
    d.stop().await;
}

/// A checkpoint entry's spec file is never trusted as a path: a tampered `../` entry is
/// dropped at load, and unprepare removes only the file the claim's UID names inside
/// `--cdi-output-dir` (it removed the `../` target before).
#[tokio::test]
async fn a_tampered_checkpoint_path_never_leaves_the_cdi_dir() {
    let inv = inventory("h100-80gb-x8.yaml");
    let mut d = Dra::start(input_of(TS4, &inv)).await;
    d.wait_slices(1, 32).await;
    let g0 = inv.gpus[0].uuid.clone();
    d.api.set_claim(
        "ns",
        "one",
        UID_A,
        &[alloc("gpu", NODE, &device_name(&format!("{g0}::0")))],
    );
    let claim = [("ns", "one", UID_A)];
    let k = d.kubelet().await;
    assert_eq!(
        k.prepare(Version::V1, &claim).await.unwrap()[UID_A].error,
        ""
    );
    d.stop_component().await;
    let checkpoint = d
        .settings()
        .plugins_dir
        .join(DRIVER)
        .join("checkpoint.json");
    let mut c: Value = serde_json::from_str(&crate::common::read(&checkpoint)).unwrap();
    c["claims"][UID_A]["spec_file"] = Value::from("../outside.json");
    std::fs::write(&checkpoint, serde_json::to_vec(&c).unwrap()).unwrap();
    let outside = d.dir.path().join("outside.json");
    std::fs::write(&outside, "not slicelet's").unwrap();
    d.spawn().await;
    let k = d.kubelet().await;
    for v in [Version::V1, Version::V1beta1] {
        assert_eq!(k.unprepare(v, &claim).await.unwrap()[UID_A], "", "{v:?}");
    }
    assert!(
        outside.exists(),
        "unprepare removed a file outside the CDI directory"
    );
    assert!(spec_files(&d.cdi_dir()).is_empty());
}

/// Unprepare of a claim that was never prepared succeeds without touching the CDI directory,
/// even where that directory cannot be written (here: under a regular file, so every unlink
/// fails with ENOTDIR, as a read-only CDI overlay fails with EROFS); it failed forever before,
/// so the kubelet's unprepare never completed.
#[tokio::test]
async fn unprepare_of_a_never_prepared_claim_needs_no_writable_cdi_dir() {
    let inv = inventory("h100-80gb-x8.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut d = Dra::start(input_of(TS4, &inv)).await;
    d.stop_component().await;
    d.cdi = Some(file.join("cdi"));
    d.spawn().await;
    let k = d.kubelet().await;
    for v in [Version::V1, Version::V1beta1] {
        let un = k.unprepare(v, &[("ns", "never", UID_B)]).await.unwrap();
        assert_eq!(un[UID_B], "", "{v:?}");
    }
    // DRA serves, and says at start that it cannot prepare claims (a readiness failure).
    let mut status = d.handle.as_ref().unwrap().status.clone();
    let down = tokio::time::timeout(WAIT, status.wait_for(|s| s.down.is_some()))
        .await
        .expect("DRA never said its CDI directory cannot be written")
        .unwrap()
        .down
        .clone();
    assert!(
        down.as_deref()
            .is_some_and(|e| e.contains("--cdi-output-dir") && e.contains("cannot be written")),
        "{down:?}"
    );
}

/// A DRA start failure is visible and recovers by itself: the registration socket still held
/// by a live process (the previous pod during a rollout) keeps DRA down, `/readyz` says why
/// while the device plugin serves on, and once the socket is free DRA serves and is ready
/// (it stayed down silently, `/readyz` 200, until SIGTERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_start_failure_is_shown_and_retried_until_it_serves() {
    use crate::common::{emulator, wait_lists, Daemon, Node};
    let policy = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n";
    let node = Node::new(policy);
    let sim = node_file("h100-80gb-x8.yaml");
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let registry = node.tmp.path().join("plugins_registry");
    std::fs::create_dir_all(&registry).unwrap();
    let held =
        std::os::unix::net::UnixListener::bind(registry.join("gpu.slicelet.io-reg.sock")).unwrap();
    let mut settings = node.settings(&sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let mut d = Daemon::start(settings);
    wait_lists(&emu, &[("nvidia.com/gpu", 4)]).await;
    let s = d.wait_status(|s| s.dra_down.is_some()).await;
    let reason = s.ready().unwrap_err().to_string();
    assert!(
        reason.contains("DRA not serving") && reason.contains("served by another live process"),
        "{reason}"
    );
    drop(held);
    let s = d
        .wait_status(|s| s.dra_down.is_none() && s.ready().is_ok())
        .await;
    assert!(s.ready().is_ok());
    // DRA registers with a kubelet now.
    let k = DraKubelet::register(&registry).await.unwrap();
    assert_eq!(k.info.name, DRIVER);
    d.stop().await;
}

/// A checkpoint that cannot be read (here a directory in its place) is set aside for
/// inspection, the record rebuilt from the API (no claim allocated: empty) and DRA serves (it
/// never started).
#[tokio::test]
async fn an_unreadable_checkpoint_is_set_aside_and_dra_serves() {
    let inv = inventory("h100-80gb-x8.yaml");
    let mut d = Dra::start(input_of(TS4, &inv)).await;
    d.stop_component().await;
    let driver_dir = d.settings().plugins_dir.join(DRIVER);
    let checkpoint = driver_dir.join("checkpoint.json");
    let _ = std::fs::remove_file(&checkpoint);
    std::fs::create_dir_all(checkpoint.join("not-a-file")).unwrap();
    d.spawn().await;
    let k = d.kubelet().await;
    assert_eq!(k.info.name, DRIVER);
    let aside: Vec<String> = std::fs::read_dir(&driver_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
}

/// A corrupt checkpoint while the API is down: DRA stays down (retried) and the file stays
/// where it is; once the API answers, the record is rebuilt from the claims allocated from this
/// node: claim `ns/a` holds GPU 0's replica 0 (claim `ns/b` is refused it), and the kubelet's
/// prepare of `ns/a` prepares it afresh, with the answer and CDI spec it had.
#[tokio::test]
async fn a_rebuilt_record_holds_its_devices_and_an_api_outage_keeps_the_file() {
    let inv = inventory("h100-80gb-x8.yaml");
    let mut d = Dra::start(input_of(TS4, &inv)).await;
    d.wait_slices(1, 32).await;
    let g0 = inv.gpus[0].uuid.clone();
    let r0 = device_name(&format!("{g0}::0"));
    d.api
        .set_claim("ns", "a", UID_A, &[alloc("gpu", NODE, &r0)]);
    d.api.reserve_claim("ns", "a", &[("pa", "pod-uid-a")]);
    let k = d.kubelet().await;
    let first = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await.unwrap();
    assert_eq!(first[UID_A].error, "");
    let spec = d
        .cdi_dir()
        .join(format!("gpu.slicelet.io-claim_{UID_A}.json"));
    let spec_text = crate::common::read(&spec);
    d.stop_component().await;
    let checkpoint = d
        .settings()
        .plugins_dir
        .join(DRIVER)
        .join("checkpoint.json");
    std::fs::write(&checkpoint, "{").unwrap();
    std::fs::remove_file(&spec).unwrap();
    d.api.set_unavailable(true);
    d.stop = CancellationToken::new();
    let h = dra::spawn(d.settings(), d.inputs.subscribe(), d.stop.clone(), None);
    let mut status = h.status.clone();
    d.handle = Some(h);
    let down = tokio::time::timeout(WAIT, status.wait_for(|s| s.down.is_some()))
        .await
        .expect("DRA never said it is down")
        .unwrap()
        .down
        .clone()
        .unwrap();
    assert!(
        down.contains("checkpoint.json") && down.contains("resourceclaims"),
        "{down}"
    );
    assert_eq!(crate::common::read(&checkpoint), "{");
    d.api.set_unavailable(false);
    let prepared = tokio::time::timeout(
        WAIT,
        status.wait_for(|s| s.prepared.as_ref().is_some_and(|p| p.contains_key(&r0))),
    )
    .await
    .expect("the record was never rebuilt")
    .unwrap()
    .prepared
    .clone()
    .unwrap();
    assert_eq!(prepared[&r0][0].pod, "claim:a");
    let record: Value = serde_json::from_str(&crate::common::read(&checkpoint)).unwrap();
    assert_eq!(record["claims"][UID_A]["rebuilt"], true);
    let k = d.kubelet().await;
    d.api
        .set_claim("ns", "b", UID_B, &[alloc("gpu", NODE, &r0)]);
    let b = k.prepare(Version::V1, &[("ns", "b", UID_B)]).await.unwrap();
    assert!(
        b[UID_B].error.contains("is held by prepared claim ns/a"),
        "{:?}",
        b[UID_B]
    );
    let again = k.prepare(Version::V1, &[("ns", "a", UID_A)]).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(crate::common::read(&spec), spec_text);
    let record: Value = serde_json::from_str(&crate::common::read(&checkpoint)).unwrap();
    assert!(record["claims"][UID_A].get("rebuilt").is_none(), "{record}");
}

/// One holder across a restart, on a kubelet whose pod-resources reports no claims (before
/// 1.34): a claim prepared on GPU 0 through DRA; slicelet stops; the policy drops `dra`;
/// slicelet starts again. The DRA checkpoint, read before the first plan, still holds GPU 0,
/// so the resource stays on DRA and the device plugin never advertises GPU 0 (it did, Healthy,
/// while the claim's container ran). Once the claim is unprepared the resource moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_drops_dra_keeps_a_claimed_gpu_off_the_device_plugin() {
    use crate::common::{emulator, uuids, Daemon, Node};
    let with_dra = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0]\n        replicas: 2\n        dra: true\n";
    let without = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0]\n        replicas: 2\n";
    let node = Node::new(with_dra);
    let sim = node_file("h100-80gb-x8.yaml");
    let g0 = uuids(&sim)[0].clone();
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let registry = node.tmp.path().join("plugins_registry");
    let mut settings = node.settings(&sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let mut d = Daemon::start(settings.clone());
    d.wait_status(|s| s.ready().is_ok() && s.dra_serving).await;
    api.wait_slices(|s| count(&parse(s)) == 2).await;
    let r0 = device_name(&format!("{g0}::0"));
    api.set_claim("ns", "one", UID_A, &[alloc("gpu", NODE, &r0)]);
    let k = DraKubelet::register(&registry).await.unwrap();
    let claim = [("ns", "one", UID_A)];
    assert_eq!(
        k.prepare(Version::V1, &claim).await.unwrap()[UID_A].error,
        ""
    );
    d.stop().await;

    node.write_policy(without);
    // First with DRA failing before it loads its checkpoint (no API credentials at node
    // boot): the holders read from the file at start stay (an empty "prepared" from the
    // failed DRA wiped them, and the device plugin served GPU 0).
    let mut broken = settings.clone();
    if let Some(dra) = broken.dra.as_mut() {
        dra.kubeconfig = Some(node.tmp.path().join("missing-kubeconfig"));
    }
    let mut d = Daemon::start(broken);
    let s = d
        .wait_status(|s| s.generation > 0 && s.dra_down.is_some())
        .await;
    assert!(
        !s.resources.contains("nvidia.com/gpu-dra"),
        "the device plugin serves GPU 0 while a claim holds it (DRA down): {:?}",
        s.resources
    );
    d.stop().await;
    let mut d = Daemon::start(settings);
    let s = d
        .wait_status(|s| s.generation > 0 && s.dra_serving && s.dra_down.is_none())
        .await;
    assert!(
        !s.resources.contains("nvidia.com/gpu-dra"),
        "the device plugin serves GPU 0 while a claim holds it: {:?}",
        s.resources
    );
    assert_eq!(emu.state().device_count("nvidia.com/gpu-dra"), None);
    // The claim ends: the resource moves to the device plugin.
    let k = DraKubelet::register(&registry).await.unwrap();
    assert_eq!(k.unprepare(Version::V1, &claim).await.unwrap()[UID_A], "");
    crate::common::wait_lists(&emu, &[("nvidia.com/gpu-dra", 2)]).await;
    d.stop().await;
}

/// The two policies of the record tests: GPU 0 time-sliced x2 through DRA, then the same
/// entry on the device plugin.
const GPU0_DRA: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0]\n        replicas: 2\n        dra: true\n";
const GPU0_DP: &str = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0]\n        replicas: 2\n";

/// A node whose claim `ns/one` (UID_A, reserved for pod `p1`) was prepared on GPU 0's replica 0
/// through DRA; slicelet stopped, and the policy now puts GPU 0 on the device plugin.
struct Claimed {
    node: crate::common::Node,
    api: KubeApi,
    emu: kubelet_emulator::KubeletEmulator,
    settings: slicelet::settings::Settings,
    checkpoint: PathBuf,
    registry: PathBuf,
}

async fn claimed_gpu0() -> Claimed {
    use crate::common::{emulator, uuids, Daemon, Node};
    let node = Node::new(GPU0_DRA);
    let sim = node_file("h100-80gb-x8.yaml");
    let g0 = uuids(&sim)[0].clone();
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let registry = node.tmp.path().join("plugins_registry");
    let mut settings = node.settings(&sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let checkpoint = node
        .tmp
        .path()
        .join("dra-plugins")
        .join(DRIVER)
        .join("checkpoint.json");
    let mut d = Daemon::start(settings.clone());
    d.wait_status(|s| s.ready().is_ok() && s.dra_serving).await;
    api.wait_slices(|s| count(&parse(s)) == 2).await;
    let r0 = device_name(&format!("{g0}::0"));
    api.set_claim("ns", "one", UID_A, &[alloc("gpu", NODE, &r0)]);
    api.reserve_claim("ns", "one", &[("p1", "pod-uid-1")]);
    let k = DraKubelet::register(&registry).await.unwrap();
    let claim = [("ns", "one", UID_A)];
    assert_eq!(
        k.prepare(Version::V1, &claim).await.unwrap()[UID_A].error,
        ""
    );
    d.stop().await;
    node.write_policy(GPU0_DP);
    Claimed {
        node,
        api,
        emu,
        settings,
        checkpoint,
        registry,
    }
}

/// Whether the device plugin ever offered a replica of GPU 0 (the only devices of
/// `nvidia.com/gpu-dra`) Healthy, in every list the kubelet emulator recorded.
fn gpu0_ever_offered(emu: &kubelet_emulator::KubeletEmulator) -> bool {
    emu.lists("nvidia.com/gpu-dra")
        .iter()
        .any(|l| kubelet_emulator::healthy(&l.devices) > 0)
}

/// A checkpoint emptied (a crash, a full disk) is set aside and the record rebuilt from the
/// API's allocated claims before the first plan, and written back: the device plugin never
/// offers GPU 0 while claim `ns/one` holds it (the kubelet does not prepare it again); once
/// the claim is unprepared, GPU 0 goes to the device plugin. Stale temporaries of the
/// checkpoint's writer are removed at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_checkpoint_is_rebuilt_from_the_api_and_gpu_0_keeps_one_holder() {
    use crate::common::Daemon;
    let c = claimed_gpu0().await;
    std::fs::write(&c.checkpoint, "").unwrap();
    let stale = c.checkpoint.with_file_name(".checkpoint.json.Xy12ab.tmp");
    std::fs::write(&stale, "{\"version\": 1, \"cla").unwrap();
    let mut d = Daemon::start(c.settings.clone());
    let s = d
        .wait_status(|s| s.generation > 0 && s.dra_serving && s.dra_down.is_none())
        .await;
    assert!(
        !s.resources.contains("nvidia.com/gpu-dra"),
        "the device plugin serves GPU 0 while claim ns/one holds it: {:?}",
        s.resources
    );
    assert!(
        !gpu0_ever_offered(&c.emu),
        "GPU 0 offered by the device plugin while claimed"
    );
    assert!(c.api.counters().claim_lists >= 1);
    // Rebuilt and written back; the emptied file set aside; the stale temporary gone.
    let record: Value = serde_json::from_str(&crate::common::read(&c.checkpoint)).unwrap();
    assert_eq!(record["claims"][UID_A]["rebuilt"], true, "{record}");
    assert_eq!(record["claims"][UID_A]["pods"][0]["uid"], "pod-uid-1");
    let dir = c.checkpoint.parent().unwrap();
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!stale.exists(), "{names:?}");
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("checkpoint.json.corrupt-"))
            .count(),
        1,
        "{names:?}"
    );
    // The claim ends: unprepared, GPU 0 moves to the device plugin.
    let k = DraKubelet::register(&c.registry).await.unwrap();
    assert_eq!(
        k.unprepare(Version::V1, &[("ns", "one", UID_A)])
            .await
            .unwrap()[UID_A],
        ""
    );
    crate::common::wait_lists(&c.emu, &[("nvidia.com/gpu-dra", 2)]).await;
    let record: Value = serde_json::from_str(&crate::common::read(&c.checkpoint)).unwrap();
    assert_eq!(record["claims"], serde_json::json!({}));
    d.stop().await;
    drop(c.node);
}

/// A restart without `--dra` (the chart's default) still reads the DRA checkpoint, read only:
/// the device plugin never offers GPU 0 while claim `ns/one` is recorded, and the file is left
/// as it was. Back with `--dra`, the claim is unprepared and GPU 0 goes to the device plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_dra_reads_the_checkpoint_and_gpu_0_keeps_one_holder() {
    use crate::common::Daemon;
    let c = claimed_gpu0().await;
    let before = std::fs::read(&c.checkpoint).unwrap();
    let mut off = c.settings.clone();
    off.dra = None;
    off.dra_checkpoint = Some(c.checkpoint.clone());
    let mut d = Daemon::start(off);
    let s = d
        .wait_status(|s| s.generation > 0 && s.ready().is_ok())
        .await;
    assert!(
        !s.resources.contains("nvidia.com/gpu-dra"),
        "the device plugin serves GPU 0 while claim ns/one holds it (DRA off): {:?}",
        s.resources
    );
    assert!(
        !gpu0_ever_offered(&c.emu),
        "GPU 0 offered by the device plugin while claimed"
    );
    d.stop().await;
    assert_eq!(
        std::fs::read(&c.checkpoint).unwrap(),
        before,
        "rewritten with DRA off"
    );
    let mut d = Daemon::start(c.settings.clone());
    d.wait_status(|s| s.generation > 0 && s.dra_serving && s.dra_down.is_none())
        .await;
    assert!(!gpu0_ever_offered(&c.emu));
    let k = DraKubelet::register(&c.registry).await.unwrap();
    assert_eq!(
        k.unprepare(Version::V1, &[("ns", "one", UID_A)])
            .await
            .unwrap()[UID_A],
        ""
    );
    crate::common::wait_lists(&c.emu, &[("nvidia.com/gpu-dra", 2)]).await;
    d.stop().await;
    drop(c.node);
}

/// The taints of device `name` in the stored slice `v`.
fn taints_in(v: &Value, name: &str) -> Vec<Value> {
    v["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["name"] == name)
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Whether any device of the stored slice `v` has a taint.
fn any_taint(v: &Value) -> bool {
    v["spec"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|d| d["taints"].as_array().is_some_and(|t| !t.is_empty()))
}

/// A taint's `timeAdded` as written: stable across republishes and a restart of the
/// component (the listed taint's time wins over a new health record's), NoExecute when the
/// policy asks for Xids, and gone once the device recovers.
#[tokio::test]
async fn a_taint_keeps_its_time_across_a_restart_and_goes_with_recovery() {
    use std::time::{Duration, UNIX_EPOCH};
    let mut inv = inventory("h100-80gb-x8.yaml");
    let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let healthy = input_with(TS4, &inv, None, Cause::Xid(79), t0);
    let mut d = Dra::start(healthy.clone()).await;
    d.wait_slices(1, 32).await;
    inv.gpus[2].health = slicelet::device_health::Health::Unhealthy;
    let t1 = t0 + Duration::from_millis(60_500);
    let sick = input_with(TS4, &inv, Some(&healthy), Cause::Xid(79), t1);
    d.inputs.send_replace(Some(sick.clone()));
    let g2 = &inv.gpus[2].uuid;
    let r0 = device_name(&format!("{g2}::0"));
    let (_, v) = d
        .api
        .wait_slice_write(0, WAIT, |v| !taints_in(v, &r0).is_empty())
        .await
        .unwrap();
    let t = &taints_in(&v, &r0)[0];
    assert_eq!(t["key"], "gpu.slicelet.io/unhealthy");
    assert_eq!(t["value"], "xid-79");
    assert_eq!(t["effect"], "NoSchedule");
    assert_eq!(t["timeAdded"], "2027-01-15T08:01:00Z", "{t}");
    // A restarted component with a health record that knows nothing of before (its since is
    // an hour later): the listed taint keeps its time.
    d.stop_component().await;
    let writes = d.api.slice_writes().len();
    d.inputs.send_replace(Some(input_with(
        TS4,
        &inv,
        None,
        Cause::Xid(79),
        t1 + Duration::from_secs(3600),
    )));
    d.spawn().await;
    let slices = d.wait_slices(1, 32).await;
    assert!(
        d.api.slice_writes().len() > writes,
        "republished after the restart"
    );
    let stored = serde_json::to_value(&slices[0]).unwrap();
    assert_eq!(
        taints_in(&stored, &r0)[0]["timeAdded"],
        "2027-01-15T08:01:00Z"
    );
    // The policy asks for NoExecute on Xids.
    let no_execute = TS4.replace("sharing:", "dra:\n  xidTaintEffect: NoExecute\nsharing:");
    let last = d.inputs.borrow().clone().unwrap();
    d.inputs.send_replace(Some(input_with(
        &no_execute,
        &inv,
        Some(&last),
        Cause::Xid(79),
        t1,
    )));
    d.api
        .wait_slice_write(0, WAIT, |v| {
            taints_in(v, &r0)
                .first()
                .is_some_and(|t| t["effect"] == "NoExecute")
        })
        .await
        .unwrap();
    // Recovered: no taint anywhere.
    inv.gpus[2].health = slicelet::device_health::Health::Healthy;
    let writes = d.api.slice_writes().len();
    d.inputs
        .send_replace(Some(input_with(TS4, &inv, None, Cause::Xid(79), t1)));
    d.api
        .wait_slice_write(writes, WAIT, |v| !any_taint(v))
        .await
        .unwrap();
    assert!(tainted(&d.wait_slices(1, 32).await).is_empty());
}

/// Log lines, for a test that counts WARNs: a fmt subscriber writing into a shared buffer.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// An API server without device taints, both ways it can show it (the field dropped silently,
/// a write refused with 422 naming it): Unhealthy devices are withdrawn instead, no device is
/// ever stored untainted while Unhealthy (the first tainted write is a dry run), one WARN
/// (not one per reconcile), and the status says why.
#[tokio::test]
async fn an_api_server_without_device_taints_gets_withdrawal_and_one_warn() {
    use kubelet_emulator::kube_api::Taints;
    for mode in [Taints::Drop, Taints::Refuse] {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let mut inv = inventory("h100-80gb-x8.yaml");
        let healthy = input_of(TS4, &inv);
        let d = Dra::start(healthy.clone()).await;
        d.api.set_taints(mode);
        d.wait_slices(1, 32).await;
        inv.gpus[3].health = slicelet::device_health::Health::Unhealthy;
        let sick = input_with(
            TS4,
            &inv,
            Some(&healthy),
            Cause::Lost,
            std::time::SystemTime::now(),
        );
        let before = d.api.slice_writes().len();
        d.inputs.send_replace(Some(sick.clone()));
        let slices = d.wait_slices(1, 28).await;
        let g3 = &inv.gpus[3].uuid.clone();
        assert!(
            !names(&slices).contains(&device_name(&format!("{g3}::0"))),
            "{mode:?}"
        );
        let mut status = d.handle.as_ref().unwrap().status.clone();
        let refused = tokio::time::timeout(WAIT, status.wait_for(|s| s.taints_refused.is_some()))
            .await
            .unwrap()
            .unwrap()
            .taints_refused
            .clone()
            .unwrap();
        assert!(refused.contains("device taints"), "{mode:?}: {refused}");
        // Another device turns Unhealthy: withdrawn too, and no second WARN.
        inv.gpus[4].health = slicelet::device_health::Health::Unhealthy;
        d.inputs.send_replace(Some(input_with(
            TS4,
            &inv,
            Some(&sick),
            Cause::Lost,
            std::time::SystemTime::now(),
        )));
        d.wait_slices(1, 24).await;
        let unit_of = |v: &Value, g: &str| {
            v["spec"]["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| d["attributes"]["uuid"]["string"] == g)
        };
        assert!(
            d.api.slice_writes()[before..]
                .iter()
                .all(|v| !unit_of(v, g3)),
            "{mode:?}: GPU 3 was stored (untainted) after it turned Unhealthy"
        );
        let warns: Vec<String> = logs
            .lines()
            .into_iter()
            .filter(|l| l.contains("WARN") && l.contains("device taints"))
            .collect();
        assert_eq!(warns.len(), 1, "{mode:?}: {warns:#?}");
    }
}

/// A simulated 8× H100 node (GPU 0 alone so that an Xid line can be put on it).
fn write_h100_node(path: &Path, gpu0: &str) {
    let text = format!(
        "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    computeCapability: \"9.0\"\n    numaNode: 0\n{gpu0}  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    computeCapability: \"9.0\"\n    numaNode: 0\n    count: 3\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    computeCapability: \"9.0\"\n    numaNode: 1\n    count: 4\nnvswitch: true\n"
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// GPUs 0–3 time-sliced ×4 through DRA, recovering 1.5 s after a critical Xid.
/// The whole daemon with `--dra` serving `policy` on the H100 node file `sim` (GPU 0's entry
/// edited by the test with [`write_h100_node`]), its 16 replicas published to the API
/// emulator and its DRA plugin registered with the kubelet emulator `k`. A test binds every
/// field (a field left to `..` would drop at once): the emulators and the node's scratch
/// directory live as long as the test.
struct XidNode {
    k: DraKubelet,
    d: crate::common::Daemon,
    _emu: kubelet_emulator::KubeletEmulator,
    api: KubeApi,
    g0: String,
    sim: PathBuf,
    _node: crate::common::Node,
}

impl XidNode {
    async fn start(policy: &str) -> XidNode {
        let api = KubeApi::start(NODE, &[]).await;
        let DaemonNode {
            node,
            sim,
            emu,
            d,
            addr: _,
        } = DaemonNode::start(policy, &api, false).await;
        let g0 = crate::common::uuids(&sim)[0].clone();
        let k = DraKubelet::register(&node.tmp.path().join("plugins_registry"))
            .await
            .unwrap();
        XidNode {
            k,
            d,
            _emu: emu,
            api,
            g0,
            sim,
            _node: node,
        }
    }
}

/// The whole daemon with `--dra` serving `policy` on the H100 node file `sim` (GPU 0's entry
/// edited by the test with [`write_h100_node`]) against the API emulator `api` (set up by the
/// caller first), returned once ready and serving DRA with its 16 replicas published; with
/// `status`, its status port open on a loopback port (`addr`). Fields in the order they were
/// made: a test binds every one, and they drop in reverse.
struct DaemonNode {
    node: crate::common::Node,
    sim: PathBuf,
    emu: kubelet_emulator::KubeletEmulator,
    d: crate::common::Daemon,
    addr: Option<std::net::SocketAddr>,
}

impl DaemonNode {
    async fn start(policy: &str, api: &KubeApi, status: bool) -> DaemonNode {
        use crate::common::{emulator, Daemon, Node};
        let node = Node::new(policy);
        let sim = node.tmp.path().join("node").join("node.yaml");
        std::fs::create_dir_all(sim.parent().unwrap()).unwrap();
        write_h100_node(&sim, "");
        let emu = emulator(&node).await;
        let mut settings = node.settings(&sim);
        settings.dra = Some(daemon_dra(&node, api));
        if status {
            settings.status_address = Some("127.0.0.1:0".parse().unwrap());
        }
        let mut d = Daemon::start(settings);
        let addr = d
            .wait_status(|s| s.ready().is_ok() && s.dra_serving && (!status || s.address.is_some()))
            .await
            .address;
        api.wait_slices(|s| count(&parse(s)) == 16).await;
        DaemonNode {
            node,
            sim,
            emu,
            d,
            addr,
        }
    }
}

const XID_POLICY: &str = "version: v1\nhealth:\n  recoverySeconds: 1.5\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-dra\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n";

/// GPU 0's four replicas in a stored slice: all tainted `xid-79` (`true`) or none tainted.
fn gpu0_tainted(v: &Value, g0: &str, tainted: bool) -> bool {
    (0..4).all(|n| {
        let t = taints_in(v, &device_name(&format!("{g0}::{n}")));
        if tainted {
            t.len() == 1 && t[0]["value"] == "xid-79" && t[0]["effect"] == "NoSchedule"
        } else {
            t.is_empty()
        }
    }) && v["spec"]["devices"]
        .as_array()
        .is_some_and(|d| d.len() == 16)
}

/// GPU 0's four replicas in a health message: all `health` with `message` (others Healthy).
fn gpu0_reported(
    m: &[kubelet_emulator::dra::DeviceHealth],
    g0: &str,
    health: &str,
    message: &str,
) -> bool {
    let r0: Vec<String> = (0..4).map(|n| device_name(&format!("{g0}::{n}"))).collect();
    m.len() == 16
        && m.iter().all(|d| {
            d.pool == NODE
                && d.timeout_seconds == 60
                && if r0.contains(&d.device) {
                    d.health == health && d.message == message
                } else {
                    d.health == "Healthy"
                }
        })
}

/// The whole daemon with `--dra`: an Xid 79 on GPU 0 taints its four replicas in the API's
/// slices (nothing withdrawn) and the kubelet's health stream (v1 and v1alpha1) reports them
/// Unhealthy, both within 1 s of the node file's edit; after the quiet period the taints are
/// gone and the stream says Healthy, again within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_taints_gpu_0_and_the_health_stream_reports_it_within_a_second() {
    use kubelet_emulator::dra::HealthVersion;
    use std::time::{Duration, Instant};
    // Bound in the order the test's own locals were: they drop in reverse.
    let XidNode {
        _node,
        sim,
        g0,
        api,
        _emu,
        mut d,
        k,
    } = XidNode::start(XID_POLICY).await;
    let v1 = k.watch_health(HealthVersion::V1).await.unwrap();
    let alpha = k.watch_health(HealthVersion::V1alpha1).await.unwrap();
    for w in [&v1, &alpha] {
        w.wait_message(0, WAIT, |m| gpu0_reported(m, &g0, "Healthy", ""))
            .await
            .unwrap();
    }
    let (writes, seen) = (api.slice_writes().len(), v1.log().messages.len());
    let seen_alpha = alpha.log().messages.len();

    write_h100_node(&sim, "    xid: 79\n");
    let edited = Instant::now();
    let deadline = edited + Duration::from_secs(1);
    let left = || deadline.saturating_duration_since(Instant::now());
    let (_, slice) = api
        .wait_slice_write(writes, left(), |v| gpu0_tainted(v, &g0, true))
        .await
        .unwrap();
    let (_, msg) = v1
        .wait_message(seen, left(), |m| {
            gpu0_reported(m, &g0, "Unhealthy", "xid 79")
        })
        .await
        .unwrap();
    alpha
        .wait_message(seen_alpha, left(), |m| {
            gpu0_reported(m, &g0, "Unhealthy", "xid 79")
        })
        .await
        .unwrap();
    // The taint's timeAdded and the stream's last_updated_time are the same second.
    let r0 = device_name(&format!("{g0}::0"));
    let added = taints_in(&slice, &r0)[0]["timeAdded"]
        .as_str()
        .unwrap()
        .to_string();
    let added: k8s_openapi::jiff::Timestamp = added.parse().unwrap();
    let reported = msg.iter().find(|d| d.device == r0).unwrap().last_updated;
    assert_eq!(added.as_second(), reported);
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((wall - reported).abs() <= 2, "{wall} {reported}");

    // The Xid line goes; GPU 0 recovers once 1.5 s passed without another.
    let (writes, seen) = (api.slice_writes().len(), v1.log().messages.len());
    write_h100_node(&sim, "");
    let recovery = Duration::from_millis(1500);
    let deadline = edited + recovery + Duration::from_secs(1);
    let left = || deadline.saturating_duration_since(Instant::now());
    api.wait_slice_write(writes, left(), |v| gpu0_tainted(v, &g0, false))
        .await
        .unwrap();
    v1.wait_message(seen, left(), |m| gpu0_reported(m, &g0, "Healthy", ""))
        .await
        .unwrap();
    let s = d.wait_status(|s| s.ready().is_ok()).await;
    assert_eq!(s.dra_taints_refused, None);
    d.stop().await;
}

/// The value of the one taint every replica of GPU 0 carries in the stored slice `v` (16
/// devices), when all four carry the same one.
fn gpu0_taint_value(v: &Value, g0: &str) -> Option<(String, String)> {
    let all: Vec<Vec<Value>> = (0..4)
        .map(|n| taints_in(v, &device_name(&format!("{g0}::{n}"))))
        .collect();
    let first = all.first()?.first()?;
    let same = all.iter().all(|t| t.len() == 1 && t[0] == *first);
    let whole = v["spec"]["devices"]
        .as_array()
        .is_some_and(|d| d.len() == 16);
    (same && whole).then(|| {
        (
            first["value"].as_str().unwrap_or_default().to_string(),
            first["timeAdded"].as_str().unwrap_or_default().to_string(),
        )
    })
}

/// The whole daemon with `--dra`: GPU 0 tainted `xid-79`, then an Xid 48 while it stays
/// Unhealthy (a quiet period of 10 minutes): the taint's value follows the latest cause
/// (`xid-48`, the health stream says `xid 48`), with a `timeAdded` of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_xid_of_another_number_retaints_gpu_0_with_its_cause() {
    use kubelet_emulator::dra::HealthVersion;
    // Bound in the order the test's own locals were: they drop in reverse.
    let XidNode {
        _node,
        sim,
        g0,
        api,
        _emu,
        d,
        k,
    } = XidNode::start(&XID_POLICY.replace("recoverySeconds: 1.5", "recoverySeconds: 600")).await;
    let v1 = k.watch_health(HealthVersion::V1).await.unwrap();

    let (writes, seen) = (api.slice_writes().len(), v1.log().messages.len());
    write_h100_node(&sim, "    xid: 79\n");
    let (_, slice) = api
        .wait_slice_write(writes, WAIT, |v| {
            gpu0_taint_value(v, &g0).is_some_and(|(value, _)| value == "xid-79")
        })
        .await
        .unwrap();
    let (_, first_added) = gpu0_taint_value(&slice, &g0).unwrap();
    v1.wait_message(seen, WAIT, |m| gpu0_reported(m, &g0, "Unhealthy", "xid 79"))
        .await
        .unwrap();

    let (writes, seen) = (api.slice_writes().len(), v1.log().messages.len());
    write_h100_node(&sim, "    xid: 48\n");
    let (_, slice) = api
        .wait_slice_write(writes, WAIT, |v| {
            gpu0_taint_value(v, &g0).is_some_and(|(value, _)| value == "xid-48")
        })
        .await
        .unwrap();
    let (_, added) = gpu0_taint_value(&slice, &g0).unwrap();
    let at = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
    assert!(at(&added) >= at(&first_added), "{added} < {first_added}");
    v1.wait_message(seen, WAIT, |m| gpu0_reported(m, &g0, "Unhealthy", "xid 48"))
        .await
        .unwrap();
    d.stop().await;
}

/// The whole daemon against an API server that drops device taints: GPU 0's replicas are
/// withdrawn on an Xid, `/readyz` stays 200 and says why in a note, the metric says 0, and
/// the health stream still reports them Unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_api_server_gets_withdrawal_shown_in_readyz_and_the_metric() {
    use kubelet_emulator::dra::HealthVersion;
    use kubelet_emulator::kube_api::Taints;
    let api = KubeApi::start(NODE, &[]).await;
    api.set_taints(Taints::Drop);
    let DaemonNode {
        node,
        sim,
        emu: _emu,
        mut d,
        addr,
    } = DaemonNode::start(XID_POLICY, &api, true).await;
    let addr = addr.unwrap();
    let g0 = crate::common::uuids(&sim)[0].clone();
    let (_, metrics) = crate::live::get(addr, "/metrics").await;
    assert!(
        metrics.contains("slicelet_dra_device_taints 1"),
        "{metrics}"
    );
    let k = DraKubelet::register(&node.tmp.path().join("plugins_registry"))
        .await
        .unwrap();
    let health = k.watch_health(HealthVersion::V1).await.unwrap();
    write_h100_node(&sim, "    xid: 79\n");
    let slices = parse(&api.wait_slices(|s| count(&parse(s)) == 12).await);
    assert!(!names(&slices).contains(&device_name(&format!("{g0}::0"))));
    health
        .wait_message(0, WAIT, |m| gpu0_reported(m, &g0, "Unhealthy", "xid 79"))
        .await
        .unwrap();
    d.wait_status(|s| s.dra_taints_refused.is_some()).await;
    let (code, body) = crate::live::get(addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("ready\n"), "{body}");
    assert!(
        body.contains("DRA device taints refused: the API server dropped the device taints"),
        "{body}"
    );
    let (_, metrics) = crate::live::get(addr, "/metrics").await;
    assert!(
        metrics.contains("slicelet_dra_device_taints 0"),
        "{metrics}"
    );
    d.stop().await;
}

/// The whole daemon with `--dra`: slices a starting kubelet deletes come back and count in
/// `slicelet_dra_slices_republished_total`; while the API server is down the watch of the
/// slices fails, which `/readyz` notes (still ready: publishing is retried as always), and the
/// note goes once the watch answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_republishes_wiped_slices_and_notes_a_failing_slice_watch() {
    let api = KubeApi::start(NODE, &[]).await;
    let DaemonNode {
        node: _node,
        sim: _sim,
        emu: _emu,
        mut d,
        addr,
    } = DaemonNode::start(XID_POLICY, &api, true).await;
    let addr = addr.unwrap();
    api.wait(|c| c.slice_watches >= 1).await;
    let (_, metrics) = crate::live::get(addr, "/metrics").await;
    assert!(
        metrics.contains("slicelet_dra_slices_republished_total 0"),
        "{metrics}"
    );

    api.delete_node_slices(NODE);
    api.wait_slices(|s| count(&parse(s)) == 16).await;
    d.wait_status(|s| s.dra_slices_republished == 1).await;
    let (_, metrics) = crate::live::get(addr, "/metrics").await;
    assert!(
        metrics.contains("slicelet_dra_slices_republished_total 1"),
        "{metrics}"
    );

    api.set_unavailable(true);
    d.wait_status(|s| s.dra_slice_watch_error.is_some()).await;
    let (code, body) = crate::live::get(addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("DRA ResourceSlice watch failing: ")
            && body.contains("published again only at the next change or registration"),
        "{body}"
    );
    api.set_unavailable(false);
    d.wait_status(|s| s.dra_slice_watch_error.is_none()).await;
    let (_, body) = crate::live::get(addr, "/readyz").await;
    assert!(!body.contains("DRA ResourceSlice watch"), "{body}");
    d.stop().await;
}

/// The whole daemon with `--dra` and `dra: capacity` on an MPS resource (the fake MPS control
/// binary): GPU 0 published once as a consumable-capacity device; three claims of 20, 20 and
/// 38 GiB of it prepared through the DRA kubelet emulator, each into a CDI spec with its own
/// MPS limits and each answered with its share ID; a fourth of 2 GiB refused while the
/// 81,559 MiB are taken, then prepared once a 20 GiB share is unprepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_prepares_capacity_shares_of_gpu_0_with_their_own_mps_limits() {
    use crate::common::{emulator, uuids, wait_lists, Daemon, Node};
    let node = Node::new("version: v1\n");
    let root = crate::mps::mps_root(&node);
    let policy = format!(
        "version: v1\nflags:\n  mpsRoot: {}\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n        dra: capacity\n",
        root.display()
    );
    node.write_policy(&policy);
    let sim = node_file("h100-80gb-x8.yaml");
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let mut settings = crate::mps::mps_settings(&node, &sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let d = Daemon::start(settings);
    // GPUs 1–7 whole through the device plugin, GPU 0 once through DRA.
    wait_lists(&emu, &[("nvidia.com/gpu", 7)]).await;
    // GPU 0 untainted: its MPS control daemon is ready (until then it is `mps-not-ready` and
    // prepare refuses it).
    let slices = parse(
        &api.wait_slices(|s| count(&parse(s)) == 1 && !s.iter().any(any_taint))
            .await,
    );
    check_shape(&slices);
    let g0 = uuids(&sim)[0].clone();
    let gpu0 = device_name(&g0);
    let dev = &slices[0].spec.devices.as_ref().unwrap()[0];
    assert_eq!(dev.name, gpu0);
    assert_eq!(dev.allow_multiple_allocations, Some(true));
    let cap = dev.capacity.as_ref().unwrap();
    assert_eq!(cap["memory"].value.0, "81559Mi");
    assert_eq!(cap["cores"].value.0, "100");

    let share = |uid: &str, memory: &str, cores: Option<&str>| AllocatedDevice {
        consumed_capacity: [("memory", memory)]
            .into_iter()
            .chain(cores.map(|c| ("cores", c)))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        share_id: Some(format!("share-{uid}")),
        ..alloc("gpu", NODE, &gpu0)
    };
    let uids: Vec<String> = (1..=4)
        .map(|i| format!("cccccccc-0000-0000-0000-00000000000{i}"))
        .collect();
    for (i, (memory, cores)) in [
        ("20Gi", Some("25")),
        ("20Gi", Some("25")),
        ("38Gi", Some("50")),
        ("2Gi", None),
    ]
    .into_iter()
    .enumerate()
    {
        api.set_claim(
            "ns",
            &format!("c{i}"),
            &uids[i],
            &[share(&uids[i], memory, cores)],
        );
    }
    let k = DraKubelet::register(&node.tmp.path().join("plugins_registry"))
        .await
        .unwrap();
    let cdi = node.tmp.path().join("cdi");
    let env_of = |uid: &str| -> Vec<String> {
        let file = cdi.join(format!("gpu.slicelet.io-claim_{uid}.json"));
        let spec: Value = serde_json::from_str(&crate::common::read(&file)).unwrap();
        spec["devices"][0]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for (i, (mib, cores)) in [(20480, 25), (20480, 25), (38912, 50)]
        .into_iter()
        .enumerate()
    {
        let uid = uids[i].as_str();
        let name = format!("c{i}");
        let got = k.prepare(Version::V1, &[("ns", &name, uid)]).await.unwrap();
        let a = &got[uid];
        assert_eq!(a.error, "", "{name}");
        assert_eq!(a.devices.len(), 1, "{name}: {a:?}");
        assert_eq!(a.devices[0].device, gpu0);
        assert_eq!(
            a.devices[0].share_id,
            Some(format!("share-{uid}")),
            "{name}"
        );
        let env = env_of(uid);
        for want in [
            format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M"),
            format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}"),
            format!("SLICELET_GPU_SHARE_MEMORY_MIB={mib}"),
            format!("NVIDIA_VISIBLE_DEVICES={g0}"),
        ] {
            assert!(env.contains(&want), "{name}: {want} not in {env:?}");
        }
    }
    // 20 + 20 + 38 GiB = 79,872 MiB of 81,559: 2 GiB more does not fit.
    let small = [("ns", "c3", uids[3].as_str())];
    let refused = k.prepare(Version::V1, &small).await.unwrap();
    let e = &refused[&uids[3]].error;
    assert!(e.contains("81559 MiB") && e.contains("2048 MiB"), "{e}");
    assert!(refused[&uids[3]].devices.is_empty());
    assert!(!cdi
        .join(format!("gpu.slicelet.io-claim_{}.json", uids[3]))
        .exists());
    // A 20 GiB share goes; the 2 GiB one now fits, with its own limits and share ID.
    let un = k
        .unprepare(Version::V1, &[("ns", "c0", uids[0].as_str())])
        .await
        .unwrap();
    assert_eq!(un[&uids[0]], "");
    let ok = k.prepare(Version::V1, &small).await.unwrap();
    let a = &ok[&uids[3]];
    assert_eq!(a.error, "");
    assert_eq!(a.devices[0].share_id, Some(format!("share-{}", uids[3])));
    let env = env_of(&uids[3]);
    assert!(
        env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M".to_string()),
        "{env:?}"
    );
    d.stop().await;
}

/// docs/dra.md says what the cluster needs before DRA works: the feature gates slicelet's DRA
/// uses (each by name), CDI turned on in the container runtime with slicelet's default
/// `--cdi-output-dir` among its spec directories (containerd's `enable_cdi` and
/// `cdi_spec_dirs`, CRI-O), and how to see that a bridge class kept its
/// `spec.extendedResourceName`.
#[test]
fn dra_doc_says_what_the_cluster_needs() {
    let doc = crate::common::read(&crate::common::repo().join("docs/dra.md"));
    let section = doc
        .split("\n## What the cluster needs\n")
        .nth(1)
        .expect("docs/dra.md has a section \"What the cluster needs\"");
    let section = section.split("\n## ").next().unwrap();
    for gate in [
        "DRAConsumableCapacity",
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRAExtendedResource",
        "ResourceHealthStatus",
    ] {
        assert!(section.contains(&format!("`{gate}`")), "the gate {gate}");
    }
    for needed in [
        "enable_cdi = true",
        "cdi_spec_dirs",
        "CRI-O",
        dra::DEFAULT_CDI_OUTPUT_DIR,
        "kubectl get deviceclass -o jsonpath=",
        ".spec.extendedResourceName",
        "status.allocatable",
    ] {
        assert!(
            section.contains(needed),
            "docs/dra.md's section lacks {needed:?}"
        );
    }
}

/// Dynamic MIG through the whole daemon on a simulated H100 with MIG mode on and no instances
/// (config/nodes/h100-80gb-x2-mig-dynamic.yaml, copied beside its state file): a claim for
/// `gpu-0-mig-3g-40gb-0` is prepared by creating that MIG device through the hardware thread
/// (the node's `.mig-state.json` has it), its CDI spec gives the container that MIG UUID, the
/// dynamic device stays published, and the device plugin never serves the instance as a
/// static MIG device; unprepare destroys it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_creates_a_claims_mig_device_and_destroys_it_at_unprepare() {
    use crate::common::{emulator, wait_lists, Daemon, Node};
    const DEVICE: &str = "gpu-0-mig-3g-40gb-0";
    let node = Node::new(
        "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: [0]\n",
    );
    let sim = node.tmp.path().join("node.yaml");
    std::fs::copy(node_file("h100-80gb-x2-mig-dynamic.yaml"), &sim).unwrap();
    let state_file = node.tmp.path().join("node.yaml.mig-state.json");
    let api = KubeApi::start(NODE, &[]).await;
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.dra = Some(daemon_dra(&node, &api));
    let d = Daemon::start(settings);
    wait_lists(&emu, &[("nvidia.com/gpu", 1)]).await;
    let has_device = |s: &[Value]| names(&parse(s)).iter().any(|n| n == DEVICE);
    api.wait_slices(has_device).await;
    api.set_claim("ns", "mig", UID_A, &[alloc("mig", NODE, DEVICE)]);
    let k = DraKubelet::register(&node.tmp.path().join("plugins_registry"))
        .await
        .unwrap();
    let r = k
        .prepare(Version::V1, &[("ns", "mig", UID_A)])
        .await
        .unwrap();
    assert_eq!(r[UID_A].error, "");
    assert_eq!(r[UID_A].devices[0].device, DEVICE);
    let spec_file = node
        .tmp
        .path()
        .join("cdi")
        .join(format!("gpu.slicelet.io-claim_{UID_A}.json"));
    let spec: Value = serde_json::from_str(&crate::common::read(&spec_file)).unwrap();
    let env = spec["devices"][0]["containerEdits"]["env"].to_string();
    let mig = env
        .split("NVIDIA_VISIBLE_DEVICES=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    assert!(mig.starts_with("MIG-") && !mig.contains(','), "{env}");
    assert!(
        env.contains(&format!("CUDA_VISIBLE_DEVICES={mig}")),
        "{env}"
    );
    assert!(crate::common::read(&state_file).contains(&mig));
    let inv = inventory_at(&sim);
    assert_eq!(inv.gpus[0].mig_devices.len(), 1);
    assert!(
        has_device(&api.slices()),
        "held, the device stays published"
    );
    assert!(!d
        .status
        .borrow()
        .resources
        .contains("nvidia.com/mig-3g.40gb"));
    let un = k
        .unprepare(Version::V1, &[("ns", "mig", UID_A)])
        .await
        .unwrap();
    assert_eq!(un[UID_A], "");
    assert!(!crate::common::read(&state_file).contains(&mig));
    assert!(inventory_at(&sim).gpus[0].mig_devices.is_empty());
    assert!(
        emu.lists("nvidia.com/mig-3g.40gb").is_empty(),
        "the instance was never a static device"
    );
    d.stop().await;
}

fn inventory_at(path: &Path) -> Inventory {
    use slicelet::inventory::GpuSource as _;
    simulated::SimulatedSource::new(path).discover().unwrap()
}
