"""Fixtures of the end-to-end suite: one real cluster for the whole run (torn down at the end,
whatever failed), an empty namespace per scenario (deleted, and waited for, after it), and
slicelet daemons on the node (stopped after the scenario).

Environment (`.ci/e2e` sets it; docs/contributing.md says how to run the suite by hand):
  E2E_KIT_BIN    a folder with kube-apiserver, kube-controller-manager, kube-scheduler,
                 kubelet, kubectl (v1.36), containerd, containerd-shim-runc-v2 and ctr
  E2E_ETCD       the etcd binary
  SLICELET_BIN   the slicelet binary under test (the release build)
  FAKE_NVML      the fake NVML library (fixtures/fake-nvml), for the memory-limit hook
  E2E_IMAGE      slicelet's OCI image archive (.ci/image), for the install scenarios
  E2E_KEEP=1     keep the scratch directory (every component's log) after the run
"""

import os
import re

import pytest

from cluster import Cluster
from node import REPO, Kube, Slicelet


def _env(name):
    v = os.environ.get(name)
    if not v:
        pytest.exit(f"{name} is not set (see tests/e2e/conftest.py)", returncode=2)
    return v


@pytest.fixture(scope="session")
def cluster():
    c = Cluster(_env("E2E_KIT_BIN"), _env("E2E_ETCD"))
    try:
        c.start()
        print(f"\ncluster up in {c.up_seconds:.1f} s ({c.dir})")
        yield c
    finally:
        c.stop()


@pytest.fixture
def kube(cluster):
    return Kube(cluster)


@pytest.fixture
def daemons():
    """What serves the node in a scenario (slicelet daemons, installed DaemonSets: anything
    with stop()): stopped after its namespace is emptied (the kubelet unprepares the pods'
    claims through them), so `ns` depends on this fixture."""
    started = []
    yield started
    for d in started:
        d.stop()


@pytest.fixture
def ns(request, kube, daemons):
    """An empty namespace named after the scenario; deleted after it, waiting until its pods
    and claims are gone (a claim left prepared would hold its GPU for the next scenario)."""
    name = "e2e-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:50].strip("-")
    kube.c.kubectl("create", "namespace", name)
    kube.wait("serviceaccount/default", "create", name, timeout=30)
    yield name
    # Pods first, waiting until the kubelet has stopped them and slicelet unprepared their
    # claims; then the claims; the namespace itself goes in the background.
    for kind in ("pods", "resourceclaims"):
        kube.c.kubectl("delete", kind, "--all", "-n", name, "--wait=true", "--timeout=60s", check=False, timeout=90)
    kube.c.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def slicelet(cluster, kube, daemons):
    """Starts `slicelet run` on the node: slicelet(config, node_file, *extra flags), stopped
    after the scenario (see `daemons`). The DeviceClasses of manifests/overlays/dra are
    applied first (an installed chart's, deleted with it, are the same)."""

    def start(config, node_file, *extra, name="slicelet"):
        kube.apply_file(REPO / "manifests/overlays/dra/deviceclasses.yaml")
        d = Slicelet(cluster, _env("SLICELET_BIN"), config, node_file, extra, name)
        daemons.append(d)
        return d

    return start


@pytest.fixture
def work(tmp_path):
    """A scratch folder for the policies and node files a scenario writes."""
    return tmp_path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failure, the tail of every daemon's log goes into the report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed and "cluster" in item.fixturenames:
        c = item.funcargs.get("cluster")
        if c:
            logs = [c.logs / n for n in sorted(os.listdir(c.logs)) if n.startswith(("slicelet", "kubelet"))]
            # The DaemonSet's slicelet, from containerd's log files while its pod exists.
            logs += sorted(c.pod_logs.glob("slicelet-system_*/*/*.log"))
            for log in logs:
                text = log.read_text(errors="replace").splitlines()[-25:]
                rep.sections.append((f"log {log.relative_to(c.dir) if c.dir in log.parents else log.name}", "\n".join(text)))
