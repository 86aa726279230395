//! Unit tests of the status endpoint: addresses, readiness, the metrics text, the `/status`
//! view timeout.

use super::*;
use crate::device_health::Health;
use crate::usage::view::NodeView;

#[test]
fn addresses() {
    assert_eq!(parse_address("").unwrap(), None);
    assert_eq!(
        // Regression: `:8080` bound IPv4 only, so probes failed on IPv6-only clusters.
        parse_address(":8080").unwrap(),
        Some("[::]:8080".parse().unwrap())
    );
    assert_eq!(
        parse_address("127.0.0.1:9").unwrap(),
        Some("127.0.0.1:9".parse().unwrap())
    );
    assert!(parse_address("8080").is_err());
}

#[test]
fn readiness() {
    let mut s = Status::default();
    assert!(s.ready().unwrap_err().to_string().contains("no policy"));
    s.generation = 1;
    s.resources.insert("nvidia.com/a".into());
    assert!(s.ready().unwrap_err().to_string().contains("nvidia.com/a"));
    s.registered.insert("nvidia.com/a".into());
    // Regression: with every GPU lost at start, nothing usable was advertised but /readyz
    // said ready.
    s.devices = 8;
    assert!(s
        .ready()
        .unwrap_err()
        .to_string()
        .contains("no device is Healthy (8 advertised)"));
    s.healthy_devices = 1;
    assert!(s.ready().is_ok());
    // Regression: registered, but the kubelet never opened ListAndWatch: was ready.
    s.stalled.insert("nvidia.com/a".into());
    assert!(s
        .ready()
        .unwrap_err()
        .to_string()
        .contains("opened no ListAndWatch stream for: nvidia.com/a"));
    s.stalled.clear();
    assert!(s.ready().is_ok());
    // A feature file that cannot be written leaves stale node labels: not ready.
    s.nfd_error = Some("writing /x/.slicelet.tmp: read-only file system".into());
    assert!(s
        .ready()
        .unwrap_err()
        .to_string()
        .contains("node labels may be stale: writing /x/.slicelet.tmp"));
    s.nfd_error = None;
    assert!(s.ready().is_ok());
    s.policy_error = Some("x: bad".into());
    assert!(s.ready().unwrap_err().to_string().contains("x: bad"));
    // Regression: running without GPUs (failOnInitError: false) reported ready.
    s.policy_error = None;
    s.discovery_error = Some("initialising NVML: driver not loaded".into());
    assert!(s
        .ready()
        .unwrap_err()
        .to_string()
        .contains("driver not loaded"));
}

#[test]
fn metrics_text() {
    let m = Metrics::new();
    m.registered("nvidia.com/a");
    m.xid("GPU-1", 79);
    m.transition("GPU-1", Health::Unhealthy);
    m.policy_applied(3);
    let text = m.encode();
    for want in [
        "slicelet_registrations_total{resource=\"nvidia.com/a\"} 1",
        "slicelet_xid_events_total{gpu=\"GPU-1\",xid=\"79\"} 1",
        "slicelet_health_transitions_total{gpu=\"GPU-1\",to=\"Unhealthy\"} 1",
        "slicelet_policy_generation 3",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
}

/// `slicelet_mig_config_state{state}`: 1 for the current state only; no layout, all 0.
#[test]
fn the_mig_layout_state_is_one_gauge_per_state() {
    let m = Metrics::new();
    m.set_mig_config_state(Some("pending"));
    m.set_mig_config_state(Some("failed"));
    let text = m.encode();
    for want in [
        "slicelet_mig_config_state{state=\"failed\"} 1",
        "slicelet_mig_config_state{state=\"pending\"} 0",
        "slicelet_mig_config_state{state=\"success\"} 0",
    ] {
        assert!(text.contains(want), "{want} in\n{text}");
    }
    m.set_mig_config_state(None);
    assert!(!m.encode().contains("_state{state=\"failed\"} 1"));
}

/// A supervisor whose view queue is full (it is busy) costs `/status` VIEW_TIMEOUT at
/// most, and the view set last is served (the send used to wait without bound).
#[tokio::test(start_paused = true)]
async fn a_busy_supervisor_costs_status_the_view_timeout_at_most() {
    let metrics = Metrics::new();
    let mut set = NodeView::default();
    set.free.insert("nvidia.com/gpu".into(), 3);
    metrics.set_view(Arc::new(set.clone()));
    let (tx, _rx) = tokio::sync::mpsc::channel::<ViewRequest>(1);
    let (queued, _) = tokio::sync::oneshot::channel();
    tx.try_send(queued).unwrap();
    metrics.answer_views(tx);
    let started = tokio::time::Instant::now();
    let view = tokio::time::timeout(VIEW_TIMEOUT * 2, metrics.current_view())
        .await
        .expect("/status waited past its view timeout on a full queue");
    assert_eq!(view, set);
    assert_eq!(started.elapsed(), VIEW_TIMEOUT);
}

#[test]
fn a_failing_rediscovery_is_a_note_under_readyz_not_a_failure() {
    let mut s = Status {
        generation: 1,
        devices: 2,
        healthy_devices: 2,
        ..Status::default()
    };
    assert!(s.ready().is_ok());
    s.rediscovery_error = Some("counting GPUs: driver not loaded".into());
    assert!(s.ready().is_ok(), "the last inventory keeps serving");
    assert_eq!(
        s.unhealthy_lines(),
        "GPU re-discovery failing: counting GPUs: driver not loaded; the last inventory keeps serving\n"
    );
}
