//! Unit tests of the simulated node's use samples (utilisation, memory, processes).

use super::*;

const H100: &str = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n";

fn samples(text: &str) -> Vec<GpuSample> {
    parse_all(Path::new("n.yaml"), text, &MigState::default())
        .unwrap()
        .samples
}

#[test]
fn use_figures_are_reported() {
    let text = format!("{H100}    utilization: 40\n    processes:\n      - pid: 4242\n        smUtil: 30\n        memoryMiB: 10240\n      - pid: 4343\n        smUtil: 10\n        memoryMiB: 2048\n      - pid: 4444\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 2\n    utilization: 5\n    memoryUsedMiB: 100\n");
    let s = samples(&text);
    assert_eq!(s.len(), 3);
    let inv = parse(Path::new("n.yaml"), &text).unwrap();
    assert_eq!(s[0].uuid, inv.gpus[0].uuid);
    assert_eq!((s[0].index, s[0].utilization_percent), (0, Some(40)));
    assert_eq!(
        s[0].memory_used_bytes,
        Some(12288 * MIB),
        "the processes' sum"
    );
    assert_eq!(s[0].memory_total_bytes, Some(81559 * MIB));
    let p: Vec<(u32, Option<u32>, Option<u64>)> = s[0]
        .processes
        .iter()
        .map(|p| (p.pid, p.sm_util_percent, p.memory_used_bytes))
        .collect();
    assert_eq!(
        p,
        [
            (4242, Some(30), Some(10240 * MIB)),
            (4343, Some(10), Some(2048 * MIB)),
            (4444, Some(0), Some(0)),
        ]
    );
    for g in &s[1..] {
        assert_eq!(g.utilization_percent, Some(5));
        assert_eq!(g.memory_used_bytes, Some(100 * MIB));
        assert!(g.processes.is_empty() && g.mig.is_empty());
    }
    assert_eq!(s[2].index, 2);
    // Nothing said: no utilisation, nothing in use.
    let s = samples(H100);
    assert_eq!(
        (s[0].utilization_percent, s[0].memory_used_bytes),
        (None, Some(0))
    );
}

#[test]
fn the_shipped_busy_node_has_the_demo_processes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodes/h100-80gb-x8-busy.yaml");
    let s = SimulatedSource::new(&path).sample().unwrap();
    assert_eq!(s.len(), 8);
    let sm: Vec<(u32, Option<u32>)> = s[0]
        .processes
        .iter()
        .map(|p| (p.pid, p.sm_util_percent))
        .collect();
    assert_eq!(sm, [(4242, Some(30)), (4343, Some(10))]);
    assert!(s[1..].iter().all(|g| g.processes.is_empty()));
}

#[test]
fn mig_devices_report_memory_only() {
    let text = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n        - profile: 3g.40gb\n          memoryUsedMiB: 30000\n        - profile: 1g.10gb\n          count: 2\n          memoryUsedMiB: 512\n";
    let s = samples(text);
    let inv = parse(Path::new("n.yaml"), text).unwrap();
    let m: Vec<(&str, Option<u64>, Option<u64>)> = s[0]
        .mig
        .iter()
        .map(|m| (m.uuid.as_str(), m.memory_used_bytes, m.memory_total_bytes))
        .collect();
    let d = &inv.gpus[0].mig_devices;
    assert_eq!(
        m,
        [
            (d[0].uuid.as_str(), Some(30000 * MIB), Some(40 * 1024 * MIB)),
            (d[1].uuid.as_str(), Some(512 * MIB), Some(10 * 1024 * MIB)),
            (d[2].uuid.as_str(), Some(512 * MIB), Some(10 * 1024 * MIB)),
        ]
    );
    assert!(s[0].mig.iter().all(|m| m.utilization_percent.is_none()));
    assert_eq!(
        s[0].memory_used_bytes,
        Some(31024 * MIB),
        "the MIG devices' sum"
    );
    assert!(s[0].processes.is_empty());
}

#[test]
fn a_live_edit_changes_the_next_sample_and_a_broken_file_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("n.yaml");
    let node = |sm: u32| format!("{H100}    processes:\n      - pid: 7\n        smUtil: {sm}\n");
    std::fs::write(&p, node(30)).unwrap();
    let mut src = SimulatedSource::new(&p);
    assert_eq!(
        src.sample().unwrap()[0].processes[0].sm_util_percent,
        Some(30)
    );
    std::fs::write(&p, node(0)).unwrap();
    assert_eq!(
        src.sample().unwrap()[0].processes[0].sm_util_percent,
        Some(0)
    );
    std::fs::write(&p, node(101)).unwrap();
    let e = src.sample().unwrap_err().to_string();
    assert!(e.contains("gpus[0].processes[0].smUtil"), "{e}");
}

/// `memoryLimits`: read back per (GPU, cgroup) on an R615 node with cgroup v2, no limit for a
/// cgroup not listed; unsupported on an older driver or cgroup v1; bad entries refused with
/// their path.
#[test]
fn memory_limits_are_read_back_where_the_node_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("n.yaml");
    let limits = "    memoryLimits:\n      - {cgroup: /kubepods/pod-a/ctr, hardMiB: 20480, softMiB: 16384}\n";
    let write = |tail: &str| std::fs::write(&p, format!("{H100}{limits}{tail}")).unwrap();
    write("driverVersion: \"615.20\"\n");
    let mut s = SimulatedSource::new(&p);
    let uuid = s.sample().unwrap()[0].uuid.clone();
    assert_eq!(s.memory_limits_supported(&uuid), Some(true));
    assert_eq!(
        s.memory_limits(&uuid, "/kubepods/pod-a/ctr"),
        LimitsRead::Read(LimitReading {
            soft: 16384 * MIB,
            hard: 20480 * MIB,
            used: 0
        })
    );
    assert_eq!(
        s.memory_limits(&uuid, "/kubepods/pod-b/ctr"),
        LimitsRead::Read(LimitReading {
            soft: 0,
            hard: NO_HARD_LIMIT,
            used: 0
        })
    );
    for tail in [
        "driverVersion: \"580.10\"\n",
        "driverVersion: \"615.20\"\ncgroupVersion: 1\n",
        "",
    ] {
        write(tail);
        s.sample().unwrap();
        assert_eq!(s.memory_limits_supported(&uuid), Some(false), "{tail}");
        assert_eq!(
            s.memory_limits(&uuid, "/kubepods/pod-a/ctr"),
            LimitsRead::Unsupported,
            "{tail}"
        );
    }
    for (entry, at, says) in [
        (
            "{cgroup: kubepods/x, hardMiB: 1}",
            "gpus[0].memoryLimits[0].cgroup",
            "absolute",
        ),
        (
            "{cgroup: /kubepods/../x, hardMiB: 1}",
            "gpus[0].memoryLimits[0].cgroup",
            "absolute",
        ),
        (
            "{cgroup: /x, hardMiB: 90000}",
            "gpus[0].memoryLimits[0].hardMiB",
            "81559",
        ),
        (
            "{cgroup: /x, hardMiB: 10, softMiB: 11}",
            "gpus[0].memoryLimits[0].softMiB",
            "hardMiB",
        ),
    ] {
        let text = format!("{H100}    memoryLimits:\n      - {entry}\n");
        let e = parse_all(Path::new("n.yaml"), &text, &MigState::default())
            .err()
            .unwrap();
        let InventoryError::SimulatedInvalid {
            path_in_file,
            message,
            ..
        } = &e
        else {
            panic!("{e}");
        };
        assert_eq!(path_in_file, at, "{entry}");
        assert!(message.contains(says), "{entry}: {message}");
    }
}
