//! `slicelet top`: the screen, the URL, and the client against real and broken servers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::usage::view::HolderView;

const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
const SHARED: &str = "nvidia.com/gpu-shared";
const MODEL: &str = "NVIDIA H100 80GB HBM3";

fn device(
    id: &str,
    holder: Option<(&str, &str, &str)>,
    figures: Option<(u32, u64, f64)>,
) -> DeviceView {
    DeviceView {
        resource: SHARED.into(),
        id: id.into(),
        unit_uuid: GPU0.into(),
        replica: None,
        mig_profile: None,
        health: "Healthy".into(),
        draining: None,
        retained: false,
        holder: holder.map(|(namespace, pod, container)| HolderView {
            namespace: namespace.into(),
            pod: pod.into(),
            container: container.into(),
        }),
        sm_util_percent: figures.map(|f| f.0),
        memory_used_bytes: figures.map(|f| f.1 * MIB),
        idle_seconds: figures.map(|f| f.2),
        memory_limit_bytes: None,
        memory_limit_enforced: None,
    }
}

/// Two pods on replicas 0 and 1 of GPU 0 (30 % and 10 % SM), replica 2 free, replica 3
/// draining; GPU 1 advertised but not sampled.
fn two_pods() -> NodeView {
    let r = |n: u32| format!("{GPU0}::{n}");
    let mut draining = device(&r(3), None, None);
    draining.health = "Unhealthy".into();
    draining.draining = Some("draining: held by ml/old".into());
    NodeView {
        generation: 3,
        ready: true,
        ready_reason: None,
        sampled_at_unix_ms: Some(1_000_000),
        checkpoint_error: None,
        unattributed_processes: 1,
        gpus: vec![
            GpuView {
                index: 0,
                uuid: GPU0.into(),
                model: Some(MODEL.into()),
                utilization_percent: Some(40),
                memory_used_bytes: Some(1536 * MIB),
                memory_total_bytes: Some(81_559 * MIB),
                unattributed_processes: 1,
                memory_limits_supported: None,
                devices: vec![
                    device(&r(0), Some(("ml", "a", "main")), Some((30, 1024, 0.0))),
                    device(&r(1), Some(("ml", "b", "main")), Some((10, 512, 12.4))),
                    device(&r(2), None, None),
                    draining,
                ],
            },
            GpuView {
                index: 1,
                uuid: GPU1.into(),
                ..GpuView::default()
            },
        ],
        free: BTreeMap::from([(SHARED.to_string(), 1)]),
    }
}

/// A table as the doc of [`render`] says: one space each side of each cell, columns as wide as
/// their widest cell, the last three right-aligned, trailing blanks trimmed.
fn table(rows: &[[&str; 7]]) -> String {
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let line: String = (0..7)
                .map(|i| {
                    let w = widths[i];
                    if i >= 4 {
                        format!(" {:>w$} ", r[i])
                    } else {
                        format!(" {:<w$} ", r[i])
                    }
                })
                .collect();
            format!("{}\n", line.trim_end())
        })
        .collect()
}

#[test]
fn renders_two_pods_under_their_gpu() {
    let view = two_pods();
    let r = |n: u32| format!("{GPU0}::{n}");
    let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
    let mut want = String::from("slicelet  policy generation 3  ready\n\n");
    want.push_str(&format!(
        "GPU 0  {MODEL}  {GPU0}  util 40%  memory 1536/81559 MiB  (1 processes of no known pod)\n"
    ));
    want.push_str(&table(&[
        [
            "DEVICE", "RESOURCE", "STATE", "HOLDER", "SM%", "MEM MiB", "IDLE s",
        ],
        [&r0, SHARED, "Healthy", "ml/a/main", "30", "1024", "0"],
        [&r1, SHARED, "Healthy", "ml/b/main", "10", "512", "12"],
        [&r2, SHARED, "Healthy", "-", "-", "-", "-"],
        [&r3, SHARED, "draining", "-", "-", "-", "-"],
    ]));
    want.push_str(&format!("\nGPU 1  -  {GPU1}  util -  memory -/- MiB\n"));
    want.push_str(&format!("\nfree: {SHARED} 1\n"));
    assert_eq!(render(&view), want);

    // Not ready, no checkpoint, a retained device.
    let mut view = two_pods();
    view.ready = false;
    view.ready_reason = Some("no policy applied yet".into());
    view.checkpoint_error = Some("missing".into());
    view.gpus[0].devices[2].retained = true;
    view.free.clear();
    let text = render(&view);
    assert!(text.starts_with(
        "slicelet  policy generation 3  not ready: no policy applied yet  (no per-container figures: missing)\n"
    ), "{text}");
    assert!(text.contains(" Healthy (retained) "), "{text}");
    assert!(text.ends_with("\nfree: -\n"), "{text}");
}

#[test]
fn addresses() {
    for (address, want) in [
        ("http://127.0.0.1:8080", Ok("http://127.0.0.1:8080/status")),
        ("http://127.0.0.1:8080/", Ok("http://127.0.0.1:8080/status")),
        (" http://[::1]:9/ ", Ok("http://[::1]:9/status")),
        ("https://127.0.0.1:8080", Err("only http://")),
        ("127.0.0.1:8080", Err("not an http:// URL")),
        ("http://", Err("`http://` is not")),
        ("http://a b", Err("not an http:// URL")),
    ] {
        let got = status_url(address)
            .map(|u| u.to_string())
            .map_err(|e| e.to_string());
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{address}"),
            (Err(got), Err(want)) => assert!(got.contains(want), "{address}: {got}"),
            (got, want) => panic!("{address}: {got:?}, want {want:?}"),
        }
    }
}

/// A server that answers every connection with `response` (after reading the request), or
/// with nothing at all (holding the connection) when `None`.
async fn raw_server(response: Option<Vec<u8>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut conn, _)) = listener.accept().await {
            let Some(response) = response.clone() else {
                held.push(conn);
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(&response).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

fn http(code: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[tokio::test]
async fn once_against_the_real_status_endpoint() {
    use crate::usage::attribute::tests::{plan, two_pods};
    let (samples, in_use) = two_pods();
    let plan = plan();
    let metrics = Arc::new(crate::status::Metrics::new());
    let mut usage = crate::usage::report::Usage::new();
    usage.allocation(&plan, &in_use, metrics.usage());
    usage.sampled(&samples, &plan, &in_use, metrics.usage());
    // No supervisor answers view requests here: the set view is served.
    metrics.set_view(Arc::new(usage.view(&plan, &in_use)));
    let status = crate::status::Status {
        generation: 2,
        ..crate::status::Status::default()
    };
    let (_tx, rx) = watch::channel(status.clone());
    let stop = CancellationToken::new();
    let (addr, task) = crate::status::serve(
        "127.0.0.1:0".parse().unwrap(),
        rx,
        Arc::clone(&metrics),
        stop.clone(),
    )
    .await
    .unwrap();
    let text = tokio::time::timeout(Duration::from_secs(30), once(&format!("http://{addr}")))
        .await
        .expect("top --once did not return")
        .unwrap();
    // What was served is the published view with the node-level fields of the status.
    let mut want = (*metrics.view()).clone();
    want.generation = 2;
    want.ready_reason = status.ready().err().map(|e| e.to_string());
    want.ready = false;
    assert_eq!(text, render(&want));
    // Both pods under GPU 0 with their own SM use, before GPU 1's line.
    let gpu1 = text.find("\nGPU 1 ").unwrap();
    let a = text
        .find(&format!(
            "{GPU0}::0  nvidia.com/gpu-shared  Healthy  ml/a/main   30"
        ))
        .unwrap();
    let b = text
        .find(&format!(
            "{GPU0}::1  nvidia.com/gpu-shared  Healthy  ml/b/main   10"
        ))
        .unwrap();
    assert!(a < gpu1 && b < gpu1, "{text}");
    assert!(
        text.starts_with("slicelet  policy generation 2  not ready: no device is Healthy"),
        "{text}"
    );
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn clear_errors_naming_the_url() {
    // Nothing listens: the port of a listener just closed.
    let closed = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let too_large = raw_server(Some(http("200 OK", &vec![b' '; MAX_BODY_BYTES + 1]))).await;
    let not_json = raw_server(Some(http("200 OK", b"<html>"))).await;
    let not_found = raw_server(Some(http("404 Not Found", b"no"))).await;
    let fits = raw_server(Some(http(
        "200 OK",
        &serde_json::to_vec(&NodeView::default()).unwrap(),
    )))
    .await;
    for (addr, want) in [
        (
            closed,
            "no answer (is `slicelet run` serving its status endpoint there?)",
        ),
        (too_large, "the answer is larger than 67108864 bytes"),
        (not_json, "not slicelet's /status JSON"),
        (not_found, "HTTP 404"),
    ] {
        let url = format!("http://{addr}");
        let e = tokio::time::timeout(Duration::from_secs(30), fetch(&url))
            .await
            .expect("fetch did not return")
            .unwrap_err();
        let text = crate::errors::chain(&e);
        assert!(text.contains(&format!("GET {url}/status: ")), "{text}");
        assert!(text.contains(want), "{want} in {text}");
    }
    let view = fetch(&format!("http://{fits}")).await.unwrap();
    assert_eq!(view, NodeView::default());
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out() {
    let silent = raw_server(None).await;
    let url = format!("http://{silent}");
    // Paused time: the 2 s pass as soon as everything waits; the outer guard only fires when
    // fetch has no timeout of its own.
    let e = tokio::time::timeout(TIMEOUT * 10, fetch(&url))
        .await
        .expect("fetch has no timeout")
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("GET {url}/status: no answer within 2 s")
    );
}

/// Text from the server never reaches the terminal as control sequences: an OSC 52 clipboard
/// write in a holder's name and an ESC in the `/readyz` reason are printed escaped.
#[test]
fn control_characters_from_the_server_are_escaped() {
    let mut view = two_pods();
    view.ready = false;
    view.ready_reason = Some("policy rejected: bad \u{1b}[2J value".into());
    view.gpus[0].devices[0].holder = Some(HolderView {
        namespace: "ml\u{1b}]52;c;SGVsbG8=\u{7}".into(),
        pod: "a\u{9b}31m".into(),
        container: "main".into(),
    });
    let out = render(&view);
    assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    assert!(out.contains("ml\\u{1b}]52;c;SGVsbG8=\\u{7}"), "{out}");
    assert!(out.contains("bad \\u{1b}[2J value"), "{out}");
}

/// The body cap is sized from what a valid node produces: the `/status` of a node with
/// 16,000 held devices fits (it is over the old 4 MiB cap).
#[test]
fn a_sixteen_thousand_device_node_fits_the_cap() {
    let mut view = two_pods();
    let long = "x".repeat(63);
    view.gpus[0].devices = (0..16_000)
        .map(|n| {
            let mut d = device(
                &format!("{GPU0}::{n}"),
                Some((&long, &long, &long)),
                Some((100, 81_559, 1.5)),
            );
            d.resource = format!("example.com/{long}");
            d
        })
        .collect();
    let body = serde_json::to_vec(&view).unwrap();
    assert!(body.len() > 4 * 1024 * 1024, "{}", body.len());
    assert!(body.len() < MAX_BODY_BYTES, "{}", body.len());
}

/// A GPU where a holder has a memory limit gets the LIMIT MiB column, each cell saying
/// whether the limit is read back; other GPUs' tables keep their columns.
#[test]
fn memory_limits_get_their_column_where_a_holder_has_one() {
    let mut view = two_pods();
    let devices = &mut view.gpus[0].devices;
    devices[0].memory_limit_bytes = Some(20480 * MIB);
    devices[0].memory_limit_enforced = Some(true);
    devices[1].memory_limit_bytes = Some(20480 * MIB);
    devices[1].memory_limit_enforced = Some(false);
    devices[2].memory_limit_bytes = Some(10240 * MIB);
    let cells: Vec<String> = view.gpus[0].devices.iter().map(limit_cell).collect();
    assert_eq!(
        cells,
        [
            "20480 enforced",
            "20480 NOT enforced",
            "10240 unchecked",
            "-"
        ]
    );
    let out = render(&view);
    let lines: Vec<&str> = out.lines().collect();
    let headers: Vec<&&str> = lines.iter().filter(|l| l.contains("DEVICE")).collect();
    assert_eq!(headers.len(), 1, "{out}");
    assert!(headers[0].ends_with(LIMIT_COLUMN), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ml/b/main") && l.ends_with("20480 NOT enforced")),
        "{out}"
    );
    assert!(!render(&two_pods()).contains(LIMIT_COLUMN));
}
