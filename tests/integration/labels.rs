//! Node labels as an NFD feature file (`--nfd-features-file`): written from what the daemon
//! advertises, rewritten when the policy changes, removed on graceful shutdown, and a write
//! failure never stops serving. Waits on the supervisor's `Status` (`nfd_writes`, `nfd_error`),
//! which the writer updates after each write: no sleeps.

use std::path::Path;

use slicelet::labels::HEADER;

use crate::common::*;

fn expect(lines: &[&str]) -> String {
    let mut s = format!("{HEADER}\n");
    for l in lines {
        s.push_str(l);
        s.push('\n');
    }
    s
}

/// The file names in `dir` (a dot-file left behind would show here).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_file_follows_the_plan_and_is_removed_on_shutdown() {
    let node = Node::new(&read(&repo().join("config/policy.yaml")));
    let features = node.tmp.path().join("features.d");
    std::fs::create_dir(&features).unwrap();
    let file = features.join("slicelet");
    // A file left by a crashed run describes a plan this process has not made.
    std::fs::write(&file, "nvidia.com/gpu.replicas=99\n").unwrap();
    let emu = emulator(&node).await;
    let mut settings = node.settings(&node_file("a100-40gb-x8.yaml"));
    settings.nfd_features_file = Some(file.clone());
    let mut d = Daemon::start(settings);

    wait_lists(&emu, &[("nvidia.com/gpu-shared", 32)]).await;
    d.wait_status(|s| s.nfd_writes == 1).await;
    assert_eq!(
        read(&file),
        expect(&[
            "nvidia.com/gpu-shared.count=8",
            "nvidia.com/gpu-shared.memory=40960",
            "nvidia.com/gpu-shared.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-shared.replicas=4",
            "nvidia.com/gpu-shared.sharing-strategy=time-slicing",
        ])
    );

    // Reload: only GPU 0 shared. The kubelet sees the new lists, and the file is rewritten.
    node.write_policy("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0]\n        replicas: 4\n");
    wait_lists(&emu, &[("nvidia.com/gpu", 7), ("nvidia.com/gpu-shared", 4)]).await;
    d.wait_status(|s| s.nfd_writes == 2).await;
    assert_eq!(
        read(&file),
        expect(&[
            "nvidia.com/gpu-shared.count=1",
            "nvidia.com/gpu-shared.memory=40960",
            "nvidia.com/gpu-shared.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu-shared.replicas=4",
            "nvidia.com/gpu-shared.sharing-strategy=time-slicing",
            "nvidia.com/gpu.count=7",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.replicas=1",
            "nvidia.com/gpu.sharing-strategy=none",
        ])
    );

    // Every GPU 4 ways under its own name: GFD's `-SHARED` product.
    node.write_policy("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n");
    wait_lists(&emu, &[("nvidia.com/gpu", 32)]).await;
    let s = d.wait_status(|s| s.nfd_writes == 3).await;
    assert_eq!(s.nfd_error, None);
    assert_eq!(
        read(&file),
        expect(&[
            "nvidia.com/gpu.count=8",
            "nvidia.com/gpu.memory=40960",
            "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-SHARED",
            "nvidia.com/gpu.replicas=4",
            "nvidia.com/gpu.sharing-strategy=time-slicing",
        ])
    );
    assert_eq!(names(&features), ["slicelet"], "no temporary file is left");

    // migStrategy mixed on a node without MIG: the same plan (nothing is re-published), but
    // the policy's strategy is a label of its own.
    node.write_policy("version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n");
    d.wait_status(|s| s.nfd_writes == 4).await;
    assert!(
        read(&file).ends_with(
            "nvidia.com/gpu.sharing-strategy=time-slicing\nnvidia.com/mig.strategy=mixed\n"
        ),
        "{}",
        read(&file)
    );

    d.stop().await;
    assert_eq!(
        names(&features),
        Vec::<String>::new(),
        "graceful shutdown removes the file so NFD drops the labels"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_feature_file_never_stops_serving_and_is_retried() {
    let node = Node::new(&ts_policy(2));
    let features = node.tmp.path().join("features.d");
    let file = features.join("slicelet");
    let emu = emulator(&node).await;
    let mut settings = node.settings(&node_file("a100-40gb-x8.yaml"));
    settings.nfd_features_file = Some(file.clone());
    let mut d = Daemon::start(settings);

    // The directory does not exist: the write fails, the kubelet is served all the same, and
    // the status (so /readyz) says why.
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 16)]).await;
    // (Registered too: the kubelet's stream can open before the daemon has seen the
    // Register answer, and /readyz would name the registration first.)
    let s = d
        .wait_status(|s| {
            s.nfd_error.is_some() && !s.resources.is_empty() && s.resources.is_subset(&s.registered)
        })
        .await;
    let reason = s.ready().unwrap_err().to_string();
    assert!(
        reason.contains("node labels may be stale") && reason.contains("features.d/slicelet"),
        "{reason}"
    );
    assert_eq!(s.nfd_writes, 0);

    // Once the directory exists the retry writes it.
    std::fs::create_dir(&features).unwrap();
    let s = d
        .wait_status(|s| s.nfd_writes == 1 && s.nfd_error.is_none())
        .await;
    assert_eq!(s.ready(), Ok(()));
    assert!(read(&file).contains("nvidia.com/gpu-shared.replicas=2\n"));
    d.stop().await;
    assert!(!file.exists());
}
