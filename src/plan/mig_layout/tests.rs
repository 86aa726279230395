//! A mig-parted layout on simulated H100s and A100s: which entry decides, what changes, and
//! every refusal with the words a user needs.

use super::*;
use crate::inventory::{test_mig, test_node, MigGeometry};
use crate::policy::parse_mig_parted;

/// A mig-parted file in NVIDIA's format, with the shapes NVIDIA's own examples use: `all`,
/// index lists, a device filter, MIG off, MIG on with no instances.
const FILE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  all-balanced:
    - device-filter: ["0x233010DE", "0x233110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
  custom:
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "7g.80gb": 1
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
        "1g.10gb": 1
  unknown-profile:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1c.3g.40gb": 1
"#;

/// `n` H100s in MIG mode with no instances.
fn mig_node(n: u32) -> Inventory {
    let mut inv = test_node(n);
    for g in &mut inv.gpus {
        g.mig_enabled = true;
        g.mig_geometry = MigGeometry::from_table(&g.model, g.memory_mib);
    }
    inv
}

fn file() -> MigPartedFile {
    parse_mig_parted(FILE).expect("the example parses")
}

fn profiles(c: &GpuChange) -> Vec<(String, u32)> {
    c.create
        .iter()
        .map(|(p, at)| (p.clone(), at.start))
        .collect()
}

#[test]
fn a_uniform_layout_creates_every_instance_at_its_placement() {
    let changes = layout(&file(), "all-1g.10gb", &mig_node(2), &BTreeSet::new()).unwrap();
    assert_eq!(changes.len(), 2);
    for c in &changes {
        assert!(c.destroy.is_empty());
        let want: Vec<(String, u32)> = (0..7).map(|s| ("1g.10gb".to_string(), s)).collect();
        assert_eq!(profiles(c), want);
    }
}

#[test]
fn mixed_profiles_are_placed_largest_first_without_overlap() {
    let changes = layout(&file(), "all-balanced", &mig_node(1), &BTreeSet::new()).unwrap();
    let [c] = changes.as_slice() else {
        panic!("{changes:?}")
    };
    // 3g.40gb at 0 leaves 4-7: the 2g.20gb at 4, one 1g.10gb at 6, and 7 is no 1g.10gb
    // start; so the 3g.40gb goes to 4 and the rest fill 0-3.
    assert_eq!(
        profiles(c),
        [
            ("3g.40gb".to_string(), 4),
            ("2g.20gb".to_string(), 0),
            ("1g.10gb".to_string(), 2),
            ("1g.10gb".to_string(), 3),
        ]
    );
    let taken: Vec<MigPlacement> = c.create.iter().map(|(_, p)| *p).collect();
    for (i, a) in taken.iter().enumerate() {
        for b in &taken[i + 1..] {
            assert!(!a.overlaps(b), "{taken:?}");
        }
    }
    assert_eq!(
        c.create.len(),
        4,
        "3g + 2g + 1g + 1g = 7 compute slices, 8 memory slices"
    );
}

#[test]
fn a_gpu_already_as_the_layout_wants_is_left_alone_and_another_is_rebuilt() {
    let mut inv = mig_node(2);
    inv.gpus[0].mig_devices = test_mig(0, &[("3g.40gb", 2)]);
    inv.gpus[1].mig_devices = test_mig(1, &[("1g.10gb", 7)]);
    let changes = layout(&file(), "custom", &inv, &BTreeSet::new()).unwrap();
    let [c] = changes.as_slice() else {
        panic!("{changes:?}")
    };
    assert_eq!(c.index, 1);
    assert_eq!(c.destroy.len(), 7, "every 1g.10gb goes");
    assert_eq!(
        c.destroy[0],
        (
            inv.gpus[1].mig_devices[0].gi_id,
            0,
            inv.gpus[1].mig_devices[0].uuid.clone()
        )
    );
    assert_eq!(profiles(c), [("7g.80gb".to_string(), 0)]);
}

#[test]
fn gpus_partitioned_on_demand_are_never_touched() {
    let changes = layout(&file(), "all-1g.10gb", &mig_node(2), &BTreeSet::from([0])).unwrap();
    assert_eq!(changes.iter().map(|c| c.index).collect::<Vec<_>>(), [1]);
}

#[test]
fn the_device_filter_chooses_the_entry_by_pci_device_id() {
    let mut inv = mig_node(2);
    // GPU 1 an A100 40GB (0x20B0): the second entry, with the A100's profiles.
    let a100 = &mut inv.gpus[1];
    a100.model = "NVIDIA A100-SXM4-40GB".to_string();
    a100.memory_mib = 40960;
    a100.pci_device_id = Some(0x20B0_10DE);
    a100.mig_geometry = MigGeometry::from_table(&a100.model, a100.memory_mib);
    let changes = layout(&file(), "all-balanced", &inv, &BTreeSet::new()).unwrap();
    let names = |c: &GpuChange| {
        let mut v: Vec<String> = c.create.iter().map(|(p, _)| p.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&changes[0]),
        ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    );
    assert_eq!(
        names(&changes[1]),
        ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    );
    // A GPU no filter names is left alone.
    inv.gpus[1].pci_device_id = Some(0x1DB4_10DE);
    let changes = layout(&file(), "all-balanced", &inv, &BTreeSet::new()).unwrap();
    assert_eq!(changes.iter().map(|c| c.index).collect::<Vec<_>>(), [0]);
    // An unknown ID cannot be matched: the layout fails, naming the entry and the GPU.
    inv.gpus[0].pci_device_id = None;
    let e = layout(&file(), "all-balanced", &inv, &BTreeSet::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mig-configs.all-balanced[0].device-filter: the PCI device ID of GPU 0 (GPU-00000000-0000-0000-0000-000000000000) is unknown here"
    );
}

#[test]
fn a_layout_needing_mig_mode_toggled_fails_with_the_nvidia_smi_step() {
    let e = layout(&file(), "all-disabled", &mig_node(1), &BTreeSet::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mig-configs.all-disabled[0]: GPU 0 (GPU-00000000-0000-0000-0000-000000000000) has MIG mode on, the layout wants it off; slicelet never toggles MIG mode (it needs a GPU reset): run `nvidia-smi -i 0 -mig 0` (then reset the GPU or reboot the node, as nvidia-smi says), or change the layout"
    );
    let e = layout(&file(), "all-enabled", &test_node(1), &BTreeSet::new()).unwrap_err();
    assert!(
        e.to_string()
            .contains("has MIG mode off, the layout wants it on"),
        "{e}"
    );
    assert!(e.to_string().contains("`nvidia-smi -i 0 -mig 1`"), "{e}");
    // MIG off where the layout wants it off: nothing to do.
    assert_eq!(
        layout(&file(), "all-disabled", &test_node(2), &BTreeSet::new()).unwrap(),
        []
    );
}

#[test]
fn mig_on_with_no_instances_destroys_what_is_there() {
    let mut inv = mig_node(1);
    inv.gpus[0].mig_devices = test_mig(0, &[("3g.40gb", 2)]);
    let changes = layout(&file(), "all-enabled", &inv, &BTreeSet::new()).unwrap();
    assert_eq!(changes[0].destroy.len(), 2);
    assert!(changes[0].create.is_empty());
    inv.gpus[0].mig_devices.clear();
    assert_eq!(
        layout(&file(), "all-enabled", &inv, &BTreeSet::new()).unwrap(),
        []
    );
}

#[test]
fn what_does_not_fit_or_does_not_exist_is_refused_by_name() {
    let e = layout(&file(), "too-many", &mig_node(1), &BTreeSet::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mig-configs.too-many[0].mig-devices: 1g.10gb ×1, 3g.40gb ×2 do not fit GPU 0 (GPU-00000000-0000-0000-0000-000000000000) together (NVIDIA's placement rules)"
    );
    let e = layout(&file(), "unknown-profile", &mig_node(1), &BTreeSet::new()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("mig-configs.unknown-profile[0].mig-devices.1c.3g.40gb: GPU 0"),
        "{e}"
    );
    let e = layout(&file(), "nope", &mig_node(1), &BTreeSet::new()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("nvidia.com/mig.config: the MIG layouts file has no layout `nope`"),
        "{e}"
    );
    let mut inv = mig_node(1);
    inv.gpus[0].mig_geometry = None;
    let e = layout(&file(), "all-1g.10gb", &inv, &BTreeSet::new()).unwrap_err();
    assert!(e.to_string().contains("the MIG profiles of GPU 0"), "{e}");
}

#[test]
fn an_instance_count_over_the_profiles_limit_does_not_fit() {
    // 1g.10gb+me: one per GPU (NVIDIA's table), though its placements do not overlap.
    let text = "version: v1\nmig-configs:\n  me:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb+me\": 2\n";
    let f = parse_mig_parted(text).unwrap();
    let e = layout(&f, "me", &mig_node(1), &BTreeSet::new()).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
}

#[test]
fn the_last_entry_naming_a_gpu_decides() {
    let text = "version: v1\nmig-configs:\n  l:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"7g.80gb\": 1}\n";
    let f = parse_mig_parted(text).unwrap();
    let changes = layout(&f, "l", &mig_node(2), &BTreeSet::new()).unwrap();
    assert_eq!(changes[0].create.len(), 7);
    assert_eq!(profiles(&changes[1]), [("7g.80gb".to_string(), 0)]);
}

/// The GPUs `dra.dynamicMig.devices` names are left to DRA, however the layout would change
/// them; without `dra.dynamicMig` none is.
#[test]
fn the_dynamic_mig_gpus_are_skipped() {
    let inv = mig_node(2);
    let dynamic = crate::policy::parse(
        "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: [0]\n",
    )
    .unwrap();
    let skip = dynamic_gpus(&dynamic, &inv);
    assert_eq!(skip, BTreeSet::from([0]));
    let changes = layout(&file(), "all-1g.10gb", &inv, &skip).unwrap();
    assert_eq!(changes.iter().map(|c| c.index).collect::<Vec<_>>(), [1]);
    let plain = crate::policy::parse("version: v1\n").unwrap();
    assert!(dynamic_gpus(&plain, &inv).is_empty());
}
