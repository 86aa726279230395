//! 4. plan build for the 2,688-device node: time and allocations.

use std::sync::atomic::Ordering;
use std::time::Instant;

use slicelet::plan;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, mig: &MigNode, table: &mut Table) {
    let scale = b.scale;
    let MigNode {
        policy: big_policy,
        node: big_node,
        ..
    } = mig;
    let mut h = hist();
    for _ in 0..(200 / scale) {
        let t = Instant::now();
        let p = plan::build(big_policy, big_node).unwrap();
        h.record(t.elapsed().as_nanos() as u64).unwrap();
        std::hint::black_box(p);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    let p = plan::build(big_policy, big_node).unwrap();
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    drop(p);
    table.row(
        "4. plan build, 2,688 devices",
        format!(
            "p50 {:.0} us, {allocs} allocations",
            us(h.value_at_quantile(0.5))
        ),
        "",
        None,
    );
}
