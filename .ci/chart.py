#!/usr/bin/env python3
"""Renders the Helm chart with Helm's own code and checks what its values promise.

Usage: chart.py CHART_DIR OUT_DIR KUBE_VERSION...

helm-python-sdk (PyPI) embeds Helm v4's Go SDK (libhelm_c); no helm binary is involved. A
client-side dry-run install is the code path `helm template` runs: values coalesced with the
chart's defaults, values.schema.json, the chart's kubeVersion constraint, the template engine,
manifests sorted in install order, NOTES.txt left out. The public Config.install() takes no
kube_version, so the call goes through the binding's own native entry point with the options
the library accepts (helm-python-sdk is pinned in .ci/run).

For the default values and every CHART_DIR/ci/*.yaml, and each KUBE_VERSION (1.34.0), it writes
OUT_DIR/<example>-<version>.yaml (for kubernetes-validate) and checks the rendering against the
merged values: RBAC only with node-label selection or migLayouts (and then only get/list/watch
on nodes; with migLayouts the mig-parted ConfigMap mounted read-only as a directory,
SLICELET_MIG_CONFIG_FILE in it, SLICELET_MIG_CONFIG from migLayouts.default, NODE_NAME, a token
and the MIG settings), the
MPS root mounted only when MPS is on, DRA's DeviceClasses (with dra.extendedResources one bridge
class per name, <name with / and . as ->.bridge.<driver>, carrying spec.extendedResourceName and
selecting exactly the devices whose `resource` attribute is that name, each name a DRA resource
of the configs as read here), RBAC (ResourceSlices, ResourceClaims get),
admission policy, env and read-write mounts exactly with dra.enabled, hostPID only in-process, every volume mounted and every
mount backed by a volume, no subPath, the NFD and CDI paths, the pod-resources directory
(read-only) and the host's /proc (read-only, only with usage.perPodAttribution), each env
variable once, the namespace and its Pod Security label; NVIDIA's variables exactly when NVIDIA's
chart sets them (MIG_STRATEGY, FAIL_ON_INIT_ERROR, ... for a value of the type its `typeIs`
checks; MPS_ROOT always), what the configs need switched on from the configs (sharing.mps: MPS;
flags.migStrategy single|mixed: the MIG settings; a cdi-* strategy: the CDI mounts), the
optional `slicelet top` Role; with memory limits (memoryLimits.enabled, or a config with `memory` on a
sharing entry) the install-hook init container writing the hook binary to the host directory
whose path the plugin's SLICELET_HOOK_BINARY names, and memoryLimits.specDir mounted read-write
as SLICELET_MEMORY_SPEC_DIR (no init container, no such variable or mount without them). The ci/nvidia-* examples (NVIDIA's README in NVIDIA's value shape)
must select configs by node label with the node RBAC and their own env (NVIDIA_EXAMPLES), and
ci/gpu-operator-values.yaml must read deployments/gpu-operator/clusterpolicy-patch.yaml's
ConfigMap, which is validated with jsonschema against clusterpolicy-patch.schema.json. Each
example also passes `helm lint --strict`. Then it checks that bad values are refused with a
message naming them, that NOTES.txt names every chart value that overrides a config's own flag
(and the configs whose flag it replaces), that every namespaced object goes into the release
namespace (-n; -n default refused), among them configs of config.map with a fault the chart can see (a key
the policy does not have, a version other than v1, replicas that are no whole number of at
least 1): the message names the config and the field. The daemon's test policies
(fixtures/policies, config/policy*.yaml) go in as config.map: each one slicelet accepts must
render, each one it rejects must be refused naming the path the daemon names. Exit 1 on any
failure.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Any

import helm_python as helm
import jsonschema
import yaml
from helm_python import _native

# Never a cluster: a client-side dry run needs none; make sure none is found either.
os.environ["KUBECONFIG"] = os.devnull

RELEASE = "slicelet"
# The namespace Helm runs in (-n), as the chart's README installs: every namespaced object the
# chart renders goes there unless namespace.name or namespaceOverride says otherwise.
RELEASE_NAMESPACE = "slicelet-system"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
DRA_RULES = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
     "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
]


# The chart's files/policy.yaml, parsed: the one config without config.map (set by main).
DEFAULT_CONFIG: dict[str, Any] = {}


def render(chart: pathlib.Path, values: dict[str, Any], kube_version: str,
           namespace: str = RELEASE_NAMESPACE) -> str:
    """The manifest `helm template RELEASE CHART -n NAMESPACE -f values --kube-version V` prints."""
    return render_release(chart, values, kube_version, namespace)["manifest"]


def render_release(chart: pathlib.Path, values: dict[str, Any], kube_version: str,
                   namespace: str = RELEASE_NAMESPACE) -> dict[str, Any]:
    """The dry-run release: its `manifest` and its `notes` (NOTES.txt, which `helm install`
    prints and `helm template` leaves out)."""
    cfg = helm.Config(storage_driver="memory", namespace=namespace)
    try:
        opts = {
            "namespace": namespace,
            "dry_run": "client",
            "kube_version": f"v{kube_version}",
        }
        handle, ref = cfg._chart_args(str(chart))
        payload = _native.call_string(
            "helm_install",
            cfg._raw(),
            cfg._context_arg(None),
            handle,
            ref,
            RELEASE,
            json.dumps(values),
            json.dumps(opts),
        )
    finally:
        cfg.close()
    return json.loads(payload)


class Checks:
    def __init__(self, name: str) -> None:
        self.name = name
        self.failures: list[str] = []

    def that(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(f"{self.name}: {what}")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def policies(v: dict[str, Any]) -> list[dict[str, Any]]:
    """The configs of config.map, parsed (a config that is not YAML counts as empty)."""
    out = []
    for text in (v["config"].get("map") or {}).values():
        try:
            cfg = yaml.safe_load(text)
        except yaml.YAMLError:
            cfg = None
        out.append(cfg if isinstance(cfg, dict) else {})
    return out


def label_selection_of(v: dict[str, Any]) -> bool:
    """NVIDIA's rule: the node label chooses whenever a ConfigMap of the user's is in use;
    config.nodeLabel.enabled false turns it off."""
    enabled = v["config"]["nodeLabel"].get("enabled")
    has_configmap = bool(v["config"]["name"] or v["config"]["map"])
    return has_configmap if enabled is None else bool(enabled)


def strategies(dls: Any) -> set[str]:
    """A deviceListStrategy, a comma-separated string or a list, as a set."""
    if isinstance(dls, str):
        return set(dls.split(","))
    return set(dls) if isinstance(dls, list) else set()


def has_memory(p: dict[str, Any]) -> bool:
    """Whether a config has `memory` on an entry of sharing.timeSlicing or sharing.mps."""
    sharing = p.get("sharing") or {}
    return any(isinstance(e, dict) and "memory" in e
               for kind in ("timeSlicing", "mps")
               for e in ((sharing.get(kind) or {}).get("resources") or []))


def qualified(name: Any) -> str:
    """A resource name as slicelet advertises it: `nvidia.com/` added when it has no `/`."""
    name = str(name)
    return name if "/" in name else f"nvidia.com/{name}"


def dra_resources(p: dict[str, Any]) -> set[str]:
    """The DRA resources of one config: `dra.resources`, and the advertised name of every
    sharing entry with `dra: true` or `dra: capacity` (rename, else <name>.shared under
    renameByDefault, else name)."""
    out = {qualified(n) for n in ((p.get("dra") or {}).get("resources") or [])}
    sharing = p.get("sharing") or {}
    for kind in ("timeSlicing", "mps"):
        section = sharing.get(kind) or {}
        for e in section.get("resources") or []:
            if isinstance(e, dict) and (e.get("dra") is True or e.get("dra") == "capacity"):
                name = e.get("rename") or (f"{e['name']}.shared" if section.get("renameByDefault") is True else e["name"])
                out.add(qualified(name))
    return out


def bridge_class(name: str, driver: str) -> str:
    """The migration bridge's DeviceClass of an extended resource name."""
    return f"{name.replace('/', '-').replace('.', '-')}.bridge.{driver}"


def needs(v: dict[str, Any]) -> dict[str, bool]:
    """What the configs in config.map need: MPS daemons, the MIG settings, the CDI specs, the
    memory-limit hook."""
    ps = policies(v)
    return {
        "memory": any(has_memory(p) for p in ps),
        "mps": any((p.get("sharing") or {}).get("mps") for p in ps),
        "mig": any((p.get("flags") or {}).get("migStrategy") in ("single", "mixed") for p in ps),
        "cdi": any(strategies(((p.get("flags") or {}).get("plugin") or {}).get("deviceListStrategy"))
                   & {"cdi-annotations", "cdi-cri"} for p in ps),
    }


def effective_mps(v: dict[str, Any]) -> str:
    """mps.mode; unset (None): in-process when a config uses sharing.mps, else none."""
    mode = v["mps"].get("mode")
    if mode is None:
        return "in-process" if needs(v)["mps"] else "none"
    return mode


def effective_mig(v: dict[str, Any]) -> bool:
    """mig.enabled; unset: migLayouts.name (slicelet creates MIG instances), else NVIDIA's
    migStrategy single|mixed (it overrides the configs'), else a config's flags.migStrategy
    single|mixed, or config.name (configs the chart cannot read)."""
    if v["mig"].get("enabled") is not None:
        return bool(v["mig"].get("enabled"))
    if v["migLayouts"]["name"]:
        return True
    if isinstance(v.get("migStrategy"), str):
        return v["migStrategy"] in ("single", "mixed")
    return needs(v)["mig"] or bool(v["config"]["name"])


def effective_cdi(v: dict[str, Any]) -> bool:
    """cdi.enabled; unset: NVIDIA's deviceListStrategy with cdi-* (it overrides the configs'),
    else a config's cdi-* strategy, or config.name."""
    if v["cdi"].get("enabled") is not None:
        return bool(v["cdi"].get("enabled"))
    if isinstance(v.get("deviceListStrategy"), str):
        return bool(strategies(v["deviceListStrategy"]) & {"cdi-annotations", "cdi-cri"})
    return needs(v)["cdi"] or bool(v["config"]["name"])


def effective_memory(v: dict[str, Any]) -> bool:
    """memoryLimits.enabled; unset: a config in config.map with `memory` on a sharing entry
    (with config.name the chart cannot read the configs: off)."""
    if v["memoryLimits"].get("enabled") is not None:
        return bool(v["memoryLimits"]["enabled"])
    return needs(v)["memory"]


def hook_binary(v: dict[str, Any]) -> str:
    return v["memoryLimits"]["hookDir"].rstrip("/") + "/slicelet"


def namespace_of(v: dict[str, Any]) -> str:
    return v.get("namespaceOverride") or v["namespace"]["name"] or RELEASE_NAMESPACE


# NVIDIA's chart values and the variables NVIDIA's chart sets for them, only for a value of the
# type its `typeIs` checks (MPS_ROOT always, from mps.root).
NVIDIA_ENV = [("migStrategy", "MIG_STRATEGY", str), ("failOnInitError", "FAIL_ON_INIT_ERROR", bool),
              ("compatWithCPUManager", "PASS_DEVICE_SPECS", bool),
              ("deviceListStrategy", "DEVICE_LIST_STRATEGY", str),
              ("deviceIDStrategy", "DEVICE_ID_STRATEGY", str),
              ("nvidiaDriverRoot", "NVIDIA_DRIVER_ROOT", str), ("nvidiaDevRoot", "NVIDIA_DEV_ROOT", str),
              ("gdrcopyEnabled", "GDRCOPY_ENABLED", bool), ("gdsEnabled", "GDS_ENABLED", bool),
              ("mofedEnabled", "MOFED_ENABLED", bool),
              ("deviceDiscoveryStrategy", "DEVICE_DISCOVERY_STRATEGY", str)]


def nvidia_env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check(name: str, docs: list[dict[str, Any]], v: dict[str, Any]) -> list[str]:
    """Checks one rendering against the merged values `v`."""
    c = Checks(name)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    namespace = namespace_of(v)
    mps = effective_mps(v)
    mig = effective_mig(v)
    cdi_on = effective_cdi(v)
    memory = effective_memory(v)
    memory_dir = v["memoryLimits"]["specDir"]
    label_selection = label_selection_of(v)
    layouts = v["migLayouts"]
    # The Node watched through the API: its config label, or its MIG layout label.
    node_watch = label_selection or bool(layouts["name"])
    dra = v["dra"]
    needs_api = label_selection or dra["enabled"]

    for d in docs:
        ns = d["metadata"].get("namespace")
        if d["kind"] in CLUSTER_SCOPED:
            c.that(ns is None, f"{d['kind']} {d['metadata']['name']} is cluster-scoped")
        else:
            c.that(ns == namespace, f"{d['kind']} {d['metadata']['name']} in {ns}, not {namespace}")

    namespaces = by_kind.get("Namespace", [])
    if v["namespace"]["create"]:
        c.that(len(namespaces) == 1 and namespaces[0]["metadata"]["name"] == namespace,
               f"one Namespace {namespace}")
        for n in namespaces:
            c.that(n["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") == "privileged",
                   "the Namespace enforces Pod Security `privileged`")
    else:
        c.that(not namespaces, "namespace.create false: no Namespace")

    all_roles = by_kind.get("ClusterRole", []) + by_kind.get("Role", [])
    all_bindings = by_kind.get("ClusterRoleBinding", []) + by_kind.get("RoleBinding", [])
    is_dra = lambda d: d["metadata"]["name"] == f"{RELEASE}-dra"
    is_top = lambda d: d["metadata"]["name"] == f"{RELEASE}-top"
    roles = [r for r in all_roles if not is_dra(r) and not is_top(r)]
    bindings = [b for b in all_bindings if not is_dra(b) and not is_top(b)]
    top_roles = [r for r in all_roles if is_top(r)]
    top_bindings = [b for b in all_bindings if is_top(b)]
    if v["top"]["rbac"]["create"]:
        c.that([r["kind"] for r in top_roles] == ["Role"] and [b["kind"] for b in top_bindings] == ["RoleBinding"],
               "top.rbac.create: one Role and one RoleBinding (namespaced, nothing cluster-wide)")
        for r in top_roles:
            c.that(r["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                                  {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}],
                   f"top Role: get/list pods and get pods/proxy only, not {r['rules']}")
        for b in top_bindings:
            c.that(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{RELEASE}-top"}
                   and b["subjects"] == v["top"]["rbac"]["subjects"], "top RoleBinding: the Role, to top.rbac.subjects")
    else:
        c.that(not top_roles and not top_bindings, "no top Role without top.rbac.create")
    dra_roles = [r for r in all_roles if is_dra(r)]
    dra_bindings = [b for b in all_bindings if is_dra(b)]
    if dra["enabled"]:
        c.that(len(dra_roles) == 1 and len(dra_bindings) == 1, "dra: one ClusterRole and its binding")
        for r in dra_roles:
            c.that(r["rules"] == DRA_RULES, f"dra ClusterRole: ResourceSlices, ResourceClaims get and nodes read only, not {r['rules']}")
        for b in dra_bindings:
            c.that(b["roleRef"]["name"] == f"{RELEASE}-dra"
                   and b["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": namespace}],
                   "dra binding: the role, to the ServiceAccount")
        vaps = by_kind.get("ValidatingAdmissionPolicy", [])
        policy_bindings = by_kind.get("ValidatingAdmissionPolicyBinding", [])
        c.that(len(vaps) == 1 and len(policy_bindings) == 1, "dra: one ValidatingAdmissionPolicy and its binding")
        for p in vaps:
            spec = p["spec"]
            rules = spec["matchConstraints"]["resourceRules"]
            c.that(rules == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                              "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}],
                   f"dra policy: writes of resourceslices, not {rules}")
            c.that(f"system:serviceaccount:{namespace}:{RELEASE}" in spec["matchConditions"][0]["expression"],
                   "dra policy: applies to slicelet's ServiceAccount")
            exprs = " ".join(x["expression"] for x in spec["variables"])
            c.that("authentication.kubernetes.io/node-name" in exprs and "nodeName" in exprs,
                   "dra policy: the token's node-name claim against the slice's spec.nodeName")
            c.that(spec["failurePolicy"] == "Fail", "dra policy: fails closed")
        for b in policy_bindings:
            c.that(b["spec"]["policyName"] == vaps[0]["metadata"]["name"] if vaps else False,
                   "dra policy binding names the policy")
            c.that(b["spec"]["validationActions"] == ["Deny"], "dra policy binding denies")
        classes = {d["metadata"]["name"]: d for d in by_kind.get("DeviceClass", [])}
        driver = dra["driverName"]
        bridges = {bridge_class(n, driver): n for n in dra["extendedResources"]}
        want_classes = {driver, f"time-sliced.{driver}", f"mps.{driver}", f"mig.{driver}"} | {
            f"mig-{p}.{driver}" for p in dra["migProfiles"]} | set(bridges)
        c.that(set(classes) == want_classes, f"DeviceClasses {sorted(classes)}, not {sorted(want_classes)}")
        for name, dc in classes.items():
            expr = dc["spec"]["selectors"][0]["cel"]["expression"]
            c.that(expr.startswith((f'device.driver == "{driver}" && device.attributes["{driver}"].',
                                    f'device.driver == "{driver}" && has(device.attributes["{driver}"].')),
                   f"DeviceClass {name}: selects the driver's devices by attribute: {expr}")
            bridged = bridges.get(name)
            c.that(dc["spec"].get("extendedResourceName") == bridged,
                   f"DeviceClass {name}: extendedResourceName {dc['spec'].get('extendedResourceName')!r}, not {bridged!r}")
            if bridged is not None:
                want = (f'device.driver == "{driver}" && has(device.attributes["{driver}"].resource) && '
                        f'device.attributes["{driver}"].resource == "{bridged}"')
                c.that(len(dc["spec"]["selectors"]) == 1 and expr == want,
                       f"bridge DeviceClass {name}: selects exactly the devices mirroring {bridged}: {expr}")
        if not v["config"]["name"]:
            ps = policies(v) or [DEFAULT_CONFIG]
            served = set().union(*(dra_resources(p) for p in ps))
            for n in dra["extendedResources"]:
                c.that(n in served, f"bridged {n} is a DRA resource of a config ({sorted(served)})")
        c.that('.sharing == "time-slicing"' in classes.get(f"time-sliced.{driver}", {}).get("spec", {}).get("selectors", [{}])[0].get("cel", {}).get("expression", ""),
               "time-sliced class selects sharing time-slicing")
    else:
        c.that(not dra["extendedResources"], "dra.extendedResources rendered without dra.enabled")
        c.that(not dra_roles and not dra_bindings and not by_kind.get("DeviceClass")
               and not by_kind.get("ValidatingAdmissionPolicy"), "no DRA objects without dra.enabled")
    if node_watch:
        c.that(len(roles) == 1 and len(bindings) == 1, "one ClusterRole and its binding")
        for r in roles:
            c.that(r["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                   "verbs": ["get", "list", "watch"]}],
                   f"ClusterRole: get/list/watch on nodes only, not {r['rules']}")
        for b in bindings:
            c.that(b["roleRef"]["name"] == roles[0]["metadata"]["name"], "binding names the role")
            c.that(b["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": namespace}],
                   f"binding's subject is the ServiceAccount, not {b['subjects']}")
    else:
        c.that(not roles and not bindings, "no RBAC without node-label selection or migLayouts")

    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    if v["config"]["name"]:
        c.that(f"{RELEASE}-config" not in configmaps, "config.name: no ConfigMap of its own")
    else:
        keys = set(configmaps.get(f"{RELEASE}-config", {}).get("data", {}))
        want = set(v["config"]["map"]) or {"default"}
        c.that(keys == want, f"ConfigMap keys {sorted(keys)}, not {sorted(want)}")

    daemonsets = {d["metadata"]["name"]: d for d in by_kind.get("DaemonSet", [])}
    want_ds = {RELEASE} | ({f"{RELEASE}-mps"} if mps == "daemonset" else set())
    c.that(set(daemonsets) == want_ds, f"DaemonSets {sorted(daemonsets)}, not {sorted(want_ds)}")
    for ds_name, ds in daemonsets.items():
        what = f"DaemonSet {ds_name}"
        spec = ds["spec"]["template"]["spec"]
        c.that(ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(),
               f"{what}: the selector matches its pods")
        container = spec["containers"][0]
        env = env_of(container)
        env_names = [e["name"] for e in container.get("env", [])]
        c.that(len(env_names) == len(set(env_names)),
               f"{what}: each env variable once, not twice: {sorted({n for n in env_names if env_names.count(n) > 1})}")
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        volumes = {vol["name"]: vol for vol in spec.get("volumes", [])}
        inits = spec.get("initContainers", [])
        every_mount = [m for x in [container] + inits for m in x.get("volumeMounts", [])]
        c.that(all("subPath" not in m for m in every_mount), f"{what}: no subPath mounts")
        mounted = {m["name"] for m in every_mount}
        c.that(mounted == set(volumes), f"{what}: mounts {sorted(mounted)} vs volumes {sorted(volumes)}")
        c.that(env.get("SLICELET_CONFIG") == "/etc/slicelet" and "/etc/slicelet" in mounts
               and volumes[mounts["/etc/slicelet"]["name"]].get("configMap", {}).get("name")
               == (v["config"]["name"] or f"{RELEASE}-config"),
               f"{what}: SLICELET_CONFIG is the mounted ConfigMap directory")
        c.that(env.get("SLICELET_CONFIG_FALLBACK") == ",".join(v["config"]["fallbackStrategies"]),
               f"{what}: SLICELET_CONFIG_FALLBACK")
        c.that(env.get("SLICELET_CONFIG_DEFAULT") == (v["config"]["default"] or None),
               f"{what}: SLICELET_CONFIG_DEFAULT")
        is_mps_ds = ds_name.endswith("-mps")
        plugin_watch = (dra["enabled"] or bool(layouts["name"])) and not is_mps_ds
        c.that((env.get("NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}})
               == (label_selection or plugin_watch),
               f"{what}: NODE_NAME from spec.nodeName exactly with node-label selection, migLayouts or DRA")
        c.that((env.get("SLICELET_CONFIG_LABEL") == v["config"]["nodeLabel"]["key"]) == label_selection,
               f"{what}: SLICELET_CONFIG_LABEL exactly with node-label selection")
        c.that(spec["automountServiceAccountToken"] == (label_selection or plugin_watch),
               f"{what}: a token exactly with node-label selection, migLayouts or DRA")
        m = mounts.get("/etc/slicelet-mig")
        if layouts["name"] and not is_mps_ds:
            c.that(m is not None and m.get("readOnly") is True
                   and volumes[m["name"]].get("configMap", {}).get("name") == layouts["name"],
                   f"{what}: migLayouts.name mounted read-only as a directory at /etc/slicelet-mig")
            c.that(env.get("SLICELET_MIG_CONFIG_FILE") == f"/etc/slicelet-mig/{layouts['key']}",
                   f"{what}: SLICELET_MIG_CONFIG_FILE is migLayouts.key in the mounted directory")
        else:
            c.that(m is None and "SLICELET_MIG_CONFIG_FILE" not in env,
                   f"{what}: the mig-parted file only with migLayouts.name (and only for `slicelet run`)")
        c.that(env.get("SLICELET_MIG_CONFIG") == ((layouts["default"] or None) if not is_mps_ds else None),
               f"{what}: SLICELET_MIG_CONFIG exactly with migLayouts.default")
        dra_env = {"SLICELET_DRA": "true", "SLICELET_DRA_DRIVER_NAME": dra["driverName"],
                   "SLICELET_DRA_REGISTRY_DIR": dra["registryDir"],
                   "SLICELET_DRA_PLUGINS_DIR": dra["pluginsDir"],
                   "SLICELET_CDI_OUTPUT_DIR": dra["cdiOutputDir"]}
        on = dra["enabled"] and not is_mps_ds
        # Without DRA the daemon still reads (never writes) the DRA checkpoint: where it lies.
        located = {"SLICELET_DRA_DRIVER_NAME", "SLICELET_DRA_PLUGINS_DIR"}
        for k, want in dra_env.items():
            if k in located and not is_mps_ds:
                c.that(env.get(k) == want, f"{what}: {k}={want} (the DRA checkpoint, with DRA or not)")
            else:
                c.that((env.get(k) == want) == on, f"{what}: {k}={want} exactly with dra.enabled")
        driver_dir = f"{dra['pluginsDir']}/{dra['driverName']}"
        m = mounts.get(driver_dir)
        if dra["enabled"] or is_mps_ds:
            c.that(m is None, f"{what}: {driver_dir} mounted on its own only without DRA")
        else:
            c.that(m is not None and m.get("readOnly") is True
                   and volumes[m["name"]]["hostPath"]["path"] == driver_dir,
                   f"{what}: DRA off: host {driver_dir} mounted read-only (the DRA checkpoint)")
        for d in (dra["registryDir"], dra["pluginsDir"], dra["cdiOutputDir"]):
            m = mounts.get(d)
            if on:
                c.that(m is not None and not m.get("readOnly")
                       and volumes[m["name"]]["hostPath"]["path"] == d,
                       f"{what}: DRA: host {d} mounted read-write")
            elif not (cdi_on and d in v["cdi"]["specDirs"]) and not (memory and d == memory_dir):
                c.that(m is None, f"{what}: {d} mounted only with dra.enabled")
        c.that(container["args"] == (["mps"] if is_mps_ds else ["run"]), f"{what}: args")
        c.that((v["mps"]["root"] in mounts) == (mps != "none"),
               f"{what}: {v['mps']['root']} mounted exactly when MPS is on")
        in_pod_mps = is_mps_ds or mps == "in-process"
        c.that(bool(spec.get("hostPID")) == in_pod_mps, f"{what}: hostPID exactly where MPS daemons run")
        c.that(("/dev/shm" in mounts) == in_pod_mps, f"{what}: the MPS shm at /dev/shm")
        c.that(bool(container["securityContext"].get("privileged")) == in_pod_mps,
               f"{what}: privileged exactly where MPS daemons run")
        c.that((env.get("NVIDIA_MIG_MONITOR_DEVICES") == "all") == mig, f"{what}: MIG env")
        c.that(("/host/proc/driver/nvidia-caps" in mounts) == mig, f"{what}: the nvidia-caps mount exactly with MIG")
        caps = [vol for vol in volumes.values() if vol.get("hostPath", {}).get("path") == "/proc/driver/nvidia-caps"]
        c.that(all(vol["hostPath"].get("type") == "Directory" for vol in caps),
               f"{what}: the host's /proc/driver/nvidia-caps mounted as type Directory (the driver's; never created)")
        if not is_mps_ds and not v.get("securityContext"):
            caps = (container["securityContext"].get("capabilities") or {}).get("add") or []
            c.that(("SYS_ADMIN" in caps) == (mig and mps != "in-process"),
                   f"{what}: CAP_SYS_ADMIN exactly with MIG (in-process MPS is privileged anyway)")
        # NVIDIA's variables, exactly when NVIDIA's chart sets them (an env var beats the file).
        c.that(env.get("MPS_ROOT") == v["mps"]["root"], f"{what}: MPS_ROOT is mps.root")
        for key, var, kind in NVIDIA_ENV:
            value = v.get(key)
            want = nvidia_env_value(value) if isinstance(value, kind) else None
            c.that(env.get(var) == want, f"{what}: {var}={want!r} from {key}={value!r}, not {env.get(var)!r}")
        driver_root = v.get("nvidiaDriverRoot")
        m = mounts.get("/driver-root")
        if isinstance(driver_root, str):
            c.that(m is not None and m.get("readOnly") is True and volumes[m["name"]]["hostPath"]["path"] == driver_root,
                   f"{what}: nvidiaDriverRoot mounted read-only at /driver-root")
        else:
            c.that(m is None, f"{what}: /driver-root only with nvidiaDriverRoot")
        extra = [e for e in ((v.get("devicePlugin") or {}).get("containers") or {}).get("main", {}).get("env", [])
                 if e["name"] not in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES")]
        if not is_mps_ds:
            for e in extra:
                c.that(e in container.get("env", []), f"{what}: devicePlugin.containers.main.env {e['name']}")
            c.that(bool(spec.get("hostNetwork")) == bool(v["devicePlugin"].get("enableHostNetwork")),
                   f"{what}: hostNetwork exactly with devicePlugin.enableHostNetwork")
        else:
            c.that(bool(spec.get("hostNetwork")) == bool(v["mps"].get("enableHostNetwork")),
                   f"{what}: hostNetwork exactly with mps.enableHostNetwork")
        c.that(spec.get("securityContext", {}) == (v.get("podSecurityContext") or {}),
               f"{what}: the pod securityContext is podSecurityContext")
        if mig:
            c.that(env.get("SLICELET_PROC_ROOT") == "/host" and "/host/proc/driver/nvidia-caps" in mounts,
                   f"{what}: MIG caps under SLICELET_PROC_ROOT")
        if v["simulate"]["enabled"]:
            c.that("affinity" not in spec and spec["nodeSelector"].get("kubernetes.io/os") == "linux",
                   f"{what}: simulated nodes need no GPU label")
            c.that(env.get("SLICELET_SIMULATE") == "/etc/slicelet-node/node.yaml"
                   and "/etc/slicelet-node" in mounts, f"{what}: the simulated node file")
        else:
            c.that(spec.get("affinity") == v.get("affinity"), f"{what}: the affinity of the values")
        if not is_mps_ds:
            c.that((env.get("SLICELET_MPS_EXTERNAL") == "true") == (mps == "daemonset"),
                   f"{what}: SLICELET_MPS_EXTERNAL exactly with the -mps DaemonSet")
            c.that(env.get("SLICELET_STATUS_ADDRESS") == f":{v['metrics']['port']}"
                   and container["ports"][0]["containerPort"] == v["metrics"]["port"],
                   f"{what}: the status port")
            labels = v["labels"]
            features = f"{labels['featuresDir'].rstrip('/')}/{labels['fileName']}"
            c.that((env.get("SLICELET_NFD_FEATURES_FILE") == features) == labels["enabled"],
                   f"{what}: SLICELET_NFD_FEATURES_FILE exactly with labels.enabled")
            if labels["enabled"]:
                m = mounts.get(labels["featuresDir"])
                c.that(m is not None and not m.get("readOnly")
                       and volumes[m["name"]]["hostPath"]["path"] == labels["featuresDir"],
                       f"{what}: the host features.d mounted read-write")
            usage = v["usage"]
            c.that(env.get("SLICELET_SAMPLE_SECONDS") == str(usage["sampleSeconds"]),
                   f"{what}: SLICELET_SAMPLE_SECONDS is usage.sampleSeconds")
            pod_resources = usage["podResources"]
            socket = env.get("SLICELET_POD_RESOURCES_SOCKET")
            m = mounts.get(pod_resources["path"])
            if pod_resources["enabled"]:
                c.that(m is not None and m.get("readOnly") is True
                       and volumes[m["name"]]["hostPath"]["path"] == pod_resources["path"],
                       f"{what}: the host's pod-resources directory mounted read-only")
                c.that(socket == f"{pod_resources['path'].rstrip('/')}/kubelet.sock",
                       f"{what}: SLICELET_POD_RESOURCES_SOCKET in the mounted directory, not {socket}")
            else:
                c.that(m is None and socket == "",
                       f"{what}: podResources off: no mount, SLICELET_POD_RESOURCES_SOCKET empty")
            attribution = usage["perPodAttribution"]["enabled"]
            m = mounts.get("/host/proc")
            c.that((m is not None) == attribution,
                   f"{what}: the host's /proc at /host/proc exactly with usage.perPodAttribution")
            if m is not None:
                c.that(m.get("readOnly") is True and volumes[m["name"]]["hostPath"]["path"] == "/proc",
                       f"{what}: the host's /proc read-only")
                c.that(env.get("SLICELET_PROC_ROOT") == "/host", f"{what}: SLICELET_PROC_ROOT=/host")
        else:
            c.that("/host/proc" not in mounts and "SLICELET_POD_RESOURCES_SOCKET" not in env,
                   f"{what}: the MPS daemons need neither /proc nor pod-resources")
        if not is_mps_ds:
            cdi = v["cdi"]
            c.that((env.get("SLICELET_CDI_SPEC_DIRS") == ",".join(cdi["specDirs"])) == cdi_on,
                   f"{what}: SLICELET_CDI_SPEC_DIRS exactly with the CDI mounts")
            for d in cdi["specDirs"]:
                m = mounts.get(d)
                shared = (dra["enabled"] and d == dra["cdiOutputDir"]) or (memory and d == memory_dir)
                if cdi_on or not shared:
                    c.that((m is not None) == cdi_on, f"{what}: {d} mounted exactly with the CDI mounts")
                if m is not None:
                    c.that(bool(m.get("readOnly")) is (not shared) and volumes[m["name"]]["hostPath"]["path"] == d,
                           f"{what}: host {d} read-only (read-write where DRA writes claim specs or "
                           f"slicelet its memory-limit spec)")
            memory_limits(c, what, spec, container, env, mounts, volumes, v, memory)
        else:
            c.that(not spec.get("initContainers"), f"{what}: no init container in the -mps DaemonSet")
            c.that("SLICELET_HOOK_BINARY" not in env and "SLICELET_MEMORY_SPEC_DIR" not in env,
                   f"{what}: the MPS daemons write no memory-limit spec")

    monitors = by_kind.get("ServiceMonitor", [])
    if v["metrics"]["serviceMonitor"]["enabled"]:
        services = by_kind.get("Service", [])
        c.that(len(monitors) == 1 and len(services) == 1, "a Service and a ServiceMonitor")
        if monitors and services and RELEASE in daemonsets:
            pod_labels = daemonsets[RELEASE]["spec"]["template"]["metadata"]["labels"]
            c.that(services[0]["spec"]["selector"].items() <= pod_labels.items(), "the Service selects the plugin pods")
            c.that(monitors[0]["spec"]["selector"]["matchLabels"].items() <= services[0]["metadata"]["labels"].items(),
                   "the ServiceMonitor selects the Service")
    else:
        c.that(not monitors, "no ServiceMonitor unless asked for")
    return c.failures


def memory_limits(c: Checks, what: str, spec: dict[str, Any], container: dict[str, Any], env: dict[str, Any],
                  mounts: dict[str, Any], volumes: dict[str, Any], v: dict[str, Any], memory: bool) -> None:
    """The plugin DaemonSet with memory limits on: the init container `slicelet install-hook`
    (the same image) writes SLICELET_INSTALL_HOOK_TO into the host directory mounted at the same
    path, which is where the plugin's SLICELET_HOOK_BINARY (the host path the container runtime
    runs) points; it is granted nothing but root. memoryLimits.specDir is mounted read-write at
    its own path from the host's, as SLICELET_MEMORY_SPEC_DIR; SLICELET_HOOK_ENV is hookEnv.
    Off: no init container, none of those variables, no hook directory."""
    ml = v["memoryLimits"]
    inits = spec.get("initContainers", [])
    hook = hook_binary(v)
    c.that((env.get("SLICELET_HOOK_BINARY") == hook) == memory,
           f"{what}: SLICELET_HOOK_BINARY={hook} exactly with memory limits, not {env.get('SLICELET_HOOK_BINARY')}")
    c.that((env.get("SLICELET_MEMORY_SPEC_DIR") == ml["specDir"]) == memory,
           f"{what}: SLICELET_MEMORY_SPEC_DIR={ml['specDir']} exactly with memory limits")
    want_hook_env = ",".join(ml["hookEnv"]) if memory and ml["hookEnv"] else None
    c.that(env.get("SLICELET_HOOK_ENV") == want_hook_env,
           f"{what}: SLICELET_HOOK_ENV={want_hook_env!r}, not {env.get('SLICELET_HOOK_ENV')!r}")
    hook_volumes = [n for n, vol in volumes.items() if vol.get("hostPath", {}).get("path") == ml["hookDir"]]
    if not memory:
        c.that(not inits, f"{what}: no init container without memory limits")
        c.that(not hook_volumes, f"{what}: the hook directory only with memory limits")
        c.that(mounts.get(ml["specDir"], {}).get("readOnly", True) is True or (
            v["dra"]["enabled"] and ml["specDir"] == v["dra"]["cdiOutputDir"]),
               f"{what}: {ml['specDir']} not read-write for a memory-limit spec")
        return
    c.that([i["name"] for i in inits] == ["install-hook"], f"{what}: one init container, install-hook")
    for init in inits:
        c.that(init["image"] == container["image"] and init.get("imagePullPolicy") == container.get("imagePullPolicy"),
               f"{what}: install-hook runs the plugin's image")
        c.that(init.get("args") == ["install-hook"] and "command" not in init,
               f"{what}: install-hook runs `slicelet install-hook`")
        init_env = env_of(init)
        to = init_env.get("SLICELET_INSTALL_HOOK_TO")
        c.that(to == hook, f"{what}: install-hook writes {to}, not the hook's host path {hook}")
        init_mounts = init.get("volumeMounts", [])
        c.that(len(init_mounts) == 1, f"{what}: install-hook mounts the hook directory only")
        for m in init_mounts:
            vol = volumes.get(m["name"], {}).get("hostPath", {})
            c.that(m["mountPath"] == ml["hookDir"] and vol.get("path") == ml["hookDir"]
                   and vol.get("type") == "DirectoryOrCreate" and not m.get("readOnly"),
                   f"{what}: the host's {ml['hookDir']} read-write at the same path in install-hook")
            c.that(isinstance(to, str) and os.path.dirname(to) == m["mountPath"].rstrip("/"),
                   f"{what}: install-hook writes into the mounted host directory")
        sc = init.get("securityContext", {})
        c.that(sc.get("runAsUser") == 0 and sc.get("allowPrivilegeEscalation") is False
               and sc.get("readOnlyRootFilesystem") is True and sc.get("capabilities") == {"drop": ["ALL"]}
               and not sc.get("privileged"), f"{what}: install-hook is root and nothing more")
    c.that(all(m["name"] not in hook_volumes for m in container.get("volumeMounts", [])),
           f"{what}: the plugin container does not mount the hook directory")
    m = mounts.get(ml["specDir"])
    c.that(m is not None and not m.get("readOnly")
           and volumes.get(m["name"], {}).get("hostPath", {}).get("path") == ml["specDir"],
           f"{what}: the host's {ml['specDir']} mounted read-write (the memory-limit spec)")


def nvidia_example(name: str, docs: list[dict[str, Any]], v: dict[str, Any]) -> list[str]:
    """An example of NVIDIA's README in NVIDIA's value shape: the node label chooses the config
    (a ConfigMap is in use), with the ClusterRole on nodes, its binding, a token, NODE_NAME and
    SLICELET_CONFIG_LABEL=nvidia.com/device-plugin.config, as NVIDIA's chart."""
    c = Checks(name)
    c.that(label_selection_of(v), "NVIDIA's values: node-label selection is on")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    c.that(("ClusterRole", f"{RELEASE}-node-reader") in kinds
           and ("ClusterRoleBinding", f"{RELEASE}-node-reader") in kinds, "the node-reader ClusterRole and binding")
    ds = next((d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == RELEASE), None)
    c.that(ds is not None, "the plugin DaemonSet")
    if ds is not None:
        spec = ds["spec"]["template"]["spec"]
        env = env_of(spec["containers"][0])
        c.that(spec["automountServiceAccountToken"] is True, "a token")
        c.that(env.get("NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, "NODE_NAME")
        c.that(env.get("SLICELET_CONFIG_LABEL") == "nvidia.com/device-plugin.config",
               "SLICELET_CONFIG_LABEL is NVIDIA's label")
        want = NVIDIA_EXAMPLES.get(name.split(" ")[0], {})
        c.that(bool(want), "every nvidia-* example has its expectations in NVIDIA_EXAMPLES")
        volumes = {vol["name"]: vol for vol in spec["volumes"]}
        if "configMap" in want:
            c.that(volumes["config"]["configMap"]["name"] == want["configMap"], f"the ConfigMap {want['configMap']}")
        for var, value in want.get("env", {}).items():
            c.that(env.get(var) == value, f"{var}={value!r}, not {env.get(var)!r}")
        if "hostPID" in want:
            c.that(bool(spec.get("hostPID")) == want["hostPID"], f"hostPID {want['hostPID']}")
    return c.failures


# What each of NVIDIA's README examples (ci/nvidia-*.yaml) must render to, besides node-label
# selection: the ConfigMap, the variables (None: unset) and MPS's hostPID.
NVIDIA_EXAMPLES: dict[str, dict[str, Any]] = {
    "nvidia-single-config-values": {
        "configMap": f"{RELEASE}-config",
        "env": {"SLICELET_CONFIG_DEFAULT": None, "SLICELET_CONFIG_FALLBACK": "named,single",
                "MIG_STRATEGY": None, "NVIDIA_MIG_MONITOR_DEVICES": None},
        "hostPID": False},
    "nvidia-multiple-configs-values": {
        "configMap": f"{RELEASE}-config",
        "env": {"SLICELET_CONFIG_DEFAULT": "config0", "MIG_STRATEGY": None,
                "NVIDIA_MIG_MONITOR_DEVICES": "all"},
        "hostPID": False},
    "nvidia-configmap-name-values": {
        "configMap": "nvidia-plugin-configs",
        "env": {"SLICELET_CONFIG_DEFAULT": "config0", "NVIDIA_MIG_MONITOR_DEVICES": "all",
                "SLICELET_CDI_SPEC_DIRS": "/etc/cdi,/var/run/cdi"},
        "hostPID": False},
    "nvidia-mps-values": {
        "configMap": f"{RELEASE}-config",
        "env": {"MPS_ROOT": "/run/nvidia/mps", "SLICELET_MPS_CHECK_SECONDS": "5",
                "SLICELET_MPS_EXTERNAL": None},
        "hostPID": True},
    "nvidia-values-values": {
        "configMap": f"{RELEASE}-config",
        "env": {"MIG_STRATEGY": "mixed", "FAIL_ON_INIT_ERROR": "false", "PASS_DEVICE_SPECS": "true",
                "DEVICE_LIST_STRATEGY": "envvar,cdi-cri", "DEVICE_ID_STRATEGY": "index",
                "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver", "NVIDIA_MIG_MONITOR_DEVICES": "all",
                "SLICELET_CDI_SPEC_DIRS": "/etc/cdi,/var/run/cdi", "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/"},
        "hostPID": False},
}


# One time-sliced entry (the REFUSED cases below break it one field at a time).
TS_ENTRY = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4"""


# A config with memory limits on an MPS entry (memory on time-slicing entries: ci/memory-limits-values.yaml).
MEMORY_CONFIG = """version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 2
      memory: {hard: 20Gi}"""


# Values the chart must refuse, and a word its message must contain.
REFUSED = [
    ({"config": {"fallbackStrategy": ["named"]}}, "fallbackStrategy"),
    ({"config": {"fallbackStrategies": ["nearest"]}}, "fallbackStrategies"),
    ({"mps": {"mode": "sidecar"}}, "mps"),
    ({"config": {"nodeLabel": {"enabled": True}}}, "config.nodeLabel.enabled"),
    # config.default must be a key of config.map, and the message names the keys.
    ({"config": {"default": "defualt", "map": {"default": "version: v1", "a100": "version: v1"}}},
     "(its keys: a100, default)"),
    ({"config": {"default": "other"}}, "(its keys: default)"),
    # Several configs, none `default`, no config.default: refused, as NVIDIA's chart.
    ({"config": {"map": {"a": "version: v1", "b": "version: v1"}}}, "has no default config"),
    # One key, but no fallback that takes it (NVIDIA's `empty` would): refused, as NVIDIA's chart.
    ({"config": {"fallbackStrategies": ["named"], "map": {"a": "version: v1"}}}, "set config.default to one of the keys"),
    ({"config": {"map": {"a": "version: [v1"}}}, "config.map.a is not YAML"),
    # Each config as slicelet reads it (src/policy/schema.rs), as far as the template engine
    # can: the config's key and the field named.
    ({"config": {"map": {"default": TS_ENTRY.replace("replicas: 4", "replica: 4")}}},
     "config.map.default: sharing.timeSlicing.resources[0].replica is not a key of a sharing.timeSlicing entry"),
    ({"config": {"map": {"default": TS_ENTRY + "\nsharin: {}"}}}, "config.map.default: sharin is not a key of a policy"),
    ({"config": {"map": {"default": TS_ENTRY.replace("version: v1", "version: v2")}}}, "config.map.default: version v2"),
    ({"config": {"map": {"default": TS_ENTRY + "\nflags:\n  renameByDefault: true"}}},
     "config.map.default: flags.renameByDefault is not a key of flags"),
    ({"config": {"map": {"default": TS_ENTRY.replace("timeSlicing:", "timeSlicing:\n    failRequestsGreaterThan1: true")}}},
     "config.map.default: sharing.timeSlicing.failRequestsGreaterThan1 is not a key of sharing.timeSlicing"),
    ({"config": {"map": {"default": TS_ENTRY.replace("timeSlicing:", "timeslicing:")}}},
     "config.map.default: sharing.timeslicing is not a key of sharing"),
    ({"config": {"default": "ok", "map": {"ok": TS_ENTRY, "ts": TS_ENTRY + "\n      activeThreadPercentage: 25"}}},
     "config.map.ts: sharing.timeSlicing.resources[0].activeThreadPercentage is not a key of a sharing.timeSlicing entry"),
    ({"config": {"map": {"default": MEMORY_CONFIG.replace("replicas: 2", "replicas: 2\n      activeThreadPercent: 25")}}},
     "config.map.default: sharing.mps.resources[0].activeThreadPercent is not a key of a sharing.mps entry"),
    ({"config": {"map": {"default": TS_ENTRY.replace("replicas: 4", "replicas: 0")}}},
     "config.map.default: sharing.timeSlicing.resources[0].replicas 0: a whole number"),
    ({"config": {"map": {"default": TS_ENTRY.replace("replicas: 4", "replicas: '4'")}}},
     "config.map.default: sharing.timeSlicing.resources[0].replicas 4: a whole number"),
    ({"config": {"map": {"default": TS_ENTRY.replace("replicas: 4", "replicas: 1.5")}}},
     "sharing.timeSlicing.resources[0].replicas 1.5: a whole number"),
    ({"config": {"map": {"default": TS_ENTRY.replace("replicas: 4", "rename: gpu-x")}}},
     "config.map.default: sharing.timeSlicing.resources[0].replicas is missing"),
    ({"config": {"map": {"default": TS_ENTRY + "\n      dra: capacty"}}},
     "config.map.default: sharing.timeSlicing.resources[0].dra capacty: true, false or capacity"),
    ({"config": {"map": {"default": TS_ENTRY.replace("- name: nvidia.com/gpu", "- rename: gpu-x")}}},
     "config.map.default: sharing.timeSlicing.resources[0] has no name"),
    # NVIDIA's values, type-checked by the schema.
    ({"migStrategy": "bogus"}, "migStrategy"),
    ({"deviceListStrategy": "envvar,bogus"}, "deviceListStrategy"),
    ({"deviceIDStrategy": "serial"}, "deviceIDStrategy"),
    ({"failOnInitError": "yes"}, "failOnInitError"),
    ({"compatWithCPUManager": "true"}, "compatWithCPUManager"),
    ({"devicePlugin": {"containers": {"sidecar": {}}}}, "sidecar"),
    # What a config or a value needs cannot be switched off.
    ({"mps": {"mode": "none"}, "config": {"map": {"default": "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2"}}},
     "config.map's default use sharing.mps, which needs the MPS control daemons: set mps.mode"),
    ({"mig": {"enabled": False}, "migStrategy": "mixed"}, "migStrategy=mixed needs the MIG settings"),
    ({"mig": {"enabled": False}, "migLayouts": {"name": "mig-parted"}},
     "migLayouts.name=mig-parted (slicelet creates and destroys MIG instances) needs the MIG settings"),
    ({"migLayouts": {"default": "all-1g.10gb"}}, "migLayouts.name (the ConfigMap holding the file) is not set"),
    ({"migLayouts": {"name": "mig-parted", "key": "a/b.yaml"}}, "key"),
    ({"mig": {"enabled": False}, "config": {"default": "a", "map": {"a": "version: v1", "b": "version: v1\nflags:\n  migStrategy: single"}}},
     "config.map's b (flags.migStrategy single or mixed) needs the MIG settings"),
    ({"cdi": {"enabled": False}, "deviceListStrategy": "cdi-cri"}, "deviceListStrategy=cdi-cri needs the host's CDI spec directories"),
    ({"memoryLimits": {"enabled": False}, "config": {"default": "a", "map": {"a": "version: v1", "sized": MEMORY_CONFIG}}},
     "config.map's sized (memory on a sharing entry) needs the GPU memory-limit hook"),
    ({"memoryLimits": {"hookDir": "bin"}}, "hookDir"),
    ({"memoryLimits": {"hookDir": "/var/lib/slicelet/bin/"}}, "hookDir"),
    ({"memoryLimits": {"hookEnv": ["A=1,B=2"]}}, "hookEnv"),
    ({"memoryLimits": {"enable": True}}, "enable"),
    # NVIDIA's values slicelet has no counterpart for: refused, naming the slicelet way.
    ({"gfd": {"enabled": True}}, "slicelet does not install GPU Feature Discovery"),
    ({"nfd": {"enabled": True}}, "slicelet does not install Node Feature Discovery"),
    ({"devicePlugin": {"enabled": False}}, "slicelet is the device plugin"),
    ({"selectorLabelsOverride": {"app": "gpu"}}, "add labels with podLabels"),
    ({"cdi": {"nvidiaHookPath": "/usr/bin/nvidia-cdi-hook"}}, "nvidia-ctk cdi generate"),
    ({"cdi": {"featureFlags": "disable-nvsandboxutils"}}, "slicelet does not generate CDI specs"),
    ({"mps": {"mode": "in-process", "enableHostPID": False}}, "mps.enableHostPID=false"),
    ({"image": {"repository": "nvcr.io/nvidia/k8s-device-plugin"}}, "NVIDIA's plugin image"),
    ({"gdrcopyEnabled": True}, "does not inject GDRCopy"),
    ({"gdsEnabled": True}, "gdsEnabled=true"),
    ({"mofedEnabled": True}, "mofedEnabled=true"),
    ({"deviceDiscoveryStrategy": "tegra"}, "slicelet finds GPUs through NVML only"),
    ({"nvidiaDevRoot": "/run/nvidia/driver"}, "nvidiaDevRoot"),
    ({"namespace": {"name": "default", "create": False}}, "allowDefaultNamespace=true"),
    ({"namespaceOverride": "default", "namespace": {"create": False}}, "allowDefaultNamespace=true"),
    ({"namespace": "gpu"}, "namespace"),
    ({"top": {"rbac": {"create": True}}}, "top.rbac.create=true needs top.rbac.subjects"),
    ({"top": {"rbac": {"create": True, "subjects": [{"kind": "Robot", "name": "r2"}]}}}, "kind"),
    ({"config": {"name": "theirs", "map": {"a": "version: v1"}}}, "config.name and config.map"),
    ({"usage": {"sampleSeconds": -1}}, "sampleSeconds"),
    ({"usage": {"perPodAttribution": {"hostPID": True}}}, "hostPID"),
    ({"dra": {"driverName": "Not_A_Driver"}}, "driverName"),
    ({"dra": {"enable": True}}, "enable"),
    # The migration bridge: names as Kubernetes takes them, each DRA's in a config, each once,
    # each a DeviceClass name of its own, only with DRA.
    ({"dra": {"enabled": True, "extendedResources": ["NVIDIA.com/gpu"]}}, "extendedResources"),
    ({"dra": {"enabled": True, "extendedResources": ["gpu-shared"]}}, "extendedResources"),
    ({"dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu_shared"]}}, "extendedResources"),
    ({"dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu", "nvidia.com/gpu"]}}, "extendedResources"),
    ({"dra": {"enabled": True, "extendedResources": ["kubernetes.io/gpu"]}}, "reserved for native resources"),
    ({"dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu-shared"]}},
     "nvidia.com/gpu-shared is no DRA resource of the chart's configs, so its DeviceClass would select no device (their DRA resources: none)"),
    ({"dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu"]}, "config": {"default": "dp", "map": {
        "dp": "version: v1", "dra": "version: v1\ndra:\n  resources: [mig-1g.10gb]"}}},
     "(their DRA resources: nvidia.com/mig-1g.10gb)"),
    # What the chart reads as a config's DRA resources: renameByDefault's <name>.shared, an MPS
    # entry's rename, `nvidia.com/` added to a bare name, an entry with `dra: capacity`; not an
    # entry without `dra: true` or `dra: capacity`.
    ({"dra": {"enabled": True, "extendedResources": ["nvidia.com/gpu"]}, "config": {"default": "ts", "map": {
        "ts": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
              "    - name: nvidia.com/gpu\n      replicas: 2\n      dra: true",
        "mps": "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      rename: gpu-mps\n"
               "      replicas: 2\n      dra: true\n    - name: nvidia.com/gpu\n      rename: gpu-plugin\n      replicas: 2\n"
               "    - name: nvidia.com/gpu\n      rename: example.com/gpu-cap\n      replicas: 2\n      dra: capacity"}}},
     "(their DRA resources: example.com/gpu-cap, nvidia.com/gpu-mps, nvidia.com/gpu.shared)"),
    ({"dra": {"extendedResources": ["nvidia.com/gpu-shared"]}}, "dra.extendedResources needs dra.enabled=true"),
    ({"config": {"name": "theirs"}, "dra": {"enabled": True, "extendedResources": ["a.b/c", "a-b/c"]}},
     "a.b/c and a-b/c both give the DeviceClass name a-b-c.bridge.gpu.slicelet.io"),
    ({"config": {"name": "theirs"}, "dra": {"enabled": True, "extendedResources": ["example.com/" + "g" * 60]}},
     "over 63 characters"),
]


# Each feature is turned on by at least one ci/ example (a new value gets an example).
FEATURES = {
    "node-label selection": label_selection_of,
    "config.nodeLabel.enabled false with a ConfigMap":
        lambda v: v["config"]["nodeLabel"].get("enabled") is False and bool(v["config"]["map"] or v["config"]["name"]),
    "mps.mode unset, in-process because a config uses sharing.mps":
        lambda v: v["mps"].get("mode") is None and effective_mps(v) == "in-process",
    "mig settings from a config's flags.migStrategy (mig.enabled unset)":
        lambda v: v["mig"].get("enabled") is None and v.get("migStrategy") is None and needs(v)["mig"],
    "mig settings from NVIDIA's migStrategy (mig.enabled unset)":
        lambda v: v["mig"].get("enabled") is None and v.get("migStrategy") in ("single", "mixed"),
    "mig settings from config.name (mig.enabled unset)":
        lambda v: v["mig"].get("enabled") is None and v.get("migStrategy") is None and bool(v["config"]["name"]),
    "CDI mounts from a config's cdi-* deviceListStrategy (cdi.enabled unset)":
        lambda v: v["cdi"].get("enabled") is None and not v["config"]["name"] and needs(v)["cdi"],
    "CDI mounts from NVIDIA's deviceListStrategy (cdi.enabled unset)":
        lambda v: v["cdi"].get("enabled") is None and "cdi-cri" in strategies(v.get("deviceListStrategy")),
    "every NVIDIA variable set":
        lambda v: all(isinstance(v.get(key), kind) for key, _, kind in NVIDIA_ENV),
    "namespaceOverride": lambda v: bool(v.get("namespaceOverride")),
    "podSecurityContext": lambda v: bool(v.get("podSecurityContext")),
    "devicePlugin.containers.main.env":
        lambda v: bool(v["devicePlugin"]["containers"]["main"]["env"]),
    "devicePlugin.enableHostNetwork": lambda v: v["devicePlugin"]["enableHostNetwork"],
    "top.rbac.create": lambda v: v["top"]["rbac"]["create"],
    "gfd and nfd keys of NVIDIA's chart (no effect)": lambda v: len(v["gfd"]) > 1 and bool(v["nfd"]),
    "config.name": lambda v: bool(v["config"]["name"]),
    "config.map with several configs": lambda v: len(v["config"]["map"]) > 1,
    "config.default": lambda v: bool(v["config"]["default"]),
    "mps.mode in-process": lambda v: v["mps"].get("mode") == "in-process",
    "mps.mode daemonset": lambda v: v["mps"].get("mode") == "daemonset",
    "mig.enabled": lambda v: v["mig"].get("enabled") is True,
    "migLayouts without node-label selection (node RBAC and MIG settings from migLayouts alone)":
        lambda v: bool(v["migLayouts"]["name"]) and not label_selection_of(v) and v["mig"].get("enabled") is None
        and v.get("migStrategy") is None and not v["config"]["name"] and not needs(v)["mig"],
    "migLayouts.default": lambda v: bool(v["migLayouts"]["default"]),
    "labels.enabled": lambda v: v["labels"]["enabled"],
    "cdi.enabled": lambda v: v["cdi"].get("enabled") is True,
    "metrics.serviceMonitor.enabled": lambda v: v["metrics"]["serviceMonitor"]["enabled"],
    "simulate.enabled": lambda v: v["simulate"]["enabled"],
    "namespace.create true (the Namespace with its Pod Security label)": lambda v: v["namespace"]["create"],
    "namespace.name another namespace than the release's":
        lambda v: bool(v["namespace"]["name"]) and not v.get("namespaceOverride"),
    "runtimeClassName": lambda v: bool(v.get("runtimeClassName")),
    "nodeSelector": lambda v: bool(v.get("nodeSelector")),
    "usage.perPodAttribution.enabled": lambda v: v["usage"]["perPodAttribution"]["enabled"],
    "usage.perPodAttribution.enabled with mig.enabled":
        lambda v: v["usage"]["perPodAttribution"]["enabled"] and effective_mig(v),
    "usage.podResources.enabled false": lambda v: not v["usage"]["podResources"]["enabled"],
    "usage.sampleSeconds 0": lambda v: v["usage"]["sampleSeconds"] == 0,
    "dra.enabled": lambda v: v["dra"]["enabled"],
    "dra.enabled with cdi.enabled": lambda v: v["dra"]["enabled"] and effective_cdi(v),
    "dra.extendedResources (the migration bridge) checked against config.map":
        lambda v: v["dra"]["enabled"] and bool(v["dra"]["extendedResources"]) and bool(v["config"]["map"]),
    "dra.extendedResources bridging a `dra: capacity` entry":
        lambda v: v["dra"]["enabled"] and any(
            e.get("dra") == "capacity" and qualified(e.get("rename") or e.get("name")) in v["dra"]["extendedResources"]
            for p in policies(v) for kind in ("timeSlicing", "mps")
            for e in (((p.get("sharing") or {}).get(kind) or {}).get("resources") or []) if isinstance(e, dict)),
    "memory limits from a config's memory (memoryLimits.enabled unset)":
        lambda v: v["memoryLimits"].get("enabled") is None and needs(v)["memory"],
    "memory limits with the spec directory one of the CDI mounts":
        lambda v: effective_memory(v) and effective_cdi(v) and v["memoryLimits"]["specDir"] in v["cdi"]["specDirs"],
    "memory limits with the spec directory DRA's":
        lambda v: effective_memory(v) and v["dra"]["enabled"] and not effective_cdi(v)
        and v["memoryLimits"]["specDir"] == v["dra"]["cdiOutputDir"],
    "memory limits with a spec directory of its own mount":
        lambda v: effective_memory(v) and not (effective_cdi(v) and v["memoryLimits"]["specDir"] in v["cdi"]["specDirs"])
        and not (v["dra"]["enabled"] and v["memoryLimits"]["specDir"] == v["dra"]["cdiOutputDir"]),
    "memoryLimits.enabled": lambda v: v["memoryLimits"].get("enabled") is True,
    "memoryLimits.hookEnv": lambda v: effective_memory(v) and bool(v["memoryLimits"]["hookEnv"]),
}


def gpu_operator(chart: pathlib.Path, values: dict[str, Any], docs: list[dict[str, Any]]) -> list[str]:
    """The GPU Operator path: deployments/gpu-operator/clusterpolicy-patch.yaml against our own
    schema of the ClusterPolicy fields it sets (clusterpolicy-patch.schema.json; kubernetes-validate
    has none for the CRD), the hand-over it promises (the operator's plugin off, GFD on), and
    ci/gpu-operator-values.yaml reading the patch's ConfigMap and default in the operator's
    namespace, following the operator's node label, writing no labels of its own."""
    c = Checks("gpu-operator")
    base = chart.parent.parent / "gpu-operator"
    patch = yaml.safe_load((base / "clusterpolicy-patch.yaml").read_text())
    schema = json.loads((base / "clusterpolicy-patch.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    for e in jsonschema.Draft7Validator(schema).iter_errors(patch):
        c.that(False, f"clusterpolicy-patch.yaml at {'/'.join(map(str, e.absolute_path))}: {e.message}")
    spec = patch.get("spec", {})
    plugin = spec.get("devicePlugin", {})
    c.that(plugin.get("enabled") is False, "the patch turns the operator's device plugin off")
    c.that(spec.get("gfd", {}).get("enabled") is True, "the patch keeps GFD on (hardware labels)")
    config = plugin.get("config", {})
    c.that(values["config"]["name"] == config.get("name") and values["config"].get("default") == config.get("default"),
           f"values config.name/default {values['config']['name']}/{values['config'].get('default')} are the "
           f"ClusterPolicy's devicePlugin.config {config.get('name')}/{config.get('default')}")
    c.that(values["namespace"] == {"name": "gpu-operator", "create": False},
           "slicelet in the operator's namespace, which it does not create")
    c.that(not values.get("labels", {}).get("enabled"), "labels.enabled off: GFD labels the nodes")
    c.that(label_selection_of(values) and values["config"]["nodeLabel"]["key"] == "nvidia.com/device-plugin.config",
           "slicelet follows the operator's node label nvidia.com/device-plugin.config")
    mig = spec.get("mig", {}).get("strategy", "single")
    c.that(values.get("migStrategy") == mig, f"migStrategy is the ClusterPolicy's mig.strategy ({mig})")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    c.that(not any(k == "ConfigMap" for k, _ in kinds), "no ConfigMap of its own: the operator's is read")
    c.that(not any(k == "Namespace" for k, _ in kinds), "no Namespace")
    ds = next((d for d in docs if d["kind"] == "DaemonSet"), None)
    if ds is not None:
        vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        c.that(vols["config"].get("configMap", {}).get("name") == config.get("name"),
               "the plugin mounts the operator's ConfigMap")
        env = env_of(ds["spec"]["template"]["spec"]["containers"][0])
        c.that(env.get("SLICELET_CONFIG_DEFAULT") == config.get("default") and env.get("MIG_STRATEGY") == mig,
               "SLICELET_CONFIG_DEFAULT and MIG_STRATEGY as the operator's plugin had them")
    return c.failures


def loaded_merge(chart: pathlib.Path, values: dict[str, Any]) -> dict[str, Any]:
    """values coalesced with the chart's defaults, as the templates see them."""
    with helm.Chart.load(chart) as loaded:
        return loaded.merge_values(values)


def policy_files(repo: pathlib.Path) -> list[tuple[str, str, str | None]]:
    """The policies the daemon's own tests read (tests/integration/fixtures.rs): each of
    fixtures/policies/*.yaml with its header's verdict (`# accept` or `# reject`, and the path
    `The error must name ...`), and config/policy*.yaml, each valid."""
    out: list[tuple[str, str, str | None]] = []
    for f in sorted((repo / "fixtures" / "policies").glob("*.yaml")) + sorted((repo / "config").glob("policy*.yaml")):
        text = f.read_text()
        header = " ".join(line for line in text.splitlines() if line.startswith("#"))
        verdict = "reject" if "# reject" in header else "accept"
        must = header.split("The error must name ")[1].split()[0].rstrip(".") if "The error must name " in header else None
        out.append((str(f.relative_to(repo)), verdict, must))
    return out


def notes_check(name: str, notes: str, v: dict[str, Any]) -> list[str]:
    """NOTES.txt names every chart value that overrides the configs' own flags: each of NVIDIA's
    values that is set (the variable wins over the file on every node), with the configs of
    config.map whose own flag differs, and nothing when no value is set; with migStrategy
    single|mixed over readable configs, that every node gets CAP_SYS_ADMIN."""
    c = Checks(f"{name} NOTES")
    any_set = False
    for key, var, kind in NVIDIA_ENV:
        value = v.get(key)
        if isinstance(value, kind):
            any_set = True
            text = nvidia_env_value(value) if isinstance(value, bool) else str(value)
            line = f"  {key}={text}: {var}={text} on every node wins over flags."
            c.that(line in notes, f"names the override of {key}={text} ({var}): {line!r}")
    flags_of = {"migStrategy": ("migStrategy",), "failOnInitError": ("failOnInitError",),
                "compatWithCPUManager": ("plugin", "passDeviceSpecs"),
                "deviceListStrategy": ("plugin", "deviceListStrategy"),
                "deviceIDStrategy": ("plugin", "deviceIDStrategy")}
    for (config, text), p in zip((v["config"].get("map") or {}).items(), policies(v)):
        for key, path in flags_of.items():
            value = v.get(key)
            own: Any = p.get("flags") or {}
            for part in path:
                own = own.get(part) if isinstance(own, dict) else None
            if isinstance(own, list):
                own = ",".join(own)
            if own is None or value is None or nvidia_env_value(own) == nvidia_env_value(value):
                continue
            c.that(f"{config} says {nvidia_env_value(own)}" in notes,
                   f"names config.map's {config}, whose flags.{'.'.join(path)} {own} {key}={value} overrides")
        root = (p.get("flags") or {}).get("mpsRoot")
        if root is not None and root != v["mps"]["root"]:
            any_set = True
            c.that(f"wins over config.map's {config} flags.mpsRoot ({root})" in notes,
                   f"names config.map's {config} flags.mpsRoot {root}, which mps.root overrides")
    c.that(("Chart values that override the configs' own flags" in notes) == any_set,
           "the override section exactly when a value overrides a flag")
    mig_note = "every node's slicelet pod has\nCAP_SYS_ADMIN"
    c.that((mig_note in notes) == (v.get("migStrategy") in ("single", "mixed") and effective_mig(v)
                                   and not v["config"]["name"]),
           "the note that migStrategy gives every node CAP_SYS_ADMIN exactly with migStrategy single|mixed")
    return c.failures


def main() -> int:
    chart = pathlib.Path(sys.argv[1])
    out = pathlib.Path(sys.argv[2])
    versions = sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    DEFAULT_CONFIG.update(yaml.safe_load((chart / "files" / "policy.yaml").read_text()))
    examples: list[tuple[str, dict[str, Any]]] = [("default", {})]
    for f in sorted((chart / "ci").glob("*.yaml")):
        examples.append((f.stem, helm.values_from_yaml(f.read_text())))
    failures: list[str] = []
    covered: set[str] = set()
    with helm.Chart.load(chart) as loaded:
        for name, values in examples:
            merged = loaded.merge_values(values)
            covered |= {f for f, on in FEATURES.items() if on(merged)}
            # `helm lint --strict`: warnings (severity 2) and errors (3) fail.
            report = helm.lint(chart, values, strict=True, namespace=RELEASE_NAMESPACE,
                               kube_version=f"v{versions[-1]}")
            failures += [f"{name}: helm lint: {m['path']}: {m['error']}"
                         for m in report["messages"] if m["severity"] >= 2]
            for version in versions:
                try:
                    release = render_release(chart, values, version)
                except helm.HelmError as e:
                    failures.append(f"{name} (Kubernetes {version}): {e}")
                    continue
                manifest = release["manifest"]
                failures += notes_check(f"{name} (Kubernetes {version})", release["notes"], merged)
                (out / f"{name}-{version}.yaml").write_text(manifest)
                docs = [d for d in yaml.safe_load_all(manifest) if d]
                failures += check(f"{name} (Kubernetes {version})", docs, merged)
                if name.startswith("nvidia-"):
                    failures += nvidia_example(f"{name} (Kubernetes {version})", docs, merged)
                if name == "gpu-operator-values":
                    failures += gpu_operator(chart, merged, docs)
            print(f"rendered: {name}")
    for values, word in REFUSED:
        try:
            render(chart, values, versions[0])
            failures.append(f"refused: {values} rendered")
        except helm.HelmError as e:
            if word not in str(e):
                failures.append(f"refused: {values}: the message does not name {word!r}: {e}")
    print(f"refused: {len(REFUSED)} bad values")
    # The release namespace is the chart's: -n default is refused (as NVIDIA's chart), naming
    # the -n to use; any other release namespace gets every namespaced object, the top Role,
    # the ServiceMonitor and the admission policy's ServiceAccount included.
    try:
        render(chart, {}, versions[-1], namespace="default")
        failures.append("-n default rendered without allowDefaultNamespace")
    except helm.HelmError as e:
        if "-n slicelet-system --create-namespace" not in str(e):
            failures.append(f"-n default: the message does not name -n slicelet-system --create-namespace: {e}")
    everything = {"dra": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}},
                  "top": {"rbac": {"create": True, "subjects": [{"kind": "Group", "name": "gpu-admins"}]}},
                  "config": {"map": {"default": TS_ENTRY}}}
    for ns, values in (("gpu-team", everything), ("default", {**everything, "allowDefaultNamespace": True})):
        release = render_release(chart, values, versions[-1], namespace=ns)
        docs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                where = d["metadata"].get("namespace")
                if where != ns:
                    failures.append(f"-n {ns}: {d['kind']} {d['metadata']['name']} in {where}")
        text = release["manifest"] + release["notes"]
        for wrong in {"slicelet-system", RELEASE_NAMESPACE} - {ns}:
            if wrong in text:
                failures.append(f"-n {ns}: the rendering or NOTES name {wrong}")
        if f"system:serviceaccount:{ns}:{RELEASE}" not in text or f"- {ns}\n" not in text:
            failures.append(f"-n {ns}: the admission policy's ServiceAccount or the ServiceMonitor's namespace is not {ns}")
    # The user's case: a time-sliced config saying migStrategy none under NVIDIA's top-level
    # migStrategy mixed: NOTES names the config and that every node gets CAP_SYS_ADMIN.
    user = {"migStrategy": "mixed", "config": {"default": "ts", "map": {
        "ts": TS_ENTRY + "\nflags:\n  migStrategy: none", "mig": "version: v1\nflags:\n  migStrategy: mixed"}}}
    notes = render_release(chart, user, versions[-1])["notes"]
    failures += notes_check("migStrategy over a config's none", notes, loaded_merge(chart, user))
    if "(config.map's ts says none)" not in notes:
        failures.append(f"migStrategy over a config's none: NOTES do not name config.map's ts: {notes}")
    templates = chart / "templates"
    for f in sorted(templates.iterdir()):
        # (A `fail` message may show the install command, naming it as an example.)
        if any("slicelet-system" in line and "fail " not in line for line in f.read_text().splitlines()):
            failures.append(f"{f}: names slicelet-system (the namespace is the release's)")
    # The daemon's own test policies as config.map's one config: every valid one renders (the
    # chart's checks refuse nothing slicelet accepts), every invalid one is refused naming the
    # config and the path the daemon's error names.
    repo = chart.resolve().parent.parent.parent
    for rel, verdict, must in policy_files(repo):
        values = {"config": {"map": {"default": (repo / rel).read_text()}}}
        try:
            render(chart, values, versions[-1])
            if verdict == "reject":
                failures.append(f"{rel} (rejected by slicelet) renders as config.map.default")
        except helm.HelmError as e:
            if verdict == "accept":
                failures.append(f"{rel} (accepted by slicelet) is refused as config.map.default: {e}")
            elif not must or f"config.map.default: {must}" not in str(e):
                failures.append(f"{rel}: the refusal does not name config.map.default: {must}: {e}")
    print(f"policies: {len(policy_files(repo))} of fixtures/policies and config as config.map")
    for f in sorted(set(FEATURES) - covered):
        failures.append(f"no example in {chart / 'ci'} turns on {f}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
