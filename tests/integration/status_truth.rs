//! `/readyz` tells the truth about what an operator would check.

use crate::common::*;

/// A policy file that disappears while the daemon runs is reported (readyz 503 naming the
/// file), the last good policy keeps serving, and the file coming back clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_policy_is_reported_and_the_last_good_one_keeps_serving() {
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    d.wait_status(|s| s.ready().is_ok()).await;
    let generation = d.status.borrow().generation;

    // The whole ConfigMap volume content goes away (its ..data link and the file).
    let dir = node.policy().parent().unwrap().to_path_buf();
    std::fs::remove_file(node.policy()).unwrap();
    std::fs::remove_file(dir.join("..data")).unwrap();
    let s = d
        .wait_status(|s| {
            s.ready()
                .is_err_and(|e| e.to_string().contains("config.yaml"))
        })
        .await;
    assert!(s.policy_error.is_some(), "{s:?}");
    assert_eq!(
        s.generation, generation,
        "the last good policy is still applied"
    );
    assert_eq!(
        emu.state().device_count("nvidia.com/gpu-shared"),
        Some(2),
        "still served"
    );

    node.write_policy(&ts_policy(2));
    let s = d.wait_status(|s| s.ready().is_ok()).await;
    assert!(s.policy_error.is_none());
    d.stop().await;
}

/// With every GPU unusable at start, nothing usable is advertised: not ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_device_is_not_ready() {
    let node = Node::new(&ts_policy(2));
    let sim = node.tmp.path().join("node.yaml");
    std::fs::write(
        &sim,
        "gpus:\n  - model: NVIDIA L4\n    memoryMiB: 23034\n    health: Unhealthy\n",
    )
    .unwrap();
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&sim));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    let s = d
        .wait_status(|s| !s.registered.is_empty() && s.devices == 2)
        .await;
    assert!(
        s.ready()
            .unwrap_err()
            .to_string()
            .contains("no device is Healthy"),
        "{:?}",
        s.ready()
    );
    // The GPU recovers: ready.
    std::fs::write(&sim, "gpus:\n  - model: NVIDIA L4\n    memoryMiB: 23034\n").unwrap();
    d.wait_status(|s| s.ready().is_ok()).await;
    d.stop().await;
}

/// A kubelet that accepts every registration and never dials back (no ListAndWatch).
struct Mute;

#[tonic::async_trait]
impl slicelet::api::registration_server::Registration for Mute {
    async fn register(
        &self,
        _: tonic::Request<slicelet::api::RegisterRequest>,
    ) -> Result<tonic::Response<slicelet::api::Empty>, tonic::Status> {
        Ok(tonic::Response::new(slicelet::api::Empty {}))
    }
}

/// `Register` succeeds but the kubelet never opens ListAndWatch: not ready, with the resource
/// named, once the grace period is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_without_a_stream_is_not_ready() {
    let node = Node::new(&ts_policy(2));
    let listener =
        tokio::net::UnixListener::bind(node.plugins().join(slicelet::api::KUBELET_SOCKET)).unwrap();
    let kubelet = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(slicelet::api::registration_server::RegistrationServer::new(
                Mute,
            ))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let mut settings = node.settings(&node_file("l4-x1.yaml"));
    settings.stream_grace = std::time::Duration::from_millis(200);
    let mut d = Daemon::start(settings);
    let s = d.wait_status(|s| !s.stalled.is_empty()).await;
    assert!(s.registered.contains("nvidia.com/gpu-shared"), "{s:?}");
    assert!(
        s.ready()
            .unwrap_err()
            .to_string()
            .contains("opened no ListAndWatch stream for: nvidia.com/gpu-shared"),
        "{:?}",
        s.ready()
    );
    d.stop().await;
    kubelet.abort();
}

/// The 400 KB policy that once took 203 s of CPU on the supervisor (nesting inside a typed
/// field): it is refused before parsing and, read off the loop, never delays a kubelet restart
/// happening at the same time. The last good policy keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_policy_is_refused_while_a_kubelet_restart_is_handled() {
    let node = Node::new(&ts_policy(2));
    let mut emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    let depth = 200_000;
    let hostile = format!(
        "flags:\n  gfd: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    assert!(hostile.len() > 400_000);
    node.write_policy(&hostile);
    emu.restart().await.unwrap();
    emu.wait_for(WAIT, |s| {
        let r = &s.resources["nvidia.com/gpu-shared"];
        r.registrations >= 2 && r.streaming && s.device_count("nvidia.com/gpu-shared") == Some(2)
    })
    .await
    .unwrap();
    let s = d
        .wait_status(|s| {
            s.policy_error
                .as_deref()
                .is_some_and(|e| e.contains("nest"))
        })
        .await;
    assert_eq!(s.generation, 1, "the last good policy keeps serving");
    d.stop().await;
}
