use super::*;

fn keys(k: &[&str]) -> BTreeSet<String> {
    k.iter().map(|s| s.to_string()).collect()
}

fn sel(default: Option<&str>, fallbacks: &[Fallback]) -> Selection {
    Selection {
        default: default.map(str::to_string),
        fallbacks: fallbacks.to_vec(),
        ..Selection::default()
    }
}

fn named(name: &str, by: Rule) -> Result<Choice, ()> {
    Ok(Choice::Named {
        name: name.to_string(),
        by,
    })
}

/// (keys, label, default, fallbacks) → choice (`Err(())`: an error).
type Case = (
    &'static [&'static str],
    Option<&'static str>,
    Option<&'static str>,
    &'static [Fallback],
    Result<Choice, ()>,
);

#[test]
fn the_rules_apply_in_nvidias_order() {
    use Fallback::*;
    let dir = Path::new("/cfg");
    // (keys, label, default, fallbacks) → choice (Err(()) = an error)
    let cases: Vec<Case> = vec![
        // 1. the label wins over the default and every fallback
        (
            &["any", "a100-ts4", "default"],
            Some("a100-ts4"),
            Some("any"),
            &[Named],
            named("a100-ts4", Rule::Label),
        ),
        // a label naming a missing key is an error, even with a default and `empty`
        (&["any"], Some("nope"), Some("any"), &[Empty], Err(())),
        // an empty label counts as unset
        (
            &["any", "ts"],
            Some(""),
            Some("ts"),
            &[],
            named("ts", Rule::Default),
        ),
        // 2. the default when no label
        (
            &["any", "ts"],
            None,
            Some("any"),
            &[Named, Single],
            named("any", Rule::Default),
        ),
        (&["any"], None, Some("missing"), &[Single], Err(())),
        // 3. fallbacks in order
        (
            &["default", "ts"],
            None,
            None,
            &[Named, Single],
            named("default", Rule::Fallback(Named)),
        ),
        (
            &["only"],
            None,
            None,
            &[Named, Single],
            named("only", Rule::Fallback(Single)),
        ),
        (
            &["only", "default"],
            None,
            None,
            &[Single, Named],
            named("default", Rule::Fallback(Named)),
        ),
        (&["a", "b"], None, None, &[Named, Single], Err(())),
        (
            &["a", "b"],
            None,
            None,
            &[Named, Single, Empty],
            Ok(Choice::Empty),
        ),
        (&["a", "b"], None, None, &[Empty, Named], Ok(Choice::Empty)),
        (&[], None, None, &[Named, Single], Err(())),
        (&["a"], None, None, &[], Err(())),
    ];
    for (k, label, default, fallbacks, want) in cases {
        let got = choose(dir, &keys(k), label, &sel(default, fallbacks)).map_err(|_| ());
        assert_eq!(
            got, want,
            "keys {k:?} label {label:?} default {default:?} fallbacks {fallbacks:?}"
        );
    }
}

#[test]
fn errors_name_the_label_the_value_and_the_keys_that_exist() {
    let e = choose(
        Path::new("/etc/slicelet"),
        &keys(&["any", "a100-ts4"]),
        Some("t4"),
        &Selection::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node label nvidia.com/device-plugin.config=t4 names config \"t4\", which /etc/slicelet does not have (keys: a100-ts4, any)"
    );
    let e = choose(
        Path::new("/c"),
        &keys(&["a", "b"]),
        None,
        &Selection::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node label nvidia.com/device-plugin.config is not set, no --config-default is given, and no fallback (named,single) found a config in /c (keys: a, b)"
    );
    let e = choose(Path::new("/c"), &keys(&[]), None, &sel(Some("x"), &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the default config \"x\" (--config-default) is not in /c (keys: none)"
    );
}

#[test]
fn fallback_names_parse_and_unknown_ones_say_what_is_allowed() {
    assert_eq!("named".parse(), Ok(Fallback::Named));
    assert_eq!(" single".parse(), Ok(Fallback::Single));
    assert_eq!("empty".parse(), Ok(Fallback::Empty));
    assert_eq!(
        "first".parse::<Fallback>().unwrap_err().to_string(),
        "unknown config fallback strategy \"first\" (allowed: named, single, empty)"
    );
}

#[test]
fn a_configmap_volume_lists_its_keys_not_its_own_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let ts = d.join("..2026_12_01_00_00_00.1");
    std::fs::create_dir(&ts).unwrap();
    std::fs::write(ts.join("any"), "version: v1\n").unwrap();
    std::fs::write(ts.join("a100-ts4"), "version: v1\n").unwrap();
    std::os::unix::fs::symlink("..2026_12_01_00_00_00.1", d.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/any", d.join("any")).unwrap();
    std::os::unix::fs::symlink("..data/a100-ts4", d.join("a100-ts4")).unwrap();
    std::fs::create_dir(d.join("subdir")).unwrap();
    std::fs::write(d.join(".hidden-key"), "").unwrap();
    assert_eq!(
        config_keys(d).unwrap(),
        keys(&[".hidden-key", "a100-ts4", "any"])
    );
    assert!(config_keys(&d.join("missing")).is_err());
}

#[test]
fn rules_fallbacks_and_choices_read_as_logged() {
    assert_eq!(Fallback::Empty.to_string(), "empty");
    assert_eq!(Rule::Label.to_string(), "node label");
    assert_eq!(Rule::Default.to_string(), "default");
    assert_eq!(
        Rule::Fallback(Fallback::Single).to_string(),
        "fallback single"
    );
    let named = Choice::Named {
        name: "a100".into(),
        by: Rule::Label,
    };
    assert_eq!(named.name(), Some("a100"));
    assert_eq!(Choice::Empty.name(), None);
}

#[test]
fn a_directory_is_a_config_dir_and_a_file_or_nothing_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(&file, "version: v1\n").unwrap();
    assert!(is_config_dir(dir.path()));
    assert!(!is_config_dir(&file));
    assert!(!is_config_dir(&dir.path().join("missing")));
}
