use super::*;
use crate::inventory::test_node;
use crate::plan;
use crate::plan::dra_names::device_name;
use crate::policy::parse;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaimStatus,
};

const NODE: &str = "node-1";
const DRIVER: &str = "gpu.slicelet.io";

fn claim(uid: &str, results: &[(&str, &str, &str, &str)]) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.uid = Some(uid.to_string());
    c.metadata.name = Some("c".to_string());
    c.metadata.namespace = Some("ns".to_string());
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(
                    results
                        .iter()
                        .map(
                            |(request, driver, pool, device)| DeviceRequestAllocationResult {
                                request: request.to_string(),
                                driver: driver.to_string(),
                                pool: pool.to_string(),
                                device: device.to_string(),
                                ..Default::default()
                            },
                        )
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c
}

/// The context of this node and driver for `plan` on `inventory`, `hook` for shares.
fn context<'a>(
    plan: &'a Plan,
    inventory: &'a crate::inventory::Inventory,
    hook: Option<&'a crate::cdi::memory::HookConfig>,
) -> Context<'a> {
    Context {
        plan,
        inventory,
        node: NODE,
        driver: DRIVER,
        dev_root: "/",
        memory_hook: hook,
    }
}

/// [`prepare`] on `plan` with `held` exclusively held (a test node of 8 GPUs as the
/// inventory, no memory hook).
fn run(
    c: &ResourceClaim,
    want: &ClaimRef,
    plan: &Plan,
    held: &BTreeMap<String, String>,
) -> Result<PreparedClaim, PrepareError> {
    let inv = test_node(8);
    let ctx = context(plan, &inv, None);
    let held = Held {
        exclusive: held.clone(),
        shares: BTreeMap::new(),
        dynamic_mig: Vec::new(),
    };
    prepare(c, want, &ctx, &held)
}

fn want(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: uid.into(),
    }
}

fn plan_of(policy: &str, n: u32, unhealthy: Option<u32>) -> (Plan, crate::inventory::Inventory) {
    let mut inv = test_node(n);
    if let Some(u) = unhealthy {
        inv.gpus[u as usize].health = Health::Unhealthy;
    }
    (
        plan::build(&parse(policy).unwrap(), &inv).unwrap().plan,
        inv,
    )
}

const TS: &str = "version: v1\ndra:\n  resources: [nvidia.com/gpu]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        dra: true\n";
const UID: &str = "11111111-2222-3333-4444-555555555555";

fn env(p: &PreparedClaim) -> Vec<String> {
    p.spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn two_replicas_of_gpu_0_name_its_uuid_once() {
    let (plan, inv) = plan_of(TS, 2, None);
    let g0 = &inv.gpus[0].uuid;
    let r0 = device_name(&format!("{g0}::0"));
    let r1 = device_name(&format!("{g0}::1"));
    let c = claim(
        UID,
        &[("gpu", DRIVER, NODE, &r0), ("gpu", DRIVER, NODE, &r1)],
    );
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    assert_eq!(p.devices.len(), 2);
    assert_eq!(
        p.devices[0].cdi_ids,
        vec![format!("gpu.slicelet.io/claim={UID}")]
    );
    assert!(p.devices[1].cdi_ids.is_empty(), "one CDI ID per request");
    assert_eq!(p.devices[0].device, r0);
    assert_eq!(p.devices[1].requests, vec!["gpu".to_string()]);
    assert_eq!(
        env(&p),
        vec![
            format!("CUDA_VISIBLE_DEVICES={g0}"),
            format!("NVIDIA_VISIBLE_DEVICES={g0}"),
        ]
    );
    assert_eq!(p.spec["kind"], "gpu.slicelet.io/claim");
    assert_eq!(p.spec["cdiVersion"], CDI_VERSION);
    assert_eq!(p.spec["devices"][0]["name"], UID);
    assert_eq!(p.spec_file, format!("gpu.slicelet.io-claim_{UID}.json"));
    // The spec is one the CDI parser accepts.
    let spec =
        crate::cdi::parse_spec(std::path::Path::new(&p.spec_file), &p.spec.to_string()).unwrap();
    assert_eq!(spec.devices, vec![UID.to_string()]);
}

#[test]
fn two_requests_each_get_the_claim_id_and_both_gpus_are_listed() {
    let (plan, inv) = plan_of(TS, 2, None);
    let (g0, g1) = (&inv.gpus[0].uuid, &inv.gpus[1].uuid);
    let a = device_name(&format!("{g0}::0"));
    let b = device_name(&format!("{g1}::3"));
    let c = claim(UID, &[("a", DRIVER, NODE, &a), ("b", DRIVER, NODE, &b)]);
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    assert!(p.devices.iter().all(|d| d.cdi_ids.len() == 1));
    assert!(env(&p).contains(&format!("NVIDIA_VISIBLE_DEVICES={g0},{g1}")));
}

#[test]
fn mps_claims_get_the_pipe_directory_shm_and_limits() {
    let policy = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n";
    let (plan, inv) = plan_of(policy, 1, None);
    let g0 = &inv.gpus[0].uuid;
    let c = claim(
        UID,
        &[("gpu", DRIVER, NODE, &device_name(&format!("{g0}::1")))],
    );
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    let e = env(&p);
    assert!(
        e.contains(&format!(
            "CUDA_MPS_PIPE_DIRECTORY={}",
            plan::container_pipe_dir(g0)
        )),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|v| v.starts_with("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|v| v.starts_with("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=")),
        "{e:?}"
    );
    assert!(
        !e.iter().any(|v| v.starts_with("CUDA_VISIBLE_DEVICES=")),
        "{e:?}"
    );
    let mounts = p.spec["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap();
    let paths: Vec<&str> = mounts
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/dev/shm"), "{paths:?}");
    assert!(
        paths.contains(&plan::container_pipe_dir(g0).as_str()),
        "{paths:?}"
    );
}

/// (case, claim UID asked, claim, plan's unhealthy GPU, held, the error's start)
#[test]
fn refusals_table() {
    let (plan, inv) = plan_of(TS, 2, None);
    let (uplan, _) = plan_of(TS, 2, Some(1));
    let g0 = &inv.gpus[0].uuid;
    let g1 = &inv.gpus[1].uuid;
    let r0 = device_name(&format!("{g0}::0"));
    let r1_of_g1 = device_name(&format!("{g1}::1"));
    let held = BTreeMap::from([(r0.clone(), "ns/other".to_string())]);
    let none = BTreeMap::new();
    type Case<'a> = (
        &'a str,
        &'a str,
        ResourceClaim,
        &'a Plan,
        &'a BTreeMap<String, String>,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "bad uid",
            "../x",
            claim("../x", &[("gpu", DRIVER, NODE, &r0)]),
            &plan,
            &none,
            "claim ns/c: UID",
        ),
        (
            "uid mismatch",
            UID,
            claim("other-uid", &[("gpu", DRIVER, NODE, &r0)]),
            &plan,
            &none,
            "the API's claim of that name has UID other-uid",
        ),
        (
            "not allocated",
            UID,
            claim(UID, &[]),
            &plan,
            &none,
            "its allocation names no device of driver",
        ),
        (
            "other driver only",
            UID,
            claim(UID, &[("gpu", "other.example.com", NODE, &r0)]),
            &plan,
            &none,
            "its allocation names no device",
        ),
        (
            "another node's pool",
            UID,
            claim(UID, &[("gpu", DRIVER, "node-2", &r0)]),
            &plan,
            &none,
            "is in pool node-2, not this node's pool node-1",
        ),
        (
            "unknown device",
            UID,
            claim(UID, &[("gpu", DRIVER, NODE, "gpu-nope")]),
            &plan,
            &none,
            "device gpu-nope is not a device",
        ),
        (
            "unhealthy device",
            UID,
            claim(UID, &[("gpu", DRIVER, NODE, &r1_of_g1)]),
            &uplan,
            &none,
            "is Unhealthy",
        ),
        (
            "held by another claim",
            UID,
            claim(UID, &[("gpu", DRIVER, NODE, &r0)]),
            &plan,
            &held,
            "is held by prepared claim ns/other",
        ),
    ];
    for (name, uid, c, plan, held, msg) in cases {
        let e = run(&c, &want(uid), plan, held).unwrap_err();
        assert!(e.to_string().contains(msg), "{name}: {e}");
    }
    // A device-plugin resource's device is not DRA's.
    let (dp_plan, _) = plan_of("version: v1\n", 1, None);
    let c = claim(UID, &[("gpu", DRIVER, NODE, &device_name(g0))]);
    let e = run(&c, &want(UID), &dp_plan, &none).unwrap_err();
    assert!(matches!(e, PrepareError::UnknownDevice { .. }), "{e}");
}

#[test]
fn claim_names_table() {
    let ok = |namespace: &str, name: &str| {
        check_claim_ref(&ClaimRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: UID.into(),
        })
        .is_ok()
    };
    for (namespace, name, want) in [
        ("ns", "c", true),
        ("kube-system", "my.claim-1", true),
        ("ns", &"a".repeat(253), false),
        ("", "c", false),
        ("ns", "", false),
        ("../x", "c", false),
        ("ns", "../../secrets/x", false),
        ("ns", "C", false),
        ("n.s", "c", false),
    ] {
        assert_eq!(ok(namespace, name), want, "{namespace:?}/{name:?}");
    }
}

#[test]
fn uids_table() {
    for (uid, ok) in [
        (UID, true),
        ("a", true),
        ("", false),
        ("-a", false),
        ("A", false),
        ("a/b", false),
        ("..", false),
        (&"a".repeat(65), false),
    ] {
        assert_eq!(valid_uid(uid), ok, "{uid:?}");
    }
}

// ---- regression tests for defects a hostile review found (each failed before its fix; the
// comments say what went wrong then) ----

#[test]
fn a_replica_of_a_gpu_another_claim_holds_whole_is_refused() {
    // A claim was prepared on GPU 0 whole (device `gpu-<uuid>`, under a whole-GPU DRA
    // policy); the policy now shares GPUs 4 ways. The new slices publish `gpu-<uuid>-r0..3`,
    // names nobody holds, so the scheduler allocates one and prepare accepts it: the GPU
    // the first claim was given exclusively is shared.
    let (plan, inv) = plan_of(TS, 1, None);
    let g0 = &inv.gpus[0].uuid;
    let held = BTreeMap::from([(device_name(g0), "ns/exclusive".to_string())]);
    let r0 = device_name(&format!("{g0}::0"));
    let c = claim(UID, &[("gpu", DRIVER, NODE, &r0)]);
    let got = run(&c, &want(UID), &plan, &held);
    assert!(
        matches!(got, Err(PrepareError::Held { .. })),
        "prepared {r0} on GPU {g0}, which prepared claim ns/exclusive holds whole: {:?}",
        got.map(|p| p.devices)
    );
}

#[test]
fn what_a_prepared_claim_blocks() {
    let g = "gpu-df942ca2-b7c5-e6fa-29b0-3e2134fef416";
    let other = "gpu-9cca8c37-c0a2-f7a2-024e-2cb35df7a5d9";
    let r = |u: &str, n: u32| format!("{u}-r{n}");
    for (held, asked, blocked) in [
        (g.to_string(), g.to_string(), true),
        (g.to_string(), r(g, 0), true),
        (r(g, 0), g.to_string(), true),
        (r(g, 0), r(g, 0), true),
        (r(g, 0), r(g, 1), false),
        (g.to_string(), other.to_string(), false),
        (r(g, 0), r(other, 0), false),
        ("dev-0123".to_string(), "dev-0123".to_string(), true),
    ] {
        let map = BTreeMap::from([(held.clone(), "ns/a".to_string())]);
        assert_eq!(
            holder_of(&map, &asked).is_some(),
            blocked,
            "{held} held, {asked} asked"
        );
    }
}

/// The devices of one claim merge into one set of container edits: the device lists join
/// without repeats, other variables take the last value, and a mount, device node or CDI name
/// at one path (or of one name) is kept once.
#[test]
fn a_claims_edits_merge_lists_and_keep_each_path_once() {
    let alloc = |gpus: &str, other: &str, paths: &[&str]| allocate::ContainerAllocation {
        envs: [
            (NVIDIA_VISIBLE_DEVICES.to_string(), gpus.to_string()),
            (CUDA_VISIBLE_DEVICES.to_string(), gpus.to_string()),
            ("OTHER".to_string(), other.to_string()),
        ]
        .into_iter()
        .collect(),
        mounts: paths
            .iter()
            .map(|p| allocate::MountSpec {
                container_path: p.to_string(),
                host_path: format!("/host{p}"),
                read_only: true,
            })
            .collect(),
        device_nodes: paths
            .iter()
            .map(|p| allocate::DeviceNode {
                container_path: format!("/dev{p}"),
                host_path: format!("/dev{p}"),
                permissions: "rw".to_string(),
            })
            .collect(),
        annotations: Default::default(),
        cdi_devices: paths.iter().map(|p| format!("k/c={p}")).collect(),
    };
    let mut e = Edits::default();
    e.merge(alloc("GPU-a", "1", &["/a"]));
    e.merge(alloc("GPU-b,GPU-a", "2", &["/a", "/b"]));
    e.merge(alloc("GPU-b", "3", &["/b"]));
    assert_eq!(e.env[NVIDIA_VISIBLE_DEVICES], "GPU-a,GPU-b");
    assert_eq!(e.env[CUDA_VISIBLE_DEVICES], "GPU-a,GPU-b");
    assert_eq!(e.env["OTHER"], "3");
    let mounts: Vec<&str> = e.mounts.iter().map(|m| m.container_path.as_str()).collect();
    assert_eq!(mounts, ["/a", "/b"]);
    let nodes: Vec<&str> = e.nodes.iter().map(|n| n.container_path.as_str()).collect();
    assert_eq!(nodes, ["/dev/a", "/dev/b"]);
    assert_eq!(e.cdi_devices, ["k/c=/a", "k/c=/b"]);
}

#[test]
fn device_names_map_to_their_unit() {
    assert_eq!(unit_of("gpu-abc-r3"), ("gpu-abc", true));
    assert_eq!(unit_of("gpu-abc-r12"), ("gpu-abc", true));
    // Not a replica number: its own unit.
    assert_eq!(unit_of("gpu-abc-r"), ("gpu-abc-r", false));
    assert_eq!(unit_of("gpu-abc-rx1"), ("gpu-abc-rx1", false));
    assert_eq!(unit_of("gpu-abc-r1x"), ("gpu-abc-r1x", false));
    assert_eq!(unit_of("mig-abc"), ("mig-abc", false));
}

#[test]
fn a_claim_is_shown_by_namespace_name_and_uid() {
    let c = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "u-1".into(),
    };
    assert_eq!(c.to_string(), "ns/c (u-1)");
}

#[test]
fn one_device_for_two_requests_is_one_device_with_both_names() {
    let (plan, inv) = plan_of(TS, 2, None);
    let a = device_name(&format!("{}::0", inv.gpus[0].uuid));
    let c = claim(
        UID,
        &[
            ("a", DRIVER, NODE, &a),
            ("b", DRIVER, NODE, &a),
            ("a", DRIVER, NODE, &a),
        ],
    );
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    assert_eq!(p.devices.len(), 1);
    assert_eq!(
        p.devices[0].requests,
        vec!["a".to_string(), "b".to_string()]
    );
}

// ---- consumable capacity (`dra: capacity`) ----

const CAPACITY: &str = "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n        dra: capacity\n";

/// The shipped 8× H100 80GB node (81,559 MiB each), optionally on an R615 driver.
fn h100(driver: Option<&str>) -> crate::inventory::Inventory {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodes/h100-80gb-x8.yaml");
    let mut inv =
        crate::inventory::simulated::parse(&path, &std::fs::read_to_string(&path).unwrap())
            .unwrap();
    inv.driver_version = driver.map(str::to_string);
    inv
}

/// A claim of one share of `device`: `memory`/`cores` consumed (none: the scheduler
/// recorded no consumed capacity), share ID `share`.
fn share_claim(
    uid: &str,
    device: &str,
    share: &str,
    memory: Option<&str>,
    cores: Option<&str>,
) -> ResourceClaim {
    let mut c = claim(uid, &[("gpu", DRIVER, NODE, device)]);
    let r = &mut c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap()[0];
    r.share_id = Some(share.to_string());
    let mut consumed = BTreeMap::new();
    if let Some(m) = memory {
        consumed.insert(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(m.to_string()),
        );
    }
    if let Some(c) = cores {
        consumed.insert(
            "cores".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(c.to_string()),
        );
    }
    r.consumed_capacity = (!consumed.is_empty()).then_some(consumed);
    c
}

fn env_value(p: &PreparedClaim, key: &str) -> Option<String> {
    env(p)
        .into_iter()
        .find_map(|e| e.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// The issue's case: three shares of 20, 20 and 38 GiB of one H100 80GB prepared with their
/// own MPS limits; a fourth of 2 GiB no longer fits (81,559 MiB is full).
#[test]
fn shares_of_one_gpu_get_their_own_limits_until_it_is_full() {
    let inv = h100(None);
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let gpu0 = device_name(&inv.gpus[0].uuid);
    let ctx = context(&plan, &inv, None);
    let mut held = Held::default();
    let mut limits = Vec::new();
    for (i, (memory, cores)) in [("20Gi", "25"), ("20Gi", "25"), ("38Gi", "50")]
        .into_iter()
        .enumerate()
    {
        let uid = format!("00000000-0000-0000-0000-00000000000{i}");
        let c = share_claim(
            &uid,
            &gpu0,
            &format!("share-{i}"),
            Some(memory),
            Some(cores),
        );
        let p = prepare(&c, &want(&uid), &ctx, &held).unwrap();
        let share = p.devices[0].share.clone().unwrap();
        assert_eq!(share.id, format!("share-{i}"));
        // Each spec carries its own share only.
        limits.push((
            env_value(&p, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").unwrap(),
            env_value(&p, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").unwrap(),
        ));
        held.shares
            .entry(gpu0.clone())
            .or_default()
            .push((format!("ns/c{i}"), share));
    }
    assert_eq!(
        limits,
        [
            ("0=20480M".to_string(), "25".to_string()),
            ("0=20480M".to_string(), "25".to_string()),
            ("0=38912M".to_string(), "50".to_string()),
        ]
    );
    let uid = "00000000-0000-0000-0000-000000000009";
    let c = share_claim(uid, &gpu0, "share-9", Some("2Gi"), None);
    let e = prepare(&c, &want(uid), &ctx, &held).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, PrepareError::ShareDoesNotFit { .. }), "{msg}");
    assert!(
        msg.contains("2048 MiB of memory")
            && msg.contains("81559 MiB")
            && msg.contains("79872 MiB"),
        "{msg}"
    );
    // Cores run out the same way, memory to spare.
    let c = share_claim(uid, &gpu0, "share-9", Some("1Gi"), Some("1"));
    let mut cores_full = held.clone();
    cores_full.shares.get_mut(&gpu0).unwrap().truncate(1);
    cores_full.shares.get_mut(&gpu0).unwrap()[0].1.cores = 100;
    let e = prepare(&c, &want(uid), &ctx, &cores_full).unwrap_err();
    assert!(e.to_string().contains("1 % of the cores"), "{e}");
}

/// The shipped 8× A100 40GB node (40,960 MiB each), optionally on an R615 driver.
fn a100(driver: Option<&str>) -> crate::inventory::Inventory {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodes/a100-40gb-x8.yaml");
    let mut inv =
        crate::inventory::simulated::parse(&path, &std::fs::read_to_string(&path).unwrap())
            .unwrap();
    inv.driver_version = driver.map(str::to_string);
    inv
}

/// A claim of several shares of `device`: per result its request, share ID, memory and
/// cores consumed.
fn shares_claim(uid: &str, device: &str, shares: &[(&str, &str, &str, &str)]) -> ResourceClaim {
    let results: Vec<(&str, &str, &str, &str)> = shares
        .iter()
        .map(|(request, ..)| (*request, DRIVER, NODE, device))
        .collect();
    let mut c = claim(uid, &results);
    let list = c
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results
        .as_mut()
        .unwrap();
    for (r, (_, id, memory, cores)) in list.iter_mut().zip(shares) {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        r.share_id = Some(id.to_string());
        r.consumed_capacity = Some(BTreeMap::from([
            ("memory".to_string(), Quantity(memory.to_string())),
            ("cores".to_string(), Quantity(cores.to_string())),
        ]));
    }
    c
}

/// A claim with two shares of one GPU (two requests, or one request with `count: 2`) is
/// checked as the sum of its shares: 20 + 25 GiB do not fit a 40 GiB A100, 20 + 15 GiB do.
/// Each share is recorded (and held, and answered) with its own ID; the MPS client's limits,
/// the memory hook and `SLICELET_GPU_MEMORY_LIMIT_MIB` are the sum, one hook for the GPU.
#[test]
fn two_shares_of_one_gpu_in_one_claim_add_up() {
    let inv = a100(Some("615.20"));
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let g0 = inv.gpus[0].uuid.clone();
    let gpu0 = device_name(&g0);
    let hook = crate::cdi::memory::HookConfig::default();
    let ctx = context(&plan, &inv, Some(&hook));
    for requests in [["a", "b"], ["gpu", "gpu"]] {
        let c = shares_claim(
            UID,
            &gpu0,
            &[
                (requests[0], "s-1", "20Gi", "25"),
                (requests[1], "s-2", "25Gi", "25"),
            ],
        );
        let e = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, PrepareError::ShareDoesNotFit { .. }), "{msg}");
        assert!(
            msg.contains("46080 MiB of memory in 2 shares") && msg.contains("40960 MiB"),
            "{msg}"
        );
        let c = shares_claim(
            UID,
            &gpu0,
            &[
                (requests[0], "s-1", "20Gi", "25"),
                (requests[1], "s-2", "15Gi", "50"),
            ],
        );
        let p = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap();
        let shares: Vec<(&str, &str, u64, u32)> = p
            .devices
            .iter()
            .map(|d| {
                let s = d.share.as_ref().unwrap();
                (d.device.as_str(), s.id.as_str(), s.memory_mib, s.cores)
            })
            .collect();
        assert_eq!(
            shares,
            [
                (gpu0.as_str(), "s-1", 20480, 25),
                (gpu0.as_str(), "s-2", 15360, 50)
            ]
        );
        assert_eq!(p.devices[0].requests, [requests[0]]);
        assert_eq!(p.devices[1].requests, [requests[1]]);
        // The claim's CDI ID once per request.
        assert_eq!(
            p.devices[1].cdi_ids.is_empty(),
            requests[0] == requests[1],
            "{requests:?}"
        );
        // The answer: one device per share, each with its share ID.
        let answer: Vec<crate::api::dra::v1::Device> =
            p.devices.iter().cloned().map(Into::into).collect();
        let ids: Vec<Option<&str>> = answer.iter().map(|d| d.share_id.as_deref()).collect();
        assert_eq!(ids, [Some("s-1"), Some("s-2")]);
        assert!(answer.iter().all(|d| d.device_name == gpu0));
        for (key, value) in [
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=35840M"),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "75"),
            ("SLICELET_GPU_SHARE_MEMORY_MIB", "35840"),
            ("SLICELET_GPU_SHARE_CORES", "75"),
            ("SLICELET_GPU_MEMORY_LIMIT_MIB", "35840"),
        ] {
            assert_eq!(env_value(&p, key).as_deref(), Some(value), "{key}");
        }
        let hooks = p.spec["devices"][0]["containerEdits"]["hooks"]
            .as_array()
            .unwrap();
        assert_eq!(hooks.len(), 1, "one hook for GPU 0: {hooks:?}");
        let args: Vec<&str> = hooks[0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2).any(|w| w == ["--hard-mib", "35840"]),
            "{args:?}"
        );
        // The checkpoint holds both shares: 5 GiB more fits, 6 GiB does not.
        let mut checkpoint = crate::dra::checkpoint::Checkpoint::new();
        checkpoint.claims.insert(UID.to_string(), p.clone());
        let held = checkpoint.held("other");
        assert_eq!(held.shares[&gpu0].len(), 2);
        let other = "99999999-0000-0000-0000-000000000000";
        let c = share_claim(other, &gpu0, "s-9", Some("5Gi"), Some("25"));
        prepare(&c, &want(other), &ctx, &held).unwrap();
        let c = share_claim(other, &gpu0, "s-9", Some("6Gi"), Some("25"));
        let e = prepare(&c, &want(other), &ctx, &held).unwrap_err();
        assert!(e.to_string().contains("35840 MiB"), "{e}");
    }
}

#[test]
fn a_share_without_consumed_capacity_takes_the_default_and_bad_quantities_are_refused() {
    let inv = h100(None);
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let gpu0 = device_name(&inv.gpus[0].uuid);
    let ctx = context(&plan, &inv, None);
    let c = share_claim(UID, &gpu0, "s", None, None);
    let p = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap();
    // 81559 / 4 replicas, 100 / 4.
    assert_eq!(
        p.devices[0].share,
        Some(Share {
            id: "s".into(),
            memory_mib: 20389,
            cores: 25
        })
    );
    assert_eq!(
        env_value(&p, "SLICELET_GPU_SHARE_MEMORY_MIB").as_deref(),
        Some("20389")
    );
    // Memory rounds up to whole MiB; cores are whole percents (`1000m` is 1).
    for (memory, cores, taken) in [
        ("1.5Gi", "25", (1536, 25)),
        ("1.5Mi", "1000m", (2, 1)),
        ("1048577", "100", (2, 100)),
        ("1Mi", "1", (1, 1)),
        ("1e9", "5e1", (954, 50)),
    ] {
        let c = share_claim(UID, &gpu0, "s", Some(memory), Some(cores));
        let s = prepare(&c, &want(UID), &ctx, &Held::default())
            .unwrap()
            .devices[0]
            .share
            .clone()
            .unwrap();
        assert_eq!((s.memory_mib, s.cores), taken, "{memory} {cores}");
    }
    for (memory, cores, says) in [(Some("lots"), None, "memory"), (None, Some("x"), "cores")] {
        let c = share_claim(UID, &gpu0, "s", memory, cores);
        let e = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap_err();
        assert!(
            matches!(e, PrepareError::BadCapacity { .. }) && e.to_string().contains(says),
            "{e}"
        );
    }
}

/// A consumed capacity below (or above) the `validRange` the slice publishes is the claim's
/// error naming the claim, the device, the value and the range, never rounded into a share of
/// 0 MiB or 0 % (fifty of which would fit one GPU): memory from 1Mi, compared before
/// rounding; cores whole percents from 1 to 100.
#[test]
fn consumed_capacity_outside_the_published_range_is_refused() {
    let inv = h100(None);
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let gpu0 = device_name(&inv.gpus[0].uuid);
    let ctx = context(&plan, &inv, None);
    // The range refused is the one published.
    let caps = crate::dra::slices::capacities(81559, 4);
    let memory = caps["memory"].request_policy.as_ref().unwrap();
    assert_eq!(memory.valid_range.as_ref().unwrap().min.0, "1Mi");
    let cores = caps["cores"].request_policy.as_ref().unwrap();
    let range = cores.valid_range.as_ref().unwrap();
    assert_eq!(
        (
            range.min.0.as_str(),
            range.max.as_ref().unwrap().0.as_str(),
            range.step.as_ref().unwrap().0.as_str()
        ),
        ("1", "100", "1")
    );
    let mut cases: Vec<(Option<&str>, Option<&str>, &str, &str)> = Vec::new();
    for m in ["0", "0.5", "1e-3", "1048575", "0.5Mi", "1e-50", "-1Gi"] {
        cases.push((Some(m), Some("25"), "memory", "at least 1Mi"));
    }
    for c in ["0", "0.9", "250m", "1.5", "101", "1e3", "-1"] {
        cases.push((Some("1Gi"), Some(c), "cores", "1 to 100 in steps of 1"));
    }
    for (memory, cores, name, range) in cases {
        let c = share_claim(UID, &gpu0, "s", memory, cores);
        let e = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap_err();
        let msg = e.to_string();
        let value = if name == "memory" { memory } else { cores }.unwrap();
        assert!(
            matches!(e, PrepareError::CapacityOutOfRange { .. }),
            "{memory:?} {cores:?}: {msg}"
        );
        for part in [UID, gpu0.as_str(), name, &format!("{value:?}"), range] {
            assert!(msg.contains(part), "{part} not in {msg}");
        }
    }
}

#[test]
fn shares_and_exclusive_holders_of_one_gpu_never_mix() {
    let inv = h100(None);
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let g0 = &inv.gpus[0].uuid;
    let gpu0 = device_name(g0);
    let ctx = context(&plan, &inv, None);
    // A claim prepared on a replica of GPU 0 before the policy turned to capacity.
    let mut held = Held::default();
    held.exclusive
        .insert(device_name(&format!("{g0}::1")), "ns/old".into());
    let c = share_claim(UID, &gpu0, "s", Some("1Gi"), None);
    let e = prepare(&c, &want(UID), &ctx, &held).unwrap_err();
    assert!(matches!(e, PrepareError::Held { .. }), "{e}");
    // The other way: shares of GPU 0 held, the policy back to replicas.
    let (ts_plan, _) = plan_of(TS, 1, None);
    let tinv = test_node(1);
    let t0 = &tinv.gpus[0].uuid;
    let mut held = Held::default();
    held.shares.insert(
        device_name(t0),
        vec![(
            "ns/share".into(),
            Share {
                id: "x".into(),
                memory_mib: 1,
                cores: 1,
            },
        )],
    );
    let c = claim(
        UID,
        &[("gpu", DRIVER, NODE, &device_name(&format!("{t0}::0")))],
    );
    let ctx = context(&ts_plan, &tinv, None);
    let e = prepare(&c, &want(UID), &ctx, &held).unwrap_err();
    assert!(e.to_string().contains("ns/share"), "{e}");
}

#[test]
fn on_an_r615_node_a_share_gets_the_memory_hook() {
    let inv = h100(Some("615.20"));
    let plan = plan::build(&parse(CAPACITY).unwrap(), &inv).unwrap().plan;
    let gpu0 = device_name(&inv.gpus[0].uuid);
    let hook = crate::cdi::memory::HookConfig::default();
    let ctx = context(&plan, &inv, Some(&hook));
    let c = share_claim(UID, &gpu0, "s", Some("20Gi"), None);
    let p = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap();
    let hooks = &p.spec["devices"][0]["containerEdits"]["hooks"];
    let args: Vec<&str> = hooks[0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(hooks[0]["hookName"], "createContainer");
    assert!(
        args.windows(2).any(|w| w == ["--hard-mib", "20480"]),
        "{args:?}"
    );
    assert!(
        args.windows(2)
            .any(|w| w == ["--gpu", inv.gpus[0].uuid.as_str()]),
        "{args:?}"
    );
    // Without R615 (or without the hook installed): no hook, the MPS limit only.
    let old = h100(Some("550.54.15"));
    let ctx = Context {
        inventory: &old,
        ..ctx
    };
    let p = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap();
    assert!(p.spec["devices"][0]["containerEdits"]
        .get("hooks")
        .is_none());
}

/// The pods a claim is reserved for are recorded with it (the core group's `pods` only, each
/// UID once): GPU use attribution maps a process's pod UID to the claim through them.
#[test]
fn the_pods_a_claim_is_reserved_for_are_recorded() {
    use k8s_openapi::api::resource::v1::ResourceClaimConsumerReference;
    let (plan, inv) = plan_of(TS, 1, None);
    let r0 = device_name(&format!("{}::0", inv.gpus[0].uuid));
    let mut c = claim(UID, &[("gpu", DRIVER, NODE, &r0)]);
    let consumer = |group: Option<&str>, resource: &str, name: &str, uid: &str| {
        ResourceClaimConsumerReference {
            api_group: group.map(str::to_string),
            resource: resource.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        }
    };
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    assert!(p.pods.is_empty(), "reserved for nobody: {:?}", p.pods);
    if let Some(s) = c.status.as_mut() {
        s.reserved_for = Some(vec![
            consumer(None, "pods", "a", "uid-a"),
            consumer(Some(""), "pods", "b", "uid-b"),
            consumer(None, "pods", "a", "uid-a"),
            consumer(Some("example.com"), "pods", "x", "uid-x"),
            consumer(None, "services", "y", "uid-y"),
        ]);
    }
    let p = run(&c, &want(UID), &plan, &BTreeMap::new()).unwrap();
    let pod = |name: &str, uid: &str| ReservedPod {
        name: name.into(),
        uid: uid.into(),
    };
    assert_eq!(p.pods, vec![pod("a", "uid-a"), pod("b", "uid-b")]);
    // The checkpoint keeps them.
    let text = serde_json::to_string(&p).unwrap();
    let back: PreparedClaim = serde_json::from_str(&text).unwrap();
    assert_eq!(back.pods, p.pods);
}

/// A `dra: true` entry's memory limit reaches a replica claim's container as slicelet's memory
/// CDI device, among the extra CDI device IDs, only under `cdi-cri` (annotations have no place
/// in DRA): exactly where the plan says the limit is enforced, and the node's memory spec
/// defines that device.
#[test]
fn a_replica_claim_gets_the_memory_hook_where_the_plan_says_it_is_enforced() {
    let inv = h100(Some("615.20"));
    let hook = crate::cdi::memory::HookConfig::default();
    let gpu0 = &inv.gpus[0].uuid;
    for (strategy, enforced) in [
        ("envvar", false),
        ("cdi-annotations", false),
        ("[envvar, cdi-annotations]", false),
        ("cdi-cri", true),
        ("[envvar, cdi-cri]", true),
    ] {
        let policy = format!("version: v1\nflags:\n  plugin:\n    deviceListStrategy: {strategy}\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-16gb\n        devices: [0]\n        replicas: 2\n        dra: true\n        memory: {{hard: 16Gi, enforce: best-effort}}\n");
        let plan = plan::build(&parse(&policy).unwrap(), &inv).unwrap().plan;
        let view = plan.view();
        let shown = view
            .resources
            .iter()
            .find(|r| r.name == "nvidia.com/gpu-16gb");
        assert_eq!(
            shown.unwrap().devices[0].memory_enforced,
            Some(enforced),
            "{strategy}"
        );
        let ctx = context(&plan, &inv, Some(&hook));
        let r0 = device_name(&format!("{gpu0}::0"));
        let c = claim(UID, &[("gpu", DRIVER, NODE, &r0)]);
        let p = prepare(&c, &want(UID), &ctx, &Held::default()).unwrap();
        let name = format!("{gpu0}-16384mib-x1");
        let given = p.devices[0]
            .cdi_ids
            .contains(&format!("{}={name}", crate::cdi::memory::KIND));
        assert_eq!(given, enforced, "{strategy}: {:?}", p.devices[0].cdi_ids);
        let spec = crate::cdi::memory::spec(&plan, &hook).unwrap_or_default();
        assert_eq!(
            spec.contains(&format!("\"{name}\"")),
            enforced,
            "{strategy}"
        );
        // The claim's own spec carries no hook for a replica.
        assert!(p.spec["devices"][0]["containerEdits"]
            .get("hooks")
            .is_none());
    }
}

/// GPU 0: an H100 with MIG on and one static 1g.10gb at memory slice 6; GPU 1: an H100 with
/// MIG on and no instances, Unhealthy when `gpu1_unhealthy`; both partitioned on demand, the
/// static 1g.10gb devices served through DRA too.
fn dynamic_node(gpu1_unhealthy: bool) -> (Plan, crate::inventory::Inventory) {
    let health = if gpu1_unhealthy {
        "    health: Unhealthy\n"
    } else {
        ""
    };
    let text = format!(
        "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n        - profile: 1g.10gb\n          placementStart: 6\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n{health}    mig: {{}}\n"
    );
    let inv = crate::inventory::simulated::parse(std::path::Path::new("n.yaml"), &text).unwrap();
    let policy = "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  resources: [nvidia.com/mig-1g.10gb]\n  dynamicMig:\n    devices: [0, 1]\n";
    let plan = plan::build(&parse(policy).unwrap(), &inv).unwrap().plan;
    (plan, inv)
}

fn held_none() -> Held {
    Held::default()
}

#[test]
fn a_dynamic_mig_device_is_staged_and_finished_with_its_uuid() {
    let (plan, inv) = dynamic_node(false);
    let ctx = context(&plan, &inv, None);
    let static_mig = &inv.gpus[0].mig_devices[0];
    let static_name = device_name(&static_mig.uuid);
    let c = claim(
        UID,
        &[
            ("mig", DRIVER, NODE, "gpu-0-mig-3g-40gb-0"),
            ("small", DRIVER, NODE, &static_name),
        ],
    );
    let staged = stage(&c, &want(UID), &ctx, &held_none()).unwrap();
    assert_eq!(
        staged.dynamic,
        vec![DynamicPick {
            device: "gpu-0-mig-3g-40gb-0".into(),
            gpu_uuid: inv.gpus[0].uuid.clone(),
            profile: "3g.40gb".into(),
            placement: MigPlacement { start: 0, size: 4 },
        }]
    );
    let created = BTreeMap::from([("gpu-0-mig-3g-40gb-0".to_string(), "MIG-new".to_string())]);
    let p = staged.finish(&created);
    // Allocation order kept; the dynamic device's ID is its MIG UUID, and both MIG devices
    // are the container's (a claim mixing dynamic and static devices).
    assert_eq!(p.devices[0].device, "gpu-0-mig-3g-40gb-0");
    assert_eq!(p.devices[0].id, "MIG-new");
    assert_eq!(p.devices[0].cdi_ids, vec![format!("{DRIVER}/claim={UID}")]);
    assert_eq!(p.devices[1].id, static_mig.uuid);
    let env = env(&p);
    for key in ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"] {
        let want = format!("{key}={},MIG-new", static_mig.uuid);
        assert!(env.contains(&want), "{want} not in {env:?}");
    }
    // Alone, the container gets that MIG device only.
    let c = claim(UID, &[("mig", DRIVER, NODE, "gpu-1-mig-1g-10gb-3")]);
    let p = stage(&c, &want(UID), &ctx, &held_none())
        .unwrap()
        .finish(&BTreeMap::from([(
            "gpu-1-mig-1g-10gb-3".to_string(),
            "MIG-one".to_string(),
        )]));
    assert!(env_of_is(&p, "NVIDIA_VISIBLE_DEVICES", "MIG-one"));
    assert!(env_of_is(&p, "CUDA_VISIBLE_DEVICES", "MIG-one"));
}

fn env_of_is(p: &PreparedClaim, key: &str, value: &str) -> bool {
    env(p).contains(&format!("{key}={value}"))
}

/// (case, device, other claims' holds, error wanted)
#[test]
fn dynamic_mig_refusals_table() {
    let (plan, inv) = dynamic_node(false);
    let (sick_plan, sick_inv) = dynamic_node(true);
    let g0 = inv.gpus[0].uuid.clone();
    let other = |device: &str, start: u32, size: u32| Held {
        exclusive: BTreeMap::from([(device.to_string(), "ns/other".to_string())]),
        dynamic_mig: vec![HeldMig {
            gpu_uuid: g0.clone(),
            placement: MigPlacement { start, size },
            holder: "ns/other".into(),
        }],
        ..Held::default()
    };
    let cases: Vec<(&str, &str, Held, bool, &str)> = vec![
        (
            "unknown profile",
            "gpu-0-mig-9g-99gb-0",
            held_none(),
            false,
            "is not a device of this node's DRA resources",
        ),
        (
            "unknown placement",
            "gpu-0-mig-3g-40gb-2",
            held_none(),
            false,
            "is not a device of this node's DRA resources",
        ),
        (
            "unknown GPU",
            "gpu-7-mig-3g-40gb-0",
            held_none(),
            false,
            "is not a device of this node's DRA resources",
        ),
        (
            "held by name",
            "gpu-0-mig-3g-40gb-0",
            other("gpu-0-mig-3g-40gb-0", 0, 4),
            false,
            "is held by prepared claim ns/other",
        ),
        (
            "held overlapping",
            "gpu-0-mig-3g-40gb-0",
            other("gpu-0-mig-1g-10gb-2", 2, 1),
            false,
            "is held by prepared claim ns/other",
        ),
        (
            "unhealthy GPU",
            "gpu-1-mig-3g-40gb-0",
            held_none(),
            true,
            "is Unhealthy",
        ),
        (
            "placement taken by a static instance",
            "gpu-0-mig-3g-40gb-4",
            held_none(),
            false,
            "overlaps the MIG device at memory slices 6..7",
        ),
    ];
    for (case, device, held, sick, msg) in cases {
        let (plan, inv) = if sick {
            (&sick_plan, &sick_inv)
        } else {
            (&plan, &inv)
        };
        let ctx = context(plan, inv, None);
        let c = claim(UID, &[("mig", DRIVER, NODE, device)]);
        let e = stage(&c, &want(UID), &ctx, &held).unwrap_err();
        assert!(e.to_string().contains(msg), "{case}: {e}");
    }
    // A GPU the plan does not partition on demand: its names are unknown.
    let policy =
        "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: [0]\n";
    let plan0 = plan::build(&parse(policy).unwrap(), &inv).unwrap().plan;
    let ctx = context(&plan0, &inv, None);
    let c = claim(UID, &[("mig", DRIVER, NODE, "gpu-1-mig-3g-40gb-0")]);
    let e = stage(&c, &want(UID), &ctx, &held_none()).unwrap_err();
    assert!(matches!(e, PrepareError::UnknownDevice { .. }), "{e}");
    // A held device of another GPU does not block this one.
    let c = claim(UID, &[("mig", DRIVER, NODE, "gpu-1-mig-3g-40gb-0")]);
    let ctx = context(&plan, &inv, None);
    assert!(stage(&c, &want(UID), &ctx, &other("gpu-0-mig-3g-40gb-0", 0, 4)).is_ok());
    // Unhealthy in the plan only (an Xid the daemon folded in; discovery says Healthy): refused
    // as a static device of an Unhealthy GPU is.
    let mut xid_plan = plan.clone();
    xid_plan.dynamic_mig[1].health = Health::Unhealthy;
    let ctx = context(&xid_plan, &inv, None);
    let e = stage(&c, &want(UID), &ctx, &held_none()).unwrap_err();
    assert!(matches!(e, PrepareError::Unhealthy { .. }), "{e}");
}
