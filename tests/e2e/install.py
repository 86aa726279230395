"""slicelet installed as a user installs it: its OCI image (.ci/image) imported into containerd,
the chart rendered by Helm's own engine (the helm-python-sdk the chart checks use) or the
kustomize overlay rendered by kubectl, and the result applied with kubectl.
"""

import importlib.util
import json
import os
import tarfile

import yaml

from node import REPO, Failure

NAMESPACE = "slicelet-system"
REPOSITORY = "e2e.local/slicelet"


def image_tag(archive):
    """The tag in slicelet's OCI archive (its index's ref name: the crate version)."""
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))
    return index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]


def import_image(cluster, archive=None, *extra_tags):
    """Imports slicelet's OCI archive (default: E2E_IMAGE) as e2e.local/slicelet:<tag>, plus
    any extra tags of the same image; returns the tag."""
    archive = archive or os.environ["E2E_IMAGE"]
    tag = image_tag(archive)
    cluster.ctr("images", "import", "--local", "--snapshotter", "native", "--base-name", REPOSITORY, archive)
    for t in extra_tags:
        cluster.ctr("images", "tag", "--force", f"{REPOSITORY}:{tag}", f"{REPOSITORY}:{t}")
    return tag


def _chart_module():
    spec = importlib.util.spec_from_file_location("chart_checks", REPO / ".ci/chart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def api_env(cluster):
    """The pod's way to the API server on this node: the `kubernetes` Service has no proxy
    here (no kube-proxy), so a host-network pod (`devicePlugin.enableHostNetwork`) is pointed
    at the API server's loopback address, as in-cluster clients read it
    (KUBERNETES_SERVICE_HOST/PORT)."""
    return [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.api_port)},
    ]


def render_chart(values):
    """`helm template slicelet deployments/helm/slicelet -n slicelet-system -f values`, by
    Helm's engine."""
    manifest = _chart_module().render(REPO / "deployments/helm/slicelet", values, "1.36.0", NAMESPACE)
    return [o for o in yaml.safe_load_all(manifest) if o]


def apply_objects(kube, objs):
    """Applies rendered objects (the namespace first, created if missing)."""
    kube.c.kubectl("create", "namespace", NAMESPACE, check=False)
    kube.apply(*objs)


def daemonset_ready(kube, name="slicelet", timeout=60):
    p = kube.c.kubectl("rollout", "status", f"ds/{name}", "-n", NAMESPACE, f"--timeout={timeout}s",
                       check=False, timeout=timeout + 30)
    if p.returncode != 0:
        pods = kube.get("pods", namespace=NAMESPACE) or {"items": []}
        detail = "\n".join(kube.story(f"pod/{x['metadata']['name']}", NAMESPACE) for x in pods["items"])
        raise Failure(f"DaemonSet {name} not rolled out in {timeout} s: {p.stdout}{p.stderr}\n{detail}")


def daemon_pod(kube):
    pods = kube.get("pods", namespace=NAMESPACE)["items"]
    live = [p for p in pods if p["metadata"].get("deletionTimestamp") is None
            and p["metadata"]["labels"].get("app.kubernetes.io/name") == "slicelet"]
    if len(live) != 1:
        raise Failure(f"expected one slicelet pod, found {[p['metadata']['name'] for p in live]}")
    return live[0]


def uninstall(kube, objs):
    """Deletes what was applied (the DaemonSet's pod gone before the call returns)."""
    kube.c.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=60s", "-f", "-",
                   input="\n---\n".join(yaml.safe_dump(o) for o in objs if o["kind"] != "Namespace"),
                   check=False, timeout=90)
