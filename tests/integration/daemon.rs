//! The daemon in process against the kubelet emulator over real unix sockets.

use slicelet::api;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a100_node_with_example_policy_serves_32_shared_replicas() {
    let policy = read(&repo().join("config/policy.yaml"));
    let node = Node::new(&policy);
    let emu = emulator(&node).await;
    let sim = node_file("a100-40gb-x8.yaml");
    let d = Daemon::start(node.settings(&sim));
    let state = wait_lists(&emu, &[("nvidia.com/gpu-shared", 32)]).await;
    assert_eq!(state.resources.len(), 1, "{state:#?}");
    let r = &state.resources["nvidia.com/gpu-shared"];
    assert_eq!(r.registrations, 1);
    assert_eq!(r.endpoint, "slicelet-nvidia.com_gpu-shared.sock");
    let opts = r.options.unwrap();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
    assert_eq!(state.healthy_count("nvidia.com/gpu-shared"), Some(32));
    let devices = r.devices.clone().unwrap();
    let numa: Vec<i64> = devices
        .iter()
        .map(|d| d.topology.as_ref().unwrap().nodes[0].id)
        .collect();
    assert_eq!(numa.iter().filter(|&&n| n == 1).count(), 16);

    // Allocate one replica: its GPU's UUID in both variables.
    let gpus = uuids(&sim);
    let id = format!("{}::2", gpus[5]);
    let mut client = emu.client("nvidia.com/gpu-shared").await.unwrap();
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![id],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 1);
    let envs = &resp.container_responses[0].envs;
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], gpus[5]);
    assert_eq!(envs["CUDA_VISIBLE_DEVICES"], gpus[5]);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_gpu_policy_registers_every_resource_separately() {
    let policy = read_fixture("policies/ts-per-gpu.yaml");
    let node = Node::new(&policy);
    let emu = emulator(&node).await;
    let sim = node_file("h100-80gb-x8.yaml");
    let d = Daemon::start(node.settings(&sim));
    let state = wait_lists(
        &emu,
        &[
            ("nvidia.com/gpu-small", 16),
            ("nvidia.com/gpu-medium", 4),
            ("nvidia.com/gpu", 4),
        ],
    )
    .await;
    assert_eq!(state.resources.len(), 3);
    let gpus = uuids(&sim);
    let small: Vec<String> = state.resources["nvidia.com/gpu-small"]
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    let want: Vec<String> = (0..2)
        .flat_map(|g| (0..8).map(move |n| (g, n)))
        .map(|(g, n)| format!("{}::{n}", gpus[g]))
        .collect();
    assert_eq!(small, want);
    let whole: Vec<String> = state.resources["nvidia.com/gpu"]
        .devices
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(whole, gpus[4..].to_vec());

    // Unknown and foreign IDs are refused with INVALID_ARGUMENT naming the ID.
    let mut small_client = emu.client("nvidia.com/gpu-small").await.unwrap();
    for bad in [
        format!("{}::0", gpus[2]),
        gpus[4].clone(),
        "GPU-bogus".to_string(),
    ] {
        let status = small_client
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec![format!("{}::0", gpus[0]), bad.clone()],
                }],
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{bad}");
        assert!(status.message().contains(&bad), "{}", status.message());
    }

    // GetPreferredAllocation: distinct GPUs first, exactly the size asked for.
    let resp = small_client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: small.iter().rev().cloned().collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let got = &resp.container_responses[0].device_i_ds;
    assert_eq!(
        got,
        &vec![format!("{}::0", gpus[0]), format!("{}::0", gpus[1])]
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_re_registers_every_resource() {
    let policy = read_fixture("policies/ts-per-gpu.yaml");
    let node = Node::new(&policy);
    let mut emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&node_file("h100-80gb-x8.yaml")));
    let want = [
        ("nvidia.com/gpu-small", 16),
        ("nvidia.com/gpu-medium", 4),
        ("nvidia.com/gpu", 4),
    ];
    wait_lists(&emu, &want).await;
    for round in 2..=3 {
        emu.restart().await.unwrap();
        let state = emu
            .wait_for(WAIT, |s| {
                // The first list on the new, open stream is the full list.
                want.iter().all(|(r, n)| {
                    let res = &s.resources[*r];
                    s.device_count(r) == Some(*n) && res.registrations >= round && res.streaming
                })
            })
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(state.resources.len(), want.len());
    }
    // Every stream of every resource, the old ones included, began with the full list.
    for (r, n) in want {
        let streams = emu.streams(r);
        assert_eq!(streams.len() as u32, emu.registrations(r), "{r}");
        assert!(emu.register_calls(r) >= emu.registrations(r), "{r}");
        for log in &streams {
            assert_eq!(log.lists.first().map(|l| l.len()), Some(n), "{r}: {log:?}");
        }
        assert!(streams.last().unwrap().open, "{r}");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_socket_is_re_bound_and_re_registered() {
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    let sock = node.plugins().join("slicelet-nvidia.com_gpu-shared.sock");
    std::fs::remove_file(&sock).unwrap();
    emu.wait_for(WAIT, |s| {
        s.resources["nvidia.com/gpu-shared"].registrations == 2
            && s.device_count("nvidia.com/gpu-shared") == Some(2)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(sock.exists());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_as_soon_as_the_kubelet_appears() {
    let node = Node::new(&ts_policy(3));
    // Daemon first: kubelet.sock is absent, registration retries with backoff.
    let d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    let sock = node.plugins().join("slicelet-nvidia.com_gpu-shared.sock");
    let emu = emulator(&node).await;
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 3)]).await;
    assert!(sock.exists());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_streams_and_removes_sockets() {
    let node = Node::new(&ts_policy(2));
    let emu = emulator(&node).await;
    let d = Daemon::start(node.settings(&node_file("h100-80gb-x8.yaml")));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 16)]).await;
    d.stop().await;
    emu.wait_for(WAIT, |s| !s.resources["nvidia.com/gpu-shared"].streaming)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let left: Vec<_> = std::fs::read_dir(node.plugins())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("slicelet-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_policy_at_start_serves_once_fixed() {
    let node = Node::new("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 0\n");
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    let st = d.wait_status(|s| s.policy_error.is_some()).await;
    let err = st.policy_error.unwrap();
    assert!(
        err.contains("sharing.timeSlicing.resources[0].replicas"),
        "{err}"
    );
    assert!(
        !d.handle.is_finished(),
        "an invalid policy must not stop the daemon"
    );
    assert!(emu.state().resources.is_empty());
    node.write_policy(&ts_policy(4));
    let state = wait_lists(&emu, &[("nvidia.com/gpu-shared", 4)]).await;
    // Nothing was registered for the invalid policy.
    assert_eq!(state.resources.len(), 1);
    assert_eq!(state.resources["nvidia.com/gpu-shared"].registrations, 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_reload_changes_only_what_changed_and_survives_a_bad_edit() {
    let two = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        devices: [0]\n        replicas: 4\n      - name: nvidia.com/gpu\n        rename: b\n        devices: [1]\n        replicas: 2\n";
    let node = Node::new(two);
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&node_file("h100-80gb-x8.yaml")));
    wait_lists(
        &emu,
        &[
            ("nvidia.com/a", 4),
            ("nvidia.com/b", 2),
            ("nvidia.com/gpu", 6),
        ],
    )
    .await;

    node.write_policy(&two.replace("replicas: 4", "replicas: 8"));
    let state = wait_lists(&emu, &[("nvidia.com/a", 8)]).await;
    let a = &state.resources["nvidia.com/a"];
    assert_eq!(
        (a.registrations, a.lists_received),
        (1, 2),
        "changed list on the same stream"
    );
    for r in ["nvidia.com/b", "nvidia.com/gpu"] {
        let s = &state.resources[r];
        assert_eq!((s.registrations, s.lists_received), (1, 1), "{r} untouched");
    }

    // A broken edit keeps the last good policy serving; the next good one applies.
    node.write_policy("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: a\n        replica: 2\n");
    let st = d.wait_status(|s| s.policy_error.is_some()).await;
    assert!(st.policy_error.unwrap().contains("resources[0].replica"));
    assert_eq!(st.generation, 2);
    let state = emu.state();
    assert_eq!(
        state.device_count("nvidia.com/a"),
        Some(8),
        "last good policy keeps serving"
    );
    assert_eq!(state.resources["nvidia.com/a"].registrations, 1);
    node.write_policy(&two.replace("replicas: 4", "replicas: 6"));
    let state = wait_lists(&emu, &[("nvidia.com/a", 6)]).await;
    assert_eq!(state.device_count("nvidia.com/b"), Some(2));
    assert_eq!(state.resources["nvidia.com/a"].registrations, 1);

    // A resource that disappears stops and removes its socket.
    node.write_policy(&ts_policy(2));
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 16)]).await;
    let gone = node.plugins().join("slicelet-nvidia.com_b.sock");
    emu.wait_for(WAIT, |s| !s.resources["nvidia.com/b"].streaming)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The stream ends when the plan is sent; the socket goes in the same fold's reconcile,
    // which the status published after it follows.
    d.wait_status(|s| !s.resources.contains("nvidia.com/b"))
        .await;
    assert!(!gone.exists());
    d.stop().await;
}

/// The simulated node's MIG devices: (GPU index, MIG UUID, profile), in (GPU, MIG) order.
fn mig_devices(node_file: &std::path::Path) -> Vec<(u32, String, String)> {
    let (inv, _) = slicelet::daemon::discover(&slicelet::settings::Settings {
        simulate: Some(node_file.to_path_buf()),
        ..slicelet::settings::Settings::new("/nonexistent", "/nonexistent")
    })
    .unwrap();
    inv.gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices
                .iter()
                .map(move |m| (g.index, m.uuid.clone(), m.profile.clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_mig_node_registers_one_resource_per_profile_and_whole_gpus() {
    let policy = "version: v1\nflags:\n  migStrategy: mixed\n";
    let node = Node::new(policy);
    let emu = emulator(&node).await;
    let sim = node_file("h100-80gb-x8-mig-mixed.yaml");
    let d = Daemon::start(node.settings(&sim));
    let want = [
        ("nvidia.com/mig-1g.10gb", 8),
        ("nvidia.com/mig-2g.20gb", 3),
        ("nvidia.com/mig-3g.40gb", 2),
        ("nvidia.com/gpu", 5),
    ];
    let state = wait_lists(&emu, &want).await;
    assert_eq!(state.resources.len(), 4, "{state:#?}");
    for (r, n) in want {
        let res = &state.resources[r];
        assert_eq!(res.registrations, 1, "{r}");
        assert_eq!(
            res.endpoint,
            format!("slicelet-{}.sock", r.replace('/', "_")),
            "{r}"
        );
        assert_eq!(state.healthy_count(r), Some(n), "{r}");
    }
    let migs = mig_devices(&sim);
    let ids = |r: &str| ids_of(&state, r);
    let of = |profile: &str| -> Vec<String> {
        migs.iter()
            .filter(|(_, _, p)| p == profile)
            .map(|(_, u, _)| u.clone())
            .collect()
    };
    assert_eq!(ids("nvidia.com/mig-1g.10gb"), of("1g.10gb"));
    assert_eq!(ids("nvidia.com/mig-2g.20gb"), of("2g.20gb"));
    assert_eq!(ids("nvidia.com/mig-3g.40gb"), of("3g.40gb"));
    assert_eq!(ids("nvidia.com/gpu"), uuids(&sim)[3..].to_vec());

    // Allocate a MIG device: its MIG UUID in both variables, not the parent GPU's UUID.
    let slice = of("2g.20gb")[1].clone();
    let mut client = emu.client("nvidia.com/mig-2g.20gb").await.unwrap();
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![slice.clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let envs = &resp.container_responses[0].envs;
    assert_eq!(envs["NVIDIA_VISIBLE_DEVICES"], slice);
    assert_eq!(envs["CUDA_VISIBLE_DEVICES"], slice);
    // A GPU UUID is no device of a MIG resource.
    let status = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![uuids(&sim)[1].clone()],
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    // The example MIG policy time-slices the 1g.10gb slices 2 ways, in place: only that
    // resource changes.
    node.write_policy(&read(&repo().join("config/policy-mig.yaml")));
    let state = wait_lists(
        &emu,
        &[
            ("nvidia.com/mig-1g.10gb", 16),
            ("nvidia.com/mig-2g.20gb", 3),
            ("nvidia.com/mig-3g.40gb", 2),
            ("nvidia.com/gpu", 5),
        ],
    )
    .await;
    let small = ids_of(&state, "nvidia.com/mig-1g.10gb");
    let first = &of("1g.10gb")[0];
    assert_eq!(small[..2], [format!("{first}::0"), format!("{first}::1")]);
    let mut client = emu.client("nvidia.com/mig-1g.10gb").await.unwrap();
    // Two replicas of two different slices on GPU 0: both MIG UUIDs, in MIG order.
    let two = [format!("{}::1", of("1g.10gb")[3]), format!("{first}::0")];
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: two.to_vec(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].envs["CUDA_VISIBLE_DEVICES"],
        format!("{first},{}", of("1g.10gb")[3])
    );
    // GetPreferredAllocation spreads over slices first.
    let resp = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: small.iter().rev().cloned().collect(),
                must_include_device_i_ds: vec![],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].device_i_ds,
        vec![format!("{first}::0"), format!("{}::0", of("1g.10gb")[1])]
    );
    let state = emu.state();
    for r in [
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/gpu",
    ] {
        assert_eq!(state.resources[r].registrations, 1, "{r} re-registered");
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_mig_node_advertises_every_mig_device_as_gpu() {
    let node = Node::new("version: v1\nflags:\n  migStrategy: single\n");
    let emu = emulator(&node).await;
    let sim = node_file("a100-40gb-x8-mig-single.yaml");
    let d = Daemon::start(node.settings(&sim));
    let state = wait_lists(&emu, &[("nvidia.com/gpu", 56)]).await;
    assert_eq!(state.resources.len(), 1);
    let migs: Vec<String> = mig_devices(&sim).into_iter().map(|(_, u, _)| u).collect();
    assert_eq!(ids_of(&state, "nvidia.com/gpu"), migs);
    let mut client = emu.client("nvidia.com/gpu").await.unwrap();
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest {
                devices_ids: vec![migs[9].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"],
        migs[9]
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_held_by_another_process_is_served_once_freed() {
    // Regression: a bind failure (another live process on our socket path) was logged once and
    // the resource was never served, leaving /readyz at 503 for good.
    let node = Node::new(&ts_policy(2));
    let sock = node.plugins().join("slicelet-nvidia.com_gpu-shared.sock");
    let squatter = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let emu = emulator(&node).await;
    let mut d = Daemon::start(node.settings(&node_file("l4-x1.yaml")));
    let st = d.wait_status(|s| s.generation == 1).await;
    assert!(
        st.registered.is_empty(),
        "the squatter's socket must not be taken over"
    );
    assert!(emu.state().resources.is_empty());
    drop(squatter);
    std::fs::remove_file(&sock).unwrap();
    wait_lists(&emu, &[("nvidia.com/gpu-shared", 2)]).await;
    d.wait_status(|s| s.ready().is_ok()).await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_links_steer_get_preferred_allocation() {
    let node = Node::new("version: v1\n");
    let emu = emulator(&node).await;
    let sim = node_file("v100-16gb-x8-dgx1.yaml");
    let d = Daemon::start(node.settings(&sim));
    wait_lists(&emu, &[("nvidia.com/gpu", 8)]).await;
    let gpus = uuids(&sim);
    let ask = async |taken: &[usize], size: i32| {
        let available: Vec<String> = (0..8)
            .filter(|i| !taken.contains(i))
            .map(|i| gpus[i].clone())
            .rev()
            .collect();
        preferred(&emu, "nvidia.com/gpu", available, size).await
    };
    // A fully connected NVLink quad on one NUMA node.
    assert_eq!(ask(&[], 4).await, gpus[0..4].to_vec());
    // Two NVLinks and one PCIe switch: 2-3 (the lowest index would give 0-1, one link).
    assert_eq!(ask(&[], 2).await, gpus[2..4].to_vec());
    // GPU 0 taken: 1, 2, 3 keeps the other quad whole.
    assert_eq!(ask(&[0], 3).await, gpus[1..4].to_vec());
    d.stop().await;
}

/// Memory limits under `enforce: required` on a node whose driver is before R615
/// (config/policy-memory.yaml on an H100 x8 with driver 550): GPU 0's sized replicas are
/// advertised Unhealthy, `/readyz` naming GPU 0 and why, and GPUs 1-7 are served; the node is
/// not dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_memory_limits_fail_closed_on_their_gpu_only() {
    let policy = read(&repo().join("config/policy-memory.yaml"));
    let node = Node::new(&policy);
    let sim = node_file("h100-80gb-x8.yaml");
    let g0 = uuids(&sim)[0].clone();
    // The node's CDI spec (kind nvidia.com/gpu, each GPU by index and UUID), for cdi-cri.
    let specs = node.tmp.path().join("cdi-specs");
    std::fs::create_dir_all(&specs).unwrap();
    let mut spec = String::from("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n");
    for (i, u) in uuids(&sim).iter().enumerate() {
        for name in [i.to_string(), u.clone()] {
            spec.push_str(&format!(
                "  - name: \"{name}\"\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia{i}\n"
            ));
        }
    }
    std::fs::write(specs.join("nvidia.yaml"), spec).unwrap();
    let mut settings = node.settings(&sim);
    settings.cdi_spec_dirs = vec![specs];
    let emu = emulator(&node).await;
    let mut d = Daemon::start(settings);
    let state = wait_lists(
        &emu,
        &[
            ("nvidia.com/gpu", 7),
            ("nvidia.com/gpu-20gb", 2),
            ("nvidia.com/gpu-38gb", 1),
        ],
    )
    .await;
    assert_eq!(state.healthy_count("nvidia.com/gpu"), Some(7));
    assert_eq!(state.healthy_count("nvidia.com/gpu-20gb"), Some(0));
    assert_eq!(state.healthy_count("nvidia.com/gpu-38gb"), Some(0));
    let s = d
        .wait_status(|s| s.generation > 0 && s.ready().is_ok())
        .await;
    assert!(s.policy_error.is_none(), "{:?}", s.policy_error);
    let why = s.unhealthy.get(&g0).cloned().unwrap_or_default();
    assert!(
        why.contains("cannot be enforced (enforce: required)") && why.contains("R615"),
        "{why:?}"
    );
    assert!(s.unhealthy_lines().contains(&g0));
    d.stop().await;
}
