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
use crate::plan::{Plan, ResourcePlan};

/// The options slicelet announces for every resource: GetPreferredAllocation is implemented,
/// PreStartContainer is not needed.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// The ListAndWatch message for a resource: every device with its health and NUMA node.
pub fn list_response(res: &ResourcePlan) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: res
            .devices
            .iter()
            .map(|d| api::Device {
                id: d.id.clone(),
                health: if d.healthy {
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

/// Maps an Allocate error to the gRPC status the kubelet sees: every user-caused error is
/// `INVALID_ARGUMENT` with a message naming the device ID or resource.
pub fn status_of(err: &AllocateError) -> Status {
    Status::invalid_argument(err.to_string())
}

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
    lost: Option<(mpsc::Sender<StreamLost>, u64)>,
}

/// A ListAndWatch stream ended because the kubelet went away (not because slicelet stopped
/// the server): the resource must register again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLost {
    /// The resource.
    pub resource: String,
    /// The server epoch given to [`Service::report_lost_streams`], so a report from a server
    /// that was already replaced can be ignored.
    pub epoch: u64,
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
        }
    }

    /// Reports on `tx` every ListAndWatch stream the client closes while the server is still
    /// meant to run (the kubelet went away), tagged with `epoch`.
    pub fn report_lost_streams(mut self, tx: mpsc::Sender<StreamLost>, epoch: u64) -> Self {
        self.lost = Some((tx, epoch));
        self
    }

    fn current(&self) -> Result<Arc<ResourcePlan>, Status> {
        let plan = Arc::clone(&self.plans.borrow());
        plan.resources.get(&self.resource).cloned().ok_or_else(|| {
            Status::failed_precondition(format!(
                "resource {} is no longer advertised by this node",
                self.resource
            ))
        })
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut plans = self.plans.clone();
        let first = self.current()?;
        let stop = self.stop.clone();
        let resource = self.resource.clone();
        let lost = self.lost.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let mut last = first;
            let report = |resource: &str| {
                if let Some((lost, epoch)) = &lost {
                    if !stop.is_cancelled() {
                        if let Err(e) = lost.try_send(StreamLost {
                            resource: resource.to_string(),
                            epoch: *epoch,
                        }) {
                            tracing::error!(resource, error = %e, "lost stream not reported to the supervisor");
                        }
                    }
                }
            };
            if tx.send(Ok(list_response(&last))).await.is_err() {
                report(&resource);
                return;
            }
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tx.closed() => {
                        report(&resource);
                        break;
                    }
                    changed = plans.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let next = plans.borrow_and_update().resources.get(&resource).cloned();
                        let Some(next) = next else { break };
                        // Never send a duplicate list: same Arc or same devices → nothing to say.
                        if Arc::ptr_eq(&next, &last) || next.devices == last.devices {
                            continue;
                        }
                        last = next;
                        if tx.send(Ok(list_response(&last))).await.is_err() {
                            report(&resource);
                            break;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let res = self.current()?;
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let size = usize::try_from(req.allocation_size).map_err(|_| {
                Status::invalid_argument(format!(
                    "resource {}: allocation_size {} is negative",
                    self.resource, req.allocation_size
                ))
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
        let res = self.current()?;
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let alloc =
                allocate::allocate(&res, &req.devices_ids, &self.dev_root).map_err(|e| {
                    tracing::warn!(resource = %self.resource, error = %e, "Allocate refused");
                    status_of(&e)
                })?;
            container_responses.push(to_api(alloc));
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
/// same token, so graceful shutdown does not wait on them.
pub fn serve(
    socket: BoundSocket,
    service: Service,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(socket.listener);
    let path = socket.path;
    tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(incoming, stop.cancelled())
            .await;
        if let Err(e) = result {
            tracing::error!(socket = %path.display(), error = %e, "device plugin server failed");
        }
    })
}

#[cfg(test)]
mod tests;
