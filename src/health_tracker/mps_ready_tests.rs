//! Unit tests of the tracker's MPS readiness set.

use super::*;

/// The ready set is what `/readyz` and the status view publish: exactly the wanted
/// daemons that reported ready.
#[test]
fn mps_ready_lists_exactly_the_ready_wanted_daemons() {
    let mut t = Tracker::new(None);
    let p = XidPolicy::default();
    let now = Instant::now();
    t.set_mps_wanted(&["GPU-a".to_string(), "GPU-b".to_string()].into());
    assert!(t.mps_ready().is_empty());
    let ready = |uuid: &str, ready| HealthEvent::MpsReady {
        uuid: uuid.into(),
        ready,
    };
    t.apply(&p, &ready("GPU-a", true), now);
    assert_eq!(
        t.mps_ready().iter().map(String::as_str).collect::<Vec<_>>(),
        ["GPU-a"]
    );
    t.apply(&p, &ready("GPU-a", false), now);
    t.apply(&p, &ready("GPU-b", true), now);
    assert_eq!(
        t.mps_ready().iter().map(String::as_str).collect::<Vec<_>>(),
        ["GPU-b"]
    );
}
