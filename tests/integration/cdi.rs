//! Container runtime setups (issue 12) on the simulated 8× A100 node with time-slicing ×4,
//! through the kubelet emulator: what Allocate returns per `deviceListStrategy` and
//! `deviceIDStrategy` reaches the kubelet side (`cdi_devices`, annotations, mounts, envs); a
//! CDI spec directory that lacks a GPU makes its replicas Unhealthy with the reason (log and
//! `/readyz`); NVIDIA's `devices`-without-`rename` file serves as NVIDIA's plugin serves it.

use std::path::PathBuf;

use kubelet_emulator::healthy;
use slicelet::api::{self, Device};
use slicelet::commands;

use crate::binary::{output, sigterm_and_wait, spawn_run, text, wait_for_log};
use crate::common::*;
use crate::live::get;

const SHARED: &str = "nvidia.com/gpu-shared";

/// Every GPU time-sliced 4 ways as `nvidia.com/gpu-shared`, with `plugin` lines under
/// `flags.plugin`.
fn policy(plugin: &str) -> String {
    format!(
        "version: v1\nflags:\n  plugin:\n{plugin}sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 4\n"
    )
}

fn spec_dir(name: &str) -> PathBuf {
    fixture(&format!("cdi/{name}"))
}

fn a100() -> PathBuf {
    node_file("a100-40gb-x8.yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_strategy_reaches_the_kubelet_for_two_replicas_of_gpu_3() {
    let node = Node::new(&policy("    deviceListStrategy: [cdi-cri]\n"));
    let emu = emulator(&node).await;
    let mut settings = node.settings(&a100());
    settings.cdi_spec_dirs = vec![spec_dir("a100-40gb-x8")];
    let mut d = Daemon::start(settings);
    wait_lists(&emu, &[(SHARED, 32)]).await;
    let gpus = uuids(&a100());
    let two_of_gpu3 = vec![format!("{}::1", gpus[3]), format!("{}::0", gpus[3])];
    let uuid3 = &gpus[3];

    // [cdi-cri]: the GPU once in cdi_devices, no NVIDIA_VISIBLE_DEVICES.
    let r = allocate(&emu, SHARED, &two_of_gpu3).await.unwrap();
    assert_eq!(
        r.cdi_devices,
        vec![api::CdiDevice {
            name: format!("nvidia.com/gpu={uuid3}")
        }]
    );
    assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"), "{r:?}");
    assert!(r.annotations.is_empty() && r.mounts.is_empty() && r.devices.is_empty());
    assert_eq!(r.envs["CUDA_VISIBLE_DEVICES"], *uuid3);

    // [envvar, cdi-annotations]: both.
    node.write_policy(&policy(
        "    deviceListStrategy: [envvar, cdi-annotations]\n",
    ));
    d.wait_status(|s| s.generation >= 2).await;
    let r = allocate(&emu, SHARED, &two_of_gpu3).await.unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], *uuid3);
    assert_eq!(r.annotations.len(), 1, "{r:?}");
    let (key, value) = r.annotations.iter().next().unwrap();
    assert!(key.starts_with("cdi.k8s.io/slicelet_"), "{key}");
    assert!(key.len() - "cdi.k8s.io/".len() <= 63, "{key}");
    assert_eq!(*value, format!("nvidia.com/gpu={uuid3}"));
    assert!(r.cdi_devices.is_empty());

    // volume-mounts: the /dev/null mount.
    node.write_policy(&policy("    deviceListStrategy: volume-mounts\n"));
    d.wait_status(|s| s.generation >= 3).await;
    let r = allocate(&emu, SHARED, &two_of_gpu3).await.unwrap();
    assert_eq!(
        r.envs["NVIDIA_VISIBLE_DEVICES"],
        "/var/run/nvidia-container-devices"
    );
    assert_eq!(
        r.mounts,
        vec![api::Mount {
            container_path: format!("/var/run/nvidia-container-devices/{uuid3}"),
            host_path: "/dev/null".into(),
            read_only: true,
        }]
    );

    // index: nvidia.com/gpu=3.
    node.write_policy(&policy(
        "    deviceListStrategy: cdi-cri\n    deviceIDStrategy: index\n",
    ));
    d.wait_status(|s| s.generation >= 4).await;
    let r = allocate(&emu, SHARED, &two_of_gpu3).await.unwrap();
    assert_eq!(
        r.cdi_devices,
        vec![api::CdiDevice {
            name: "nvidia.com/gpu=3".into()
        }]
    );
    assert!(!r.envs.contains_key("NVIDIA_VISIBLE_DEVICES"));

    // The spec names every GPU by UUID and index: nothing was ever held Unhealthy.
    assert_eq!(emu.state().healthy_count(SHARED), Some(32));
    assert!(d.status.borrow().unhealthy.is_empty());
    d.stop().await;
}

fn gpu3_down(gpus: &[String]) -> impl Fn(&[Device]) -> bool + Sync + '_ {
    move |list: &[Device]| {
        list.len() == 32
            && healthy(list) == 28
            && list
                .iter()
                .filter(|d| d.health == api::UNHEALTHY)
                .all(|d| d.id.starts_with(&gpus[3]))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_dir_without_gpu_3_makes_its_replicas_unhealthy_with_the_reason() {
    let node = Node::new(&policy("    deviceListStrategy: [cdi-cri]\n"));
    let emu = emulator(&node).await;
    let dir = spec_dir("a100-40gb-x8-without-gpu3");
    let mut settings = node.settings(&a100());
    settings.cdi_spec_dirs = vec![dir.clone()];
    settings.status_address = Some("127.0.0.1:0".parse().unwrap());
    let mut d = Daemon::start(settings);
    let gpus = uuids(&a100());
    let down = gpu3_down(&gpus);
    emu.wait_for_sequence(SHARED, &[&down], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = d
        // Ready is waited for too: the first list can already be "down" and reach the emulator
        // before the daemon has folded the `Register` reply (the kubelet opens ListAndWatch
        // while it answers `Register`).
        .wait_status(|s| {
            s.address.is_some() && s.unhealthy.contains_key(&gpus[3]) && s.ready().is_ok()
        })
        .await;
    let reason = format!(
        "CDI device nvidia.com/gpu={} is not defined by any spec in {}",
        gpus[3],
        dir.display()
    );
    assert_eq!(status.unhealthy.len(), 1, "{:?}", status.unhealthy);
    assert!(
        status.unhealthy[&gpus[3]].starts_with(&reason),
        "{status:?}"
    );
    // /readyz: still ready (28 devices serve), and it names the device and the reason.
    let (code, body) = get(status.address.unwrap(), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.starts_with("ready\n") && body.contains(&format!("Unhealthy {}: {reason}", gpus[3])),
        "{body}"
    );
    // Allocate still answers for it (the kubelet decides), naming the GPU.
    let r = allocate(&emu, SHARED, &[format!("{}::0", gpus[3])])
        .await
        .unwrap();
    assert_eq!(r.cdi_devices.len(), 1);

    // Without a cdi-* strategy the names are not checked: every replica is Healthy again.
    let seen = emu.lists(SHARED).len();
    node.write_policy(&policy("    deviceListStrategy: envvar\n"));
    emu.wait_for_sequence_after(SHARED, seen, &[&|l: &[Device]| healthy(l) == 32], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_the_reason_and_validate_reports_it() {
    let node = Node::new(&policy("    deviceListStrategy: cdi-cri\n"));
    let emu = emulator(&node).await;
    let dir = spec_dir("a100-40gb-x8-without-gpu3");
    let gpus = uuids(&a100());
    let mut child = spawn_run(
        &node,
        &["--simulate", a100().to_str().unwrap()],
        &[("SLICELET_CDI_SPEC_DIRS", dir.as_path())],
    );
    let log = wait_for_log(&mut child, "is not defined by any spec").await;
    let line = log
        .lines()
        .find(|l| l.contains("is not defined by any spec"))
        .unwrap();
    assert!(
        line.contains("device health changed")
            && line.contains(&gpus[3])
            && line.contains(&format!("nvidia.com/gpu={}", gpus[3])),
        "{line}"
    );
    let down = gpu3_down(&gpus);
    emu.wait_for_sequence(SHARED, &[&down], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (code, _) = sigterm_and_wait(child).await;
    assert_eq!(code, Some(0));

    // validate --simulate NODE --cdi-spec-dirs DIR says the same, and exits 0.
    let args = |dir: &PathBuf| {
        vec![
            "validate".to_string(),
            "--config".into(),
            node.policy().display().to_string(),
            "--simulate".into(),
            a100().display().to_string(),
            "--cdi-spec-dirs".into(),
            dir.display().to_string(),
        ]
    };
    let a = args(&dir);
    let out = output(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "warning: GPU 3 ({}): CDI device nvidia.com/gpu={} is not defined",
            gpus[3], gpus[3]
        )) && stdout
            .contains("the daemon advertises its 4 devices of nvidia.com/gpu-shared Unhealthy"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("is not defined").count(), 1, "{stdout}");
    // Directories without any spec (a laptop): one line for all of the node's names.
    let empty = tempfile::tempdir().unwrap();
    let a = args(&empty.path().to_path_buf());
    let out = output(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let cdi: Vec<&str> = stdout.lines().filter(|l| l.contains("CDI")).collect();
    assert_eq!(cdi.len(), 1, "{stdout}");
    assert!(
        cdi[0].starts_with(&format!(
            "warning: no CDI spec in {}: none of the CDI names of 8 GPUs",
            empty.path().display()
        )) && cdi[0].contains("advertises their 32 devices Unhealthy"),
        "{stdout}"
    );
    let full = spec_dir("a100-40gb-x8");
    let a = args(&full);
    let out = output(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("CDI"), "{}", text(&out.stdout));
    // A kind that breaks the CDI naming rules is refused on the command line.
    let mut a = args(&full);
    a.extend(["--cdi-kind".to_string(), "nvidia.com".to_string()]);
    let out = output(&a.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("vendor/class"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn validate_refuses_unknown_strategies_naming_the_field_and_the_values() {
    let node = Node::new(&policy("    deviceListStrategy: nonsense\n"));
    for (plugin, path) in [
        (
            "    deviceListStrategy: nonsense\n",
            "flags.plugin.deviceListStrategy",
        ),
        (
            "    deviceListStrategy: [envvar, cdi]\n",
            "flags.plugin.deviceListStrategy[1]",
        ),
        (
            "    deviceIDStrategy: serial\n",
            "flags.plugin.deviceIDStrategy",
        ),
    ] {
        node.write_policy(&policy(plugin));
        let out = output(&["validate", "--config", node.policy().to_str().unwrap()]).await;
        assert_eq!(out.status.code(), Some(1), "{plugin}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("{path}: ")), "{plugin}: {err}");
        let allowed: &[&str] = if plugin.contains("deviceID") {
            &["uuid", "index"]
        } else {
            &["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"]
        };
        for a in allowed {
            assert!(err.contains(a), "{plugin}: {err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidias_devices_file_validates_with_a_warning_and_serves_16_replicas() {
    let text_in = read_fixture("nvidia/ts-devices-without-rename.yaml");
    let node = Node::new(&text_in);
    let sim = a100();
    let report = commands::validate(&node.settings(&sim)).unwrap();
    assert!(
        report.starts_with(&format!(
            "valid: {} (1 time-slicing entry, migStrategy none); on simulated node {} (8 GPUs): nvidia.com/gpu ×16",
            node.policy().display(),
            sim.display()
        )),
        "{report}"
    );
    assert!(
        report.contains("warning: sharing.timeSlicing.resources[0].devices: ")
            && report.contains("add rename: nvidia.com/gpu-shared to share only these GPUs"),
        "{report}"
    );
    // --strict turns the fallback into an error.
    let e = commands::validate_with(&node.settings(&sim), true).unwrap_err();
    assert!(
        matches!(e, commands::CommandError::Strict { .. })
            && e.to_string().contains("under --strict")
            && e.to_string().contains("add rename: nvidia.com/gpu-shared"),
        "{e}"
    );
    let out = output(&[
        "validate",
        "--strict",
        "--config",
        node.policy().to_str().unwrap(),
        "--simulate",
        sim.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("under --strict"),
        "{}",
        text(&out.stderr)
    );

    // The daemon serves it: every GPU shared 2 ways under nvidia.com/gpu.
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&sim));
    let state = wait_lists(&emu, &[("nvidia.com/gpu", 16)]).await;
    assert_eq!(state.resources.len(), 1, "{state:#?}");
    assert_eq!(state.healthy_count("nvidia.com/gpu"), Some(16));
    let gpus = uuids(&sim);
    let ids = ids_of(&state, "nvidia.com/gpu");
    let want: Vec<String> = gpus
        .iter()
        .flat_map(|u| (0..2).map(move |n| format!("{u}::{n}")))
        .collect();
    assert_eq!(ids, want);
    d.stop().await;
}

/// The JSON-patch operations of an overlay's patches for `kind`.
fn overlay_ops(overlay: &str, kind: &str) -> Vec<serde_json::Value> {
    let path = repo().join(format!("manifests/overlays/{overlay}/kustomization.yaml"));
    let doc: serde_json::Value = yaml_serde::from_str(&read(&path)).unwrap();
    doc["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["target"]["kind"] == kind)
        .flat_map(|p| {
            let ops: serde_json::Value =
                yaml_serde::from_str(p["patch"].as_str().unwrap()).unwrap();
            ops.as_array().unwrap().clone()
        })
        .collect()
}

fn overlay_policy(overlay: &str) -> slicelet::policy::Policy {
    let ops = overlay_ops(overlay, "ConfigMap");
    let text = ops
        .iter()
        .find(|op| op["path"] == "/data/config.yaml")
        .and_then(|op| op["value"].as_str())
        .unwrap();
    slicelet::policy::parse(text).unwrap()
}

#[test]
fn cdi_overlay_mounts_the_spec_dirs_read_only_where_slicelet_reads_them() {
    let p = overlay_policy("cdi");
    assert_eq!(p.delivery.strategies.names(), vec!["cdi-cri"]);
    let ops = overlay_ops("cdi", "DaemonSet");
    let values: Vec<&serde_json::Value> = ops.iter().map(|op| &op["value"]).collect();
    let env = values
        .iter()
        .find(|v| v["name"] == "SLICELET_CDI_SPEC_DIRS")
        .unwrap();
    let dirs: Vec<&str> = env["value"].as_str().unwrap().split(',').collect();
    assert_eq!(dirs, slicelet::cdi::DEFAULT_SPEC_DIRS);
    for dir in dirs {
        let mount = values
            .iter()
            .find(|v| v["mountPath"] == dir)
            .unwrap_or_else(|| panic!("{dir} not mounted"));
        assert_eq!(mount["readOnly"], true, "{dir}");
        let volume = values
            .iter()
            .find(|v| v["name"] == mount["name"] && v.get("hostPath").is_some())
            .unwrap();
        assert_eq!(volume["hostPath"]["path"], dir);
    }
}

#[test]
fn volume_mounts_overlay_asks_for_nvml_by_mount_too() {
    let p = overlay_policy("volume-mounts");
    assert_eq!(p.delivery.strategies.names(), vec!["volume-mounts"]);
    let ops = overlay_ops("volume-mounts", "DaemonSet");
    let set = ops
        .iter()
        .find(|op| op["path"] == "/spec/template/spec/containers/0/env/0/value")
        .unwrap();
    assert_eq!(set["value"], slicelet::allocate::VOLUME_MOUNTS_ROOT);
    let mount = ops
        .iter()
        .map(|op| &op["value"])
        .find(|v| v["mountPath"] == format!("{}/all", slicelet::allocate::VOLUME_MOUNTS_ROOT))
        .unwrap();
    assert_eq!(mount["readOnly"], true);
}

/// GPU 0 of the A100 node on an R615 driver shared by size (2 × 16 GiB as gpu-16gb, 1 × 8 GiB
/// as gpu-8gb): the daemon writes its memory-limit CDI spec before serving, and Allocate
/// names the toolkit's GPU and slicelet's device for the replicas asked, whose hook carries
/// their limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limited_replicas_get_the_hook_device_from_slicelets_own_spec() {
    let node = Node::new(
        "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-16gb\n        devices: [0]\n        replicas: 2\n        memory: {hard: 16Gi}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-8gb\n        devices: [0]\n        replicas: 1\n        memory: {hard: 8Gi, soft: 4Gi}\n",
    );
    let sim = node.tmp.path().join("a100-r615.yaml");
    let text = std::fs::read_to_string(a100()).unwrap();
    std::fs::write(&sim, format!("{text}driverVersion: \"615.20\"\n")).unwrap();
    let emu = emulator(&node).await;
    let spec_out = node.tmp.path().join("cdi-out");
    std::fs::create_dir_all(&spec_out).unwrap();
    let mut settings = node.settings(&sim);
    settings.cdi_spec_dirs = vec![spec_dir("a100-40gb-x8")];
    settings.memory_spec_dir = Some(spec_out.clone());
    let d = Daemon::start(settings);
    wait_lists(
        &emu,
        &[("nvidia.com/gpu-16gb", 2), ("nvidia.com/gpu-8gb", 1)],
    )
    .await;
    let gpu0 = &uuids(&sim)[0];
    let spec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(spec_out.join(slicelet::cdi::memory::SPEC_FILE)).unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            format!("{gpu0}-16384mib-x1"),
            format!("{gpu0}-16384mib-x2"),
            format!("{gpu0}-8192mib-x1"),
        ]
    );
    let r = allocate(
        &emu,
        "nvidia.com/gpu-16gb",
        &[format!("{gpu0}::1"), format!("{gpu0}::0")],
    )
    .await
    .unwrap();
    let got: Vec<&str> = r.cdi_devices.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        got,
        [
            format!("nvidia.com/gpu={gpu0}"),
            format!("gpu.slicelet.io/memory={gpu0}-16384mib-x2")
        ]
    );
    let r = allocate(&emu, "nvidia.com/gpu-8gb", &[format!("{gpu0}::2")])
        .await
        .unwrap();
    assert_eq!(
        r.cdi_devices[1].name,
        format!("gpu.slicelet.io/memory={gpu0}-8192mib-x1")
    );
    let hook = &spec["devices"][2]["containerEdits"]["hooks"][0]["args"];
    assert_eq!(hook[6], "8192", "{hook}");
    assert_eq!(hook[8], "4096", "{hook}");
    d.stop().await;
}
