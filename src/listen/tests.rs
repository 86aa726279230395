//! The connection limits over real unix sockets, with a consumer standing in for tonic.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_stream::StreamExt as _;

use super::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// A listener under `limits` whose admitted connections are kept (as a server would) in
/// `admitted`, counted as they arrive.
struct Socket {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    admitted: mpsc::UnboundedReceiver<AnyAuthority<Admitted>>,
}

fn socket(limits: Limits) -> Socket {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let mut conns = Box::pin(incoming(listener, limits));
    let (tx, admitted) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(c) = conns.next().await {
            if tx.send(c.unwrap()).is_err() {
                return;
            }
        }
    });
    Socket {
        _dir: dir,
        path,
        admitted,
    }
}

/// Descriptors this process holds on the server side of `path`: accepted connections carry
/// the listener's address in `/proc/self/net/unix`, the clients' ends carry none.
fn server_fds(path: &std::path::Path) -> usize {
    let path = path.to_string_lossy();
    let table = std::fs::read_to_string("/proc/self/net/unix").unwrap();
    let inodes: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            (cols.get(7) == Some(&&*path)).then(|| format!("socket:[{}]", cols[6]))
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| inodes.contains(&*l.to_string_lossy()))
        .count()
}

/// Reads until the server closes `c` (EOF or reset); panics after [`DEADLINE`].
async fn closed(c: &mut UnixStream) {
    let mut buf = [0u8; 64];
    tokio::time::timeout(DEADLINE, async {
        while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await
    .expect("the server kept the connection open");
}

#[tokio::test]
async fn the_preface_admits_a_connection_and_reaches_the_server_unchanged() {
    let mut s = socket(Limits::default());
    let mut c = UnixStream::connect(&s.path).await.unwrap();
    // In two writes, as a slow client might send it, and the client's next frame after it
    // (an empty SETTINGS frame: RFC 9113 §6.5).
    const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    c.write_all(&PREFACE[..10]).await.unwrap();
    c.write_all(&PREFACE[10..]).await.unwrap();
    c.write_all(&SETTINGS).await.unwrap();
    let mut conn = tokio::time::timeout(DEADLINE, s.admitted.recv())
        .await
        .unwrap()
        .unwrap();
    let mut got = vec![0u8; PREFACE.len() + SETTINGS.len()];
    tokio::time::timeout(DEADLINE, conn.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..PREFACE.len()], PREFACE);
    assert_eq!(&got[PREFACE.len()..], SETTINGS);
}

#[tokio::test]
async fn one_byte_then_silence_is_closed_at_the_preface_timeout_never_admitted() {
    let mut s = socket(Limits {
        preface_timeout: Some(Duration::from_millis(200)),
        ..Limits::default()
    });
    let mut c = UnixStream::connect(&s.path).await.unwrap();
    c.write_all(&PREFACE[..1]).await.unwrap();
    closed(&mut c).await;
    assert!(s.admitted.try_recv().is_err(), "admitted on one byte");
}

#[tokio::test]
async fn other_bytes_than_the_preface_are_closed_at_once() {
    // A timeout far past the deadline: only the wrong bytes can close it in time.
    let mut s = socket(Limits {
        preface_timeout: Some(Duration::from_secs(3600)),
        ..Limits::default()
    });
    let mut c = UnixStream::connect(&s.path).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    closed(&mut c).await;
    assert!(s.admitted.try_recv().is_err());
}

#[tokio::test]
async fn a_flood_of_silent_connections_holds_max_pending_and_a_client_is_admitted_at_once() {
    // Silent connections are never timed out here: only eviction bounds them.
    let mut s = socket(Limits {
        preface_timeout: Some(Duration::from_secs(3600)),
        ..Limits::default()
    });
    let mut idle = Vec::new();
    for _ in 0..10 * MAX_PENDING {
        idle.push(UnixStream::connect(&s.path).await.unwrap());
    }
    // The oldest were closed to make room for the newer ones.
    closed(&mut idle[0]).await;
    let mut c = UnixStream::connect(&s.path).await.unwrap();
    c.write_all(PREFACE).await.unwrap();
    tokio::time::timeout(DEADLINE, s.admitted.recv())
        .await
        .expect("a client with its preface waited behind silent connections")
        .unwrap();
    let held = server_fds(&s.path);
    assert!(
        held <= MAX_PENDING + 1,
        "the server holds {held} descriptors for {} silent connections and one client",
        idle.len()
    );
}

#[tokio::test]
async fn past_max_connections_a_new_connection_is_closed_after_its_preface() {
    let mut s = socket(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let mut clients = Vec::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = UnixStream::connect(&s.path).await.unwrap();
        c.write_all(PREFACE).await.unwrap();
        held.push(
            tokio::time::timeout(DEADLINE, s.admitted.recv())
                .await
                .unwrap()
                .unwrap(),
        );
        clients.push(c);
    }
    let mut third = UnixStream::connect(&s.path).await.unwrap();
    third.write_all(PREFACE).await.unwrap();
    closed(&mut third).await;
    // One closes: the next is admitted.
    drop(held.pop());
    let mut fourth = UnixStream::connect(&s.path).await.unwrap();
    fourth.write_all(PREFACE).await.unwrap();
    tokio::time::timeout(DEADLINE, s.admitted.recv())
        .await
        .expect("a freed slot was not reused")
        .unwrap();
}
