use super::*;

fn ts(replicas: &str) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )
}

#[test]
fn replicas_must_be_a_whole_number_of_at_least_one() {
    let path = "sharing.timeSlicing.resources[0].replicas";
    for bad in ["0", "-1", "\"4\"", "4.5", "null", "[4]", "99999999999"] {
        let e = parse(&ts(bad)).expect_err(bad);
        assert_eq!(e.path, path, "replicas: {bad}: {e}");
        assert_eq!(
            e.location.as_ref().map(|l| l.line),
            Some(6),
            "replicas: {bad}: {e}"
        );
    }
    let missing = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n";
    let e = parse(missing).unwrap_err();
    assert_eq!(e.path, path);
    assert_eq!(e.message, "is required");
    for (good, n) in [("1", 1), ("4", 4), ("48", 48)] {
        let p = parse(&ts(good)).unwrap();
        assert_eq!(p.time_slicing.resources[0].replicas, n);
    }
}

#[test]
fn misplaced_and_unknown_keys_name_their_path() {
    let cases: &[(&str, &str, usize)] = &[
        (
            "flags:\n  renameByDefault: true\n",
            "flags.renameByDefault",
            2,
        ),
        (
            "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replica: 4\n",
            "sharing.timeSlicing.resources[0].replica",
            5,
        ),
        ("sharing:\n  timeslicing: {}\n", "sharing.timeslicing", 2),
        (
            "flags:\n  plugin:\n    passDeviceSpec: true\n",
            "flags.plugin.passDeviceSpec",
            3,
        ),
        ("extra: 1\n", "extra", 1),
        ("version: v2\n", "version", 1),
        ("flags:\n  migStrategy: both\n", "flags.migStrategy", 2),
    ];
    for (text, path, line) in cases {
        let e = parse(text).expect_err(text);
        assert_eq!(&e.path, path, "{text}: {e}");
        assert_eq!(e.location.map(|l| l.line), Some(*line), "{text}");
    }
}

#[test]
fn every_recognised_nvidia_key_is_accepted_and_reported_once() {
    let text = r#"
version: v1
flags:
  migStrategy: none
  failOnInitError: false
  restartOnDeviceUnhealthy: false
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /
  mpsRoot: /run/nvidia/mps
  gdrcopyEnabled: false
  gdsEnabled: false
  mofedEnabled: false
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: auto
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: uuid
    cdiAnnotationPrefix: cdi.k8s.io/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: distributed
  gfd:
    oneshot: false
    noTimestamp: false
    sleepInterval: 60s
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
resources:
  gpus:
    - pattern: "*H100*"
      name: h100
sharing:
  mps:
    resources:
      - name: nvidia.com/gpu
        replicas: 2
imex:
  channelIDs: [0]
  required: false
"#;
    let p = parse(text).unwrap();
    assert!(!p.fail_on_init_error);
    assert!(p.pass_device_specs);
    assert_eq!(p.shared_allocation, SharedAllocation::Distributed);
    assert_eq!(p.delivery.strategies.names(), vec!["envvar", "cdi-cri"]);
    assert_eq!(p.delivery.annotation_prefix, "cdi.k8s.io/");
    let expected = [
        "flags.restartOnDeviceUnhealthy",
        "flags.nvidiaDriverRoot",
        "flags.nvidiaDevRoot",
        "flags.gdrcopyEnabled",
        "flags.gdsEnabled",
        "flags.mofedEnabled",
        "flags.useNodeFeatureAPI",
        "flags.deviceDiscoveryStrategy",
        "flags.gfd",
        "flags.plugin.nvidiaCTKPath",
        "flags.plugin.containerDriverRoot",
        "resources",
        "imex",
    ];
    let mut got = p.ignored_keys.clone();
    got.sort();
    let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn defaults_are_nvidias() {
    let p = parse("").unwrap();
    assert_eq!(p, Policy::default());
    assert!(p.fail_on_init_error);
    assert_eq!(p.mig_strategy, MigStrategy::None);
    let p = parse("version: v1\nflags:\n  plugin:\n    deviceListStrategy: envvar\n    deviceIDStrategy: uuid\n").unwrap();
    assert!(p.ignored_keys.is_empty(), "{:?}", p.ignored_keys);
}

#[test]
fn names_renames_and_devices() {
    let text = "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n      - name: gpu\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: team-a\n        devices: [1, \"GPU-abcdef01-0000-0000-0000-000000000000\", \"0:1\"]\n        replicas: 3\n      - name: nvidia.com/gpu\n        rename: team-b\n        devices: 2\n        replicas: 1\n";
    let p = parse(text).unwrap();
    let r = &p.time_slicing.resources;
    assert_eq!(r[0].source.as_str(), "nvidia.com/gpu");
    assert_eq!(r[0].advertised.as_str(), "nvidia.com/gpu.shared");
    assert_eq!(r[0].devices, DeviceSelector::All);
    assert_eq!(r[1].advertised.as_str(), "nvidia.com/team-a");
    assert_eq!(
        r[1].devices,
        DeviceSelector::List(vec![
            DeviceRef::Index(1),
            DeviceRef::Uuid("GPU-abcdef01-0000-0000-0000-000000000000".into()),
            DeviceRef::MigIndex(0, 1)
        ])
    );
    assert_eq!(r[2].devices, DeviceSelector::Count(2));
    // rename and devices are honoured, which NVIDIA's plugin does not do: say so.
    assert!(p
        .notices
        .iter()
        .any(|n| n.contains("resources[1].rename") && n.contains("nvidia.com/team-a")));
    assert!(p.notices.iter().any(|n| n.contains("resources[2].devices")));
}

#[test]
fn bad_names_and_device_lists_are_rejected_with_paths() {
    let base = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n";
    let cases: &[(&str, &str)] = &[
        (
            "        rename: kubernetes.io/gpu\n",
            "sharing.timeSlicing.resources[0].rename",
        ),
        (
            "        rename: Bad_Prefix.com/x\n",
            "sharing.timeSlicing.resources[0].rename",
        ),
        (
            "        devices: 0\n",
            "sharing.timeSlicing.resources[0].devices",
        ),
        (
            "        devices: some\n",
            "sharing.timeSlicing.resources[0].devices",
        ),
        (
            "        devices: [gpu0]\n",
            "sharing.timeSlicing.resources[0].devices[0]",
        ),
        (
            "        devices: [-1]\n",
            "sharing.timeSlicing.resources[0].devices[0]",
        ),
    ];
    for (extra, path) in cases {
        let text = format!("{base}{extra}");
        let e = parse(&text).expect_err(extra);
        assert_eq!(&e.path, path, "{extra}: {e}");
        assert!(e.location.is_some(), "{extra}: {e}");
    }
}

#[test]
fn two_entries_advertising_one_name_are_rejected_naming_both() {
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: shared\n        devices: [0]\n        replicas: 2\n      - name: nvidia.com/gpu\n        rename: nvidia.com/shared\n        devices: [1]\n        replicas: 4\n";
    let e = parse(text).unwrap_err();
    assert_eq!(e.path, "sharing.timeSlicing.resources[1]");
    assert!(
        e.message.contains("sharing.timeSlicing.resources[0]"),
        "{e}"
    );
    assert!(e.message.contains("nvidia.com/shared"), "{e}");
}

#[test]
fn error_display_has_path_message_and_position() {
    let e = parse(&ts("0")).unwrap_err();
    let s = e.to_string();
    assert!(
        s.starts_with("sharing.timeSlicing.resources[0].replicas: "),
        "{s}"
    );
    assert!(s.ends_with("(line 6, column 19)"), "{s}");
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.yaml");
    assert!(matches!(load(&p), Err(LoadError::Read { .. })));
    std::fs::write(&p, ts("0")).unwrap();
    let e = load(&p).unwrap_err().to_string();
    assert!(e.contains("config.yaml") && e.contains("replicas"), "{e}");
}

#[test]
fn health_extension() {
    let p = parse("health:\n  ignoredXids: [79]\n  criticalXids: [13]\n  recoverySeconds: 0.5\n")
        .unwrap();
    assert_eq!(p.health.ignored_xids, [79]);
    assert_eq!(p.health.critical_xids, [13]);
    assert_eq!(
        p.health.recovery,
        Some(std::time::Duration::from_millis(500))
    );
    let e = parse("health:\n  recoverySeconds: -1\n").unwrap_err();
    assert_eq!(e.path, "health.recoverySeconds");
    let e = parse("health:\n  ignoredXids: [79]\n  criticalXids: [79]\n").unwrap_err();
    assert_eq!(e.path, "health.criticalXids");
    assert_eq!(p.health.nvidia, None);
}

/// NVIDIA's `health` section (`disabled`, `eventTypes`, `ignoredXIDs`, `criticalXIDs`: `all`
/// in any case or a list) is read as NVIDIA's plugin reads it, with a notice saying so; an Xid
/// in both lists, an unknown event type or another word than `all` is refused as there, and
/// so is mixing it with slicelet's `ignoredXids`/`criticalXids`. (Regression: every key of it
/// was refused as unknown.)
#[test]
fn nvidias_health_keys_are_read_as_nvidias_plugin_reads_them() {
    let nvidia = |yaml: &str| {
        let p = parse(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        assert!(
            p.notices
                .iter()
                .any(|n| n.starts_with("health: read as NVIDIA's")),
            "{yaml}: {:?}",
            p.notices
        );
        p.health.nvidia.unwrap()
    };
    let n =
        nvidia("health:\n  ignoredXIDs: [13, 31]\n  criticalXIDs: all\n  recoverySeconds: 60\n");
    assert_eq!(
        n,
        NvidiaXids {
            off: false,
            ignored: vec![13, 31],
            critical: None
        }
    );
    assert_eq!(nvidia("health:\n  criticalXIDs: ALL\n").critical, None);
    assert_eq!(
        nvidia("health:\n  eventTypes: [EventTypeXidCriticalError]\n  criticalXIDs: [48, 79]\n"),
        NvidiaXids {
            off: false,
            ignored: vec![],
            critical: Some(vec![48, 79])
        }
    );
    assert!(nvidia("health:\n  disabled: true\n").off);
    assert!(!nvidia("health:\n  disabled: false\n").off);
    // Only Xid events mark a GPU Unhealthy, in NVIDIA's plugin as here.
    assert!(
        nvidia("health:\n  eventTypes: [EventTypeDoubleBitEccError, EventTypeSingleBitEccError]\n")
            .off
    );
    let p = parse(
        "health:\n  disabled: false\n  eventTypes: [EventTypeXidCriticalError]\n  ignoredXIDs: [13]\n",
    )
    .unwrap();
    assert!(p.ignored_keys.is_empty(), "{:?}", p.ignored_keys);

    for (yaml, path, says) in [
        (
            "health:\n  ignoredXIDs: [48]\n  criticalXIDs: [48, 79]\n",
            "health.criticalXIDs",
            "Xid 48",
        ),
        (
            "health:\n  criticalXIDs: some\n",
            "health.criticalXIDs",
            "`all` or a list of Xids",
        ),
        (
            "health:\n  eventTypes: [EventTypeClock]\n",
            "health.eventTypes[0]",
            "EventTypeXidCriticalError",
        ),
        (
            "health:\n  ignoredXIDs: [13]\n  ignoredXids: [79]\n",
            "health.ignoredXids",
            "use one form",
        ),
        (
            "health:\n  criticalXids: [79]\n  disabled: true\n",
            "health.criticalXids",
            "use one form",
        ),
    ] {
        let e = parse(yaml).expect_err(yaml);
        assert_eq!(e.path, path, "{yaml}: {e}");
        assert!(e.to_string().contains(says), "{yaml}: {e}");
    }
}

/// NVIDIA's newer plugin flags `kubeletSocket` and `cdiFeatureFlags` are recognised and not
/// acted on, like `nvidiaCTKPath`. (Regression: refused as unknown.)
#[test]
fn nvidias_newer_plugin_flags_are_recognised() {
    let p = parse(
        "version: v1\nflags:\n  plugin:\n    kubeletSocket: /var/lib/kubelet/device-plugins/kubelet.sock\n    cdiFeatureFlags: disable-multiple-csv-devices\n",
    )
    .unwrap();
    assert_eq!(
        p.ignored_keys,
        ["flags.plugin.kubeletSocket", "flags.plugin.cdiFeatureFlags"]
    );
}

#[test]
fn dra_xid_taint_effect_is_read_and_listed_as_an_extension() {
    let p = parse("dra:\n  resources: [nvidia.com/gpu]\n").unwrap();
    assert_eq!(p.dra_xid_taint_effect, TaintEffect::NoSchedule);
    assert!(p.extensions.is_empty(), "{:?}", p.extensions);
    for (value, effect) in [
        ("NoExecute", TaintEffect::NoExecute),
        ("NoSchedule", TaintEffect::NoSchedule),
    ] {
        let p = parse(&format!("dra:\n  xidTaintEffect: {value}\n")).unwrap();
        assert_eq!(p.dra_xid_taint_effect, effect);
        assert_eq!(p.extensions.len(), 1);
        assert!(
            p.extensions[0].starts_with("dra.xidTaintEffect"),
            "{:?}",
            p.extensions
        );
    }
    for bad in ["PreferNoSchedule", "noexecute", "[NoExecute]"] {
        let e = parse(&format!("dra:\n  xidTaintEffect: {bad}\n")).unwrap_err();
        assert_eq!(e.path, "dra.xidTaintEffect", "{bad}: {e}");
    }
}

#[test]
fn yaml_merge_keys_are_resolved() {
    // NVIDIA's parser resolves merge keys; an anchored entry reused with `<<` must work here too.
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - &base\n        name: nvidia.com/gpu\n        rename: a\n        devices: [0]\n        replicas: 2\n      - <<: *base\n        rename: b\n        devices: [1]\n";
    let p = parse(text).unwrap();
    let r = &p.time_slicing.resources;
    assert_eq!(
        (r[1].advertised.as_str(), r[1].replicas),
        ("nvidia.com/b", 2)
    );
    // A merge that still leaves an unknown key is an error with its line.
    let bad = text.replace(
        "        rename: b\n",
        "        rename: b\n        replica: 3\n",
    );
    let e = parse(&bad).unwrap_err();
    assert!(e.location.is_some(), "{e}");
}

// --- mutation-testing gaps ---

#[test]
fn an_empty_key_still_has_a_field_path() {
    // Regression (found by policy::proptests::arbitrary_text_never_panics while mutation
    // testing): `'': 1` was an error whose field path was empty.
    let cases: &[(&str, &str, usize)] = &[
        ("'': 1\n", "\"\"", 1),
        ("\"\": 1\n", "\"\"", 1),
        ("flags:\n  '': 1\n", "flags.\"\"", 2),
    ];
    for (text, path, line) in cases {
        let e = parse(text).expect_err(text);
        assert_eq!(&e.path, path, "{text:?}: {e}");
        assert!(e.message.contains("unknown field"), "{text:?}: {e}");
        assert_eq!(e.location.map(|l| l.line), Some(*line), "{text:?}");
    }
}

#[test]
fn prefix_of_at_most_253_characters() {
    // Kubernetes: the prefix is a DNS-1123 subdomain, at most 253 characters, of labels of at
    // most 63. Four labels: 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253.
    let label = "a".repeat(63);
    let p253 = format!("{label}.{label}.{label}.{}", "b".repeat(61));
    let p254 = format!("{label}.{label}.{label}.{}", "b".repeat(62));
    assert_eq!(p253.len(), 253);
    assert_eq!(p254.len(), 254);
    assert!(names::ResourceName::parse(&format!("{p253}/gpu")).is_ok());
    let e = names::ResourceName::parse(&format!("{p254}/gpu")).unwrap_err();
    assert!(e.to_string().contains("is not a DNS subdomain"), "{e}");
    assert!(names::ResourceName::parse("/gpu").is_err());
}

#[test]
fn prefix_labels_take_lowercase_digits_and_inner_hyphens() {
    let cases: &[(&str, bool)] = &[
        ("k8s.example.com/gpu", true),
        ("my-org.example/gpu", true),
        ("0.example/gpu", true),
        ("-org.example/gpu", false),
        ("org-.example/gpu", false),
        ("org..example/gpu", false),
        ("org_x.example/gpu", false),
        ("Org.example/gpu", false),
    ];
    for (raw, ok) in cases {
        assert_eq!(names::ResourceName::parse(raw).is_ok(), *ok, "{raw}");
    }
}

#[test]
fn every_kubernetes_suffix_scales() {
    // resource.Quantity: binary SI powers of 1024, decimal SI powers of 1000.
    let cases: &[(&str, u128)] = &[
        ("1Ki", 1 << 10),
        ("1Mi", 1 << 20),
        ("1Gi", 1 << 30),
        ("1Ti", 1 << 40),
        ("1Pi", 1 << 50),
        ("1Ei", 1 << 60),
        ("1000m", 1),
        ("1", 1),
        ("1k", 1_000),
        ("1M", 1_000_000),
        ("1G", 1_000_000_000),
        ("1T", 1_000_000_000_000),
        ("1P", 1_000_000_000_000_000),
        ("1E", 1_000_000_000_000_000_000),
        ("2e3", 2_000),
    ];
    for (text, bytes) in cases {
        assert_eq!(quantity::parse_bytes(text), Ok(*bytes), "{text}");
    }
}

#[test]
fn a_malformed_exponent_is_not_a_quantity() {
    // `1e`, `1e+`, `1ex` are malformed, not numbers too large.
    for bad in ["1e", "1e+", "1e-", "1ex", "1e3x", "1e+-3"] {
        let e = quantity::parse_bytes(bad).unwrap_err();
        assert!(
            e.to_string().contains("is not a Kubernetes quantity"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn recovery_seconds_must_be_a_finite_number_of_at_least_zero() {
    for bad in ["-1", "-0.5", "-1e3", ".inf", "-.inf", ".nan", "x", "[1]"] {
        let e = parse(&format!("health:\n  recoverySeconds: {bad}\n")).expect_err(bad);
        assert_eq!(e.path, "health.recoverySeconds", "{bad}: {e}");
        assert!(
            e.message.contains("a number of seconds of at least 0"),
            "{bad}: {e}"
        );
    }
    for (good, secs) in [
        ("0", 0.0),
        ("-0", 0.0),
        ("0.0", 0.0),
        ("2.5", 2.5),
        ("300", 300.0),
    ] {
        let p = parse(&format!("health:\n  recoverySeconds: {good}\n")).expect(good);
        assert_eq!(
            p.health.recovery,
            Some(std::time::Duration::from_secs_f64(secs)),
            "{good}"
        );
    }
}

#[test]
fn mig_strategy_spelling_round_trips() {
    for s in [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed] {
        let p = parse(&format!("flags:\n  migStrategy: {}\n", s.as_str())).unwrap();
        assert_eq!(p.mig_strategy, s);
    }
}

#[test]
fn device_uuids_are_gpu_or_mig_prefixed_and_not_empty() {
    let base = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: x\n        replicas: 2\n        devices: ";
    let cases: &[(&str, Option<DeviceRef>)] = &[
        (
            "[\"GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416\"]",
            Some(DeviceRef::Uuid(
                "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416".into(),
            )),
        ),
        (
            "[\"MIG-0a1b2c3d-0000-1111-2222-333344445555\"]",
            Some(DeviceRef::Uuid(
                "MIG-0a1b2c3d-0000-1111-2222-333344445555".into(),
            )),
        ),
        // The pre-R470 MIG form holds `/` (a path separator): refused (issue 15, D2).
        ("[\"MIG-GPU-0a1b/1/0\"]", None),
        ("[\"GPU-0a1b\"]", None),
        ("[\"GPU-\"]", None),
        ("[\"MIG-\"]", None),
        ("[\"abcdef01\"]", None),
        ("[\"GPU-a_b\"]", None),
        ("[\"GPU-a b\"]", None),
        ("[\"GPU-a:b\"]", None),
    ];
    for (devices, want) in cases {
        let got = parse(&format!("{base}{devices}\n"));
        match want {
            Some(r) => assert_eq!(
                got.unwrap().time_slicing.resources[0].devices,
                DeviceSelector::List(vec![r.clone()]),
                "{devices}"
            ),
            None => {
                let e = got.expect_err(devices);
                assert_eq!(
                    e.path, "sharing.timeSlicing.resources[0].devices[0]",
                    "{devices}"
                );
                assert!(e.message.contains("is not a GPU"), "{devices}: {e}");
            }
        }
    }
}

#[test]
fn device_selector_errors_say_what_is_expected() {
    let base = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: x\n        replicas: 2\n        devices: ";
    // (devices, path, expected phrase)
    let cases: &[(&str, &str, &str)] = &[
        (
            "some",
            "sharing.timeSlicing.resources[0].devices",
            "`all`, a positive count, or a list of GPU indices or UUIDs",
        ),
        (
            "-1",
            "sharing.timeSlicing.resources[0].devices",
            "`all`, a positive count, or a list of GPU indices or UUIDs",
        ),
        (
            "true",
            "sharing.timeSlicing.resources[0].devices",
            "`all`, a positive count, or a list of GPU indices or UUIDs",
        ),
        (
            "[true]",
            "sharing.timeSlicing.resources[0].devices[0]",
            "a GPU index, \"<gpu>:<mig>\", or a GPU-/MIG- UUID",
        ),
        (
            "[99999999999]",
            "sharing.timeSlicing.resources[0].devices[0]",
            "a GPU index, \"<gpu>:<mig>\", or a GPU-/MIG- UUID",
        ),
    ];
    for (devices, path, expected) in cases {
        let e = parse(&format!("{base}{devices}\n")).expect_err(devices);
        assert_eq!(&e.path, path, "{devices}: {e}");
        assert!(e.message.contains(expected), "{devices}: {e}");
        assert!(e.location.is_some(), "{devices}: {e}");
    }
}

#[test]
fn yaml_messages_keep_their_own_sentence() {
    // Only the YAML's repeated field path is stripped from a message, never another
    // `<word>: ` head such as serde's "invalid value: ".
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: kubernetes.io/gpu\n        replicas: 2\n";
    let e = parse(text).unwrap_err();
    assert_eq!(e.path, "sharing.timeSlicing.resources[0].rename");
    assert!(
        e.message
            .starts_with("invalid value: string \"kubernetes.io/gpu\""),
        "{e}"
    );
    assert!(e.message.contains("reserved for native resources"), "{e}");
    assert_eq!(
        strip_yaml_path("a.b: unknown field", "a.b.c"),
        "unknown field"
    );
    assert_eq!(
        strip_yaml_path("invalid value: string", "a.b"),
        "invalid value: string"
    );
}

#[test]
fn shared_devices_allocation_policy_is_validated() {
    let p = parse("flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n").unwrap();
    assert_eq!(p.shared_allocation, SharedAllocation::Packed);
    assert!(p.ignored_keys.is_empty(), "{:?}", p.ignored_keys);
    assert_eq!(
        parse("").unwrap().shared_allocation,
        SharedAllocation::Distributed
    );
    let e = parse("flags:\n  plugin:\n    sharedDevicesAllocationPolicy: spread\n").unwrap_err();
    assert_eq!(e.path, "flags.plugin.sharedDevicesAllocationPolicy");
    assert!(
        e.message
            .contains("unknown variant `spread`, expected `distributed` or `packed`"),
        "{e}"
    );
    assert_eq!(e.location.map(|l| l.line), Some(3));
}

fn plugin(body: &str) -> Result<Policy, PolicyError> {
    parse(&format!("version: v1\nflags:\n  plugin:\n{body}"))
}

#[test]
fn device_list_strategy_takes_nvidias_four_values_as_a_string_or_a_list() {
    let names = |body: &str| plugin(body).unwrap().delivery.strategies.names();
    assert_eq!(names("    deviceListStrategy: envvar\n"), vec!["envvar"]);
    assert_eq!(
        names("    deviceListStrategy: volume-mounts\n"),
        vec!["volume-mounts"]
    );
    assert_eq!(
        names("    deviceListStrategy: [cdi-cri]\n"),
        vec!["cdi-cri"]
    );
    assert_eq!(
        names("    deviceListStrategy:\n      - cdi-annotations\n      - envvar\n      - envvar\n"),
        vec!["envvar", "cdi-annotations"]
    );
    // Absent: envvar.
    assert_eq!(
        parse("").unwrap().delivery.strategies,
        DeviceListStrategies::default()
    );
    assert_eq!(names("    passDeviceSpecs: true\n"), vec!["envvar"]);
}

#[test]
fn unknown_device_list_strategies_are_errors_naming_the_allowed_values() {
    for (body, path, line) in [
        (
            "    deviceListStrategy: nonsense\n",
            "flags.plugin.deviceListStrategy",
            4,
        ),
        (
            "    deviceListStrategy: [envvar, cdi]\n",
            "flags.plugin.deviceListStrategy[1]",
            4,
        ),
        (
            "    deviceListStrategy:\n      - envvar\n      - CDI-CRI\n",
            "flags.plugin.deviceListStrategy[1]",
            6,
        ),
        (
            "    deviceListStrategy: 1\n",
            "flags.plugin.deviceListStrategy",
            4,
        ),
    ] {
        let e = plugin(body).expect_err(body);
        assert_eq!(e.path, path, "{body}: {e}");
        assert_eq!(e.location.as_ref().map(|l| l.line), Some(line), "{e}");
        if !body.contains(": 1") {
            for allowed in ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"] {
                assert!(e.message.contains(allowed), "{e}");
            }
        }
    }
    let e = plugin("    deviceListStrategy: []\n").unwrap_err();
    assert_eq!(e.path, "flags.plugin.deviceListStrategy");
    assert!(e.message.contains("empty list"), "{e}");
}

#[test]
fn device_id_strategy_is_uuid_or_index() {
    let id = |body: &str| plugin(body).unwrap().delivery.id;
    assert_eq!(id("    deviceIDStrategy: uuid\n"), DeviceIdStrategy::Uuid);
    assert_eq!(id("    deviceIDStrategy: index\n"), DeviceIdStrategy::Index);
    assert_eq!(parse("").unwrap().delivery.id, DeviceIdStrategy::Uuid);
    let e = plugin("    deviceIDStrategy: serial\n").unwrap_err();
    assert_eq!(e.path, "flags.plugin.deviceIDStrategy");
    assert!(
        e.message.contains("uuid") && e.message.contains("index"),
        "{e}"
    );
}

#[test]
fn cdi_annotation_prefix_must_start_an_annotation_key() {
    let p = plugin("    cdiAnnotationPrefix: example.com/\n").unwrap();
    assert_eq!(p.delivery.annotation_prefix, "example.com/");
    assert!(p.ignored_keys.is_empty(), "{:?}", p.ignored_keys);
    for bad in ["cdi.k8s.io", "Example.com/", "\"\"", "a/b/"] {
        let e = plugin(&format!("    cdiAnnotationPrefix: {bad}\n")).expect_err(bad);
        assert_eq!(e.path, "flags.plugin.cdiAnnotationPrefix", "{bad}: {e}");
        assert!(e.message.contains("DNS subdomain followed by `/`"), "{e}");
    }
}

#[test]
fn a_huge_wrong_typed_scalar_is_quoted_short() {
    // serde quotes the scalar whole: a 1 MB string must not become a 1 MB /readyz body.
    let text = format!(
        "version: v1\nflags:\n  migStrategy: {}\n",
        "x".repeat(1_000_000)
    );
    let e = parse(&text).unwrap_err();
    let shown = e.to_string();
    assert!(shown.len() < 600, "{} bytes", shown.len());
    assert!(shown.starts_with("flags.migStrategy: "), "{shown}");
    assert!(shown.contains("bytes in all)"), "{shown}");
    assert!(
        e.message.len() > 1_000_000,
        "the full message stays in the error value"
    );
}

/// (policy, the resources DRA serves, or the error's path)
#[test]
fn dra_key_table() {
    let cases: [(&str, Result<&[&str], &str>); 7] = [
        ("version: v1\n", Ok(&[])),
        (
            "version: v1\ndra:\n  resources: [nvidia.com/gpu, nvidia.com/mig-1g.10gb]\n",
            Ok(&["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]),
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 4\n        dra: true\n",
            Ok(&["nvidia.com/gpu-shared"]),
        ),
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: true\n",
            Ok(&["nvidia.com/gpu"]),
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: false\n",
            Ok(&[]),
        ),
        (
            "version: v1\ndra:\n  resources: [nvidia.com/gpu, nvidia.com/gpu]\n",
            Err("dra.resources[1]"),
        ),
        (
            "version: v1\ndra:\n  resource: [nvidia.com/gpu]\n",
            Err("dra.resource"),
        ),
    ];
    for (text, want) in cases {
        match (parse(text), want) {
            (Ok(p), Ok(names)) => {
                let got: Vec<&str> = p.dra.iter().map(ResourceName::as_str).collect();
                assert_eq!(got, names, "{text}");
            }
            (Err(e), Err(path)) => assert_eq!(e.path, path, "{text}: {e}"),
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }
    // Strict: `dra` must be a bool or `capacity`, with its path.
    let e = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        dra: yes-please\n").unwrap_err();
    assert_eq!(e.path, "sharing.timeSlicing.resources[0].dra", "{e}");
    assert!(e.location.is_some());
    assert!(e.to_string().contains("true, false or capacity"), "{e}");
}

/// `dra: capacity`: DRA's, one device per GPU (replicas 1), the entry's replicas kept as the
/// default share count; listed as an extension; its own limits refused, naming the key.
#[test]
fn dra_capacity_is_read_and_its_conflicts_named() {
    for mode in ["timeSlicing", "mps"] {
        let p = parse(&format!("version: v1\nsharing:\n  {mode}:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        replicas: 4\n        dra: capacity\n")).unwrap();
        let e = if mode == "mps" {
            assert_eq!(p.mps.resources[0].active_thread_percentage, 100);
            assert_eq!(p.mps.resources[0].pinned_device_memory_limit_mib, None);
            &p.mps.resources[0].shared
        } else {
            &p.time_slicing.resources[0]
        };
        assert!(e.dra);
        assert_eq!((e.replicas, e.capacity_shares), (1, Some(4)));
        let names: Vec<&str> = p.dra.iter().map(ResourceName::as_str).collect();
        assert_eq!(names, ["nvidia.com/gpu-shared"]);
        assert!(
            p.extensions.iter().any(|x| x.contains("dra: capacity")),
            "{:?}",
            p.extensions
        );
    }
    let bad = [
        (
            "timeSlicing",
            "        memory: {hard: 20Gi}\n",
            "sharing.timeSlicing.resources[0].memory",
        ),
        (
            "mps",
            "        activeThreadPercentage: 25\n",
            "sharing.mps.resources[0].activeThreadPercentage",
        ),
        (
            "mps",
            "        pinnedDeviceMemoryLimit: 10Gi\n",
            "sharing.mps.resources[0].pinnedDeviceMemoryLimit",
        ),
    ];
    for (mode, extra, path) in bad {
        let e = parse(&format!("version: v1\nsharing:\n  {mode}:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n        dra: capacity\n{extra}")).unwrap_err();
        assert_eq!(e.path, path, "{e}");
        assert!(e.to_string().contains("capacity request"), "{e}");
    }
}

#[test]
fn memory_limits_are_read_checked_and_listed_as_an_extension() {
    let p = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        memory: {hard: 20Gi, soft: 16Gi}\n").unwrap();
    let m = p.time_slicing.resources[0].memory.unwrap();
    assert_eq!((m.hard_mib, m.soft_mib), (20480, Some(16384)));
    assert_eq!(m.enforce, Enforce::Required);
    assert_eq!(p.extensions.len(), 1);
    assert!(p.extensions[0].starts_with("sharing.timeSlicing.resources[0].memory"));
    let e = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        memory: {hard: 8Gi, soft: 16Gi}\n").unwrap_err();
    assert_eq!(e.path, "sharing.timeSlicing.resources[0].memory.soft");
    let e = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        memory: {hard: 8Gi, enforce: maybe}\n").unwrap_err();
    assert!(e.path.contains("memory"), "{e}");
    let e = parse("version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        memory: {soft: 8Gi}\n").unwrap_err();
    assert!(e.to_string().contains("hard"), "{e}");
    let p = parse("version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n        memory: {hard: 8Gi, enforce: best-effort}\n").unwrap();
    assert_eq!(
        p.mps.resources[0].shared.memory.unwrap().enforce,
        Enforce::BestEffort
    );
}

/// One name, one path per node (KEP-5004, the DRA extended-resource bridge: a node may serve
/// an extended resource name through a device plugin or through DRA, never both). A policy
/// whose device-plugin entry advertises a name a DRA entry also advertises is refused, naming
/// the name and both entries. Already refused by the one-name-one-entry rule before the
/// bridge; kept as its regression test.
#[test]
fn one_name_through_dra_and_the_device_plugin_is_refused_naming_both_entries() {
    let ts = |first_dra: bool, second_dra: bool| {
        format!(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: {first_dra}\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [4, 5, 6, 7]\n        replicas: 4\n        dra: {second_dra}\n"
        )
    };
    for (first, second) in [(true, false), (false, true)] {
        let e = parse(&ts(first, second)).unwrap_err();
        assert_eq!(e.path, "sharing.timeSlicing.resources[1]", "{e}");
        assert!(
            e.message.contains("nvidia.com/gpu-shared")
                && e.message.contains("sharing.timeSlicing.resources[0]"),
            "{e}"
        );
    }
    // A time-slicing entry through DRA and an MPS entry through the device plugin.
    let e = parse("version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [0, 1, 2, 3]\n        replicas: 4\n        dra: true\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: nvidia.com/gpu-shared\n        devices: [4, 5, 6, 7]\n        replicas: 4\n").unwrap_err();
    assert_eq!(e.path, "sharing.mps.resources[0]", "{e}");
    assert!(
        e.message.contains("nvidia.com/gpu-shared")
            && e.message.contains("sharing.timeSlicing.resources[0]"),
        "{e}"
    );
}

/// `dra.resources` lists a name that an entry saying `dra: false` advertises: the entry asks
/// for the device plugin, the list for DRA. Refused at the entry's `dra`, naming the list
/// item and the name (it was read as DRA, silently overriding the entry).
#[test]
fn an_entry_saying_dra_false_for_a_name_dra_resources_lists_is_refused() {
    for (sharing, path) in [
        ("timeSlicing", "sharing.timeSlicing.resources[0].dra"),
        ("mps", "sharing.mps.resources[0].dra"),
    ] {
        let e = parse(&format!("version: v1\ndra:\n  resources: [nvidia.com/mig-1g.10gb, nvidia.com/gpu-shared]\nsharing:\n  {sharing}:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n        dra: false\n")).unwrap_err();
        assert_eq!(e.path, path, "{e}");
        assert!(
            e.message.contains("nvidia.com/gpu-shared") && e.message.contains("dra.resources[1]"),
            "{e}"
        );
    }
    // Without `dra: false` the list decides (the entry says nothing), and `dra: true` agrees.
    for dra in ["", "        dra: true\n"] {
        let p = parse(&format!("version: v1\ndra:\n  resources: [nvidia.com/gpu-shared]\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n{dra}")).unwrap();
        assert!(p.dra.iter().any(|n| n.as_str() == "nvidia.com/gpu-shared"));
    }
}
