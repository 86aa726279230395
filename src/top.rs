//! `slicelet top`: one node's GPUs and who uses them, from the daemon's `/status`
//! ([`crate::usage::view::NodeView`]).
//!
//! Per GPU a header line (index, model, utilisation %, memory used/total MiB) and under it a
//! table of its devices: device ID, resource, state (health, or `draining`), holder
//! `namespace/pod/container`, that container's SM %, memory MiB and idle seconds. `--once`
//! prints once; otherwise the screen is redrawn every second until Ctrl-C.
//!
//! The client is bounded: one GET, a body of at most [`MAX_BODY_BYTES`], all within
//! [`TIMEOUT`]; plain HTTP only (the status endpoint serves no TLS).

use std::time::Duration;

use comfy_table::{presets, CellAlignment, Table};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::usage::view::{DeviceView, GpuView, NodeView};

pub mod cluster;

/// Whose status `slicelet top` shows.
#[derive(Debug, Clone)]
pub enum Source {
    /// One daemon's status endpoint (`--address`), as an http:// URL.
    Local(String),
    /// The daemon on one node, through the API server's pod proxy (`--node`).
    Node(cluster::Cluster, String),
    /// Every node's daemon, through the pod proxy, as one table (`--all-nodes`).
    AllNodes(cluster::Cluster),
}

/// The default `--address`: the daemon's status endpoint on this host.
pub const DEFAULT_ADDRESS: &str = "http://127.0.0.1:8080";
/// Largest `/status` body read, bytes (64 MiB). Sized from what a valid node can produce:
/// `/status` spends about 600 bytes a device (a node of 2,688 devices is about 1.5 MiB, one of
/// 16,000 about 9 MiB), and the kubelet's 4 MiB message limit caps one resource's list at
/// roughly 60,000 devices, so 64 MiB covers over 100,000 devices.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How long one fetch (connect, headers, body) may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// How often the view is redrawn without `--once`.
pub const REFRESH: Duration = Duration::from_secs(1);

const MIB: u64 = 1024 * 1024;

/// Why `/status` could not be shown. Each names the URL asked.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// `--address` is not an `http://host:port` URL.
    #[error("`{address}` is not an http:// URL of slicelet's status endpoint: {reason}")]
    Address {
        /// What was given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Nothing answered (not running, another port, `--status-address` off).
    #[error("GET {url}: no answer (is `slicelet run` serving its status endpoint there?)")]
    Request {
        /// The URL asked.
        url: String,
        /// The client's error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// No whole answer within [`TIMEOUT`].
    #[error("GET {url}: no answer within {} s", TIMEOUT.as_secs())]
    Timeout {
        /// The URL asked.
        url: String,
    },
    /// An answer other than 200 (an older slicelet without `/status` answers 404).
    #[error("GET {url}: HTTP {code} (an older slicelet has no /status)")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status code.
        code: u16,
    },
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("GET {url}: the answer is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge {
        /// The URL asked.
        url: String,
    },
    /// The body broke off.
    #[error("GET {url}: reading the answer")]
    Body {
        /// The URL asked.
        url: String,
        /// The body's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The body is not slicelet's `/status` JSON.
    #[error("GET {url}: not slicelet's /status JSON")]
    Parse {
        /// The URL asked.
        url: String,
        /// Where and why it did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// No kubeconfig or in-cluster config could be used (`--node`, `--all-nodes`).
    #[error("connecting to the cluster")]
    Kubeconfig(#[source] crate::k8s::ClientError),
    /// The API server refused or failed a request (RBAC: `list` pods, `get` `pods/proxy`).
    #[error("{what}")]
    Kube {
        /// The request, in words.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Asking one node (`--all-nodes`) ended without an answer: its task panicked or was
    /// cancelled. Shown as the task's own error.
    #[error(transparent)]
    Ask(#[from] tokio::task::JoinError),
    /// No slicelet pod runs on the node (`--node`).
    #[error("no pod with {selector} runs on node {node} in namespace {namespace} (see --namespace, --selector)")]
    NoPod {
        /// The node asked for.
        node: String,
        /// The namespace searched.
        namespace: String,
        /// The label selector used.
        selector: String,
    },
    /// Writing to the terminal failed.
    #[error("writing to standard output")]
    Output(#[source] std::io::Error),
}

/// The `/status` URL of `address` (`http://host:port`, a trailing `/` allowed).
///
/// # Errors
/// [`TopError::Address`] when it is not an `http://` URL with a host.
pub fn status_url(address: &str) -> Result<hyper::Uri, TopError> {
    let bad = |reason: &str| TopError::Address {
        address: address.to_string(),
        reason: reason.to_string(),
    };
    let full = format!("{}/status", address.trim().trim_end_matches('/'));
    let uri: hyper::Uri = full
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad("only http:// is served"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    Ok(uri)
}

/// GETs `<address>/status` once, bounded by [`TIMEOUT`] and [`MAX_BODY_BYTES`].
///
/// # Errors
/// A [`TopError`] naming the URL.
pub async fn fetch(address: &str) -> Result<NodeView, TopError> {
    let uri = status_url(address)?;
    let url = uri.to_string();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = async {
        let response = client.get(uri).await.map_err(|source| TopError::Request {
            url: url.clone(),
            source,
        })?;
        read_view(&url, response).await
    };
    within(url.clone(), get).await
}

/// A `/status` answer from `url` read as slicelet's view: HTTP 200, a body of at most
/// [`MAX_BODY_BYTES`], the view's JSON. Shared by the local fetch and the pod proxy's.
///
/// # Errors
/// [`TopError::Status`], [`TopError::TooLarge`], [`TopError::Body`], [`TopError::Parse`].
async fn read_view<B>(url: &str, response: hyper::Response<B>) -> Result<NodeView, TopError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if !response.status().is_success() {
        return Err(TopError::Status {
            url: url.to_string(),
            code: response.status().as_u16(),
        });
    }
    let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|source| {
            if source.is::<http_body_util::LengthLimitError>() {
                TopError::TooLarge {
                    url: url.to_string(),
                }
            } else {
                TopError::Body {
                    url: url.to_string(),
                    source,
                }
            }
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|source| TopError::Parse {
        url: url.to_string(),
        source,
    })
}

/// `get` within [`TIMEOUT`]; [`TopError::Timeout`] naming `url` past it.
async fn within<T>(
    url: String,
    get: impl std::future::Future<Output = Result<T, TopError>>,
) -> Result<T, TopError> {
    match tokio::time::timeout(TIMEOUT, get).await {
        Ok(result) => result,
        Err(_) => Err(TopError::Timeout { url }),
    }
}

/// `s` with every control character (ESC, BEL, newlines, C1 controls such as the 8-bit CSI)
/// written as its Rust escape (`\u{1b}`), so text from the server (a holder's name, a
/// `/readyz` reason quoting a ConfigMap) can never move the cursor, retitle the terminal or
/// reach the clipboard (OSC 52).
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn mib(bytes: Option<u64>) -> String {
    or_dash(bytes.map(|b| b / MIB))
}

/// The line above a GPU's table: `GPU <index>  <model>  <uuid>  util <p>%  memory
/// <used>/<total> MiB` (`-` for what is not known, e.g. before the first sample).
pub fn gpu_line(g: &GpuView) -> String {
    let mut line = format!(
        "GPU {}  {}  {}  util {}  memory {}/{} MiB",
        g.index,
        g.model.as_deref().unwrap_or("-"),
        g.uuid,
        or_dash(g.utilization_percent.map(|p| format!("{p}%"))),
        mib(g.memory_used_bytes),
        mib(g.memory_total_bytes),
    );
    if g.unattributed_processes > 0 {
        line.push_str(&format!(
            "  ({} processes of no known pod)",
            g.unattributed_processes
        ));
    }
    line
}

/// The table's header.
pub const COLUMNS: [&str; 7] = [
    "DEVICE", "RESOURCE", "STATE", "HOLDER", "SM%", "MEM MiB", "IDLE s",
];

/// The extra column shown for a GPU where some holder has a GPU memory limit.
pub const LIMIT_COLUMN: &str = "LIMIT MiB";

/// One device's cells, in [`COLUMNS`] order.
pub fn device_cells(d: &DeviceView) -> [String; 7] {
    let mut state = if d.draining.is_some() {
        "draining".to_string()
    } else {
        d.health.clone()
    };
    if d.retained {
        state.push_str(" (retained)");
    }
    [
        d.id.clone(),
        d.resource.clone(),
        state,
        or_dash(d.holder.as_ref()),
        or_dash(d.sm_util_percent),
        mib(d.memory_used_bytes),
        or_dash(d.idle_seconds.map(|s| format!("{s:.0}"))),
    ]
}

/// The [`LIMIT_COLUMN`] cell: the holder's hard limit in MiB and whether NVML reads it back
/// (`20480 enforced`, `20480 NOT enforced`, `20480 unchecked` while no process of the holder
/// ran on the GPU); `-` without a limit.
pub fn limit_cell(d: &DeviceView) -> String {
    match d.memory_limit_bytes {
        None => "-".to_string(),
        Some(b) => {
            let state = match d.memory_limit_enforced {
                Some(true) => "enforced",
                Some(false) => "NOT enforced",
                None => "unchecked",
            };
            format!("{} {state}", b / (1024 * 1024))
        }
    }
}

/// The first line: generation and readiness.
pub fn node_line(view: &NodeView) -> String {
    let ready = match &view.ready_reason {
        None if view.ready => "ready".to_string(),
        None => "not ready".to_string(),
        Some(reason) => format!("not ready: {reason}"),
    };
    let mut line = format!("slicelet  policy generation {}  {ready}", view.generation);
    if let Some(e) = &view.checkpoint_error {
        line.push_str(&format!("  (no per-container figures: {e})"));
    }
    line
}

/// The whole screen for one `/status` answer: [`node_line`], then per GPU a blank line,
/// [`gpu_line`] and its devices' table (no borders, columns padded one space each side, SM%,
/// MEM MiB and IDLE s right-aligned, trailing blanks trimmed; a [`LIMIT_COLUMN`] after them
/// where a holder on that GPU has a memory limit), then a blank line and
/// `free: <resource> <n>, …`. Pure.
pub fn render(view: &NodeView) -> String {
    let mut out = printable(&node_line(view));
    out.push('\n');
    for g in &view.gpus {
        out.push('\n');
        out.push_str(&printable(&gpu_line(g)));
        out.push('\n');
        if g.devices.is_empty() {
            continue;
        }
        let limits = g.devices.iter().any(|d| d.memory_limit_bytes.is_some());
        let mut header: Vec<&str> = COLUMNS.to_vec();
        if limits {
            header.push(LIMIT_COLUMN);
        }
        let mut table = Table::new();
        table.load_preset(presets::NOTHING).set_header(&header);
        for d in &g.devices {
            let mut cells = device_cells(d).to_vec();
            if limits {
                cells.push(limit_cell(d));
            }
            table.add_row(cells.iter().map(|c| printable(c)).collect::<Vec<_>>());
        }
        for i in 4..header.len() {
            if let Some(c) = table.column_mut(i) {
                c.set_cell_alignment(CellAlignment::Right);
            }
        }
        for line in table.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.push('\n');
    let free: Vec<String> = view
        .free
        .iter()
        .map(|(r, n)| printable(&format!("{r} {n}")))
        .collect();
    out.push_str(&format!(
        "free: {}\n",
        if free.is_empty() {
            "-".to_string()
        } else {
            free.join(", ")
        }
    ));
    out
}

/// What `slicelet top --once` prints: one fetch, rendered.
///
/// # Errors
/// As [`fetch`].
pub async fn once(address: &str) -> Result<String, TopError> {
    fetch(address).await.map(|v| render(&v))
}

/// Clears the terminal and moves the cursor home (ANSI: `ESC [ H`, `ESC [ 2 J`).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// One rendering of `source`; a cluster source uses `client` (connecting when `None`).
async fn view(source: &Source, client: Option<&kube::Client>) -> Result<String, TopError> {
    let cluster = match source {
        Source::Local(address) => return once(address).await,
        Source::Node(c, _) | Source::AllNodes(c) => c,
    };
    let connected;
    let client = match client {
        Some(client) => client,
        None => {
            connected = cluster.client().await?;
            &connected
        }
    };
    match source {
        Source::Node(c, node) => cluster::node(c, client, node).await,
        _ => cluster::all_nodes(cluster, client).await,
    }
}

/// `slicelet top`: with `once`, prints one view and returns; otherwise redraws every
/// [`REFRESH`] until Ctrl-C (a failed fetch is shown in place of the view and retried).
///
/// # Errors
/// With `once`, as [`fetch`] (or [`cluster::node`], [`cluster::all_nodes`]); a bad
/// `address`, or no usable kubeconfig, at once; writing to standard output.
pub async fn run(source: &Source, once: bool) -> Result<(), TopError> {
    use std::io::Write as _;
    let client = match source {
        Source::Local(address) => {
            status_url(address)?;
            None
        }
        Source::Node(c, _) | Source::AllNodes(c) => Some(c.client().await?),
    };
    if once {
        let text = view(source, client.as_ref()).await?;
        let mut out = std::io::stdout().lock();
        return out.write_all(text.as_bytes()).map_err(TopError::Output);
    }
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            _ = tick.tick() => {}
        }
        let text = match view(source, client.as_ref()).await {
            Ok(text) => text,
            Err(e) => format!("{}\n", crate::errors::chain(&e)),
        };
        let mut out = std::io::stdout().lock();
        out.write_all(CLEAR.as_bytes())
            .and_then(|()| out.write_all(text.as_bytes()))
            .and_then(|()| out.flush())
            .map_err(TopError::Output)?;
    }
}

#[cfg(test)]
#[path = "top_tests.rs"]
mod tests;
