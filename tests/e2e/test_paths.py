"""The paths slicelet serves, each against the real kubelet, scheduler and containerd: the
device plugin, a DRA claim, consumable-capacity shares, the extended-resource bridge and MIG
through DRA.
"""

import json

from cluster import NODE, wait_for
from node import PRINT_ENV, REPO, claim_template, container_env, pod, serve_dra

H100 = REPO / "config/nodes/h100-80gb-x8.yaml"
POLICY = REPO / "config/policy.yaml"


def slice_devices(kube):
    """Every device slicelet publishes for the node, by name."""
    out = {}
    for s in kube.get("resourceslices")["items"]:
        if s["spec"].get("nodeName") == NODE:
            for d in s["spec"].get("devices", []):
                out[d["name"]] = d
    return out


def claimed(kube, ns, pod_obj):
    """The allocation results of the pod's claims (one per device)."""
    out = []
    for st in pod_obj["status"].get("resourceClaimStatuses", []):
        claim = kube.get("resourceclaim", st["resourceClaimName"], ns)
        out += claim["status"]["allocation"]["devices"]["results"]
    return out


def allocated(kube, ns, pod_obj):
    """The devices allocated to the pod's claims: [(device name, its published attributes)]."""
    devices = slice_devices(kube)
    return [(r["device"], devices[r["device"]]["attributes"], r) for r in claimed(kube, ns, pod_obj)]


def attr(attrs, name):
    v = attrs[name]
    return next(iter(v.values()))


def test_device_plugin_pod_gets_one_gpu(cluster, kube, ns, slicelet):
    d = slicelet(POLICY, H100)
    kube.wait(f"node/{NODE}", "jsonpath={.status.allocatable.nvidia\\.com/gpu-shared}=32", timeout=20,
              why=lambda: d.proc.tail())
    kube.apply(pod("dp", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    p = kube.pod_running(ns, "dp")
    env = container_env(cluster, p)
    uuid = env.get("NVIDIA_VISIBLE_DEVICES", "")
    assert uuid.startswith("GPU-") and "," not in uuid, env
    assert env.get("CUDA_VISIBLE_DEVICES") == uuid, env
    # The kubelet's own record names one replica of that GPU for this pod.
    cp = json.loads((cluster.root / "device-plugins/kubelet_internal_checkpoint").read_text())
    mine = [
        e for e in cp["Data"]["PodDeviceEntries"]
        if e["PodUID"] == p["metadata"]["uid"] and e["ResourceName"] == "nvidia.com/gpu-shared"
    ]
    ids = [i for e in mine for ids in e["DeviceIDs"].values() for i in ids]
    assert len(ids) == 1 and ids[0].startswith(uuid + "::"), mine


DRA_WHOLE = """version: v1
dra:
  resources: [nvidia.com/gpu]
"""


def test_dra_claim_template_pod_gets_its_gpu(cluster, kube, ns, slicelet, work):
    serve_dra(slicelet, work, DRA_WHOLE, H100)
    kube.apply(claim_template("gpu", "gpu.slicelet.io"), namespace=ns)
    kube.apply(pod("dra", PRINT_ENV, claims=[("gpu", "gpu")]), namespace=ns)
    p = kube.pod_running(ns, "dra")
    [(name, attrs, _)] = allocated(kube, ns, p)
    env = container_env(cluster, p)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == attr(attrs, "uuid"), (name, env)
    # Somebody deletes the node's slices as a starting kubelet does (one DeleteCollection by
    # node and driver): slicelet's watch of them sees it and publishes them again, with no
    # registration and no plan change.
    first = f"{NODE}-gpu-slicelet-io-0"
    kube.c.kubectl("delete", "resourceslices", "--field-selector",
                   f"spec.nodeName={NODE},spec.driver=gpu.slicelet.io", "--wait=true")
    kube.wait(f"resourceslice/{first}", "create", timeout=20)
    kube.watch_until("resourceslice", first, lambda s: name in {d["name"] for d in s["spec"].get("devices", [])},
                     20, what=f"device {name} published again")


CAPACITY = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-shared
        devices: [0]
        replicas: 4
        dra: capacity
"""


def test_consumable_capacity_shares_fill_one_gpu(cluster, kube, ns, slicelet, work):
    serve_dra(slicelet, work, CAPACITY, H100)
    sizes = {"a": "20Gi", "b": "20Gi", "c": "38Gi"}
    for n, size in [*sizes.items(), ("d", "2Gi")]:
        kube.apply(claim_template(n, "time-sliced.gpu.slicelet.io", capacity={"memory": size}), namespace=ns)
    for n in sizes:
        kube.apply(pod(n, PRINT_ENV, claims=[("gpu", n)]), namespace=ns)
    for n, size in sizes.items():
        p = kube.pod_running(ns, n)
        env = container_env(cluster, p)
        assert env.get("SLICELET_GPU_SHARE_MEMORY_MIB") == str(int(size[:-2]) * 1024), (n, env)
    # 78 GiB of the H100's 81,559 MiB are taken: the scheduler holds a 2 GiB fourth back.
    kube.apply(pod("d", PRINT_ENV, claims=[("gpu", "d")]), namespace=ns)
    [ev] = kube.wait_event(ns, "d", "FailedScheduling")[-1:]
    assert "cannot allocate all claims" in ev["message"], ev["message"]
    assert kube.get("pod", "d", ns)["status"]["phase"] == "Pending"
    kube.delete("pod", "a", ns)
    p = kube.pod_running(ns, "d", timeout=60)
    assert container_env(cluster, p).get("SLICELET_GPU_SHARE_MEMORY_MIB") == "2048"


BRIDGE = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-shared
        replicas: 4
        dra: true
"""


def test_bridge_serves_the_extended_resource_through_dra(cluster, kube, ns, slicelet, work):
    kube.apply_file(REPO / "manifests/overlays/dra-bridge/bridge-deviceclass.yaml")
    serve_dra(slicelet, work, BRIDGE, H100)
    # The node does not advertise the name: only the bridge class can serve it.
    assert kube.get("node", NODE)["status"]["allocatable"].get("nvidia.com/gpu-shared", "0") == "0"
    kube.apply(pod("bridged", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    p = kube.pod_running(ns, "bridged")
    ext = p["status"].get("extendedResourceClaimStatus")
    assert ext and ext["resourceClaimName"], p["status"]
    claim = kube.get("resourceclaim", ext["resourceClaimName"], ns)
    [r] = claim["status"]["allocation"]["devices"]["results"]
    attrs = slice_devices(kube)[r["device"]]["attributes"]
    assert attr(attrs, "resource") == "nvidia.com/gpu-shared"
    env = container_env(cluster, p)
    assert env.get("NVIDIA_VISIBLE_DEVICES") == attr(attrs, "uuid"), env


MIG = """version: v1
flags:
  migStrategy: mixed
dra:
  resources: [nvidia.com/mig-1g.10gb, nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb]
"""


def test_mig_devices_through_dra(cluster, kube, ns, slicelet, work):
    d = serve_dra(slicelet, work, MIG, REPO / "config/nodes/h100-80gb-x8-mig-mixed.yaml")
    # The API server accepted every slice, the counter sets' first.
    kube.wait(f"resourceslice/{NODE}-gpu-slicelet-io-1", "create", timeout=20, why=lambda: d.proc.tail())
    slices = [s for s in kube.get("resourceslices")["items"] if s["spec"].get("nodeName") == NODE]
    assert slices and "sharedCounters" in slices[0]["spec"], [s["metadata"]["name"] for s in slices]
    kube.apply(claim_template("two", "mig-3g.40gb.gpu.slicelet.io", count=2), namespace=ns)
    kube.apply(pod("mig", PRINT_ENV, claims=[("gpu", "two")]), namespace=ns)
    p = kube.pod_running(ns, "mig")
    uuids = sorted(attr(a, "uuid") for _, a, _ in allocated(kube, ns, p))
    assert len(uuids) == 2 and all(u.startswith("MIG-") for u in uuids), uuids
    env = container_env(cluster, p)
    assert sorted(env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")) == uuids, env
    assert "publishing ResourceSlices failed" not in d.log(), d.proc.tail()


DYNAMIC_MIG = """version: v1
flags:
  migStrategy: mixed
dra:
  dynamicMig:
    devices: [0]
"""

# One H100 80GB in MIG mode with no instance: all 8 memory slices are free for claims.
H100_MIG_EMPTY = """gpus:
  - model: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    computeCapability: "9.0"
    numaNode: 0
    mig:
      devices: []
"""


def created_instances(node_file):
    """The MIG instances the simulated driver holds: {MIG UUID: placement start}."""
    state = node_file.with_name(node_file.name + ".mig-state.json")
    if not state.exists():
        return {}
    gpus = json.loads(state.read_text()).get("gpus", {})
    return {c["uuid"]: c["placementStart"] for g in gpus.values() for c in g.get("created", [])}


def running_placements(kube, ns, names):
    """Per running pod of `names`: (device name, placement start, size, MIG UUID in its env)."""
    out = {}
    for n in names:
        p = kube.get("pod", n, ns)
        if p["status"].get("phase") != "Running":
            continue
        [(device, attrs, _)] = allocated(kube, ns, p)
        out[n] = (device, attr(attrs, "placementStart"), attr(attrs, "placementSize"))
    return out


def assert_disjoint(placements):
    taken = {}
    for n, (device, start, size) in placements.items():
        for s in range(start, start + size):
            assert s not in taken, f"{n} ({device}) and {taken[s]} both cover memory slice {s}: {placements}"
            taken[s] = n


def test_dynamic_mig_claims_create_their_devices_where_the_scheduler_placed_them(cluster, kube, ns, slicelet, work):
    node_file = work / "h100-mig-empty.yaml"
    node_file.write_text(H100_MIG_EMPTY)
    d = serve_dra(slicelet, work, DYNAMIC_MIG, node_file)
    kube.wait(f"resourceslice/{NODE}-gpu-slicelet-io-1", "create", timeout=20, why=lambda: d.proc.tail())
    published = slice_devices(kube)
    assert any(n.startswith("gpu-0-mig-3g-40gb-") for n in published), sorted(published)
    # 4 + 2 + 1 of the 8 memory slices, largest first (a 1g.10gb placed first could split the
    # free half a 2g.20gb needs): all three fit wherever the scheduler puts each.
    wanted = {"a": "mig-3g.40gb", "b": "mig-2g.20gb", "c": "mig-1g.10gb"}
    for n, cls in [*wanted.items(), ("d", "mig-3g.40gb")]:
        kube.apply(claim_template(n, f"{cls}.gpu.slicelet.io"), namespace=ns)
    uuids = {}
    for n in wanted:
        kube.apply(pod(n, PRINT_ENV, claims=[("gpu", n)]), namespace=ns)
        p = kube.pod_running(ns, n, timeout=60)
        env = container_env(cluster, p)
        uuids[n] = env.get("NVIDIA_VISIBLE_DEVICES", "")
        assert uuids[n].startswith("MIG-") and "," not in uuids[n], (n, env)
    assert len(set(uuids.values())) == 3, uuids
    running = running_placements(kube, ns, wanted)
    assert_disjoint(running)
    # Each container's MIG device is one the (simulated) driver created at its placement.
    created = created_instances(node_file)
    assert {uuids[n]: running[n][1] for n in wanted} == created, (uuids, running, created)
    # A second 3g.40gb needs 4 free memory slices in one half: the counters hold it back.
    kube.apply(pod("d", PRINT_ENV, claims=[("gpu", "d")]), namespace=ns)
    [ev] = kube.wait_event(ns, "d", "FailedScheduling")[-1:]
    assert "cannot allocate all claims" in ev["message"], ev["message"]
    assert kube.get("pod", "d", ns)["status"]["phase"] == "Pending"
    assert_disjoint(running_placements(kube, ns, [*wanted, "d"]))
    # a ends: its instance is destroyed, and d runs in the placement a freed.
    kube.delete("pod", "a", ns)
    p = kube.pod_running(ns, "d", timeout=60)
    running = running_placements(kube, ns, ["b", "c", "d"])
    assert_disjoint(running)
    assert running["d"][1] == created[uuids["a"]], (running, created)
    env = container_env(cluster, p)
    created = created_instances(node_file)
    assert uuids["a"] not in created, created
    assert created.get(env.get("NVIDIA_VISIBLE_DEVICES")) == running["d"][1], (env, created)
    # Every claim gone: every instance slicelet created is destroyed.
    for n in ["b", "c", "d"]:
        kube.delete("pod", n, ns)
    wait_for("the created MIG instances destroyed", lambda: not created_instances(node_file), timeout=30)
    assert "publishing ResourceSlices failed" not in d.log(), d.proc.tail()
