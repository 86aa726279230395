//! Hostile and broken simulated node files (issue 15).

use std::path::Path;

use super::*;

fn err(text: &str) -> String {
    parse(Path::new("n.yaml"), text).unwrap_err().to_string()
}

#[test]
fn a_fifo_node_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("node.yaml");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(SimulatedSource::new(fifo).discover().map(|_| ()));
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("discover blocked on a FIFO")
        .unwrap_err();
    assert!(crate::errors::chain(&e).contains("FIFO"), "{e}");
}

#[test]
fn nesting_and_bom() {
    let deep = format!(
        "gpus:\n  - model: {}{}\n    memoryMiB: 1\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(
        err(&deep).contains("deeper than 64 levels"),
        "{}",
        err(&deep)
    );
    let inv = parse(
        Path::new("n.yaml"),
        "\u{feff}gpus:\n  - model: X\n    memoryMiB: 1\n",
    )
    .unwrap();
    assert_eq!(inv.gpus.len(), 1);
}

#[test]
fn a_uuid_that_could_traverse_a_path_is_refused_with_its_field_path() {
    let e = err("gpus:\n  - model: X\n    memoryMiB: 1\n    uuid: \"GPU-/../../victim3\"\n");
    assert!(
        e.contains("gpus[0].uuid: `GPU-/../../victim3` is not a GPU or MIG UUID"),
        "{e}"
    );
    let e = err("gpus:\n  - model: X\n    memoryMiB: 1\n    uuid: MIG-11111111-2222-3333-4444-000000000002\n");
    assert!(
        e.contains(
            "gpus[0].uuid: `MIG-11111111-2222-3333-4444-000000000002` does not start with GPU-"
        ),
        "{e}"
    );
    let inv = parse(
        Path::new("n.yaml"),
        "gpus:\n  - model: X\n    memoryMiB: 1\n    uuid: GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416\n",
    )
    .unwrap();
    assert_eq!(inv.gpus[0].uuid, "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416");
}

#[test]
fn policy_devices_refuse_uuids_with_slashes() {
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        devices: [\"GPU-/../../victim3\"]\n        replicas: 2\n";
    let e = crate::policy::parse(text).unwrap_err();
    assert_eq!(e.path, "sharing.timeSlicing.resources[0].devices[0]");
    assert!(e.message.contains("is not a GPU or MIG UUID"), "{e}");
}

#[test]
fn counts_are_bounded_before_anything_is_expanded() {
    let e = err("gpus:\n  - model: X\n    memoryMiB: 1\n    count: 4294967295\n");
    assert!(
        e.contains("gpus[0].count: 4294967295 is more than the 64 GPUs"),
        "{e}"
    );
    let e = err("gpus:\n  - model: X\n    memoryMiB: 1\n    count: 40\n  - model: X\n    memoryMiB: 1\n    count: 25\n");
    assert!(
        e.contains("gpus[1].count: the node would have more than 64 GPUs"),
        "{e}"
    );
    let inv = parse(
        Path::new("n.yaml"),
        "gpus:\n  - model: X\n    memoryMiB: 1\n    count: 40\n  - model: X\n    memoryMiB: 1\n    count: 24\n",
    )
    .unwrap();
    assert_eq!(inv.gpus.len(), MAX_GPUS as usize);
    let mig = |count: &str| {
        format!("gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    mig:\n      devices:\n        - profile: 1c.1g.5gb\n          count: {count}\n")
    };
    // Refused before expanding (an expansion of 4294967295 devices would not finish).
    let e = err(&mig("4294967295"));
    assert!(
        e.contains("gpus[0].mig.devices: the MIG devices use more than the GPU's 7 GPU slices"),
        "{e}"
    );
    assert_eq!(
        parse(Path::new("n.yaml"), &mig("7")).unwrap().gpus[0]
            .mig_devices
            .len(),
        7
    );
}

#[test]
fn use_figures_are_checked_with_their_paths() {
    let gpu = "gpus:\n  - model: X\n    memoryMiB: 1000\n";
    let procs = |list: &str| format!("{gpu}    processes:\n{list}");
    let many: String = (1..=1025)
        .map(|pid| format!("      - pid: {pid}\n"))
        .collect();
    let cases = [
        (format!("{gpu}    utilization: 101\n"), "gpus[0].utilization: 101 is more than 100 (percent)"),
        (format!("{gpu}    utilization: -1\n"), "gpus[0].utilization"),
        (format!("{gpu}    memoryUsedMiB: 1001\n"), "gpus[0].memoryUsedMiB: 1001 MiB is more than the GPU's 1000 MiB"),
        (procs("      - pid: 0\n"), "gpus[0].processes[0].pid: must be positive"),
        (procs("      - pid: -4\n"), "gpus[0].processes[0].pid"),
        (procs("      - pid: 1\n      - pid: 2\n      - pid: 1\n"), "gpus[0].processes[2].pid: PID 1 is listed already at processes[0]"),
        (procs("      - pid: 1\n      - pid: 2\n        smUtil: 200\n"), "gpus[0].processes[1].smUtil: 200 is more than 100 (percent)"),
        (procs("      - pid: 1\n        memoryMiB: 1001\n"), "gpus[0].processes[0].memoryMiB: 1001 MiB is more than the GPU's 1000 MiB"),
        (procs("      - pid: 1\n        memoryMiB: 600\n      - pid: 2\n        memoryMiB: 600\n"), "gpus[0].processes: the processes use 1200 MiB, more than the GPU's 1000 MiB"),
        (procs("      - pid: 1\n        sm: 3\n"), "gpus[0].processes[0].sm: unknown field `sm`"),
        (procs(&many), "gpus[0].processes: 1025 processes, more than the 1024"),
        (format!("{gpu}    count: 2\n    processes:\n      - pid: 1\n"), "gpus[0].processes: only allowed when count is 1 (a PID runs on one GPU)"),
        (format!("{gpu}    mig:\n      devices: []\n    processes:\n      - pid: 1\n"), "gpus[0].processes: not allowed on a MIG-enabled GPU"),
        ("gpus:\n  - model: X\n    memoryMiB: 81559\n    mig:\n      devices:\n        - profile: 1g.10gb\n          memoryUsedMiB: 10241\n".to_string(), "gpus[0].mig.devices[0].memoryUsedMiB: 10241 MiB is more than the 10240 MiB of a 1g.10gb"),
    ];
    for (text, want) in cases {
        let e = err(&text);
        assert!(e.contains(want), "{want}: {e}");
    }
    // At the limit: accepted.
    let at_limit: String = (1..=1024)
        .map(|pid| format!("      - pid: {pid}\n"))
        .collect();
    assert!(parse(Path::new("n.yaml"), &procs(&at_limit)).is_ok());
}
