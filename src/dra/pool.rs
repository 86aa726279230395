//! The pool's devices: which device of the plan's DRA resources is published under each name.
//! A name is the device ID's DNS label ([`device_name`]), so two resources that share a unit
//! (only while the drain rules keep it in both, one copy held Unhealthy) give one name twice:
//! the pool keeps one device per name. Pure; what the slices publish ([`super::slices`]) and
//! the health map ([`super::health_map`]) both enumerate it.

use std::collections::BTreeSet;

use crate::device_health::Health;
use crate::plan::dra_names::device_name;
use crate::plan::{ResourcePlan, VirtualDevice};

/// One published device and where it came from (what the kubelet plugin checks a claim
/// against).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedDevice {
    /// The device name in the pool.
    pub name: String,
    /// The device-plugin resource it mirrors.
    pub resource: String,
    /// The device ID in that resource (`<uuid>` or `<uuid>::<n>`).
    pub id: String,
}

/// A device of the pool: its name and where it came from.
pub type PoolDevice<'a> = (PublishedDevice, &'a ResourcePlan, &'a VirtualDevice);

/// Every device of the pool, Healthy or not, in order (resources as given, each in its own
/// device order), each name once: a Healthy device wins a name over Unhealthy ones (the drain
/// rules may keep a unit in two resources, one copy held Unhealthy), else the first.
pub fn pool_devices<'a>(
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
) -> Vec<PoolDevice<'a>> {
    named(resources).0
}

/// Devices in order with their names, each name once ([`pool_devices`]), and the Healthy
/// devices left out because an earlier Healthy one has their name (`resource/id`).
pub fn named<'a>(
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
) -> (Vec<PoolDevice<'a>>, Vec<String>) {
    let all: Vec<(&ResourcePlan, &VirtualDevice, String)> = resources
        .into_iter()
        .flat_map(|res| {
            res.devices
                .iter()
                .map(move |d| (res, d, device_name(&d.id)))
        })
        .collect();
    let healthy_names: BTreeSet<&str> = all
        .iter()
        .filter(|(_, d, _)| d.health == Health::Healthy)
        .map(|(_, _, n)| n.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for (res, d, name) in &all {
        let healthy = d.health == Health::Healthy;
        if !healthy && healthy_names.contains(name.as_str()) {
            continue;
        }
        if !seen.insert(name.clone()) {
            if healthy {
                skipped.push(format!("{}/{}", res.name, d.id));
            }
            continue;
        }
        out.push((
            PublishedDevice {
                name: name.clone(),
                resource: res.name.to_string(),
                id: d.id.clone(),
            },
            *res,
            *d,
        ));
    }
    (out, skipped)
}

/// The Healthy devices of `resources`, which a claim can be allocated ([`pool_devices`] less
/// the Unhealthy ones, which are tainted or withdrawn), and the Healthy devices skipped
/// because an earlier one has their name (`resource/id`).
pub fn published<'a>(
    resources: impl IntoIterator<Item = &'a ResourcePlan>,
) -> (Vec<PoolDevice<'a>>, Vec<String>) {
    let (mut out, skipped) = named(resources);
    out.retain(|(_, _, d)| d.health == Health::Healthy);
    (out, skipped)
}
