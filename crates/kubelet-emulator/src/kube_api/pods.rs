//! Pods in namespaces, and the `pods/proxy` subresource as the API server serves it:
//! `GET /api/v1/namespaces/<ns>/pods` (label selector `k=v,…` and field selector
//! `spec.nodeName=<node>`), and `GET /api/v1/namespaces/<ns>/pods/<name>:<port>/proxy/<path>`
//! forwarded as a real HTTP GET to the pod's IP and that port (503 when nothing answers there,
//! 404 for an unknown pod), its status and body passed back.

use std::net::IpAddr;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::{ok_json, refuse_if_down, status, KubeApi, Shared};

/// One pod: its object as listed, and the IP the proxy dials.
#[derive(Clone)]
pub(super) struct PodEntry {
    object: Value,
    ip: IpAddr,
}

#[derive(serde::Deserialize)]
pub(super) struct PodQuery {
    #[serde(rename = "labelSelector", default)]
    label_selector: String,
    #[serde(rename = "fieldSelector", default)]
    field_selector: String,
}

/// Whether `labels` satisfy an equality selector `k=v,k2==v2`.
fn labels_match(selector: &str, labels: &Value) -> Result<bool, String> {
    for part in selector.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("unsupported label selector {part}"))?;
        if labels[k].as_str() != Some(v.trim_start_matches('=')) {
            return Ok(false);
        }
    }
    Ok(true)
}

pub(super) async fn list_pods(
    State(s): State<Shared>,
    UrlPath(namespace): UrlPath<String>,
    Query(q): Query<PodQuery>,
) -> Response {
    let mut inner = s.inner.lock().unwrap();
    inner.selectors.push(q.field_selector.clone());
    if let Some(r) = refuse_if_down(&s, &inner) {
        return r;
    }
    let node = match q.field_selector.as_str() {
        "" => None,
        f => match f.strip_prefix("spec.nodeName=") {
            Some(n) => Some(n.to_string()),
            None => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("field label not supported: {f}"),
                )
            }
        },
    };
    let mut items = Vec::new();
    for ((ns, _), pod) in &inner.pods {
        if *ns != namespace {
            continue;
        }
        match labels_match(&q.label_selector, &pod.object["metadata"]["labels"]) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e),
        }
        if node
            .as_deref()
            .is_some_and(|n| pod.object["spec"]["nodeName"].as_str() != Some(n))
        {
            continue;
        }
        items.push(pod.object.clone());
    }
    let list = json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": inner.resource_version.to_string()},
        "items": items,
    });
    drop(inner);
    s.counters.send_modify(|c| c.pod_lists += 1);
    ok_json(&list)
}

pub(super) async fn proxy(
    State(s): State<Shared>,
    UrlPath((namespace, target, path)): UrlPath<(String, String, String)>,
) -> Response {
    let (name, port) = match target.rsplit_once(':') {
        Some((n, p)) => (n.to_string(), p.parse::<u16>().ok()),
        None => (target.clone(), Some(80)),
    };
    let ip = {
        let inner = s.inner.lock().unwrap();
        if let Some(r) = refuse_if_down(&s, &inner) {
            return r;
        }
        inner.pods.get(&(namespace, name.clone())).map(|p| p.ip)
    };
    let Some(ip) = ip else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        );
    };
    let Some(port) = port else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("invalid port in {target}"),
        );
    };
    s.counters.send_modify(|c| c.proxied += 1);
    let uri = format!("http://{ip}:{port}/{path}");
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let unreachable = |e: String| {
        status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!("error trying to reach service: {e}"),
        )
    };
    let Ok(uri) = uri.parse::<hyper::Uri>() else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("bad path {path}"),
        );
    };
    let response = match client.get(uri).await {
        Ok(r) => r,
        Err(e) => return unreachable(e.to_string()),
    };
    let code = response.status();
    match response.into_body().collect().await {
        Ok(body) => (code, body.to_bytes()).into_response(),
        Err(e) => unreachable(e.to_string()),
    }
}

impl KubeApi {
    /// Adds (or replaces) pod `namespace/name` on `node` with `labels`, serving its status
    /// endpoint on `ip` at the container port `status_port`, named `status` (as slicelet's
    /// DaemonSet names it): the pod proxy dials `ip` and the port the path names.
    pub fn add_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: &[(&str, &str)],
        ip: IpAddr,
        status_port: u16,
    ) {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [{
                    "name": "slicelet",
                    "ports": [{"name": "status", "containerPort": status_port, "protocol": "TCP"}],
                }],
            },
            "status": {"podIP": ip.to_string(), "phase": "Running"},
        });
        self.shared.inner.lock().unwrap().pods.insert(
            (namespace.to_string(), name.to_string()),
            PodEntry { object, ip },
        );
    }
}
