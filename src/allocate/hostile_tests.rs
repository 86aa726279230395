//! Hostile requests (issue 15 D8, D10).

use super::*;
use crate::inventory::test_node;
use crate::plan::build;
use crate::policy::parse;

fn resource(sharing: &str, gpus: u32) -> std::sync::Arc<ResourcePlan> {
    let p = parse(&format!("sharing:\n{sharing}")).unwrap();
    let built = build(&p, &test_node(gpus)).unwrap();
    built.plan.resources.values().next().unwrap().clone()
}

fn replica(gpu: u32, n: u32) -> String {
    format!("GPU-{gpu:08}-0000-0000-0000-000000000000::{n}")
}

#[test]
fn preferred_never_returns_an_id_outside_available() {
    let ts = resource(
        "  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 4\n",
        2,
    );
    let mps = resource(
        "  mps:\n    resources:\n      - name: gpu\n        replicas: 4\n",
        2,
    );
    for res in [ts, mps] {
        let available = vec![replica(1, 0), replica(1, 1), replica(1, 2)];
        // replica(0, 0) is a real device of the resource, but not available.
        let got = preferred(&res, &available, &[replica(0, 0), replica(1, 2)], 2);
        assert_eq!(got.len(), 2, "{:?}: {got:?}", res.strategy);
        assert!(
            got.iter().all(|id| available.contains(id)),
            "{:?}: {got:?}",
            res.strategy
        );
        assert!(got.contains(&replica(1, 2)), "{:?}: {got:?}", res.strategy);
    }
}

#[test]
fn a_64kib_unknown_id_is_named_short() {
    let res = resource(
        "  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 2\n",
        1,
    );
    let id = "x".repeat(64 * 1024);
    let e = allocate(&res, &[id], "/").unwrap_err();
    assert!(matches!(e, AllocateError::UnknownDevice { .. }));
    let msg = e.to_string();
    assert!(msg.len() < 400, "{} bytes", msg.len());
    assert!(msg.ends_with("… (65536 bytes)\""), "{msg}");
}
