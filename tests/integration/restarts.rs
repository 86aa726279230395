//! 100 kubelet restarts in a row, exactly one registration per resource per restart.
//!
//! The "Done when": 100 kubelet restarts in a row (socket wiped and re-created, with and
//! without a stale `kubelet.sock` left behind, gaps 0–100 ms) produce exactly 100 registrations
//! per resource and no moment at the end of the run in which a resource is missing.

use std::path::Path;
use std::time::{Duration, Instant};

use kubelet_emulator::{KubeletEmulator, State};

use crate::common::*;

const RESTARTS: u32 = 100;

/// Two time-sliced entries on different GPUs: two resources, two sockets.
fn policy(a: u32, b: u32) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-a\n        devices: [0]\n        replicas: {a}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-b\n        devices: [1]\n        replicas: {b}\n"
    )
}

fn write_node(path: &Path) {
    let mut text = String::from("gpus:\n");
    for i in 0..2 {
        text.push_str(&format!(
            "  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    uuid: GPU-{i:08}-aaaa-bbbb-cccc-eeeeeeeeeeee\n"
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// A fixed pseudo-random sequence (Knuth's MMIX LCG), so every run restarts with the same gaps.
struct Lcg(u64);

impl Lcg {
    /// The next gap, 0–100 ms.
    fn gap(&mut self) -> Duration {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        Duration::from_millis((self.0 >> 33) % 101)
    }
}

/// Every resource of `want` is registered (at least `registrations` accepted registrations),
/// its stream is open and its latest list is complete. The emulator forgets every list and
/// marks every stream closed when it restarts, so this holds only for a registration with the
/// instance serving now.
fn all_served(s: &State, want: &[(&str, usize)], registrations: u32) -> bool {
    want.iter().all(|(r, n)| {
        s.resources.get(*r).is_some_and(|res| {
            res.registrations >= registrations && res.streaming && s.device_count(r) == Some(*n)
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_kubelet_restarts_cost_a_hundred_registrations_per_resource() {
    let node = Node::new(&policy(4, 2));
    let sim = node.tmp.path().join("node.yaml");
    write_node(&sim);
    let mut emu: KubeletEmulator = emulator(&node).await;
    let d = Daemon::start(node.settings(&sim));
    let want = [("nvidia.com/gpu-a", 4), ("nvidia.com/gpu-b", 2)];
    emu.wait_for(WAIT, |s| all_served(s, &want, 1))
        .await
        .unwrap_or_else(|e| panic!("first registration: {e}"));

    let started = Instant::now();
    let mut gaps = Lcg(0x05EE_D1E7);
    let mut total_gap = Duration::ZERO;
    let mut first_off: Option<String> = None;
    for round in 1..=RESTARTS {
        let gap = gaps.gap();
        total_gap += gap;
        let stale = round % 2 == 0;
        if stale {
            emu.restart_leaving_stale_socket(gap).await.unwrap();
        } else {
            emu.restart_after(gap).await.unwrap();
        }
        let state = emu
            .wait_for(WAIT, |s| all_served(s, &want, round + 1))
            .await
            .unwrap_or_else(|e| panic!("restart {round} (stale: {stale}, gap {gap:?}): {e}"));
        for (r, _) in want {
            // Noted per round, so a duplicate is pinned to the restart that caused it (one
            // still on its way shows up at a later round or at the end).
            let calls = state.resources[r].register_calls;
            if calls != round + 1 && first_off.is_none() {
                first_off = Some(format!(
                    "{r}: {calls} register calls after restart {round} (stale: {stale}, gap {gap:?})"
                ));
            }
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{RESTARTS} kubelet restarts in {elapsed:?} ({total_gap:?} of it deliberate gaps); \
         register calls: {:?}",
        want.map(|(r, _)| (r, emu.register_calls(r)))
    );

    // 1 initial registration + 1 per restart. The emulator counts every Register call that
    // reaches it (`register_calls`, refused ones included) and every accepted one
    // (`registrations`); both must be exactly that, none refused, none twice.
    let expected = RESTARTS + 1;
    let check = |when: &str| {
        for (r, _) in want {
            assert_eq!(
                emu.register_calls(r),
                expected,
                "{r} register calls {when}; first off: {first_off:?}"
            );
            assert_eq!(emu.registrations(r), expected, "{r} registrations {when}");
            assert_eq!(emu.streams(r).len() as u32, expected, "{r} streams {when}");
        }
    };
    check("after the last restart");

    // One more observable event, after which no late duplicate can still be on its way: a
    // policy change whose new lists arrive on the open streams (the daemon has processed
    // everything queued before it by then).
    let skip: Vec<usize> = want.iter().map(|(r, _)| emu.lists(r).len()).collect();
    node.write_policy(&policy(3, 3));
    for ((r, _), skip) in want.iter().zip(skip) {
        let three = |d: &[slicelet::api::Device]| d.len() == 3;
        let found = emu
            .wait_for_sequence_after(r, skip, &[&three], WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found[0].stream, expected, "{r}: on the last stream");
    }
    check("after a later policy change");
    let want = [("nvidia.com/gpu-a", 3), ("nvidia.com/gpu-b", 3)];
    let state = emu.state();
    assert!(
        all_served(&state, &want, expected),
        "every resource registered, streaming, with its full list: {state:#?}"
    );
    for (r, _) in want {
        assert!(emu.streams(r).last().unwrap().open, "{r}");
    }
    d.stop().await;
}
