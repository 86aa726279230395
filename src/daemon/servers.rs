//! Reconciling the device-plugin servers with the plan: one gRPC server per resource on its
//! unix socket, registered once per kubelet.
//!
//! Rules (kubelet 1.32 device manager):
//! - A resource's socket serves before `Register` is sent (the kubelet dials back inside it).
//! - A kubelet restart is known by the identity of `kubelet.sock` ([`KubeletId`]), not by
//!   counting directory events: however many events one restart produces (our sockets removed,
//!   the old `kubelet.sock` removed, the new one created), the servers registered with the old
//!   kubelet are restarted once, and a registration still pending is re-aimed at the new
//!   kubelet instead of being sent twice.
//! - The old server's ListAndWatch stream ends before the new registration is sent (the kubelet
//!   drops a registration when an older stream closes after it).
//! - Every task (servers, registrations) is tracked in one `JoinSet`; shutdown has one overall
//!   deadline, after which whatever still runs is aborted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::KUBELET_SOCKET;
use crate::kubelet::KubeletId;
use crate::plan::Plan;
use crate::plugin::{self, StreamEvent, StreamKind};
use crate::status::{Metrics, Status};

/// First delay before registering again after the kubelet closed a stream; a kubelet restart
/// in that window supersedes it, so one restart costs one registration.
const LOST_STREAM_MIN_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between re-registrations of a resource whose streams keep being closed.
const LOST_STREAM_MAX_DELAY: Duration = Duration::from_secs(30);
/// A stream that lasted this long resets the re-registration backoff.
const LOST_STREAM_RESET: Duration = Duration::from_secs(60);
/// How long a new registration waits for the previous server of its resource to stop (its
/// stream to end) before aborting it.
const RESTART_DEADLINE: Duration = Duration::from_millis(200);
/// Capacity of the channels from servers and registrations to the supervisor.
pub(super) const CHANNEL_CAPACITY: usize = 1024;

/// A registration finished: `resource`'s server of `epoch` is registered with `kubelet`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Registered {
    pub resource: String,
    pub epoch: u64,
    pub kubelet: KubeletId,
}

struct Server {
    epoch: u64,
    stop: CancellationToken,
    /// Cancelled when the serve task has ended.
    done: CancellationToken,
    serve: AbortHandle,
    register: AbortHandle,
    path: PathBuf,
    id: (u64, u64),
    registered: Option<KubeletId>,
    /// When registration succeeded and no ListAndWatch stream has opened since: the kubelet
    /// must open one within the stream grace ([`crate::settings::Settings::stream_grace`]; the
    /// kubelet dials back inside `Register`, so it is normally at once).
    awaiting_stream: Option<Instant>,
}

/// The device-plugin servers and their registrations.
pub(super) struct Servers {
    dir: PathBuf,
    dev_root: String,
    plans: watch::Receiver<Arc<Plan>>,
    servers: BTreeMap<String, Server>,
    tasks: JoinSet<()>,
    identity: watch::Sender<Option<KubeletId>>,
    recheck: Arc<Notify>,
    allocated: Arc<crate::plugin::Allocated>,
    registered_tx: mpsc::Sender<Registered>,
    lost_tx: mpsc::Sender<StreamEvent>,
    epoch: u64,
    unserved: BTreeSet<String>,
    lost_backoff: BTreeMap<String, (backon::ExponentialBackoff, Instant)>,
    shutdown: CancellationToken,
    status: Arc<watch::Sender<Status>>,
    metrics: Arc<Metrics>,
    stream_grace: Duration,
}

/// What the servers send back to the supervisor's loop.
pub(super) struct ServerEvents {
    pub registered: mpsc::Receiver<Registered>,
    pub streams: mpsc::Receiver<StreamEvent>,
    /// Notified when a registration found `kubelet.sock` to be another socket than expected.
    pub recheck: Arc<Notify>,
    /// Signalled after successful Allocates (what is in use changed): once until rearmed.
    pub allocated: Arc<crate::plugin::Allocated>,
}

impl Servers {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        dir: PathBuf,
        dev_root: String,
        plans: watch::Receiver<Arc<Plan>>,
        shutdown: CancellationToken,
        status: Arc<watch::Sender<Status>>,
        metrics: Arc<Metrics>,
        stream_grace: Duration,
    ) -> (Self, ServerEvents) {
        let (registered_tx, registered) = mpsc::channel(CHANNEL_CAPACITY);
        let (lost_tx, streams) = mpsc::channel(CHANNEL_CAPACITY);
        let recheck = Arc::new(Notify::new());
        let allocated = Arc::new(crate::plugin::Allocated::default());
        let identity = KubeletId::of(&dir.join(KUBELET_SOCKET));
        let servers = Servers {
            dir,
            dev_root,
            plans,
            servers: BTreeMap::new(),
            tasks: JoinSet::new(),
            identity: watch::Sender::new(identity),
            recheck: Arc::clone(&recheck),
            allocated: Arc::clone(&allocated),
            registered_tx,
            lost_tx,
            epoch: 0,
            unserved: BTreeSet::new(),
            lost_backoff: BTreeMap::new(),
            shutdown,
            status,
            metrics,
            stream_grace,
        };
        (
            servers,
            ServerEvents {
                registered,
                streams,
                recheck,
                allocated,
            },
        )
    }

    /// Resources whose socket could not be bound (retried).
    pub(super) fn has_unserved(&self) -> bool {
        !self.unserved.is_empty()
    }

    /// Reaps one finished task (a future for the supervisor's `select!`; pending while none).
    pub(super) async fn reap(&mut self) {
        if self.tasks.join_next().await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// Starts servers for resources that appeared in `plan`, stops those that left it.
    /// Unchanged resources are left alone (their streams see the new plan, or nothing).
    pub(super) fn reconcile(&mut self, plan: &Plan) {
        let removed: Vec<String> = self
            .servers
            .keys()
            .filter(|n| plan.resources.get(*n).is_none_or(|r| r.dra))
            .cloned()
            .collect();
        for name in removed {
            tracing::info!(resource = %name, "resource removed; stopping its server");
            if let Some(s) = self.servers.remove(&name) {
                self.retire(&name, &s);
            }
            self.lost_backoff.remove(&name);
        }
        // DRA resources are served by DRA only ([`crate::dra`]), never also here.
        self.unserved
            .retain(|n| plan.resources.get(n).is_some_and(|r| !r.dra));
        let wanted: Vec<String> = plan
            .resources
            .iter()
            .filter(|(n, r)| !r.dra && !self.servers.contains_key(*n))
            .map(|(n, _)| n.clone())
            .collect();
        for name in wanted {
            self.start(&name, None, Duration::ZERO);
        }
    }

    /// Ends a server: its streams end, its registration is cancelled, its socket removed.
    fn retire(&self, name: &str, s: &Server) {
        s.stop.cancel();
        s.register.abort();
        plugin::remove_if_ours(&s.path, s.id);
        self.forget(name);
    }

    /// `name` is no longer registered, streaming or stalled, as far as `/readyz` goes.
    fn forget(&self, name: &str) {
        self.status.send_if_modified(|st| {
            let a = st.registered.remove(name);
            let b = st.streaming.remove(name);
            let c = st.stalled.remove(name);
            a || b || c
        });
    }

    /// Binds and serves `name`, registering once `previous` (the server it replaces) has
    /// stopped and `delay` has passed. A socket that cannot be bound is retried.
    fn start(
        &mut self,
        name: &str,
        previous: Option<(CancellationToken, AbortHandle)>,
        delay: Duration,
    ) {
        let socket = match plugin::bind(&self.dir, name) {
            Ok(s) => s,
            Err(e) => {
                if self.unserved.insert(name.to_string()) {
                    tracing::error!(resource = %name, error = %crate::errors::chain(&e), "cannot serve resource; retrying every second and when the directory changes");
                }
                return;
            }
        };
        if self.unserved.remove(name) {
            tracing::info!(resource = %name, "socket bound after earlier failures");
        }
        self.epoch += 1;
        let epoch = self.epoch;
        let stop = self.shutdown.child_token();
        let done = CancellationToken::new();
        let path = socket.path.clone();
        let id = socket.id;
        let endpoint = socket.endpoint.clone();
        let service = plugin::Service::new(
            name,
            self.plans.clone(),
            stop.clone(),
            self.dev_root.clone(),
        )
        .report_streams(self.lost_tx.clone(), epoch)
        .report_allocations(Arc::clone(&self.allocated));
        let serving = AbortOnDrop(plugin::serve(socket, service, stop.clone()));
        let finished = done.clone();
        // Aborting this task (a restart past its deadline, shutdown past its deadline) drops
        // the guard, which aborts the server task itself, not only this wait for it.
        let serve = self.tasks.spawn(async move {
            let mut serving = serving;
            let _ = (&mut serving.0).await;
            finished.cancel();
        });
        let register = self.tasks.spawn(
            Registration {
                previous,
                delay,
                kubelet: self.dir.join(KUBELET_SOCKET),
                endpoint,
                resource: name.to_string(),
                identity: self.identity.subscribe(),
                recheck: Arc::clone(&self.recheck),
                stop: stop.clone(),
                registered: self.registered_tx.clone(),
                epoch,
            }
            .run(),
        );
        tracing::debug!(resource = %name, socket = %path.display(), "serving");
        self.servers.insert(
            name.to_string(),
            Server {
                epoch,
                stop,
                done,
                serve,
                register,
                path,
                id,
                registered: None,
                awaiting_stream: None,
            },
        );
    }

    /// Replaces `name`'s server: the old one stops (its stream ends) and a new one binds at
    /// once and registers when the old one has stopped, after `delay`.
    fn restart(&mut self, name: &str, delay: Duration) {
        let Some(old) = self.servers.remove(name) else {
            return;
        };
        self.retire(name, &old);
        if self.plans.borrow().resources.contains_key(name) {
            self.start(name, Some((old.done, old.serve)), delay);
        }
    }

    /// Looks at the device-plugin directory again after an event (or a registration that
    /// found another socket than expected): a new `kubelet.sock` restarts the servers that were
    /// registered with the old kubelet (once each, however many events led here) and re-aims
    /// pending registrations; a socket of ours that is gone is served again.
    pub(super) fn kubelet_dir_changed(&mut self) {
        let now = KubeletId::of(&self.dir.join(KUBELET_SOCKET));
        // Sockets of ours that are gone first, before a new kubelet is announced: a
        // registration woken by the announcement must not be under way from a server about to
        // be replaced (its Register could reach the new kubelet, and then its successor's too).
        let lost: Vec<String> = self
            .servers
            .iter()
            .filter(|(_, s)| !socket_is(&s.path, s.id))
            .map(|(n, _)| n.clone())
            .collect();
        for name in lost {
            tracing::info!(resource = %name, "our socket is gone; serving and registering it again");
            self.restart(&name, Duration::ZERO);
        }
        let changed = self.identity.send_if_modified(|id| {
            let differs = *id != now;
            *id = now;
            differs
        });
        if changed && now.is_some() {
            self.lost_backoff.clear();
            let stale: Vec<String> = self
                .servers
                .iter()
                .filter(|(_, s)| s.registered.is_some_and(|r| Some(r) != now))
                .map(|(n, _)| n.clone())
                .collect();
            tracing::info!(
                restarted = stale.len(),
                "new kubelet.sock: kubelet restart seen; registering every resource with it"
            );
            for name in stale {
                self.restart(&name, Duration::ZERO);
            }
        }
        self.retry_unserved();
    }

    /// A registration finished.
    pub(super) fn registered(&mut self, r: Registered) {
        let current = *self.identity.borrow();
        let Some(s) = self.servers.get_mut(&r.resource) else {
            return;
        };
        if s.epoch != r.epoch {
            return;
        }
        s.registered = Some(r.kubelet);
        if s.awaiting_stream.is_none() && !self.status.borrow().streaming.contains(&r.resource) {
            s.awaiting_stream = Some(Instant::now() + self.stream_grace);
        }
        self.metrics.registered(&r.resource);
        self.status.send_modify(|st| {
            st.registered.insert(r.resource.clone());
        });
        if current.is_some() && current != Some(r.kubelet) {
            // The kubelet restarted while this registration was in flight.
            self.restart(&r.resource, Duration::ZERO);
        }
    }

    /// A stream opened or was lost.
    pub(super) fn stream_event(&mut self, ev: StreamEvent) {
        match ev.kind {
            StreamKind::Opened => {
                let Some(s) = self.servers.get_mut(&ev.resource) else {
                    return;
                };
                if s.epoch != ev.epoch {
                    return;
                }
                s.awaiting_stream = None;
                self.status.send_if_modified(|st| {
                    let a = st.streaming.insert(ev.resource.clone());
                    let b = st.stalled.remove(&ev.resource);
                    a || b
                });
            }
            StreamKind::Lost => self.stream_lost(ev),
        }
    }

    /// When the earliest registered server without a stream runs out of grace, if any.
    pub(super) fn next_stream_deadline(&self) -> Option<Instant> {
        self.servers
            .values()
            .filter_map(|s| s.awaiting_stream)
            .min()
    }

    /// Registered resources whose kubelet opened no ListAndWatch stream within
    /// the stream grace are reported (`/readyz` 503) until one opens.
    pub(super) fn check_streams(&mut self) {
        let now = Instant::now();
        let mut late = Vec::new();
        for (name, s) in &mut self.servers {
            if s.awaiting_stream.is_some_and(|t| t <= now) {
                s.awaiting_stream = None;
                late.push(name.clone());
            }
        }
        for name in late {
            tracing::warn!(resource = %name, grace = ?self.stream_grace, "registered with the kubelet, but it opened no ListAndWatch stream");
            self.status.send_modify(|st| {
                st.stalled.insert(name);
            });
        }
    }

    /// The kubelet closed a resource's ListAndWatch stream while we still serve it (kubelet
    /// stopped, or dropped the stream): serve it afresh and register again with backoff.
    fn stream_lost(&mut self, lost: StreamEvent) {
        if self.servers.get(&lost.resource).map(|s| s.epoch) != Some(lost.epoch) {
            return; // a server already replaced
        }
        let now = Instant::now();
        let entry = self
            .lost_backoff
            .entry(lost.resource.clone())
            .or_insert_with(|| (lost_stream_backoff(), now));
        if now.duration_since(entry.1) > LOST_STREAM_RESET {
            entry.0 = lost_stream_backoff();
        }
        entry.1 = now;
        let delay = entry.0.next().unwrap_or(LOST_STREAM_MAX_DELAY);
        tracing::warn!(resource = %lost.resource, register_in = ?delay, "the kubelet closed the ListAndWatch stream; registering again");
        self.restart(&lost.resource, delay);
    }

    /// Tries again to serve resources whose socket could not be bound.
    pub(super) fn retry_unserved(&mut self) {
        let wanted: Vec<String> = self
            .unserved
            .iter()
            .filter(|n| self.plans.borrow().resources.contains_key(*n))
            .cloned()
            .collect();
        self.unserved.retain(|n| wanted.contains(n));
        for name in wanted {
            if !self.servers.contains_key(&name) {
                self.start(&name, None, Duration::ZERO);
            }
        }
    }

    /// Stops every server and registration within one overall `deadline`, then aborts
    /// whatever still runs and removes our sockets.
    pub(super) async fn shutdown(mut self, deadline: Duration) {
        let servers = std::mem::take(&mut self.servers);
        for (name, s) in &servers {
            s.stop.cancel();
            s.register.abort();
            self.forget(name);
        }
        let drained = tokio::time::timeout(deadline, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = self.tasks.len(),
                "servers did not stop in time; aborting them"
            );
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        for s in servers.values() {
            plugin::remove_if_ours(&s.path, s.id);
        }
    }
}

/// Aborts the task it holds when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether the socket file at `path` is still the one with identity `id`.
fn socket_is(path: &std::path::Path, id: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id)
}

fn lost_stream_backoff() -> backon::ExponentialBackoff {
    backon::BackoffBuilder::build(
        backon::ExponentialBuilder::default()
            .with_min_delay(LOST_STREAM_MIN_DELAY)
            .with_max_delay(LOST_STREAM_MAX_DELAY)
            .without_max_times(),
    )
}

/// One resource's registration with the kubelet, run as a task by `Servers::start`: waits for
/// the server it replaces to stop (aborting it past [`RESTART_DEADLINE`]), then the backoff
/// `delay` (cut short by a new kubelet), registers until done and reports it.
struct Registration {
    previous: Option<(CancellationToken, AbortHandle)>,
    delay: Duration,
    kubelet: PathBuf,
    endpoint: String,
    resource: String,
    identity: watch::Receiver<Option<KubeletId>>,
    recheck: Arc<Notify>,
    stop: CancellationToken,
    registered: mpsc::Sender<Registered>,
    epoch: u64,
}

impl Registration {
    async fn run(mut self) {
        if let Some((old_done, old_serve)) = self.previous.take() {
            if tokio::time::timeout(RESTART_DEADLINE, old_done.cancelled())
                .await
                .is_err()
            {
                tracing::warn!(resource = %self.resource, "previous server did not stop in time; aborting it");
                old_serve.abort();
            }
        }
        // The backoff after a lost stream is for a kubelet that closed it while alive; a new
        // kubelet (a changed kubelet.sock) supersedes it at once.
        if !self.delay.is_zero() {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(self.delay) => {}
                _ = self.identity.changed() => {}
            }
        }
        let registered = crate::kubelet::register_until_done(
            &self.kubelet,
            &self.endpoint,
            &self.resource,
            &mut self.identity,
            &self.recheck,
            &self.stop,
        )
        .await;
        if let Some(kubelet) = registered {
            let _ = self
                .registered
                .send(Registered {
                    resource: self.resource,
                    epoch: self.epoch,
                    kubelet,
                })
                .await;
        }
    }
}
