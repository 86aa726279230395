//! The drain rules through real sockets: the daemon asks the kubelet's pod-resources API
//! (emulated) what running containers hold, and a reload never pulls a held device from the
//! kubelet's ListAndWatch list; the exact list sequences are checked.

use kubelet_emulator::pod_resources::PodResources;
use kubelet_emulator::{healthy, KubeletEmulator};
use slicelet::api::Device;

use crate::common::*;

const GPU: &str = "nvidia.com/gpu";

fn ts(replicas: u32) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )
}

/// `(id, health)` of a list, sorted by ID.
fn by_id(d: &[Device]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = d.iter().map(|d| (d.id.clone(), d.health.clone())).collect();
    v.sort();
    v
}

async fn started(policy: &str) -> (Node, KubeletEmulator, PodResources, Daemon, Vec<String>) {
    let node = Node::new(policy);
    let sim = node_file("h100-80gb-x8.yaml");
    let pr = PodResources::start(&node.pod_resources()).await.unwrap();
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    // The release is seen by the periodic read; 1 s instead of 10 keeps the test short.
    settings.pod_resources_interval = std::time::Duration::from_secs(1);
    let d = Daemon::start(settings);
    let uuids = uuids(&sim);
    (node, emu, pr, d, uuids)
}

/// The case: 8× H100 time-sliced ×4, a pod holds `::3` of GPU 0; reloading to ×2 keeps
/// `::3` advertised (Healthy) and GPU 0's new replicas Unhealthy until the pod is gone, then
/// `::3` is withdrawn and GPU 0 serves its two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_to_two_replicas_keeps_a_held_replica_until_its_pod_is_gone() {
    let (node, emu, pr, mut d, uuids) = started(&ts(4)).await;
    wait_lists(&emu, &[(GPU, 32)]).await;
    let held = format!("{}::3", uuids[0]);
    allocate(&emu, GPU, std::slice::from_ref(&held))
        .await
        .unwrap();
    pr.hold("ml", "llm-0", "main", GPU, &[&held]);
    // After the Allocate, the daemon asks what is in use (not only on its 10 s timer).
    d.wait_status(|s| s.in_use == 1).await;

    let before = emu.lists(GPU).len();
    node.write_policy(&ts(2));
    let gpu0 = uuids[0].clone();
    let h = held.clone();
    let draining = move |l: &[Device]| {
        let want: Vec<(String, String)> = {
            let mut w = vec![
                (format!("{gpu0}::0"), "Unhealthy".to_string()),
                (format!("{gpu0}::1"), "Unhealthy".to_string()),
                (h.clone(), "Healthy".to_string()),
            ];
            w.sort();
            w
        };
        let mine: Vec<(String, String)> = by_id(l)
            .into_iter()
            .filter(|(id, _)| id.starts_with(&gpu0))
            .collect();
        l.len() == 17 && healthy(l) == 15 && mine == want
    };
    let s = d.wait_status(|s| s.retained.len() == 1).await;
    assert_eq!(
        s.retained.get(&format!("{GPU} {held}")).map(String::as_str),
        Some("held by ml/llm-0")
    );
    assert_eq!(
        s.unhealthy.get(&uuids[0]).map(String::as_str),
        Some("draining: held by ml/llm-0")
    );
    // The pod is gone: the next read withdraws ::3 and GPU 0's replicas are Healthy again.
    pr.release("ml", "llm-0");
    let released = |l: &[Device]| l.len() == 16 && healthy(l) == 16;
    let seq = emu
        .wait_for_sequence_after(GPU, before, &[&draining, &released], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Never a list without the held replica between the reload and the release.
    let lists = emu.lists(GPU);
    let upto = lists
        .iter()
        .position(|l| l.stream == seq[1].stream && l.index == seq[1].index)
        .unwrap();
    for l in &lists[before..upto] {
        assert!(
            l.devices
                .iter()
                .any(|x| x.id == held && x.health == "Healthy"),
            "a list dropped the held replica: {:?}",
            by_id(&l.devices)
        );
    }
    d.wait_status(|s| s.retained.is_empty() && s.unhealthy.is_empty())
        .await;
    d.stop().await;
}

/// Whole → shared ×4 while a pod holds GPU 1 whole: GPU 1 stays advertised whole (Healthy),
/// its four new replicas are Unhealthy ("draining") until the pod is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_to_shared_keeps_the_whole_gpu_for_its_pod() {
    let (node, emu, pr, d, uuids) = started("version: v1\n").await;
    wait_lists(&emu, &[(GPU, 8)]).await;
    pr.hold("ml", "trainer", "main", GPU, &[&uuids[1]]);
    let before = emu.lists(GPU).len();
    node.write_policy(&ts(4));
    let gpu1 = uuids[1].clone();
    let shared_but_held = move |l: &[Device]| {
        let whole = l.iter().any(|x| x.id == gpu1 && x.health == "Healthy");
        let drained = l
            .iter()
            .filter(|x| x.id.starts_with(&format!("{gpu1}::")))
            .all(|x| x.health == "Unhealthy");
        l.len() == 33 && healthy(l) == 29 && whole && drained
    };
    emu.wait_for_sequence_after(GPU, before, &[&shared_but_held], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // Never a list of the new shape without the whole GPU.
    for l in &emu.lists(GPU)[before..] {
        assert!(l.devices.iter().any(|x| x.id == uuids[1]));
    }
    let before = emu.lists(GPU).len();
    pr.release("ml", "trainer");
    let all_shared = |l: &[Device]| l.len() == 32 && healthy(l) == 32;
    emu.wait_for_sequence_after(GPU, before, &[&all_shared], WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    d.stop().await;
}

/// No pod-resources socket: everything else works, the reason is in the status, and a reload
/// applies with what was last known (nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pod_resources_socket_changes_nothing_else() {
    let node = Node::new(&ts(4));
    let sim = node_file("h100-80gb-x8.yaml");
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&sim));
    wait_lists(&emu, &[(GPU, 32)]).await;
    // Ready despite the error. Waited for, not asserted at the first status with the error:
    // the kubelet opens ListAndWatch while it answers `Register` (kubelet 1.32,
    // `devicemanager/plugin/v1beta1/server.go`), so the lists above can reach the emulator
    // before the daemon has folded the `Register` reply into its status.
    let s = d
        .wait_status(|s| s.in_use_error.is_some() && s.ready().is_ok())
        .await;
    assert!(
        s.in_use_error
            .as_deref()
            .unwrap()
            .contains("does not exist"),
        "{:?}",
        s.in_use_error
    );
    node.write_policy(&ts(2));
    wait_lists(&emu, &[(GPU, 16)]).await;
    d.stop().await;
}

/// pod-resources refusing (the kubelet's rate limiter) while a reload waits: the reload
/// applies with the last answer, which still protects the held replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_pod_resources_keeps_the_last_answer() {
    let (node, emu, pr, mut d, uuids) = started(&ts(4)).await;
    wait_lists(&emu, &[(GPU, 32)]).await;
    let held = format!("{}::2", uuids[3]);
    pr.hold("ml", "llm-1", "main", GPU, &[&held]);
    allocate(&emu, GPU, std::slice::from_ref(&held))
        .await
        .unwrap();
    d.wait_status(|s| s.in_use == 1).await;
    pr.set_failing(true);
    let lists = pr.lists();
    node.write_policy(&ts(2));
    pr.wait_for_lists(lists + 1, WAIT).await.unwrap();
    let s = d.wait_status(|s| s.retained.len() == 1).await;
    let error = s.in_use_error.unwrap_or_default();
    assert!(error.contains("rate limit"), "{error}");
    let st = wait_lists(&emu, &[(GPU, 17)]).await;
    assert!(ids_of(&st, GPU).contains(&held));
    d.stop().await;
}

/// Each burst of Allocates is followed by a pod-resources read (`ALLOCATE_SETTLE` later), the
/// second burst as the first: here nothing else reads (the periodic read is an hour apart),
/// so a supervisor that stopped listening after the first burst never sees the second pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_allocate_burst_is_followed_by_a_read() {
    let node = Node::new(&ts(4));
    let sim = node_file("h100-80gb-x8.yaml");
    let pr = PodResources::start(&node.pod_resources()).await.unwrap();
    let emu = emulator(&node).await;
    let mut settings = node.settings(&sim);
    settings.pod_resources_interval = std::time::Duration::from_secs(3600);
    let mut d = Daemon::start(settings);
    let uuids = uuids(&sim);
    wait_lists(&emu, &[(GPU, 32)]).await;
    for (n, pod) in [(1, "llm-1"), (2, "llm-2")] {
        let id = format!("{}::0", uuids[n]);
        pr.hold("ml", pod, "main", GPU, &[&id]);
        allocate(&emu, GPU, std::slice::from_ref(&id))
            .await
            .unwrap();
        d.wait_status(|s| s.in_use == n).await;
    }
    d.stop().await;
}
