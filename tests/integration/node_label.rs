//! Per-node config selection: a ConfigMap directory of named configs, one chosen by this
//! node's `nvidia.com/device-plugin.config` label, read through the real `kube` client from
//! the Kubernetes API emulator (`kube_api.rs`).

use std::path::PathBuf;

use slicelet::k8s::LabelWatch;
use slicelet::policy::select::{Fallback, DEFAULT_LABEL};

use crate::common::{emulator, node_file, wait_lists, write_configmap, Daemon, Node};
use kubelet_emulator::kube_api::{kubeconfig_for, KubeApi};

const NODE: &str = "gpu-node-7";

fn ts(replicas: u32) -> String {
    format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n")
}

/// `nvidia.com/gpu` whole on GPUs 1–7, and GPU 0 shared `replicas` ways as
/// `nvidia.com/gpu-shared`.
fn gpu0_shared(replicas: u32) -> String {
    format!("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: {replicas}\n")
}

struct Setup {
    node: Node,
    configs: PathBuf,
}

fn setup(keys: &[(&str, &str)]) -> Setup {
    let node = Node::new("version: v1\n");
    let configs = node.tmp.path().join("configs");
    write_configmap(&configs, keys);
    Setup { node, configs }
}

impl Setup {
    fn settings(
        &self,
        kubeconfig: Option<PathBuf>,
        default: Option<&str>,
    ) -> slicelet::settings::Settings {
        let mut s = self.node.settings(&node_file("a100-40gb-x8.yaml"));
        s.config = self.configs.clone();
        s.selection.default = default.map(str::to_string);
        s.label_watch = kubeconfig.map(|k| LabelWatch {
            node: NODE.to_string(),
            kubeconfig: Some(k),
        });
        s
    }
}

#[tokio::test]
async fn the_node_label_chooses_the_config_live_and_removing_it_goes_back_to_the_default() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    let api = KubeApi::start(NODE, &[("kubernetes.io/hostname", NODE)]).await;
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), Some("any")));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    d.wait_status(|st| st.generation >= 1 && st.node_label.is_none())
        .await;
    // The Node's LIST is served from the API server's watch cache (resourceVersion 0), as the
    // kubelet's is, not a quorum read of every Node from etcd.
    assert_eq!(api.node_list_versions(), [Some("0".to_string())]);

    api.set_label(DEFAULT_LABEL, "a100-ts4");
    let state = wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    assert_eq!(state.healthy_count("nvidia.com/gpu"), Some(32));
    d.wait_status(|st| st.node_label.as_deref() == Some("a100-ts4") && st.ready().is_ok())
        .await;

    api.remove_label(DEFAULT_LABEL);
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    d.wait_status(|st| st.node_label.is_none()).await;
    // Metadata only, and only this node was ever asked for.
    assert_eq!(
        api.counters().full_objects,
        0,
        "full Node objects were requested"
    );
    let selectors = api.selectors();
    assert!(!selectors.is_empty());
    assert!(
        selectors
            .iter()
            .all(|f| f == &format!("metadata.name={NODE}")),
        "{selectors:?}"
    );
    d.stop().await;
}

#[tokio::test]
async fn a_label_naming_a_missing_key_keeps_the_last_good_config_and_readyz_names_the_keys() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    let api = KubeApi::start(NODE, &[(DEFAULT_LABEL, "a100-ts4")]).await;
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), Some("any")));
    // The label is known before the first config is chosen: no moment of the default.
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    assert!(
        emu.lists("nvidia.com/gpu")
            .iter()
            .all(|l| l.devices.len() == 32),
        "the default config was served before the label was read"
    );

    api.set_label(DEFAULT_LABEL, "tesla-t4");
    let st = d.wait_status(|st| st.policy_error.is_some()).await;
    let reason = st.ready().unwrap_err().to_string();
    assert!(
        reason.contains("names config \"tesla-t4\"") && reason.contains("(keys: a100-ts4, any)"),
        "{reason}"
    );
    assert_eq!(emu.state().device_count("nvidia.com/gpu"), Some(32));
    assert_eq!(st.generation, 1, "nothing new was applied");

    // Fixing the ConfigMap (adding the key) applies it without a label change.
    write_configmap(
        &s.configs,
        &[
            ("any", "version: v1\n"),
            ("a100-ts4", &ts(4)),
            ("tesla-t4", &ts(2)),
        ],
    );
    wait_lists(&emu, &[("nvidia.com/gpu", 16)]).await;
    d.wait_status(|st| st.policy_error.is_none() && st.generation == 2)
        .await;
    d.stop().await;
}

#[tokio::test]
async fn a_label_change_leaves_untouched_resources_streaming() {
    let s = setup(&[("two", &gpu0_shared(2)), ("four", &gpu0_shared(4))]);
    let api = KubeApi::start(NODE, &[(DEFAULT_LABEL, "two")]).await;
    let emu = emulator(&s.node).await;
    let d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), None));
    wait_lists(&emu, &[("nvidia.com/gpu", 7), ("nvidia.com/gpu-shared", 2)]).await;
    let whole_before = emu.streams("nvidia.com/gpu");
    api.set_label(DEFAULT_LABEL, "four");
    wait_lists(&emu, &[("nvidia.com/gpu", 7), ("nvidia.com/gpu-shared", 4)]).await;
    let whole_after = emu.streams("nvidia.com/gpu");
    assert_eq!(whole_before.len(), 1);
    assert_eq!(whole_after.len(), 1, "nvidia.com/gpu's stream was reopened");
    assert_eq!(
        whole_after[0].lists.len(),
        whole_before[0].lists.len(),
        "nvidia.com/gpu got a new list"
    );
    assert_eq!(emu.registrations("nvidia.com/gpu"), 1);
    d.stop().await;
}

#[tokio::test]
async fn without_a_label_the_default_then_the_fallbacks_choose() {
    // No API at all (no --node-name): the default, then `named`, then `single`, then `empty`.
    let s = setup(&[("default", &ts(2)), ("other", &ts(3))]);
    let emu = emulator(&s.node).await;
    let d = Daemon::start(s.settings(None, Some("other")));
    wait_lists(&emu, &[("nvidia.com/gpu", 24)]).await;
    d.stop().await;

    let s = setup(&[("default", &ts(2)), ("other", &ts(3))]);
    let emu = emulator(&s.node).await;
    let d = Daemon::start(s.settings(None, None));
    wait_lists(&emu, &[("nvidia.com/gpu", 16)]).await;
    d.stop().await;

    let s = setup(&[("only", &ts(4))]);
    let emu = emulator(&s.node).await;
    let d = Daemon::start(s.settings(None, None));
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    d.stop().await;

    let s = setup(&[("a", &ts(4)), ("b", &ts(2))]);
    let emu = emulator(&s.node).await;
    let mut settings = s.settings(None, None);
    settings.selection.fallbacks = vec![Fallback::Named, Fallback::Single, Fallback::Empty];
    let d = Daemon::start(settings);
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    d.stop().await;

    // Nothing matches: nothing is served and /readyz says why.
    let s = setup(&[("a", &ts(4)), ("b", &ts(2))]);
    let mut d = Daemon::start(s.settings(None, None));
    let st = d.wait_status(|st| st.policy_error.is_some()).await;
    assert!(
        st.ready()
            .unwrap_err()
            .to_string()
            .contains("no fallback (named,single) found a config"),
        "{st:?}"
    );
    assert_eq!(st.generation, 0);
    d.stop().await;
}

#[tokio::test]
async fn an_unreachable_api_at_start_serves_the_default_and_the_label_applies_once_it_answers() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    let api = KubeApi::start(NODE, &[(DEFAULT_LABEL, "a100-ts4")]).await;
    api.set_unavailable(true);
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), Some("any")));
    // The first API error ends the start-up wait: the default serves meanwhile.
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    // An API outage is not a readiness failure.
    d.wait_status(|st| st.api_error.is_some() && st.ready().is_ok())
        .await;
    api.set_unavailable(false);
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    d.wait_status(|st| st.api_error.is_none()).await;
    d.stop().await;
}

/// An API that keeps refusing the Node's LIST is asked again after a growing delay (0.8 s
/// doubling to 30 s, jittered), not about once a second: kube-runtime's default backoff
/// restarts at every re-list (the watcher says `Init` before each), which on a real API
/// server with the RBAC missing was 53 LISTs in a minute from one node (the fleet bench), and
/// on a fleet is every node's LIST every second for as long as it lasts.
#[tokio::test]
async fn a_failing_api_is_asked_again_after_a_growing_delay() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    let api = KubeApi::start(NODE, &[(DEFAULT_LABEL, "a100-ts4")]).await;
    api.set_unavailable(true);
    let emu = emulator(&s.node).await;
    let d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), Some("any")));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    let first = api.wait(|c| c.refused >= 1).await.refused;
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    // Retries after 0.8-1.6, 1.6-3.2 and 3.2-6.4 s: at most three more in 8 s (the default
    // backoff made about eight).
    let again = api.counters().refused - first;
    assert!(again <= 3, "{again} retries in 8 s");
    // Still retried: the label applies once the API answers.
    api.set_unavailable(false);
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    d.stop().await;
}

#[tokio::test]
async fn a_lost_api_keeps_the_config_and_the_watch_resumes() {
    let s = setup(&[
        ("any", "version: v1\n"),
        ("a100-ts4", &ts(4)),
        ("ts2", &ts(2)),
    ]);
    let api = KubeApi::start(NODE, &[(DEFAULT_LABEL, "a100-ts4")]).await;
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(api.kubeconfig(s.node.tmp.path())), Some("any")));
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    let before = api.wait(|c| c.watches >= 1).await;

    // An outage: open watches end and requests fail; the config keeps serving.
    api.set_unavailable(true);
    let st = d.wait_status(|st| st.api_error.is_some()).await;
    assert_eq!(st.generation, 1);
    assert_eq!(emu.state().device_count("nvidia.com/gpu"), Some(32));
    api.set_unavailable(false);
    api.wait(|c| c.watches > before.watches).await;
    d.wait_status(|st| st.api_error.is_none()).await;

    // A watch that merely ends is resumed too, and the next change arrives.
    let n = api.wait(|_| true).await.watches;
    api.drop_watches();
    api.wait(|c| c.watches > n).await;
    api.set_label(DEFAULT_LABEL, "ts2");
    wait_lists(&emu, &[("nvidia.com/gpu", 16)]).await;
    d.stop().await;
}

#[tokio::test]
async fn no_api_configuration_is_reported_and_the_default_serves() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    // A kubeconfig naming a port nobody listens on: connection refused, retried with backoff.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let kubeconfig = kubeconfig_for(s.node.tmp.path(), &format!("http://{closed}"));
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(kubeconfig), Some("any")));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    d.wait_status(|st| st.api_error.is_some()).await;
    d.stop().await;

    // An unreadable kubeconfig: the watch ends at once with the error named.
    let s = setup(&[("any", "version: v1\n")]);
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(s.node.tmp.path().join("no-such-kubeconfig")), None));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    let st = d.wait_status(|st| st.api_error.is_some()).await;
    assert!(st.api_error.unwrap().contains("no-such-kubeconfig"));
    d.stop().await;
}

#[test]
fn validate_checks_every_config_of_a_directory_and_plan_chooses_like_the_daemon() {
    let s = setup(&[
        ("any", "version: v1\n"),
        ("a100-ts4", &ts(4)),
        ("broken", &ts(0)),
    ]);
    let node = node_file("a100-40gb-x8.yaml");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_slicelet"))
            .args(args)
            .arg("--config")
            .arg(&s.configs)
            .arg("--simulate")
            .arg(&node)
            .env_remove("FALLBACK_STRATEGIES")
            .env_remove("DEFAULT_CONFIG")
            .output()
            .unwrap()
    };
    let out = run(&["validate"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1 of 3 configs in"), "{err}");
    assert!(
        err.contains("  broken: invalid policy") && err.contains("replicas"),
        "{err}"
    );

    let out = run(&["plan", "--output", "json", "--config-default", "a100-ts4"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        plan["resources"][0]["devices"].as_array().unwrap().len(),
        32
    );

    let out = run(&["plan"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("(keys: a100-ts4, any, broken)"));
    let out = run(&["plan", "--config-fallback", "named,empty"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the `empty` fallback"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slicelet"))
        .args(["plan", "--config"])
        .arg(&s.configs)
        .arg("--simulate")
        .arg(&node)
        .env("FALLBACK_STRATEGIES", "single,nope")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown config fallback strategy \"nope\"")
    );
}

#[tokio::test]
async fn a_config_directory_replaced_by_a_file_keeps_the_last_good_config() {
    let s = setup(&[("any", "version: v1\n"), ("a100-ts4", &ts(4))]);
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(None, Some("a100-ts4")));
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    // The directory goes and a file (a valid, empty policy) takes its name: it is not read as
    // a single-file policy.
    std::fs::remove_dir_all(&s.configs).unwrap();
    std::fs::write(&s.configs, "").unwrap();
    let st = d.wait_status(|st| st.policy_error.is_some()).await;
    assert!(
        st.policy_error
            .as_deref()
            .unwrap()
            .contains("was a directory of named configs at start and is no longer a directory"),
        "{st:?}"
    );
    assert_eq!(st.generation, 1);
    assert_eq!(emu.state().device_count("nvidia.com/gpu"), Some(32));
    d.stop().await;
}

#[tokio::test]
async fn a_kubeconfig_that_is_a_fifo_is_refused_naming_it() {
    let s = setup(&[("any", "version: v1\n")]);
    let fifo = s.node.tmp.path().join("kubeconfig-fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let emu = emulator(&s.node).await;
    let mut d = Daemon::start(s.settings(Some(fifo), None));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    let st = d.wait_status(|st| st.api_error.is_some()).await;
    let e = st.api_error.unwrap();
    assert!(e.contains("kubeconfig-fifo is a FIFO"), "{e}");
    d.stop().await;
}
