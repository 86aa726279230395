//! GetPreferredAllocation by topology on real layouts (simulated node files through the plan),
//! and its properties on random ones.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::Strategy;

use super::*;
use crate::inventory::simulated;
use crate::plan::build;
use crate::policy::parse;

/// DGX-1 with V100 (hybrid cube-mesh): each GPU has 6 NVLinks to 4 neighbours, two of them
/// doubled, as `nvidia-smi topo -m` shows it on a DGX-1V (NV1 / NV2). GPUs 0-3 on NUMA node 0,
/// 4-7 on 1; pairs (0,1), (2,3), (4,5), (6,7) share a PCIe switch.
const DGX1_NVLINKS: [(u32, u32, u32); 16] = [
    (0, 1, 1),
    (0, 2, 1),
    (0, 3, 2),
    (0, 4, 2),
    (1, 2, 2),
    (1, 3, 1),
    (1, 5, 2),
    (2, 3, 2),
    (2, 6, 1),
    (3, 7, 1),
    (4, 5, 1),
    (4, 6, 1),
    (4, 7, 2),
    (5, 6, 2),
    (5, 7, 1),
    (6, 7, 2),
];

fn gpus(model: &str, per_numa: &[u32]) -> String {
    let mut s = "gpus:\n".to_string();
    for (numa, n) in per_numa.iter().enumerate() {
        s.push_str(&format!(
            "  - model: {model}\n    memoryMiB: 32768\n    count: {n}\n    numaNode: {numa}\n"
        ));
    }
    s
}

fn dgx1() -> String {
    let mut s = gpus("Tesla V100-SXM2-32GB", &[4, 4]);
    s.push_str("links:\n");
    for (a, b, n) in DGX1_NVLINKS {
        s.push_str(&format!("  - gpus: [{a}, {b}]\n    nvlinks: {n}\n"));
        if a / 2 == b / 2 {
            s.push_str("    pcie: single\n");
        }
    }
    s
}

/// A PCIe server: 8 GPUs, NUMA {0-3} and {4-7}, two PCIe switches per NUMA node ({0,1}, {2,3},
/// {4,5}, {6,7}), an NVLink bridge (4 links) on each switch's pair; the switches of one NUMA
/// node meet at its host bridge.
fn pcie_pairs() -> String {
    let mut s = gpus("NVIDIA RTX A6000", &[4, 4]);
    s.push_str("links:\n");
    for a in 0..8u32 {
        for b in a + 1..8 {
            if a / 4 != b / 4 {
                continue;
            }
            if a / 2 == b / 2 {
                s.push_str(&format!(
                    "  - gpus: [{a}, {b}]\n    nvlinks: 4\n    pcie: single\n"
                ));
            } else {
                s.push_str(&format!("  - gpus: [{a}, {b}]\n    pcie: hostbridge\n"));
            }
        }
    }
    s
}

/// DGX H100: 8 GPUs all-to-all over NVSwitch, NUMA {0-3} and {4-7}.
fn dgx_h100() -> String {
    gpus("NVIDIA H100 80GB HBM3", &[4, 4]) + "nvswitch: true\n"
}

/// A 4-GPU workstation without NVLink: one NUMA node, GPUs (0,1) and (2,3) behind two PCIe
/// switches each pair, the rest across the host's PCIe tree.
fn workstation() -> String {
    gpus("NVIDIA RTX 6000 Ada Generation", &[4])
        + "links:\n  - gpus: [0, 1]\n    pcie: multiple\n  - gpus: [2, 3]\n    pcie: multiple\n"
}

fn whole(node: &str, policy: &str) -> Arc<ResourcePlan> {
    let inv = simulated::parse(std::path::Path::new("node.yaml"), node).unwrap();
    let p = parse(policy).unwrap();
    let built = build(&p, &inv).unwrap();
    built.plan.resources.values().next().unwrap().clone()
}

/// The GPU indices behind an answer.
fn indices(res: &ResourcePlan, ids: &[String]) -> Vec<u32> {
    ids.iter()
        .map(|id| res.device(id).expect("known ID").gpu_index)
        .collect()
}

fn id_of(res: &ResourcePlan, gpu: u32) -> String {
    res.devices
        .iter()
        .find(|d| d.gpu_index == gpu)
        .unwrap()
        .id
        .clone()
}

struct Case {
    what: &'static str,
    /// GPUs not in `available` (in use).
    taken: &'static [u32],
    must: &'static [u32],
    size: usize,
    want: &'static [u32],
}

fn run(node: &str, cases: &[Case]) {
    let res = whole(node, "");
    for c in cases {
        let available: Vec<String> = (0..res.devices.len() as u32)
            .filter(|g| !c.taken.contains(g))
            .map(|g| id_of(&res, g))
            .collect();
        let must: Vec<String> = c.must.iter().map(|&g| id_of(&res, g)).collect();
        let got = preferred(&res, &available, &must, c.size);
        assert_eq!(indices(&res, &got), c.want, "{}", c.what);
    }
}

#[test]
fn pcie_server_with_nvlink_pairs() {
    run(
        &pcie_pairs(),
        &[
            Case {
                what: "GPU 2 taken, size 1: the orphan GPU 3, no pair broken",
                taken: &[2],
                must: &[],
                size: 1,
                want: &[3],
            },
            Case {
                what: "GPU 2 taken, size 2: an intact pair",
                taken: &[2],
                must: &[],
                size: 2,
                want: &[0, 1],
            },
            Case {
                what: "GPU 2 taken, size 3: one NUMA node, and NUMA node 1 stays two pairs",
                taken: &[2],
                must: &[],
                size: 3,
                want: &[0, 1, 3],
            },
            Case {
                what: "empty, size 1",
                taken: &[],
                must: &[],
                size: 1,
                want: &[0],
            },
            Case {
                what: "empty, size 2",
                taken: &[],
                must: &[],
                size: 2,
                want: &[0, 1],
            },
            Case {
                what: "empty, size 4: two pairs on one NUMA node",
                taken: &[],
                must: &[],
                size: 4,
                want: &[0, 1, 2, 3],
            },
            Case {
                what: "GPUs 0 and 4 taken, size 2: an intact pair",
                taken: &[0, 4],
                must: &[],
                size: 2,
                want: &[2, 3],
            },
            Case {
                what: "GPUs 0, 2 and 4 taken, size 1: orphans first",
                taken: &[0, 2, 4],
                must: &[],
                size: 1,
                want: &[1],
            },
            Case {
                what: "must GPU 5, size 2: its NVLink partner",
                taken: &[],
                must: &[5],
                size: 2,
                want: &[4, 5],
            },
            Case {
                what: "must GPU 3 with 2 taken, size 2: same NUMA node",
                taken: &[2],
                must: &[3],
                size: 2,
                want: &[0, 3],
            },
            Case {
                what: "must GPU 2 is not available: ignored",
                taken: &[2],
                must: &[2],
                size: 1,
                want: &[3],
            },
            Case {
                what: "size 5: NUMA node 0 plus the least damage",
                taken: &[],
                must: &[],
                size: 5,
                want: &[0, 1, 2, 3, 4],
            },
            Case {
                what: "size 8: all",
                taken: &[],
                must: &[],
                size: 8,
                want: &[0, 1, 2, 3, 4, 5, 6, 7],
            },
            Case {
                what: "GPUs 4 and 5 taken, size 3: NUMA node 0",
                taken: &[4, 5],
                must: &[],
                size: 3,
                want: &[0, 1, 2],
            },
        ],
    );
}

#[test]
fn dgx_h100_nvswitch_two_numa_nodes() {
    let res = whole(&dgx_h100(), "");
    let ids = |g: &[u32]| g.iter().map(|&g| id_of(&res, g)).collect::<Vec<_>>();
    // The case: lowest index first would give [3, 4] across NUMA nodes.
    assert_eq!(
        indices(&res, &preferred(&res, &ids(&[3, 4, 5]), &[], 2)),
        [4, 5]
    );
    assert_eq!(
        indices(&res, &preferred(&res, &ids(&[0, 4, 5, 6]), &[], 3)),
        [4, 5, 6]
    );
    assert_eq!(
        indices(
            &res,
            &preferred(&res, &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), &[], 4)
        ),
        [0, 1, 2, 3]
    );
    assert_eq!(
        indices(
            &res,
            &preferred(&res, &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), &ids(&[6]), 4)
        ),
        [4, 5, 6, 7]
    );
    assert_eq!(
        indices(
            &res,
            &preferred(&res, &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), &[], 5)
        ),
        [0, 1, 2, 3, 4]
    );
    // NVSwitch pairs count as all 18 links, not as none.
    let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    let scored = preferred_scored(&res, &all, &[], 2);
    assert_eq!(
        scored.score,
        u64::from(18 * crate::inventory::topology::NVLINK_WEIGHT + 1)
    );
}

#[test]
fn dgx1_hybrid_cube_mesh() {
    run(
        &dgx1(),
        &[
            Case { what: "empty, size 4: a fully connected quad", taken: &[], must: &[], size: 4, want: &[0, 1, 2, 3] },
            Case { what: "empty, size 2: two NVLinks and one PCIe switch", taken: &[], must: &[], size: 2, want: &[2, 3] },
            Case { what: "empty, size 1", taken: &[], must: &[], size: 1, want: &[0] },
            Case { what: "GPU 0 taken, size 3: NUMA node 1 stays a quad", taken: &[0], must: &[], size: 3, want: &[1, 2, 3] },
            Case { what: "GPUs 0-3 taken, size 4: the other quad", taken: &[0, 1, 2, 3], must: &[], size: 4, want: &[4, 5, 6, 7] },
            Case { what: "must GPU 4, size 4", taken: &[], must: &[4], size: 4, want: &[4, 5, 6, 7] },
            Case { what: "GPUs 2 and 3 taken, size 2: doubled links first", taken: &[2, 3], must: &[], size: 2, want: &[6, 7] },
            Case { what: "size 6: the quad, then 4 (NVLink to 0) and 5 (NVLink to 1 and 4, same PCIe switch)", taken: &[], must: &[], size: 6, want: &[0, 1, 2, 3, 4, 5] },
            Case { what: "size 8", taken: &[], must: &[], size: 8, want: &[0, 1, 2, 3, 4, 5, 6, 7] },
            Case { what: "one NUMA node before more NVLinks: 0-1 (NV1) over 0-4 (NV2, across sockets)", taken: &[2, 3, 5, 6, 7], must: &[], size: 2, want: &[0, 1] },
        ],
    );
    // Every size-4 answer on an empty node is fully connected by NVLink.
    let res = whole(&dgx1(), "");
    let all: Vec<String> = (0..8).map(|g| id_of(&res, g)).collect();
    let got = indices(&res, &preferred(&res, &all, &[], 4));
    for (i, a) in got.iter().enumerate() {
        for b in &got[i + 1..] {
            assert!(
                DGX1_NVLINKS.iter().any(|&(x, y, _)| (x, y) == (*a, *b)),
                "{a}-{b} in {got:?} has no NVLink"
            );
        }
    }
}

#[test]
fn workstation_without_nvlink() {
    run(
        &workstation(),
        &[
            Case {
                what: "size 2: behind one PCIe switch pair",
                taken: &[],
                must: &[],
                size: 2,
                want: &[0, 1],
            },
            Case {
                what: "GPU 0 taken, size 1: the orphan",
                taken: &[0],
                must: &[],
                size: 1,
                want: &[1],
            },
            Case {
                what: "GPU 1 taken, size 2",
                taken: &[1],
                must: &[],
                size: 2,
                want: &[2, 3],
            },
            Case {
                what: "size 3",
                taken: &[],
                must: &[],
                size: 3,
                want: &[0, 1, 2],
            },
            Case {
                what: "size 4",
                taken: &[],
                must: &[],
                size: 4,
                want: &[0, 1, 2, 3],
            },
            Case {
                what: "size 5 on 4 GPUs: all of them",
                taken: &[],
                must: &[],
                size: 5,
                want: &[0, 1, 2, 3],
            },
        ],
    );
}

#[test]
fn unhealthy_gpus_are_not_candidates() {
    let node = pcie_pairs().replacen(
        "    count: 4\n    numaNode: 0\n",
        "    count: 1\n    numaNode: 0\n    health: Unhealthy\n  - model: NVIDIA RTX A6000\n    memoryMiB: 32768\n    count: 3\n    numaNode: 0\n",
        1,
    );
    let res = whole(&node, "");
    assert!(!res.devices[0].health.is_healthy() && res.devices[1].health.is_healthy());
    // The kubelet may still list it (a race with ListAndWatch): it goes last.
    let all: Vec<String> = res.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(indices(&res, &preferred(&res, &all, &[], 1)), [1]);
    assert_eq!(indices(&res, &preferred(&res, &all, &[], 2)), [2, 3]);
    assert_eq!(indices(&res, &preferred(&res, &all[..1], &[], 1)), [0]);
}

#[test]
fn renamed_whole_gpus_and_mig_devices_use_the_chooser() {
    // `replicas: 1` under a new name: whole GPUs, chosen by topology.
    let res = whole(
        &pcie_pairs(),
        "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-whole\n        replicas: 1\n",
    );
    assert_eq!(res.name.as_str(), "nvidia.com/gpu-whole");
    let avail: Vec<String> = [0, 1, 3, 4, 5, 6, 7]
        .iter()
        .map(|&g| id_of(&res, g))
        .collect();
    assert_eq!(indices(&res, &preferred(&res, &avail, &[], 1)), [3]);
    // MIG slices of one GPU count as linked: a size-2 request stays on one GPU.
    let node = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 2\n    mig:\n      devices:\n        - profile: 3g.40gb\n          count: 2\n";
    let inv = simulated::parse(std::path::Path::new("n.yaml"), node).unwrap();
    let built = build(&parse("flags:\n  migStrategy: single\n").unwrap(), &inv).unwrap();
    let res = built.plan.resources["nvidia.com/gpu"].clone();
    let avail: Vec<String> = [0usize, 2, 3]
        .iter()
        .map(|&p| res.devices[p].id.clone())
        .collect();
    assert_eq!(indices(&res, &preferred(&res, &avail, &[], 2)), [1, 1]);
    // Size 1: the lone slice on GPU 0, keeping GPU 1's two together.
    assert_eq!(indices(&res, &preferred(&res, &avail, &[], 1)), [0]);
}

fn replicas_of(node: &str, policy_flags: &str) -> Arc<ResourcePlan> {
    whole(
        node,
        &format!("{policy_flags}sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 4\n"),
    )
}

#[test]
fn packed_fills_one_gpu_before_the_next() {
    let packed = replicas_of(
        &dgx_h100(),
        "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n",
    );
    let spread = replicas_of(&dgx_h100(), "");
    assert_eq!(packed.shared_allocation, SharedAllocation::Packed);
    let all = |r: &ResourcePlan| r.devices.iter().map(|d| d.id.clone()).collect::<Vec<_>>();
    // One replica at a time, as the kubelet admits pods: packed stays on GPU 0 until it is full.
    let mut avail = all(&packed);
    let mut got = Vec::new();
    for _ in 0..5 {
        let one = preferred(&packed, &avail, &[], 1);
        avail.retain(|id| *id != one[0]);
        got.extend(indices(&packed, &one));
    }
    assert_eq!(got, [0, 0, 0, 0, 1]);
    // distributed: a new GPU each time.
    let mut avail = all(&spread);
    let mut got = Vec::new();
    for _ in 0..3 {
        let one = preferred(&spread, &avail, &[], 1);
        avail.retain(|id| *id != one[0]);
        got.extend(indices(&spread, &one));
    }
    assert_eq!(got, [0, 1, 2]);
    // A request of 3 on an empty node: one GPU; the most used GPU first.
    assert_eq!(
        indices(&packed, &preferred(&packed, &all(&packed), &[], 3)),
        [0, 0, 0]
    );
    // GPU 5 has three replicas in use: its last one, then the next GPU on its NUMA node.
    let gpu5 = packed.devices[20].gpu_uuid.clone();
    let busy: Vec<String> = all(&packed)
        .into_iter()
        .filter(|id| !id.starts_with(&gpu5) || id.ends_with("::3"))
        .collect();
    assert_eq!(indices(&packed, &preferred(&packed, &busy, &[], 2)), [4, 5]);
    assert_eq!(indices(&spread, &preferred(&spread, &busy, &[], 2)), [0, 1]);
    // Six replicas: GPU 0's four, then the GPU best linked to it on its NUMA node.
    assert_eq!(
        indices(&packed, &preferred(&packed, &all(&packed), &[], 6)),
        [0, 0, 0, 0, 1, 1]
    );
}

#[test]
fn distributed_replicas_prefer_linked_gpus() {
    let res = replicas_of(&dgx1(), "");
    let all: Vec<String> = res.devices.iter().map(|d| d.id.clone()).collect();
    // GPU 0, then its double-linked neighbour on its NUMA node (GPU 3), then the best linked
    // to both.
    assert_eq!(indices(&res, &preferred(&res, &all, &[], 2)), [0, 3]);
    assert_eq!(indices(&res, &preferred(&res, &all, &[], 3)), [0, 2, 3]);
    // A must_include replica's GPU counts for the links: with GPU 1's already the container's,
    // the next is GPU 1's double-linked neighbour (GPU 2), not the lowest index (GPU 0).
    let gpu1 = id_of(&res, 1);
    assert_eq!(
        indices(&res, &preferred(&res, &all, std::slice::from_ref(&gpu1), 2)),
        [1, 2]
    );
}

fn random_node() -> impl Strategy<Value = String> {
    (
        1u32..=40,
        prop::collection::vec((0u32..40, 0u32..40, 0u32..5, 0u32..4), 0..48),
        any::<bool>(),
        0u32..3,
    )
        .prop_map(|(n, links, nvswitch, numas)| {
            let mut s = "gpus:\n".to_string();
            for i in 0..n {
                s.push_str("  - model: X\n    memoryMiB: 1\n");
                if numas > 0 {
                    s.push_str(&format!("    numaNode: {}\n", i % numas));
                }
                if i % 7 == 3 {
                    s.push_str("    health: Unhealthy\n");
                }
            }
            let mut seen = std::collections::BTreeSet::new();
            let mut body = String::new();
            for (a, b, nv, pcie) in links {
                let (a, b) = (a % n, b % n);
                if a == b || !seen.insert((a.min(b), a.max(b))) {
                    continue;
                }
                body.push_str(&format!("  - gpus: [{a}, {b}]\n    nvlinks: {nv}\n"));
                if pcie > 0 {
                    let level = ["single", "multiple", "hostbridge"][pcie as usize - 1];
                    body.push_str(&format!("    pcie: {level}\n"));
                }
            }
            if !body.is_empty() {
                s.push_str("links:\n");
                s.push_str(&body);
            }
            if nvswitch {
                s.push_str("nvswitch: true\n");
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The answer is of the requested size when `available` has enough, lies within
    /// `available`, includes the `must_include` IDs that are in `available` (up to `size`),
    /// and IDs outside `available` or not of this resource change nothing about that.
    #[test]
    fn answers_are_within_available_and_of_the_size(
        node in random_node(),
        avail_mask in any::<u32>(),
        must_mask in any::<u32>(),
        size in 0usize..=41,
        foreign in any::<bool>(),
        replicated in any::<bool>(),
        packed in any::<bool>(),
    ) {
        let policy = match (replicated, packed) {
            (false, _) => String::new(),
            (true, p) => format!(
                "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: {}\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 2\n",
                if p { "packed" } else { "distributed" }
            ),
        };
        let res = whole(&node, &policy);
        let mut available: Vec<String> = res.devices.iter().enumerate()
            .filter(|(p, _)| avail_mask & (1 << (p % 32)) != 0)
            .map(|(_, d)| d.id.clone()).collect();
        // must_include: some of `available`, plus (whole devices) some that are not in it.
        let mut must: Vec<String> = res.devices.iter().enumerate()
            .filter(|(p, _)| must_mask & (1 << (p % 32)) != 0)
            .map(|(_, d)| d.id.clone())
            .filter(|id| !replicated || available.contains(id))
            .collect();
        if foreign {
            available.push("GPU-not-on-this-node".to_string());
            must.push("GPU-lost".to_string());
        }
        let got = preferred(&res, &available, &must, size);
        let known = available.iter().filter(|id| res.device(id).is_some()).count();
        prop_assert_eq!(got.len(), size.min(known), "{:?}", got);
        for id in &got {
            prop_assert!(available.contains(id), "{} not available", id);
        }
        let wanted: Vec<&String> = must.iter().filter(|id| available.contains(id)).take(size).collect();
        for id in wanted {
            prop_assert!(got.contains(id), "must_include {} missing from {:?}", id, got);
        }
        let mut dedup = got.clone();
        dedup.dedup();
        prop_assert_eq!(dedup.len(), got.len());
    }
}

#[test]
fn large_nodes_use_the_bounded_greedy_search() {
    // 32 GPUs in NVLink pairs, NUMA {0-15} {16-31}: C(30, 8) = 5,852,925 sets is over the
    // exact limit (EXACT_LIMIT).
    let mut node = gpus("NVIDIA H100 80GB HBM3", &[16, 16]);
    node.push_str("links:\n");
    for a in (0..32u32).step_by(2) {
        node.push_str(&format!("  - gpus: [{a}, {}]\n    nvlinks: 4\n", a + 1));
    }
    let res = whole(&node, "");
    let available: Vec<String> = (0..32)
        .filter(|g| *g != 0 && *g != 17)
        .map(|g| id_of(&res, g))
        .collect();
    let got = indices(&res, &preferred(&res, &available, &[], 8));
    assert_eq!(got.len(), 8);
    assert!(
        got.iter().all(|g| g / 16 == got[0] / 16),
        "one NUMA node: {got:?}"
    );
    // Four intact pairs, and neither orphan (1, 16) is taken.
    for g in &got {
        assert!(got.contains(&(g ^ 1)), "{g} without its pair in {got:?}");
    }
    // Size 1: an orphan.
    assert_eq!(indices(&res, &preferred(&res, &available, &[], 1)), [1]);
}

/// Six GPUs on one NUMA node with uneven NVLink counts, found by searching random layouts for
/// one where rule 3 decides between sets of equal link score only through the links the
/// chosen units have among themselves (with GPU 0 held, four GPUs: 1, 4, 5 beat 2, 4, 5).
fn uneven() -> String {
    let mut s = gpus("NVIDIA A100-SXM4-80GB", &[6]);
    s.push_str("links:\n");
    for (a, b, n) in [
        (0, 2, 1),
        (0, 3, 1),
        (0, 4, 2),
        (0, 5, 2),
        (1, 3, 2),
        (1, 5, 2),
        (2, 3, 2),
        (2, 5, 1),
        (3, 4, 1),
        (4, 5, 2),
    ] {
        s.push_str(&format!("  - gpus: [{a}, {b}]\n    nvlinks: {n}\n"));
    }
    s
}

/// The answer is the best set by the module's rules 1–3, checked against every combination
/// (a brute force written from the rules, not from the search), on the real layouts (and one
/// whose NVLinks all cross NUMA nodes, so rule 1 and rule 2 disagree) with each
/// single GPU already held (`must`) and some GPUs taken: on one NUMA node if any set is, then
/// the most links (with `must`), then the most links among the candidates left over.
#[test]
fn answers_are_the_best_set_by_the_rules() {
    fn combos(items: &[usize], k: usize) -> Vec<Vec<usize>> {
        if k == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for (i, &x) in items.iter().enumerate() {
            for mut rest in combos(&items[i + 1..], k - 1) {
                rest.insert(0, x);
                out.push(rest);
            }
        }
        out
    }
    let across = gpus("NVIDIA A100-SXM4-80GB", &[2, 2])
        + "links:\n  - gpus: [0, 2]\n    nvlinks: 4\n  - gpus: [1, 3]\n    nvlinks: 4\n";
    for node in [
        dgx1(),
        pcie_pairs(),
        workstation(),
        dgx_h100(),
        uneven(),
        across,
    ] {
        let res = whole(&node, "");
        let links = res.links();
        let unit = |id: &String| {
            let pos = res.devices.iter().position(|d| d.id == *id).unwrap();
            links.unit_of(pos)
        };
        let pairs = |set: &[usize]| -> i64 {
            let mut s = 0i64;
            for (i, &a) in set.iter().enumerate() {
                for &b in &set[i + 1..] {
                    s += i64::from(links.score(a, b));
                }
            }
            s
        };
        let score = |chosen: &[usize], must: &[usize], candidates: &[usize]| {
            let all: Vec<usize> = must.iter().chain(chosen).copied().collect();
            let one_numa = all.windows(2).all(|w| links.numa(w[0]) == links.numa(w[1]));
            let left: Vec<usize> = candidates
                .iter()
                .copied()
                .filter(|c| !chosen.contains(c))
                .collect();
            (one_numa, pairs(&all), pairs(&left))
        };
        let n = res.devices.len();
        for held in 0..n {
            for taken in [None, Some((held + 3) % n)] {
                let available: Vec<String> = res
                    .devices
                    .iter()
                    .enumerate()
                    .filter(|(p, _)| Some(*p) != taken)
                    .map(|(_, d)| d.id.clone())
                    .collect();
                let must_id = vec![res.devices[held].id.clone()];
                let must = vec![unit(&must_id[0])];
                let candidates: Vec<usize> = available
                    .iter()
                    .map(&unit)
                    .filter(|u| !must.contains(u))
                    .collect();
                for size in 2..=4usize.min(candidates.len() + 1) {
                    let got = preferred(&res, &available, &must_id, size);
                    let chosen: Vec<usize> = got
                        .iter()
                        .map(&unit)
                        .filter(|u| !must.contains(u))
                        .collect();
                    let best = combos(&candidates, size - 1)
                        .iter()
                        .map(|c| score(c, &must, &candidates))
                        .max()
                        .unwrap();
                    assert_eq!(
                        score(&chosen, &must, &candidates),
                        best,
                        "held GPU {held}, taken {taken:?}, size {size}: got {chosen:?}"
                    );
                }
            }
        }
    }
}

/// The score GetPreferredAllocation logs with its answer is the sum of the chosen units'
/// pairwise link scores (each pair once).
#[test]
fn the_preferred_answer_carries_the_sum_of_its_pairs_link_scores() {
    let res = whole(&dgx1(), "");
    let all: Vec<String> = (0..8).map(|g| id_of(&res, g)).collect();
    let links = res.links();
    for size in [1, 2, 3, 4] {
        let got = preferred_scored(&res, &all, &[], size);
        let units: Vec<usize> = got
            .ids
            .iter()
            .map(|id| links.unit_of(res.position(id).unwrap()))
            .collect();
        let mut want = 0u64;
        for (i, &a) in units.iter().enumerate() {
            for &b in &units[i + 1..] {
                want += u64::from(links.score(a, b));
            }
        }
        assert_eq!(got.score, want, "size {size}: {:?}", got.ids);
        assert_eq!(got.score > 0, size > 1, "size {size}");
    }
}
