//! 10. GPU use: `/metrics` rendered with 2,688 devices and 500 containers holding them
//!     (every GPU-use series filled), one attribution pass (a sample) and the /status view.

use std::time::Instant;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let quick = b.quick;
    use slicelet::usage::report::{synthetic_node, Usage};
    let metrics = slicelet::status::Metrics::new();
    let (plan, in_use, samples) = synthetic_node(8, 336, 500);
    let mut usage = Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    metrics.set_plan(&plan);
    let rounds = if quick { 50 } else { 500 };
    let (mut render, mut sample, mut view) = (hist(), hist(), hist());
    let mut bytes = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let text = std::hint::black_box(metrics.encode());
        render.record(t.elapsed().as_nanos() as u64).unwrap();
        bytes = text.len();
        let t = Instant::now();
        usage.sampled(&samples, &plan, &in_use, metrics.usage());
        sample.record(t.elapsed().as_nanos() as u64).unwrap();
        let t = Instant::now();
        std::hint::black_box(usage.view(&plan, &in_use));
        view.record(t.elapsed().as_nanos() as u64).unwrap();
    }
    table.row(
        "10. /metrics render, 2,688 devices, 500 containers",
        format!(
            "p50 {:.2} ms, p99 {:.2} ms ({} KiB)",
            ms(&render, 0.5),
            ms(&render, 0.99),
            bytes / 1024
        ),
        "< 5 ms",
        Some(ms(&render, 0.99) < 5.0),
    );
    table.row(
        "10. one sample attributed (Usage::sampled) / /status view",
        format!("p50 {:.2} / {:.2} ms", ms(&sample, 0.5), ms(&view, 0.5)),
        "",
        None,
    );
}
