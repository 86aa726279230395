//! One kubelet `DevicePlugin` gRPC server per resource, on its own unix socket in the
//! device-plugin directory. Thin: sharing logic lives in [`crate::plan`] and
//! [`crate::allocate`]; this module converts to and from the v1beta1 messages and maps domain
//! errors to `tonic::Status` (in [`status_of`], the one place that does).

mod socket;

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

pub use socket::{bind, remove_if_ours, socket_name, BoundSocket, SocketError, MAX_SOCKET_PATH};

use crate::allocate::{self, AllocateError, ContainerAllocation};
use crate::api::{self, device_plugin_server::DevicePlugin};
use crate::listen;
use crate::plan::{Plan, ResourcePlan};

/// The ListAndWatch message for a resource: every device with its health and NUMA node.
pub fn list_response(res: &ResourcePlan) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: res
            .devices
            .iter()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: if d.health.is_healthy() {
                    api::HEALTHY
                } else {
                    api::UNHEALTHY
                }
                .to_string(),
                topology: d.numa_node.map(|n| api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            })
            .collect(),
    }
}

/// What a `DevicePlugin` call can fail with, before it becomes a gRPC status in [`status_of`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The container request is wrong (unknown device ID, too many replicas, …).
    #[error(transparent)]
    Allocate(#[from] AllocateError),
    /// The resource is not (or no longer) in the plan: this server is being withdrawn.
    #[error("resource {resource} is no longer advertised by this node")]
    NotAdvertised {
        /// The resource.
        resource: String,
    },
    /// GetPreferredAllocation's `allocation_size` is negative.
    #[error("resource {resource}: allocation_size {size} is negative")]
    NegativeSize {
        /// The resource.
        resource: String,
        /// The size the kubelet sent.
        size: i32,
    },
}

/// The one map from a domain error to the gRPC status the kubelet sees; no other plugin code
/// builds a `tonic::Status`. Codes, as the kubelet's device manager reads them (any error fails
/// the pod's admission with `UnexpectedAdmissionError`; the code tells the operator why):
/// - `INVALID_ARGUMENT`: the request is wrong — every [`AllocateError`] (unknown device ID,
///   more replicas than `failRequestsGreaterThanOne` allows, no IDs, MPS replicas of two GPUs)
///   and a negative `allocation_size`;
/// - `UNAVAILABLE`: not ready — [`PluginError::NotAdvertised`], the resource is being
///   withdrawn (a retry after re-registration may succeed).
///
/// Messages name the resource and device ID; IDs are cut to 256 bytes with their length
/// ([`crate::uuid::truncate_id`]), so the status always fits a gRPC header.
pub fn status_of(err: &PluginError) -> Status {
    match err {
        PluginError::Allocate(_) | PluginError::NegativeSize { .. } => {
            Status::invalid_argument(err.to_string())
        }
        PluginError::NotAdvertised { .. } => Status::unavailable(err.to_string()),
    }
}

/// How long a stopped server waits for its connections to close before dropping them, so a
/// client that never reads its ListAndWatch stream cannot hold a server open.
pub const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

fn to_api(alloc: ContainerAllocation) -> api::ContainerAllocateResponse {
    api::ContainerAllocateResponse {
        envs: alloc.envs.into_iter().collect(),
        mounts: alloc
            .mounts
            .into_iter()
            .map(|m| api::Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: alloc
            .device_nodes
            .into_iter()
            .map(|d| api::DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: alloc.annotations.into_iter().collect(),
        cdi_devices: alloc
            .cdi_devices
            .into_iter()
            .map(|name| api::CdiDevice { name })
            .collect(),
    }
}

/// The `DevicePlugin` service of one resource. Reads plan snapshots from a `watch` channel and
/// keeps no state of its own.
#[derive(Clone)]
pub struct Service {
    resource: String,
    plans: watch::Receiver<Arc<Plan>>,
    stop: CancellationToken,
    dev_root: String,
    lost: Option<(mpsc::Sender<StreamEvent>, u64)>,
    allocated: Option<Arc<Allocated>>,
}

/// Tells the supervisor that Allocate answered, with one wake-up per quiet period however many
/// Allocates come: the first Allocate after [`Allocated::rearm`] notifies, later ones only
/// find the flag set. A wake-up per call cost a supervisor loop turn on the runtime's workers
/// for every Allocate (the single-caller Allocate p50 was 1.2 times the floor's; with this,
/// the floor's, see docs/benchmarks.md, row 1).
#[derive(Debug, Default)]
pub struct Allocated {
    pending: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Allocated {
    /// An Allocate answered: notifies unless a notification is pending already.
    pub fn signal(&self) {
        use std::sync::atomic::Ordering;
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    /// Resolves when [`Allocated::signal`] notified (a notification given while nobody waits
    /// is kept for the next wait).
    pub async fn notified(&self) {
        self.notify.notified().await;
    }

    /// The supervisor acted on the Allocates so far (it asks pod-resources now): the next
    /// Allocate notifies again.
    pub fn rearm(&self) {
        self.pending
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// What happened to a ListAndWatch stream, for the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// The kubelet opened a stream and got its first full list.
    Opened,
    /// The stream ended because the kubelet went away (not because slicelet stopped the
    /// server): the resource must register again.
    Lost,
}

/// A ListAndWatch stream of `resource` opened or was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEvent {
    /// The resource.
    pub resource: String,
    /// The server epoch given to [`Service::report_streams`], so a report from a server that
    /// was already replaced can be ignored.
    pub epoch: u64,
    /// Opened or lost.
    pub kind: StreamKind,
}

impl Service {
    /// A service for `resource`. Its ListAndWatch streams end when `stop` is cancelled or the
    /// resource leaves the plan. `dev_root` is the host's `/dev` root for device specs.
    pub fn new(
        resource: impl Into<String>,
        plans: watch::Receiver<Arc<Plan>>,
        stop: CancellationToken,
        dev_root: impl Into<String>,
    ) -> Self {
        Service {
            resource: resource.into(),
            plans,
            stop,
            dev_root: dev_root.into(),
            lost: None,
            allocated: None,
        }
    }

    /// Reports on `tx` every ListAndWatch stream the client closes while the server is still
    /// meant to run (the kubelet went away), tagged with `epoch`.
    pub fn report_streams(mut self, tx: mpsc::Sender<StreamEvent>, epoch: u64) -> Self {
        self.lost = Some((tx, epoch));
        self
    }

    /// Signals `allocated` after each successful Allocate (the supervisor then asks
    /// pod-resources what is in use).
    pub fn report_allocations(mut self, allocated: Arc<Allocated>) -> Self {
        self.allocated = Some(allocated);
        self
    }

    fn current(&self) -> Result<Arc<ResourcePlan>, PluginError> {
        let plan = Arc::clone(&self.plans.borrow());
        plan.resources
            .get(&self.resource)
            .cloned()
            .ok_or_else(|| PluginError::NotAdvertised {
                resource: self.resource.clone(),
            })
    }
}

/// One ListAndWatch stream's task: sends the resource's device list, then every change of
/// it, until the server stops, the kubelet goes away or the resource leaves the plan.
struct ListWatch {
    plans: watch::Receiver<Arc<Plan>>,
    stop: CancellationToken,
    resource: String,
    lost: Option<(mpsc::Sender<StreamEvent>, u64)>,
    tx: mpsc::Sender<Result<api::ListAndWatchResponse, Status>>,
}

impl ListWatch {
    /// Sends `first`, then the changes; the supervisor is told when the stream opens and when
    /// it is lost.
    async fn run(mut self, first: Arc<ResourcePlan>) {
        let mut last = first;
        if !self.send(list_response(&last)).await {
            self.tell(StreamKind::Lost);
            return;
        }
        self.tell(StreamKind::Opened);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => {
                    // Stopped because the resource left the plan (the supervisor publishes
                    // the plan first): say so with an empty list, if there is room.
                    if !self.plans.borrow().resources.contains_key(&self.resource) {
                        let _ = self.tx.try_send(Ok(withdrawn()));
                    }
                    break;
                }
                _ = self.tx.closed() => {
                    self.tell(StreamKind::Lost);
                    break;
                }
                changed = self.plans.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let next = self.plans.borrow_and_update().resources.get(&self.resource).cloned();
                    let Some(next) = next else {
                        // Withdrawn: the kubelet drops the capacity at once instead of
                        // showing the old devices for its grace period.
                        let _ = self.send(withdrawn()).await;
                        break;
                    };
                    // Never send a duplicate list: same Arc or same devices → nothing to say.
                    if Arc::ptr_eq(&next, &last) || next.devices == last.devices {
                        continue;
                    }
                    last = next;
                    if !self.send(list_response(&last)).await {
                        self.tell(StreamKind::Lost);
                        break;
                    }
                }
            }
        }
    }

    /// Tells the supervisor what happened to the stream (unless the server stops).
    fn tell(&self, kind: StreamKind) {
        let resource = self.resource.as_str();
        if let Some((events, epoch)) = &self.lost {
            if !self.stop.is_cancelled() {
                if let Err(e) = events.try_send(StreamEvent {
                    resource: resource.to_string(),
                    epoch: *epoch,
                    kind,
                }) {
                    tracing::error!(resource, error = %e, "stream event not reported to the supervisor");
                }
            }
        }
    }

    /// Sends `msg`; false when it could not be. A send waits for room only until the server
    /// stops: a client that never reads cannot keep this task (or the server) alive.
    async fn send(&self, msg: api::ListAndWatchResponse) -> bool {
        tokio::select! {
            biased;
            sent = self.tx.send(Ok(msg)) => sent.is_ok(),
            _ = self.stop.cancelled() => false,
        }
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::device_plugin_options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = self.current().map_err(|e| status_of(&e))?;
        let (tx, rx) = mpsc::channel(4);
        let stream = ListWatch {
            plans: self.plans.clone(),
            stop: self.stop.clone(),
            resource: self.resource.clone(),
            lost: self.lost.clone(),
            tx,
        };
        tokio::spawn(stream.run(first));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let res = self.current().map_err(|e| status_of(&e))?;
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let size = usize::try_from(req.allocation_size).map_err(|_| {
                status_of(&PluginError::NegativeSize {
                    resource: self.resource.clone(),
                    size: req.allocation_size,
                })
            })?;
            let chosen = allocate::preferred_scored(
                &res,
                &req.available_device_i_ds,
                &req.must_include_device_i_ds,
                size,
            );
            tracing::debug!(resource = %self.resource, size, available = req.available_device_i_ds.len(), chosen = ?chosen.ids, score = chosen.score, "GetPreferredAllocation");
            container_responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen.ids,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let res = self.current().map_err(|e| status_of(&e))?;
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let alloc =
                allocate::allocate(&res, &req.devices_ids, &self.dev_root).map_err(|e| {
                    tracing::warn!(resource = %self.resource, error = %e, "Allocate refused");
                    status_of(&e.into())
                })?;
            // The kubelet decides (it may allocate a device it saw Unhealthy, e.g. after a
            // restart); answer, but leave a trace with the device ID.
            for id in &req.devices_ids {
                if res.device(id).is_some_and(|d| !d.health.is_healthy()) {
                    tracing::warn!(resource = %self.resource, device = %crate::uuid::truncate_id(id), "Allocate of an Unhealthy device");
                }
            }
            container_responses.push(to_api(alloc));
        }
        if let Some(a) = &self.allocated {
            a.signal();
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// Serves `service` on `socket` until `stop` is cancelled. ListAndWatch streams observe the
/// same token, so graceful shutdown does not wait on them; connections still open
/// [`DRAIN_TIMEOUT`] after `stop` are dropped, so the task ends even when a client never reads.
///
/// Every request is answered whatever `:authority` its client sends (older kubelets, grpcurl and
/// grpc C-core send the socket path; [`crate::authority`]).
///
/// Limits: those of [`crate::listen`] (admitted connections, the HTTP/2 preface within a
/// timeout, streams per connection, keepalive).
pub fn serve(
    socket: BoundSocket,
    service: Service,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    serve_limited(socket, service, stop, listen::Limits::default())
}

/// [`serve`] with other connection limits (for measurements).
fn serve_limited(
    socket: BoundSocket,
    service: Service,
    stop: CancellationToken,
    limits: listen::Limits,
) -> tokio::task::JoinHandle<()> {
    let incoming = listen::incoming(socket.listener, limits);
    let path = socket.path;
    tokio::spawn(async move {
        let server = listen::server()
            .add_service(api::device_plugin_server::DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
        tokio::pin!(server);
        let drained = async {
            stop.cancelled().await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        };
        tokio::select! {
            result = &mut server => {
                if let Err(e) = result {
                    tracing::error!(socket = %path.display(), error = %crate::errors::chain(&e), "device plugin server failed");
                }
            }
            () = drained => {
                tracing::debug!(socket = %path.display(), "connections still open after the drain timeout; dropping them");
            }
        }
    })
}

/// The empty ListAndWatch message a withdrawn resource sends before its stream ends.
pub fn withdrawn() -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: Vec::new(),
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
