//! `slicelet top --node NAME` and `slicelet top --all-nodes`: the daemons' `/status` through
//! the API server's pod proxy, so nobody port-forwards by hand.
//!
//! The kubeconfig is read as `kubectl` reads it (`--kubeconfig`, else `KUBECONFIG`, else
//! `~/.kube/config`, else the in-cluster service account; [`crate::k8s::client`]). slicelet's
//! pods are listed in `--namespace` with `--selector` (and, for `--node`, the field selector
//! `spec.nodeName=NAME`); each pod's status endpoint is its container port named `status`
//! (the chart's and the manifests' name; 8080 when no port has that name), reached as
//! `GET /api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/status` (the API server's
//! `pods/proxy` subresource). RBAC: `list` on pods and `get` on `pods/proxy` in that namespace
//! only (the chart's optional `top` Role grants exactly that).
//!
//! Each answer is bounded as the local fetch is: [`super::MAX_BODY_BYTES`] and
//! [`super::TIMEOUT`] per pod.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::TopError;
use crate::usage::view::NodeView;

/// The default `--namespace`: where the chart and the manifests install slicelet.
pub const DEFAULT_NAMESPACE: &str = "slicelet-system";
/// The default `--selector`: the label every slicelet pod carries (chart and manifests).
pub const DEFAULT_SELECTOR: &str = "app.kubernetes.io/name=slicelet";
/// The container port name of the status endpoint (chart and manifests).
pub const STATUS_PORT_NAME: &str = "status";
/// The status port when no container port is named [`STATUS_PORT_NAME`] (the daemon's
/// default `--status-address :8080`).
pub const DEFAULT_STATUS_PORT: i32 = 8080;
/// The component label of the device-plugin pods; preferred when several slicelet pods run on
/// one node (the chart's MPS DaemonSet carries the same name label).
const DEVICE_PLUGIN_COMPONENT: &str = "device-plugin";

/// Where to find the daemons.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// A kubeconfig file; `None`: as `kubectl` finds one.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The namespace slicelet runs in.
    pub namespace: String,
    /// The label selector of slicelet's pods.
    pub selector: String,
}

/// One slicelet pod and the proxy path of its status endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusPod {
    /// The node it runs on.
    pub node: String,
    /// The pod's name.
    pub pod: String,
    /// `/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/status`.
    pub path: String,
}

/// The status pods among `pods`, one per node (the device-plugin one where a node has
/// several), by node name. Pods not yet scheduled, or without a name, are skipped.
pub fn status_pods(namespace: &str, pods: &[Pod]) -> Vec<StatusPod> {
    let mut by_node: std::collections::BTreeMap<String, (bool, StatusPod)> = Default::default();
    for pod in pods {
        let (Some(name), Some(node)) = (
            pod.metadata.name.as_deref(),
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        ) else {
            continue;
        };
        let port = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(STATUS_PORT_NAME))
            .map_or(DEFAULT_STATUS_PORT, |p| p.container_port);
        let plugin = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/component"))
            .is_none_or(|c| c == DEVICE_PLUGIN_COMPONENT);
        let candidate = StatusPod {
            node: node.to_string(),
            pod: name.to_string(),
            path: format!("/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/status"),
        };
        match by_node.get(node) {
            Some((true, _)) => {}
            Some((false, _)) if !plugin => {}
            _ => {
                by_node.insert(node.to_string(), (plugin, candidate));
            }
        }
    }
    by_node.into_values().map(|(_, p)| p).collect()
}

impl Cluster {
    /// A client for the cluster.
    ///
    /// # Errors
    /// [`TopError::Kubeconfig`] when no kubeconfig or in-cluster config can be used.
    pub async fn client(&self) -> Result<kube::Client, TopError> {
        crate::k8s::client(self.kubeconfig.as_deref())
            .await
            .map_err(TopError::Kubeconfig)
    }

    /// slicelet's pods, on `node` only when given.
    ///
    /// # Errors
    /// [`TopError::Kube`] when the list is refused (RBAC, a wrong namespace).
    pub async fn pods(
        &self,
        client: &kube::Client,
        node: Option<&str>,
    ) -> Result<Vec<StatusPod>, TopError> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        let mut params = ListParams::default().labels(&self.selector);
        if let Some(node) = node {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        let list = api.list(&params).await.map_err(|source| TopError::Kube {
            what: format!("listing pods in {} with {}", self.namespace, self.selector),
            source,
        })?;
        Ok(status_pods(&self.namespace, &list.items))
    }
}

/// GETs one pod's `/status` through the pod proxy, bounded by [`super::TIMEOUT`] and
/// [`super::MAX_BODY_BYTES`].
///
/// # Errors
/// A [`TopError`] naming the proxy path.
pub async fn fetch(client: &kube::Client, pod: &StatusPod) -> Result<NodeView, TopError> {
    let url = pod.path.clone();
    let get = async {
        let request = http::Request::get(&url)
            .header(http::header::ACCEPT, "application/json")
            .body(kube::client::Body::empty())
            .map_err(|e| TopError::Address {
                address: url.clone(),
                reason: e.to_string(),
            })?;
        let response = client
            .send(request)
            .await
            .map_err(|source| TopError::Kube {
                what: format!("GET {url}"),
                source,
            })?;
        super::read_view(&url, response).await
    };
    super::within(url.clone(), get).await
}

/// `--node NAME`: that node's view, rendered as the local `slicelet top` renders it, under a
/// line naming the node and the pod.
///
/// # Errors
/// [`TopError::NoPod`] when no slicelet pod runs on `node`; as [`fetch`].
pub async fn node(
    cluster: &Cluster,
    client: &kube::Client,
    node: &str,
) -> Result<String, TopError> {
    let pods = cluster.pods(client, Some(node)).await?;
    let Some(pod) = pods.iter().find(|p| p.node == node) else {
        return Err(TopError::NoPod {
            node: node.to_string(),
            namespace: cluster.namespace.clone(),
            selector: cluster.selector.clone(),
        });
    };
    let view = fetch(client, pod).await?;
    Ok(format!(
        "node {}  pod {}/{}\n{}",
        super::printable(node),
        super::printable(&cluster.namespace),
        super::printable(&pod.pod),
        super::render(&view)
    ))
}

/// `--all-nodes`: one table of every node's GPUs and their holders. The nodes are asked at
/// once (each within [`super::TIMEOUT`]), so one that does not answer costs the view [`super::TIMEOUT`],
/// not one per node; it is one row saying why, the others are still shown.
///
/// # Errors
/// As [`Cluster::pods`].
pub async fn all_nodes(cluster: &Cluster, client: &kube::Client) -> Result<String, TopError> {
    let pods = cluster.pods(client, None).await?;
    let mut asks = tokio::task::JoinSet::new();
    for (i, pod) in pods.into_iter().enumerate() {
        let client = client.clone();
        asks.spawn(async move {
            let view = fetch(&client, &pod).await;
            (i, pod.node, view)
        });
    }
    let mut views = Vec::with_capacity(asks.len());
    while let Some(done) = asks.join_next().await {
        match done {
            Ok(answer) => views.push(answer),
            Err(e) => views.push((usize::MAX, "?".to_string(), Err(TopError::Ask(e)))),
        }
    }
    views.sort_by_key(|(i, _, _)| *i);
    let views: Vec<_> = views.into_iter().map(|(_, node, v)| (node, v)).collect();
    Ok(render_all(&views))
}

/// The `--all-nodes` table: NODE, GPU (index), MODEL, UTIL %, MEMORY used/total MiB, DEVICES
/// (advertised), HELD (by a container), HOLDERS (`namespace/pod`, each once, in order); a
/// node whose view could not be fetched is one row with the reason (the error and its
/// causes). Ends with one line of totals.
pub fn render_all(views: &[(String, Result<NodeView, TopError>)]) -> String {
    use comfy_table::{presets, Table};
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header([
        "NODE",
        "GPU",
        "MODEL",
        "UTIL",
        "MEMORY MiB",
        "DEVICES",
        "HELD",
        "HOLDERS",
    ]);
    let (mut gpus, mut devices, mut held) = (0usize, 0usize, 0usize);
    for (node, view) in views {
        let node = super::printable(node);
        let view = match view {
            Ok(v) => v,
            Err(e) => {
                table.add_row([node, "-".into(), super::printable(&crate::errors::chain(e))]);
                continue;
            }
        };
        if view.gpus.is_empty() {
            table.add_row([node.clone(), "-".into(), "no GPUs".into()]);
        }
        for g in &view.gpus {
            let mut holders: Vec<String> = Vec::new();
            for h in g.devices.iter().filter_map(|d| d.holder.as_ref()) {
                let who = super::printable(&format!("{}/{}", h.namespace, h.pod));
                if !holders.contains(&who) {
                    holders.push(who);
                }
            }
            let n_held = g.devices.iter().filter(|d| d.holder.is_some()).count();
            gpus += 1;
            devices += g.devices.len();
            held += n_held;
            let mib = |b: Option<u64>| b.map_or("-".to_string(), |b| (b / super::MIB).to_string());
            table.add_row([
                node.clone(),
                g.index.to_string(),
                super::printable(g.model.as_deref().unwrap_or("-")),
                g.utilization_percent
                    .map_or("-".to_string(), |u| format!("{u}%")),
                format!("{}/{}", mib(g.memory_used_bytes), mib(g.memory_total_bytes)),
                g.devices.len().to_string(),
                n_held.to_string(),
                if holders.is_empty() {
                    "-".to_string()
                } else {
                    holders.join(",")
                },
            ]);
        }
    }
    format!(
        "{table}\n{} nodes, {gpus} GPUs, {held} of {devices} devices held\n",
        views.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        name: &str,
        node: Option<&str>,
        component: Option<&str>,
        port: Option<(&str, i32)>,
    ) -> Pod {
        let mut labels = serde_json::json!({"app.kubernetes.io/name": "slicelet"});
        if let Some(c) = component {
            labels["app.kubernetes.io/component"] = serde_json::json!(c);
        }
        let ports: Vec<serde_json::Value> = port
            .iter()
            .map(|(n, p)| serde_json::json!({"name": n, "containerPort": p}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "slicelet", "ports": ports}]},
        }))
        .unwrap()
    }

    #[test]
    fn one_status_pod_per_node_the_device_plugin_first() {
        let pods = [
            pod("mps-a", Some("a"), Some("mps"), Some(("status", 9000))),
            pod(
                "dp-a",
                Some("a"),
                Some("device-plugin"),
                Some(("status", 8081)),
            ),
            pod("mps-a2", Some("a"), Some("mps"), None),
            pod("plain-b", Some("b"), None, Some(("metrics", 9100))),
            pod(
                "pending",
                None,
                Some("device-plugin"),
                Some(("status", 8080)),
            ),
            pod("mps-c", Some("c"), Some("mps"), Some(("status", 8082))),
        ];
        let got = status_pods("ns", &pods);
        let want = [
            ("a", "/api/v1/namespaces/ns/pods/dp-a:8081/proxy/status"),
            // No port named status: the daemon's default port.
            ("b", "/api/v1/namespaces/ns/pods/plain-b:8080/proxy/status"),
            // Only an MPS pod on c: it is asked (it may serve a status endpoint too).
            ("c", "/api/v1/namespaces/ns/pods/mps-c:8082/proxy/status"),
        ];
        let got: Vec<(&str, &str)> = got
            .iter()
            .map(|p| (p.node.as_str(), p.path.as_str()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_all_nodes_table_lists_holders_once_and_failed_nodes_as_rows() {
        use crate::usage::view::{DeviceView, GpuView, HolderView};
        let held = |pod: &str| DeviceView {
            holder: Some(HolderView {
                namespace: "ml".into(),
                pod: pod.into(),
                container: "server".into(),
            }),
            ..Default::default()
        };
        let view = NodeView {
            gpus: vec![GpuView {
                index: 3,
                model: Some("NVIDIA H100 80GB HBM3".into()),
                utilization_percent: Some(40),
                memory_used_bytes: Some(2048 * 1024 * 1024),
                memory_total_bytes: Some(81559 * 1024 * 1024),
                devices: vec![
                    held("a"),
                    held("a"),
                    held("b\u{1b}[2J"),
                    DeviceView::default(),
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render_all(&[
            ("node-1".into(), Ok(view)),
            (
                "node-2".into(),
                Err(TopError::Status {
                    url: "…".into(),
                    code: 503,
                }),
            ),
        ]);
        let row = text.lines().find(|l| l.contains("node-1")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], "3", "{row}");
        assert!(row.contains("40%") && row.contains("2048/81559"), "{row}");
        assert!(
            row.contains(" 4 ") && row.contains(" 3 "),
            "devices and held: {row}"
        );
        assert!(
            row.contains("ml/a,ml/b\\u{1b}[2J"),
            "holders once, escaped: {row}"
        );
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.lines()
                .any(|l| l.contains("node-2") && l.contains("HTTP 503")),
            "{text}"
        );
        assert!(
            text.ends_with("2 nodes, 1 GPUs, 3 of 4 devices held\n"),
            "{text}"
        );
    }
}
