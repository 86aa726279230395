//! Dynamic MIG devices (docs/mig.md, "Dynamic MIG"; KEP-4815 partitionable devices, the
//! shape of its own MIG example): per dynamic MIG GPU one counter set
//! ([`dynamic_mig_counter_set`], `gpu-<index>-mig`) with one counter per memory slice
//! (`memory-slice-<i>`, 1 each) and [`COUNTER_COMPUTE_SLICES`] (the GPU's compute slices), and
//! one device per placement of each profile of its geometry that overlaps no existing MIG
//! device, consuming `memory-slice-<i>: 1` for each memory slice the placement covers and
//! `compute-slices: <the profile's g>`. Two devices the counters let the scheduler allocate
//! together never share a memory slice, so they can both be created.
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
//! profile's, in MiB. An Unhealthy GPU publishes no dynamic device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{gpu_attributes, int, semver, string, version, COUNTER_COMPUTE_SLICES, MEMORY};
use crate::device_health::Health;
use crate::inventory::{Gpu, Inventory, MigPlacement, MigProfileInfo};
use crate::plan::dra_names::{dynamic_mig_counter_set, dynamic_mig_name};
use crate::plan::DynamicMigGpu;

/// The prefix of a dynamic MIG GPU's per-memory-slice counters: `memory-slice-0` ….
pub const COUNTER_MEMORY_SLICE_PREFIX: &str = "memory-slice-";

/// The most counters all devices of one slice consume together (`resource.k8s.io/v1`
/// `consumesCounters`: "the total number in the entire ResourceSlice must be <= 1024"). A
/// dynamic MIG device consumes at most 9 (8 memory slices and the compute slices), so a slice
/// of 64 devices consumes at most 576.
pub const MAX_DEVICE_COUNTERS_PER_SLICE: usize = 1024;

/// The counter of memory slice `i`: `memory-slice-<i>`.
fn memory_slice(i: u32) -> String {
    format!("{COUNTER_MEMORY_SLICE_PREFIX}{i}")
}

fn counter(n: u64) -> Counter {
    Counter {
        value: Quantity(n.to_string()),
    }
}

/// The counter set and devices of the dynamic MIG GPU `g` ([`dynamic_mig_devices`]); `None`
/// when the inventory lacks the GPU or its geometry, or the GPU is Unhealthy.
pub fn dynamic_mig(
    g: &DynamicMigGpu,
    inventory: &Inventory,
    driver_version: Option<&str>,
) -> Option<(CounterSet, Vec<Device>)> {
    let gpu = inventory.by_index(g.index)?;
    let geometry = gpu.mig_geometry.as_ref()?;
    if gpu.health != Health::Healthy {
        return None;
    }
    let mut counters: BTreeMap<String, Counter> = (0..geometry.memory_slices)
        .map(|i| (memory_slice(i), counter(1)))
        .collect();
    counters.insert(
        COUNTER_COMPUTE_SLICES.to_string(),
        counter(u64::from(geometry.compute_slices)),
    );
    let set = CounterSet {
        name: dynamic_mig_counter_set(g.index),
        counters,
    };
    Some((set, dynamic_mig_devices(g, gpu, driver_version)))
}

/// One device per placement of each profile of `gpu`'s geometry (profiles in the geometry's
/// order, placements `start` ascending) that overlaps none of `g.occupied`; none when the
/// GPU has no geometry.
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
    let mut out = Vec::new();
    for profile in &geometry.profiles {
        for p in &profile.placements {
            if g.occupied.iter().any(|o| o.overlaps(p)) {
                continue;
            }
            if let Some(d) = placement_device(g.index, profile, *p, &base) {
                out.push(d);
            }
        }
    }
    out
}

/// The device for `profile` at `p` on GPU `index`, with the attributes `base` (the GPU's);
/// `None` when its name is no DNS label.
fn placement_device(
    index: u32,
    profile: &MigProfileInfo,
    p: MigPlacement,
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
