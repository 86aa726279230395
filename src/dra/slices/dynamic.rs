//! Dynamic MIG devices (docs/mig.md, "Dynamic MIG"; KEP-4815 partitionable devices, the
//! shape of its own MIG example): per dynamic MIG GPU one counter set
//! ([`dynamic_mig_counter_set`], `gpu-<index>-mig`) with one counter per memory slice
//! (`memory-slice-<i>`, 1 each) and [`COUNTER_COMPUTE_SLICES`] (the GPU's compute slices), and
//! one device per placement of each profile of its geometry that overlaps no existing MIG
//! device, consuming `memory-slice-<i>: 1` for each memory slice the placement covers and
//! `compute-slices: <the profile's g>`. Two devices the counters let the scheduler allocate
//! together never share a memory slice, so they can both be created.
//!
//! A profile the driver allows fewer instances of than its placements could hold side by side
//! (NVML's `instanceCount`: one `1g.10gb+me` per H100, whose seven placements would otherwise
//! admit seven) also gets a counter of its own, `<profile label>-instances` ([`instances_counter`]),
//! holding the instances still allowed (the count less the GPU's existing GPU instances of that
//! profile), and each of its devices consumes 1 of it; at 0 none of its devices is published.
//!
//! A memory slice an existing (static) MIG device occupies stays in the set (its counter is
//! never consumed: no published device covers it), so the set's shape does not change as
//! static devices come and go. The set's `compute-slices` is the whole GPU's, not reduced by
//! the static devices' slices: the memory-slice counters already keep every dynamic device
//! off their placements; should the driver still refuse a combination, preparing the claim
//! fails with its reason.
//!
//! Attributes: those of a static MIG device (`type: mig`, `parentUUID`, `index`, `profile`,
//! `sharing: none`, the GPU's product, architecture, compute capability, NUMA node, PCIe root
//! and the driver version) without `uuid` (the MIG device does not exist until a claim is
//! prepared) and `resource` (no device-plugin resource mirrors it), plus `dynamic: true`,
//! `placementStart` and `placementSize` (ints, memory slices). Capacity `memory`: the
//! profile's, in MiB. Health is the caller's ([`super::build_pool`]): like a static MIG
//! device, an Unhealthy dynamic device (its GPU Unhealthy, or the instance created for the
//! claim that holds it) is published with a taint, or withdrawn where the API server has no
//! device taints.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{gpu_attributes, int, semver, string, version, COUNTER_COMPUTE_SLICES, MEMORY};
use crate::inventory::mig::gpu_instance_profile;
use crate::inventory::{Gpu, Inventory, MigGeometry, MigPlacement, MigProfileInfo};
use crate::plan::dra_names::{
    dynamic_mig_counter_set, dynamic_mig_name, is_dns_label, profile_label,
};
use crate::plan::DynamicMigGpu;

/// The prefix of a dynamic MIG GPU's per-memory-slice counters: `memory-slice-0` ….
pub const COUNTER_MEMORY_SLICE_PREFIX: &str = "memory-slice-";

/// The most counters all devices of one slice consume together (`resource.k8s.io/v1` in
/// Kubernetes 1.34, `consumesCounters`: "the total number in the entire ResourceSlice must be
/// <= 1024"; later releases limit each consumption to 32 counters instead). A dynamic MIG
/// device consumes at most 10 (8 memory slices, the compute slices and its profile's
/// instances), so a slice of 64 devices consumes at most 640.
pub const MAX_DEVICE_COUNTERS_PER_SLICE: usize = 1024;

/// The suffix of a profile's instance-limit counter: `1g-10gb-me-instances`.
pub const COUNTER_INSTANCES_SUFFIX: &str = "-instances";

/// The instance-limit counter of `profile` ([`profile_label`] and
/// [`COUNTER_INSTANCES_SUFFIX`]: `1g.10gb+me` → `1g-10gb-me-instances`); `None` when that is
/// no DNS label.
pub fn instances_counter(profile: &str) -> Option<String> {
    let name = format!("{}{COUNTER_INSTANCES_SUFFIX}", profile_label(profile));
    is_dns_label(&name).then_some(name)
}

/// The most placements of `profile` that fit side by side (no two sharing a memory slice):
/// the earliest-ending placement first, as interval scheduling goes.
fn disjoint_placements(profile: &MigProfileInfo) -> u32 {
    let mut ends: Vec<(u32, u32)> = profile
        .placements
        .iter()
        .map(|p| (p.start + p.size, p.start))
        .collect();
    ends.sort_unstable();
    let mut n = 0;
    let mut free_from = 0;
    for (end, start) in ends {
        if start >= free_from {
            n += 1;
            free_from = end;
        }
    }
    n
}

/// The profiles of `gpu`'s geometry whose instance count the memory slices alone do not
/// enforce ([`disjoint_placements`] above NVML's `instanceCount`), each with the instances
/// still allowed: the count less the GPU's existing GPU instances of that profile (each GPU
/// instance once, however many compute instances it holds).
fn instance_limits(gpu: &Gpu, geometry: &MigGeometry) -> BTreeMap<String, u32> {
    geometry
        .profiles
        .iter()
        .filter(|p| p.instance_count < disjoint_placements(p))
        .map(|p| {
            let existing: BTreeSet<u32> = gpu
                .mig_devices
                .iter()
                .filter(|m| gpu_instance_profile(&m.profile) == p.profile)
                .map(|m| m.gi_id)
                .collect();
            let left = p.instance_count.saturating_sub(existing.len() as u32);
            (p.profile.clone(), left)
        })
        .collect()
}

/// The counter of memory slice `i`: `memory-slice-<i>`.
fn memory_slice(i: u32) -> String {
    format!("{COUNTER_MEMORY_SLICE_PREFIX}{i}")
}

fn counter(n: u64) -> Counter {
    Counter {
        value: Quantity(n.to_string()),
    }
}

/// The counter set and devices of the dynamic MIG GPU `g` ([`dynamic_mig_devices`]), Healthy
/// or not (the caller taints or withdraws); `None` when the inventory lacks the GPU or its
/// geometry.
pub fn dynamic_mig(
    g: &DynamicMigGpu,
    inventory: &Inventory,
    driver_version: Option<&str>,
) -> Option<(CounterSet, Vec<Device>)> {
    let gpu = inventory.by_index(g.index)?;
    let geometry = gpu.mig_geometry.as_ref()?;
    let mut counters: BTreeMap<String, Counter> = (0..geometry.memory_slices)
        .map(|i| (memory_slice(i), counter(1)))
        .collect();
    counters.insert(
        COUNTER_COMPUTE_SLICES.to_string(),
        counter(u64::from(geometry.compute_slices)),
    );
    for (profile, left) in instance_limits(gpu, geometry) {
        if let Some(name) = instances_counter(&profile) {
            counters.insert(name, counter(u64::from(left)));
        }
    }
    let set = CounterSet {
        name: dynamic_mig_counter_set(g.index),
        counters,
    };
    Some((set, dynamic_mig_devices(g, gpu, driver_version)))
}

/// One device per placement of each profile of `gpu`'s geometry (profiles in the geometry's
/// order, placements `start` ascending) that overlaps none of `g.occupied`, leaving out a
/// profile with no instance left ([`instance_limits`]); none when the GPU has no geometry.
pub fn dynamic_mig_devices(
    g: &DynamicMigGpu,
    gpu: &Gpu,
    driver_version: Option<&str>,
) -> Vec<Device> {
    let Some(geometry) = gpu.mig_geometry.as_ref() else {
        return Vec::new();
    };
    let mut base = BTreeMap::new();
    gpu_attributes(&mut base, gpu);
    if let Some(v) = driver_version.and_then(semver) {
        base.insert("driverVersion".to_string(), version(v));
    }
    base.insert("type".to_string(), string("mig"));
    base.insert("parentUUID".to_string(), string(&gpu.uuid));
    base.insert("index".to_string(), int(i64::from(gpu.index)));
    base.insert("sharing".to_string(), string("none"));
    base.insert(
        "dynamic".to_string(),
        DeviceAttribute {
            bool: Some(true),
            ..DeviceAttribute::default()
        },
    );
    let limits = instance_limits(gpu, geometry);
    let mut out = Vec::new();
    for profile in &geometry.profiles {
        let limited = match limits.get(&profile.profile) {
            Some(0) => continue,
            Some(_) => match instances_counter(&profile.profile) {
                Some(name) => Some(name),
                None => continue,
            },
            None => None,
        };
        for p in &profile.placements {
            if g.occupied.iter().any(|o| o.overlaps(p)) {
                continue;
            }
            if let Some(d) = placement_device(g.index, profile, *p, limited.as_deref(), &base) {
                out.push(d);
            }
        }
    }
    out
}

/// The device for `profile` at `p` on GPU `index`, with the attributes `base` (the GPU's),
/// consuming 1 of `instances` too when the profile has an instance-limit counter; `None` when
/// its name is no DNS label.
fn placement_device(
    index: u32,
    profile: &MigProfileInfo,
    p: MigPlacement,
    instances: Option<&str>,
    base: &BTreeMap<String, DeviceAttribute>,
) -> Option<Device> {
    let name = dynamic_mig_name(index, &profile.profile, p.start)?;
    let mut attrs = base.clone();
    attrs.insert("profile".to_string(), string(&profile.profile));
    attrs.insert("placementStart".to_string(), int(i64::from(p.start)));
    attrs.insert("placementSize".to_string(), int(i64::from(p.size)));
    let mut counters: BTreeMap<String, Counter> = (p.start..p.start + p.size)
        .map(|i| (memory_slice(i), counter(1)))
        .collect();
    counters.insert(
        COUNTER_COMPUTE_SLICES.to_string(),
        counter(u64::from(profile.gpu_slices)),
    );
    if let Some(name) = instances {
        counters.insert(name.to_string(), counter(1));
    }
    Some(Device {
        name,
        attributes: Some(attrs),
        capacity: Some(BTreeMap::from([(
            MEMORY.to_string(),
            DeviceCapacity {
                value: Quantity(format!("{}Mi", profile.memory_mib)),
                ..DeviceCapacity::default()
            },
        )])),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: dynamic_mig_counter_set(index),
            counters,
        }]),
        ..Device::default()
    })
}
