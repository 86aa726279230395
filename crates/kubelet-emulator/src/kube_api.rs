//! A small Kubernetes API emulator: just enough of `/api/v1/nodes` for the real `kube` client's
//! watcher (LIST with a field selector and a resourceVersion, then a streaming WATCH of
//! newline-delimited watch events; full objects, or `PartialObjectMetadata` when the `Accept`
//! header asks for it as the API server serves it), over HTTP on a loopback port, reached through a
//! kubeconfig file. One node; tests change its labels, end every open watch, or make the API
//! answer 500 and back. For the integration tests and the benchmark (the Node watch's RSS).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Query, State};
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
    // `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
    let meta_only = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("as=PartialObjectMetadata"));
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
    if q.watch.as_deref().is_some_and(|w| w == "true" || w == "1") {
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

    /// Ends every open watch stream (as an API server restart or a load balancer would).
    pub fn drop_watches(&self) {
        self.shared.inner.lock().unwrap().watchers.clear();
    }

    /// Makes every request answer 500 (and ends open watches), or serves again.
    pub fn set_unavailable(&self, unavailable: bool) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.unavailable = unavailable;
        if unavailable {
            inner.watchers.clear();
        }
    }

    /// Every request's field selector so far.
    pub fn selectors(&self) -> Vec<String> {
        self.shared.inner.lock().unwrap().selectors.clone()
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
