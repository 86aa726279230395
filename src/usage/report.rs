//! [`Usage`]: the latest attributed figures, each container's last active time, and what they
//! put into `/metrics` and `/status`. Owned by the supervisor's shell; every method is pure
//! bookkeeping plus atomic gauge writes (no I/O, no `.await`, no blocking).
//!
//! Stale series: every family is updated by [`Family::remove`] of the label sets written last
//! time and not this time (the set of label sets written is kept here), never by
//! clear-and-refill, so a scrape that runs while a sample is being written never sees a family
//! half empty, and a container or GPU that is gone loses its series at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;

use prometheus_client::metrics::family::Family;

use crate::in_use::{Holder, InUse};
use crate::plan::dra_names::with_claims;
use crate::plan::{physical_uuid, Plan, VirtualDevice};
use crate::usage::attribute::{attribute, physical, ContainerFigures, Figures, GpuFigures};
use crate::usage::metrics::{
    AllocationLabels, ContainerLabels, ContainerLimitLabels, GpuLabels, MigLabels, ResourceLabels,
    UsageMetrics, UuidLabels,
};
use crate::usage::view::{DeviceView, GpuView, HolderView, NodeView};
use crate::usage::Samples;

/// A sample's containers' figures by (unit UUID, resource, holder).
type FiguresOf<'a> = HashMap<(&'a str, &'a str, &'a Holder), &'a ContainerFigures>;

/// Who and which unit a last-active time is for: (holder, unit UUID).
type ActiveKey = (Holder, String);

/// The label sets last written, per family group.
#[derive(Debug, Default)]
struct Written {
    gpu_utilization: HashSet<GpuLabels>,
    gpu_memory_used: HashSet<GpuLabels>,
    gpu_memory_total: HashSet<GpuLabels>,
    mig_utilization: HashSet<MigLabels>,
    mig_memory_used: HashSet<MigLabels>,
    mig_memory_total: HashSet<MigLabels>,
    /// The three container families are written together.
    containers: HashSet<ContainerLabels>,
    container_limits: HashSet<ContainerLimitLabels>,
    container_enforced: HashSet<ContainerLabels>,
    gpu_limits_supported: HashSet<GpuLabels>,
    unattributed: HashSet<UuidLabels>,
    allocation: HashSet<AllocationLabels>,
    /// The three per-resource families are written together.
    resources: HashSet<ResourceLabels>,
}

/// GPU use as the supervisor knows it: the latest [`Figures`] and, per (container, unit),
/// the sample time of its last sample with SM use > 0.
#[derive(Debug, Default)]
pub struct Usage {
    figures: Option<Figures>,
    /// Seconds since the Unix epoch (of the sample), per (holder, unit UUID). Starts at the
    /// first sample that shows the container, so "idle since start" counts from there;
    /// forgotten once the container is gone from a sample or from what is in use.
    last_active: HashMap<ActiveKey, f64>,
    written: Written,
}

/// Gauges are i64; a byte count past `i64::MAX` (impossible on real GPUs) saturates.
fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Removes the series of `family` written last time but not in `now`, and remembers `now`.
fn sync<L, M>(family: &Family<L, M>, written: &mut HashSet<L>, now: HashSet<L>)
where
    L: Clone + Hash + Eq,
{
    for gone in written.difference(&now) {
        family.remove(gone);
    }
    *written = now;
}

fn limit_labels(l: &ContainerLabels, kind: &'static str) -> ContainerLimitLabels {
    ContainerLimitLabels {
        pod: l.pod.clone(),
        namespace: l.namespace.clone(),
        container: l.container.clone(),
        UUID: l.UUID.clone(),
        resource: l.resource.clone(),
        kind,
    }
}

fn container_labels(c: &ContainerFigures) -> ContainerLabels {
    ContainerLabels {
        pod: c.holder.pod.clone(),
        namespace: c.holder.namespace.clone(),
        container: c.holder.container.clone(),
        UUID: c.unit_uuid.clone(),
        resource: c.resource.clone(),
    }
}

/// The label sets one sample writes, per family group (as in [`Written`]).
#[derive(Debug, Default)]
struct Series {
    gpu_utilization: HashSet<GpuLabels>,
    gpu_memory_used: HashSet<GpuLabels>,
    gpu_memory_total: HashSet<GpuLabels>,
    mig_utilization: HashSet<MigLabels>,
    mig_memory_used: HashSet<MigLabels>,
    mig_memory_total: HashSet<MigLabels>,
    containers: HashSet<ContainerLabels>,
    container_limits: HashSet<ContainerLimitLabels>,
    container_enforced: HashSet<ContainerLabels>,
    gpu_limits_supported: HashSet<GpuLabels>,
    unattributed: HashSet<UuidLabels>,
}

/// Writes GPU `g`'s gauges (limits supported, utilization, memory, its MIG devices', its
/// unattributed processes), adding their label sets to `series`.
fn write_gpu(m: &UsageMetrics, g: &GpuFigures, series: &mut Series) {
    let labels = GpuLabels {
        UUID: g.uuid.clone(),
        gpu: g.index.to_string(),
        modelName: g.model.clone(),
    };
    if let Some(s) = g.memory_limits_supported {
        m.gpu_limits_supported
            .get_or_create(&labels)
            .set(i64::from(s));
        series.gpu_limits_supported.insert(labels.clone());
    }
    for (value, family, set) in [
        (
            g.utilization_percent.map(u64::from),
            &m.gpu_utilization,
            &mut series.gpu_utilization,
        ),
        (
            g.memory_used_bytes,
            &m.gpu_memory_used,
            &mut series.gpu_memory_used,
        ),
        (
            g.memory_total_bytes,
            &m.gpu_memory_total,
            &mut series.gpu_memory_total,
        ),
    ] {
        if let Some(v) = value {
            family.get_or_create(&labels).set(gauge_value(v));
            set.insert(labels.clone());
        }
    }
    for mig in &g.mig {
        let labels = MigLabels {
            UUID: mig.uuid.clone(),
            parentUUID: g.uuid.clone(),
            profile: mig.profile.clone().unwrap_or_default(),
        };
        for (value, family, set) in [
            (
                mig.utilization_percent.map(u64::from),
                &m.mig_utilization,
                &mut series.mig_utilization,
            ),
            (
                mig.memory_used_bytes,
                &m.mig_memory_used,
                &mut series.mig_memory_used,
            ),
            (
                mig.memory_total_bytes,
                &m.mig_memory_total,
                &mut series.mig_memory_total,
            ),
        ] {
            if let Some(v) = value {
                family.get_or_create(&labels).set(gauge_value(v));
                set.insert(labels.clone());
            }
        }
    }
    let uuid = UuidLabels {
        UUID: g.uuid.clone(),
    };
    m.unattributed
        .get_or_create(&uuid)
        .set(i64::from(g.unattributed_processes));
    series.unattributed.insert(uuid);
}

/// Writes `slicelet_allocation_info` (one series per held device and holder); returns those
/// label sets and the container label sets of every holder on its unit.
fn write_allocation_info(
    m: &UsageMetrics,
    plan: &Plan,
    in_use: &InUse,
) -> (HashSet<AllocationLabels>, HashSet<ContainerLabels>) {
    let mut allocation = HashSet::new();
    let mut live: HashSet<ContainerLabels> = HashSet::new();
    for (resource, id, holders) in in_use.iter() {
        let device = plan.resources.get(resource).and_then(|r| r.device(id));
        let uuid = device.map_or_else(|| physical_uuid(id), |d| d.gpu_uuid.as_str());
        for h in holders {
            let labels = AllocationLabels {
                resource: resource.to_string(),
                device: id.to_string(),
                UUID: uuid.to_string(),
                pod: h.pod.clone(),
                namespace: h.namespace.clone(),
                container: h.container.clone(),
            };
            m.allocation.get_or_create(&labels).set(1);
            allocation.insert(labels);
            live.insert(ContainerLabels {
                pod: h.pod.clone(),
                namespace: h.namespace.clone(),
                container: h.container.clone(),
                UUID: uuid.to_string(),
                resource: resource.to_string(),
            });
        }
    }
    (allocation, live)
}

/// Writes the held, free (Healthy and not held) and draining device counts of every resource
/// the plan has or something holds; returns their label sets.
fn write_resource_counts(m: &UsageMetrics, plan: &Plan, in_use: &InUse) -> HashSet<ResourceLabels> {
    let mut resources = HashSet::new();
    let names: std::collections::BTreeSet<&str> = plan
        .resources
        .keys()
        .map(String::as_str)
        .chain(in_use.devices.keys().map(String::as_str))
        .collect();
    for name in names {
        let held = in_use.devices.get(name).map_or(0, BTreeMap::len);
        let free = plan.resources.get(name).map_or(0, |r| {
            r.devices
                .iter()
                .filter(|d| d.health.is_healthy() && !in_use.is_held(name, &d.id))
                .count()
        });
        let draining = plan.drain.draining.get(name).map_or(0, BTreeMap::len);
        let labels = ResourceLabels {
            resource: name.to_string(),
        };
        m.allocated.get_or_create(&labels).set(held as i64);
        m.free.get_or_create(&labels).set(free as i64);
        m.draining.get_or_create(&labels).set(draining as i64);
        resources.insert(labels);
    }
    resources
}

impl Usage {
    /// Nothing sampled, nothing written.
    pub fn new() -> Usage {
        Usage::default()
    }

    /// The latest attributed figures, once a sample was taken.
    pub fn figures(&self) -> Option<&Figures> {
        self.figures.as_ref()
    }

    /// The last active time (seconds since the Unix epoch) of `holder` on unit `unit_uuid`
    /// (a GPU or MIG UUID), while it is known.
    pub fn last_active(&self, holder: &Holder, unit_uuid: &str) -> Option<f64> {
        self.last_active
            .get(&(holder.clone(), unit_uuid.to_string()))
            .copied()
    }

    /// A new sample: attributes it ([`attribute`]), advances each container's last active
    /// time where its SM use is > 0, writes the GPU, MIG, container and unattributed gauges
    /// (removing the series of GPUs and containers no longer there), counts the sample
    /// (`slicelet_samples_total`) and publishes the new `/status` view.
    pub fn sampled(
        &mut self,
        samples: &Samples,
        plan: &Plan,
        in_use: &InUse,
        metrics: &UsageMetrics,
    ) {
        let in_use = &*with_claims(plan, in_use);
        let figures = attribute(samples, plan, in_use);
        // Milliseconds to seconds: exact for any real date (below 2^53 ms).
        let now = samples.at_unix_ms as f64 / 1000.0;
        let m = metrics;

        let mut seen = HashSet::new();
        let mut series = Series::default();
        for g in &figures.gpus {
            write_gpu(m, g, &mut series);
            for c in &g.containers {
                seen.insert(self.write_container(m, c, now, &mut series));
            }
        }
        self.last_active.retain(|k, _| seen.contains(k));
        self.sync_series(m, series);
        if figures.limits_not_cleared > 0 {
            m.limits_not_cleared
                .inc_by(u64::from(figures.limits_not_cleared));
        }
        m.samples.inc();
        m.attribution_up
            .set(i64::from(figures.checkpoint_error.is_none()));
        self.figures = Some(figures);
    }

    /// Writes container `c`'s gauges (SM use, memory, last active time advanced to `now`
    /// where its SM use is > 0, memory limits), adding their label sets to `series`; returns
    /// its last-active key.
    fn write_container(
        &mut self,
        m: &UsageMetrics,
        c: &ContainerFigures,
        now: f64,
        series: &mut Series,
    ) -> ActiveKey {
        let key = (c.holder.clone(), c.unit_uuid.clone());
        let last = self.last_active.entry(key.clone()).or_insert(now);
        if c.sm_util_percent > 0 && now > *last {
            *last = now;
        }
        let labels = container_labels(c);
        m.container_sm
            .get_or_create(&labels)
            .set(i64::from(c.sm_util_percent));
        m.container_memory
            .get_or_create(&labels)
            .set(gauge_value(c.memory_used_bytes));
        m.container_last_active.get_or_create(&labels).set(*last);
        if let Some(l) = &c.memory_limit {
            for (kind, value) in [("hard", Some(l.hard_bytes)), ("soft", l.soft_bytes)] {
                if let Some(v) = value {
                    let k = limit_labels(&labels, kind);
                    m.container_limit.get_or_create(&k).set(gauge_value(v));
                    series.container_limits.insert(k);
                }
            }
            if let Some(e) = l.enforced {
                m.container_limit_enforced
                    .get_or_create(&labels)
                    .set(i64::from(e));
                series.container_enforced.insert(labels.clone());
            }
        }
        series.containers.insert(labels);
        key
    }

    /// Removes the series written last time but not in this sample's `series`, and remembers
    /// these.
    fn sync_series(&mut self, m: &UsageMetrics, series: Series) {
        let w = &mut self.written;
        sync(
            &m.gpu_utilization,
            &mut w.gpu_utilization,
            series.gpu_utilization,
        );
        sync(
            &m.gpu_memory_used,
            &mut w.gpu_memory_used,
            series.gpu_memory_used,
        );
        sync(
            &m.gpu_memory_total,
            &mut w.gpu_memory_total,
            series.gpu_memory_total,
        );
        sync(
            &m.mig_utilization,
            &mut w.mig_utilization,
            series.mig_utilization,
        );
        sync(
            &m.mig_memory_used,
            &mut w.mig_memory_used,
            series.mig_memory_used,
        );
        sync(
            &m.mig_memory_total,
            &mut w.mig_memory_total,
            series.mig_memory_total,
        );
        sync(&m.unattributed, &mut w.unattributed, series.unattributed);
        sync(
            &m.gpu_limits_supported,
            &mut w.gpu_limits_supported,
            series.gpu_limits_supported,
        );
        sync(
            &m.container_limit,
            &mut w.container_limits,
            series.container_limits,
        );
        sync(
            &m.container_limit_enforced,
            &mut w.container_enforced,
            series.container_enforced,
        );
        self.sync_containers(m, series.containers);
    }

    fn sync_containers(&mut self, metrics: &UsageMetrics, now: HashSet<ContainerLabels>) {
        let m = metrics;
        for gone in self.written.containers.difference(&now) {
            m.container_sm.remove(gone);
            m.container_memory.remove(gone);
            m.container_last_active.remove(gone);
        }
        // A container's limit series go with its other series.
        let w = &mut self.written;
        w.container_enforced.retain(|l| {
            let keep = now.contains(l);
            if !keep {
                m.container_limit_enforced.remove(l);
            }
            keep
        });
        w.container_limits.retain(|l| {
            let base = ContainerLabels {
                pod: l.pod.clone(),
                namespace: l.namespace.clone(),
                container: l.container.clone(),
                UUID: l.UUID.clone(),
                resource: l.resource.clone(),
            };
            let keep = now.contains(&base);
            if !keep {
                m.container_limit.remove(l);
            }
            keep
        });
        self.written.containers = now;
    }

    /// A new plan or a new in-use snapshot: writes `slicelet_allocation_info` (one series per
    /// held device and holder), `slicelet_resource_allocated_devices` (held device IDs),
    /// `slicelet_resource_free_devices` (Healthy and not held) and
    /// `slicelet_draining_devices` (the plan's [`crate::plan::Drain::draining`]) per resource;
    /// removes the series (and last active times) of containers and devices that are gone; and
    /// publishes the new `/status` view.
    pub fn allocation(&mut self, plan: &Plan, in_use: &InUse, metrics: &UsageMetrics) {
        let in_use = &*with_claims(plan, in_use);
        let m = metrics;
        let (allocation, live) = write_allocation_info(m, plan, in_use);
        sync(&m.allocation, &mut self.written.allocation, allocation);
        let resources = write_resource_counts(m, plan, in_use);
        for gone in self.written.resources.difference(&resources) {
            m.allocated.remove(gone);
            m.free.remove(gone);
            m.draining.remove(gone);
        }
        self.written.resources = resources;
        self.forget_released(metrics, &live);
    }

    /// Containers no longer holding anything on a unit (not in `live`) lose their series and
    /// last active times now, not at the next sample.
    fn forget_released(&mut self, metrics: &UsageMetrics, live: &HashSet<ContainerLabels>) {
        let still: HashSet<ContainerLabels> = self
            .written
            .containers
            .intersection(live)
            .cloned()
            .collect();
        self.sync_containers(metrics, still);
        let live_units: HashSet<(&str, &str, &str, &str)> = live
            .iter()
            .map(|l| {
                (
                    l.namespace.as_str(),
                    l.pod.as_str(),
                    l.container.as_str(),
                    l.UUID.as_str(),
                )
            })
            .collect();
        self.last_active.retain(|(h, unit), _| {
            live_units.contains(&(
                h.namespace.as_str(),
                h.pod.as_str(),
                h.container.as_str(),
                unit.as_str(),
            ))
        });
    }

    /// The `/status` body ([`NodeView`]; its shape is documented there): every GPU the plan
    /// advertises devices on or the latest sample has, by index; under each, every advertised
    /// device with its holder (per `in_use`) and that holder's figures on the device's unit
    /// from the latest sample. `idle_seconds` is measured to the latest sample's time (no
    /// clock is read). `generation`/`ready` are left 0/false: the status endpoint fills them
    /// per request.
    pub fn view(&self, plan: &Plan, in_use: &InUse) -> NodeView {
        let in_use = &*with_claims(plan, in_use);
        let (mut gpus, figures_of) = self.sampled_gpus();
        let mut free = BTreeMap::new();
        for (name, r) in &plan.resources {
            let mut n_free = 0;
            for d in &r.devices {
                let holder = in_use.holders(name, &d.id).first();
                if holder.is_none() && d.health.is_healthy() {
                    n_free += 1;
                }
                let figures =
                    holder.and_then(|h| figures_of.get(&(d.gpu_uuid.as_str(), name.as_str(), h)));
                let view = self.device_view(plan, name, d, holder, figures.copied());
                let gpu_uuid = physical(d);
                gpus.entry(gpu_uuid)
                    .or_insert_with(|| GpuView {
                        index: d.gpu_index,
                        uuid: gpu_uuid.to_string(),
                        ..GpuView::default()
                    })
                    .devices
                    .push(view);
            }
            free.insert(name.clone(), n_free);
        }
        let mut gpus: Vec<GpuView> = gpus.into_values().collect();
        gpus.sort_by(|a, b| (a.index, &a.uuid).cmp(&(b.index, &b.uuid)));
        NodeView {
            generation: 0,
            ready: false,
            ready_reason: None,
            sampled_at_unix_ms: self.figures.as_ref().map(|f| f.at_unix_ms),
            checkpoint_error: self
                .figures
                .as_ref()
                .and_then(|f| f.checkpoint_error.clone()),
            unattributed_processes: self
                .figures
                .as_ref()
                .map_or(0, Figures::unattributed_processes),
            gpus,
            free,
        }
    }

    /// The latest sample's GPUs (no devices yet) by UUID, and its containers' figures by
    /// (unit UUID, resource, holder).
    fn sampled_gpus(&self) -> (HashMap<&str, GpuView>, FiguresOf<'_>) {
        let mut gpus: HashMap<&str, GpuView> = HashMap::new();
        let mut figures_of = FiguresOf::new();
        for g in self.figures.iter().flat_map(|f| &f.gpus) {
            gpus.insert(
                g.uuid.as_str(),
                GpuView {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    model: Some(g.model.clone()),
                    utilization_percent: g.utilization_percent,
                    memory_used_bytes: g.memory_used_bytes,
                    memory_total_bytes: g.memory_total_bytes,
                    unattributed_processes: g.unattributed_processes,
                    devices: Vec::new(),
                    memory_limits_supported: g.memory_limits_supported,
                },
            );
            for c in &g.containers {
                figures_of.insert((c.unit_uuid.as_str(), c.resource.as_str(), &c.holder), c);
            }
        }
        (gpus, figures_of)
    }

    /// Device `d` of resource `name` as `/status` shows it: its drain state, its `holder` and
    /// that holder's `figures` on its unit, idle seconds measured to the latest sample's time.
    fn device_view(
        &self,
        plan: &Plan,
        name: &str,
        d: &VirtualDevice,
        holder: Option<&Holder>,
        figures: Option<&ContainerFigures>,
    ) -> DeviceView {
        let sampled_at = self.figures.as_ref().map(|f| f.at_unix_ms as f64 / 1000.0);
        let idle_seconds = match (figures, sampled_at) {
            (Some(c), Some(at)) => self
                .last_active
                .get(&(c.holder.clone(), c.unit_uuid.clone()))
                .map(|last| (at - last).max(0.0)),
            _ => None,
        };
        DeviceView {
            resource: name.to_string(),
            id: d.id.clone(),
            unit_uuid: d.gpu_uuid.clone(),
            replica: d.replica,
            mig_profile: d.mig.as_ref().map(|m| m.profile.clone()),
            health: d.health.as_str().to_string(),
            draining: plan
                .drain
                .draining
                .get(name)
                .and_then(|m| m.get(&d.id))
                .cloned(),
            retained: plan
                .drain
                .retained
                .get(name)
                .is_some_and(|s| s.contains(&d.id)),
            holder: holder.map(HolderView::from),
            sm_util_percent: figures.map(|c| c.sm_util_percent),
            memory_used_bytes: figures.map(|c| c.memory_used_bytes),
            idle_seconds,
            memory_limit_bytes: figures.and_then(|c| c.memory_limit).map(|l| l.hard_bytes),
            memory_limit_enforced: figures
                .and_then(|c| c.memory_limit)
                .and_then(|l| l.enforced),
        }
    }
}

/// A synthetic node for benchmarks and tests: `gpus` GPUs (`GPU-<index:08x>-0000-…`, one
/// time-sliced resource `nvidia.com/gpu-shared` of `replicas` replicas each) and `containers`
/// containers (`ml/pod-<n>/main`, spread round-robin over the GPUs, replica `n / gpus`), each
/// holding one replica and running one process (SM `1 + n % 50` %, 100 MiB) that the
/// checkpoint attributes to it. 84 × 32 replicas with 500 containers is the `/metrics`
/// benchmark's 2,688 devices.
///
/// # Panics
/// When `containers > gpus * replicas` (not every container could hold a replica).
pub fn synthetic_node(gpus: u32, replicas: u32, containers: u32) -> (Plan, InUse, Samples) {
    use crate::inventory::sample::ProcessSample;
    use crate::plan::replica_id;
    use crate::usage::CheckpointEntry;
    assert!(u64::from(containers) <= u64::from(gpus) * u64::from(replicas));
    let plan = synthetic_plan(gpus, replicas);
    let mut samples = synthetic_samples(gpus);
    let mut in_use = InUse::default();
    for c in 0..containers {
        let (g, n) = (c % gpus, c / gpus);
        let id = replica_id(&synthetic_uuid(g), n);
        let pod_uid = format!("uid-{c}");
        in_use.insert(
            SYNTHETIC_RESOURCE,
            &id,
            Holder {
                namespace: "ml".into(),
                pod: format!("pod-{c}"),
                container: "main".into(),
            },
        );
        if let Some(checkpoint) = samples.checkpoint.as_mut() {
            checkpoint.push(CheckpointEntry {
                pod_uid: pod_uid.clone(),
                container: "main".into(),
                resource: SYNTHETIC_RESOURCE.into(),
                device_ids: vec![id],
            });
        }
        samples.gpus[g as usize].processes.push(ProcessSample {
            pid: 1000 + c,
            sm_util_percent: Some(1 + c % 50),
            memory_used_bytes: Some(100 * SYNTHETIC_MIB),
            pod_uid: Some(pod_uid),
            container_id: None,
            cgroup: None,
        });
    }
    (plan, in_use, samples)
}

/// [`synthetic_node`]'s one resource.
const SYNTHETIC_RESOURCE: &str = "nvidia.com/gpu-shared";
/// Bytes in a MiB, for [`synthetic_node`]'s figures.
const SYNTHETIC_MIB: u64 = 1024 * 1024;

/// The UUID of [`synthetic_node`]'s GPU `g`.
fn synthetic_uuid(g: u32) -> String {
    format!("GPU-{g:08x}-0000-0000-0000-000000000000")
}

/// [`synthetic_node`]'s plan: one time-sliced resource of `replicas` Healthy replicas on each
/// of `gpus` GPUs.
fn synthetic_plan(gpus: u32, replicas: u32) -> Plan {
    use crate::device_health::Health;
    use crate::plan::{replica_id, ResourcePlan, Strategy};
    let devices = (0..gpus)
        .flat_map(|g| (0..replicas).map(move |n| (g, n)))
        .map(|(g, n)| VirtualDevice {
            id: replica_id(&synthetic_uuid(g), n),
            gpu_index: g,
            gpu_uuid: synthetic_uuid(g),
            gpu_minor: Some(g),
            replica: Some(n),
            health: Health::Healthy,
            numa_node: None,
            mig: None,
        })
        .collect();
    let mut plan = Plan::default();
    plan.resources.insert(
        SYNTHETIC_RESOURCE.into(),
        Arc::new(ResourcePlan::new(
            crate::policy::ResourceName::parse(SYNTHETIC_RESOURCE).expect("a valid name"),
            Strategy::TimeSlicing,
            replicas,
            false,
            false,
            devices,
        )),
    );
    plan
}

/// [`synthetic_node`]'s sample of `gpus` H100s, 40 % busy, no processes yet, an empty
/// checkpoint.
fn synthetic_samples(gpus: u32) -> Samples {
    use crate::inventory::sample::GpuSample;
    Samples {
        at_unix_ms: 1_000_000,
        gpus: (0..gpus)
            .map(|g| GpuSample {
                uuid: synthetic_uuid(g),
                index: g,
                model: "NVIDIA H100 80GB HBM3".into(),
                utilization_percent: Some(40),
                memory_used_bytes: Some(4096 * SYNTHETIC_MIB),
                memory_total_bytes: Some(81_559 * SYNTHETIC_MIB),
                processes: Vec::new(),
                mig: Vec::new(),
                ..GpuSample::default()
            })
            .collect(),
        checkpoint: Some(Vec::new()),
        checkpoint_error: None,
        claims: None,
        limits_not_cleared: 0,
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
