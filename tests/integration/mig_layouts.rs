//! MIG layouts (mig-parted files, docs/mig.md): the real daemon on a simulated H100 node reads
//! config/mig-parted.yaml (`--mig-config-file`), applies the layout the node label
//! `nvidia.com/mig.config` (through the Kubernetes API emulator) or `--mig-config` names, and
//! says how it went in the NFD feature file (`nvidia.com/mig.config.state`), `/readyz` and
//! the kubelet emulator's ListAndWatch lists. No sleeps: every wait is on the daemon's status,
//! the emulators' state or their counters, under a timeout.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kubelet_emulator::kube_api::KubeApi;
use kubelet_emulator::pod_resources::PodResources;
use slicelet::k8s::{LabelWatch, MIG_CONFIG_LABEL};
use slicelet::settings::Settings;

use crate::common::*;

const NODE: &str = "gpu-node-mig";
const MIXED: &str = "version: v1\nflags:\n  migStrategy: mixed\n";

/// `n` H100 80GB (PCI device ID 0x233010DE) in MIG mode with no instances.
fn h100s(n: usize) -> String {
    let gpu = "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    pciDeviceId: \"0x233010DE\"\n    mig: {}\n";
    format!("gpus:\n{}", gpu.repeat(n))
}

/// A node with `gpus` simulated H100s (the file in the temporary directory: the instances
/// created are kept beside it), the layouts file as a ConfigMap key, and a features file.
struct Setup {
    node: Node,
    sim: PathBuf,
    features: PathBuf,
}

fn setup(gpus: usize) -> Setup {
    let node = Node::new(MIXED);
    let sim = node.tmp.path().join("node.yaml");
    std::fs::write(&sim, h100s(gpus)).unwrap();
    let layouts = node.tmp.path().join("mig");
    write_configmap(
        &layouts,
        &[("config.yaml", &read(&repo().join("config/mig-parted.yaml")))],
    );
    let features = node.tmp.path().join("features.d");
    std::fs::create_dir(&features).unwrap();
    Setup {
        features: features.join("slicelet"),
        sim,
        node,
    }
}

impl Setup {
    fn settings(&self, layout: Option<&str>, api: Option<&KubeApi>) -> Settings {
        let mut s = self.node.settings(&self.sim);
        s.mig_config_file = Some(self.node.tmp.path().join("mig/config.yaml"));
        s.mig_config = layout.map(str::to_string);
        s.nfd_features_file = Some(self.features.clone());
        s.label_watch = api.map(|a| LabelWatch {
            node: NODE.to_string(),
            kubeconfig: Some(a.kubeconfig(self.node.tmp.path())),
        });
        s.pod_resources_interval = std::time::Duration::from_secs(1);
        s
    }
}

/// Whether the features file at `path` has `line`.
fn has_line(path: &Path, line: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.lines().any(|l| l == line))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_labelled_layout_is_applied_and_advertised_and_a_new_label_applies_another() {
    let s = setup(2);
    let api = KubeApi::start(NODE, &[(MIG_CONFIG_LABEL, "all-1g.10gb")]).await;
    let emu = emulator(&s.node).await;
    let started = Instant::now();
    // The flag names another layout: the label wins.
    let mut d = Daemon::start(s.settings(Some("all-3g.40gb"), Some(&api)));
    wait_lists(&emu, &[("nvidia.com/mig-1g.10gb", 14)]).await;
    let file = s.features.clone();
    let st = d
        .wait_status(|st| {
            st.mig_config_state == Some("success")
                && has_line(&file, "nvidia.com/mig.config.state=success")
        })
        .await;
    eprintln!(
        "start to success (2 GPUs x 7 instances): {:?}",
        started.elapsed()
    );
    assert_eq!(st.mig_config_error, None);

    let asked = Instant::now();
    api.set_label(MIG_CONFIG_LABEL, "all-balanced");
    let state = wait_lists(
        &emu,
        &[
            ("nvidia.com/mig-1g.10gb", 4),
            ("nvidia.com/mig-2g.20gb", 2),
            ("nvidia.com/mig-3g.40gb", 2),
        ],
    )
    .await;
    d.wait_status(|st| {
        st.mig_config_state == Some("success")
            && has_line(&file, "nvidia.com/mig.config.state=success")
    })
    .await;
    eprintln!(
        "label to success (all-balanced on 2 GPUs): {:?}",
        asked.elapsed()
    );
    assert_eq!(state.healthy_count("nvidia.com/mig-3g.40gb"), Some(2));
    assert!(
        has_line(&file, "nvidia.com/mig-3g.40gb.count=2"),
        "{}",
        read(&file)
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_that_needs_mig_mode_toggled_fails_with_the_nvidia_smi_step() {
    let s = setup(1);
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some("all-disabled"), None));
    let file = s.features.clone();
    let st = d
        .wait_status(|st| {
            st.mig_config_state == Some("failed")
                && has_line(&file, "nvidia.com/mig.config.state=failed")
        })
        .await;
    let why = st.mig_config_error.clone().unwrap();
    assert!(
        why.contains("nvidia-smi -i 0 -mig 0") && why.contains("never toggles MIG mode"),
        "{why}"
    );
    assert!(st.unhealthy_lines().contains(&format!("MIG layout: {why}")));
    // Nothing was touched: MIG mode on, no instances, so nothing is advertised.
    assert!(
        emu.state().resources.is_empty(),
        "{:?}",
        emu.state().resources.keys()
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_gpu_stays_pending_and_withdrawn_until_its_holder_goes() {
    let s = setup(1);
    let pr = PodResources::start(&s.node.pod_resources()).await.unwrap();
    let api = KubeApi::start(NODE, &[(MIG_CONFIG_LABEL, "all-3g.40gb")]).await;
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(None, Some(&api)));
    const BIG: &str = "nvidia.com/mig-3g.40gb";
    let state = wait_lists(&emu, &[(BIG, 2)]).await;
    d.wait_status(|st| st.mig_config_state == Some("success"))
        .await;
    let held = ids_of(&state, BIG)[0].clone();
    allocate(&emu, BIG, std::slice::from_ref(&held))
        .await
        .unwrap();
    pr.hold("ml", "train-0", "main", BIG, &[&held]);
    d.wait_status(|st| st.in_use == 1).await;

    api.set_label(MIG_CONFIG_LABEL, "all-1g.10gb");
    let h = held.clone();
    emu.wait_for(WAIT, |st| {
        st.resources[BIG]
            .devices
            .as_ref()
            .is_some_and(|l| l.len() == 1 && l[0].id == h)
    })
    .await
    .expect("the free instance is withdrawn, the held one kept");
    let file = s.features.clone();
    let st = d
        .wait_status(|st| {
            st.mig_config_state == Some("pending")
                && st.retained.len() == 1
                && has_line(&file, "nvidia.com/mig.config.state=pending")
        })
        .await;
    assert!(st.retained.contains_key(&format!("{BIG} {held}")));
    // Two more reads of what is in use: still held, still pending, nothing created.
    let reads = pr.lists();
    tokio::time::timeout(WAIT, async {
        while pr.lists() < reads + 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(d.status.borrow().mig_config_state, Some("pending"));
    assert_eq!(emu.state().device_count("nvidia.com/mig-1g.10gb"), None);

    let released = Instant::now();
    pr.release("ml", "train-0");
    wait_lists(&emu, &[("nvidia.com/mig-1g.10gb", 7)]).await;
    d.wait_status(|st| st.mig_config_state == Some("success"))
        .await;
    eprintln!(
        "release to success (all-1g.10gb on 1 GPU): {:?}",
        released.elapsed()
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_watched_and_a_refused_one_keeps_the_last_good_one() {
    let s = setup(1);
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some("custom"), None));
    let st = d
        .wait_status(|st| st.mig_config_state == Some("failed"))
        .await;
    let why = st.mig_config_error.unwrap();
    assert!(why.contains("no layout `custom`"), "{why}");

    let dir = s.node.tmp.path().join("mig");
    write_configmap(
        &dir,
        &[(
            "config.yaml",
            "version: v1\nmig-configs:\n  custom:\n    - devices: all\n      mig-enabled: true\n      mig-device: {}\n",
        )],
    );
    let st = d
        .wait_status(|st| {
            st.mig_config_error
                .as_deref()
                .is_some_and(|e| e.contains("refused (the last good one is kept)"))
        })
        .await;
    let why = st.mig_config_error.unwrap();
    assert!(
        why.contains("mig-configs.custom[0]") && why.contains("config.yaml"),
        "{why}"
    );
    assert_eq!(st.mig_config_state, Some("failed"));

    write_configmap(
        &dir,
        &[(
            "config.yaml",
            "version: v1\nmig-configs:\n  custom:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n",
        )],
    );
    wait_lists(&emu, &[("nvidia.com/mig-3g.40gb", 2)]).await;
    let st = d
        .wait_status(|st| st.mig_config_state == Some("success"))
        .await;
    assert_eq!(st.mig_config_error, None);
    d.stop().await;
}
