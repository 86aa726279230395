//! The manifests and the policy they ship agree: the ConfigMap's embedded policy (and every
//! overlay's replacement) passes slicelet's own validator and plans like config/policy.yaml.
//! Schema validation of the rendered manifests runs in .ci/run (kubectl kustomize +
//! kubernetes-validate).

use std::path::Path;

use slicelet::inventory::simulated;
use slicelet::{plan, policy};

use crate::common::*;

fn yaml(path: &Path) -> serde_json::Value {
    yaml_serde::from_str(&read(path)).unwrap()
}

fn h100() -> slicelet::inventory::Inventory {
    let f = node_file("h100-80gb-x8.yaml");
    simulated::parse(&f, &read(&f)).unwrap()
}

/// The same node on a driver that enforces per-cgroup memory limits (R615, cgroup v2).
fn h100_r615() -> slicelet::inventory::Inventory {
    let f = node_file("h100-80gb-x8-r615.yaml");
    simulated::parse(&f, &read(&f)).unwrap()
}

/// Whether a sharing entry of `p` sets `memory` (planned on [`h100_r615`]: under
/// `enforce: required` an older driver is a plan error).
fn uses_memory(p: &policy::Policy) -> bool {
    p.time_slicing.resources.iter().any(|r| r.memory.is_some())
        || p.mps.resources.iter().any(|e| e.shared.memory.is_some())
}

#[test]
fn configmap_policy_is_the_example_policy_and_valid() {
    let cm = yaml(&repo().join("manifests/base/configmap.yaml"));
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "slicelet-policy");
    let embedded = cm["data"]["config.yaml"].as_str().unwrap();
    let example = read(&repo().join("config/policy.yaml"));
    assert_eq!(
        embedded, example,
        "manifests/base/configmap.yaml must embed config/policy.yaml"
    );
    let p = policy::parse(embedded).unwrap();
    let built = plan::build(&p, &h100()).unwrap();
    assert_eq!(
        built.plan.resources["nvidia.com/gpu-shared"].devices.len(),
        32
    );
}

#[test]
fn overlay_policies_are_valid() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("manifests/overlays")).unwrap() {
        let k = entry.unwrap().path().join("kustomization.yaml");
        let doc = yaml(&k);
        for patch in doc["patches"].as_array().into_iter().flatten() {
            if patch["target"]["kind"] != "ConfigMap" {
                continue;
            }
            let ops: serde_json::Value =
                yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
            for op in ops.as_array().unwrap() {
                // Every key a patch writes is a policy (overlays/node-label holds several
                // named configs).
                if op["path"].as_str().is_some_and(|p| p.starts_with("/data/"))
                    && op["op"] != "remove"
                {
                    let text = op["value"].as_str().unwrap();
                    let p = policy::parse(text).unwrap_or_else(|e| panic!("{}: {e}", k.display()));
                    let node = if uses_memory(&p) { h100_r615() } else { h100() };
                    plan::build(&p, &node).unwrap_or_else(|e| panic!("{}: {e}", k.display()));
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 1, "no overlay replaces the policy");
}

#[test]
fn daemonset_mounts_the_policy_as_a_directory_and_the_plugin_dir() {
    let ds = yaml(&repo().join("manifests/base/daemonset.yaml"));
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(
        mounts.iter().all(|m| m.get("subPath").is_none()),
        "subPath mounts never update"
    );
    let policy_mount = mounts.iter().find(|m| m["name"] == "policy").unwrap();
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let config = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    assert_eq!(
        Path::new(config).parent().unwrap(),
        Path::new(policy_mount["mountPath"].as_str().unwrap())
    );
    assert!(mounts
        .iter()
        .any(|m| m["mountPath"] == "/var/lib/kubelet/device-plugins"));
}

#[test]
fn simulated_overlay_node_is_a_shipped_node() {
    let cm = yaml(&repo().join("manifests/overlays/simulated/node-configmap.yaml"));
    let embedded = cm["data"]["node.yaml"].as_str().unwrap();
    let shipped = read(&node_file("h100-80gb-x8.yaml"));
    assert_eq!(embedded, shipped);
    assert_eq!(
        simulated::parse(Path::new("node.yaml"), embedded)
            .unwrap()
            .gpus
            .len(),
        8
    );
}

#[test]
fn mig_overlay_ships_the_mig_policy_and_the_caps_under_its_proc_root() {
    let k = yaml(&repo().join("manifests/overlays/mig/kustomization.yaml"));
    let mut policy = None;
    let mut proc_root = None;
    let mut caps_mount = None;
    for patch in k["patches"].as_array().unwrap() {
        let ops: serde_json::Value =
            yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
        for op in ops.as_array().unwrap() {
            let v = &op["value"];
            if op["path"] == "/data/config.yaml" {
                policy = v.as_str().map(str::to_string);
            } else if v["name"] == "SLICELET_PROC_ROOT" {
                proc_root = v["value"].as_str().map(str::to_string);
            } else if v["name"] == "nvidia-caps" && v.get("mountPath").is_some() {
                caps_mount = v["mountPath"].as_str().map(str::to_string);
            }
        }
    }
    let example = read(&repo().join("config/policy-mig.yaml"));
    assert_eq!(policy.as_deref(), Some(example.as_str()));
    let root = proc_root.expect("SLICELET_PROC_ROOT");
    assert_eq!(
        Path::new(&root).join("proc/driver/nvidia-caps"),
        Path::new(&caps_mount.expect("nvidia-caps mount"))
    );
}

#[test]
fn mps_overlay_splits_the_daemons_into_their_own_daemonset() {
    let dir = repo().join("manifests/overlays/mps");
    let k = yaml(&dir.join("kustomization.yaml"));
    let patches = k["patches"].as_array().unwrap();
    let plugin_patch = patches
        .iter()
        .find(|p| p["target"]["kind"] == "DaemonSet" && p["target"]["name"] == "slicelet")
        .unwrap();
    assert!(plugin_patch["patch"]
        .as_str()
        .unwrap()
        .contains("--mps-external"));
    let policy_text = patches
        .iter()
        .find(|p| p["target"]["kind"] == "ConfigMap")
        .map(|p| {
            let ops: serde_json::Value =
                yaml_serde::from_str(p["patch"].as_str().unwrap()).unwrap();
            ops[0]["value"].as_str().unwrap().to_string()
        })
        .unwrap();
    let p = policy::parse(&policy_text).unwrap();
    let built = plan::build(&p, &h100()).unwrap();
    assert_eq!(built.plan.resources["nvidia.com/gpu-mps"].devices.len(), 32);

    let ds = yaml(&dir.join("mps-daemonset.yaml"));
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["mps", "--config", "/etc/slicelet/config.yaml"]);
    let mounts = c["volumeMounts"].as_array().unwrap();
    assert!(mounts
        .iter()
        .any(|m| m["mountPath"] == p.mps_root.to_str().unwrap()));
    assert!(mounts
        .iter()
        .any(|m| m["mountPath"] == "/etc/slicelet" && m.get("subPath").is_none()));
    assert_eq!(spec["hostPID"], true);
    // The plugin mounts the same MPS root (the daemons' pipe directories, health-checked).
    assert_eq!(
        added_mount_paths(&k, "slicelet"),
        [p.mps_root.to_str().unwrap()]
    );
}

/// The mountPaths an overlay's DaemonSet patch adds, in order.
fn added_mount_paths(kustomization: &serde_json::Value, daemonset: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for patch in kustomization["patches"].as_array().unwrap() {
        if patch["target"]["kind"] != "DaemonSet" || patch["target"]["name"] != daemonset {
            continue;
        }
        let ops: serde_json::Value =
            yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
        for op in ops.as_array().unwrap() {
            if op["path"] == "/spec/template/spec/containers/0/volumeMounts/-" {
                paths.push(op["value"]["mountPath"].as_str().unwrap().to_string());
            }
        }
    }
    paths
}

/// Node affinity terms as `key` strings, one per term.
fn affinity_keys(affinity: &serde_json::Value) -> Vec<String> {
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let e = &t["matchExpressions"][0];
            assert_eq!(
                (&e["operator"], &e["values"]),
                (&"In".into(), &serde_json::json!(["true"]))
            );
            e["key"].as_str().unwrap().to_string()
        })
        .collect()
}

const GPU_NODE_LABELS: [&str; 4] = [
    "nvidia.com/gpu.present",
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
];

#[test]
fn base_namespace_enforces_privileged_and_mps_root_is_mounted_only_with_mps() {
    let ns = yaml(&repo().join("manifests/base/namespace.yaml"));
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    let ds = yaml(&repo().join("manifests/base/daemonset.yaml"));
    let spec = &ds["spec"]["template"]["spec"];
    let paths: Vec<&str> = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/lib/kubelet/device-plugins",
            "/etc/slicelet",
            "/var/lib/kubelet/pod-resources",
            "/var/lib/kubelet/plugins/gpu.slicelet.io"
        ]
    );
    // The DRA checkpoint without DRA: read only (overlays/dra mounts the plugins directory).
    assert_eq!(spec["containers"][0]["volumeMounts"][3]["readOnly"], true);
    assert!(spec.get("hostPID").is_none());
    let mps_root = policy::Policy::default().mps_root;
    for overlay in ["mps", "mps-in-process"] {
        let k = yaml(&repo().join(format!("manifests/overlays/{overlay}/kustomization.yaml")));
        assert!(
            added_mount_paths(&k, "slicelet").contains(&mps_root.display().to_string()),
            "overlays/{overlay} mounts {}",
            mps_root.display()
        );
    }
    // Both DaemonSets select GPU nodes by GFD's label or any of NFD's NVIDIA PCI labels.
    assert_eq!(affinity_keys(&spec["affinity"]), GPU_NODE_LABELS);
    let mps = yaml(&repo().join("manifests/overlays/mps/mps-daemonset.yaml"));
    assert_eq!(
        affinity_keys(&mps["spec"]["template"]["spec"]["affinity"]),
        GPU_NODE_LABELS
    );
}

#[test]
fn simulated_overlay_puts_its_node_configmap_in_the_namespace() {
    // The overlay's own resources get the namespace only from its own kustomization.
    let base = yaml(&repo().join("manifests/base/kustomization.yaml"));
    let k = yaml(&repo().join("manifests/overlays/simulated/kustomization.yaml"));
    assert_eq!(k["namespace"], base["namespace"]);
    assert!(k["resources"]
        .as_array()
        .unwrap()
        .contains(&"node-configmap.yaml".into()));
}

const CHART: &str = "deployments/helm/slicelet";

/// values.yaml, or a ci/ example merged over it the way Helm coalesces values (maps merged
/// key by key, a null deletes the key, anything else replaces).
fn chart_values(example: Option<&Path>) -> serde_json::Value {
    fn merge(base: &mut serde_json::Value, over: &serde_json::Value) {
        match (base, over) {
            (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
                for (k, v) in o {
                    if v.is_null() {
                        b.remove(k);
                    } else if let Some(slot) = b.get_mut(k) {
                        merge(slot, v);
                    } else {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
            (b, o) => *b = o.clone(),
        }
    }
    let mut v = yaml(&repo().join(CHART).join("values.yaml"));
    if let Some(e) = example {
        merge(&mut v, &yaml(e));
    }
    v
}

#[test]
fn chart_ships_the_example_policy_and_node_and_the_base_scheduling() {
    let chart = repo().join(CHART);
    assert_eq!(
        read(&chart.join("files/policy.yaml")),
        read(&repo().join("config/policy.yaml")),
        "the chart's default config is config/policy.yaml"
    );
    assert_eq!(
        read(&chart.join("files/simulated-node.yaml")),
        read(&node_file("h100-80gb-x8.yaml"))
    );
    let v = chart_values(None);
    let base = yaml(&repo().join("manifests/base/daemonset.yaml"));
    let spec = &base["spec"]["template"]["spec"];
    assert_eq!(v["affinity"], spec["affinity"]);
    assert_eq!(affinity_keys(&v["affinity"]), GPU_NODE_LABELS);
    assert_eq!(v["tolerations"], spec["tolerations"]);
    assert_eq!(v["priorityClassName"], spec["priorityClassName"]);
    let c = &spec["containers"][0];
    assert_eq!(v["resources"], c["resources"]);
    assert_eq!(
        v["mps"]["root"],
        policy::Policy::default().mps_root.to_str().unwrap()
    );
}

#[test]
fn chart_example_configs_are_valid_and_plan() {
    let nodes = [h100(), {
        let f = node_file("h100-80gb-x8-mig-mixed.yaml");
        simulated::parse(&f, &read(&f)).unwrap()
    }];
    let memory_nodes = [h100_r615()];
    let mut checked = 0;
    let mut examples: Vec<_> = std::fs::read_dir(repo().join(CHART).join("ci"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    examples.sort();
    for example in &examples {
        let v = chart_values(Some(example));
        for (name, text) in v["config"]["map"].as_object().unwrap() {
            let at = format!("{}: config.map.{name}", example.display());
            let p = policy::parse(text.as_str().unwrap()).unwrap_or_else(|e| panic!("{at}: {e}"));
            // Memory limits are enforced (required) only on R615 and later, never on MIG.
            let on = if uses_memory(&p) {
                &memory_nodes[..]
            } else {
                &nodes[..]
            };
            for node in on {
                plan::build(&p, node).unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            if !p.mps.resources.is_empty() {
                // The chart mounts mps.root; the daemons live under the policy's mpsRoot.
                assert_eq!(v["mps"]["root"], p.mps_root.to_str().unwrap(), "{at}");
                assert_ne!(v["mps"]["mode"], "none", "{at}: MPS entries need mps.mode");
            }
            if uses_memory(&p) {
                assert_ne!(
                    v["memoryLimits"]["enabled"], false,
                    "{at}: memory limits need the hook (memoryLimits)"
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked >= 7,
        "{checked} configs in {} examples",
        examples.len()
    );
}

/// overlays/memory-limits: the policy is config/policy-memory.yaml and plans with its limits
/// enforced on an R615 node; the init container (`slicelet install-hook`, the plugin's image)
/// writes the hook into the host directory mounted at the same path, which is the path the
/// plugin's SLICELET_HOOK_BINARY names; slicelet's spec directory is the host's /var/run/cdi,
/// mounted read-write, and the CDI specs it checks names against are mounted too.
#[test]
fn memory_limits_overlay_installs_the_hook_where_the_spec_names_it() {
    let k = yaml(&repo().join("manifests/overlays/memory-limits/kustomization.yaml"));
    let mut policy_text = None;
    let mut init = None;
    let mut env = std::collections::BTreeMap::new();
    let mut mounts = Vec::new();
    let mut volumes = std::collections::BTreeMap::new();
    for patch in k["patches"].as_array().unwrap() {
        let ops: serde_json::Value =
            yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
        for op in ops.as_array().unwrap() {
            let v = &op["value"];
            match op["path"].as_str().unwrap() {
                "/data/config.yaml" => policy_text = v.as_str().map(str::to_string),
                "/spec/template/spec/initContainers" => init = Some(v.clone()),
                "/spec/template/spec/containers/0/env/-" => {
                    env.insert(
                        v["name"].as_str().unwrap().to_string(),
                        v["value"].as_str().unwrap().to_string(),
                    );
                }
                "/spec/template/spec/containers/0/volumeMounts/-" => mounts.push(v.clone()),
                "/spec/template/spec/volumes/-" => {
                    volumes.insert(
                        v["name"].as_str().unwrap().to_string(),
                        v["hostPath"]["path"].as_str().unwrap().to_string(),
                    );
                }
                other => panic!("an op the test does not know: {other}"),
            }
        }
    }

    let example = read(&repo().join("config/policy-memory.yaml"));
    assert_eq!(policy_text.as_deref(), Some(example.as_str()));
    let p = policy::parse(&example).unwrap();
    assert!(uses_memory(&p));
    let built = plan::build(&p, &h100_r615()).unwrap();
    let sized = &built.plan.resources["nvidia.com/gpu-20gb"];
    assert_eq!(sized.devices.len(), 2);
    let m = sized.memory.as_ref().expect("memory limits in the plan");
    assert!(
        sized.devices.iter().all(|d| m.enforced(d)),
        "enforced on R615"
    );

    // The hook the spec names is the file the init container writes, on the host.
    let hook = env["SLICELET_HOOK_BINARY"].clone();
    let init = init.expect("an init container");
    let init = init.as_array().unwrap();
    assert_eq!(init.len(), 1);
    let i = &init[0];
    let base = yaml(&repo().join("manifests/base/daemonset.yaml"));
    let plugin = &base["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(i["image"], plugin["image"], "the plugin's image");
    assert_eq!(i["args"], serde_json::json!(["install-hook"]));
    assert_eq!(i["env"][0]["name"], "SLICELET_INSTALL_HOOK_TO");
    assert_eq!(i["env"][0]["value"], hook.as_str());
    let init_mounts = i["volumeMounts"].as_array().unwrap();
    assert_eq!(init_mounts.len(), 1);
    let dir = init_mounts[0]["mountPath"].as_str().unwrap();
    assert_eq!(Path::new(&hook).parent().unwrap(), Path::new(dir));
    assert_eq!(
        volumes[init_mounts[0]["name"].as_str().unwrap()],
        dir,
        "the host directory at the same path"
    );
    assert_eq!(
        i["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_eq!(i["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(hook, slicelet::cdi::memory::DEFAULT_HOOK_BINARY);

    // slicelet writes its spec to the host's spec directory (read-write) and checks the CDI
    // names it hands out (cdi-cri) against the specs there.
    let spec_dir = env["SLICELET_MEMORY_SPEC_DIR"].as_str();
    let spec_mount = mounts
        .iter()
        .find(|m| m["mountPath"] == spec_dir)
        .expect("the spec directory mounted");
    assert_ne!(spec_mount["readOnly"], true, "{spec_dir} read-write");
    assert_eq!(volumes[spec_mount["name"].as_str().unwrap()], spec_dir);
    let cdi_dirs: Vec<&str> = env["SLICELET_CDI_SPEC_DIRS"].split(',').collect();
    assert!(cdi_dirs.contains(&spec_dir));
    for d in cdi_dirs {
        let m = mounts.iter().find(|m| m["mountPath"] == d).expect(d);
        assert_eq!(volumes[m["name"].as_str().unwrap()], d);
    }
    // The plugin itself does not mount the hook directory.
    assert!(mounts.iter().all(|m| m["mountPath"] != dir));
}

/// The migration bridge's DeviceClass name of an extended resource name:
/// `<name with "/" and "." as "-">.bridge.gpu.slicelet.io`.
fn bridge_class(name: &str) -> String {
    format!("{}.bridge.gpu.slicelet.io", name.replace(['/', '.'], "-"))
}

/// The devices the slices of `config` on `node` publish with the attribute `resource` ==
/// `name`, and the devices of resource `name` in its plan, both as published device names.
fn bridged_devices(
    config: &policy::Policy,
    node: &slicelet::inventory::Inventory,
    name: &str,
) -> (Vec<String>, Vec<String>) {
    use slicelet::dra::slices;
    let plan = plan::build(config, node).unwrap().plan;
    let params = slices::SliceParams {
        node: "node-1".to_string(),
        driver: "gpu.slicelet.io".to_string(),
        generation: 1,
        driver_version: None,
        unhealthy: slices::Unhealthy::default(),
    };
    let built = slices::build(
        slices::dra_resources(&plan),
        node,
        &params,
        &slicelet::dra::health_map::HealthMap::new(),
    );
    let mut selected: Vec<String> = built
        .slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| {
            d.attributes
                .as_ref()
                .and_then(|a| a.get("resource"))
                .and_then(|a| a.string.as_deref())
                == Some(name)
        })
        .map(|d| d.name.clone())
        .collect();
    let mut of_resource: Vec<String> = plan
        .resources
        .get(name)
        .filter(|r| r.dra)
        .map(|r| {
            r.devices
                .iter()
                .map(|d| slicelet::plan::dra_names::device_name(&d.id))
                .collect()
        })
        .unwrap_or_default();
    selected.sort();
    of_resource.sort();
    (selected, of_resource)
}

/// The migration bridge (overlays/dra-bridge and the chart's dra.extendedResources): every
/// bridged name is a DRA resource of a config (read by slicelet's own parser, not the chart's
/// reading of it), its class is named and selects as documented, and on a node that config
/// publishes exactly the devices of that resource with the attribute the class selects on
/// (so a pod asking the name gets a device of that resource and no other). In the overlay the
/// default config serves the same name through the device plugin: the same pods fit both kinds
/// of node.
#[test]
fn bridge_classes_name_dra_resources_and_select_exactly_their_devices() {
    let mig = {
        let f = node_file("h100-80gb-x8-mig-mixed.yaml");
        simulated::parse(&f, &read(&f)).unwrap()
    };
    let nodes = [h100(), mig];
    let check = |at: &str, name: &str, configs: &[(String, policy::Policy)]| {
        let serving: Vec<&policy::Policy> = configs
            .iter()
            .filter(|(_, p)| p.dra.iter().any(|n| n.as_str() == name))
            .map(|(_, p)| p)
            .collect();
        assert!(
            !serving.is_empty(),
            "{at}: no config serves {name} through DRA"
        );
        for p in serving {
            let mut published = 0;
            for node in &nodes {
                let (selected, of_resource) = bridged_devices(p, node, name);
                assert_eq!(selected, of_resource, "{at}: {name}");
                published += selected.len();
            }
            assert!(published > 0, "{at}: {name} publishes no device");
        }
    };

    // The overlay: one class, both configs advertise its name, one of them through DRA.
    let dir = repo().join("manifests/overlays/dra-bridge");
    let class = yaml(&dir.join("bridge-deviceclass.yaml"));
    let name = class["spec"]["extendedResourceName"].as_str().unwrap();
    assert_eq!(class["kind"], "DeviceClass");
    assert_eq!(class["metadata"]["name"], bridge_class(name).as_str());
    assert_eq!(
        class["spec"]["selectors"],
        serde_json::json!([{"cel": {"expression": format!("device.driver == \"gpu.slicelet.io\" && has(device.attributes[\"gpu.slicelet.io\"].resource) && device.attributes[\"gpu.slicelet.io\"].resource == \"{name}\"")}}])
    );
    let k = yaml(&dir.join("kustomization.yaml"));
    let mut configs = Vec::new();
    for patch in k["patches"].as_array().unwrap() {
        if patch["target"]["kind"] != "ConfigMap" {
            continue;
        }
        let ops: serde_json::Value =
            yaml_serde::from_str(patch["patch"].as_str().unwrap()).unwrap();
        for op in ops.as_array().unwrap() {
            if let (Some(key), Some(text)) = (
                op["path"].as_str().and_then(|p| p.strip_prefix("/data/")),
                op["value"].as_str(),
            ) {
                configs.push((key.to_string(), policy::parse(text).unwrap()));
            }
        }
    }
    let keys: Vec<&str> = configs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["device-plugin", "dra"]);
    check("overlays/dra-bridge", name, &configs);
    let plugin = plan::build(&configs[0].1, &h100()).unwrap().plan;
    assert!(
        plugin.resources.get(name).is_some_and(|r| !r.dra),
        "the default config serves {name} through the device plugin"
    );

    // The chart's examples: every dra.extendedResources name.
    let mut bridged = 0;
    for e in std::fs::read_dir(repo().join(CHART).join("ci")).unwrap() {
        let example = e.unwrap().path();
        let v = chart_values(Some(&example));
        let names = v["dra"]["extendedResources"].as_array().unwrap();
        if names.is_empty() {
            continue;
        }
        let configs: Vec<(String, policy::Policy)> = v["config"]["map"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, t)| (k.clone(), policy::parse(t.as_str().unwrap()).unwrap()))
            .collect();
        for n in names {
            check(
                &example.display().to_string(),
                n.as_str().unwrap(),
                &configs,
            );
            bridged += 1;
        }
    }
    assert!(
        bridged >= 2,
        "{bridged} bridged names in the chart's examples"
    );
}
