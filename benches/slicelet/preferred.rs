//! 2. GetPreferredAllocation over 2,688 available IDs (8 GPUs x 7 MIG slices x 48 replicas),
//!    and for whole GPUs by topology.

use std::path::Path;
use std::time::Instant;

use slicelet::plan;
use slicelet::{allocate, policy};

use crate::harness::*;

/// GetPreferredAllocation over 2,688 available IDs (8 GPUs x 7 MIG slices x 48 replicas).
pub fn mig_ids(b: &Bench, mig: &MigNode, table: &mut Table) {
    let scale = b.scale;
    let MigNode { res: big_res, .. } = mig;
    let mut avail: Vec<String> = big_res.devices.iter().map(|d| d.id.clone()).collect();
    shuffle(&mut avail);
    for size in [1usize, 4, 8] {
        let mut h = hist();
        for _ in 0..(2_000 / scale) {
            let t = Instant::now();
            let got = allocate::preferred(big_res, &avail, &[], size);
            h.record(t.elapsed().as_nanos() as u64).unwrap();
            assert_eq!(got.len(), size);
        }
        table.row(
            format!("2. GetPreferredAllocation, 2,688 available, size {size}"),
            format!(
                "p50 {:.0} us, p99 {:.0} us",
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99))
            ),
            "",
            None,
        );
    }
}

/// GetPreferredAllocation for whole GPUs by topology: DGX-1 (8 GPUs, NVLink cube-mesh) and a
/// 16-GPU node (NVLink pairs, two NUMA nodes); sizes 1, 2, 4, 8 with two GPUs taken, in one
/// histogram per node (size 8 of 16 is the exact search's worst case, 12,870 sets).
pub fn whole_gpus(b: &Bench, table: &mut Table) {
    let scale = b.scale;
    let mut sixteen = "gpus:\n".to_string();
    for numa in 0..2 {
        sixteen.push_str(&format!("  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 8\n    numaNode: {numa}\n"));
    }
    sixteen.push_str("links:\n");
    for a in 0..16u32 {
        for b in a + 1..16 {
            if a / 2 == b / 2 {
                sixteen.push_str(&format!(
                    "  - gpus: [{a}, {b}]\n    nvlinks: 4\n    pcie: single\n"
                ));
            } else if a / 4 == b / 4 {
                sixteen.push_str(&format!("  - gpus: [{a}, {b}]\n    pcie: hostbridge\n"));
            }
        }
    }
    let nodes = [
        (
            8,
            include_str!("../../config/nodes/v100-16gb-x8-dgx1.yaml").to_string(),
        ),
        (16, sixteen),
    ];
    for (n, text) in nodes {
        let inv = slicelet::inventory::simulated::parse(Path::new("node"), &text).unwrap();
        let built = plan::build(&policy::Policy::default(), &inv).unwrap().plan;
        let res = built.resources["nvidia.com/gpu"].clone();
        assert_eq!(res.devices.len(), n);
        let mut avail: Vec<String> = res.devices.iter().map(|d| d.id.clone()).collect();
        avail.remove(5);
        avail.remove(2);
        shuffle(&mut avail);
        let mut h = hist();
        for _ in 0..(500 / scale) {
            for size in [1usize, 2, 4, 8] {
                let t = Instant::now();
                let got = allocate::preferred(&res, &avail, &[], size);
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                assert_eq!(got.len(), size.min(avail.len()));
            }
        }
        let p99 = h.value_at_quantile(0.99);
        table.row(
            format!("2. GetPreferredAllocation whole GPUs, {n} GPUs (sizes 1-8)"),
            format!(
                "p50 {:.0} us, p99 {:.0} us",
                us(h.value_at_quantile(0.5)),
                us(p99)
            ),
            "p99 < 1 ms",
            Some(p99 < 1_000_000),
        );
    }
}
