//! Unit tests of the simulated node file: parsing, counts and UUIDs, MIG layouts, Xid lines, caps.

use super::*;

#[test]
fn driver_version_is_optional_and_checked() {
    let gpu = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n";
    let p = Path::new("n.yaml");
    assert_eq!(parse(p, gpu).unwrap().driver_version, None);
    let with = format!("{gpu}driverVersion: \"550.54.15\"\n");
    assert_eq!(
        parse(p, &with).unwrap().driver_version.as_deref(),
        Some("550.54.15")
    );
    let bad = format!("{gpu}driverVersion: \"550; rm -rf\"\n");
    let e = parse(p, &bad).unwrap_err().to_string();
    assert!(e.contains("driverVersion"), "{e}");
}

#[test]
fn expands_counts_and_derives_stable_uuids() {
    let text = "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    count: 2\n    numaNode: 1\n";
    let a = parse(Path::new("n.yaml"), text).unwrap();
    let b = parse(Path::new("n.yaml"), text).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.gpus.len(), 2);
    assert_eq!(a.gpus[1].index, 1);
    assert_eq!(a.gpus[1].numa_node, Some(1));
    assert_ne!(a.gpus[0].uuid, a.gpus[1].uuid);
    assert!(a.gpus[0].uuid.starts_with("GPU-") && a.gpus[0].uuid.len() == 40);
}

/// `pcieRoot` is optional, kept per GPU (also for each of `count` GPUs), and must be a root
/// complex as sysfs names it.
#[test]
fn pcie_root_is_optional_and_checked() {
    let p = Path::new("n.yaml");
    let gpu = |root: &str| {
        format!("gpus:\n  - model: X\n    memoryMiB: 1\n    count: 2\n    pcieRoot: \"{root}\"\n  - model: X\n    memoryMiB: 1\n")
    };
    let inv = parse(p, &gpu("pci0000:16")).unwrap();
    let roots: Vec<Option<&str>> = inv.gpus.iter().map(|g| g.pcie_root.as_deref()).collect();
    assert_eq!(roots, [Some("pci0000:16"), Some("pci0000:16"), None]);
    assert_eq!(
        parse(p, &gpu("pci10000:0a")).unwrap().gpus[0]
            .pcie_root
            .as_deref(),
        Some("pci10000:0a")
    );
    for bad in [
        "0000:16",
        "pci0000:1",
        "pci0000:16:00.0",
        "pci00:16",
        "PCI0000:16",
        "pci0000:1G",
        "",
    ] {
        let e = parse(p, &gpu(bad)).unwrap_err().to_string();
        assert!(
            e.contains("gpus[0].pcieRoot") && e.contains("PCIe root"),
            "{bad}: {e}"
        );
    }
}

/// `pciDeviceId` is optional hex (with or without `0x`, any case) and refused otherwise,
/// naming its path.
#[test]
fn pci_device_id_is_optional_hex() {
    let p = Path::new("n.yaml");
    let gpu = |id: &str| {
        format!("gpus:\n  - model: X\n    memoryMiB: 1\n    pciDeviceId: \"{id}\"\n  - model: X\n    memoryMiB: 1\n")
    };
    let ids: Vec<Option<u32>> = parse(p, &gpu("0x233010DE"))
        .unwrap()
        .gpus
        .iter()
        .map(|g| g.pci_device_id)
        .collect();
    assert_eq!(ids, [Some(0x2330_10DE), None]);
    assert_eq!(
        parse(p, &gpu("20b010de")).unwrap().gpus[0].pci_device_id,
        Some(0x20B0_10DE)
    );
    let e = parse(p, &gpu("H100")).unwrap_err().to_string();
    assert!(
        e.contains("gpus[0].pciDeviceId") && e.contains("PCI device ID"),
        "{e}"
    );
}

#[test]
fn unknown_key_names_its_path() {
    let text = "gpus:\n  - model: X\n    memoryMiB: 1\n    memory: 2\n";
    let e = parse(Path::new("n.yaml"), text).unwrap_err().to_string();
    assert!(e.contains("gpus[0].memory:"), "{e}");
    assert!(e.contains("line 4"), "{e}");
}

#[test]
fn xid_lines_report_once_until_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("n.yaml");
    let mut src = SimulatedSource::new(&p);
    std::fs::write(
        &p,
        "gpus:\n  - model: X\n    memoryMiB: 1\n  - model: X\n    memoryMiB: 1\n    xid: 79\n",
    )
    .unwrap();
    let inv = src.discover().unwrap();
    let ev = src.take_events();
    assert_eq!(
        ev,
        [XidEvent {
            uuid: inv.gpus[1].uuid.clone(),
            xid: 79
        }]
    );
    src.discover().unwrap();
    assert!(src.take_events().is_empty(), "same line, no new event");
    std::fs::write(
        &p,
        "gpus:\n  - model: X\n    memoryMiB: 1\n  - model: X\n    memoryMiB: 1\n    xid: 48\n",
    )
    .unwrap();
    src.discover().unwrap();
    assert_eq!(src.take_events()[0].xid, 48);
}

#[test]
fn uuid_only_with_count_one() {
    let text = "gpus:\n  - model: X\n    memoryMiB: 1\n    count: 2\n    uuid: GPU-1\n";
    let e = parse(Path::new("n.yaml"), text).unwrap_err().to_string();
    assert!(e.contains("gpus[0].uuid"), "{e}");
}

#[test]
fn mig_devices_are_expanded() {
    let text = "gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    mig:\n      devices:\n        - profile: 1g.5gb\n          count: 7\n";
    let inv = parse(Path::new("n.yaml"), text).unwrap();
    assert!(inv.gpus[0].mig_enabled);
    assert_eq!(inv.gpus[0].mig_devices.len(), 7);
    let last = &inv.gpus[0].mig_devices[6];
    assert_eq!(last.memory_mib, 5 * 1024);
    assert_eq!((last.index, last.gi_id, last.ci_id), (6, 7, 0));
    assert_eq!((last.gpu_slices, last.compute_slices), (1, 1));
    assert!(last.uuid.starts_with("MIG-") && last.uuid.len() == 40);
    assert!(last.health.is_healthy() && last.caps.is_none());
    let uuids: std::collections::BTreeSet<&str> = inv.gpus[0]
        .mig_devices
        .iter()
        .map(|m| m.uuid.as_str())
        .collect();
    assert_eq!(uuids.len(), 7);
}

#[test]
fn mig_layouts_are_checked() {
    let node = |devices: &str| {
        format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices:\n{devices}")
    };
    let cases: &[(&str, Result<Vec<&str>, &str>)] = &[
        (
            "        - profile: 3g.40gb\n          count: 2\n",
            Ok(vec!["3g.40gb", "3g.40gb"]),
        ),
        (
            "        - profile: 2g.20gb\n          count: 3\n        - profile: 1g.10gb+me\n",
            Ok(vec!["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb+me"]),
        ),
        (
            "        - profile: 1g.10gb\n          count: 8\n",
            Err("gpus[0].mig.devices: the MIG devices use more than the GPU's 7 GPU slices"),
        ),
        (
            "        - profile: 4g.40gb\n        - profile: 4g.40gb\n",
            Err("gpus[0].mig.devices: the MIG devices use more"),
        ),
        (
            "        - profile: 1g.10gb\n        - profile: large\n",
            Err("gpus[0].mig.devices[1].profile: `large` is not a MIG profile"),
        ),
        (
            "        - profile: 1g.10gb\n          count: 0\n",
            Err("gpus[0].mig.devices[0].count: must be at least 1"),
        ),
        (
            "        - profile: 1g.10gb\n          slots: 2\n",
            Err("gpus[0].mig.devices[0].slots: unknown field `slots`"),
        ),
    ];
    for (devices, want) in cases {
        let got = parse(Path::new("n.yaml"), &node(devices));
        match (got, want) {
            (Ok(inv), Ok(profiles)) => {
                let got: Vec<&str> = inv.gpus[0]
                    .mig_devices
                    .iter()
                    .map(|m| m.profile.as_str())
                    .collect();
                assert_eq!(&got, profiles, "{devices}");
            }
            (Err(e), Err(msg)) => {
                let e = e.to_string();
                assert!(e.contains(msg), "{devices}: {e}");
            }
            (got, _) => panic!("{devices}: {got:?}"),
        }
    }
    // `mig:` without devices: MIG on, no instances.
    let inv = parse(
        Path::new("n.yaml"),
        "gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig: {}\n",
    )
    .unwrap();
    assert!(inv.gpus[0].mig_enabled && inv.gpus[0].mig_devices.is_empty());
}

#[test]
fn discover_resolves_caps_under_the_proc_root() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node.yaml");
    std::fs::write(&node, "gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    count: 2\n    mig:\n      devices:\n        - profile: 3g.20gb\n          count: 2\n").unwrap();
    let caps_dir = dir.path().join("proc/driver/nvidia-caps");
    std::fs::create_dir_all(&caps_dir).unwrap();
    std::fs::write(caps_dir.join("mig-minors"), mig::standard_mig_minors(2)).unwrap();
    let inv = SimulatedSource::new(&node)
        .with_proc_root(dir.path())
        .discover()
        .unwrap();
    // GPU 1 (minor 1), MIG device 1: GI 2, CI 0 -> 3 + 135 + 2*9 = 156, 157.
    assert_eq!(
        inv.gpus[1].mig_devices[1].caps,
        Some(super::super::MigCaps {
            gi_access: 156,
            ci_access: 157
        })
    );
    // Without the file: no caps, discovery still works.
    let inv = SimulatedSource::new(&node)
        .with_proc_root(dir.path().join("nothing"))
        .discover()
        .unwrap();
    assert!(inv.gpus[0].mig_devices.iter().all(|m| m.caps.is_none()));
}
