use crate::policy::{parse, Policy};

fn mps(entry_extra: &str, replicas: &str) -> String {
    format!(
        "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        rename: gpu-mps\n        replicas: {replicas}\n{entry_extra}"
    )
}

#[test]
fn defaults() {
    // (replicas, default activeThreadPercentage = 100 / replicas rounded down)
    for (replicas, pct) in [(1, 100), (2, 50), (3, 33), (4, 25), (7, 14), (48, 2)] {
        let p = parse(&mps("", &replicas.to_string())).unwrap();
        let e = &p.mps.resources[0];
        assert_eq!(e.shared.replicas, replicas);
        assert_eq!(e.active_thread_percentage, pct, "replicas {replicas}");
        assert_eq!(e.pinned_device_memory_limit_mib, None);
        assert_eq!(e.shared.advertised.as_str(), "nvidia.com/gpu-mps");
        assert_eq!(e.shared.path, "sharing.mps.resources[0]");
    }
    let p = parse(&mps("", "4")).unwrap();
    assert!(
        p.mps.fail_requests_greater_than_one,
        "failRequestsGreaterThanOne defaults to true for MPS"
    );
    assert!(!p.mps.exclusive_process);
    assert_eq!(p.mps_root, std::path::PathBuf::from("/run/nvidia/mps"));
    assert!(
        p.ignored_keys.is_empty(),
        "MPS is acted on: {:?}",
        p.ignored_keys
    );
    assert_eq!(parse("").unwrap(), Policy::default());
    // Time-slicing keeps NVIDIA's default (false).
    let p = parse("sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 2\n  mps:\n    failRequestsGreaterThanOne: false\n    exclusiveProcess: true\n    renameByDefault: true\n    resources:\n      - name: gpu\n        devices: [1]\n        replicas: 2\nflags:\n  mpsRoot: /var/run/mps\n").unwrap();
    assert!(!p.time_slicing.fail_requests_greater_than_one);
    assert!(!p.mps.fail_requests_greater_than_one);
    assert!(p.mps.exclusive_process);
    assert_eq!(
        p.mps.resources[0].shared.advertised.as_str(),
        "nvidia.com/gpu.shared"
    );
    assert_eq!(p.mps_root, std::path::PathBuf::from("/var/run/mps"));
}

#[test]
fn explicit_limits() {
    let cases: &[(&str, u32, Option<u64>)] = &[
        ("        activeThreadPercentage: 30\n", 30, None),
        ("        activeThreadPercentage: 100\n", 100, None),
        ("        pinnedDeviceMemoryLimit: 10Gi\n", 25, Some(10240)),
        (
            "        pinnedDeviceMemoryLimit: 20000Mi\n",
            25,
            Some(20000),
        ),
        ("        pinnedDeviceMemoryLimit: 8G\n", 25, Some(7629)),
        ("        pinnedDeviceMemoryLimit: 1.5Gi\n", 25, Some(1536)),
        // Regression: an unquoted exponent is a YAML float; Kubernetes accepts it.
        ("        pinnedDeviceMemoryLimit: 1e10\n", 25, Some(9536)),
        (
            "        pinnedDeviceMemoryLimit: 1073741824\n",
            25,
            Some(1024),
        ),
        (
            "        activeThreadPercentage: 10\n        pinnedDeviceMemoryLimit: \"2Gi\"\n",
            10,
            Some(2048),
        ),
    ];
    for (extra, pct, mib) in cases {
        let p = parse(&mps(extra, "4")).unwrap_or_else(|e| panic!("{extra}: {e}"));
        let e = &p.mps.resources[0];
        assert_eq!(e.active_thread_percentage, *pct, "{extra}");
        assert_eq!(e.pinned_device_memory_limit_mib, *mib, "{extra}");
    }
}

#[test]
fn rules_are_errors_with_paths_and_numbers() {
    let entry = "sharing.mps.resources[0]";
    // (entry extra, replicas, path, message must contain, line when the parser knows it)
    let cases: &[(&str, &str, String, &str, Option<usize>)] = &[
        (
            "        activeThreadPercentage: 0\n",
            "4",
            format!("{entry}.activeThreadPercentage"),
            "1 to 100",
            Some(8),
        ),
        (
            "        activeThreadPercentage: 101\n",
            "4",
            format!("{entry}.activeThreadPercentage"),
            "101",
            Some(8),
        ),
        (
            "        activeThreadPercentage: 12.5\n",
            "4",
            format!("{entry}.activeThreadPercentage"),
            "1 to 100",
            Some(8),
        ),
        (
            "        activeThreadPercentage: \"25\"\n",
            "4",
            format!("{entry}.activeThreadPercentage"),
            "1 to 100",
            Some(8),
        ),
        (
            "        pinnedDeviceMemoryLimit: 10GB\n",
            "4",
            format!("{entry}.pinnedDeviceMemoryLimit"),
            "`10GB` is not a Kubernetes quantity",
            Some(8),
        ),
        (
            "        pinnedDeviceMemoryLimit: 512Ki\n",
            "4",
            format!("{entry}.pinnedDeviceMemoryLimit"),
            "less than 1 MiB",
            Some(8),
        ),
        (
            "        pinnedDeviceMemoryLimit: -1Gi\n",
            "4",
            format!("{entry}.pinnedDeviceMemoryLimit"),
            "negative",
            Some(8),
        ),
        (
            "        pinnedDeviceMemoryLimit: 0\n",
            "4",
            format!("{entry}.pinnedDeviceMemoryLimit"),
            "less than 1 MiB",
            Some(8),
        ),
        (
            "        activeThreadPercentag: 10\n",
            "4",
            format!("{entry}.activeThreadPercentag"),
            "unknown field",
            Some(8),
        ),
        (
            "",
            "49",
            format!("{entry}.replicas"),
            "49 replicas exceed the 48 clients",
            None,
        ),
        ("", "0", format!("{entry}.replicas"), "at least 1", Some(7)),
    ];
    for (extra, replicas, path, msg, line) in cases {
        let e = parse(&mps(extra, replicas)).expect_err(extra);
        assert_eq!(&e.path, path, "{extra}: {e}");
        assert!(e.to_string().contains(msg), "{extra}: {e}");
        assert_eq!(e.location.as_ref().map(|l| l.line), *line, "{extra}: {e}");
    }
    let e = parse("flags:\n  mpsRoot: run/mps\n").unwrap_err();
    assert_eq!(e.path, "flags.mpsRoot");
    let e = parse("sharing:\n  mps:\n    exclusive: true\n").unwrap_err();
    assert_eq!(e.path, "sharing.mps.exclusive");
}

#[test]
fn both_modes_on_one_node() {
    let text = "sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        rename: gpu-shared\n        devices: [0]\n        replicas: 4\n  mps:\n    resources:\n      - name: gpu\n        rename: gpu-mps\n        devices: [1]\n        replicas: 4\n";
    let p = parse(text).unwrap();
    assert_eq!(p.time_slicing.resources.len(), 1);
    assert_eq!(p.mps.resources.len(), 1);
    assert!(
        p.notices
            .iter()
            .any(|n| n.starts_with("sharing.mps:") && n.contains("ignores sharing.timeSlicing")),
        "{:?}",
        p.notices
    );
    // One name from both sections: an error naming both entries.
    let e = parse(&text.replace("rename: gpu-mps", "rename: gpu-shared")).unwrap_err();
    assert_eq!(e.path, "sharing.mps.resources[0]");
    assert!(
        e.message.contains("sharing.timeSlicing.resources[0]") && e.message.contains("gpu-shared"),
        "{e}"
    );
    // Two MPS entries, one name.
    let e = parse("sharing:\n  mps:\n    resources:\n      - name: gpu\n        devices: [0]\n        replicas: 2\n      - name: gpu\n        devices: [1]\n        replicas: 4\n").unwrap_err();
    assert_eq!(e.path, "sharing.mps.resources[1]");
    assert!(e.message.contains("sharing.mps.resources[0]"), "{e}");
}

#[test]
fn mps_on_mig_resources_is_accepted() {
    // NVIDIA's plugin rejects MPS on MIG; slicelet runs one control daemon per MIG device.
    let p = parse("flags:\n  migStrategy: mixed\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/mig-1g.10gb\n        replicas: 2\n        pinnedDeviceMemoryLimit: 4Gi\n").unwrap();
    let e = &p.mps.resources[0];
    assert_eq!(e.shared.source.as_str(), "nvidia.com/mig-1g.10gb");
    assert_eq!(e.active_thread_percentage, 50);
    assert_eq!(e.pinned_device_memory_limit_mib, Some(4096));
}

// --- mutation-testing gaps ---

#[test]
fn the_both_modes_notice_needs_both_modes() {
    // The notice says NVIDIA's plugin ignores timeSlicing when mps is set: only when both
    // sections have entries.
    let both = |n: &str| n.contains("ignores sharing.timeSlicing");
    let mps_only = parse(&mps("", "4")).unwrap();
    assert!(
        !mps_only.notices.iter().any(|n| both(n)),
        "{:?}",
        mps_only.notices
    );
    let ts_only = parse("sharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 2\n  mps:\n    resources: []\n").unwrap();
    assert!(
        !ts_only.notices.iter().any(|n| both(n)),
        "{:?}",
        ts_only.notices
    );
}

#[test]
fn a_memory_limit_of_the_wrong_type_says_what_is_expected() {
    for bad in ["[1]", "true", "{a: 1}", ".inf", ".nan"] {
        let e = parse(&mps(
            &format!("        pinnedDeviceMemoryLimit: {bad}\n"),
            "4",
        ))
        .expect_err(bad);
        assert_eq!(
            e.path, "sharing.mps.resources[0].pinnedDeviceMemoryLimit",
            "{bad}: {e}"
        );
        assert!(
            e.message
                .contains("a Kubernetes quantity such as 10Gi or 20000Mi"),
            "{bad}: {e}"
        );
    }
}
