//! The health of dynamic MIG devices ([`fold_dynamic`]): what their device taints
//! ([`super::slices`]) and the kubelet's health stream show, by the rule of static MIG
//! devices (docs/mig.md, "Dynamic MIG"). Pure: time and the tracker's conditions are passed in.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::health_map::{entry, whole_seconds, HealthMap, TrackedCause};
use crate::device_health::Cause;
use crate::inventory::mig::gpu_instance_profile;
use crate::inventory::{Gpu, Inventory};
use crate::plan::dra_names::dynamic_mig_name;
use crate::plan::DynamicMigGpu;

/// The health of every dynamic MIG device the GPUs `dynamic` (the plan's
/// [`crate::plan::Plan::dynamic_mig`]) publish on `inventory` (the discovered one, which
/// still lists the instances created for claims), by name, with `since` kept from `prev` as
/// [`super::health_map::fold`] does. The rule is the static MIG devices' (docs/mig.md): a device is Unhealthy
/// when its GPU is (the plan's or the inventory's verdict; the cause `tracked` gives for the
/// GPU, else [`Cause::Other`]), or when the instance created for the claim that holds it (the
/// MIG device at its placement, of its profile) has a condition in `tracked` (a critical Xid
/// the event watch matched to the instance's UUID by its GPU-instance id) or is Unhealthy in
/// `inventory`.
pub fn fold_dynamic(
    prev: &HealthMap,
    dynamic: &[DynamicMigGpu],
    inventory: &Inventory,
    tracked: &TrackedCause<'_>,
    now: SystemTime,
) -> HealthMap {
    let now = whole_seconds(now);
    let mut out = HealthMap::new();
    for g in dynamic {
        let Some(gpu) = inventory.by_index(g.index).filter(|gpu| gpu.uuid == g.uuid) else {
            continue;
        };
        let gpu_cause = gpu_condition(g, gpu, tracked);
        let created = created_instances(g.index, gpu, tracked);
        for d in super::slices::dynamic_mig_devices(g, gpu, None) {
            let cause = gpu_cause
                .clone()
                .or_else(|| created.get(&d.name).cloned().flatten());
            let e = entry(prev, &d.name, cause, now);
            out.insert(d.name, e);
        }
    }
    out
}

/// Why dynamic MIG GPU `g` (discovered as `gpu`) is Unhealthy; `None` when Healthy.
fn gpu_condition(
    g: &DynamicMigGpu,
    gpu: &Gpu,
    tracked: &TrackedCause<'_>,
) -> Option<(Cause, String)> {
    if g.health.is_healthy() && gpu.health.is_healthy() {
        return None;
    }
    Some(tracked(&g.uuid).unwrap_or((Cause::Other, "Unhealthy".to_string())))
}

/// The MIG devices of `gpu` by the dynamic device name of their placement and profile
/// (`gpu-<index>-mig-<profile>-<start>`), each with its condition (`None`: Healthy). Of the
/// names the GPU publishes, only an instance created for a claim can have one: a static
/// instance's placement is occupied, so no device of that name is published.
fn created_instances(
    index: u32,
    gpu: &Gpu,
    tracked: &TrackedCause<'_>,
) -> BTreeMap<String, Option<(Cause, String)>> {
    gpu.mig_devices
        .iter()
        .filter_map(|m| {
            let name =
                dynamic_mig_name(index, gpu_instance_profile(&m.profile), m.placement?.start)?;
            let cause = tracked(&m.uuid).or_else(|| {
                (!m.health.is_healthy()).then(|| (Cause::Other, "Unhealthy".to_string()))
            });
            Some((name, cause))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_health::Health;
    use crate::dra::health_map::unix_seconds;
    use crate::plan;
    use crate::policy::parse;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(secs * 1000 + 700)
    }

    /// One H100 with MIG on, partitioned on demand, and the instance created for a claim at
    /// `3g.40gb` memory slice 0: the plan's inventory (without it, as the daemon plans) and
    /// the discovered one (with it).
    fn held_node() -> (crate::plan::Plan, Inventory) {
        let node = |devices: &str| {
            crate::inventory::simulated::parse(
                std::path::Path::new("n.yaml"),
                &format!("gpus:\n  - model: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    mig:\n      devices: {devices}\n"),
            )
            .unwrap()
        };
        let policy = parse(
            "version: v1\nflags:\n  migStrategy: mixed\ndra:\n  dynamicMig:\n    devices: all\n",
        )
        .unwrap();
        let plan = plan::build(&policy, &node("[]")).unwrap().plan;
        let discovered = node("\n        - profile: 3g.40gb\n          placementStart: 0");
        (plan, discovered)
    }

    #[test]
    fn an_xid_on_a_created_instance_marks_the_device_its_claim_holds() {
        let (plan, inv) = held_node();
        let mig = inv.gpus[0].mig_devices[0].uuid.clone();
        let gpu = inv.gpus[0].uuid.clone();
        let on = |who: String, xid: u64| {
            move |u: &str| (u == who).then(|| (Cause::Xid(xid), format!("xid {xid}")))
        };
        let h = fold_dynamic(
            &HealthMap::new(),
            &plan.dynamic_mig,
            &inv,
            &on(mig, 79),
            at(100),
        );
        assert_eq!(h.len(), 25, "every placement of the empty GPU");
        let held = &h["gpu-0-mig-3g-40gb-0"];
        assert_eq!(held.health, Health::Unhealthy);
        assert_eq!(held.cause, Some(Cause::Xid(79)));
        assert_eq!(held.message, "xid 79");
        let sick: Vec<&String> = h
            .iter()
            .filter(|(_, d)| !d.health.is_healthy())
            .map(|(n, _)| n)
            .collect();
        assert_eq!(sick, ["gpu-0-mig-3g-40gb-0"], "only the held device");
        // The same Xid on the GPU (the plan folded it in): every dynamic device of the GPU.
        let mut sick_plan = plan.clone();
        sick_plan.dynamic_mig[0].health = Health::Unhealthy;
        let h2 = fold_dynamic(&h, &sick_plan.dynamic_mig, &inv, &on(gpu, 48), at(200));
        assert!(
            h2.values().all(|d| d.cause == Some(Cause::Xid(48))),
            "{h2:?}"
        );
        // Healthy again: nothing left, each since moved.
        let none = |_: &str| None;
        let h3 = fold_dynamic(&h2, &plan.dynamic_mig, &inv, &none, at(300));
        assert!(h3
            .values()
            .all(|d| d.health.is_healthy() && unix_seconds(d.since) == 300));
    }
}
