#!/usr/bin/env python3
"""The fleet bench: what N slicelet daemons cost a real Kubernetes control plane.

scripts/fleet-bench prepares what this needs (the kit's binaries, etcd, the release build)
and runs it; docs/benchmarks.md ("Fleet") says how to read what it prints.

On this machine: etcd, kube-apiserver and kube-scheduler from the kit (tests/e2e/cluster.py
brings them up; no controller manager, no kubelet, no container runtime), N Node objects
(node-0 ... node-<N-1>, kwok-style: Ready, allocatable pods), and N `slicelet run` daemons as
separate processes, each with the flags a node's DaemonSet pod has (--dra, --node-name
node-i, --config a ConfigMap-style directory of named configs chosen by each Node's
nvidia.com/device-plugin.config label, --simulate an 8-GPU H100 node file of its own, the
status endpoint off), every path of theirs under the bench's scratch directory. Each daemon
authenticates with a token of its own (user fleet:node-i, group slicelet-fleet, bound to the
DRA overlay's ClusterRole), so the API server's audit log attributes each request to its
node; the API server's own apiserver_request_total is read beside it.

Phases, in order, each measured from the API server's side:
  publish   start -> every node's ResourceSlices present (ts16: 16 time-sliced replicas per
            GPU, dra: true, 128 devices per node)
  steady    nothing changes for --steady-seconds: requests per node per minute (watches
            counted as held, not as requests)
  health    GPU 0 of every node turns Unhealthy (its node file) and back: slice writes per
            node per event
  schedule  --claims one-device ResourceClaims, each with a pod, allocated and bound by the
            real scheduler against the 128 devices per node (dra: true)
  reload    the ConfigMap edited (its ..data swapped, as the kubelet does): ts16 -> 8
            replicas, 64 devices per node; time until every node's slices show it
  flip      every Node's label flipped to cap16 (dra: capacity, 16 shares per GPU, 8 devices
            per node); time from each node's patch until its slices show it
  schedule  the same claims against the consumable-capacity devices
The last line printed is the one for scripts:
  fleet nodes=<N> publish_s=... steady_requests_per_node_min=... flip_p99_s=... reload_p99_s=...
  schedule_true_per_s=... schedule_capacity_per_s=... rss_mib_per_node=...
"""

import argparse
import concurrent.futures
import datetime
import http.client
import json
import os
import resource
import signal
import ssl
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from cluster import TOKEN, Cluster, Process, free_port, run  # noqa: E402

LABEL = "nvidia.com/device-plugin.config"
DRIVER = "gpu.slicelet.io"
GROUP = "slicelet-fleet"
NAMESPACE = "fleet"
# The configs of the ConfigMap (one directory, a key per config): what each node's label names.
TS = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
        dra: true
"""
CAP = """version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 16
        dra: capacity
"""
GPU = """  - model: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    computeCapability: "9.0"
    numaNode: {numa}
    count: {count}
"""


def node_file(unhealthy_gpu0=False):
    """8x H100 80GB: GPU 0 on a line of its own (so that it alone can turn Unhealthy), then
    GPUs 1-3 and 4-7 (NUMA 0 and 1), all-to-all over NVSwitch."""
    gpu0 = GPU.format(numa=0, count=1) + ("    health: Unhealthy\n" if unhealthy_gpu0 else "")
    return "gpus:\n" + gpu0 + GPU.format(numa=0, count=3) + GPU.format(numa=1, count=4) + "nvswitch: true\n"


def now():
    return time.time()


def pct(values, p):
    """The p-th percentile (nearest rank) of `values`; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def fmt(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"


def log(msg, file=None):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True, file=file or sys.stdout)


class Api:
    """A small client of the API server (HTTPS, bearer token), one keep-alive connection per
    thread."""

    def __init__(self, port, ca, token):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.token = token
        self.local = threading.local()

    def _conn(self, timeout=60):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None, ctype="application/json", raw=False):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json",
                   "User-Agent": "fleet-bench"}
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = ctype
        for attempt in range(5):
            c = getattr(self.local, "c", None)
            if c is None:
                c = self.local.c = self._conn()
            try:
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                out = r.read()
            except (http.client.HTTPException, OSError):
                self.local.c = None
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
                continue
            if raw:
                return r.status, out
            return r.status, (json.loads(out) if out else None)
        raise RuntimeError("unreachable")

    def ok(self, method, path, body=None, ctype="application/json", allow=()):
        status, out = self.request(method, path, body, ctype)
        if status >= 300 and status not in allow:
            raise RuntimeError(f"{method} {path}: {status}: {json.dumps(out)[:500]}")
        return out

    def watch(self, path, on_event, stop):
        """Lists `path`, then watches it from that resourceVersion until `stop` is set, calling
        `on_event(type, object, at)` for every object (the list's as ADDED) and every event;
        re-lists when the watch ends with 410 Gone, resumes otherwise."""
        rv = None
        while not stop.is_set():
            if rv is None:
                lst = self.ok("GET", path)
                rv = lst["metadata"]["resourceVersion"]
                for obj in lst.get("items", []):
                    on_event("ADDED", obj, now())
            sep = "&" if "?" in path else "?"
            c = self._conn(timeout=None)
            try:
                c.request("GET", f"{path}{sep}watch=1&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={rv}",
                          headers={"Authorization": f"Bearer {self.token}", "User-Agent": "fleet-bench"})
                r = c.getresponse()
                if r.status != 200:
                    r.read()
                    rv = None
                    continue
                self.local.watch_sock = c
                while not stop.is_set():
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    at = now()
                    if ev["type"] == "ERROR":
                        if ev["object"].get("code") == 410:
                            rv = None
                        break
                    rv = ev["object"]["metadata"]["resourceVersion"]
                    if ev["type"] != "BOOKMARK":
                        on_event(ev["type"], ev["object"], at)
            except (http.client.HTTPException, OSError, ValueError):
                if stop.is_set():
                    return
                time.sleep(0.2)
            finally:
                c.close()

    def metrics(self):
        """The API server's /metrics: {(name, frozenset(labels)): value} of the series read."""
        status, out = self.request("GET", "/metrics", raw=True)
        return parse_series(out.decode(), ("apiserver_request_total{",
                                            "apiserver_longrunning_requests{"))


def parse_series(text, prefixes):
    """The samples of Prometheus text `text` whose lines start with one of `prefixes`:
    {(name, frozenset(labels)): value}."""
    series = {}
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = {}
        for part in labels.rstrip("}").split('",'):
            if "=" in part:
                k, _, v = part.partition("=")
                pairs[k] = v.strip('"')
        series[(name, frozenset(pairs.items()))] = float(value)
    return series


def metric_delta(before, after, name, group_by):
    """apiserver_request_total (or another counter) between two reads, summed by `group_by`."""
    out = Counter()
    for key, v in after.items():
        if key[0] != name:
            continue
        d = v - before.get(key, 0.0)
        if d:
            labels = dict(key[1])
            out[tuple(labels.get(g, "") for g in group_by)] += d
    return out


class Slices:
    """Every node's ResourceSlices as a watch sees them, and when each node's pool took each
    shape: (devices at the newest complete generation, consumable capacity, tainted devices)."""

    def __init__(self):
        self.by_name = {}
        self.lock = threading.Condition()
        self.history = defaultdict(list)  # node -> [(at, shape)]

    def on_event(self, kind, obj, at):
        node = obj["spec"].get("nodeName")
        if obj["spec"].get("driver") != DRIVER or not node:
            return
        with self.lock:
            if kind == "DELETED":
                self.by_name.pop(obj["metadata"]["name"], None)
            else:
                self.by_name[obj["metadata"]["name"]] = obj
            shape = self.shape(node)
            h = self.history[node]
            if not h or h[-1][1] != shape:
                h.append((at, shape))
            self.lock.notify_all()

    def shape(self, node):
        mine = [s for s in self.by_name.values() if s["spec"]["nodeName"] == node]
        if not mine:
            return None
        gen = max(s["spec"]["pool"]["generation"] for s in mine)
        current = [s for s in mine if s["spec"]["pool"]["generation"] == gen]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            return None  # incomplete: the scheduler would wait too
        devices = [d for s in current for d in s["spec"].get("devices") or []]
        return (
            len(devices),
            any(d.get("allowMultipleAllocations") for d in devices),
            sum(1 for d in devices if d.get("taints")),
        )

    def bytes_per_node(self):
        """The mean JSON size of a node's slices as the API server sends them (what etcd
        stores and every slice watcher, the scheduler first, receives)."""
        with self.lock:
            per = Counter()
            for sl in self.by_name.values():
                per[sl["spec"]["nodeName"]] += len(json.dumps(sl, separators=(",", ":")))
        return statistics.mean(per.values()) if per else 0

    def wait(self, nodes, pred, since, timeout):
        """For each node, the first time at or after `since` its shape satisfied `pred`;
        waits until every node has one or `timeout` s passed (missing nodes are left out)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                got = {}
                for n in nodes:
                    h = self.history.get(n, [])
                    # The shape in force at `since`, then every later one.
                    start = max([i for i, (t, _) in enumerate(h) if t <= since] or [0])
                    for t, shape in h[start:]:
                        if shape is not None and pred(shape):
                            got[n] = max(t, since)
                            break
                if len(got) == len(nodes) or time.monotonic() >= deadline:
                    return got
                self.lock.wait(timeout=min(1.0, max(0.01, deadline - time.monotonic())))


class Audit:
    """The API server's audit log (Metadata level, slicelet's group and the scheduler), read
    as it grows: every request of slicelet's daemons with its time, node, verb, resource,
    whether it was a dry run, and its user agent."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.events = []  # (at, node, verb, resource, dry_run, stage, user_agent, code)
        self.other = Counter()  # user -> requests of other users (the scheduler)

    def read(self):
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            user = e.get("user", {})
            stage = e.get("stage")
            at = datetime.datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            if GROUP not in (user.get("groups") or []):
                if stage == "ResponseComplete" or (stage == "ResponseStarted" and e.get("verb") == "watch"):
                    self.other[user.get("username", "?")] += 1
                continue
            ref = e.get("objectRef") or {}
            resource_ = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            self.events.append((
                at, user.get("username", "").removeprefix("fleet:"), e.get("verb"), resource_,
                "dryRun=All" in e.get("requestURI", ""), stage, e.get("userAgent", ""),
                (e.get("responseStatus") or {}).get("code"),
            ))

    def requests(self, t0, t1):
        """Non-watch requests completed in [t0, t1) (watches are held, counted apart)."""
        self.read()
        return [e for e in self.events if t0 <= e[0] < t1 and e[5] == "ResponseComplete" and e[2] != "watch"]

    def watch_opens(self, t0, t1):
        self.read()
        return [e for e in self.events if t0 <= e[0] < t1 and e[5] == "ResponseStarted" and e[2] == "watch"]

    def held_watches(self, t):
        """Watches opened before `t` and not ended by then."""
        self.read()
        opened = sum(1 for e in self.events if e[0] < t and e[5] == "ResponseStarted" and e[2] == "watch")
        ended = sum(1 for e in self.events if e[0] < t and e[5] == "ResponseComplete" and e[2] == "watch")
        return opened - ended


def table(events, what):
    """One line per (user agent, verb, resource) with its count."""
    c = Counter((e[6] or "-", e[2] + (" (dry run)" if e[4] else ""), e[3]) for e in events)
    lines = [f"  {what}: {len(events)} requests"]
    for (ua, verb, res), n in sorted(c.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {n:7d}  {verb:18s} {res:28s} {ua}")
    return "\n".join(lines)


class Fleet:
    def __init__(self, args):
        self.a = args
        self.n = args.nodes
        self.names = [f"node-{i}" for i in range(self.n)]
        self.cp = Cluster(args.kit_bin, args.etcd, prefix="slicelet-fleet-")
        self.dir = self.cp.dir
        self.daemons = {}
        self.stop_watch = threading.Event()
        self.slices = Slices()
        self.results = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.threads)

    # -- bring-up ---------------------------------------------------------------------------
    def start_control_plane(self):
        t = now()
        cp = self.cp
        self.tokens = {name: f"fleet-{name}-{os.urandom(8).hex()}" for name in self.names}
        cp._certs(tokens=[(tok, f"fleet:{name}", GROUP) for name, tok in self.tokens.items()])
        cp._etcd()
        policy = self.dir / "audit-policy.json"
        policy.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "userGroups": [GROUP]},
                {"level": "Metadata", "users": ["system:kube-scheduler", "admin"],
                 "resources": [{"group": "resource.k8s.io"}]},
                {"level": "None"},
            ],
        }))
        self.audit_log = self.dir / "audit.log"
        cp._apiserver(
            "--audit-policy-file", policy, "--audit-log-path", self.audit_log,
            "--audit-log-maxsize", "0", "--audit-log-format", "json",
            "--max-requests-inflight", "800", "--max-mutating-requests-inflight", "400",
        )
        self.api = Api(cp.api_port, cp.pki / "ca.crt", TOKEN)
        # The scheduler: its client's rate limit raised (the default, 50 QPS, would bound both
        # shapes alike: two writes per pod), everything else its defaults.
        sched = self.dir / "scheduler.yaml"
        sched.write_text(json.dumps({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(cp.kubeconfig), "qps": 5000, "burst": 5000},
            "leaderElection": {"leaderElect": False},
        }))
        self.sched_config = sched
        self.start_scheduler()
        self.audit = Audit(self.audit_log)
        log(f"control plane up in {now() - t:.1f} s (etcd, kube-apiserver :{cp.api_port}, kube-scheduler; {self.dir})")

    def setup_objects(self):
        t = now()
        kubectl = [self.cp.bin / "kubectl", "--kubeconfig", self.cp.kubeconfig]
        for f in ("manifests/overlays/dra/deviceclasses.yaml", "manifests/overlays/dra/rbac.yaml"):
            # The overlay's RBAC as the chart ships it, less its admission policy (it reads the
            # node from a pod-bound token's claim, which static tokens do not carry).
            docs = (REPO / f).read_text()
            if "rbac" in f:
                docs = "\n---\n".join(d for d in docs.split("\n---\n")
                                      if "\nkind: ValidatingAdmissionPolicy" not in f"\n{d}" and d.strip())
            run(*kubectl, "apply", "--validate=false", "-f", "-", input=docs)
        if self.a.forbidden_seconds:
            log("no RBAC for the daemons (--forbidden-seconds): every request of theirs is refused")
        else:
            self.api.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "slicelet-fleet"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "slicelet-dra"},
                "subjects": [{"kind": "Group", "name": GROUP, "apiGroup": "rbac.authorization.k8s.io"}],
            })
        self.api.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        self.api.ok("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

        def node(name):
            res = {"cpu": "192", "memory": "2Ti", "pods": "2000"}
            self.api.ok("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "fleet-bench", LABEL: "ts16"}},
                "status": {"capacity": res, "allocatable": res, "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fleet bench",
                     "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}]},
            })

        list(self.pool.map(node, self.names))

        # The API server's TaintNodesByCondition admission taints a new Node not-ready; the
        # node lifecycle controller (not run here) lifts it once the kubelet reports Ready.
        def untaint(name):
            self.api.ok("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                        ctype="application/merge-patch+json")

        list(self.pool.map(untaint, self.names))
        # Config: a ConfigMap volume's layout (keys are links into ..data, a link to the
        # current timestamped directory), so an edit is the kubelet's atomic ..data swap.
        self.config = self.dir / "config"
        self.config.mkdir()
        self.write_config({"ts16": TS.format(replicas=16), "cap16": CAP})
        for key in ("ts16", "cap16"):
            (self.config / key).symlink_to(f"..data/{key}")
        log(f"{self.n} nodes, DeviceClasses, RBAC and the config directory in {now() - t:.1f} s")

    def write_config(self, files):
        gen = self.config / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{os.urandom(4).hex()}"
        gen.mkdir()
        for k, v in files.items():
            (gen / k).write_text(v)
        tmp = self.config / "..data_tmp"
        tmp.symlink_to(gen.name)
        old = os.readlink(self.config / "..data") if (self.config / "..data").is_symlink() else None
        os.replace(tmp, self.config / "..data")
        if old:
            for f in (self.config / old).iterdir():
                f.unlink()
            (self.config / old).rmdir()

    def start_watches(self):
        t = threading.Thread(target=self.api.watch, args=("/apis/resource.k8s.io/v1/resourceslices",
                                                          self.slices.on_event, self.stop_watch), daemon=True)
        t.start()

    def daemon_args(self, name):
        d = self.dir / "nodes" / name
        kc = d / "kubeconfig"
        kc.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fleet",
            "clusters": [{"name": "fleet", "cluster": {
                "server": f"https://127.0.0.1:{self.cp.api_port}",
                "certificate-authority": str(self.cp.pki / "ca.crt")}}],
            "users": [{"name": name, "user": {"token": self.tokens[name]}}],
            "contexts": [{"name": "fleet", "context": {"cluster": "fleet", "user": name}}],
        }))
        return [
            self.a.slicelet, "run", "--config", self.config, "--simulate", d / "sim" / "node.yaml",
            "--dra", "--node-name", name, "--kubeconfig", kc, "--status-address", "",
            "--log-format", "text",
            # Every path a node's daemon uses, under the bench's scratch directory: this
            # machine's kubelet directories and CDI directories are never touched.
            "--device-plugin-path", d / "device-plugins", "--pod-resources-socket", "",
            "--dra-registry-dir", d / "plugins_registry", "--dra-plugins-dir", d / "plugins",
            "--cdi-output-dir", d / "cdi", "--cdi-spec-dirs", d / "cdi", "--memory-spec-dir", d / "cdi",
        ]

    def start_daemons(self):
        for name in self.names:
            d = self.dir / "nodes" / name
            for sub in ("sim", "device-plugins", "plugins_registry", "plugins", "cdi", "logs"):
                (d / sub).mkdir(parents=True, exist_ok=True)
            (d / "sim" / "node.yaml").write_text(node_file())
        args = {name: self.daemon_args(name) for name in self.names}
        self.cpu_start = self.cpu()
        self.t_start = now()
        self.spawned = {}
        rate = self.a.start_rate
        for i, name in enumerate(self.names):
            if rate:
                # A rollout's pace rather than every node in the same second.
                time.sleep(max(0.0, self.t_start + i / rate - now()))
            self.spawned[name] = now()
            self.daemons[name] = Process(f"slicelet-{name}", args[name], self.dir / "nodes" / name / "logs")
        log(f"{self.n} daemons started in {now() - self.t_start:.2f} s")

    # -- phases -----------------------------------------------------------------------------
    def cpu(self):
        """CPU seconds so far (user + system) of each part: the API server, etcd, the
        scheduler, every daemon together, and the bench itself (its watches and clients)."""
        tick = os.sysconf("SC_CLK_TCK")

        def of(pid):
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(f[11]) + int(f[12])) / tick
            except (OSError, IndexError, ValueError):
                return 0.0

        out = {}
        for name in ("kube-apiserver", "etcd", "kube-scheduler"):
            p = self.cp.procs.get(name)
            out[name] = (p.proc.pid, of(p.proc.pid)) if p else (None, 0.0)
        out["daemons"] = (0, sum(of(p.proc.pid) for p in self.daemons.values()))
        t = os.times()
        out["bench"] = (0, t.user + t.system)
        out["wall"] = (0, time.monotonic())
        return out

    def cpu_since(self, before):
        """CPU seconds of each part since `before` (a process started since: all of its)."""
        after = self.cpu()
        d = {k: (v[1] - before[k][1] if before.get(k, (None,))[0] == v[0] else v[1]) for k, v in after.items()}
        wall = d.pop("wall")
        return {"wall_s": wall, **{k: round(v, 2) for k, v in d.items()}}

    def say_cpu(self, what, d):
        log(f"{what}: CPU s over {d['wall_s']:.1f} s wall (2 cores: {2 * d['wall_s']:.1f} s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in d.items() if k != "wall_s"))

    def per_node(self, events):
        c = Counter(e[1] for e in events)
        return [c.get(n, 0) for n in self.names]

    def check_alive(self):
        dead = [n for n, p in self.daemons.items() if not p.alive()]
        if dead:
            raise RuntimeError(f"{len(dead)} daemons exited, e.g. {dead[0]}:\n{self.daemons[dead[0]].tail()}")

    def landed(self, what, got, since_of, t0):
        if len(got) < self.n:
            missing = [n for n in self.names if n not in got]
            self.check_alive()
            raise RuntimeError(f"{what}: {len(missing)} of {self.n} nodes never showed it (e.g. {missing[:3]}; "
                               f"last shapes: {[self.slices.history.get(m, [(0, None)])[-1][1] for m in missing[:3]]})")
        lat = [got[n] - since_of(n) for n in self.names]
        return {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat), "all": max(got.values()) - t0}

    def phase_publish(self):
        got = self.slices.wait(self.names, lambda s: s == (128, False, 0), self.t_start, self.a.timeout)
        r = self.landed("publish", got, lambda n: self.spawned[n], self.t_start)
        t_end = max(got.values()) + 1.0
        time.sleep(max(0.0, t_end - now()))
        ev = self.audit.requests(self.t_start - 1, t_end)
        r["cpu"] = self.cpu_since(self.cpu_start)
        per = self.per_node(ev)
        r.update(requests_per_node=sum(per) / self.n, requests_max=max(per), slice_kib_per_node=self.slices.bytes_per_node() / 1024)
        self.results["publish"] = r
        log(f"publish: every node's 128 devices in {r['all']:.2f} s from the first start "
            f"(per node from its own start p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s); "
            f"{r['requests_per_node']:.1f} requests per node (max {r['requests_max']}); "
            f"{r['slice_kib_per_node']:.1f} KiB of slices per node")
        print(table(ev, "publish, slicelet's requests"))
        self.say_cpu("publish", r["cpu"])
        self.t_published = t_end

    def phase_steady(self):
        settle = 5.0
        time.sleep(settle)
        self.check_alive()
        t0 = now()
        m0 = self.api.metrics()
        c0 = self.cpu()
        w = self.a.steady_seconds
        log(f"steady: {w:.0f} s with nothing changing")
        time.sleep(w)
        t1 = now()
        m1 = self.api.metrics()
        steady_cpu = self.cpu_since(c0)
        time.sleep(1.0)  # the audit log is written asynchronously
        ev = self.audit.requests(t0, t1)
        opens = self.audit.watch_opens(t0, t1)
        held = self.audit.held_watches(t1)
        per_min = len(ev) / self.n / (w / 60)
        rss = []
        for p in self.daemons.values():
            try:
                for line in Path(f"/proc/{p.proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss.append(int(line.split()[1]) / 1024)
            except OSError:
                pass
        all_clients = metric_delta(m0, m1, "apiserver_request_total", ("verb", "resource"))
        r = {"requests": len(ev), "per_node_min": per_min, "per_node_hour": per_min * 60,
             "watch_opens_per_node_hour": len(opens) / self.n / (w / 3600), "held_watches_per_node": held / self.n,
             "rss_mib_mean": statistics.mean(rss) if rss else None, "rss_mib_max": max(rss) if rss else None,
             "seconds": w, "cpu": steady_cpu}
        self.results["steady"] = r
        log(f"steady: {len(ev)} requests by slicelet in {w:.0f} s: {per_min:.3f} per node per minute "
            f"({r['per_node_hour']:.2f} per node per hour); {held / self.n:.2f} watches held per node, "
            f"{r['watch_opens_per_node_hour']:.1f} watch (re)opens per node per hour; RSS per daemon "
            f"mean {fmt(r['rss_mib_mean'], 1)} MiB, max {fmt(r['rss_mib_max'], 1)} MiB")
        if ev:
            print(table(ev, "steady, slicelet's requests"))
        self.say_cpu("steady", steady_cpu)
        print("  steady, the API server's apiserver_request_total (every client, watches included):")
        for (verb, res), v in sorted(all_clients.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {int(v):7d}  {verb:10s} {res}")

    def edit_nodes(self, unhealthy):
        text = node_file(unhealthy)

        def edit(name):
            f = self.dir / "nodes" / name / "sim" / "node.yaml"
            tmp = f.with_name(".node.yaml.tmp")
            tmp.write_text(text)
            os.replace(tmp, f)
            return now()

        return dict(zip(self.names, self.pool.map(edit, self.names)))

    def phase_health(self):
        out = {}
        for what, unhealthy, want in (("unhealthy", True, 16), ("healthy", False, 0)):
            time.sleep(1.0)
            c0 = self.cpu()
            t0 = now()
            edited = self.edit_nodes(unhealthy)
            got = self.slices.wait(self.names, lambda s, w=want: s[0] == 128 and s[2] == w, t0, self.a.timeout)
            r = self.landed(f"health ({what})", got, lambda n: edited[n], t0)
            r["cpu"] = self.cpu_since(c0)
            t1 = max(got.values()) + 1.0
            time.sleep(max(0.0, t1 - now()))
            ev = self.audit.requests(t0, t1)
            writes = [e for e in ev if e[2] in ("create", "update", "patch", "delete") and e[3] == "resourceslices"]
            # Stored: answered 2xx and not a dry run. A write the API server refused (429: its
            # in-flight limit, every node writing in the same instant) is retried by kube's
            # client and counted as a request, not as a stored write.
            stored = [e for e in writes if not e[4] and e[7] is not None and e[7] < 300]
            refused = [e for e in ev if e[7] == 429]
            r.update(requests_per_node=len(ev) / self.n, writes_per_node=len(writes) / self.n,
                     stored_writes_per_node=len(stored) / self.n, stored_writes_max=max(self.per_node(stored)),
                     refused_429=len(refused))
            out[what] = r
            log(f"health: GPU 0 of every node {what}: on every node's slices within p50 {r['p50']:.2f} s, "
                f"p99 {r['p99']:.2f} s; per node {r['requests_per_node']:.2f} requests, "
                f"{r['writes_per_node']:.2f} slice writes ({r['stored_writes_per_node']:.2f} stored, max "
                f"{r['stored_writes_max']} on one node; the rest dry runs or refused: {len(refused)} answered 429)")
            print(table(ev, f"health ({what}), slicelet's requests"))
            self.say_cpu(f"health ({what}), until the last node", r["cpu"])
        self.results["health"] = out

    def start_scheduler(self):
        # Its own port (the last --secure-port wins), for its /metrics.
        self.sched_port = free_port()
        self.cp._scheduler("--config", self.sched_config, "--secure-port", self.sched_port)

    def scheduler_metrics(self):
        """The scheduler's own figures (its /metrics, the admin token through its delegated
        authorization): {(name, frozenset(labels)): value} of the series read."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        c = http.client.HTTPSConnection("127.0.0.1", self.sched_port, context=ctx, timeout=30)
        try:
            c.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            out = c.getresponse().read().decode()
        finally:
            c.close()
        return parse_series(out, ("scheduler_plugin_execution_duration_seconds_",
                                  "scheduler_scheduling_algorithm_duration_seconds_",
                                  "scheduler_schedule_attempts_total"))

    def stop_scheduler(self):
        p = self.cp.procs.pop("kube-scheduler", None)
        if p:
            p.stop(timeout=5)

    def schedule_round(self, prefix, k, pace=None):
        """Creates `k` one-device claims, each with a pod referencing it, and waits until the
        scheduler has allocated every claim. `pace`: claims per second (one thread, the
        scheduler running), else as fast as the bench's threads go. Returns each claim's
        creation and allocation times."""
        ns = NAMESPACE
        allocated = {}
        created = {}
        lock = threading.Condition()
        stop = threading.Event()

        def on_claim(kind, obj, at):
            if obj["metadata"]["name"].startswith(prefix) and obj.get("status", {}).get("allocation"):
                with lock:
                    allocated.setdefault(obj["metadata"]["name"], at)
                    lock.notify_all()

        w = threading.Thread(target=self.api.watch, args=(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
                                                          on_claim, stop), daemon=True)
        w.start()
        time.sleep(0.5)

        def create(i):
            name = f"{prefix}{i}"
            t = now()
            self.api.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "time-sliced.gpu.slicelet.io"}}]}},
            })
            self.api.ok("POST", f"/api/v1/namespaces/{ns}/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "fleet-bench/none:1", "resources": {"claims": [{"name": "gpu"}]}}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
            })
            created[name] = t

        if pace:
            t0 = now()
            for i in range(k):
                time.sleep(max(0.0, t0 + i / pace - now()))
                create(i)
        else:
            list(self.pool.map(create, range(k)))
        return created, allocated, lock, stop

    def wait_allocated(self, what, k, allocated, lock, stop):
        deadline = time.monotonic() + self.a.timeout
        with lock:
            while len(allocated) < k and time.monotonic() < deadline:
                lock.wait(timeout=1.0)
        stop.set()
        if len(allocated) < k:
            raise RuntimeError(f"{what}: {len(allocated)} of {k} claims allocated within {self.a.timeout} s")

    def phase_schedule(self, shape):
        """Two rounds of one-device claims (each with a pod), allocated and bound by the real
        scheduler. Rate: --claims claims created while no scheduler runs, then the scheduler
        started: claims per second from its first allocation to its last (the scheduler's own
        pace, not the bench's). Latency: a quarter as many created one by one at half that
        rate with the scheduler running: creation -> allocation per claim."""
        k = self.a.claims
        self.stop_scheduler()
        m0 = self.api.metrics()
        created, allocated, lock, stop = self.schedule_round(f"{shape}-", k)
        c0 = self.cpu()
        t_sched = now()
        self.start_scheduler()
        self.wait_allocated(f"schedule ({shape})", k, allocated, lock, stop)
        sched_cpu = self.cpu_since(c0)
        time.sleep(1.0)  # the bindings follow the allocations
        m1 = self.api.metrics()
        sm = self.scheduler_metrics()
        first, last = min(allocated.values()), max(allocated.values())
        rate = (k - 1) / (last - first) if last > first else None
        calls = metric_delta(m0, m1, "apiserver_request_total", ("verb", "resource", "subresource"))
        self.cleanup_claims()
        # The scheduler's own time: the algorithm (filter and score) per attempt, and the
        # DynamicResources plugin per call at each extension point (sampled: 10 % of cycles).
        def mean(name, **want):
            total = count = 0.0
            for (n, labels), v in sm.items():
                d = dict(labels)
                if all(d.get(kk) == vv for kk, vv in want.items()):
                    if n == f"{name}_sum":
                        total += v
                    elif n == f"{name}_count":
                        count += v
            return (total / count, count) if count else (None, 0)

        algo, attempts = mean("scheduler_scheduling_algorithm_duration_seconds")
        r_dra = {}
        for point in ("PreFilter", "Filter", "Reserve", "PreBind"):
            m, n = mean("scheduler_plugin_execution_duration_seconds", plugin="DynamicResources", extension_point=point)
            r_dra[point] = {"mean_ms": m * 1000 if m is not None else None, "samples": n}
        r = {"claims": k, "per_s": rate, "start_to_first_s": first - t_sched, "drain_s": last - first,
             "bindings": int(calls.get(("POST", "pods", "binding"), 0)),
             "claim_status_writes": int(calls.get(("PUT", "resourceclaims", "status"), 0)
                                        + calls.get(("PATCH", "resourceclaims", "status"), 0)),
             "algorithm_ms": algo * 1000 if algo is not None else None, "dynamic_resources": r_dra,
             "cpu": sched_cpu}
        log(f"schedule ({shape}): scheduling algorithm {fmt(algo and algo * 1000, 2)} ms per attempt "
            f"({int(attempts)} attempts); DynamicResources per call: "
            + ", ".join(f"{pt} {fmt(v['mean_ms'], 3)} ms" for pt, v in r_dra.items()))
        log(f"schedule ({shape}): {k} claims created, then the scheduler started: first allocation "
            f"{r['start_to_first_s']:.1f} s after its start, all {k} in {r['drain_s']:.1f} s more: "
            f"{fmt(rate, 1)} claims/s; {r['bindings']} bindings, {r['claim_status_writes']} claim status writes")
        self.say_cpu(f"schedule ({shape}), the scheduler's start to the last allocation", sched_cpu)
        # Latency at half that rate.
        k2 = max(10, k // 4)
        pace = max(1.0, (rate or 10) / 2)
        created, allocated, lock, stop = self.schedule_round(f"{shape}-lat-", k2, pace=pace)
        self.wait_allocated(f"schedule ({shape}, latency)", k2, allocated, lock, stop)
        lat = [allocated[n] - created[n] for n in created]
        self.cleanup_claims()
        r.update(latency_claims=k2, pace_per_s=pace, p50=pct(lat, 50), p99=pct(lat, 99))
        log(f"schedule ({shape}): {k2} claims at {pace:.1f}/s with the scheduler running: creation -> "
            f"allocation p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s")
        self.results[f"schedule_{shape}"] = r

    def cleanup_claims(self):
        ns = NAMESPACE
        self.api.ok("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
        claims = self.api.ok("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]

        def free(c):
            name = c["metadata"]["name"]
            self.api.ok("PATCH", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}",
                        {"metadata": {"finalizers": None}}, ctype="application/merge-patch+json", allow=(404,))

        list(self.pool.map(free, claims))
        self.api.ok("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")

    def phase_reload(self):
        time.sleep(1.0)
        c0 = self.cpu()
        t0 = now()
        self.write_config({"ts16": TS.format(replicas=8), "cap16": CAP})
        got = self.slices.wait(self.names, lambda s: s == (64, False, 0), t0, self.a.timeout)
        r = self.landed("reload", got, lambda n: t0, t0)
        r["cpu"] = self.cpu_since(c0)
        t1 = max(got.values()) + 1.0
        time.sleep(max(0.0, t1 - now()))
        ev = self.audit.requests(t0, t1)
        r["requests_per_node"] = len(ev) / self.n
        self.results["reload"] = r
        log(f"reload: the ConfigMap's ts16 edited (16 -> 8 replicas): every node's 64 devices within "
            f"p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s of the swap; {r['requests_per_node']:.2f} requests per node")
        print(table(ev, "reload, slicelet's requests"))
        self.say_cpu("reload, until the last node", r["cpu"])

    def phase_flip(self):
        time.sleep(1.0)
        c0 = self.cpu()
        t0 = now()

        def flip(name):
            t = now()
            self.api.ok("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {LABEL: "cap16"}}},
                        ctype="application/merge-patch+json")
            return t

        patched = dict(zip(self.names, self.pool.map(flip, self.names)))
        t_patched = now()
        got = self.slices.wait(self.names, lambda s: s == (8, True, 0), t0, self.a.timeout)
        r = self.landed("flip", got, lambda n: patched[n], t0)
        r["cpu"] = self.cpu_since(c0)
        t1 = max(got.values()) + 1.0
        time.sleep(max(0.0, t1 - now()))
        ev = self.audit.requests(t0, t1)
        r.update(requests_per_node=len(ev) / self.n, patch_s=t_patched - t0,
                 slice_kib_per_node=self.slices.bytes_per_node() / 1024)
        self.results["flip"] = r
        log(f"flip: every node's label ts16 -> cap16 ({r['patch_s']:.2f} s to patch them all): its slices show "
            f"8 consumable-capacity devices p50 {r['p50']:.2f} s, p99 {r['p99']:.2f} s after its patch, the whole "
            f"fleet {r['all']:.2f} s after the first; {r['requests_per_node']:.2f} requests per node; "
            f"{r['slice_kib_per_node']:.1f} KiB of slices per node")
        print(table(ev, "flip, slicelet's requests"))
        self.say_cpu("flip, until the last node", r["cpu"])

    def phase_forbidden(self):
        """The daemons without RBAC: how often each asks an API server that refuses it."""
        w = self.a.forbidden_seconds
        time.sleep(w)
        t1 = now()
        time.sleep(1.0)
        ev = self.audit.requests(self.t_start - 1, t1)
        per = Counter((e[2], e[3], e[7]) for e in ev)
        log(f"forbidden: {len(ev)} requests in {w:.0f} s, {len(ev) / self.n / (w / 60):.1f} per node per minute: "
            + ", ".join(f"{n} {v} {r} ({c})" for (v, r, c), n in per.most_common()))
        print(f"fleet-forbidden nodes={self.n} seconds={w:.0f} requests_per_node_min={len(ev) / self.n / (w / 60):.2f}")

    # -- the whole run ----------------------------------------------------------------------
    def run(self):
        self.start_control_plane()
        self.setup_objects()
        self.start_watches()
        self.start_daemons()
        if self.a.forbidden_seconds:
            self.phase_forbidden()
            return
        self.phase_publish()
        self.phase_steady()
        self.phase_health()
        self.phase_schedule("true")
        self.phase_reload()
        self.phase_flip()
        self.phase_schedule("capacity")
        self.check_alive()
        self.audit.read()
        print(f"  other clients' requests (audited: the scheduler and the bench on resource.k8s.io): "
              f"{dict(self.audit.other)}")
        r = self.results
        json_out = self.a.json or None
        if json_out:
            Path(json_out).write_text(json.dumps(r, indent=2, default=str))
        ratio = r["schedule_capacity"]["per_s"] / r["schedule_true"]["per_s"]
        r["capacity_over_true"] = ratio
        log(f"dra: capacity schedules {ratio:.2f}x the claims per second of dra: true at N={self.n}")
        failed = self.check_goals() if self.a.check else []
        print(
            f"fleet nodes={self.n} publish_s={r['publish']['all']:.2f} "
            f"steady_requests_per_node_min={r['steady']['per_node_min']:.4f} "
            f"flip_p99_s={r['flip']['p99']:.2f} reload_p99_s={r['reload']['p99']:.2f} "
            f"schedule_true_per_s={r['schedule_true']['per_s']:.1f} "
            f"schedule_capacity_per_s={r['schedule_capacity']['per_s']:.1f} "
            f"rss_mib_per_node={r['steady']['rss_mib_mean']:.1f}",
            flush=True,
        )
        if failed:
            raise SystemExit(f"fleet bench: goals missed: {'; '.join(failed)}")

    def check_goals(self):
        """The goals (docs/benchmarks.md) that hold per node whatever the machine's speed:
        nothing asked in the steady window, at most one stored slice write per node per health
        event, a label flip on every node within 5 s p99 of its patch."""
        r = self.results
        h = r["health"]
        checks = [
            ("steady state: no request in the window", r["steady"]["requests"] == 0),
            ("health: at most one stored slice write per node per event",
             all(h[e]["stored_writes_max"] <= 1 for e in h)),
            ("label flip: every node within 5 s p99", r["flip"]["p99"] <= 5.0),
        ]
        failed = [what for what, ok in checks if not ok]
        for what, ok in checks:
            print(f"  {'ok' if ok else 'FAILED'}: {what}")
        print(f"fleet checks: {len(checks) - len(failed)} passed, {len(failed)} failed")
        return failed

    def stop(self):
        self.stop_watch.set()
        t = now()
        procs = list(self.daemons.values())
        for p in procs:
            if p.alive():
                p.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.proc.wait(max(0.1, deadline - time.monotonic()))
            except Exception:
                p.proc.kill()
                p.proc.wait()
            p._out.close()
        for name in ("kube-scheduler", "kube-apiserver", "etcd"):
            p = self.cp.procs.pop(name, None)
            if p:
                p.stop(timeout=3)
        for p in self.cp.procs.values():
            p.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        # On stderr: the figures' line stays the last of stdout.
        log(f"stopped {len(procs)} daemons and the control plane in {now() - t:.1f} s", file=sys.stderr)
        if os.environ.get("FLEET_KEEP") != "1":
            import shutil
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            log(f"kept {self.dir}", file=sys.stderr)


def raise_limits(n):
    """Room for N daemons on one machine: open files for the bench, inotify instances for the
    daemons (each watches its config, node file and device-plugin directories; one machine's
    default of 128 per user is sized for one node's daemons, not a fleet's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    want = 8 * n + 256
    p = Path("/proc/sys/fs/inotify/max_user_instances")
    have = int(p.read_text())
    if have < want:
        try:
            p.write_text(str(want))
            log(f"fs.inotify.max_user_instances {have} -> {want} (for {n} daemons on one machine)")
        except OSError as e:
            raise SystemExit(f"fs.inotify.max_user_instances is {have}; {n} daemons need about {want} "
                             f"(sysctl -w fs.inotify.max_user_instances={want}, as root): {e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--claims", type=int, default=0, help="claims per scheduling round (default 20 per node, at most 2000)")
    ap.add_argument("--steady-seconds", type=float, default=300)
    ap.add_argument("--timeout", type=float, default=300, help="seconds each phase may take")
    ap.add_argument("--threads", type=int, default=8, help="the bench's client threads")
    ap.add_argument("--kit-bin", required=True)
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--slicelet", required=True)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--start-rate", type=float, default=0,
                    help="daemons started per second (default: all at once)")
    ap.add_argument("--check", action="store_true",
                    help="fail unless the per-node goals hold (the CI smoke run)")
    ap.add_argument("--forbidden-seconds", type=float, default=0,
                    help="instead: run the daemons this long without RBAC and count how often they ask")
    a = ap.parse_args()
    if not a.claims:
        a.claims = min(20 * a.nodes, 2000)
    raise_limits(a.nodes)
    fleet = Fleet(a)

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        fleet.run()
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
