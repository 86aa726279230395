"""What a scenario does on the cluster: objects applied and waited on with kubectl (the real
client, through watches: `kubectl wait`), slicelet daemons started on the node, and what a
container saw (its log file, written by containerd under the kubelet's pod-log directory).
"""

import json
import os
import re
import selectors
import subprocess
import time
from pathlib import Path

import yaml

from cluster import NODE, IMAGE, Process, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]


class Failure(AssertionError):
    """A scenario's failure, carrying the cluster's own words (events, logs)."""


def dump(objs):
    return "\n---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objs)


class Kube:
    """kubectl on the cluster, with the waits scenarios need."""

    def __init__(self, cluster):
        self.c = cluster

    def apply(self, *objs, namespace=None):
        args = ["apply", "--validate=false", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        self.c.kubectl(*args, input=dump(objs))

    def apply_file(self, path, namespace=None):
        args = ["apply", "--validate=false", "-f", str(path)]
        if namespace:
            args += ["-n", namespace]
        self.c.kubectl(*args)

    def get(self, kind, name=None, namespace=None, check=True):
        args = ["get", kind] + ([name] if name else []) + ["-o", "json"]
        if namespace:
            args += ["-n", namespace]
        p = self.c.kubectl(*args, check=check)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def delete(self, kind, name, namespace=None, wait=True):
        args = ["delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}", "--timeout=90s"]
        if namespace:
            args += ["-n", namespace]
        self.c.kubectl(*args, timeout=120)

    def wait(self, target, condition, namespace=None, timeout=30, why=None):
        """`kubectl wait --for=<condition> <target>`; on a time-out, a Failure with `why()`
        (the cluster's words) or the pod's events."""
        args = ["wait", f"--for={condition}", target, f"--timeout={timeout}s"]
        if namespace:
            args += ["-n", namespace]
        p = self.c.kubectl(*args, check=False, timeout=timeout + 30)
        if p.returncode != 0:
            detail = why() if why else self.story(target, namespace)
            raise Failure(f"{target} never reached {condition} within {timeout} s: {p.stderr.strip()}\n{detail}")

    def watch_until(self, kind, name, predicate, timeout, namespace=None, what=None):
        """Watches one object (`kubectl get --watch -o json`: its state now, then every
        change) until `predicate(obj)` holds; returns that object, or raises a Failure with the
        last state seen after `timeout` s."""
        args = [str(self.c.bin / "kubectl"), "--kubeconfig", str(self.c.kubeconfig), "get", kind, name,
                "--watch", "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        w = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        os.set_blocking(w.stdout.fileno(), False)
        buf, last = "", None
        decoder = json.JSONDecoder()
        sel = selectors.DefaultSelector()
        sel.register(w.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(timeout=left):
                    continue
                chunk = w.stdout.read()
                if not chunk:
                    break
                buf += chunk.decode()
                while buf.strip():
                    try:
                        obj, end = decoder.raw_decode(buf.lstrip())
                    except ValueError:
                        break
                    buf = buf.lstrip()[end:]
                    last = obj
                    if predicate(obj):
                        return obj
        finally:
            w.kill()
            w.wait()
        raise Failure(f"{kind}/{name}: {what or 'condition'} not reached within {timeout:.1f} s; last seen: {json.dumps(last)[:2000]}")

    def story(self, target, namespace):
        """What the cluster says about `kind/name`: its events and, for a pod, its status."""
        kind, _, name = target.partition("/")
        out = []
        ev = self.get("events", namespace=namespace, check=False) or {"items": []}
        for e in ev["items"]:
            inv = e.get("involvedObject", {})
            if inv.get("name") == name:
                out.append(f"  event {e.get('reason')}: {e.get('message')}")
        if kind in ("pod", "pods"):
            pod = self.get("pod", name, namespace, check=False)
            if pod:
                st = pod.get("status", {})
                out.append(f"  phase {st.get('phase')}")
                for cs in st.get("containerStatuses", []):
                    out.append(f"  container {cs['name']}: {json.dumps(cs.get('state'))}")
        return "\n".join(out) or "  (no events)"

    def pod_running(self, ns, name, timeout=30):
        self.wait(f"pod/{name}", "condition=Ready", ns, timeout)
        return self.get("pod", name, ns)

    def events(self, ns, name, reason=None):
        ev = self.get("events", namespace=ns)["items"]
        return [
            e for e in ev
            if e["involvedObject"].get("name") == name and (reason is None or e.get("reason") == reason)
        ]

    def wait_event(self, ns, name, reason, timeout=30):
        """Waits for an event of `reason` on `name`: `kubectl get events --watch` on a field
        selector (it lists what exists, then streams what comes) until its first line."""
        field = f"involvedObject.name={name},reason={reason}"
        w = subprocess.Popen(
            [str(self.c.bin / "kubectl"), "--kubeconfig", str(self.c.kubeconfig), "get", "events",
             "-n", ns, "--field-selector", field, "--watch", "-o", "name"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            sel = selectors.DefaultSelector()
            sel.register(w.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(timeout=left) and w.stdout.readline().strip():
                    return self.events(ns, name, reason)
            raise Failure(f"no {reason} event for {name} within {timeout} s:\n{self.story('pod/' + name, ns)}")
        finally:
            w.kill()
            w.wait()


def pod(name, command, limits=None, claims=None, **extra):
    """A busybox pod on the node running `command` (sh -c), with extended-resource `limits`
    and `claims` (a list of (claim name, template name) pairs) on its one container `c`."""
    container = {
        "name": "c",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command],
        "resources": {},
    }
    if limits:
        container["resources"]["limits"] = dict(limits)
    spec = {"terminationGracePeriodSeconds": 1, "containers": [container]}
    if claims:
        container["resources"]["claims"] = [{"name": n} for n, _ in claims]
        spec["resourceClaims"] = [
            {"name": n, "resourceClaimTemplateName": t} for n, t in claims
        ]
    spec.update(extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def claim_template(name, device_class, count=1, capacity=None, selectors=None):
    exactly = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


# The command of a pod whose environment a scenario reads: it prints it once, then sleeps.
PRINT_ENV = "env | sort; echo ENV-END; exec sleep 3600"


def container_env(cluster, pod_obj, container="c", timeout=10):
    """The environment a running container printed (PRINT_ENV), from its CRI log file:
    `<pod-logs>/<ns>_<pod>_<uid>/<container>/0.log`, lines `<time> stdout F <text>`."""
    meta = pod_obj["metadata"]
    log = cluster.pod_logs / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / container / "0.log"

    def done():
        return "ENV-END" in log.read_text()

    wait_for(f"{log} printing its environment", done, timeout)
    env = {}
    for line in log.read_text().splitlines():
        text = line.split(" ", 3)[3] if line.count(" ") >= 3 else ""
        if text == "ENV-END":
            break
        k, sep, v = text.partition("=")
        if sep:
            env[k] = v
    return env


class Slicelet:
    """`slicelet run` on the node, as the DaemonSet runs it (the kubelet's default paths), with
    a simulated node, DRA on, its status endpoint on a free loopback port and a text log
    (`slicelet-<n>.log`, one per daemon started)."""

    started = 0

    def __init__(self, cluster, binary, config, node_file, extra=(), name="slicelet"):
        self.cluster = cluster
        self.port = free_port()
        self.args = [
            binary, "run", "--config", config, "--simulate", node_file,
            "--dra", "--node-name", NODE, "--kubeconfig", cluster.kubeconfig,
            "--status-address", f"127.0.0.1:{self.port}", "--log-format", "text",
            *extra,
        ]
        Slicelet.started += 1
        self.name = f"{name}-{Slicelet.started}"
        self.proc = Process(self.name, self.args, cluster.logs)

    def log(self):
        return self.proc.log.read_text(errors="replace")

    def wait_log(self, pattern, timeout=20, after=0):
        """Waits until the daemon's log (from byte `after`) has a line matching `pattern`."""
        rx = re.compile(pattern)

        def seen():
            if not self.proc.alive():
                raise Failure(f"slicelet exited: {self.proc.tail()}")
            return rx.search(self.log()[after:]) is not None

        wait_for(f"slicelet log /{pattern}/", seen, timeout)

    def wait_dra_registered(self, timeout=20):
        """Waits for the kubelet's registration of the DRA driver; on a time-out, a Failure
        with the kubelet's own words about it."""
        try:
            self.wait_log(r"DRA: registered with the kubelet", timeout)
        except TimeoutError as e:
            kubelet = self.cluster.procs["kubelet"].log.read_text(errors="replace").splitlines()
            said = [line for line in kubelet if "RegisterPlugin" in line and "error" in line.lower()]
            raise Failure(f"{e}\nthe kubelet: " + "\n".join(said[-3:] or ["(no registration error logged)"])) from e

    def stop(self):
        self.proc.stop()


def serve_dra(slicelet, work, policy_text, node_file):
    """Writes `policy_text` as the scenario's policy, starts slicelet with it on `node_file`
    and returns the daemon once the kubelet has registered its DRA driver (a DRA pod synced
    before that is retried only after the kubelet's long backoff)."""
    policy = work / "policy.yaml"
    policy.write_text(policy_text)
    d = slicelet(policy, node_file)
    d.wait_dra_registered()
    return d
