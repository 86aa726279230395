//! A small Kubernetes API emulator: just enough of `/api/v1/nodes` for the real `kube` client's
//! watcher (LIST with a field selector and a resourceVersion, then a streaming WATCH of
//! newline-delimited watch events; full objects, or `PartialObjectMetadata` when the `Accept`
//! header asks for it as the API server serves it), over HTTP on a loopback port, reached through a
//! kubeconfig file. One node; tests change its labels, end every open watch, or make the API
//! answer 500 and back. For the integration tests and the benchmark (the Node watch's RSS).
//!
//! For DRA it also serves `resource.k8s.io/v1` ResourceSlices (cluster-scoped: create, get,
//! replace with a resourceVersion check (409 on a stale one), delete, list with the field
//! selectors `spec.nodeName` and `spec.driver`; `dryRun=All` on create and replace answers
//! what would be stored and stores nothing; a watch with the same selectors, full objects
//! or metadata only, gets every change after the `resourceVersion` it names (after it opened
//! without one), a deletion with the deletion's
//! `resourceVersion` as the API server sends it) and ResourceClaims (get by namespace and
//! name; list cluster-wide, as the API server answers `GET /apis/resource.k8s.io/v1/resourceclaims`:
//! a `ResourceClaimList` with the list's `resourceVersion`, in namespace and name order); tests set claims with their allocation results ([`KubeApi::set_claim`]), delete
//! them, read the slices ([`KubeApi::slices`]), wait for slice changes
//! ([`KubeApi::wait_slices`]) or for a slice write in the record of every one
//! ([`KubeApi::wait_slice_write`]). It can play an API server without device taints
//! ([`KubeApi::set_taints`]): one that drops the devices' `taints` field silently (Kubernetes
//! before 1.37, or the `DRADeviceTaints` feature gate off) or one that refuses it with 422.
//!
//! For `slicelet top --node`/`--all-nodes` it serves pods and their `pods/proxy` subresource
//! ([`KubeApi::add_pod`]), the proxy forwarding to the pod's address over real HTTP.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt as _;

/// Longest [`KubeApi::wait`] waits.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(20);

#[derive(Default)]
struct Inner {
    node: String,
    labels: BTreeMap<String, String>,
    resource_version: u64,
    unavailable: bool,
    /// Open watches, and whether each asked for metadata only.
    watchers: Vec<(mpsc::UnboundedSender<Result<String, std::io::Error>>, bool)>,
    /// Every request's `fieldSelector` (empty when none), in order.
    selectors: Vec<String>,
    /// Every ResourceSlice LIST's `resourceVersion` and `resourceVersionMatch`, in order.
    slice_list_versions: Vec<(Option<String>, Option<String>)>,
    /// Every Node LIST's (not WATCH's) `resourceVersion`, in order.
    node_list_versions: Vec<Option<String>>,
    /// ResourceSlices by name (JSON as stored, with `metadata.resourceVersion`).
    slices: BTreeMap<String, Value>,
    /// ResourceClaims by (namespace, name).
    claims: BTreeMap<(String, String), Value>,
    /// What the API does with the devices' `taints`.
    taints: Taints,
    /// Every ResourceSlice stored by a create or replace, in order (as stored).
    slice_log: Vec<Value>,
    /// Pods by (namespace, name) ([`pods`]).
    pods: BTreeMap<(String, String), pods::PodEntry>,
    /// Open ResourceSlice watches.
    slice_watchers: Vec<SliceWatcher>,
    /// Every ResourceSlice watch event, with its `resourceVersion`, for a watch from a version.
    slice_history: Vec<(u64, &'static str, Value)>,
}

/// One open ResourceSlice watch: its stream, its field selector, whether it asked for
/// metadata only.
struct SliceWatcher {
    tx: mpsc::UnboundedSender<Result<String, std::io::Error>>,
    selector: Vec<(&'static str, String)>,
    meta_only: bool,
}

impl SliceWatcher {
    /// Sends `kind` (`ADDED`, `MODIFIED`, `DELETED`) of `slice` when the selector matches;
    /// false once the stream is gone.
    fn send(&self, kind: &str, slice: &Value) -> bool {
        if !selects(&self.selector, slice) {
            return !self.tx.is_closed();
        }
        let object = if self.meta_only {
            metadata_of(slice)
        } else {
            slice.clone()
        };
        let line = json!({"type": kind, "object": object}).to_string() + "\n";
        self.tx.send(Ok(line)).is_ok()
    }
}

/// Whether `slice` matches the parsed field selector.
fn selects(selector: &[(&'static str, String)], slice: &Value) -> bool {
    selector
        .iter()
        .all(|(k, want)| slice["spec"][*k].as_str() == Some(want.as_str()))
}

impl Inner {
    /// Sends a watch event of `slice` to every open ResourceSlice watch it matches.
    fn slice_event(&mut self, kind: &'static str, slice: &Value) {
        self.slice_history
            .push((self.resource_version, kind, slice.clone()));
        self.slice_watchers.retain(|w| w.send(kind, slice));
    }

    /// Deletes slice `name` (the deletion's `resourceVersion` on the event, as the API server
    /// sends it); `None` when there is none.
    fn remove_slice(&mut self, name: &str) -> Option<Value> {
        let mut v = self.slices.remove(name)?;
        self.resource_version += 1;
        v["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.slice_event("DELETED", &v);
        Some(v)
    }
}

mod pods;
mod validate;

/// What the emulated API server does with a ResourceSlice's device taints
/// (`spec.devices[].taints`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Taints {
    /// Stores them (Kubernetes 1.37 and newer).
    #[default]
    Keep,
    /// Drops them silently, as an API server without the field or with its feature gate off.
    Drop,
    /// Refuses a write with taints: 422 naming `spec.devices[i].taints`.
    Refuse,
}

/// What tests can wait on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// LIST requests answered with a list.
    pub lists: u32,
    /// WATCH requests answered with a stream.
    pub watches: u32,
    /// Requests that asked for full Node objects (not `PartialObjectMetadata`).
    pub full_objects: u32,
    /// Requests answered 500 (kube's client retries 503 itself, 15 times).
    pub refused: u32,
    /// ResourceSlice creates, replaces and deletes that succeeded.
    pub slice_writes: u32,
    /// ResourceSlice lists of full objects answered.
    pub slice_lists: u32,
    /// ResourceSlice lists of metadata only (`PartialObjectMetadataList`) answered.
    pub slice_meta_lists: u32,
    /// ResourceSlice WATCH requests answered with a stream.
    pub slice_watches: u32,
    /// ResourceClaim gets answered (found or not).
    pub claim_gets: u32,
    /// Cluster-wide ResourceClaim lists answered.
    pub claim_lists: u32,
    /// Pod lists answered.
    pub pod_lists: u32,
    /// Requests forwarded through the `pods/proxy` subresource.
    pub proxied: u32,
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    counters: Arc<watch::Sender<Counters>>,
}

/// The emulator; dropping it stops the server.
pub struct KubeApi {
    /// Where it listens (`http://<addr>`).
    pub addr: SocketAddr,
    shared: Shared,
    _server: AbortOnDrop,
}

#[derive(serde::Deserialize)]
struct NodeQuery {
    #[serde(rename = "fieldSelector", default)]
    field_selector: String,
    #[serde(default)]
    watch: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
}

impl Inner {
    fn node_json(&self, meta_only: bool) -> Value {
        let (api_version, kind) = if meta_only {
            ("meta.k8s.io/v1", "PartialObjectMetadata")
        } else {
            ("v1", "Node")
        };
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": self.node,
                "resourceVersion": self.resource_version.to_string(),
                "labels": self.labels,
            },
        })
    }

    fn matches(&self, selector: &str) -> bool {
        selector.is_empty() || selector == format!("metadata.name={}", self.node)
    }
}

async fn nodes(
    State(s): State<Shared>,
    Query(q): Query<NodeQuery>,
    headers: HeaderMap,
) -> Response {
    let meta_only = asks_metadata_only(&headers);
    let mut inner = s.inner.lock().unwrap();
    inner.selectors.push(q.field_selector.clone());
    if !meta_only {
        s.counters.send_modify(|c| c.full_objects += 1);
    }
    if inner.unavailable {
        s.counters.send_modify(|c| c.refused += 1);
        return (StatusCode::INTERNAL_SERVER_ERROR, "emulated outage").into_response();
    }
    let matches = inner.matches(&q.field_selector);
    if is_watch(q.watch.as_deref()) {
        let (tx, rx) = mpsc::unbounded_channel();
        // No history is kept: a watch from an older version gets the current object at once
        // (the watcher applies it idempotently).
        if matches {
            let line = json!({"type": "MODIFIED", "object": inner.node_json(meta_only)})
                .to_string()
                + "\n";
            let _ = tx.send(Ok(line));
            inner.watchers.push((tx, meta_only));
        }
        s.counters.send_modify(|c| c.watches += 1);
        let body = Body::from_stream(UnboundedReceiverStream::new(rx).map(|r| r));
        return ([("content-type", "application/json")], body).into_response();
    }
    inner.node_list_versions.push(q.resource_version.clone());
    let items: Vec<Value> = if matches {
        vec![inner.node_json(meta_only)]
    } else {
        Vec::new()
    };
    let (api_version, kind) = if meta_only {
        ("meta.k8s.io/v1", "PartialObjectMetadataList")
    } else {
        ("v1", "NodeList")
    };
    let list = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": items,
    });
    s.counters.send_modify(|c| c.lists += 1);
    ([("content-type", "application/json")], list.to_string()).into_response()
}

/// Whether the request asks for metadata only:
/// `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
fn asks_metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadata"))
}

/// Whether a LIST's `watch` parameter makes it a WATCH.
fn is_watch(watch: Option<&str>) -> bool {
    watch.is_some_and(|w| w == "true" || w == "1")
}

/// `slice` as a `PartialObjectMetadata` (its metadata only).
fn metadata_of(slice: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": slice["metadata"],
    })
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok_json(v: &Value) -> Response {
    ([("content-type", "application/json")], v.to_string()).into_response()
}

/// `spec.nodeName=a,spec.driver=b` → pairs; an unsupported field is an error (as the API
/// server answers 400 for a field it does not index).
fn slice_selector(selector: &str) -> Result<Vec<(&'static str, String)>, String> {
    let mut out = Vec::new();
    for part in selector.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("unsupported selector {part}"))?;
        let v = v.trim_start_matches('=');
        let key = match k {
            "spec.nodeName" => "nodeName",
            "spec.driver" => "driver",
            other => return Err(format!("field label not supported: {other}")),
        };
        out.push((key, v.to_string()));
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
struct WriteQuery {
    #[serde(rename = "dryRun", default)]
    dry_run: Option<String>,
}

impl WriteQuery {
    fn dry(&self) -> bool {
        self.dry_run.as_deref() == Some("All")
    }
}

/// Applies the API server's handling of device taints to a slice being written: `Err` with
/// the 422's message, or the slice as it would be stored.
fn apply_taints(mode: Taints, mut v: Value) -> Result<Value, String> {
    let name = v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let Some(devices) = v["spec"]["devices"].as_array_mut() else {
        return Ok(v);
    };
    for (i, d) in devices.iter_mut().enumerate() {
        let Some(obj) = d.as_object_mut() else {
            continue;
        };
        match mode {
            Taints::Keep => {}
            Taints::Drop => {
                obj.remove("taints");
            }
            Taints::Refuse => {
                if obj
                    .get("taints")
                    .and_then(Value::as_array)
                    .is_some_and(|t| !t.is_empty())
                {
                    return Err(format!("ResourceSlice.resource.k8s.io \"{name}\" is invalid: spec.devices[{i}].taints: Forbidden: device taints are disabled"));
                }
            }
        }
    }
    Ok(v)
}

#[derive(serde::Deserialize)]
struct ListQuery {
    #[serde(rename = "fieldSelector", default)]
    field_selector: String,
    #[serde(default)]
    watch: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
    #[serde(rename = "resourceVersionMatch", default)]
    version_match: Option<String>,
}

fn refuse_if_down(s: &Shared, inner: &Inner) -> Option<Response> {
    if inner.unavailable {
        s.counters.send_modify(|c| c.refused += 1);
        return Some((StatusCode::INTERNAL_SERVER_ERROR, "emulated outage").into_response());
    }
    None
}

/// Lists or (`watch=true`) watches ResourceSlices. A metadata-only LIST (the `Accept` header
/// asks for `PartialObjectMetadata`) is counted apart and not recorded in
/// [`KubeApi::slice_list_versions`]. A watch from a `resourceVersion` gets every change after
/// it first (none without one), then each change as it happens.
async fn list_slices(
    State(s): State<Shared>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    let meta_only = asks_metadata_only(&headers);
    let watch = is_watch(q.watch.as_deref());
    let mut inner = s.inner.lock().unwrap();
    inner.selectors.push(q.field_selector.clone());
    if !meta_only && !watch {
        inner
            .slice_list_versions
            .push((q.resource_version.clone(), q.version_match.clone()));
    }
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let sel = match slice_selector(&q.field_selector) {
        Ok(sel) => sel,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    if watch {
        let (tx, rx) = mpsc::unbounded_channel();
        let w = SliceWatcher {
            tx,
            selector: sel,
            meta_only,
        };
        // From a version (the LIST's, as a watcher sends it): the changes after it first.
        if let Some(from) = q
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
        {
            for (_, kind, v) in inner.slice_history.iter().filter(|(rv, _, _)| *rv > from) {
                w.send(kind, v);
            }
        }
        inner.slice_watchers.push(w);
        drop(inner);
        s.counters.send_modify(|c| c.slice_watches += 1);
        let body = Body::from_stream(UnboundedReceiverStream::new(rx).map(|r| r));
        return ([("content-type", "application/json")], body).into_response();
    }
    let items: Vec<Value> = inner
        .slices
        .values()
        .filter(|v| selects(&sel, v))
        .map(|v| if meta_only { metadata_of(v) } else { v.clone() })
        .collect();
    let (api_version, kind) = if meta_only {
        ("meta.k8s.io/v1", "PartialObjectMetadataList")
    } else {
        ("resource.k8s.io/v1", "ResourceSliceList")
    };
    let list = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": items,
    });
    drop(inner);
    s.counters.send_modify(|c| {
        if meta_only {
            c.slice_meta_lists += 1;
        } else {
            c.slice_lists += 1;
        }
    });
    ok_json(&list)
}

fn stamp(inner: &mut Inner, mut v: Value) -> Value {
    inner.resource_version += 1;
    v["apiVersion"] = json!("resource.k8s.io/v1");
    v["kind"] = json!("ResourceSlice");
    v["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
    v
}

async fn create_slice(
    State(s): State<Shared>,
    Query(q): Query<WriteQuery>,
    body: String,
) -> Response {
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let mut inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let v = match apply_taints(inner.taints, v).and_then(|v| validate::slice(&v).map(|()| v)) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e),
    };
    let Some(name) = v["metadata"]["name"].as_str().map(str::to_string) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required value".into(),
        );
    };
    if inner.slices.contains_key(&name) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("resourceslices \"{name}\" already exists"),
        );
    }
    if q.dry() {
        return (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            v.to_string(),
        )
            .into_response();
    }
    let v = stamp(&mut inner, v);
    inner.slices.insert(name, v.clone());
    inner.slice_log.push(v.clone());
    inner.slice_event("ADDED", &v);
    drop(inner);
    s.counters.send_modify(|c| c.slice_writes += 1);
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn get_slice(State(s): State<Shared>, UrlPath(name): UrlPath<String>) -> Response {
    let inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    match inner.slices.get(&name) {
        Some(v) => ok_json(v),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceslices \"{name}\" not found"),
        ),
    }
}

async fn replace_slice(
    State(s): State<Shared>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<WriteQuery>,
    body: String,
) -> Response {
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let mut inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let v = match apply_taints(inner.taints, v).and_then(|v| validate::slice(&v).map(|()| v)) {
        Ok(v) => v,
        Err(e) => return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e),
    };
    let Some(old) = inner.slices.get(&name) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceslices \"{name}\" not found"),
        );
    };
    let sent = v["metadata"]["resourceVersion"].as_str();
    if sent.is_some() && sent != old["metadata"]["resourceVersion"].as_str() {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on resourceslices \"{name}\": the object has been modified"),
        );
    }
    if q.dry() {
        return ok_json(&v);
    }
    let v = stamp(&mut inner, v);
    inner.slices.insert(name, v.clone());
    inner.slice_log.push(v.clone());
    inner.slice_event("MODIFIED", &v);
    drop(inner);
    s.counters.send_modify(|c| c.slice_writes += 1);
    ok_json(&v)
}

async fn delete_slice(State(s): State<Shared>, UrlPath(name): UrlPath<String>) -> Response {
    let mut inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    match inner.remove_slice(&name) {
        Some(v) => {
            drop(inner);
            s.counters.send_modify(|c| c.slice_writes += 1);
            ok_json(&v)
        }
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceslices \"{name}\" not found"),
        ),
    }
}

async fn get_claim(
    State(s): State<Shared>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    let inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let found = inner.claims.get(&(namespace, name.clone())).cloned();
    drop(inner);
    s.counters.send_modify(|c| c.claim_gets += 1);
    match found {
        Some(v) => ok_json(&v),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
        ),
    }
}

async fn list_claims(State(s): State<Shared>) -> Response {
    let inner = s.inner.lock().unwrap();
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let list = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimList",
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": inner.claims.values().cloned().collect::<Vec<Value>>(),
    });
    drop(inner);
    s.counters.send_modify(|c| c.claim_lists += 1);
    ok_json(&list)
}

/// One allocated device of a claim, as `status.allocation.devices.results[]` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// The request's name in the claim (`gpu`, or `gpu/sub` for a subrequest).
    pub request: String,
    /// The driver (`gpu.slicelet.io`).
    pub driver: String,
    /// The pool (the node's name for slicelet).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// `consumedCapacity` (capacity name, quantity) of a share of a consumable-capacity device
    /// (`allowMultipleAllocations`); left out of the result when empty.
    pub consumed_capacity: Vec<(String, String)>,
    /// `shareID` of such a share; left out of the result when `None`.
    pub share_id: Option<String>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl KubeApi {
    /// Serves one node named `node` with `labels` on a loopback port.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(node: &str, labels: &[(&str, &str)]) -> KubeApi {
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner {
                node: node.to_string(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                resource_version: 1,
                ..Inner::default()
            })),
            counters: Arc::new(watch::channel(Counters::default()).0),
        };
        let app = Router::new()
            .route("/api/v1/nodes", get(nodes))
            .route(
                "/apis/resource.k8s.io/v1/resourceslices",
                get(list_slices).post(create_slice),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceslices/{name}",
                get(get_slice).put(replace_slice).delete(delete_slice),
            )
            .route("/apis/resource.k8s.io/v1/resourceclaims", get(list_claims))
            .route(
                "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
                get(get_claim),
            )
            .route("/api/v1/namespaces/{namespace}/pods", get(pods::list_pods))
            .route(
                "/api/v1/namespaces/{namespace}/pods/{target}/proxy/{*path}",
                get(pods::proxy),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KubeApi {
            addr,
            shared,
            _server: AbortOnDrop(server),
        }
    }

    /// Writes a kubeconfig pointing at this emulator into `dir` and returns its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        kubeconfig_for(dir, &format!("http://{}", self.addr))
    }

    fn bump(&self, f: impl FnOnce(&mut BTreeMap<String, String>)) {
        let mut inner = self.shared.inner.lock().unwrap();
        f(&mut inner.labels);
        inner.resource_version += 1;
        let lines = [false, true].map(|meta_only| {
            json!({"type": "MODIFIED", "object": inner.node_json(meta_only)}).to_string() + "\n"
        });
        inner
            .watchers
            .retain(|(w, meta_only)| w.send(Ok(lines[usize::from(*meta_only)].clone())).is_ok());
    }

    /// Sets a label (a MODIFIED event to every open watch).
    pub fn set_label(&self, key: &str, value: &str) {
        self.bump(|l| {
            l.insert(key.to_string(), value.to_string());
        });
    }

    /// Removes a label.
    pub fn remove_label(&self, key: &str) {
        self.bump(|l| {
            l.remove(key);
        });
    }

    /// Ends every open watch stream, of the Node and of ResourceSlices (as an API server
    /// restart or a load balancer would).
    pub fn drop_watches(&self) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.watchers.clear();
        inner.slice_watchers.clear();
    }

    /// Makes every request answer 500 (and ends open watches), or serves again.
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.unavailable = unavailable;
        if unavailable {
            inner.watchers.clear();
            inner.slice_watchers.clear();
        }
    }

    /// Every ResourceSlice stored, by name order (JSON as the API holds it).
    pub fn slices(&self) -> Vec<Value> {
        self.shared
            .inner
            .lock()
            .unwrap()
            .slices
            .values()
            .cloned()
            .collect()
    }

    /// Makes the API keep, drop or refuse the devices' taints on later slice writes.
    pub fn set_taints(&self, taints: Taints) {
        self.shared.inner.lock().unwrap().taints = taints;
    }

    /// Every ResourceSlice stored by a create or replace so far, in order (as stored).
    pub fn slice_writes(&self) -> Vec<Value> {
        self.shared.inner.lock().unwrap().slice_log.clone()
    }

    /// Waits up to `timeout` for a ResourceSlice write (create or replace) at or after index
    /// `after` of [`KubeApi::slice_writes`] that satisfies `pred`, and returns its index and
    /// the slice as stored. Every write is recorded, so a short-lived state is seen however
    /// late this looks.
    ///
    /// # Errors
    /// After `timeout`: a sentence with the writes seen.
    pub async fn wait_slice_write(
        &self,
        after: usize,
        timeout: std::time::Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<(usize, Value), String> {
        let mut rx = self.shared.counters.subscribe();
        let wait = async {
            loop {
                let log = self.slice_writes();
                if let Some((i, v)) = log.iter().enumerate().skip(after).find(|(_, v)| pred(v)) {
                    return (i, v.clone());
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| {
            format!(
                "no ResourceSlice write after #{after} matched within {timeout:?}; {} writes: {:?}",
                self.slice_writes().len(),
                self.slice_writes().iter().skip(after).collect::<Vec<_>>()
            )
        })
    }

    /// Deletes every ResourceSlice of `node` (as a starting kubelet does), one watch event
    /// each.
    pub fn delete_node_slices(&self, node: &str) {
        let mut inner = self.shared.inner.lock().unwrap();
        let names: Vec<String> = inner
            .slices
            .iter()
            .filter(|(_, v)| v["spec"]["nodeName"].as_str() == Some(node))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            inner.remove_slice(&name);
        }
        drop(inner);
        self.shared.counters.send_modify(|c| c.slice_writes += 1);
    }

    /// Stores a ResourceSlice as another writer would (say, a predecessor's leftover).
    pub fn put_slice(&self, slice: Value) {
        let mut inner = self.shared.inner.lock().unwrap();
        let name = slice["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = if inner.slices.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let v = stamp(&mut inner, slice);
        inner.slices.insert(name, v.clone());
        inner.slice_event(kind, &v);
        drop(inner);
        self.shared.counters.send_modify(|c| c.slice_writes += 1);
    }

    /// Waits until the stored slices satisfy `pred` (checked now and after every slice
    /// write), and returns them.
    ///
    /// # Panics
    /// After [`WAIT`].
    pub async fn wait_slices(&self, mut pred: impl FnMut(&[Value]) -> bool) -> Vec<Value> {
        let mut rx = self.shared.counters.subscribe();
        let wait = async {
            loop {
                let now = self.slices();
                if pred(&now) {
                    return now;
                }
                rx.changed().await.expect("emulator gone");
            }
        };
        tokio::time::timeout(WAIT, wait)
            .await
            .expect("timed out waiting for the emulator's ResourceSlices")
    }

    /// Stores (or replaces) the ResourceClaim `namespace/name` with `uid`, allocated `devices`
    /// on `node` (`status.allocation.devices.results`, each with its `consumedCapacity` and
    /// `shareID` when set; no allocation when `devices` is empty).
    pub fn set_claim(&self, namespace: &str, name: &str, uid: &str, devices: &[AllocatedDevice]) {
        let results: Vec<Value> = devices
            .iter()
            .map(|d| {
                let mut r = json!({
                    "request": d.request,
                    "driver": d.driver,
                    "pool": d.pool,
                    "device": d.device,
                });
                if !d.consumed_capacity.is_empty() {
                    r["consumedCapacity"] = d
                        .consumed_capacity
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                        .collect::<serde_json::Map<_, _>>()
                        .into();
                }
                if let Some(id) = &d.share_id {
                    r["shareID"] = Value::String(id.clone());
                }
                r
            })
            .collect();
        let requests: std::collections::BTreeSet<&str> = devices
            .iter()
            .map(|d| d.request.split('/').next().unwrap_or_default())
            .collect();
        let mut claim = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1"},
            "spec": {"devices": {"requests": requests.iter().map(|r| json!({
                "name": r,
                "exactly": {"deviceClassName": "gpu.slicelet.io"},
            })).collect::<Vec<_>>()}},
        });
        if !devices.is_empty() {
            claim["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        self.shared
            .inner
            .lock()
            .unwrap()
            .claims
            .insert((namespace.to_string(), name.to_string()), claim);
    }

    /// Waits for the first ResourceSlice, then stores ResourceClaim `namespace/name` (UID
    /// `uid`) allocated the first device it publishes (request `gpu`, driver `driver`, pool
    /// `pool`) and reserved for pod `p1`, as the scheduler leaves a claim for the kubelet to
    /// prepare. Returns the device's name.
    ///
    /// # Panics
    /// After [`WAIT`] without a slice, or when the slice names no device.
    pub async fn claim_first_device(
        &self,
        driver: &str,
        pool: &str,
        (namespace, name, uid): (&str, &str, &str),
    ) -> String {
        let slices = self.wait_slices(|s| !s.is_empty()).await;
        let device = slices[0]["spec"]["devices"][0]["name"]
            .as_str()
            .expect("the slice names no device")
            .to_string();
        self.set_claim(
            namespace,
            name,
            uid,
            &[AllocatedDevice {
                request: "gpu".to_string(),
                driver: driver.to_string(),
                pool: pool.to_string(),
                device: device.clone(),
                ..AllocatedDevice::default()
            }],
        );
        self.reserve_claim(namespace, name, &[("p1", "pod-uid-1")]);
        device
    }

    /// Reserves the stored ResourceClaim `namespace/name` for `pods` (name, UID): its
    /// `status.reservedFor` becomes one core `pods` consumer reference per pod, as the
    /// scheduler writes it before the kubelet prepares the claim.
    ///
    /// # Panics
    /// When no such claim is stored.
    pub fn reserve_claim(&self, namespace: &str, name: &str, pods: &[(&str, &str)]) {
        let mut inner = self.shared.inner.lock().unwrap();
        let claim = inner
            .claims
            .get_mut(&(namespace.to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("no claim {namespace}/{name} to reserve"));
        let reserved: Vec<Value> = pods
            .iter()
            .map(|(pod, uid)| json!({"resource": "pods", "name": pod, "uid": uid}))
            .collect();
        if !claim["status"].is_object() {
            claim["status"] = json!({});
        }
        claim["status"]["reservedFor"] = Value::Array(reserved);
    }

    /// Deletes the ResourceClaim `namespace/name`.
    pub fn delete_claim(&self, namespace: &str, name: &str) {
        self.shared
            .inner
            .lock()
            .unwrap()
            .claims
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Every request's field selector so far.
    pub fn selectors(&self) -> Vec<String> {
        self.shared.inner.lock().unwrap().selectors.clone()
    }

    /// Every Node LIST's `resourceVersion` so far (`None`: a quorum read).
    pub fn node_list_versions(&self) -> Vec<Option<String>> {
        self.shared.inner.lock().unwrap().node_list_versions.clone()
    }

    /// Every ResourceSlice LIST's `resourceVersion` and `resourceVersionMatch` so far.
    pub fn slice_list_versions(&self) -> Vec<(Option<String>, Option<String>)> {
        self.shared
            .inner
            .lock()
            .unwrap()
            .slice_list_versions
            .clone()
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        self.shared.counters.borrow().clone()
    }

    /// Waits until the counters satisfy `pred`.
    ///
    /// # Panics
    /// After [`WAIT`].
    pub async fn wait(&self, pred: impl FnMut(&Counters) -> bool) -> Counters {
        let mut rx = self.shared.counters.subscribe();
        let got = tokio::time::timeout(WAIT, rx.wait_for(pred))
            .await
            .expect("timed out waiting for the Kubernetes API emulator")
            .expect("emulator gone")
            .clone();
        got
    }
}

/// A kubeconfig for `server` (a token user, no TLS), written as JSON (which is YAML).
pub fn kubeconfig_for(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emu", "cluster": {"server": server}}],
        "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
        "current-context": "emu",
        "users": [{"name": "emu", "user": {"token": "test-token"}}],
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path
}
