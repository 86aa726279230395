//! `dra.dynamicMig`: the forms `devices` takes, the errors with their field paths, and sharing
//! a dynamic MIG GPU refused.

use super::*;

fn dynamic(devices: &str) -> Result<Policy, PolicyError> {
    parse(&format!(
        "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: {devices}\n"
    ))
}

const UUID: &str = "GPU-00000001-0000-0000-0000-000000000000";

#[test]
fn devices_take_every_gpu_form_of_a_sharing_entry() {
    let cases: [(&str, DeviceSelector); 5] = [
        ("all", DeviceSelector::All),
        ("2", DeviceSelector::Count(2)),
        (
            "[0, 1]",
            DeviceSelector::List(vec![DeviceRef::Index(0), DeviceRef::Index(1)]),
        ),
        ("[\"3\"]", DeviceSelector::List(vec![DeviceRef::Index(3)])),
        (
            &format!("[{UUID}, 0]"),
            DeviceSelector::List(vec![DeviceRef::Uuid(UUID.to_string()), DeviceRef::Index(0)]),
        ),
    ];
    for (text, want) in cases {
        let p = dynamic(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(p.dynamic_mig, Some(want), "{text}");
        assert!(
            p.extensions
                .iter()
                .any(|e| e.starts_with("dra.dynamicMig.devices")),
            "{text}: {:?}",
            p.extensions
        );
    }
    // Absent: no dynamic MIG, no extension.
    let p = parse("version: v1\ndra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    assert_eq!(p.dynamic_mig, None);
    assert!(p.extensions.is_empty(), "{:?}", p.extensions);
}

#[test]
fn a_gpu_listed_twice_counts_once_with_a_lenient_warning() {
    let p = dynamic("[0, 0]").unwrap();
    assert_eq!(
        p.dynamic_mig,
        Some(DeviceSelector::List(vec![DeviceRef::Index(0)]))
    );
    assert!(
        p.lenient
            .iter()
            .any(|l| l.starts_with("dra.dynamicMig.devices[1]")),
        "{:?}",
        p.lenient
    );
}

#[test]
fn errors_name_their_field_path() {
    let cases: [(String, &str, &str); 6] = [
        (
            "[\"0:1\"]".to_string(),
            "dra.dynamicMig.devices[0]",
            "MIG device",
        ),
        (
            "[0, MIG-00000000-0000-0000-0000-000000000000]".to_string(),
            "dra.dynamicMig.devices[1]",
            "MIG device",
        ),
        (
            format!("[MIG-{UUID}/1/0]"),
            "dra.dynamicMig.devices[0]",
            "MIG device",
        ),
        ("[-1]".to_string(), "dra.dynamicMig.devices", ""),
        ("0".to_string(), "dra.dynamicMig.devices", ""),
        ("none".to_string(), "dra.dynamicMig.devices", ""),
    ];
    for (text, path, says) in cases {
        let e = dynamic(&text).unwrap_err();
        assert!(e.path.starts_with(path), "{text}: {e}");
        assert!(e.message.contains(says), "{text}: {e}");
    }
    let e = parse("dra:\n  dynamicMig: {}\n").unwrap_err();
    assert_eq!(e.path, "dra.dynamicMig.devices", "{e}");
    assert!(e.message.contains("missing"), "{e}");
    let e = parse("dra:\n  dynamicMig:\n    devices: all\n    profiles: [1g.10gb]\n").unwrap_err();
    assert!(e.path.starts_with("dra.dynamicMig"), "{e}");
}

#[test]
fn time_slicing_or_mps_of_a_dynamic_mig_gpu_is_refused() {
    for (section, path) in [
        ("timeSlicing", "sharing.timeSlicing.resources[0].devices"),
        ("mps", "sharing.mps.resources[0].devices"),
    ] {
        for (shared, dynamic) in [
            ("[1]", "[0, 1]"),
            ("[\"1:0\"]", "[1]"),
            (&format!("[{UUID}]") as &str, &format!("[{UUID}]") as &str),
            // NVIDIA's old MIG form names its GPU by UUID.
            (&format!("[MIG-{UUID}/1/0]"), &format!("[{UUID}]")),
        ] {
            let text = format!(
                "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  {section}:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        devices: {shared}\ndra:\n  dynamicMig:\n    devices: {dynamic}\n"
            );
            let e = parse(&text).unwrap_err();
            assert_eq!(e.path, path, "{section} {shared} {dynamic}: {e}");
            assert!(e.message.contains("dynamic MIG"), "{e}");
        }
        // Other GPUs: fine, a MIG device of another GPU in the old form too.
        let text = format!(
            "version: v1\nsharing:\n  {section}:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        devices: [2]\ndra:\n  dynamicMig:\n    devices: [0, 1]\n"
        );
        parse(&text).unwrap();
        let other = UUID.replace("00000001", "00000002");
        let text = format!(
            "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  {section}:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        devices: [MIG-{other}/1/0]\ndra:\n  dynamicMig:\n    devices: [{UUID}]\n"
        );
        parse(&text).unwrap();
    }
}
