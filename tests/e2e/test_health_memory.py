"""GPU health as the scheduler and the pod see it (device taints, `allocatedResourcesStatus`),
and per-container GPU memory limits set by slicelet's CDI hook when containerd creates the
container.
"""

import json
import os
import time

from cluster import NODE, run
from node import PRINT_ENV, REPO, Failure, claim_template, container_env, pod, serve_dra
from test_paths import DRA_WHOLE, allocated, attr

# Two H100s listed one by one, so that a scenario can mark one Unhealthy.
GPU = """  - model: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    computeCapability: "9.0"
    numaNode: 0
"""


def two_gpus(unhealthy=None):
    return "gpus:\n" + "".join(
        GPU + ("    health: Unhealthy\n" if i == unhealthy else "") for i in range(2)
    )


def slice_of(kube, device):
    for s in kube.get("resourceslices")["items"]:
        if s["spec"].get("nodeName") == NODE and any(d["name"] == device for d in s["spec"].get("devices", [])):
            return s["metadata"]["name"]
    raise Failure(f"no ResourceSlice of {NODE} publishes {device}")


def test_unhealthy_gpu_taints_its_device_and_the_pods_status(cluster, kube, ns, slicelet, work):
    node = work / "node.yaml"
    node.write_text(two_gpus())
    serve_dra(slicelet, work, DRA_WHOLE, node)
    kube.apply(claim_template("gpu", "gpu.slicelet.io"), namespace=ns)
    kube.apply(pod("sick", PRINT_ENV, claims=[("gpu", "gpu")]), namespace=ns)
    p = kube.pod_running(ns, "sick")
    [(device, attrs, _)] = allocated(kube, ns, p)
    index = attr(attrs, "index")
    slice_name = slice_of(kube, device)

    def device_taints(s):
        return [t for d in s["spec"]["devices"] if d["name"] == device for t in d.get("taints", [])]

    def pod_health(p):
        st = p["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or [{}]
        return [r.get("health") for r in st[0].get("resources", [])]

    def within(seconds, started, slice_ok, pod_ok, what):
        kube.watch_until("resourceslice", slice_name, slice_ok, seconds, what=f"device {device} {what}")
        left = seconds - (time.monotonic() - started)
        p = kube.watch_until("pod", "sick", pod_ok, max(left, 0.1), ns, what=f"pod status {what}")
        return time.monotonic() - started, p

    # The GPU fails: the scheduler sees a taint on its device, the pod an Unhealthy device.
    started = time.monotonic()
    node.write_text(two_gpus(unhealthy=index))
    took, p = within(2, started, lambda s: [t["value"] for t in device_taints(s)] == ["lost"],
                     lambda p: pod_health(p) == ["Unhealthy"], "Unhealthy")
    [res] = p["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
    assert res.get("message"), res  # slicelet's words for why
    print(f"unhealthy: taint and pod status in {took:.2f} s; message {res.get('message')!r}")
    # It recovers: both clear.
    started = time.monotonic()
    node.write_text(two_gpus())
    took, _ = within(2, started, lambda s: device_taints(s) == [],
                     lambda p: pod_health(p) == ["Healthy"], "Healthy again")
    print(f"recovered: cleared in {took:.2f} s")


def gpu_uuids(binary, policy, node):
    plan = json.loads(run(binary, "plan", "--config", policy, "--simulate", node, "--output", "json").stdout)
    return sorted({d["gpu"] for r in plan["resources"] for d in r["devices"]})


def nvidia_cdi_spec(uuids):
    """The NVIDIA Container Toolkit's spec for these GPUs, as a node without GPUs can have it:
    kind nvidia.com/gpu, one device per UUID, environment only (no device nodes)."""
    return json.dumps({
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": u, "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={u}"]}} for u in uuids
        ],
    })


def cgroup2_root():
    for line in open("/proc/self/mountinfo"):
        mount, _, fs = line.partition(" - ")
        if fs.split()[0] == "cgroup2":
            return mount.split()[4]
    raise Failure("no cgroup2 hierarchy: NVML's memory limits need cgroup v2")


def container_cgroup(cluster, pod_obj):
    """The container's cgroup v2 directory: its process's `0::` line, under the cgroup2 mount."""
    cid = pod_obj["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    for line in cluster.ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, _ = line.split()
        if task == cid:
            for cg in open(f"/proc/{pid}/cgroup"):
                if cg.startswith("0::"):
                    return cgroup2_root() + cg[3:].strip()
    raise Failure(f"no containerd task {cid}")


def records(state_dir):
    out = []
    for f in sorted(state_dir.glob("*.json")):
        v = json.loads(f.read_text())
        out.append((v["uuid"], v["nameSpace"], v["softLimit"], v["hardLimit"]))
    return out


def test_memory_limit_hook_caps_the_containers_cgroup(cluster, kube, ns, slicelet, work, request):
    binary, fake = os.environ["SLICELET_BIN"], os.environ.get("FAKE_NVML")
    if not fake:
        raise Failure("FAKE_NVML is not set (the fake NVML library, fixtures/fake-nvml)")
    policy = REPO / "config/policy-memory.yaml"
    node = REPO / "config/nodes/h100-80gb-x8-r615.yaml"
    uuids = gpu_uuids(binary, policy, node)
    spec = cluster.cdi / "nvidia-e2e.json"
    spec.write_text(nvidia_cdi_spec(uuids))
    request.addfinalizer(spec.unlink)
    gpu0 = json.loads(run(binary, "plan", "--config", policy, "--simulate", node, "--output", "json").stdout)
    gpu0 = next(r for r in gpu0["resources"] if r["name"] == "nvidia.com/gpu-20gb")["devices"][0]["gpu"]
    inventory, state = work / "nvml.json", work / "nvml-state"
    fake_gpu = {"uuid": gpu0, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "minor": 0,
                "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0"}
    inventory.write_text(json.dumps({"driverVersion": "615.20", "gpus": [fake_gpu]}))
    d = slicelet(policy, node, "--hook-binary", binary, "--nvml-library", fake, "--hook-env",
                 f"FAKE_NVML_INVENTORY={inventory},FAKE_NVML_STATE_DIR={state},"
                 f"SLICELET_HOOK_CGROUP_ROOT={cgroup2_root()}")
    kube.wait(f"node/{NODE}", "jsonpath={.status.allocatable.nvidia\\.com/gpu-20gb}=2", timeout=20,
              why=lambda: d.proc.tail())
    kube.apply(pod("capped", PRINT_ENV, limits={"nvidia.com/gpu-20gb": 1}), namespace=ns)
    p = kube.pod_running(ns, "capped")
    env = container_env(cluster, p)
    assert env.get("SLICELET_GPU_MEMORY_LIMIT_MIB") == "20480", env
    assert env.get("NVIDIA_VISIBLE_DEVICES") == gpu0, env
    # The driver (the fake NVML the hook loaded) holds 20 GiB for the container's own cgroup.
    assert records(state) == [(gpu0, container_cgroup(cluster, p), 0, 20 << 30)], records(state)

    # NVML fails under `enforce: required` (the policy's default): the container never starts,
    # and the pod says why in the hook's words.
    inventory.write_text(json.dumps({"initError": 9, "driverVersion": "615.20", "gpus": [fake_gpu]}))
    kube.apply(pod("refused", PRINT_ENV, limits={"nvidia.com/gpu-20gb": 1}), namespace=ns)
    def refused(p):
        st = p["status"].get("containerStatuses") or [{}]
        return "memory limit not set" in st[0].get("state", {}).get("waiting", {}).get("message", "")

    p = kube.watch_until("pod", "refused", refused, 30, ns, what="the hook's refusal in the pod status")
    waiting = p["status"]["containerStatuses"][0]["state"]["waiting"]
    assert "enforce: required" in waiting["message"] and gpu0 in waiting["message"], waiting
    assert "running" not in p["status"]["containerStatuses"][0]["state"]
    print(f"refused ({waiting['reason']}): {waiting['message'][-160:]}")
