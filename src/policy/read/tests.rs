use std::path::Path;
use std::time::Duration;

use super::*;

fn limits() -> Limits {
    Limits::default()
}

/// Runs `f` on a thread and fails the test if it does not answer within 10 s (a FIFO read
/// would block forever).
fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("read_bounded blocked")
}

#[test]
fn refuses_what_is_not_a_regular_file_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.yaml");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(status.success());
    let cases: [(std::path::PathBuf, &str); 3] = [
        (fifo, "FIFO"),
        ("/dev/zero".into(), "character device"),
        (dir.path().to_path_buf(), "directory"),
    ];
    for (path, kind) in cases {
        let p = path.clone();
        let got = within_deadline(move || read_bounded(&p, &limits()));
        match got {
            Err(e @ ReadError::NotRegular { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(kind), "{msg}");
                assert!(msg.contains(&path.display().to_string()), "{msg}");
                assert!(msg.contains("not a regular file"), "{msg}");
            }
            other => panic!("{}: {other:?}", path.display()),
        }
    }
}

#[test]
fn follows_symlinks_as_configmaps_use_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2024_01_01");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("config.yaml"), "version: v1\n").unwrap();
    std::os::unix::fs::symlink(&data, dir.path().join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", dir.path().join("config.yaml")).unwrap();
    let text = read_bounded(&dir.path().join("config.yaml"), &limits()).unwrap();
    assert_eq!(text, "version: v1\n");
}

#[test]
fn size_limit_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    let small = Limits {
        max_bytes: 100,
        ..limits()
    };
    std::fs::write(&p, "#".repeat(100)).unwrap();
    assert_eq!(read_bounded(&p, &small).unwrap().len(), 100);
    std::fs::write(&p, "#".repeat(101)).unwrap();
    let e = read_bounded(&p, &small).unwrap_err();
    assert!(matches!(e, ReadError::TooLarge { limit: 100, .. }), "{e:?}");
    assert!(e.to_string().contains("larger than 100 bytes"), "{e}");
    // The default is the ConfigMap limit.
    assert_eq!(DEFAULT_MAX_BYTES, 1 << 20);
    std::fs::write(&p, "#".repeat((1 << 20) + 1)).unwrap();
    assert!(matches!(
        read_bounded(&p, &limits()),
        Err(ReadError::TooLarge { .. })
    ));
}

#[test]
fn invalid_utf8_names_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(&p, b"version: v1\n# caf\xe9\n").unwrap();
    let e = read_bounded(&p, &limits()).unwrap_err();
    assert!(
        matches!(e, ReadError::InvalidUtf8 { offset: 17, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("not valid UTF-8 at byte 17"), "{e}");
    // validate (policy::load) refuses it the same way.
    let e = crate::policy::load(&p).unwrap_err();
    assert!(e.to_string().contains("at byte 17"), "{e}");
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(
        &p,
        "\u{feff}version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: gpu\n        replicas: 2\n",
    )
    .unwrap();
    let policy = crate::policy::load(&p).unwrap();
    assert_eq!(policy.time_slicing.resources[0].replicas, 2);
}

#[test]
// How fast it is refused is a benchmark row ("8. … nested policy: written -> rejected"), not a
// timed test.
fn a_deeply_nested_400kb_policy_is_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    let depth = 200_000;
    let text = format!(
        "flags: {{gfd: {}{}}}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    assert!(text.len() > 400_000);
    std::fs::write(&p, &text).unwrap();
    let e = crate::policy::load(&p).unwrap_err();
    assert!(
        matches!(
            e,
            crate::policy::LoadError::Read(ReadError::TooDeep {
                source: NestingError::Flow { line: 1, limit: 64 },
                ..
            })
        ),
        "{e:?}"
    );
    assert!(
        crate::errors::chain(&e).contains("deeper than 64 levels"),
        "{e}"
    );
}

#[test]
fn nesting_limits_count_what_a_parser_nests() {
    let l = Limits {
        max_depth: 8,
        max_indent: 16,
        ..limits()
    };
    let deep = |n: usize| format!("a: {}{}\n", "[".repeat(n), "]".repeat(n));
    assert_eq!(check_nesting(&deep(8), &l), Ok(()));
    assert_eq!(
        check_nesting(&deep(9), &l),
        Err(NestingError::Flow { line: 1, limit: 8 })
    );
    let flow_err = Err(NestingError::Flow { line: 1, limit: 8 });
    // Closing brackets inside strings do not pay for openings outside them.
    let hidden = format!("a: {}\n", r#"[ "]", "#.repeat(9));
    assert_eq!(check_nesting(&hidden, &l), flow_err);
    let single = format!("a: {}\n", "[ ']', ".repeat(9));
    assert_eq!(check_nesting(&single, &l), flow_err);
    let tagged = format!("a: {}\n", r#"[!t &x "]", "#.repeat(9));
    assert_eq!(check_nesting(&tagged, &l), flow_err);
    let escaped = format!("a: {}\n", r#"[ "\"]", "#.repeat(9));
    assert_eq!(check_nesting(&escaped, &l), flow_err);
    // Nor do closings in a comment, or openings hidden in a tag.
    let commented = format!("a: {}\n", "[ #]]]]]]]]]]\n".repeat(9));
    assert_eq!(
        check_nesting(&commented, &l),
        Err(NestingError::Flow { line: 9, limit: 8 })
    );
    let in_tag = format!("a: !t{}\n", "[".repeat(9));
    assert_eq!(check_nesting(&in_tag, &l), flow_err);
    // Openings inside strings count, and are cancelled by their own closings only.
    assert_eq!(
        check_nesting(&format!("a: \"{}\"\n", "[".repeat(9)), &l),
        flow_err
    );
    let balanced_strings = "a: \"[x]\"\n".repeat(100);
    assert_eq!(check_nesting(&balanced_strings, &l), Ok(()));
    let balanced_comments = "# devices: [0, 1] or {a: b}\n".repeat(100);
    assert_eq!(check_nesting(&balanced_comments, &l), Ok(()));
    // Block nesting by indentation, and compact block sequences.
    let indented = format!("a:\n{}b: 1\n", " ".repeat(17));
    assert_eq!(
        check_nesting(&indented, &l),
        Err(NestingError::Indent { line: 2, limit: 16 })
    );
    assert_eq!(
        check_nesting(&format!("{}x\n", "- ".repeat(9)), &l),
        Err(NestingError::Indent { line: 1, limit: 16 })
    );
    assert_eq!(check_nesting(&format!("{}x\n", "- ".repeat(8)), &l), Ok(()));
}

#[test]
fn quoted_strings_end_where_yaml_ends_them_and_keep_the_line_count() {
    let l = Limits {
        max_depth: 8,
        max_indent: 16,
        ..limits()
    };
    // A single-quoted string ends at its closing quote (`''` is a quote inside it), so the
    // `]` after it closes its line's `[`: nine lines of depth 1 stay at depth 1.
    let single = "a: ['it''s', 'y']\n".repeat(9);
    assert_eq!(check_nesting(&single, &l), Ok(()));
    // And only there: after `''` the string goes on, so its `]` close nothing outside it and
    // the `[` after it is the ninth level.
    let quoted_quote = format!("a: {}'x''{}' [\n", "[".repeat(8), "]".repeat(8));
    assert_eq!(
        check_nesting(&quoted_quote, &l),
        Err(NestingError::Flow { line: 1, limit: 8 })
    );
    // A `\` line break inside a double-quoted string is still a line: the error is on line 3.
    let continued = format!("a: \"x\\\n  y\"\nb: {}{}\n", "[".repeat(9), "]".repeat(9));
    assert_eq!(
        check_nesting(&continued, &l),
        Err(NestingError::Flow { line: 3, limit: 8 })
    );
}

#[test]
fn every_shipped_policy_and_node_passes_the_nesting_check() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![
        repo.join("config"),
        repo.join("config/nodes"),
        repo.join("fixtures/policies"),
    ];
    let mut seen = 0;
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                read_bounded(&p, &limits()).unwrap_or_else(|e| panic!("{e}"));
                seen += 1;
            }
        }
    }
    assert!(seen >= 7, "found {seen} files");
}

/// A tag or an anchor that ends the text (no line break after it) is scanned to its end and
/// no further.
#[test]
fn a_tag_or_anchor_at_the_end_of_the_text_is_read_to_its_end() {
    for text in ["a: !tag", "a: [&x", "- !!str"] {
        assert_eq!(check_nesting(text, &limits()), Ok(()), "{text:?}");
    }
}
