//! The layouts' steps on simulated H100s: decide, withdraw, wait for the holders, apply one GPU
//! at a time, check once, and never apply again until the file, the name or the GPUs change.

use super::*;
use crate::inventory::{test_mig, test_node, MigGeometry};
use crate::policy::parse_mig_parted;

const FILE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  all-3g.40gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
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

fn layouts(name: &str) -> MigLayouts {
    let mut m = MigLayouts::default();
    m.set_file(Ok((Arc::new(parse_mig_parted(FILE).unwrap()), [1; 32])));
    m.name = Some(name.to_string());
    m
}

fn none() -> BTreeSet<u32> {
    BTreeSet::new()
}

#[test]
fn a_layout_already_in_place_is_success_at_once_and_decided_once() {
    let mut inv = mig_node(2);
    inv.gpus[0].mig_devices = test_mig(0, &[("3g.40gb", 2)]);
    inv.gpus[1].mig_devices = test_mig(1, &[("3g.40gb", 2)]);
    let mut m = layouts("all-3g.40gb");
    let n = m.next(Some(&inv), &none(), |_| true);
    assert_eq!((n.replan, n.apply, n.state_changed), (false, None, true));
    assert_eq!(m.state, Some(MigConfigState::Success));
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
}

#[test]
fn each_gpu_is_withdrawn_waited_for_and_applied_in_turn_then_success() {
    let mut inv = mig_node(2);
    let mut m = layouts("all-1g.10gb");
    let n = m.next(Some(&inv), &none(), |_| false);
    assert!(n.replan && n.state_changed && n.apply.is_none());
    assert_eq!(m.state, Some(MigConfigState::Pending));
    assert_eq!(m.withdrawn(), Some(0));
    // Held: nothing is applied, however often asked.
    for _ in 0..3 {
        assert_eq!(m.next(Some(&inv), &none(), |_| false), Next::default());
    }
    let n = m.next(Some(&inv), &none(), |g| g == 0);
    let change = n.apply.expect("GPU 0 is free");
    assert_eq!((change.index, change.create.len()), (0, 7));
    // Applying: nothing more until the hardware answers.
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
    inv.gpus[0].mig_devices = test_mig(0, &[("1g.10gb", 7)]);
    let n = m.applied(Ok(()), Some(&inv), &none());
    assert!(n.replan && !n.state_changed);
    assert_eq!(m.withdrawn(), Some(1));
    let change = m.next(Some(&inv), &none(), |_| true).apply.unwrap();
    assert_eq!(change.index, 1);
    inv.gpus[1].mig_devices = test_mig(1, &[("1g.10gb", 7)]);
    let n = m.applied(Ok(()), Some(&inv), &none());
    assert!(n.replan && n.state_changed);
    assert_eq!(
        (m.state.clone(), m.withdrawn()),
        (Some(MigConfigState::Success), None)
    );
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
}

#[test]
fn a_mode_change_fails_with_the_nvidia_smi_step_and_is_not_retried() {
    let inv = mig_node(1);
    let mut m = layouts("all-disabled");
    let n = m.next(Some(&inv), &none(), |_| true);
    assert!(n.state_changed && !n.replan && n.apply.is_none());
    let Some(MigConfigState::Failed(why)) = &m.state else {
        panic!("{:?}", m.state)
    };
    assert!(why.contains("nvidia-smi -i 0 -mig 0"), "{why}");
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
}

#[test]
fn a_failed_create_is_failed_with_the_drivers_reason_until_something_changes() {
    let mut inv = mig_node(2);
    let mut m = layouts("all-1g.10gb");
    m.next(Some(&inv), &none(), |_| true);
    m.next(Some(&inv), &none(), |_| true).apply.unwrap();
    inv.gpus[0].mig_devices = test_mig(0, &[("1g.10gb", 3)]);
    let n = m.applied(Err("Insufficient Resources".into()), Some(&inv), &none());
    assert!(n.replan && n.state_changed);
    let Some(MigConfigState::Failed(why)) = &m.state else {
        panic!("{:?}", m.state)
    };
    assert!(
        why.contains("GPU 0") && why.contains("Insufficient Resources"),
        "{why}"
    );
    // GPU 1 is never touched, and nothing is tried again for the same inputs.
    assert_eq!(m.withdrawn(), None);
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
    // Another name is decided anew.
    m.name = Some("all-3g.40gb".into());
    assert!(m.next(Some(&inv), &none(), |_| true).replan);
}

#[test]
fn an_apply_that_leaves_the_gpu_different_fails_instead_of_looping() {
    let inv = mig_node(1);
    let mut m = layouts("all-1g.10gb");
    m.next(Some(&inv), &none(), |_| true);
    m.next(Some(&inv), &none(), |_| true).apply.unwrap();
    // The hardware said yes, the discovery shows nothing changed.
    m.applied(Ok(()), Some(&inv), &none());
    assert!(
        matches!(&m.state, Some(MigConfigState::Failed(w)) if w.contains("still differs")),
        "{:?}",
        m.state
    );
    assert_eq!(m.withdrawn(), None);
    assert_eq!(m.next(Some(&inv), &none(), |_| true), Next::default());
}

#[test]
fn a_renamed_layout_while_waiting_for_holders_starts_over() {
    let inv = mig_node(1);
    let mut m = layouts("all-1g.10gb");
    m.next(Some(&inv), &none(), |_| false);
    assert_eq!(m.withdrawn(), Some(0));
    m.name = Some("all-3g.40gb".into());
    let n = m.next(Some(&inv), &none(), |_| false);
    assert!(n.replan && n.apply.is_none());
    assert_eq!(m.withdrawn(), Some(0));
    let change = m.next(Some(&inv), &none(), |_| true).apply.unwrap();
    assert_eq!(change.create.len(), 2, "the new layout's instances");
}

/// The refusal a read of `text` from `layouts.yaml` gives.
fn refused(text: &str) -> LayoutsFileError {
    LayoutsFileError::Parse {
        path: "layouts.yaml".into(),
        source: crate::policy::parse_mig_parted(text).unwrap_err(),
    }
}

#[test]
fn skipped_gpus_are_left_alone_and_a_bad_file_keeps_the_last_good_one() {
    let inv = mig_node(2);
    let mut m = layouts("all-3g.40gb");
    let bad = refused("version: v1\nmig-configs: bad\n");
    let bad_text = bad.to_string();
    assert!(bad_text.starts_with("layouts.yaml: "), "{bad_text}");
    m.set_file(Err(bad));
    m.next(Some(&inv), &[0, 1].into(), |_| true);
    assert_eq!(m.state, Some(MigConfigState::Success), "both GPUs skipped");
    assert_eq!(m.file_error, Some(bad_text));
    // Without any good file, the file's error is the failure.
    let mut fresh = MigLayouts {
        name: Some("all-3g.40gb".into()),
        ..MigLayouts::default()
    };
    let unknown = refused("version: v9\nmig-configs: {}\n");
    let unknown_text = unknown.to_string();
    fresh.set_file(Err(unknown));
    fresh.next(Some(&inv), &none(), |_| true);
    assert_eq!(fresh.state, Some(MigConfigState::Failed(unknown_text)));
    // No layout asked for: no state at all.
    fresh.name = None;
    assert!(fresh.next(Some(&inv), &none(), |_| true).state_changed);
    assert_eq!(fresh.state, None);
}
