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
                    plan::build(&p, &h100()).unwrap_or_else(|e| panic!("{}: {e}", k.display()));
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
    // The base DaemonSet mounts the same MPS root (the pipe directories Allocate mounts).
    let base = yaml(&repo().join("manifests/base/daemonset.yaml"));
    assert!(
        base["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == p.mps_root.to_str().unwrap())
    );
}
