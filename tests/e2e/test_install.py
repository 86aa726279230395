"""slicelet installed as a user installs it, and day 2 with it: the chart's DaemonSet and the
kustomize overlay, each serving a GPU pod; a rolling update of the DaemonSet and a kubelet
restart under running device-plugin and DRA pods; a node moved to DRA by its config label
while a device-plugin pod holds a replica.
"""

import json
import os
import textwrap

import pytest
import yaml

from cluster import NODE, wait_for
from install import (NAMESPACE, REPOSITORY, api_env, apply_objects, daemon_pod, daemonset_ready,
                     import_image, render_chart, uninstall)
from node import PRINT_ENV, REPO, claim_template, container_env, pod
from test_paths import claimed

GPU_SHARED = "jsonpath={.status.allocatable.nvidia\\.com/gpu-shared}"


class Installed:
    """Objects applied for a scenario; stop() deletes them."""

    def __init__(self, kube):
        self.kube, self.objs = kube, []

    def __call__(self, objs):
        apply_objects(self.kube, objs)
        self.objs = objs
        daemonset_ready(self.kube)

    def stop(self):
        if self.objs:
            uninstall(self.kube, self.objs)


@pytest.fixture
def installed(kube, daemons):
    """installed(objects): applies rendered objects and waits for the DaemonSet; they are
    deleted after the scenario, once its namespace is emptied (see `daemons`)."""
    i = Installed(kube)
    daemons.append(i)
    return i


def test_chart_daemonset_serves_a_gpu_pod(cluster, kube, ns, installed):
    tag = import_image(cluster, None)
    installed(render_chart({
        "simulate": {"enabled": True},
        "image": {"repository": REPOSITORY, "tag": tag},
    }))
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=32", timeout=30,
              why=lambda: kube.story(f"pod/{daemon_pod(kube)['metadata']['name']}", NAMESPACE))
    kube.apply(pod("gpu", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    env = container_env(cluster, kube.pod_running(ns, "gpu"))
    assert env.get("NVIDIA_VISIBLE_DEVICES", "").startswith("GPU-"), env


def test_kustomize_overlay_serves_a_gpu_pod(cluster, kube, ns, installed, tmp_path):
    tag = import_image(cluster, None)
    # The user's `kustomize edit set image ghcr.io/slicelet-dev/slicelet=<registry>/slicelet:<tag>`,
    # in an overlay of the simulated overlay (the name as the base's own `images` leaves it).
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests/overlays/simulated", overlay)],
        "images": [{"name": "ghcr.io/slicelet-dev/slicelet", "newName": REPOSITORY, "newTag": tag}],
    }))
    rendered = kube.c.kubectl("kustomize", "--load-restrictor", "LoadRestrictionsNone", overlay).stdout
    installed([o for o in yaml.safe_load_all(rendered) if o])
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=32", timeout=30)
    kube.apply(pod("gpu", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    env = container_env(cluster, kube.pod_running(ns, "gpu"))
    assert env.get("NVIDIA_VISIBLE_DEVICES", "").startswith("GPU-"), env


# Two configs the node picks by label: GPUs 0-3 time-sliced as nvidia.com/gpu-shared through
# the device plugin (`device-plugin`) or through DRA (`dra`), GPUs 4-7 whole through DRA.
def day2_config(replicas, dra):
    return textwrap.dedent(f"""\
        version: v1
        dra:
          resources: [nvidia.com/gpu]
        sharing:
          timeSlicing:
            resources:
              - name: nvidia.com/gpu
                rename: nvidia.com/gpu-shared
                devices: [0, 1, 2, 3]
                replicas: {replicas}
        """) + ("        dra: true\n" if dra else "")


def day2_values(cluster, tag, replicas=4):
    return {
        "simulate": {"enabled": True},
        "image": {"repository": REPOSITORY, "tag": tag},
        # The API server listens on the node's loopback address (api_env).
        "devicePlugin": {"enableHostNetwork": True},
        "env": api_env(cluster),
        "dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu-shared"]},
        "config": {
            "map": {"device-plugin": day2_config(replicas, False), "dra": day2_config(replicas, True)},
            "default": "device-plugin",
        },
    }


def kubelet_log(cluster, since=0):
    return cluster.procs["kubelet"].log.read_text(errors="replace")[since:]


def registrations(cluster, since):
    """Registrations the kubelet took since byte `since` of its log: device-plugin resources
    by name, and DRA plugin registrations."""
    log = kubelet_log(cluster, since)
    dp = {}
    for line in log.splitlines():
        if "Got registration request from device plugin with resource" in line:
            name = line.rsplit('resourceName="', 1)[1].rstrip('"')
            dp[name] = dp.get(name, 0) + 1
    dra = sum(1 for line in log.splitlines()
              if "RegisterPlugin started" in line and "gpu.slicelet.io-reg.sock" in line)
    return dp, dra


def wait_dra_connected(cluster, kube, since):
    """The kubelet connected to the DRA plugin (registration and its health stream) after
    byte `since` of its log: DRA pods created before are retried only after a long backoff."""
    wait_for("the kubelet's DRA connection",
             lambda: "Successfully started WatchResources health stream" in kubelet_log(cluster, since), 30)


def holders(cluster, kube, ns, pods):
    """Who holds what: each pod's device-plugin IDs (the kubelet's checkpoint) and DRA devices
    (its claims' allocations)."""
    cp = json.loads((cluster.root / "device-plugins/kubelet_internal_checkpoint").read_text())
    out = {}
    for name in pods:
        p = kube.get("pod", name, ns)
        ids = [i for e in cp["Data"]["PodDeviceEntries"] if e["PodUID"] == p["metadata"]["uid"]
               for v in e["DeviceIDs"].values() for i in v]
        devs = [r["device"] for r in claimed(kube, ns, p)]
        cs = p["status"]["containerStatuses"][0]
        out[name] = {"ids": sorted(ids + devs), "container": cs["containerID"], "restarts": cs["restartCount"]}
    return out


def assert_one_holder_each(h):
    seen = {}
    for name, v in h.items():
        for i in v["ids"]:
            assert i not in seen, f"{i} held by {seen[i]} and {name}"
            seen[i] = name


def test_rolling_update_and_kubelet_restart_keep_running_pods(cluster, kube, ns, installed):
    tag = import_image(cluster, None, "next")
    since = len(kubelet_log(cluster))
    installed(render_chart(day2_values(cluster, tag)))
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=16", timeout=30)
    wait_dra_connected(cluster, kube, since)
    kube.apply(claim_template("gpu", "gpu.slicelet.io"), namespace=ns)
    kube.apply(pod("dp", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    kube.apply(pod("dra", PRINT_ENV, claims=[("gpu", "gpu")]), namespace=ns)
    kube.pod_running(ns, "dp")
    kube.pod_running(ns, "dra")
    before = holders(cluster, kube, ns, ["dp", "dra"])
    assert all(v["ids"] for v in before.values()), before

    # (a) A rolling update: a new image tag and a changed policy (2 replicas per GPU).
    old = daemon_pod(kube)["metadata"]["name"]
    since = len(kubelet_log(cluster))
    installed(render_chart(day2_values(cluster, "next", replicas=2)))
    new = daemon_pod(kube)
    assert new["metadata"]["name"] != old and new["spec"]["containers"][0]["image"].endswith(":next")
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=8", timeout=30)
    wait_dra_connected(cluster, kube, since)
    dp, dra = registrations(cluster, since)
    assert dp == {"nvidia.com/gpu-shared": 1} and dra == 1, (dp, dra)
    assert holders(cluster, kube, ns, ["dp", "dra"]) == before
    # New pods get devices nobody holds.
    kube.apply(pod("dp2", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    kube.apply(pod("dra2", PRINT_ENV, claims=[("gpu", "gpu")]), namespace=ns)
    kube.pod_running(ns, "dp2")
    kube.pod_running(ns, "dra2")
    assert_one_holder_each(holders(cluster, kube, ns, ["dp", "dra", "dp2", "dra2"]))

    # (b) The kubelet restarts: the pods keep running, slicelet registers again, once.
    before = holders(cluster, kube, ns, ["dp", "dra", "dp2", "dra2"])
    since = len(kubelet_log(cluster))
    cluster.restart_kubelet()
    wait_dra_connected(cluster, kube, since)
    wait_for("the device plugin's registration after the kubelet's restart",
             lambda: registrations(cluster, since)[0].get("nvidia.com/gpu-shared"), 30)
    kube.wait(f"node/{NODE}", "condition=Ready", timeout=30)
    for name in before:
        kube.pod_running(ns, name)
    dp, dra = registrations(cluster, since)
    assert dp == {"nvidia.com/gpu-shared": 1} and dra == 1, (dp, dra)
    assert holders(cluster, kube, ns, list(before)) == before
    # The kubelet wiped the node's ResourceSlices at its start; slicelet published them again.
    first = f"{NODE}-gpu-slicelet-io-0"
    kube.wait(f"resourceslice/{first}", "create", timeout=20)
    held = {i for v in before.values() for i in v["ids"] if "::" not in i}
    kube.watch_until("resourceslice", first, lambda s: held <= {d["name"] for d in s["spec"].get("devices", [])},
                     20, what=f"devices {sorted(held)} published again")


def bridged(p):
    """Whether the pod got its extended resource through the bridge (a claim the scheduler made)."""
    return bool((p["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))


def test_node_moves_to_dra_by_label_once_its_holders_end(cluster, kube, ns, installed):
    tag = import_image(cluster, None)
    since = len(kubelet_log(cluster))
    installed(render_chart(day2_values(cluster, tag)))
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=16", timeout=30)
    wait_dra_connected(cluster, kube, since)
    kube.apply(pod("old", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    kube.pod_running(ns, "old")
    [old] = holders(cluster, kube, ns, ["old"])["old"]["ids"]
    old_gpu = old.split("::")[0]

    # The node's label chooses the `dra` config while `old` holds a replica: the resource stays
    # with the device plugin, the held GPU's free replicas are withdrawn (draining), and DRA
    # publishes none of it.
    kube.c.kubectl("label", "node", NODE, "nvidia.com/device-plugin.config=dra", "--overwrite")
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=13", timeout=30)  # 16 less the 3 free replicas of old's GPU
    published = [d for d in slice_devices_of(kube) if attr_of(d, "resource") == "nvidia.com/gpu-shared"]
    assert published == [], published
    kube.apply(pod("meanwhile", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    p = kube.pod_running(ns, "meanwhile")
    assert not bridged(p), p["status"]
    [mid] = holders(cluster, kube, ns, ["meanwhile"])["meanwhile"]["ids"]
    assert not mid.startswith(old_gpu + "::"), (old, mid)

    # Its holders end: the device plugin stops serving the name, its devices are DRA's.
    kube.delete("pod", "old", ns)
    kube.delete("pod", "meanwhile", ns)
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=0", timeout=30)
    kube.watch_until("resourceslice", f"{NODE}-gpu-slicelet-io-0",
                     lambda s: sum(attr_of(d, "resource") == "nvidia.com/gpu-shared" for d in s["spec"].get("devices", [])) == 16,
                     20, what="the 16 nvidia.com/gpu-shared devices published through DRA")
    # New pods asking the name now land through the bridge: the kubelet lists the stopped
    # device plugin's resource at 0, which sends the request to DRA.
    kube.apply(pod("after", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    p = kube.pod_running(ns, "after")
    assert bridged(p), p["status"]
    kube.delete("pod", "after", ns)

    # Labelled back: the device plugin serves the name again, DRA withdraws it.
    kube.c.kubectl("label", "node", NODE, "nvidia.com/device-plugin.config=device-plugin", "--overwrite")
    kube.wait(f"node/{NODE}", f"{GPU_SHARED}=16", timeout=30)
    kube.apply(pod("back", PRINT_ENV, limits={"nvidia.com/gpu-shared": 1}), namespace=ns)
    assert not bridged(kube.pod_running(ns, "back"))
    devices = slice_devices_of(kube)
    assert not [d for d in devices if attr_of(d, "resource") == "nvidia.com/gpu-shared"], devices


def slice_devices_of(kube):
    return [d for s in kube.get("resourceslices")["items"] if s["spec"].get("nodeName") == NODE
            for d in s["spec"].get("devices", [])]


def attr_of(device, name):
    v = device.get("attributes", {}).get(name)
    return next(iter(v.values())) if v else None
