//! The Kubernetes API, read-only, for one thing: this node's own labels, its config-selection
//! label (`nvidia.com/device-plugin.config`, [`crate::policy::select`]) and its MIG layout
//! label ([`MIG_CONFIG_LABEL`], docs/mig.md), both carried by one watch of the Node.
//!
//! [`watch_label`] starts a task that watches the Node named `--node-name` only (field selector
//! `metadata.name=<node>`, so the API server sends nothing about other nodes), metadata only
//! (`PartialObjectMetadata`: the API server leaves out the Node's spec and status, and the
//! daemon carries no deserializer for them), with kube-runtime's watcher: a LIST (from the API
//! server's watch cache, `resourceVersion=0`), then a WATCH from its resourceVersion,
//! re-listing when the
//! API server says the version is too old (410 Gone), and exponential backoff (0.8 s doubling
//! to 30 s, with jitter) after any error, reset only by an answer (a completed list, a change):
//! not kube-runtime's `default_backoff`, which the watcher's `Init` before every re-list resets,
//! so that a LIST failing for good (403, an API server down) was retried about once a second
//! forever: on a fleet, every node once a second. It publishes [`LabelView`] on a `watch`
//! channel, changed only when the label's value, the sync state or the error changes; the
//! supervisor re-reads the policy on a change.
//!
//! The API is never on the Allocate or ListAndWatch path: a lost connection only means the
//! label cannot change; the config chosen last keeps serving. RBAC needed: `get`, `list` and
//! `watch` on `nodes`.

use std::path::PathBuf;
use std::pin::pin;

use k8s_openapi::api::core::v1::Node;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

/// What the supervisor knows of the node's label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelView {
    /// True once a LIST of the node succeeded (the value below is then the API's, not a
    /// guess).
    pub synced: bool,
    /// The label's value (`None`: the label is not set, or the node does not exist).
    pub value: Option<String>,
    /// The MIG layout label's value ([`MIG_CONFIG_LABEL`]; `None`: not set).
    pub mig_config: Option<String>,
    /// The last error talking to the API (building the client, LIST or WATCH), cleared by the
    /// next successful event. The last synced value stays in `value` meanwhile.
    pub error: Option<String>,
}

/// Where to reach the API and what to watch.
#[derive(Debug, Clone)]
pub struct LabelWatch {
    /// The node's name (`spec.nodeName` through the downward API).
    pub node: String,
    /// A kubeconfig file (`--kubeconfig`, or `KUBECONFIG`); `None`: `~/.kube/config` when it
    /// exists, else the in-cluster service account (kube's `Config::infer`), as in a pod.
    pub kubeconfig: Option<PathBuf>,
}

/// Building the API client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("reading kubeconfig {}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig file was refused before parsing (not a regular file, too large, too
    /// deeply nested, not UTF-8); the error names the file.
    #[error(transparent)]
    Read(crate::policy::ReadError),
    /// Neither in-cluster config nor a kubeconfig was found.
    #[error(
        "no Kubernetes API configuration (not in a cluster, no KUBECONFIG, no ~/.kube/config)"
    )]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the config (TLS settings, say).
    #[error("building the Kubernetes API client")]
    Client(#[source] kube::Error),
}

/// Builds a client from `kubeconfig`, or (`None`) from kube's inference: `KUBECONFIG`,
/// `~/.kube/config`, then the in-cluster service account.
///
/// # Errors
/// [`ClientError`] naming the file or what was missing.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            // Through the policy's bounded reader: a regular file (a FIFO must not hang the
            // watch), at most 1 MiB, nesting checked before the YAML parser sees it.
            let text = crate::policy::read_bounded(path, &crate::policy::Limits::default())
                .map_err(ClientError::Read)?;
            let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|source| {
                ClientError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClientError::Infer)?,
    };
    // ring, explicitly: rustls picks a process-wide provider from its features only when one
    // provider is enabled, and a build that unifies a second one into them (tests/hook-runc's:
    // the CDI library's jsonschema brings aws-lc-rs) would panic building the TLS config, even
    // for an http:// server. An install after the first is refused, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::try_from(with_user_agent(config)).map_err(ClientError::Client)
}

/// What slicelet's requests say they are (`User-Agent`), so that an API server's audit log,
/// or a flow schema matching user agents, tells them from other clients of the same
/// service account: kube's client sends none of its own.
pub const USER_AGENT: &str = concat!("slicelet/", env!("CARGO_PKG_VERSION"));

/// `config` sending [`USER_AGENT`] with every request.
fn with_user_agent(mut config: Config) -> Config {
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    config
}

/// The first retry delay after an API error.
pub const RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(800);
/// The longest retry delay after API errors.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// 0.8 s doubling to 30 s, with jitter, forever.
pub(crate) fn retry_backoff() -> impl Iterator<Item = std::time::Duration> {
    use backon::BackoffBuilder as _;
    backon::ExponentialBuilder::default()
        .with_min_delay(RETRY_MIN)
        .with_max_delay(RETRY_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The node label naming the MIG layout to apply (NVIDIA's mig-manager's key).
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";

/// The two values a node's labels give: (config label `label`, [`MIG_CONFIG_LABEL`]).
type Seen = (Option<String>, Option<String>);

/// The config label's and the MIG layout label's values on a node object (its metadata).
fn seen_on(node: &PartialObjectMeta<Node>, label: &str) -> Seen {
    (value_of(node, label), value_of(node, MIG_CONFIG_LABEL))
}

/// The label's value on a node object (its metadata).
fn value_of(node: &PartialObjectMeta<Node>, label: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(label).cloned()
}

/// Starts watching `w.node`'s label `label` on the current tokio runtime until `stop` is cancelled.
/// The receiver starts at [`LabelView::default`] (not synced).
///
/// A client that cannot be built (no configuration) is reported in [`LabelView::error`] and
/// the watch ends: nothing would change without a restart.
pub fn watch_label(
    w: LabelWatch,
    label: String,
    stop: CancellationToken,
) -> watch::Receiver<LabelView> {
    let (tx, rx) = watch::channel(LabelView::default());
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = run(w, &label, &tx) => {}
        }
    });
    rx
}

async fn run(w: LabelWatch, label: &str, tx: &watch::Sender<LabelView>) {
    let client = match client(w.kubeconfig.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            let error = crate::errors::chain(&e);
            tracing::error!(error = %error, node = %w.node, "cannot watch the node's config label; choosing the config by --config-default and the fallbacks");
            tx.send_modify(|v| v.error = Some(error));
            return;
        }
    };
    // `Api<PartialObjectMeta<Node>>` asks for metadata only.
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(client);
    let mut events = pin!(watcher::watcher(nodes, node_watch_config(&w.node)));
    // The values seen during a (re-)list, applied when the list is complete.
    let mut listing: Option<Seen> = None;
    let mut backoff = retry_backoff();
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                let delay = backoff.next().unwrap_or(RETRY_MAX);
                show_watch_error(tx, crate::errors::chain(&e), &w.node);
                // The watcher tries again at the next poll: wait first.
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        // An answer (a list complete, a change) resets the backoff; `Init`, which the watcher
        // yields before every (re-)list, is not one.
        if matches!(ev, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
            backoff = retry_backoff();
        }
        if let Some(seen) = label_seen(ev, &mut listing, &w.node, label) {
            show_label(tx, seen, &w.node, label);
        }
    }
}

/// The watch of Node `node`. Its LISTs from the API server's watch cache
/// (`resourceVersion=0`), as client-go's reflectors (the kubelet's own Node watch) do: a
/// quorum read makes an API server without consistent reads from its cache (etcd before
/// 3.5.13) read every Node from etcd, once per node of a fleet starting together. The watch
/// that follows brings any newer label. No pages (one Node): kube sends no
/// `resourceVersion=0` with a `limit`, which the API server would not honour from its cache.
fn node_watch_config(node: &str) -> watcher::Config {
    let mut config = watcher::Config::default()
        .fields(&format!("metadata.name={node}"))
        .any_semantic();
    config.page_size = None;
    config
}

/// Shows a failed watch (`error`) in the view, logging it once while it stays the same.
fn show_watch_error(tx: &watch::Sender<LabelView>, error: String, node: &str) {
    tx.send_if_modified(|v| {
        if v.error.as_deref() == Some(error.as_str()) {
            return false;
        }
        tracing::warn!(error = %error, node = %node, "Kubernetes API: watching the node failed; keeping the current config and retrying with backoff");
        v.error = Some(error.clone());
        true
    });
}

/// The labels' values event `ev` settles (`Some((None, None))`: no labels), or `None` while a
/// (re-)list is under way (its values kept in `listing` until the list is complete).
fn label_seen(
    ev: Event<PartialObjectMeta<Node>>,
    listing: &mut Option<Seen>,
    node: &str,
    label: &str,
) -> Option<Seen> {
    match ev {
        Event::Init => {
            *listing = Some((None, None));
            None
        }
        Event::InitApply(n) => {
            if n.metadata.name.as_deref() == Some(node) {
                *listing = Some(seen_on(&n, label));
            }
            None
        }
        Event::InitDone => Some(listing.take().unwrap_or((None, None))),
        Event::Apply(n) => Some(seen_on(&n, label)),
        Event::Delete(_) => Some((None, None)),
    }
}

/// Shows the labels' values `seen` in the view (synced, no error), logging a changed value.
fn show_label(tx: &watch::Sender<LabelView>, seen: Seen, node: &str, label: &str) {
    tx.send_if_modified(|v| {
        let next = LabelView {
            synced: true,
            value: seen.0.clone(),
            mig_config: seen.1.clone(),
            error: None,
        };
        if *v == next {
            return false;
        }
        if v.value != next.value || !v.synced {
            tracing::info!(node = %node, label = %label, value = ?next.value, "node config label");
        }
        if v.mig_config != next.mig_config || !v.synced {
            tracing::info!(node = %node, label = MIG_CONFIG_LABEL, value = ?next.mig_config, "node MIG layout label");
        }
        *v = next;
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every request names slicelet and its version (the fleet bench read an empty user agent
    /// in the API server's audit log before).
    #[test]
    fn requests_say_they_are_slicelets() {
        let config = with_user_agent(Config::new("https://127.0.0.1:6443".parse().unwrap()));
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(k, _)| k == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(agents, [format!("slicelet/{}", env!("CARGO_PKG_VERSION"))]);
    }
}
