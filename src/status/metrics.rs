//! The metrics registry: slicelet's Prometheus families (devices, registrations, policy,
//! DRA, Xid events, health transitions, GPU use) and the latest `/status` view, encoded for
//! `/metrics` and served by `/status`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::device_health::Health;
use crate::plan::Plan;
use crate::usage::metrics::{ResourceLabels, UsageMetrics};
use crate::usage::view::NodeView;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    resource: String,
    health: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    gpu: String,
    xid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    gpu: String,
    to: String,
}

/// A `/status` request to the supervisor: it sends the view back on this.
pub type ViewRequest = tokio::sync::oneshot::Sender<NodeView>;

/// Longest `/status` waits for the supervisor's view before serving the last one set.
pub const VIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// slicelet's Prometheus metrics, and the latest `/status` view.
pub struct Metrics {
    registry: Registry,
    devices: Family<DeviceLabels, Gauge>,
    registrations: Family<ResourceLabels, Counter>,
    policy_generation: Gauge,
    /// `slicelet_dra_up`: 1 while `--dra` serves, 0 while it is down (and retried).
    dra_up: Gauge,
    /// `slicelet_dra_device_taints`: 1 while DRA publishes Unhealthy devices with device
    /// taints, 0 when it withdraws them (the API server has no device taints) or DRA is off.
    dra_device_taints: Gauge,
    /// `slicelet_dra_slices_republished_total`: times DRA found this node's ResourceSlices
    /// changed or deleted by somebody else and published them again.
    dra_slices_republished: Counter,
    policy_reload_failures: Counter,
    xid_events: Family<XidLabels, Counter>,
    health_transitions: Family<TransitionLabels, Counter>,
    /// `slicelet_mig_config_state{state}`: 1 for the MIG layout's state (`pending`,
    /// `success`, `failed`), 0 for the others; all 0 when no layout is asked for.
    mig_config_state: Family<StateLabels, Gauge>,
    pub(crate) usage: UsageMetrics,
    /// The latest `/status` body (without the node-level fields, filled per request). A
    /// `std` lock held only to clone or swap the `Arc`, never across `.await`.
    view: std::sync::RwLock<Arc<NodeView>>,
    /// Where `/status` asks the supervisor for the view, built per request from its state
    /// (so no copy of it is kept between requests); `None`: the view set last is served.
    views: std::sync::RwLock<Option<tokio::sync::mpsc::Sender<ViewRequest>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The GPU-use families, for [`crate::usage::report::Usage`] to write.
    pub fn usage(&self) -> &UsageMetrics {
        &self.usage
    }

    /// A registry with every slicelet metric, prefixed `slicelet_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("slicelet");
        let devices = Family::<DeviceLabels, Gauge>::default();
        registry.register(
            "devices",
            "Devices advertised, by resource and health",
            devices.clone(),
        );
        let registrations = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "registrations",
            "Successful registrations with the kubelet, by resource",
            registrations.clone(),
        );
        let policy_generation = Gauge::default();
        registry.register(
            "policy_generation",
            "Generation of the applied policy",
            policy_generation.clone(),
        );
        let dra_up = Gauge::default();
        registry.register(
            "dra_up",
            "1 while the DRA kubelet plugin serves (with --dra), 0 while it is down and retried",
            dra_up.clone(),
        );
        let dra_device_taints = Gauge::default();
        registry.register(
            "dra_device_taints",
            "1 while DRA publishes Unhealthy devices with device taints, 0 when it withdraws them (the API server has no device taints) or DRA is off",
            dra_device_taints.clone(),
        );
        let dra_slices_republished = Counter::default();
        registry.register(
            "dra_slices_republished",
            "Times DRA found this node's ResourceSlices changed or deleted by somebody else (a starting kubelet deletes them) and published them again",
            dra_slices_republished.clone(),
        );
        let policy_reload_failures = Counter::default();
        registry.register(
            "policy_reload_failures",
            "Policy reads that were rejected",
            policy_reload_failures.clone(),
        );
        let xid_events = Family::<XidLabels, Counter>::default();
        registry.register(
            "xid_events",
            "NVML Xid events, by GPU UUID and Xid",
            xid_events.clone(),
        );
        let health_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "health_transitions",
            "Device health transitions, by UUID and new state",
            health_transitions.clone(),
        );
        let mig_config_state = Family::<StateLabels, Gauge>::default();
        registry.register(
            "mig_config_state",
            "1 for the state of the node's MIG layout (nvidia.com/mig.config.state: pending, success, failed), 0 for the others",
            mig_config_state.clone(),
        );
        let usage = UsageMetrics::register(&mut registry);
        Metrics {
            mig_config_state,
            registry,
            devices,
            registrations,
            policy_generation,
            dra_up,
            dra_device_taints,
            dra_slices_republished,
            policy_reload_failures,
            xid_events,
            health_transitions,
            usage,
            view: std::sync::RwLock::new(Arc::new(NodeView::default())),
            views: std::sync::RwLock::new(None),
        }
    }

    /// Counts a GPU use sample that could not be taken (an NVML error on the hardware actor);
    /// `slicelet_sample_failures_total`. Successful samples are counted by
    /// [`crate::usage::report::Usage::sampled`].
    pub fn sample_failed(&self) {
        self.usage.sample_failures.inc();
    }

    /// Replaces what `/status` serves ([`crate::usage::report::Usage`] does it after each
    /// sample and each allocation change).
    pub fn set_view(&self, view: Arc<NodeView>) {
        // A poisoned lock only means a panic elsewhere while swapping an Arc: the value is
        // whole either way.
        *self
            .view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
    }

    /// Makes `/status` ask `requests` for the view: the supervisor answers each request with
    /// one built from its state at that moment.
    pub fn answer_views(&self, requests: tokio::sync::mpsc::Sender<ViewRequest>) {
        *self
            .views
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(requests);
    }

    /// The view `/status` serves: the supervisor's answer (within [`VIEW_TIMEOUT`]), else the
    /// view set last ([`Metrics::set_view`]).
    pub async fn current_view(&self) -> NodeView {
        let requests = self
            .views
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(tx) = requests {
            // The whole exchange is bounded: a supervisor that is busy (its queue full) or
            // slow to answer costs `/status` at most VIEW_TIMEOUT.
            let ask = async {
                let (answer, view) = tokio::sync::oneshot::channel();
                tx.send(answer).await.ok()?;
                view.await.ok()
            };
            if let Ok(Some(v)) = tokio::time::timeout(VIEW_TIMEOUT, ask).await {
                return v;
            }
        }
        (*self.view()).clone()
    }

    /// What `/status` serves now (node-level `generation`/`ready` are filled per request).
    pub fn view(&self) -> Arc<NodeView> {
        Arc::clone(
            &self
                .view
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Sets the device gauges from a plan.
    pub fn set_plan(&self, plan: &Plan) {
        self.devices.clear();
        for (name, r) in &plan.resources {
            let healthy = r.devices.iter().filter(|d| d.health.is_healthy()).count() as i64;
            let total = r.devices.len() as i64;
            for (health, n) in [
                (Health::Healthy.as_str(), healthy),
                (Health::Unhealthy.as_str(), total - healthy),
            ] {
                self.devices
                    .get_or_create(&DeviceLabels {
                        resource: name.clone(),
                        health: health.to_string(),
                    })
                    .set(n);
            }
        }
    }

    /// Counts a registration.
    pub fn registered(&self, resource: &str) {
        self.registrations
            .get_or_create(&ResourceLabels {
                resource: resource.to_string(),
            })
            .inc();
    }

    /// Records an applied policy generation.
    pub fn policy_applied(&self, generation: u64) {
        self.policy_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    /// Counts a rejected policy read.
    pub fn policy_rejected(&self) {
        self.policy_reload_failures.inc();
    }

    /// Sets `slicelet_dra_device_taints` (1: Unhealthy devices are tainted, 0: withdrawn).
    pub fn set_dra_device_taints(&self, on: bool) {
        self.dra_device_taints.set(i64::from(on));
    }

    /// Raises `slicelet_dra_slices_republished_total` to `total` (DRA's own count, which only
    /// grows); a lower `total` changes nothing.
    pub fn set_dra_slices_republished(&self, total: u64) {
        let now = self.dra_slices_republished.get();
        if total > now {
            self.dra_slices_republished.inc_by(total - now);
        }
    }

    /// Sets `slicelet_mig_config_state`: 1 for `state`, 0 for the other states (`None`: no
    /// layout asked for, every state 0).
    pub fn set_mig_config_state(&self, state: Option<&str>) {
        for s in ["pending", "success", "failed"] {
            self.mig_config_state
                .get_or_create(&StateLabels {
                    state: s.to_string(),
                })
                .set(i64::from(state == Some(s)));
        }
    }

    /// Sets `slicelet_dra_up` (1 serving, 0 down).
    pub fn set_dra_up(&self, up: bool) {
        self.dra_up.set(i64::from(up));
    }

    /// Counts an Xid event.
    pub fn xid(&self, gpu: &str, xid: u64) {
        self.xid_events
            .get_or_create(&XidLabels {
                gpu: gpu.to_string(),
                xid: xid.to_string(),
            })
            .inc();
    }

    /// Counts a health transition.
    pub fn transition(&self, gpu: &str, to: Health) {
        let to = to.as_str();
        self.health_transitions
            .get_or_create(&TransitionLabels {
                gpu: gpu.to_string(),
                to: to.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
