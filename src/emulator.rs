//! A kubelet emulator: the kubelet's side of the device-plugin protocol over real unix sockets,
//! for the integration tests and the README demo (one copy, shared by both).
//!
//! It serves `Registration` on `<dir>/kubelet.sock`. On `Register` it checks the version and
//! endpoint, dials the plugin back and calls `GetDevicePluginOptions` before answering (as the
//! kubelet does, so a plugin that is not yet serving, or holds a lock across Register,
//! deadlocks here as it would on a node), then consumes `ListAndWatch` in the background.
//! [`KubeletEmulator::restart`] wipes the directory and re-creates `kubelet.sock`, as a real
//! kubelet start does. Tests wait on state with [`KubeletEmulator::wait_for`], which awaits a
//! change notification under a timeout (never a sleep loop).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::api::{
    self, device_plugin_client::DevicePluginClient, registration_server::Registration,
    registration_server::RegistrationServer,
};
use crate::kubelet::connect;

/// What the emulator knows about one registered resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourceState {
    /// Socket file name the plugin registered.
    pub endpoint: String,
    /// Options the plugin answered at dial-back.
    pub options: Option<api::DevicePluginOptions>,
    /// How many times the resource registered since the emulator started.
    pub registrations: u32,
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

#[derive(Clone)]
struct Shared {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
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
}

/// The emulator; dropping it stops serving.
pub struct KubeletEmulator {
    shared: Shared,
    stop: CancellationToken,
    server: Option<JoinHandle<()>>,
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
        self.shutdown().await;
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
        self.shared.update(|s| {
            for r in s.resources.values_mut() {
                r.devices = None;
                r.streaming = false;
                r.lists_received = 0;
            }
        });
        self.stop = CancellationToken::new();
        self.serve()
    }

    /// Closes every ListAndWatch stream as a kubelet does when it drops a plugin, without
    /// restarting: the plugin must notice and register again.
    pub fn drop_streams(&self) {
        let streams = std::mem::take(&mut *self.shared.streams.lock().expect("poisoned"));
        for (_, h) in streams {
            h.abort();
        }
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
        self.shared.update(|s| {
            let r = s.resources.entry(resource.clone()).or_default();
            r.endpoint = req.endpoint.clone();
            r.options = Some(options);
            r.registrations += 1;
            r.devices = None;
            r.lists_received = 0;
            r.streaming = true;
            generation = r.registrations;
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
                    shared.update(|s| {
                        if let Some(r) = s
                            .resources
                            .get_mut(&name)
                            .filter(|r| r.registrations == generation)
                        {
                            r.devices = Some(msg.devices);
                            r.lists_received += 1;
                        }
                    });
                }
            }
            shared.update(|s| {
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
