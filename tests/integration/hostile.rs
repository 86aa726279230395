//! Hostile and broken inputs through the commands and the daemon's entry points (issue 15).

use std::time::Duration;

use slicelet::commands;

use crate::common::{node_file, ts_policy, Node};

#[test]
fn validate_and_the_daemon_read_invalid_utf8_alike() {
    let node = Node::new("version: v1\n");
    std::fs::write(node.policy(), b"version: v1\n# caf\xe9\n").unwrap();
    let e = commands::validate(&node.settings(&node_file("l4-x1.yaml"))).unwrap_err();
    assert!(e.to_string().contains("not valid UTF-8 at byte 17"), "{e}");
    // The daemon reads through the same function.
    let e = slicelet::policy::read_bounded(&node.policy(), &Default::default()).unwrap_err();
    assert!(e.to_string().contains("at byte 17"), "{e}");
}

#[test]
fn a_bom_policy_validates() {
    let node = Node::new(&format!("\u{feff}{}", ts_policy(2)));
    let out = commands::validate(&node.settings(&node_file("l4-x1.yaml"))).unwrap();
    assert!(out.starts_with("valid: "), "{out}");
}

#[test]
fn a_fifo_policy_is_refused_at_once() {
    let node = Node::new("version: v1\n");
    let target = std::fs::canonicalize(node.policy()).unwrap();
    std::fs::remove_file(&target).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&target)
        .status()
        .unwrap()
        .success());
    let settings = node.settings(&node_file("l4-x1.yaml"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(commands::validate(&settings).map(|_| ()));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("validate blocked on a FIFO")
        .unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
}

#[test]
fn hostile_node_files_are_refused_with_their_field_path() {
    let node = Node::new(&ts_policy(2));
    let cases = [
        (
            "gpus:\n  - model: X\n    memoryMiB: 1\n    uuid: \"GPU-/../../victim3\"\n",
            "gpus[0].uuid: `GPU-/../../victim3` is not a GPU or MIG UUID",
        ),
        (
            "gpus:\n  - model: X\n    memoryMiB: 1\n    count: 4294967295\n",
            "gpus[0].count: 4294967295 is more than the 64 GPUs",
        ),
    ];
    for (text, want) in cases {
        let file = node.tmp.path().join("node.yaml");
        std::fs::write(&file, text).unwrap();
        // Refused before expanding (an expansion would not finish, or exhaust memory).
        let e = commands::validate(&node.settings(&file)).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
    }
}
