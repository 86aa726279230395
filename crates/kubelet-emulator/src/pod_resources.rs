//! The kubelet's pod-resources API v1 (`PodResourcesLister`) over a real unix socket, answering
//! from a table the test sets: which containers hold which device IDs.
//!
//! [`PodResources::hold`], [`PodResources::hold_claim`] and [`PodResources::release`] change
//! the table (what the kubelet's device manager records after Allocate and its DRA manager
//! after NodePrepareResources, and forgets when a pod is gone); every `List` is
//! counted and tests await the count ([`PodResources::wait_for_lists`]) under a timeout.
//! [`PodResources::set_failing`] makes every call answer `ResourceExhausted` (the kubelet's
//! rate limiter's answer) until cleared.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use slicelet::api::podresources::{
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
    AllocatableResourcesRequest, AllocatableResourcesResponse, ClaimResource, ContainerDevices,
    ContainerResources, DynamicResource, GetPodResourcesRequest, GetPodResourcesResponse,
    ListPodResourcesRequest, ListPodResourcesResponse,
};

#[derive(Default)]
struct Table {
    pods: Vec<slicelet::api::podresources::PodResources>,
    failing: bool,
}

#[derive(Clone)]
struct Lister {
    table: Arc<Mutex<Table>>,
    lists: watch::Sender<u64>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let answer = {
            let t = self.table.lock().expect("pod-resources table poisoned");
            if t.failing {
                None
            } else {
                Some(t.pods.clone())
            }
        };
        self.lists.send_modify(|n| *n += 1);
        match answer {
            Some(pod_resources) => Ok(Response::new(ListPodResourcesResponse { pod_resources })),
            None => Err(Status::resource_exhausted(
                "rejected by rate limit (emulated)",
            )),
        }
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let t = self.table.lock().expect("pod-resources table poisoned");
        let pod = t
            .pods
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("pod {}/{}", r.pod_namespace, r.pod_name)))?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// One device of a claim, as pod-resources names it (`ClaimResource`).
#[derive(Debug, Clone, Copy)]
pub struct ClaimedDevice<'a> {
    /// The DRA driver (`gpu.slicelet.io`).
    pub driver: &'a str,
    /// The pool (the node's name for slicelet).
    pub pool: &'a str,
    /// The device's name in the pool's ResourceSlices.
    pub device: &'a str,
}

/// The emulated pod-resources service; dropping it stops serving.
pub struct PodResources {
    path: PathBuf,
    table: Arc<Mutex<Table>>,
    lists: watch::Sender<u64>,
    stop: CancellationToken,
    server: JoinHandle<()>,
}

impl PodResources {
    /// Serves pod-resources on the unix socket `path` (its directory is created).
    ///
    /// # Errors
    /// I/O errors creating the directory or binding the socket.
    pub async fn start(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        let table = Arc::new(Mutex::new(Table::default()));
        let (lists, _) = watch::channel(0);
        let svc = PodResourcesListerServer::new(Lister {
            table: Arc::clone(&table),
            lists: lists.clone(),
        });
        let stop = CancellationToken::new();
        let s = stop.clone();
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), s.cancelled())
                .await;
        });
        Ok(PodResources {
            path: path.to_path_buf(),
            table,
            lists,
            stop,
            server,
        })
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that container `container` of pod `namespace/pod` holds `ids` of `resource`.
    pub fn hold(&self, namespace: &str, pod: &str, container: &str, resource: &str, ids: &[&str]) {
        self.with_container(namespace, pod, container, |c| {
            c.devices.push(ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                topology: None,
            });
        });
    }

    /// Records that container `container` of pod `namespace/pod` holds the DRA claim
    /// `namespace/claim` with `devices`, as the kubelet's pod-resources lists claims since
    /// Kubernetes 1.34 (`ContainerResources.dynamic_resources`; no CDI devices listed).
    pub fn hold_claim(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        claim: &str,
        devices: &[ClaimedDevice<'_>],
    ) {
        self.with_container(namespace, pod, container, |c| {
            c.dynamic_resources.push(DynamicResource {
                claim_name: claim.into(),
                claim_namespace: namespace.into(),
                claim_resources: devices
                    .iter()
                    .map(|d| ClaimResource {
                        cdi_devices: Vec::new(),
                        driver_name: d.driver.into(),
                        pool_name: d.pool.into(),
                        device_name: d.device.into(),
                    })
                    .collect(),
            });
        });
    }

    /// Runs `f` on container `container` of pod `namespace/pod`, adding either when missing.
    fn with_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        f: impl FnOnce(&mut ContainerResources),
    ) {
        let mut t = self.table.lock().expect("pod-resources table poisoned");
        let idx = match t
            .pods
            .iter()
            .position(|p| p.name == pod && p.namespace == namespace)
        {
            Some(i) => i,
            None => {
                t.pods.push(slicelet::api::podresources::PodResources {
                    name: pod.into(),
                    namespace: namespace.into(),
                    containers: Vec::new(),
                });
                t.pods.len() - 1
            }
        };
        let p = &mut t.pods[idx];
        let c = match p.containers.iter().position(|c| c.name == container) {
            Some(i) => &mut p.containers[i],
            None => {
                p.containers.push(ContainerResources {
                    name: container.into(),
                    ..Default::default()
                });
                p.containers.last_mut().expect("just pushed")
            }
        };
        f(c);
    }

    /// Forgets pod `namespace/pod` (it is gone).
    pub fn release(&self, namespace: &str, pod: &str) {
        self.table
            .lock()
            .expect("pod-resources table poisoned")
            .pods
            .retain(|p| !(p.name == pod && p.namespace == namespace));
    }

    /// Every call answers `ResourceExhausted` while `failing`.
    pub fn set_failing(&self, failing: bool) {
        self.table
            .lock()
            .expect("pod-resources table poisoned")
            .failing = failing;
    }

    /// `List` calls answered (or refused) so far.
    pub fn lists(&self) -> u64 {
        *self.lists.borrow()
    }

    /// Waits until at least `n` `List` calls were made, up to `timeout`; the count reached.
    ///
    /// # Errors
    /// The count when it gave up.
    pub async fn wait_for_lists(&self, n: u64, timeout: Duration) -> Result<u64, u64> {
        let mut rx = self.lists.subscribe();
        let reached = tokio::time::timeout(timeout, async {
            rx.wait_for(|c| *c >= n).await.map(|c| *c)
        })
        .await;
        match reached {
            Ok(Ok(c)) => Ok(c),
            _ => Err(self.lists()),
        }
    }
}

impl Drop for PodResources {
    fn drop(&mut self) {
        self.stop.cancel();
        self.server.abort();
    }
}
