//! A kubelet emulator: the kubelet's side of the device-plugin protocol over real unix sockets,
//! for slicelet's integration tests, the README demo and the benchmark (one copy, shared by all;
//! a workspace crate of its own so that it is not compiled into the production library).
//!
//! It serves `Registration` on `<dir>/kubelet.sock`. On `Register` it checks the version and
//! endpoint, dials the plugin back and calls `GetDevicePluginOptions` before answering (as the
//! kubelet does, so a plugin that is not yet serving, or holds a lock across Register,
//! deadlocks here as it would on a node), then consumes `ListAndWatch` in the background.
//! [`KubeletEmulator::restart`] wipes the directory and re-creates `kubelet.sock`, as a real
//! kubelet start does; [`KubeletEmulator::restart_after`] waits between the two, and
//! [`KubeletEmulator::restart_leaving_stale_socket`] leaves the old, dead `kubelet.sock` in place
//! for a while first, as a crashed kubelet does.
//!
//! Every ListAndWatch response is recorded, per stream and in order ([`KubeletEmulator::streams`],
//! [`KubeletEmulator::lists`]), so a short phase (a GPU Unhealthy for half a second) cannot be
//! missed by a test that looks late. Tests wait with [`KubeletEmulator::wait_for`] (a predicate
//! on the latest state) or [`KubeletEmulator::wait_for_sequence`] (lists matching predicates in
//! order); both await the recorder's change notification under a timeout, never a sleep loop.

pub mod dra;
pub mod kube_api;
pub mod node_files;
pub mod pod_resources;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use slicelet::api::{
    self, device_plugin_client::DevicePluginClient, registration_server::Registration,
    registration_server::RegistrationServer,
};
use slicelet::kubelet::connect;

/// What the emulator knows about one registered resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceState {
    /// Socket file name the plugin registered.
    pub endpoint: String,
    /// Options the plugin answered at dial-back.
    pub options: Option<api::DevicePluginOptions>,
    /// How many registrations of the resource were accepted (dial-back and
    /// GetDevicePluginOptions answered) since the emulator started; kept across restarts.
    pub registrations: u32,
    /// How many `Register` calls named the resource since the emulator started, accepted or
    /// not; kept across restarts.
    pub register_calls: u32,
    /// The latest ListAndWatch list (None before the first).
    pub devices: Option<Vec<api::Device>>,
    /// ListAndWatch messages received on the current stream.
    pub lists_received: u32,
    /// The current stream is open.
    pub streaming: bool,
}

/// Everything the emulator has seen, by resource name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// Registered resources.
    pub resources: BTreeMap<String, ResourceState>,
}

impl State {
    /// Device count of a resource's latest list.
    pub fn device_count(&self, resource: &str) -> Option<usize> {
        self.resources.get(resource)?.devices.as_ref().map(Vec::len)
    }

    /// Healthy device count of a resource's latest list.
    pub fn healthy_count(&self, resource: &str) -> Option<usize> {
        let devs = self.resources.get(resource)?.devices.as_ref()?;
        Some(devs.iter().filter(|d| d.health == api::HEALTHY).count())
    }
}

/// One ListAndWatch stream of a resource and every list it delivered, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamLog {
    /// The stream's number: the resource's accepted registration that opened it (1, 2, …).
    pub stream: u32,
    /// Every list received on the stream, in order (shared, so copies are cheap).
    pub lists: Vec<Arc<[api::Device]>>,
    /// The stream is still open.
    pub open: bool,
}

/// One recorded ListAndWatch response.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedList {
    /// The stream it arrived on ([`StreamLog::stream`]).
    pub stream: u32,
    /// Its position on that stream, from 0.
    pub index: usize,
    /// The devices it listed.
    pub devices: Arc<[api::Device]>,
}

/// A predicate on one ListAndWatch list, for [`KubeletEmulator::wait_for_sequence`].
pub type ListPredicate<'a> = &'a (dyn Fn(&[api::Device]) -> bool + Sync);

/// Number of devices in `devices` whose health is `Healthy`.
pub fn healthy(devices: &[api::Device]) -> usize {
    devices.iter().filter(|d| d.health == api::HEALTHY).count()
}

/// The first lists of `lists` (in order) that satisfy `preds` in order, each after the
/// previous match; `None` unless every predicate matched. Greedy earliest matching finds a
/// match whenever one exists.
pub fn match_sequence(
    lists: &[RecordedList],
    preds: &[ListPredicate<'_>],
) -> Option<Vec<RecordedList>> {
    let mut matched = Vec::with_capacity(preds.len());
    let mut rest = lists.iter();
    for pred in preds {
        matched.push(rest.find(|l| pred(&l.devices))?.clone());
    }
    Some(matched)
}

#[derive(Clone)]
struct Shared {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    /// Per resource, every stream with every list, in order (kept apart from [`State`] so that
    /// copying the latest state stays cheap however long the history grows).
    history: Arc<Mutex<BTreeMap<String, Vec<StreamLog>>>>,
    changed: watch::Sender<u64>,
    streams: Arc<Mutex<BTreeMap<String, JoinHandle<()>>>>,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut State)) {
        {
            let mut s = self.state.lock().expect("emulator state poisoned");
            f(&mut s);
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// Applies `f` to the state and the history together (one notification), so a waiter
    /// never sees a list in one and not the other.
    fn record(&self, f: impl FnOnce(&mut State, &mut BTreeMap<String, Vec<StreamLog>>)) {
        {
            let mut s = self.state.lock().expect("emulator state poisoned");
            let mut h = self.history.lock().expect("emulator history poisoned");
            f(&mut s, &mut h);
        }
        self.changed.send_modify(|v| *v += 1);
    }
}

/// The emulator; dropping it stops serving.
pub struct KubeletEmulator {
    shared: Shared,
    stop: CancellationToken,
    server: Option<JoinHandle<()>>,
}

/// Waiting for a sequence of lists timed out; carries what was recorded for the failure message.
#[derive(Debug, thiserror::Error)]
#[error(
    "timed out after {after:?} waiting for {wanted} lists of {resource} matching in order \
     (the first {matched} matched); recorded:\n{recorded}"
)]
pub struct SequenceTimeout {
    /// How long it waited.
    pub after: Duration,
    /// The resource.
    pub resource: String,
    /// How many predicates were given.
    pub wanted: usize,
    /// How many of the first predicates had matched when it gave up.
    pub matched: usize,
    /// One line per recorded list: stream, index, device count, healthy count.
    pub recorded: String,
}

/// Waiting for a condition timed out; carries the last state for the failure message.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {after:?} waiting for the kubelet emulator; last state: {state:#?}")]
pub struct WaitTimeout {
    /// How long it waited.
    pub after: Duration,
    /// The state when it gave up.
    pub state: State,
}

impl KubeletEmulator {
    /// Creates `dir` if needed and serves `Registration` on `<dir>/kubelet.sock`.
    ///
    /// # Errors
    /// I/O errors creating the directory or binding the socket.
    pub async fn start(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (changed, _) = watch::channel(0);
        let shared = Shared {
            dir: dir.to_path_buf(),
            state: Arc::default(),
            history: Arc::default(),
            changed,
            streams: Arc::default(),
        };
        let mut emu = KubeletEmulator {
            shared,
            stop: CancellationToken::new(),
            server: None,
        };
        emu.serve()?;
        Ok(emu)
    }

    fn serve(&mut self) -> std::io::Result<()> {
        let path = self.shared.dir.join(api::KUBELET_SOCKET);
        let listener = tokio::net::UnixListener::bind(&path)?;
        let svc = RegistrationServer::new(Registrar {
            shared: self.shared.clone(),
        });
        let stop = self.stop.clone();
        self.server = Some(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop.cancelled())
                .await;
        }));
        Ok(())
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// A copy of the current state.
    pub fn state(&self) -> State {
        self.shared
            .state
            .lock()
            .expect("emulator state poisoned")
            .clone()
    }

    /// Waits until `pred` holds for the state, up to `timeout`.
    ///
    /// # Errors
    /// [`WaitTimeout`] with the last state.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&State) -> bool,
    ) -> Result<State, WaitTimeout> {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let s = self.state();
            if pred(&s) {
                return Ok(s);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    return Err(WaitTimeout {
                        after: timeout,
                        state: self.state(),
                    })
                }
            }
        }
    }

    /// Accepted registrations of `resource` since the emulator started (0 when never seen);
    /// kept across [`restart`](Self::restart).
    pub fn registrations(&self, resource: &str) -> u32 {
        self.state()
            .resources
            .get(resource)
            .map_or(0, |r| r.registrations)
    }

    /// `Register` calls naming `resource` since the emulator started, accepted or refused
    /// (0 when never seen); kept across [`restart`](Self::restart).
    pub fn register_calls(&self, resource: &str) -> u32 {
        self.state()
            .resources
            .get(resource)
            .map_or(0, |r| r.register_calls)
    }

    /// Every ListAndWatch stream of `resource` since the emulator started, oldest first, each
    /// with every list it delivered in order (empty when never registered). Kept across
    /// [`restart`](Self::restart).
    pub fn streams(&self, resource: &str) -> Vec<StreamLog> {
        self.shared
            .history
            .lock()
            .expect("emulator history poisoned")
            .get(resource)
            .cloned()
            .unwrap_or_default()
    }

    /// Every list `resource` delivered, over all its streams, in arrival order.
    pub fn lists(&self, resource: &str) -> Vec<RecordedList> {
        flatten(&self.streams(resource))
    }

    /// Waits until the lists `resource` delivered (over all its streams, in arrival order, from
    /// the first) contain lists matching `preds` in order: a list matching `preds[0]`, a later
    /// one matching `preds[1]`, and so on (other lists may come between). Returns the matched
    /// lists. Nothing is missed however short a phase: every list is recorded.
    ///
    /// To look only at what comes after some point, take `lists(resource).len()` there and use
    /// [`wait_for_sequence_after`](Self::wait_for_sequence_after).
    ///
    /// # Errors
    /// [`SequenceTimeout`] after `timeout`, with a summary of every recorded list.
    pub async fn wait_for_sequence(
        &self,
        resource: &str,
        preds: &[ListPredicate<'_>],
        timeout: Duration,
    ) -> Result<Vec<RecordedList>, SequenceTimeout> {
        self.wait_for_sequence_after(resource, 0, preds, timeout)
            .await
    }

    /// [`wait_for_sequence`](Self::wait_for_sequence) over the lists after the first `skip`
    /// (in arrival order over all streams).
    ///
    /// # Errors
    /// [`SequenceTimeout`] after `timeout`, with a summary of every recorded list.
    pub async fn wait_for_sequence_after(
        &self,
        resource: &str,
        skip: usize,
        preds: &[ListPredicate<'_>],
        timeout: Duration,
    ) -> Result<Vec<RecordedList>, SequenceTimeout> {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            let lists = self.lists(resource);
            let tail = lists.get(skip..).unwrap_or_default();
            if let Some(found) = match_sequence(tail, preds) {
                return Ok(found);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    let lists = self.lists(resource);
                    let tail = lists.get(skip..).unwrap_or_default();
                    let matched = (0..preds.len())
                        .rev()
                        .find(|&n| match_sequence(tail, &preds[..n]).is_some())
                        .unwrap_or(0);
                    return Err(SequenceTimeout {
                        after: timeout,
                        resource: resource.to_string(),
                        wanted: preds.len(),
                        matched,
                        recorded: summary(&lists, skip),
                    });
                }
            }
        }
    }

    /// A client for a registered resource's plugin socket, as the kubelet would dial it.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unregistered resource, `UNAVAILABLE` when dialing fails.
    pub async fn client(&self, resource: &str) -> Result<DevicePluginClient<Channel>, Status> {
        let endpoint = self
            .state()
            .resources
            .get(resource)
            .map(|r| r.endpoint.clone())
            .ok_or_else(|| Status::not_found(format!("{resource} is not registered")))?;
        let channel = connect(&self.shared.dir.join(endpoint))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(DevicePluginClient::new(channel))
    }

    /// Simulates a kubelet restart: stop serving, close every ListAndWatch stream, delete every
    /// file in the directory (as the kubelet's device manager does at start), forget the
    /// devices (registration counts are kept), and serve a new `kubelet.sock`.
    ///
    /// # Errors
    /// I/O errors wiping the directory or binding the socket.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        self.restart_after(Duration::ZERO).await
    }

    /// [`restart`](Self::restart) with `gap` between the old kubelet stopping and the new one
    /// serving: the directory is wiped at once, so during the gap there is no `kubelet.sock`
    /// at all (a kubelet that cleaned up, then took `gap` to start).
    ///
    /// # Errors
    /// I/O errors wiping the directory or binding the socket.
    pub async fn restart_after(&mut self, gap: Duration) -> std::io::Result<()> {
        self.stop_and_forget().await;
        self.wipe()?;
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        self.stop = CancellationToken::new();
        self.serve()
    }

    /// A kubelet restart that leaves the old `kubelet.sock` behind for `gap`, as a kubelet that
    /// crashed does: stop serving and close every ListAndWatch stream, but keep every file in
    /// the directory (the old `kubelet.sock` is then stale: the file is there, nobody listens,
    /// connecting is refused; the plugins' sockets stay too). After `gap` the new kubelet
    /// starts as [`restart`](Self::restart) does: it wipes the directory and serves a new
    /// `kubelet.sock` (a new file, so its identity differs from the stale one's).
    ///
    /// # Errors
    /// I/O errors wiping the directory or binding the socket; `NotFound` when the stale
    /// `kubelet.sock` was gone before the gap ended (someone else removed it).
    pub async fn restart_leaving_stale_socket(&mut self, gap: Duration) -> std::io::Result<()> {
        self.stop_and_forget().await;
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let path = self.shared.dir.join(api::KUBELET_SOCKET);
        if let Err(e) = std::fs::symlink_metadata(&path) {
            return Err(std::io::Error::new(
                e.kind(),
                format!("the stale {} was removed during the gap", path.display()),
            ));
        }
        self.wipe()?;
        self.stop = CancellationToken::new();
        self.serve()
    }

    /// Stops serving, closes every stream and forgets the devices (registration counts are
    /// kept): the kubelet is gone. Files in the directory are left alone.
    async fn stop_and_forget(&mut self) {
        self.shutdown().await;
        self.shared.record(|s, h| {
            for r in s.resources.values_mut() {
                r.devices = None;
                r.streaming = false;
                r.lists_received = 0;
            }
            for log in h.values_mut().flatten() {
                log.open = false;
            }
        });
    }

    /// Deletes every file in the directory (subdirectories are kept), as the kubelet's device
    /// manager does at start.
    fn wipe(&self) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.shared.dir)? {
            let entry = entry?;
            // A plugin may remove its own socket at the same moment: gone is fine.
            match entry.file_type() {
                Ok(t) if t.is_dir() => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
                Ok(_) => {}
            }
            match std::fs::remove_file(entry.path()) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Closes every ListAndWatch stream as a kubelet does when it drops a plugin, without
    /// restarting: the plugin must notice and register again.
    pub fn drop_streams(&self) {
        let streams = std::mem::take(&mut *self.shared.streams.lock().expect("poisoned"));
        for (_, h) in streams {
            h.abort();
        }
        self.close_logs();
    }

    /// Marks every recorded stream closed (their tasks were aborted, so they cannot).
    fn close_logs(&self) {
        self.shared.record(|_, h| {
            for log in h.values_mut().flatten() {
                log.open = false;
            }
        });
    }

    /// Stops serving and closes every stream.
    pub async fn shutdown(&mut self) {
        self.stop.cancel();
        if let Some(h) = self.server.take() {
            let _ = h.await;
        }
        let streams = std::mem::take(&mut *self.shared.streams.lock().expect("poisoned"));
        for (_, h) in streams {
            h.abort();
        }
        self.close_logs();
    }
}

impl Drop for KubeletEmulator {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Ok(streams) = self.shared.streams.lock() {
            for h in streams.values() {
                h.abort();
            }
        }
    }
}

struct Registrar {
    shared: Shared,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let req = request.into_inner();
        self.shared.update(|s| {
            s.resources
                .entry(req.resource_name.clone())
                .or_default()
                .register_calls += 1;
        });
        if req.version != api::VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported API version {:?}",
                req.version
            )));
        }
        if req.endpoint.is_empty() || req.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} must be a file name in the device-plugin directory",
                req.endpoint
            )));
        }
        // Dial back while Register is pending, as the kubelet does.
        let channel = connect(&self.shared.dir.join(&req.endpoint))
            .await
            .map_err(|e| Status::unavailable(format!("dialing {}: {e}", req.endpoint)))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(api::Empty {})
            .await?
            .into_inner();
        let resource = req.resource_name.clone();
        // A new registration replaces the old endpoint: the kubelet stops the old client. The
        // streams map stays locked until the new stream's task is recorded, so restart() and
        // drop_streams() never miss it.
        let mut streams = self.shared.streams.lock().expect("poisoned");
        if let Some(old) = streams.remove(&resource) {
            old.abort();
        }
        let mut generation = 0;
        self.shared.record(|s, h| {
            let r = s.resources.entry(resource.clone()).or_default();
            r.endpoint = req.endpoint.clone();
            r.options = Some(options);
            r.registrations += 1;
            r.devices = None;
            r.lists_received = 0;
            r.streaming = true;
            generation = r.registrations;
            let logs = h.entry(resource.clone()).or_default();
            for old in logs.iter_mut() {
                old.open = false;
            }
            logs.push(StreamLog {
                stream: generation,
                lists: Vec::new(),
                open: true,
            });
        });
        let shared = self.shared.clone();
        let name = resource.clone();
        // Only this registration's stream may change the state (an older stream ending late
        // must not mark the new one closed).
        let handle = tokio::spawn(async move {
            let stream = client.list_and_watch(api::Empty {}).await;
            if let Ok(stream) = stream {
                let mut stream = stream.into_inner();
                while let Ok(Some(msg)) = stream.message().await {
                    let devices: Arc<[api::Device]> = msg.devices.into();
                    shared.record(|s, h| {
                        // Every list is recorded on its own stream's log, even a late one on
                        // an older stream; only the current stream sets the latest state.
                        if let Some(log) = h
                            .get_mut(&name)
                            .and_then(|logs| logs.iter_mut().find(|l| l.stream == generation))
                        {
                            log.lists.push(Arc::clone(&devices));
                        }
                        if let Some(r) = s
                            .resources
                            .get_mut(&name)
                            .filter(|r| r.registrations == generation)
                        {
                            r.devices = Some(devices.to_vec());
                            r.lists_received += 1;
                        }
                    });
                }
            }
            shared.record(|s, h| {
                if let Some(log) = h
                    .get_mut(&name)
                    .and_then(|logs| logs.iter_mut().find(|l| l.stream == generation))
                {
                    log.open = false;
                }
                if let Some(r) = s
                    .resources
                    .get_mut(&name)
                    .filter(|r| r.registrations == generation)
                {
                    r.streaming = false;
                }
            });
        });
        streams.insert(resource, handle);
        drop(streams);
        Ok(Response::new(api::Empty {}))
    }
}

fn flatten(logs: &[StreamLog]) -> Vec<RecordedList> {
    logs.iter()
        .flat_map(|log| {
            log.lists
                .iter()
                .enumerate()
                .map(move |(index, devices)| RecordedList {
                    stream: log.stream,
                    index,
                    devices: Arc::clone(devices),
                })
        })
        .collect()
}

/// One line per recorded list, marking those before `skip` as not considered.
fn summary(lists: &[RecordedList], skip: usize) -> String {
    let mut out = String::new();
    for (n, l) in lists.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {}stream {} list {}: {} devices, {} healthy",
            if n < skip { "(skipped) " } else { "" },
            l.stream,
            l.index,
            l.devices.len(),
            healthy(&l.devices)
        );
    }
    if out.is_empty() {
        out.push_str("  (no lists)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(stream: u32, index: usize, healthy: &[bool]) -> RecordedList {
        let devices: Vec<api::Device> = healthy
            .iter()
            .enumerate()
            .map(|(i, h)| api::Device {
                id: format!("GPU-{i}"),
                health: if *h { api::HEALTHY } else { api::UNHEALTHY }.to_string(),
                ..Default::default()
            })
            .collect();
        RecordedList {
            stream,
            index,
            devices: devices.into(),
        }
    }

    #[test]
    fn sequences_match_in_order_with_lists_between() {
        let all_up = |d: &[api::Device]| healthy(d) == d.len();
        let one_down = |d: &[api::Device]| healthy(d) + 1 == d.len();
        let lists = [
            list(1, 0, &[true, true]),
            list(1, 1, &[false, true]),
            list(1, 2, &[false, false]),
            list(2, 0, &[true, true]),
        ];
        let found = match_sequence(&lists, &[&one_down, &all_up]).unwrap();
        assert_eq!(
            found
                .iter()
                .map(|l| (l.stream, l.index))
                .collect::<Vec<_>>(),
            [(1, 1), (2, 0)]
        );
        // Order matters: nothing comes after the last all-up list.
        assert!(match_sequence(&lists[1..], &[&all_up, &one_down]).is_none());
        // One list cannot satisfy two steps.
        assert!(match_sequence(&lists[..2], &[&one_down, &one_down]).is_none());
        assert_eq!(match_sequence(&lists, &[]), Some(vec![]));
    }

    #[test]
    fn the_summary_names_every_list_and_marks_the_skipped() {
        let lists = [list(1, 0, &[true]), list(1, 1, &[false])];
        assert_eq!(
            summary(&lists, 1),
            "  (skipped) stream 1 list 0: 1 devices, 1 healthy\n  stream 1 list 1: 1 devices, 0 healthy\n"
        );
        assert_eq!(summary(&[], 0), "  (no lists)\n");
    }

    #[test]
    fn flattening_keeps_arrival_order_over_streams() {
        let a: Arc<[api::Device]> = Vec::new().into();
        let logs = [
            StreamLog {
                stream: 1,
                lists: vec![a.clone(), a.clone()],
                open: false,
            },
            StreamLog {
                stream: 3,
                lists: vec![a.clone()],
                open: true,
            },
        ];
        let got: Vec<_> = flatten(&logs).iter().map(|l| (l.stream, l.index)).collect();
        assert_eq!(got, [(1, 0), (1, 1), (3, 0)]);
    }
}
