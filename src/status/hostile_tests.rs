//! Idle and slow clients on the status endpoint (issue 15 D5).

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

/// Descriptors this process holds on TCP sockets whose local port is `port`: the server's
/// listener and the connections it accepted (the clients' sockets have `port` as the remote
/// end). Counted from `/proc/self/net/tcp` inodes matched against `/proc/self/fd` links, so
/// sockets other tests in this process open meanwhile do not count.
fn server_fds(port: u16) -> usize {
    let mut inodes = std::collections::HashSet::new();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    for row in table.lines().skip(1) {
        let cols: Vec<&str> = row.split_whitespace().collect();
        let local_port = cols[1].rsplit(':').next().unwrap();
        if u16::from_str_radix(local_port, 16).unwrap() == port && cols[9] != "0" {
            inodes.insert(format!("socket:[{}]", cols[9]));
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| inodes.contains(&*l.to_string_lossy()))
        .count()
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
    assert_eq!(server_fds(addr.port()), 1, "the listener alone");
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
    // The server holds its listener and at most MAX_CONNECTIONS accepted connections.
    let held = server_fds(addr.port());
    assert!(
        held <= 1 + MAX_CONNECTIONS,
        "the server holds {held} descriptors for 201 connections"
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
