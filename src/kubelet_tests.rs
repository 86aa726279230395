//! `register_until_done` against a kubelet that appears while registration is backing off.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::*;
use crate::api::registration_server::{Registration, RegistrationServer};

/// A kubelet that accepts every registration and reports it.
struct Kubelet(mpsc::UnboundedSender<api::RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(api::Empty {}))
    }
}

/// Runs a future and publishes, after every poll that leaves it pending, how many polls there
/// were and the (virtual) instant of the last one.
struct Polls<F> {
    inner: Pin<Box<F>>,
    count: u32,
    tx: watch::Sender<(u32, Instant)>,
}

impl<F: Future> Future for Polls<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let out = this.inner.as_mut().poll(cx);
        this.count += 1;
        if out.is_pending() {
            this.tx.send_replace((this.count, Instant::now()));
        }
        out
    }
}

/// Past this much (virtual) time of failed attempts every backoff delay is at least
/// [`BACKOFF_MAX`]: the delays before it reaches the cap (2 ms doubling, at most twice that with
/// jitter) add up to under 17 s.
const LONG: Duration = Duration::from_secs(30);

/// The identity of a socket that existed and is gone (a kubelet that stopped).
fn gone_kubelet(dir: &std::path::Path) -> KubeletId {
    let p = dir.join("old.sock");
    let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
    let id = KubeletId::of(&p).unwrap();
    drop(l);
    std::fs::remove_file(&p).unwrap();
    id
}

/// Serves a kubelet on `socket` that reports each registration.
fn serve_kubelet(
    socket: &std::path::Path,
) -> (
    mpsc::UnboundedReceiver<api::RegisterRequest>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let (registered_tx, registered) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet(registered_tx)))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    (registered, server)
}

/// Registration is aimed at a kubelet whose socket is gone, so it backs off until its delay is
/// [`BACKOFF_MAX`] or more (on a paused clock: no real waiting, and nothing but the backoff
/// timer wakes it). Then a new kubelet appears and the supervisor publishes its identity, as it
/// does when it sees kubelet.sock created: registration must complete before the delay it was
/// waiting out could have ended.
#[tokio::test(start_paused = true)]
async fn a_kubelet_that_appears_cuts_the_registration_backoff_short() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(api::KUBELET_SOCKET);
    let (identity, mut rx) = watch::channel(Some(gone_kubelet(dir.path())));
    let recheck = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let start = Instant::now();
    let (polls_tx, mut polls) = watch::channel((0, start));
    let mut task = {
        let (socket, recheck, stop) = (socket.clone(), Arc::clone(&recheck), stop.clone());
        tokio::spawn(Polls {
            inner: Box::pin(async move {
                register_until_done(
                    &socket,
                    "slicelet-example.com_gpu.sock",
                    "example.com/gpu",
                    &mut rx,
                    &recheck,
                    &stop,
                )
                .await
            }),
            count: 0,
            tx: polls_tx,
        })
    };

    // Each poll after the first is a backoff timer firing: one failed attempt (the socket is
    // not the expected one, so it fails at once), then the next delay begins at that instant.
    let (attempts, backoff_began) = *polls.wait_for(|(_, at)| *at >= start + LONG).await.unwrap();
    assert!(attempts >= 10, "only {attempts} attempts in {LONG:?}");
    // Each failed attempt asked the supervisor to look at the directory again.
    tokio::time::timeout(Duration::from_secs(1), recheck.notified())
        .await
        .expect("a recheck request");

    // The kubelet appears (back on the real clock, for the sockets), then its identity.
    tokio::time::resume();
    let (mut registered, server) = serve_kubelet(&socket);
    identity.send_replace(KubeletId::of(&socket));
    tokio::select! {
        biased;
        done = &mut task => assert_eq!(done.unwrap(), KubeletId::of(&socket), "registered with the new kubelet"),
        _ = tokio::time::sleep_until(backoff_began + BACKOFF_MAX) => panic!(
            "a new kubelet was announced, but registration is still waiting out the backoff \
             delay (at least {BACKOFF_MAX:?}) that began after attempt {attempts}"
        ),
    }
    let req = registered.recv().await.unwrap();
    assert_eq!(
        (
            req.version.as_str(),
            req.endpoint.as_str(),
            req.resource_name.as_str()
        ),
        (
            api::VERSION,
            "slicelet-example.com_gpu.sock",
            "example.com/gpu"
        )
    );
    assert!(registered.try_recv().is_err(), "registered once");
    server.abort();
}

/// A registration meant for a kubelet that has restarted is never delivered to its successor:
/// the successor gets exactly one registration, after its identity is announced.
#[tokio::test]
async fn a_registration_for_an_old_kubelet_is_not_sent_to_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(api::KUBELET_SOCKET);
    let old = gone_kubelet(dir.path());
    let (mut registered, server) = serve_kubelet(&socket);
    let new = KubeletId::of(&socket).unwrap();
    assert_ne!(old, new);
    let err = register(&socket, old, "slicelet-x.sock", "example.com/gpu")
        .await
        .unwrap_err();
    assert!(matches!(err, RegisterError::Superseded { .. }), "{err}");
    assert!(
        registered.try_recv().is_err(),
        "nothing reached the new kubelet"
    );
    register(&socket, new, "slicelet-x.sock", "example.com/gpu")
        .await
        .unwrap();
    assert_eq!(registered.recv().await.unwrap().endpoint, "slicelet-x.sock");
    server.abort();
}
