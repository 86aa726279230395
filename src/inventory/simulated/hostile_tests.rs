//! Hostile and broken simulated node files (issue 15).

use std::path::Path;

use super::*;

fn err(text: &str) -> String {
    parse(Path::new("n.yaml"), text).unwrap_err().to_string()
}

#[test]
fn a_fifo_node_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("node.yaml");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(SimulatedSource::new(fifo).discover().map(|_| ()));
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("discover blocked on a FIFO")
        .unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
}

#[test]
fn nesting_and_bom() {
    let deep = format!(
        "gpus:\n  - model: {}{}\n    memoryMiB: 1\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(
        err(&deep).contains("deeper than 64 levels"),
        "{}",
        err(&deep)
    );
    let inv = parse(
        Path::new("n.yaml"),
        "\u{feff}gpus:\n  - model: X\n    memoryMiB: 1\n",
    )
    .unwrap();
    assert_eq!(inv.gpus.len(), 1);
}
