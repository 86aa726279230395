//! The GPU-use metric families and their label sets (dcgm-exporter's label names), written by
//! [`crate::usage::report::Usage`] and registered in (and served by)
//! [`crate::status::Metrics`].

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A resource's label (`resource="nvidia.com/gpu"`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResourceLabels {
    pub(crate) resource: String,
}

/// `slicelet_allocation_info`'s labels: one held device and its holder (dcgm-exporter's label
/// names, so dashboards join on `UUID`/`pod`/`namespace`/`container`).
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AllocationLabels {
    pub(crate) resource: String,
    pub(crate) device: String,
    pub(crate) UUID: String,
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) container: String,
}

/// A GPU's labels, as dcgm-exporter names them (`gpu` is the NVML index).
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct GpuLabels {
    pub(crate) UUID: String,
    pub(crate) gpu: String,
    pub(crate) modelName: String,
}

/// A MIG device's labels: its own UUID, its parent GPU's and its profile.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MigLabels {
    pub(crate) UUID: String,
    pub(crate) parentUUID: String,
    pub(crate) profile: String,
}

/// One container's use of one unit (`UUID`: the GPU's, or the MIG device's) through one
/// resource.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLabels {
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) container: String,
    pub(crate) UUID: String,
    pub(crate) resource: String,
}

/// A container's memory limit on one unit: [`ContainerLabels`] and `kind` (`hard` or `soft`).
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ContainerLimitLabels {
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) container: String,
    pub(crate) UUID: String,
    pub(crate) resource: String,
    pub(crate) kind: &'static str,
}

/// A GPU by UUID only.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UuidLabels {
    pub(crate) UUID: String,
}

/// The GPU-use metrics (issue 13), written by [`crate::usage::report::Usage`] only, registered
/// and served by [`crate::status::Metrics`].
///
/// Units are in the names: `_percent` 0–100, `_bytes` bytes, `_timestamp_seconds` seconds
/// since the Unix epoch (of the sample).
pub struct UsageMetrics {
    /// `slicelet_allocation_info{resource,device,UUID,pod,namespace,container} 1`.
    pub(crate) allocation: Family<AllocationLabels, Gauge>,
    /// `slicelet_gpu_utilization_percent{UUID,gpu,modelName}`.
    pub(crate) gpu_utilization: Family<GpuLabels, Gauge>,
    /// `slicelet_gpu_memory_used_bytes{UUID,gpu,modelName}`.
    pub(crate) gpu_memory_used: Family<GpuLabels, Gauge>,
    /// `slicelet_gpu_memory_total_bytes{UUID,gpu,modelName}`.
    pub(crate) gpu_memory_total: Family<GpuLabels, Gauge>,
    /// `slicelet_mig_utilization_percent{UUID,parentUUID,profile}` (GPM; absent without).
    pub(crate) mig_utilization: Family<MigLabels, Gauge>,
    /// `slicelet_mig_memory_used_bytes{UUID,parentUUID,profile}`.
    pub(crate) mig_memory_used: Family<MigLabels, Gauge>,
    /// `slicelet_mig_memory_total_bytes{UUID,parentUUID,profile}`.
    pub(crate) mig_memory_total: Family<MigLabels, Gauge>,
    /// `slicelet_container_gpu_sm_util_percent{pod,namespace,container,UUID,resource}`.
    pub(crate) container_sm: Family<ContainerLabels, Gauge>,
    /// `slicelet_container_gpu_memory_used_bytes{…}`.
    pub(crate) container_memory: Family<ContainerLabels, Gauge>,
    /// `slicelet_container_gpu_last_active_timestamp_seconds{…}`.
    pub(crate) container_last_active: Family<ContainerLabels, Gauge<f64, AtomicU64>>,
    /// `slicelet_container_gpu_memory_limit_bytes{…,kind="hard"|"soft"}`: the limit the
    /// policy gives the container on the unit.
    pub(crate) container_limit: Family<ContainerLimitLabels, Gauge>,
    /// `slicelet_container_gpu_memory_limit_enforced{…}`: 1 when NVML reads the limit back for
    /// the container's cgroup, 0 when not (or unenforced by the plan); absent until the
    /// container has a process on the GPU.
    pub(crate) container_limit_enforced: Family<ContainerLabels, Gauge>,
    /// `slicelet_gpu_memory_limits_supported{UUID,gpu,modelName}`: 1 when the GPU takes
    /// per-cgroup memory limits.
    pub(crate) gpu_limits_supported: Family<GpuLabels, Gauge>,
    /// `slicelet_gpu_memory_limits_not_cleared_total`: removed cgroups whose limit the driver
    /// still reported.
    pub(crate) limits_not_cleared: Counter,
    /// `slicelet_resource_allocated_devices{resource}`.
    pub(crate) allocated: Family<ResourceLabels, Gauge>,
    /// `slicelet_resource_free_devices{resource}`.
    pub(crate) free: Family<ResourceLabels, Gauge>,
    /// `slicelet_draining_devices{resource}`.
    pub(crate) draining: Family<ResourceLabels, Gauge>,
    /// `slicelet_unattributed_processes{UUID}`.
    pub(crate) unattributed: Family<UuidLabels, Gauge>,
    /// `slicelet_samples_total`.
    pub(crate) samples: Counter,
    /// `slicelet_sample_failures_total`.
    pub(crate) sample_failures: Counter,
    /// `slicelet_attribution_up`: 1 while GPU use is attributed to containers, 0 while the
    /// kubelet's device checkpoint cannot be used (the per-container series are gone then:
    /// unknown, not idle).
    pub(crate) attribution_up: Gauge,
}

impl UsageMetrics {
    /// Registers every GPU-use family in `registry` (names as [`UsageMetrics`] lists them).
    pub(crate) fn register(registry: &mut Registry) -> UsageMetrics {
        fn family<L, M>(registry: &mut Registry, name: &str, help: &str) -> Family<L, M>
        where
            L: Clone
                + std::hash::Hash
                + Eq
                + EncodeLabelSet
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
            M: Default
                + prometheus_client::metrics::TypedMetric
                + prometheus_client::encoding::EncodeMetric
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
        {
            let f = Family::<L, M>::default();
            registry.register(name, help, f.clone());
            f
        }
        let samples = Counter::default();
        registry.register("samples", "GPU use samples taken", samples.clone());
        let sample_failures = Counter::default();
        registry.register(
            "sample_failures",
            "GPU use samples that failed (NVML errors)",
            sample_failures.clone(),
        );
        let attribution_up = Gauge::default();
        registry.register(
            "attribution_up",
            "1 while GPU use is attributed to containers; 0 while the kubelet's device checkpoint cannot be used and the per-container series are withheld",
            attribution_up.clone(),
        );
        let limits_not_cleared = Counter::default();
        registry.register(
            "gpu_memory_limits_not_cleared",
            "Removed container cgroups whose GPU memory limit the driver still reported",
            limits_not_cleared.clone(),
        );
        UsageMetrics {
            attribution_up,
            limits_not_cleared,
            container_limit: family(registry, "container_gpu_memory_limit_bytes", "GPU memory limit the policy gives a container on a GPU (kind hard or soft), bytes"),
            container_limit_enforced: family(registry, "container_gpu_memory_limit_enforced", "1 when NVML reads a container's GPU memory limit back for its cgroup, 0 when it does not or the limit is not enforced there; absent until the container runs a process on the GPU"),
            gpu_limits_supported: family(registry, "gpu_memory_limits_supported", "1 when the GPU takes per-cgroup memory limits (driver R615 or later, cgroup v2)"),
            allocation: family(registry, "allocation_info", "A device held by a container (value 1)"),
            gpu_utilization: family(registry, "gpu_utilization_percent", "GPU utilisation, percent (0-100)"),
            gpu_memory_used: family(registry, "gpu_memory_used_bytes", "GPU framebuffer memory in use, bytes"),
            gpu_memory_total: family(registry, "gpu_memory_total_bytes", "GPU framebuffer memory in all, bytes"),
            mig_utilization: family(registry, "mig_utilization_percent", "MIG device SM use from GPM samples, percent (only where GPM is supported)"),
            mig_memory_used: family(registry, "mig_memory_used_bytes", "MIG device memory in use, bytes"),
            mig_memory_total: family(registry, "mig_memory_total_bytes", "MIG device memory in all, bytes"),
            container_sm: family(registry, "container_gpu_sm_util_percent", "SM use of a container's processes on a GPU (or its MIG device's GPM SM use), percent"),
            container_memory: family(registry, "container_gpu_memory_used_bytes", "GPU memory of a container's processes on a GPU (or its MIG device's), bytes"),
            container_last_active: family(registry, "container_gpu_last_active_timestamp_seconds", "Unix time of the last sample with SM use > 0 (first seen, until then): time() - x is seconds idle"),
            allocated: family(registry, "resource_allocated_devices", "Devices of a resource held by containers"),
            free: family(registry, "resource_free_devices", "Devices of a resource that are Healthy and not held"),
            draining: family(registry, "draining_devices", "Devices of a resource advertised Unhealthy while a re-purposed GPU's old devices are held"),
            unattributed: family(registry, "unattributed_processes", "Processes on a GPU that could not be given to a container"),
            samples,
            sample_failures,
        }
    }
}
