//! Idle and slow clients on the status endpoint (issue 15 D5).

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn two_hundred_idle_connections_neither_exhaust_fds_nor_block_a_probe() {
    let (_tx, rx) = watch::channel(Status::default());
    let stop = CancellationToken::new();
    let (addr, task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        rx,
        Arc::new(Metrics::new()),
        stop.clone(),
    )
    .await
    .unwrap();
    let before = open_fds();
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept what it will: a probe on a fresh connection waits behind them.
    let mut probe = tokio::net::TcpStream::connect(addr).await.unwrap();
    probe
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), probe.read_to_end(&mut answer))
        .await
        .expect("the probe was not served")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // 201 client sockets are this test's own; the server holds at most MAX_CONNECTIONS more.
    let grown = open_fds().saturating_sub(before);
    assert!(
        grown <= 201 + MAX_CONNECTIONS + 8,
        "{grown} descriptors for 201 connections"
    );
    // The idle ones were closed by the header-read timeout.
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(30), idle[0].read(&mut buf))
        .await
        .expect("an idle connection stayed open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}
