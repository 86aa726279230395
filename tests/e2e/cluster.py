"""A real single-node Kubernetes cluster on this machine, from release binaries.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (CRI, CDI on) and
the kubelet run as child processes of the test run, with every file they write under one
scratch directory. The kubelet's root `/var/lib/kubelet` and the CDI spec directory
`/var/run/cdi` are bind mounts of scratch directories, so that daemons and the chart find
them at their real paths (the kubelet serves device plugins at
`/var/lib/kubelet/device-plugins` whatever its `--root-dir`); containerd keeps shim sockets
under `/run/containerd` and CNI makes the bridge `cni0`. `Cluster.stop()` removes all of it:
pods, containerd tasks and shims, mounts, `cni0`, whatever the tests got to.

The facts this follows (flags, cgroup settings, `restrict_oom_score_adj`, images without a
registry) are those of a cluster on these machines (the kit's README); docs/contributing.md
says how to run the suite.
"""

import base64
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

NODE = "e2e-node"
# The kubelet's root directory at its real path, so that every daemon (and the chart's
# hostPath mounts) finds the kubelet where a node has it: a bind mount of a scratch directory.
# (The kubelet serves device plugins at /var/lib/kubelet/device-plugins whatever its --root-dir.)
KUBELET_ROOT = Path("/var/lib/kubelet")
# The CDI spec directory slicelet writes to by default, containerd's spec directory here.
CDI_DIR = Path("/var/run/cdi")
IMAGE = "docker.io/library/e2e-busybox:1"
TOKEN = "e2e-admin-token"
POD_CIDR = "10.88.0.0/16"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*args, check=True, **kw):
    """Runs a command, returning its CompletedProcess (text); raises with its stderr."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def wait_for(what, predicate, timeout, step=0.1):
    """Waits for a process-level readiness (an endpoint answering, a socket appearing):
    the one polling loop of the harness; Kubernetes objects are waited on with watches."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as e:  # not ready yet: keep the reason for the failure message
            last = e
        time.sleep(step)
    raise TimeoutError(f"{what}: not ready within {timeout} s (last: {last})")


class Process:
    """A child process with its log file."""

    def __init__(self, name, args, log_dir, env=None):
        self.name = name
        self.log = Path(log_dir) / f"{name}.log"
        self.args = [str(a) for a in args]
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.args,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()

    def tail(self, lines=40):
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _oci_image(busybox, out):
    """An OCI image layout tar holding a static busybox and /etc/passwd, entrypoint
    `sleep infinity` (it serves as the pause image too), named IMAGE for containerd."""

    def blob(tar, data):
        digest = hashlib.sha256(data).hexdigest()
        info = tarfile.TarInfo(f"blobs/sha256/{digest}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        return {"digest": f"sha256:{digest}", "size": len(data)}

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        for d in ("bin", "etc", "tmp", "out"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            layer.addfile(info)
        data = Path(busybox).read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        layer.addfile(info, io.BytesIO(data))
        for applet in ("sh", "sleep", "env", "cat"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            layer.addfile(info)
        passwd = b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        layer.addfile(info, io.BytesIO(passwd))
    layer_bytes = layer_buf.getvalue()
    with tarfile.open(out, "w") as tar:
        layer_desc = blob(tar, layer_bytes)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/bin/busybox", "sleep", "infinity"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }
        manifest_desc = blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {
                        "io.containerd.image.name": IMAGE,
                        "org.opencontainers.image.ref.name": "1",
                    },
                }
            ],
        }
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


class Cluster:
    """One node: `start()` brings every component up (about 10 s), `stop()` tears down."""

    def __init__(self, kit_bin, etcd, busybox="/bin/busybox", prefix="slicelet-e2e-"):
        self.bin = Path(kit_bin)
        self.etcd_bin = Path(etcd)
        self.busybox = busybox
        # The scratch directory's prefix: .ci/e2e ends what it left by this name
        # (scripts/fleet-bench, a control plane of its own, uses another).
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.logs = self.dir / "logs"
        self.logs.mkdir()
        self.root = KUBELET_ROOT
        self.cdi = CDI_DIR
        self.pod_logs = self.dir / "pod-logs"
        self.procs = {}
        self.api_port = free_port()
        self.kubeconfig = self.dir / "admin.kubeconfig"

    # -- paths a daemon on this node uses ---------------------------------------------
    @property
    def pod_resources(self):
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def registry_dir(self):
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self):
        return self.root / "plugins"

    @property
    def containerd_sock(self):
        return self.dir / "containerd" / "containerd.sock"

    def kubectl(self, *args, check=True, input=None, timeout=120):
        return run(
            self.bin / "kubectl", "--kubeconfig", self.kubeconfig, *args,
            check=check, input=input, timeout=timeout,
        )

    def ctr(self, *args, check=True):
        return run(self.bin / "ctr", "--address", self.containerd_sock, "-n", "k8s.io", *args, check=check)

    # -- bring-up ------------------------------------------------------------------------
    def start(self):
        started = time.monotonic()
        self._bind_host_dirs()
        self._certs()
        self._etcd()
        self._apiserver()
        self._controllers()
        self._containerd()
        self._kubelet()
        self.up_seconds = time.monotonic() - started
        return self

    def _certs(self, tokens=()):
        """The CA, the API server's serving pair, the service-account keys, the token file
        (the admin token, then `tokens`: (token, user, group) rows) and the admin kubeconfig."""
        pki = self.dir / "pki"
        pki.mkdir()
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-subj", "/CN=e2e-ca")
        (pki / "san.cnf").write_text(
            "[req]\ndistinguished_name=dn\n[dn]\n[ext]\n"
            "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
            "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", pki / "apiserver.key",
            "-out", pki / "apiserver.csr", "-subj", "/CN=kube-apiserver")
        run("openssl", "x509", "-req", "-in", pki / "apiserver.csr", "-CA", pki / "ca.crt",
            "-CAkey", pki / "ca.key", "-CAcreateserial", "-days", "2", "-out", pki / "apiserver.crt",
            "-extfile", pki / "san.cnf", "-extensions", "ext")
        run("openssl", "genrsa", "-out", pki / "sa.key", "2048")
        run("openssl", "rsa", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
        rows = [f'{TOKEN},admin,admin,"system:masters"'] + [f"{t},{u},{u},{g}" for t, u, g in tokens]
        (pki / "tokens.csv").write_text("\n".join(rows) + "\n")
        self.pki = pki
        ca = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {
                "server": f"https://127.0.0.1:{self.api_port}",
                "certificate-authority-data": ca}}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        }))

    def _spawn(self, name, args, env=None):
        self.procs[name] = Process(name, args, self.logs, env)
        return self.procs[name]

    def _etcd(self):
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            self.etcd_bin, "--data-dir", self.dir / "etcd",
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            "--log-level", "warn",
        ])
        wait_for("etcd", lambda: urllib.request.urlopen(self.etcd_url + "/health", timeout=1).status == 200, 30)

    def _apiserver(self, *extra):
        p = self.pki
        self._spawn("kube-apiserver", [
            self.bin / "kube-apiserver",
            "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--secure-port", self.api_port,
            "--advertise-address", "127.0.0.1",
            "--tls-cert-file", p / "apiserver.crt", "--tls-private-key-file", p / "apiserver.key",
            "--client-ca-file", p / "ca.crt",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", p / "sa.pub",
            "--service-account-signing-key-file", p / "sa.key",
            "--token-auth-file", p / "tokens.csv",
            "--authorization-mode", "RBAC",
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--endpoint-reconciler-type", "none",
            "--kubelet-preferred-address-types", "InternalIP,Hostname",
            "--runtime-config", "resource.k8s.io/v1=true,resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            *extra,
        ])
        ctx = ssl.create_default_context(cafile=str(p / "ca.crt"))

        def ready():
            req = urllib.request.Request(
                f"https://127.0.0.1:{self.api_port}/readyz",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            return urllib.request.urlopen(req, context=ctx, timeout=2).status == 200

        wait_for("kube-apiserver /readyz", ready, 60)

    def _controllers(self):
        kc = self.kubeconfig
        self._spawn("kube-controller-manager", [
            self.bin / "kube-controller-manager",
            "--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
            "--leader-elect=false", "--controllers=*",
            "--service-account-private-key-file", self.pki / "sa.key",
            "--root-ca-file", self.pki / "ca.crt",
            "--use-service-account-credentials=false",
            "--bind-address", "127.0.0.1", "--secure-port", free_port(),
        ])
        self._scheduler()

    def _scheduler(self, *extra):
        kc = self.kubeconfig
        self._spawn("kube-scheduler", [
            self.bin / "kube-scheduler",
            "--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
            "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", free_port(),
            *extra,
        ])

    def _containerd(self):
        d = self.dir / "containerd"
        d.mkdir()
        net = self.dir / "cni" / "net.d"
        net.mkdir(parents=True)
        (net / "10-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "e2e",
            "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                         "dataDir": str(self.dir / "cni" / "ipam")},
            }],
        }))
        (d / "config.toml").write_text(f"""version = 3
root = '{d}/root'
state = '{d}/state'
[grpc]
  address = '{self.containerd_sock}'
[ttrpc]
  address = '{self.containerd_sock}.ttrpc'
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'native'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{IMAGE}'
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['{self.cdi}']
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{net}'
""")
        env = dict(os.environ, PATH=f"{self.bin}:{os.environ.get('PATH', '')}")
        self._spawn("containerd", [self.bin / "containerd", "--config", d / "config.toml"], env=env)
        wait_for("containerd", lambda: self.ctr("version").returncode == 0, 30)
        tar = self.dir / "busybox-oci.tar"
        _oci_image(self.busybox, tar)
        self.import_image(tar)

    def import_image(self, tar):
        """Imports an OCI image layout tar into containerd's k8s.io namespace."""
        self.ctr("images", "import", "--local", "--snapshotter", "native", tar)

    def _kubelet(self):
        config = self.dir / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "readOnlyPort": 0,
            "healthzPort": 0,
            "port": free_port(),
            "resolvConf": "/etc/resolv.conf",
            "podLogsDir": str(self.pod_logs),
            # Device-plugin capacity reaches the node's status at the next status update:
            # every second here (10 s by default), so scenarios wait for it less.
            "nodeStatusUpdateFrequency": "1s",
        }))
        self.kubelet_args = [
            self.bin / "kubelet", "--config", config, "--kubeconfig", self.kubeconfig,
            "--root-dir", self.root, "--cert-dir", self.dir / "kubelet-pki",
            "--hostname-override", NODE, "--v", "2",
        ]
        self._spawn("kubelet", self.kubelet_args)
        self.kubectl("wait", "--for=create", f"node/{NODE}", "--timeout=60s")
        self.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=60s")

    def _bind_host_dirs(self):
        """Binds scratch directories onto the kubelet's root and the CDI spec directory,
        refusing a machine that has a kubelet of its own there."""
        for host in (KUBELET_ROOT, CDI_DIR):
            if host.is_mount() or (host.is_dir() and any(host.iterdir())):
                raise RuntimeError(
                    f"{host} is in use (a kubelet or container runtime of this machine?): "
                    "the end-to-end suite runs its own node there; run it on a scratch machine"
                )
        for host, scratch in ((KUBELET_ROOT, "kubelet"), (CDI_DIR, "cdi")):
            (self.dir / scratch).mkdir()
            host.mkdir(parents=True, exist_ok=True)
            run("mount", "--bind", self.dir / scratch, host)

    def restart_kubelet(self):
        """Stops the kubelet (SIGTERM) and starts it again with the same flags; returns once
        the node is Ready again. Containers keep running meanwhile (they are containerd's)."""
        self.procs["kubelet"].stop()
        self._spawn("kubelet", self.kubelet_args)

    # -- teardown ----------------------------------------------------------------------
    def stop(self):
        """Tears everything down, whatever state the tests left: kubelet first (so it starts
        nothing new), containerd's pods and tasks, the rest of the control plane, mounts,
        `cni0`, the scratch directory (kept under E2E_KEEP=1, for reading logs)."""
        kubelet = self.procs.pop("kubelet", None)
        if kubelet:
            kubelet.stop()
        if "containerd" in self.procs and self.procs["containerd"].alive():
            for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            for c in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("tasks", "delete", "-f", c, check=False)
                self.ctr("containers", "delete", c, check=False)
        for name in ("kube-scheduler", "kube-controller-manager", "containerd", "kube-apiserver", "etcd"):
            p = self.procs.pop(name, None)
            if p:
                p.stop()
        for p in self.procs.values():
            p.stop()
        # Leftover shims (each a process of its own session) and their sockets.
        run("pkill", "-9", "-f", f"containerd-shim-runc-v2 -namespace k8s.io -address {self.containerd_sock}", check=False)
        self._unmount_all()
        run("ip", "link", "delete", "cni0", check=False)
        if os.environ.get("E2E_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)

    def _unmount_all(self):
        """Unmounts the bind mounts and everything the kubelet and containerd mounted under
        them or the scratch directory (volumes, sandboxes' shm), deepest first."""
        # mountinfo names real paths (/run/cdi for /var/run/cdi).
        dirs = [d.resolve() for d in (self.dir, KUBELET_ROOT, CDI_DIR)]
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(d) or point.startswith(f"{d}/") for d in dirs):
                mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            run("umount", "-l", point, check=False)
