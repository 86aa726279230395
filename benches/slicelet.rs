//! slicelet's hot paths, measured side by side with the physical floor in one run.
//!
//! `cargo bench --bench slicelet` prints one table. Latencies are measured with hdrhistogram;
//! ratios compare slicelet with a bare tonic server on a unix socket that answers the same
//! unary call with a response of the same size and does no work (the floor). These machines
//! are shared and noisy, so the two are measured in alternating rounds and the ratio matters
//! more than the absolute figure. `--quick` runs fewer iterations; `--only 6,11` runs those figures.
//!
//! One module per figure (row of the table, numbered as in the output) under `benches/slicelet/`
//! (`#[path]`: a bench's root is not a directory module); `harness` holds what they share.

#[path = "slicelet/allocate_latency.rs"]
mod allocate_latency;
#[path = "slicelet/dra_sockets.rs"]
mod dra_sockets;
#[path = "slicelet/gpu_use.rs"]
mod gpu_use;
#[path = "slicelet/harness.rs"]
mod harness;
#[path = "slicelet/hostile_policy.rs"]
mod hostile_policy;
#[path = "slicelet/lifecycle.rs"]
mod lifecycle;
#[path = "slicelet/list_and_watch.rs"]
mod list_and_watch;
#[path = "slicelet/memory.rs"]
mod memory;
#[path = "slicelet/node_label.rs"]
mod node_label;
#[path = "slicelet/plan_build.rs"]
mod plan_build;
#[path = "slicelet/preferred.rs"]
mod preferred;
#[path = "slicelet/sampler_cpu.rs"]
mod sampler_cpu;
#[path = "slicelet/slow_nvml.rs"]
mod slow_nvml;

use harness::{hostname, runtime, Bench, MigNode, Table};

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `--only 6,11`: just those figures (the number before the dot of each row).
    let only: Option<Vec<u32>> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect());
    let wanted = |n: u32| only.as_ref().is_none_or(|o| o.contains(&n));
    let scale = if quick { 10 } else { 1 };
    println!(
        "slicelet benchmarks on {} ({} CPUs){}",
        hostname(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        if quick { ", --quick" } else { "" }
    );
    println!("{:<58} {:<44} GOAL", "FIGURE", "VALUE");
    let mut table = Table(Vec::new());
    let tmp = tempfile::tempdir().unwrap();
    let server_rt = runtime(2);
    let client_rt = runtime(2);
    let b = Bench {
        quick,
        scale,
        tmp,
        server_rt,
        client_rt,
    };

    if wanted(1) {
        allocate_latency::run(&b, &mut table);
    }
    let mig = MigNode::new();
    if wanted(2) {
        preferred::mig_ids(&b, &mig, &mut table);
        preferred::whole_gpus(&b, &mut table);
    }
    if wanted(3) {
        list_and_watch::run(&b, &mig, &mut table);
    }
    if wanted(4) {
        plan_build::run(&b, &mig, &mut table);
    }
    if wanted(5) {
        lifecycle::run(&b, &mut table);
    }
    if wanted(6) {
        memory::run(&b, &mut table);
    }
    if wanted(7) {
        slow_nvml::run(&b, &mut table);
    }
    if wanted(8) {
        hostile_policy::run(&b, &mut table);
    }
    if wanted(9) {
        node_label::run(&b, &mut table);
    }
    if wanted(10) {
        gpu_use::run(&b, &mut table);
    }
    if wanted(11) {
        sampler_cpu::run(&b, &mut table);
    }
    if wanted(12) {
        dra_sockets::run(&b, &mut table);
    }

    let missed: Vec<&str> = table
        .0
        .iter()
        .filter(|r| r[3] == "MISSED")
        .map(|r| r[0].as_str())
        .collect();
    if !missed.is_empty() {
        println!("\nmissed goals: {}", missed.join("; "));
    }
}
