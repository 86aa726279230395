//! The edge values of NVIDIA's config v1 validation (`api/config/v1/replicas.go` and its
//! tests, NVIDIA k8s-device-plugin v0.17–v0.20): every form NVIDIA's plugin accepts loads here,
//! every form it refuses is refused, and what slicelet serves only leniently is a warning that
//! `validate --strict` turns into an error.

use super::*;

fn entry(devices: &str, replicas: &str) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: shared\n        devices: {devices}\n        replicas: {replicas}\n"
    )
}

const GPU: &str = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c";

#[test]
fn every_devices_form_nvidia_accepts_loads() {
    let cases: [(&str, DeviceSelector); 11] = [
        ("all", DeviceSelector::All),
        ("2", DeviceSelector::Count(2)),
        ("[0]", DeviceSelector::List(vec![DeviceRef::Index(0)])),
        ("[\"0\"]", DeviceSelector::List(vec![DeviceRef::Index(0)])),
        ("[\"007\"]", DeviceSelector::List(vec![DeviceRef::Index(7)])),
        (
            "[\"0:0\"]",
            DeviceSelector::List(vec![DeviceRef::MigIndex(0, 0)]),
        ),
        (
            "[\"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\"]",
            DeviceSelector::List(vec![DeviceRef::Uuid(GPU.into())]),
        ),
        (
            "[\"MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\"]",
            DeviceSelector::List(vec![DeviceRef::Uuid(
                "MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c".into(),
            )]),
        ),
        (
            "[\"MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0\"]",
            DeviceSelector::List(vec![DeviceRef::LegacyMig {
                gpu: GPU.into(),
                gi: 0,
                ci: 0,
            }]),
        ),
        (
            "[\"MIG-GPU-662077db-fa3f-0d8f-9502-21ab0ef058a2/10/0\"]",
            DeviceSelector::List(vec![DeviceRef::LegacyMig {
                gpu: "GPU-662077db-fa3f-0d8f-9502-21ab0ef058a2".into(),
                gi: 10,
                ci: 0,
            }]),
        ),
        (
            "[0, \"0:0\", \"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\"]",
            DeviceSelector::List(vec![
                DeviceRef::Index(0),
                DeviceRef::MigIndex(0, 0),
                DeviceRef::Uuid(GPU.into()),
            ]),
        ),
    ];
    for (devices, want) in cases {
        let p = parse(&entry(devices, "2")).unwrap_or_else(|e| panic!("{devices}: {e}"));
        assert_eq!(p.time_slicing.resources[0].devices, want, "{devices}");
        assert!(p.lenient.is_empty(), "{devices}: {:?}", p.lenient);
    }
}

#[test]
fn every_devices_form_nvidia_refuses_is_refused() {
    for devices in [
        "\"not-all\"",
        "-2",
        "2.0",
        "0",
        "[-1]",
        "[\"-1\"]",
        "[\"+1\"]",
        "[\"1:+0\"]",
        "[\"invalid-UUID\"]",
        "[\"GPU-UUID\"]",
        "[\"MIG-UUID\"]",
        "[\"MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\"]",
        "[\"MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0\"]",
        "[\"MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0/0\"]",
        "[\"MIG-GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/../0\"]",
        "[\"MIG-GPU-MIG-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c/0/0\"]",
    ] {
        let e = parse(&entry(devices, "2")).expect_err(devices);
        assert!(
            e.path
                .starts_with("sharing.timeSlicing.resources[0].devices"),
            "{devices}: {e}"
        );
    }
}

#[test]
fn replicas_follow_nvidia_one_and_up() {
    for ok in ["1", "2", "48"] {
        let p = parse(&entry("all", ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(p.time_slicing.resources[0].replicas.to_string(), ok);
    }
    for bad in ["0", "-1", "2.0", "\"2\"", "null"] {
        let e = parse(&entry("all", bad)).expect_err(bad);
        assert_eq!(
            e.path, "sharing.timeSlicing.resources[0].replicas",
            "{bad}: {e}"
        );
    }
}

#[test]
fn uuid_forms_nvml_never_reports_load_and_match_nothing_with_a_warning() {
    // Go's uuid.Parse takes braces, urn:uuid: and 32 bare hex digits; NVML reports none of
    // them, so NVIDIA's plugin accepts such an entry and shares nothing through it.
    for form in [
        "GPU-{4cf8db2d-06c0-7d70-1a51-e59b25b2c16c}",
        "GPU-urn:uuid:4cf8db2d-06c0-7d70-1a51-e59b25b2c16c",
        "MIG-4cf8db2d06c07d701a51e59b25b2c16c",
    ] {
        let p =
            parse(&entry(&format!("[\"{form}\"]"), "2")).unwrap_or_else(|e| panic!("{form}: {e}"));
        assert_eq!(
            p.time_slicing.resources[0].devices,
            DeviceSelector::List(vec![DeviceRef::Unmatchable(form.into())])
        );
        assert_eq!(p.lenient.len(), 1, "{form}: {:?}", p.lenient);
        assert!(
            p.lenient[0].starts_with("sharing.timeSlicing.resources[0].devices[0]: "),
            "{:?}",
            p.lenient
        );
    }
}

#[test]
fn a_device_listed_twice_loads_once_with_a_warning() {
    let p = parse(&entry(&format!("[0, \"{GPU}\", \"0\"]"), "2")).unwrap();
    assert_eq!(
        p.time_slicing.resources[0].devices,
        DeviceSelector::List(vec![DeviceRef::Index(0), DeviceRef::Uuid(GPU.into())])
    );
    assert_eq!(
        p.lenient,
        vec!["sharing.timeSlicing.resources[0].devices[2]: 0 is listed twice; it counts once"]
    );
}

#[test]
fn names_and_renames_follow_nvidia() {
    // An unqualified name is NVIDIA's `nvidia.com/` one; a rename equal to the name is accepted.
    let p = parse("sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu\n        replicas: 2\n").unwrap();
    assert_eq!(
        p.time_slicing.resources[0].advertised.as_str(),
        "nvidia.com/gpu"
    );
    for bad in [
        "name: $invalid$\n        rename: valid-shared",
        "name: gpu\n        rename: $invalid$",
    ] {
        let text = format!(
            "sharing:\n  timeSlicing:\n    resources:\n      - {bad}\n        replicas: 2\n"
        );
        assert!(parse(&text).is_err(), "{bad}");
    }
    // No name, or no replicas: refused, as NVIDIA refuses them.
    for bad in ["replicas: 2", "name: gpu"] {
        let text = format!("sharing:\n  timeSlicing:\n    resources:\n      - {bad}\n");
        assert!(parse(&text).is_err(), "{bad}");
    }
}
