//! Connection limits for every unix socket slicelet serves gRPC on: each resource's
//! device-plugin socket, the DRA endpoint and the DRA registration socket.
//!
//! The kubelet holds one long-lived HTTP/2 connection per socket; anything else is a tool, a
//! test or a hostile local process. So each socket:
//!
//! - holds at most [`MAX_CONNECTIONS`] admitted connections; one that completes its preface
//!   while all are taken is closed (its client retries, as grpc-go and C-core do);
//! - admits a connection only once it has sent the whole HTTP/2 client preface (RFC 9113
//!   §3.4, [`PREFACE`]) within [`PREFACE_TIMEOUT`]; other bytes close it at once. Until then
//!   it is *pending*: at most [`MAX_PENDING`] are, and a new arrival closes the oldest pending
//!   one (and waits until its descriptor is closed, so the bound holds however fast they come). Silent or one-byte connections therefore never hold a slot a real client needs, and
//!   a flood of them costs at most `MAX_PENDING` descriptors and a few KiB each. The kubelet
//!   sends its preface in the same instant it connects, so it is admitted even mid-flood;
//! - keeps accepting when `accept` fails (out of descriptors: another process, or this one,
//!   exhausted them), after a pause of [`ACCEPT_PAUSE`] rather than spinning;
//! - and, through [`server`], caps each connection's concurrent streams, its header list,
//!   and pings it when idle (HTTP/2 keepalive), dropping it when the ping goes unanswered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;

use crate::authority::AnyAuthority;

/// The HTTP/2 client connection preface (RFC 9113 §3.4): every HTTP/2 client's first 24 bytes.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Admitted connections one socket serves at a time.
pub const MAX_CONNECTIONS: usize = 64;
/// Accepted connections that have not yet sent their whole preface, at most; a new one closes
/// the oldest.
pub const MAX_PENDING: usize = 16;
/// How long a new connection may take to send its preface before it is closed.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 streams one connection may have open at once (`SETTINGS_MAX_CONCURRENT_STREAMS`).
/// The kubelet uses one long-lived stream (ListAndWatch, or DRA's health watch) and short
/// unary calls; further calls wait in the client.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;
/// Largest header list one request may send (`SETTINGS_MAX_HEADER_LIST_SIZE`), bytes. gRPC
/// requests of the kubelet carry a few hundred bytes of headers.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// An idle connection is pinged after this long (HTTP/2 keepalive)...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ...and dropped when the ping is not answered within this long.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after a failed `accept` (typically `EMFILE`) before the next.
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// One socket's connection limits; [`Limits::default`] is what slicelet serves with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Admitted connections at most.
    pub max_connections: usize,
    /// Pending connections (preface not yet read) at most.
    pub max_pending: usize,
    /// How long the preface may take; `None` admits every connection at once without reading
    /// it (for measurements of an unlimited server only).
    pub preface_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            max_pending: MAX_PENDING,
            preface_timeout: Some(PREFACE_TIMEOUT),
        }
    }
}

/// A tonic server builder with the per-connection limits above: concurrent streams, header
/// list size and keepalive.
pub fn server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_SIZE))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
}

/// The admitted connections of `listener` under `limits`, each answering any `:authority`
/// ([`crate::authority`]), for `serve_with_incoming`. The stream ends when its receiver is
/// dropped (the server stopped); no accept error reaches the server.
pub fn incoming(
    listener: UnixListener,
    limits: Limits,
) -> impl Stream<Item = std::io::Result<AnyAuthority<Admitted>>> + Send + 'static {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(accept_loop(listener, limits, tx));
    ReceiverStream::new(rx)
}

type Sender = mpsc::Sender<std::io::Result<AnyAuthority<Admitted>>>;

async fn accept_loop(listener: UnixListener, limits: Limits, tx: Sender) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let pending = Arc::new(Pending::new(limits.max_pending));
    let mut failing = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
        };
        let io = match accepted {
            Ok((io, _)) => io,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "accepting a connection failed; pausing between tries until one succeeds");
                }
                failing = true;
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_PAUSE) => continue,
                    () = tx.closed() => return,
                }
            }
        };
        failing = false;
        let slot = match limits.preface_timeout {
            None => None,
            Some(t) => tokio::select! {
                slot = Pending::enter(&pending) => Some((slot, t)),
                () = tx.closed() => return,
            },
        };
        tokio::spawn(admit(io, slot, Arc::clone(&permits), tx.clone()));
    }
}

/// Reads the preface of `io` (when `slot` says so), then hands it over holding a permit, or
/// closes it (dropped): wrong bytes, too slow, evicted, or every permit taken.
async fn admit(
    mut io: UnixStream,
    slot: Option<(PendingSlot, Duration)>,
    permits: Arc<Semaphore>,
    tx: Sender,
) {
    let first = match slot {
        None => Vec::new(),
        Some((slot, limit)) => {
            let read = tokio::time::timeout(limit, read_preface(&mut io));
            let ok = tokio::select! {
                r = read => matches!(r, Ok(Ok(true))),
                () = slot.evicted.cancelled() => false,
            };
            if !ok {
                // The descriptor is closed before its place is given back, so the accept loop
                // never holds more than the places' worth.
                drop(io);
                drop(slot);
                return;
            }
            PREFACE.to_vec()
        }
    };
    let Ok(permit) = permits.try_acquire_owned() else {
        tracing::debug!("every connection slot of this socket is taken; closing a new connection");
        return;
    };
    let _ = tx
        .send(Ok(AnyAuthority::new(Admitted::new(io, permit, first))))
        .await;
}

/// Whether `io`'s first bytes are exactly [`PREFACE`]; false at the first byte that differs
/// or at end of stream. Reads nothing past the preface.
async fn read_preface(io: &mut UnixStream) -> std::io::Result<bool> {
    let mut buf = [0u8; PREFACE.len()];
    let mut got = 0;
    while got < buf.len() {
        let n = io.read(&mut buf[got..]).await?;
        if n == 0 || buf[got..got + n] != PREFACE[got..got + n] {
            return Ok(false);
        }
        got += n;
    }
    Ok(true)
}

/// The pending connections of one socket, oldest first, and their places: a place is given
/// back only once its connection's descriptor is closed.
struct Pending {
    places: Arc<Semaphore>,
    next: AtomicU64,
    queue: Mutex<VecDeque<(u64, CancellationToken)>>,
}

/// One pending connection's place; leaves the queue and frees the place when dropped.
struct PendingSlot {
    pending: Arc<Pending>,
    id: u64,
    evicted: CancellationToken,
    _place: OwnedSemaphorePermit,
}

impl Pending {
    fn new(max: usize) -> Self {
        Pending {
            places: Arc::new(Semaphore::new(max.max(1))),
            next: AtomicU64::new(0),
            queue: Mutex::new(VecDeque::new()),
        }
    }

    /// A place for a new connection. When all are taken, the oldest pending connection is
    /// closed and its place awaited (the wait ends as soon as its task drops it).
    async fn enter(pending: &Arc<Pending>) -> PendingSlot {
        let place = match Arc::clone(&pending.places).try_acquire_owned() {
            Ok(place) => place,
            Err(_) => {
                let oldest = pending.lock().pop_front();
                if let Some((_, evicted)) = oldest {
                    evicted.cancel();
                }
                Arc::clone(&pending.places)
                    .acquire_owned()
                    .await
                    .expect("the places are never closed")
            }
        };
        let id = pending.next.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        pending.lock().push_back((id, evicted.clone()));
        PendingSlot {
            pending: Arc::clone(pending),
            id,
            evicted,
            _place: place,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut queue = self.pending.lock();
        if let Some(at) = queue.iter().position(|(id, _)| *id == self.id) {
            queue.remove(at);
        }
    }
}

/// An admitted connection holding one of its socket's permits until dropped; reads first
/// return the bytes already read from it (the preface), then the stream's.
#[derive(Debug)]
pub struct Admitted {
    io: UnixStream,
    first: Vec<u8>,
    pos: usize,
    _permit: OwnedSemaphorePermit,
}

impl Admitted {
    fn new(io: UnixStream, permit: OwnedSemaphorePermit, first: Vec<u8>) -> Self {
        Admitted {
            io,
            first,
            pos: 0,
            _permit: permit,
        }
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = <UnixStream as tonic::transport::server::Connected>::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Admitted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.pos < self.first.len() {
            let n = buf.remaining().min(self.first.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.first[start..start + n]);
            self.pos += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Admitted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
