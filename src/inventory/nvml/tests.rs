//! Unit tests of the NVML source: Xid instance ids, bus ids, the process join, the fake NVML, and
//! (ignored without a driver) a real GPU.

use super::events::{EventTarget, WHOLE_GPU};
use super::sample::{join_processes, UtilSample};
use super::*;
use crate::inventory::mig::Profile;
use crate::inventory::sample::ProcessSample;
use crate::inventory::{CreatedMig, MigPlacement};

#[test]
fn xid_instance_ids_select_devices() {
    let t = EventTarget {
        index: 0,
        uuid: "GPU-0".into(),
        migs: vec![
            (2, 0, "MIG-a".into()),
            (2, 1, "MIG-b".into()),
            (3, 0, "MIG-c".into()),
        ],
    };
    assert_eq!(t.uuids_for(WHOLE_GPU, WHOLE_GPU), ["GPU-0"]);
    assert_eq!(t.uuids_for(2, 1), ["MIG-b"]);
    // Regression: a GPU-instance-scoped Xid marked only the first compute instance.
    assert_eq!(t.uuids_for(2, WHOLE_GPU), ["MIG-a", "MIG-b"]);
    assert_eq!(t.uuids_for(9, 0), ["GPU-0"]);
}

#[test]
fn bus_id_to_sysfs_form() {
    assert_eq!(sysfs_bus_id("00000000:17:00.0"), "0000:17:00.0");
    assert_eq!(sysfs_bus_id("00000000:AF:1F.7"), "0000:af:1f.7");
    assert_eq!(sysfs_bus_id("0000:17:00.0"), "0000:17:00.0");
}

/// On a node with an NVIDIA driver: `cargo test --lib real_gpu -- --ignored --nocapture`.
#[test]
#[ignore = "needs an NVIDIA driver"]
fn real_gpu_enumeration_is_consistent() {
    let mut source = NvmlSource::new(None, None).expect("NVML");
    let inv = source.discover().expect("discovery");
    assert!(!inv.gpus.is_empty());
    for g in &inv.gpus {
        eprintln!(
            "GPU {} {} {} MiB mig={} ({} MIG devices)",
            g.index,
            g.model,
            g.memory_mib,
            g.mig_enabled,
            g.mig_devices.len()
        );
        assert!(g.uuid.starts_with("GPU-"), "{}", g.uuid);
        if !g.mig_enabled {
            assert!(g.mig_devices.is_empty());
        }
        for m in &g.mig_devices {
            eprintln!(
                "  MIG {}:{} {} {} GI {} CI {} {} MiB caps {:?}",
                g.index, m.index, m.uuid, m.profile, m.gi_id, m.ci_id, m.memory_mib, m.caps
            );
            assert!(m.uuid.starts_with("MIG-"), "{}", m.uuid);
            assert!(Profile::parse(&m.profile).is_some(), "{}", m.profile);
            assert!(m.memory_mib > 0 && m.memory_mib <= g.memory_mib);
            assert!(m.gpu_slices >= 1 && m.compute_slices <= m.gpu_slices);
        }
    }
}

#[test]
fn process_lists_and_samples_join_by_pid() {
    let p = |pid: u32, sm: Option<u32>, mem: Option<u64>| ProcessSample {
        pid,
        sm_util_percent: sm,
        memory_used_bytes: mem,
        ..Default::default()
    };
    type Case<'a> = (
        &'a [(u32, Option<u64>)],
        Option<&'a [UtilSample]>,
        Vec<ProcessSample>,
    );
    let cases: Vec<Case> = vec![
        // Two processes with their own SM %.
        (
            &[(20, Some(2)), (10, Some(1))],
            Some(&[(10, 5, 30), (20, 5, 10)]),
            vec![p(10, Some(30), Some(1)), p(20, Some(10), Some(2))],
        ),
        // Several samples of one PID: the newest counts, whatever the order.
        (
            &[(10, Some(1))],
            Some(&[(10, 9, 70), (10, 12, 40), (10, 11, 90)]),
            vec![p(10, Some(40), Some(1))],
        ),
        // Listed without a sample (or NOT_FOUND: no samples): idle.
        (
            &[(10, Some(1)), (20, None)],
            Some(&[]),
            vec![p(10, Some(0), Some(1)), p(20, Some(0), None)],
        ),
        // The utilisation query failed: unknown.
        (&[(10, Some(1))], None, vec![p(10, None, Some(1))]),
        // In both lists (compute and MPS): once, memory from the first that gives it.
        (
            &[(10, None), (10, Some(3)), (10, Some(4))],
            Some(&[(10, 1, 5)]),
            vec![p(10, Some(5), Some(3))],
        ),
        // Only in the samples: no memory figure. Over 100: capped.
        (&[], Some(&[(30, 1, 250)]), vec![p(30, Some(100), None)]),
        (&[], None, vec![]),
    ];
    for (listed, samples, want) in cases {
        assert_eq!(
            join_processes(listed, samples),
            want,
            "{listed:?} {samples:?}"
        );
    }
}

const FAKE_LIB: &str = "SLICELET_TEST_FAKE_NVML";
/// The fake sysfs root [`fake_nvml_child`] discovers with.
const FAKE_SYSFS: &str = "SLICELET_TEST_FAKE_SYSFS";

/// Runs [`fake_nvml_child`] in a child process (the fake NVML reads its inventory from the
/// environment at init, and its state is process-wide).
#[test]
fn sample_against_the_fake_nvml() {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} missing: fake-nvml is a dev-dependency",
        lib.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let inv = dir.path().join("inventory.json");
    std::fs::write(
        &inv,
        r#"{"gpus": [
          {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
           "memoryMiB": 81559, "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0",
           "utilization": {"gpu": 40, "memory": 12},
           "processes": [{"pid": 4343, "smUtil": 10, "usedMemoryMiB": 2048, "mps": true},
                         {"pid": 4242, "smUtil": 30, "usedMemoryMiB": 10240},
                         {"pid": 4444, "usedMemoryMiB": 100}]},
          {"uuid": "GPU-22222222-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
           "memoryMiB": 81559, "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:18:00.0",
           "migMode": 1,
           "migDevices": [{"uuid": "MIG-22222222-2222-3333-4444-000000000000", "profile": "3g.40gb",
                           "memoryMiB": 40320, "giId": 1, "ciId": 0},
                          null,
                          {"uuid": "MIG-22222222-2222-3333-4444-000000000002", "profile": "1g.10gb",
                           "memoryMiB": 9856, "giId": 9, "ciId": 0}]},
          {"uuid": "GPU-33333333-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
           "memoryMiB": 81559, "minor": 2, "computeCapability": [9, 0], "pciBusId": "00000000:19:00.0",
           "lost": true}
        ]}"#,
    )
    .unwrap();
    // GPU 0 (bus 17) below root complex pci0000:16 on NUMA node 1; GPU 1 absent from sysfs.
    let sysfs = dir.path().join("sys");
    fake_sysfs(&sysfs, "pci0000:16", "0000:17:00.0", "1\n");
    let out = std::process::Command::new(exe)
        .args([
            "inventory::nvml::tests::fake_nvml_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAKE_NVML_INVENTORY", &inv)
        .env(FAKE_LIB, &lib)
        .env(FAKE_SYSFS, &sysfs)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// The body of [`sample_against_the_fake_nvml`]; does nothing outside it.
#[test]
#[ignore = "run by sample_against_the_fake_nvml in a child process"]
fn fake_nvml_child() {
    let Some(lib) = std::env::var_os(FAKE_LIB) else {
        return;
    };
    const MIB: u64 = 1024 * 1024;
    let mut src = NvmlSource::new(Some(Path::new(&lib)), None).expect("fake NVML");
    let first = src.sample().unwrap();
    // The lost GPU is left out; the MIG GPU has MIG figures and no processes.
    assert_eq!(first.len(), 2, "{first:#?}");
    let g = &first[0];
    assert_eq!(g.uuid, "GPU-11111111-2222-3333-4444-555555555555");
    assert_eq!((g.index, g.model.as_str()), (0, "NVIDIA H100 80GB HBM3"));
    assert_eq!(g.utilization_percent, Some(40));
    assert_eq!(g.memory_used_bytes, Some((10240 + 2048 + 100) * MIB));
    assert_eq!(g.memory_total_bytes, Some(81559 * MIB));
    let procs = |s: &GpuSample| -> Vec<(u32, Option<u32>, Option<u64>)> {
        s.processes
            .iter()
            .map(|p| (p.pid, p.sm_util_percent, p.memory_used_bytes))
            .collect()
    };
    assert_eq!(
        procs(g),
        [
            (4242, Some(30), Some(10240 * MIB)),
            (4343, Some(10), Some(2048 * MIB)), // an MPS client
            (4444, Some(0), Some(100 * MIB)),   // listed, no samples: idle
        ]
    );
    assert_eq!(
        src.last_seen.get(&g.uuid),
        Some(&1_000_000),
        "the newest sample's time is kept"
    );
    let m = &first[1];
    assert_eq!(
        m.utilization_percent, None,
        "not in the inventory: NotSupported"
    );
    assert!(m.processes.is_empty());
    let mig: Vec<(&str, Option<u64>, Option<u64>)> = m
        .mig
        .iter()
        .map(|x| (x.uuid.as_str(), x.memory_used_bytes, x.memory_total_bytes))
        .collect();
    assert_eq!(
        mig,
        [
            (
                "MIG-22222222-2222-3333-4444-000000000000",
                Some(0),
                Some(40320 * MIB)
            ),
            (
                "MIG-22222222-2222-3333-4444-000000000002",
                Some(0),
                Some(9856 * MIB)
            ),
        ]
    );
    // Asked with the newest time seen: NOT_FOUND, nothing new, every process idle.
    let second = src.sample().unwrap();
    assert_eq!(
        procs(&second[0]),
        [
            (4242, Some(0), Some(10240 * MIB)),
            (4343, Some(0), Some(2048 * MIB)),
            (4444, Some(0), Some(100 * MIB)),
        ]
    );
    assert_eq!(src.last_seen.get(&g.uuid), Some(&1_000_000));
    // The fake's clock moved on: new samples since the kept time.
    let third = src.sample().unwrap();
    assert_eq!(procs(&third[0]), procs(g));
    assert_eq!(src.last_seen.get(&g.uuid), Some(&2_000_000));

    // Discovery through a fake sysfs: NUMA node and PCIe root complex from the bus ID.
    let sysfs = std::env::var_os(FAKE_SYSFS).expect("a fake sysfs");
    let mut src = NvmlSource::new(Some(Path::new(&lib)), Some(Path::new(&sysfs))).unwrap();
    let inv = src.discover().unwrap();
    let topo: Vec<(Option<i64>, Option<&str>)> = inv
        .gpus
        .iter()
        .map(|g| (g.numa_node, g.pcie_root.as_deref()))
        .collect();
    assert_eq!(topo[0], (Some(1), Some("pci0000:16")), "{topo:?}");
    assert_eq!(topo[1], (None, None), "{topo:?}");
}

/// On a node with an NVIDIA driver: `cargo test --lib real_gpu -- --ignored --nocapture`.
#[test]
#[ignore = "needs an NVIDIA driver"]
fn real_gpu_sample_is_consistent() {
    let mut source = NvmlSource::new(None, None).expect("NVML");
    let inv = source.discover().expect("discovery");
    for round in 0..2 {
        let samples = source.sample().expect("sample");
        assert_eq!(samples.len(), inv.gpus.len(), "no GPU is lost");
        for g in &samples {
            eprintln!(
                "round {round} GPU {} {} util {:?}% mem {:?}/{:?} bytes, {} processes, {} MIG devices, last seen {:?}",
                g.index,
                g.uuid,
                g.utilization_percent,
                g.memory_used_bytes,
                g.memory_total_bytes,
                g.processes.len(),
                g.mig.len(),
                source.last_seen.get(&g.uuid)
            );
            assert_eq!(
                Some(g.uuid.as_str()),
                inv.by_index(g.index).map(|x| x.uuid.as_str())
            );
            assert!(g.utilization_percent.is_none_or(|u| u <= 100));
            assert!(g.memory_total_bytes.is_some());
            assert!(g.memory_used_bytes <= g.memory_total_bytes);
            for p in &g.processes {
                eprintln!(
                    "  PID {} SM {:?}% mem {:?}",
                    p.pid, p.sm_util_percent, p.memory_used_bytes
                );
                assert!(p.sm_util_percent.is_none_or(|u| u <= 100));
            }
            for m in &g.mig {
                eprintln!(
                    "  MIG {} mem {:?}/{:?}",
                    m.uuid, m.memory_used_bytes, m.memory_total_bytes
                );
                assert!(m.memory_used_bytes <= m.memory_total_bytes);
            }
        }
    }
}

/// A fake sysfs: `devices/<root>/0000:16:00.0/<device>` with `numa_node`, and
/// `bus/pci/devices/<device>` linking to it relatively, as the kernel lays them out.
fn fake_sysfs(sysfs: &Path, root: &str, device: &str, numa: &str) {
    let real = sysfs.join(format!("devices/{root}/0000:16:00.0/{device}"));
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("numa_node"), numa).unwrap();
    let bus = sysfs.join("bus/pci/devices");
    std::fs::create_dir_all(&bus).unwrap();
    std::os::unix::fs::symlink(
        format!("../../../devices/{root}/0000:16:00.0/{device}"),
        bus.join(device),
    )
    .unwrap();
}

#[test]
fn pcie_root_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    fake_sysfs(dir.path(), "pci0000:16", "0000:17:00.0", "1\n");
    assert_eq!(
        pcie_root(dir.path(), "00000000:17:00.0").as_deref(),
        Some("pci0000:16")
    );
    assert_eq!(numa_node(dir.path(), "00000000:17:00.0"), Some(1));
    // No link, or a link that names no root complex: unknown.
    assert_eq!(pcie_root(dir.path(), "00000000:18:00.0"), None);
    let odd = dir.path().join("bus/pci/devices/0000:19:00.0");
    std::os::unix::fs::symlink("../../../devices/platform/x/0000:19:00.0", &odd).unwrap();
    assert_eq!(pcie_root(dir.path(), "00000000:19:00.0"), None);
    // A directory, not a link (as in numa_from_sysfs): unknown.
    let dev = dir.path().join("bus/pci/devices/0000:1a:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    assert_eq!(pcie_root(dir.path(), "00000000:1A:00.0"), None);
}

#[test]
fn pcie_root_names() {
    for (name, want) in [
        ("pci0000:00", true),
        ("pci0000:af", true),
        ("pci10000:00", true),
        ("pci0000:0", false),
        ("pci000:00", false),
        ("pci0000:AF", false),
        ("pci0000:00:01.0", false),
        ("0000:00", false),
        ("pci123456789:00", false),
        ("", false),
    ] {
        assert_eq!(crate::inventory::is_pcie_root(name), want, "{name}");
    }
}

#[test]
fn numa_from_sysfs() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("bus/pci/devices/0000:17:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("numa_node"), "1\n").unwrap();
    assert_eq!(numa_node(dir.path(), "00000000:17:00.0"), Some(1));
    std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
    assert_eq!(numa_node(dir.path(), "00000000:17:00.0"), None);
    assert_eq!(numa_node(dir.path(), "00000000:18:00.0"), None);
}

/// The fake MIG state file the dynamic MIG children share.
const FAKE_MIG_DIR: &str = "SLICELET_TEST_FAKE_MIG_DIR";

/// Runs `child` (a test of this module) in a child process against the fake NVML, with the
/// inventory `inventory` and `FAKE_NVML_STATE` in `dir`; its output.
fn run_fake_child(child: &str, dir: &Path, inventory: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libfake_nvml.so");
    assert!(lib.exists(), "{} missing", lib.display());
    let inv = dir.join("inventory.json");
    std::fs::write(&inv, inventory).unwrap();
    let out = std::process::Command::new(exe)
        .args([
            child,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FAKE_NVML_INVENTORY", &inv)
        .env("FAKE_NVML_STATE", dir.join("mig-state.json"))
        .env(FAKE_LIB, &lib)
        .env(FAKE_MIG_DIR, dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    text
}

/// An H100 in MIG mode without instances, and one with a 3g.40gb from the inventory.
const MIG_INVENTORY: &str = r#"{"gpus": [
  {"uuid": "GPU-44444444-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
   "memoryMiB": 81559, "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0",
   "migMode": 1},
  {"uuid": "GPU-55555555-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
   "memoryMiB": 81559, "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:18:00.0",
   "migMode": 1,
   "migDevices": [{"uuid": "MIG-55555555-2222-3333-4444-000000000000", "profile": "3g.40gb",
                   "memoryMiB": 40320, "giId": 1, "ciId": 0}]}
]}"#;

/// Dynamic MIG through the real NVML source against the fake NVML: geometry, create at a
/// placement, overlap refused, destroy, and the instances kept across a restart (a second
/// process with the same `FAKE_NVML_STATE`).
#[test]
fn dynamic_mig_against_the_fake_nvml() {
    let dir = tempfile::tempdir().unwrap();
    run_fake_child(
        "inventory::nvml::tests::fake_mig_create_child",
        dir.path(),
        MIG_INVENTORY,
    );
    run_fake_child(
        "inventory::nvml::tests::fake_mig_restart_child",
        dir.path(),
        MIG_INVENTORY,
    );
}

const MIG_GPU: &str = "GPU-44444444-2222-3333-4444-555555555555";

/// `(uuid, profile, gi, ci, placement)` of GPU 0's MIG devices in a new discovery.
fn mig_layout(src: &mut NvmlSource) -> Vec<(String, String, u32, u32, Option<MigPlacement>)> {
    let inv = src.discover().unwrap();
    inv.gpus[0]
        .mig_devices
        .iter()
        .map(|m| {
            (
                m.uuid.clone(),
                m.profile.clone(),
                m.gi_id,
                m.ci_id,
                m.placement,
            )
        })
        .collect()
}

fn at(start: u32, size: u32) -> Option<MigPlacement> {
    Some(MigPlacement { start, size })
}

/// The first half of [`dynamic_mig_against_the_fake_nvml`]; does nothing outside it.
#[test]
#[ignore = "run by dynamic_mig_against_the_fake_nvml in a child process"]
fn fake_mig_create_child() {
    use crate::inventory::MigGeometry;
    let (Some(lib), Some(dir)) = (std::env::var_os(FAKE_LIB), std::env::var_os(FAKE_MIG_DIR))
    else {
        return;
    };
    let mut src = NvmlSource::new(Some(Path::new(&lib)), None).expect("fake NVML");
    let inv = src.discover().unwrap();
    let geometry = inv.gpus[0].mig_geometry.clone().expect("a MIG geometry");
    assert_eq!(geometry.profiles.len(), 7, "{geometry:#?}");
    let placements: usize = geometry.profiles.iter().map(|p| p.placements.len()).sum();
    assert_eq!(placements, 25);
    assert_eq!((geometry.memory_slices, geometry.compute_slices), (8, 7));
    // Names, ids, memory and placements as NVIDIA's table has them.
    assert_eq!(
        Some(geometry),
        MigGeometry::from_table("NVIDIA H100 80GB HBM3", 81559)
    );
    // The inventory's 3g.40gb on GPU 1 sits at the first placement of its profile.
    let pre = &inv.gpus[1].mig_devices[0];
    assert_eq!((pre.gi_id, pre.placement), (1, at(0, 4)));

    let a = src.create_mig(MIG_GPU, "3g.40gb", 0).unwrap();
    assert_eq!(a.parent_uuid, MIG_GPU);
    assert_eq!(
        (a.device.profile.as_str(), a.device.placement),
        ("3g.40gb", at(0, 4))
    );
    assert_eq!(a.device.memory_mib, 40320);
    let b = src.create_mig(MIG_GPU, "3g.40gb", 4).unwrap();
    assert_eq!(b.device.placement, at(4, 4));
    assert_ne!(a.device.uuid, b.device.uuid);
    let refused = src.create_mig(MIG_GPU, "1g.10gb", 0).unwrap_err();
    assert!(
        matches!(&refused, InventoryError::MigCreate { reason, .. } if reason.contains("Insufficient Resources")),
        "{refused:?}"
    );
    let device = |c: &CreatedMig| {
        let d = &c.device;
        (
            d.uuid.clone(),
            d.profile.clone(),
            d.gi_id,
            d.ci_id,
            d.placement,
        )
    };
    assert_eq!(mig_layout(&mut src), [device(&a), device(&b)]);

    // Destroying frees the placement; destroying again is success.
    src.destroy_mig(MIG_GPU, a.device.gi_id, a.device.ci_id)
        .unwrap();
    src.destroy_mig(MIG_GPU, a.device.gi_id, a.device.ci_id)
        .unwrap();
    assert_eq!(mig_layout(&mut src), [device(&b)]);
    let c = src.create_mig(MIG_GPU, "1g.10gb", 0).unwrap();
    assert_eq!(c.device.placement, at(0, 1));
    let layout = mig_layout(&mut src);
    assert_eq!(layout.len(), 2);
    let kept: Vec<String> = layout.iter().map(|d| format!("{d:?}")).collect();
    std::fs::write(Path::new(&dir).join("layout.txt"), kept.join("\n")).unwrap();
}

/// The second half of [`dynamic_mig_against_the_fake_nvml`]: a restart sees the instances.
#[test]
#[ignore = "run by dynamic_mig_against_the_fake_nvml in a child process"]
fn fake_mig_restart_child() {
    let (Some(lib), Some(dir)) = (std::env::var_os(FAKE_LIB), std::env::var_os(FAKE_MIG_DIR))
    else {
        return;
    };
    let mut src = NvmlSource::new(Some(Path::new(&lib)), None).expect("fake NVML");
    let layout = mig_layout(&mut src);
    let seen: Vec<String> = layout.iter().map(|d| format!("{d:?}")).collect();
    let kept = std::fs::read_to_string(Path::new(&dir).join("layout.txt")).unwrap();
    assert_eq!(seen.join("\n"), kept);
    // The 1g.10gb at 0 still blocks a 3g.40gb there.
    let refused = src.create_mig(MIG_GPU, "3g.40gb", 0).unwrap_err();
    assert!(
        refused.to_string().contains("Insufficient Resources"),
        "{refused}"
    );
    for (_, _, gi, ci, _) in &layout {
        src.destroy_mig(MIG_GPU, *gi, *ci).unwrap();
    }
    assert!(mig_layout(&mut src).is_empty());
}
