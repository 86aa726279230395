use super::*;
use crate::inventory::test_node;
use crate::plan::build;
use crate::policy::parse;

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

/// A YAML spec of kind `kind` naming `names`.
fn yaml_spec(kind: &str, names: &[&str]) -> String {
    let mut s = format!("cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n");
    for n in names {
        s.push_str(&format!(
            "  - name: \"{n}\"\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia0\n"
        ));
    }
    s.push_str("containerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n");
    s
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(file), text).unwrap();
}

#[test]
fn kinds_and_device_names_follow_the_cdi_rules() {
    for ok in [
        "nvidia.com/gpu",
        "k8s.device-plugin.nvidia.com/gpu",
        "a/b",
        "x_y.z/g-p_u",
    ] {
        assert_eq!(parse_kind(ok).as_deref(), Ok(ok), "{ok}");
    }
    for bad in [
        "",
        "nvidia.com",
        "nvidia.com/",
        "/gpu",
        "1nvidia.com/gpu",
        "nvidia.com/gpu.x",
        "nvidia.com/gpu/x",
        "nvidia.com-/gpu",
        "nvidia .com/gpu",
    ] {
        assert!(parse_kind(bad).is_err(), "{bad:?}");
    }
    for ok in [
        "0",
        "3:1",
        "all",
        "GPU-00000000-0000-0000-0000-000000000000",
        "a.b_c",
    ] {
        assert!(check_device_name(ok).is_ok(), "{ok}");
    }
    for bad in ["", ":0", "0:", "a b", "a/b", "a=b", "-a"] {
        assert!(check_device_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn yaml_and_json_specs_are_read_for_kind_and_names_only() {
    let y = parse_spec(
        Path::new("/x/nvidia.yaml"),
        &yaml_spec("nvidia.com/gpu", &["0", "all"]),
    )
    .unwrap();
    assert_eq!(y.kind, "nvidia.com/gpu");
    assert_eq!(y.devices, vec!["0", "all"]);
    let json = r#"{"cdiVersion":"0.6.0","kind":"example.com/gpu","devices":[{"name":"1","containerEdits":{"env":["A=1"]}}],"containerEdits":{}}"#;
    let j = parse_spec(Path::new("/x/other.json"), json).unwrap();
    assert_eq!(
        j,
        Spec {
            kind: "example.com/gpu".into(),
            devices: vec!["1".into()]
        }
    );
    // A .json file is parsed as JSON: YAML-only syntax is refused.
    assert!(parse_spec(Path::new("/x/a.json"), "kind: a/b\n").is_err());
    // Spec-level errors name the file and the field.
    let e = parse_spec(
        Path::new("/x/a.yaml"),
        &yaml_spec("nvidia.com/gpu", &["0", "0"]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("/x/a.yaml") && e.contains("devices[1].name") && e.contains("twice"),
        "{e}"
    );
    let e = parse_spec(Path::new("/x/a.yaml"), &yaml_spec("nvidia.com", &["0"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kind:"), "{e}");
    let e = parse_spec(
        Path::new("/x/a.yaml"),
        &yaml_spec("nvidia.com/gpu", &["a b"]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("devices[0].name"), "{e}");
    assert!(parse_spec(Path::new("/x/a.yaml"), "devices: []\n").is_err());
}

#[test]
fn resolution_present_missing_and_two_files_of_one_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc-cdi");
    let run = tmp.path().join("run-cdi");
    write(
        &run,
        "nvidia.yaml",
        &yaml_spec("nvidia.com/gpu", &["0", "1", "all"]),
    );
    write(
        &run,
        "extra.json",
        r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[{"name":"1"},{"name":"2"}]}"#,
    );
    // Not specs: other extensions, a subdirectory, a FIFO-free unreadable entry.
    write(
        &run,
        "notes.txt",
        "kind: nvidia.com/gpu\ndevices:\n  - name: \"7\"\n",
    );
    std::fs::create_dir_all(run.join("sub.yaml")).unwrap();
    write(
        &run.join("sub"),
        "deep.yaml",
        &yaml_spec("nvidia.com/gpu", &["8"]),
    );
    let index = read_specs(&[etc.clone(), run.clone()]);
    assert_eq!(index.files, 2, "{index:?}");
    assert!(index.errors.is_empty(), "{:?}", index.errors);
    assert_eq!(
        index.resolve("nvidia.com/gpu=0").unwrap(),
        run.join("nvidia.yaml")
    );
    assert_eq!(
        index.resolve("nvidia.com/gpu=2").unwrap(),
        run.join("extra.json")
    );
    // Defined by two files of one directory: runtimes drop it.
    let e = index.resolve("nvidia.com/gpu=1").unwrap_err();
    assert!(matches!(e, Unresolved::Conflict { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("extra.json") && msg.contains("nvidia.yaml") && msg.contains("drop"),
        "{msg}"
    );
    for missing in ["nvidia.com/gpu=7", "nvidia.com/gpu=8", "other.com/gpu=0"] {
        let e = index.resolve(missing).unwrap_err();
        assert!(matches!(e, Unresolved::Missing { .. }), "{missing}: {e}");
        assert!(e.to_string().contains(&run.display().to_string()), "{e}");
    }

    // The same name in a later directory overrides an earlier one: no conflict.
    write(
        &etc,
        "nvidia.yaml",
        &yaml_spec("nvidia.com/gpu", &["0", "5"]),
    );
    let index = read_specs(&[etc.clone(), run.clone()]);
    assert_eq!(
        index.resolve("nvidia.com/gpu=0").unwrap(),
        run.join("nvidia.yaml")
    );
    assert_eq!(
        index.resolve("nvidia.com/gpu=5").unwrap(),
        etc.join("nvidia.yaml")
    );
}

#[test]
fn unusable_specs_are_skipped_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    write(&dir, "good.yaml", &yaml_spec("nvidia.com/gpu", &["0"]));
    write(&dir, "broken.yaml", "kind: [unclosed\n");
    write(&dir, "big.json", &" ".repeat(MAX_SPEC_BYTES as usize + 1));
    std::os::unix::net::UnixListener::bind(dir.join("sock.yaml")).unwrap();
    let index = read_specs(std::slice::from_ref(&dir));
    assert_eq!(index.files, 1);
    let errors: Vec<String> = index.errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("broken.yaml")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("big.json") && e.contains("larger")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("sock.yaml") && e.contains("not a regular file")),
        "{errors:?}"
    );
    assert!(index.resolve("nvidia.com/gpu=0").is_ok());
    // A missing name's reason mentions the skipped specs.
    let e = index.resolve("nvidia.com/gpu=1").unwrap_err().to_string();
    assert!(
        e.contains("3 spec files or directories could not be used"),
        "{e}"
    );
    // No directory at all: nothing resolves, and the reason says there were no specs.
    let none = read_specs(&[tmp.path().join("absent")]);
    assert!(none.errors.is_empty());
    let e = none.resolve("nvidia.com/gpu=0").unwrap_err().to_string();
    assert!(e.contains("no spec files there"), "{e}");
}

#[test]
fn unresolved_checks_the_names_allocate_hands_out() {
    let node = test_node(4);
    let policy = |strategy: &str, ids: &str| {
        parse(&format!(
            "flags:\n  plugin:\n    deviceListStrategy: {strategy}\n    deviceIDStrategy: {ids}\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 4\n"
        ))
        .unwrap()
    };
    let mut index = SpecIndex::new(&[PathBuf::from("/var/run/cdi")]);
    let spec = Spec {
        kind: "nvidia.com/gpu".into(),
        devices: vec![uuid(0), uuid(1), uuid(2), "0".into(), "1".into()],
    };
    index.add(0, Path::new("/var/run/cdi/nvidia.yaml"), &spec);
    let plan = build(&policy("cdi-cri", "uuid"), &node).unwrap().plan;
    let got = unresolved(&plan, &index);
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), vec![uuid(3)]);
    assert!(
        got[&uuid(3)].contains(&format!("nvidia.com/gpu={}", uuid(3))),
        "{got:?}"
    );
    // By index: GPUs 2 and 3 are not named by index.
    let plan = build(&policy("[envvar, cdi-annotations]", "index"), &node)
        .unwrap()
        .plan;
    let got = unresolved(&plan, &index);
    assert_eq!(
        got.keys().cloned().collect::<Vec<_>>(),
        vec![uuid(2), uuid(3)]
    );
    assert!(got[&uuid(2)].contains("nvidia.com/gpu=2 "), "{got:?}");
    // Without a cdi-* strategy nothing is checked.
    let plan = build(&policy("volume-mounts", "uuid"), &node).unwrap().plan;
    assert!(unresolved(&plan, &SpecIndex::default()).is_empty());
    // Another kind (--cdi-kind).
    let mut p = policy("cdi-cri", "uuid");
    p.delivery = p.delivery.with_cdi_kind("example.com/gpu");
    let plan = build(&p, &node).unwrap().plan;
    assert_eq!(unresolved(&plan, &index).len(), 4);
}

#[test]
fn mig_devices_are_named_gpu_colon_mig_by_index() {
    let mut node = test_node(2);
    node.gpus[1].mig_enabled = true;
    node.gpus[1].mig_devices = crate::inventory::test_mig(1, &[("1g.10gb", 2)]);
    let p = parse("flags:\n  migStrategy: mixed\n  plugin:\n    deviceListStrategy: cdi-cri\n    deviceIDStrategy: index\n").unwrap();
    let plan = build(&p, &node).unwrap().plan;
    let res = &plan.resources["nvidia.com/mig-1g.10gb"];
    let names: Vec<String> = res
        .devices
        .iter()
        .map(|d| qualified_name(&res.delivery.cdi_kind, d, res.delivery.id))
        .collect();
    assert_eq!(names, vec!["nvidia.com/gpu=1:0", "nvidia.com/gpu=1:1"]);
    let mut index = SpecIndex::new(&[PathBuf::from("/var/run/cdi")]);
    let spec = Spec {
        kind: "nvidia.com/gpu".into(),
        devices: vec!["0".into(), "1:1".into()],
    };
    index.add(0, Path::new("/var/run/cdi/nvidia.yaml"), &spec);
    let got = unresolved(&plan, &index);
    let mig0 = node.gpus[1].mig_devices[0].uuid.clone();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), vec![mig0]);
}

/// 300 DRA claim specs beside the toolkit's spec (their names sort first) change nothing: the
/// claim specs are skipped and the NVIDIA spec is read (with 256 files per directory read, it
/// was left out and every `cdi-*` GPU turned Unhealthy).
#[test]
fn claim_specs_never_crowd_the_nvidia_spec_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    for i in 0..300 {
        let uid = format!("{i:08x}-0000-4000-8000-000000000000");
        write(
            &dir,
            &claim_spec_file("gpu.slicelet.io", &uid),
            &format!("{{\"cdiVersion\": \"0.6.0\", \"kind\": \"gpu.slicelet.io/claim\", \"devices\": [{{\"name\": \"{uid}\"}}]}}"),
        );
    }
    write(
        &dir,
        "nvidia.yaml",
        &yaml_spec("nvidia.com/gpu", &["0", "1"]),
    );
    let index = read_specs(std::slice::from_ref(&dir));
    assert_eq!(index.errors, Vec::<SpecError>::new());
    assert_eq!(index.files, 1);
    assert!(index.resolve("nvidia.com/gpu=1").is_ok());
}

#[test]
fn claim_spec_names_are_recognised() {
    let uid = "aaaaaaaa-0000-4000-8000-000000000001";
    assert!(is_claim_spec(&claim_spec_file("gpu.slicelet.io", uid)));
    for other in [
        "nvidia.yaml",
        "gpu.slicelet.io-claim_short.json",
        "-claim_aaaaaaaa-0000-4000-8000-000000000001.json",
        "gpu.slicelet.io-claim_aaaaaaaa-0000-4000-8000-000000000001.yaml",
    ] {
        assert!(!is_claim_spec(other), "{other}");
    }
}

/// The read is bounded by bytes per directory: past the budget the rest is reported and
/// skipped, in name order.
#[test]
fn a_directory_is_read_within_its_byte_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    for i in 0..4 {
        write(
            &dir,
            &format!("{i}.yaml"),
            &yaml_spec("nvidia.com/gpu", &[&i.to_string()]),
        );
    }
    let one = std::fs::metadata(dir.join("0.yaml")).unwrap().len();
    let index = read_specs_within(std::slice::from_ref(&dir), one * 2 + one / 2, MAX_DIR_NAMES);
    assert_eq!(index.files, 2);
    assert_eq!(index.errors, vec![SpecError::TooMany { dir: dir.clone() }]);
    assert!(index.resolve("nvidia.com/gpu=1").is_ok());
    assert!(index.resolve("nvidia.com/gpu=2").is_err());
}

/// A parse error quotes at most [`MAX_ERROR_CHARS`] of the bad value: a 4 MiB scalar in a
/// spec gives a short error (it gave a 33.5 MB `/readyz` and log line), in both formats.
#[test]
fn a_huge_bad_scalar_is_quoted_short() {
    let huge = "x".repeat(4 * 1024 * 1024);
    let yaml = format!("cdiVersion: 0.6.0\nkind: {huge}\ndevices: []\n");
    let json = format!("{{\"kind\": \"nvidia.com/gpu\", \"devices\": \"{huge}\"}}");
    for (file, text) in [("/etc/cdi/x.yaml", yaml), ("/etc/cdi/x.json", json)] {
        let e = parse_spec(Path::new(file), &text).unwrap_err();
        let msg = e.to_string();
        assert!(msg.len() < 1_000, "{file}: {} bytes", msg.len());
        assert!(msg.contains(file), "{msg}");
    }
}

/// A valid YAML spec of at least `bytes`, its devices named `<prefix>-<n>`.
fn big_spec(prefix: &str, bytes: usize) -> String {
    let mut text = String::from("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n");
    let mut n = 0;
    while text.len() < bytes {
        text.push_str(&format!(
            "  - name: {prefix}-{n}\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia{n}\n"
        ));
        n += 1;
    }
    text
}

/// A valid spec larger than [`MAX_SPEC_BYTES`] (1 MiB; 1.5 MiB here: twelve specs of 4 MiB,
/// which the old limit let through, took about 0.2 GB of resident memory to index) is refused
/// naming its path, and the specs beside it are still read; one within the limit is read.
#[test]
fn a_valid_spec_over_the_size_limit_is_refused_with_its_path() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    let mib = 1024 * 1024;
    write(&dir, "a-large.yaml", &big_spec("large", mib + mib / 2));
    write(&dir, "b-fits.yaml", &big_spec("fits", mib - 200));
    write(&dir, "c-small.yaml", &yaml_spec("nvidia.com/gpu", &["0"]));
    let index = read_specs(std::slice::from_ref(&dir));
    let errors: Vec<String> = index.errors.iter().map(ToString::to_string).collect();
    let large = dir.join("a-large.yaml");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains(&large.display().to_string()) && errors[0].contains("larger than"),
        "{errors:?}"
    );
    assert_eq!(index.files, 2);
    assert!(index.resolve("nvidia.com/gpu=0").is_ok());
    assert!(index.resolve("nvidia.com/gpu=fits-0").is_ok());
    assert!(index.resolve("nvidia.com/gpu=large-0").is_err());
    // One path per file read, not one per name.
    assert_eq!(index.paths.len(), 2);
    assert!(index.names() > 1000, "{}", index.names());
}

/// The read is bounded by device names per directory too: a spec that would pass the count
/// and the rest of the directory are reported and skipped.
#[test]
fn a_directory_is_read_within_its_name_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cdi");
    write(&dir, "0.yaml", &yaml_spec("nvidia.com/gpu", &["0", "1"]));
    write(&dir, "1.yaml", &yaml_spec("nvidia.com/gpu", &["2", "3"]));
    write(&dir, "2.yaml", &yaml_spec("nvidia.com/gpu", &["4"]));
    let index = read_specs_within(std::slice::from_ref(&dir), MAX_DIR_BYTES, 3);
    assert_eq!(index.files, 1);
    assert_eq!(index.errors, vec![SpecError::TooMany { dir: dir.clone() }]);
    assert!(index.resolve("nvidia.com/gpu=1").is_ok());
    assert!(index.resolve("nvidia.com/gpu=2").is_err());
    assert!(index.errors[0].to_string().contains("16384 device names"));
}
