//! The drain rules: a policy or inventory change never pulls a device from under a running
//! container.
//!
//! The kubelet keeps every container's device IDs in its checkpoint and, after a restart,
//! re-admits a pod only if each ID it holds is still advertised Healthy ("previously allocated
//! devices are no longer healthy" otherwise: the pod is rejected, i.e. killed). So, given what
//! the kubelet's pod-resources API says is held ([`InUse`]):
//!
//! 1. **Retained**: a held device ID the new plan no longer has (a reload went from 4 to 2
//!    replicas while `::3` is held, or made a whole GPU shared) stays advertised with its old
//!    shape, Healthy unless its physical unit is Unhealthy or gone, until the kubelet releases
//!    it; then it is withdrawn. Its shape comes from the previous plan, or, after a restart of
//!    slicelet, from the ID (`<uuid>` or `<uuid>::<n>`) and the inventory.
//! 2. **Draining**: a physical unit (GPU or MIG device) whose held devices are retained, or
//!    whose resource changed strategy or replica count under a holder, is re-purposed: its
//!    new devices that nobody holds are advertised Unhealthy with the reason
//!    `draining: held by ns/pod` until the old holders are gone, so nobody new is scheduled
//!    onto a GPU still shared the old way.
//!
//! A held device that the new plan still has keeps its place (and its health). An MPS resource
//! whose replica count changes keeps the MPS pending-change rule ([`super::build_with`]: the
//! daemon's enforced limits are advertised until its clients leave); only IDs that disappear
//! are retained there.
//!
//! Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{Drain, Plan, ResourcePlan, Strategy, VirtualDevice};
use crate::device_health::Health;
use crate::in_use::{Holder, InUse};
use crate::inventory::Inventory;

/// Applies the drain rules to `plan` (just built from the policy and the effective inventory
/// `inventory`), given what is held (`in_use`) and the plan served until now (`previous`, which
/// holds the shapes of devices retained before). Sets [`Plan::drain`].
pub fn apply(plan: &mut Plan, previous: &Plan, in_use: &InUse, inventory: &Inventory) {
    // Held through the device plugin (pod-resources' `devices`), whatever plan came before.
    let plugin_held = in_use;
    let with_claims;
    let mut claim_units = BTreeMap::new();
    let in_use = if in_use.claimed.is_empty() {
        in_use
    } else {
        let (ids, units) = claims_as_ids(in_use, previous, plan, inventory);
        with_claims = ids;
        claim_units = units;
        &with_claims
    };
    let mut walk = Walk {
        drain: Drain::default(),
        repurposed: claim_units,
        retained: BTreeMap::new(),
        keep_dra: BTreeMap::new(),
    };
    for (resource, id, holders) in in_use.iter() {
        // Only resources slicelet serves or served: another device plugin's resource whose IDs
        // happen to look like slicelet's is none of its business.
        if !plan.resources.contains_key(resource) && !previous.resources.contains_key(resource) {
            continue;
        }
        if let Some(res) = plan.resources.get(resource) {
            if let Some(d) = res.device(id) {
                let given = given_shape(res, previous, plugin_held, resource, id);
                walk.note_reshaped(res, d, given, resource, id, holders);
                continue;
            }
        }
        walk.retain(previous, inventory, resource, id, holders);
    }
    let Walk {
        mut drain,
        repurposed,
        retained,
        keep_dra,
    } = walk;
    merge_retained(plan, previous, retained, inventory);
    for (resource, dra) in keep_dra {
        if let Some(res) = plan.resources.get_mut(&resource) {
            Arc::make_mut(res).dra = dra;
        }
    }
    mark_draining(plan, in_use, &repurposed, &mut drain);
    plan.drain = drain;
}

/// What [`apply`] gathers while it walks the held devices.
struct Walk {
    /// The drain state being built (its `given` and `retained` so far).
    drain: Drain,
    /// Physical unit (GPU or MIG UUID) → the pods holding its old devices; a claim whose
    /// device no plan names any more holds its whole unit.
    repurposed: BTreeMap<String, BTreeSet<Holder>>,
    /// Resource → the held devices the new plan no longer has, with their old shape.
    retained: BTreeMap<String, Vec<VirtualDevice>>,
    /// Resources that keep their previous DRA flag while a holder of the old path runs.
    keep_dra: BTreeMap<String, bool>,
}

impl Walk {
    /// A held device the new plan still has (`d` of `res`): when its holder was `given` another
    /// shape, remembers that shape and re-purposes its unit (and keeps the old path, DRA or
    /// device plugin, when that changed).
    fn note_reshaped(
        &mut self,
        res: &ResourcePlan,
        d: &VirtualDevice,
        given: Option<(Strategy, u32, bool)>,
        resource: &str,
        id: &str,
        holders: &[Holder],
    ) {
        let now = shape(res);
        let changed = given.is_some_and(|was| {
            was != now && !(was.0 == Strategy::Mps && now.0 == Strategy::Mps && was.2 == now.2)
        });
        if let (true, Some(was)) = (changed, given) {
            if was.2 != now.2 {
                // The other path must not hand out what this one's holder has: the
                // resource stays on its old path until the holders are gone.
                self.keep_dra.insert(resource.to_string(), was.2);
            }
            self.drain
                .given
                .entry(resource.to_string())
                .or_default()
                .insert(id.to_string(), was);
            self.repurposed
                .entry(d.gpu_uuid.clone())
                .or_default()
                .extend(holders.iter().cloned());
        }
    }

    /// A held device the new plan no longer has: retained with its old shape (from `previous`,
    /// else from its ID and the inventory) and its unit re-purposed; one that names no GPU or
    /// MIG device on this node is only warned about.
    fn retain(
        &mut self,
        previous: &Plan,
        inventory: &Inventory,
        resource: &str,
        id: &str,
        holders: &[Holder],
    ) {
        let Some(mut device) = previous
            .resources
            .get(resource)
            .and_then(|r| r.device(id))
            .cloned()
            .or_else(|| from_id(id, inventory))
        else {
            tracing::warn!(resource, device = id, holders = %names(holders.iter()),
                "a held device ID names no GPU or MIG device on this node; it cannot stay advertised");
            return;
        };
        device.health = unit_health(&device, inventory);
        self.repurposed
            .entry(device.gpu_uuid.clone())
            .or_default()
            .extend(holders.iter().cloned());
        self.drain
            .retained
            .entry(resource.to_string())
            .or_default()
            .insert(id.to_string());
        self.retained
            .entry(resource.to_string())
            .or_default()
            .push(device);
    }
}

/// What the holder of `id` (a device of `res`, the new plan's `resource`) was given: remembered
/// from the last drain, else the previous plan's resource when it had this ID, else the path
/// it must have come through (`plugin_held`: pod-resources' device-plugin devices).
fn given_shape(
    res: &ResourcePlan,
    previous: &Plan,
    plugin_held: &InUse,
    resource: &str,
    id: &str,
) -> Option<(Strategy, u32, bool)> {
    previous
        .drain
        .given
        .get(resource)
        .and_then(|g| g.get(id))
        .copied()
        .or_else(|| {
            previous
                .resources
                .get(resource)
                .filter(|old| old.device(id).is_some())
                .map(|old| shape(old))
        })
        .or_else(|| {
            // No plan knows it (slicelet restarted with a changed policy): what
            // pod-resources lists as a device was handed out by the device plugin,
            // so at least its path is known, and a resource now on DRA stays on
            // the device plugin while the holder runs, as on a live reload.
            (res.dra && plugin_held.is_held(resource, id)).then_some((
                res.strategy,
                res.replicas,
                false,
            ))
        })
        .or_else(|| {
            // The other way: a claim holds it (pod-resources' `dynamic_resources`
            // or the DRA checkpoint) while the resource is now the device
            // plugin's: it stays on DRA while the claim runs.
            (!res.dra && !plugin_held.is_held(resource, id)).then_some((
                res.strategy,
                res.replicas,
                true,
            ))
        })
}

/// Puts the retained devices back into their resources (or the resource they kept alive).
fn merge_retained(
    plan: &mut Plan,
    previous: &Plan,
    retained: BTreeMap<String, Vec<VirtualDevice>>,
    inventory: &Inventory,
) {
    for (resource, devices) in retained {
        let merged = match plan.resources.get(&resource) {
            Some(res) => {
                let mut all = res.devices.clone();
                all.extend(devices);
                rebuilt(res, all, inventory)
            }
            // Only resources of the new or the previous plan are retained (the loop in
            // `apply` skips the others), so one of the two has it.
            None => match previous.resources.get(&resource) {
                Some(old) => rebuilt(old, devices, inventory),
                None => continue,
            },
        };
        plan.resources.insert(resource, Arc::new(merged));
    }
}

/// Marks the new devices of a re-purposed unit (nobody holds them, none is retained)
/// Unhealthy with the reason `draining: held by …` while the old holders are there.
fn mark_draining(
    plan: &mut Plan,
    in_use: &InUse,
    repurposed: &BTreeMap<String, BTreeSet<Holder>>,
    drain: &mut Drain,
) {
    if repurposed.is_empty() {
        return;
    }
    for (name, res) in plan.resources.iter_mut() {
        let kept = drain.retained.get(name);
        let hit: Vec<usize> = res
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| {
                repurposed.contains_key(&d.gpu_uuid)
                    && !in_use.is_held(name, &d.id)
                    && !kept.is_some_and(|k| k.contains(&d.id))
            })
            .map(|(i, _)| i)
            .collect();
        if hit.is_empty() {
            continue;
        }
        let res = Arc::make_mut(res);
        for i in hit {
            let d = &mut res.devices[i];
            d.health = Health::Unhealthy;
            let reason = format!(
                "draining: held by {}",
                names(repurposed[&d.gpu_uuid].iter())
            );
            drain
                .draining
                .entry(name.clone())
                .or_default()
                .insert(d.id.clone(), reason);
        }
    }
}

/// `in_use` with the DRA devices claims hold (by published device name) as device IDs: of the
/// DRA resources of `previous` (the plan that published them), else of any resource of the
/// new `plan` with that device; and, for a claimed device neither names (slicelet restarted
/// with a reshaped policy), its physical unit (read back from the name: `gpu-<uuid>[-r<n>]`,
/// `mig-<uuid>[-r<n>]`) with its holders, so every new device on that unit drains.
fn claims_as_ids(
    in_use: &InUse,
    previous: &Plan,
    plan: &Plan,
    inventory: &Inventory,
) -> (InUse, BTreeMap<String, BTreeSet<Holder>>) {
    use super::dra_names::record_claims;
    let mut out = in_use.clone();
    let dra = previous.resources.values().filter(|r| r.dra).map(|r| &**r);
    let mut resolved = record_claims(dra, in_use, &BTreeSet::new(), &mut out);
    // Claims the previous plan did not name (it skips those it did).
    let all = plan.resources.values().map(|r| &**r);
    let more = record_claims(all, in_use, &resolved, &mut out);
    resolved.extend(more);
    let mut units: BTreeMap<String, BTreeSet<Holder>> = BTreeMap::new();
    for (claim, holders) in &in_use.claimed {
        if resolved.contains(claim) {
            continue;
        }
        if let Some(unit) = unit_of_name(claim, inventory) {
            units
                .entry(unit)
                .or_default()
                .extend(holders.iter().cloned());
        }
    }
    (out, units)
}

/// The GPU or MIG UUID a published device name is of, when it names one of `inventory`'s
/// units ([`super::dra_names::device_name`] read back; a hashed `dev-…` name names none).
fn unit_of_name(name: &str, inventory: &Inventory) -> Option<String> {
    inventory
        .gpus
        .iter()
        .flat_map(|g| {
            std::iter::once(g.uuid.as_str()).chain(g.mig_devices.iter().map(|m| m.uuid.as_str()))
        })
        .find(|uuid| {
            let base = super::dra_names::device_name(uuid);
            name == base
                || name
                    .strip_prefix(base.as_str())
                    .and_then(|r| r.strip_prefix("-r"))
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// What a holder was given: the resource's strategy, replica count and path (DRA or not).
fn shape(res: &ResourcePlan) -> (Strategy, u32, bool) {
    (res.strategy, res.replicas, res.dra)
}

/// `ns/pod, ns/pod2` (each pod once, in order).
fn names<'a>(holders: impl Iterator<Item = &'a Holder>) -> String {
    let pods: BTreeSet<String> = holders.map(ToString::to_string).collect();
    pods.into_iter().collect::<Vec<_>>().join(", ")
}

/// The device behind a held ID the previous plan does not know (slicelet restarted with a
/// changed policy): `<uuid>` or `<uuid>::<n>`, the UUID a GPU's or a MIG device's.
fn from_id(id: &str, inventory: &Inventory) -> Option<VirtualDevice> {
    let (unit, replica) = match id.split_once("::") {
        Some((u, n)) => (u, Some(n.parse::<u32>().ok()?)),
        None => (id, None),
    };
    for g in &inventory.gpus {
        if g.uuid == unit {
            return Some(VirtualDevice {
                id: id.to_string(),
                gpu_index: g.index,
                gpu_uuid: g.uuid.clone(),
                gpu_minor: g.minor,
                replica,
                health: g.health,
                numa_node: g.numa_node,
                mig: None,
            });
        }
        if let Some(m) = g.mig_devices.iter().find(|m| m.uuid == unit) {
            return Some(VirtualDevice {
                id: id.to_string(),
                gpu_index: g.index,
                gpu_uuid: m.uuid.clone(),
                gpu_minor: g.minor,
                replica,
                health: g.health.and(m.health),
                numa_node: g.numa_node,
                mig: Some(super::MigInfo::of(g, m)),
            });
        }
    }
    None
}

/// A retained device's health: its unit's in the (effective) inventory; Unhealthy when the
/// unit is gone.
fn unit_health(d: &VirtualDevice, inventory: &Inventory) -> Health {
    match &d.mig {
        None => inventory
            .by_uuid(&d.gpu_uuid)
            .map_or(Health::Unhealthy, |g| g.health),
        Some(m) => inventory
            .by_uuid(&m.parent_uuid)
            .and_then(|g| {
                g.mig_devices
                    .iter()
                    .find(|x| x.uuid == d.gpu_uuid)
                    .map(|x| g.health.and(x.health))
            })
            .unwrap_or(Health::Unhealthy),
    }
}

fn sort(devices: &mut [VirtualDevice]) {
    devices.sort_by(|a, b| {
        (a.unit_order(), a.replica, &a.id).cmp(&(b.unit_order(), b.replica, &b.id))
    });
}

/// `res` with `devices` (re-sorted, re-indexed) and everything else kept.
/// Withdraws every device of GPU `gpu` (NVML index: the whole GPU, its MIG devices, their
/// replicas) from `plan`, just built, before [`apply`]: a GPU whose MIG layout is about to
/// change (docs/mig.md, "MIG layouts") is offered to nobody new, while [`apply`] keeps its held
/// devices advertised until released.
pub fn withdraw_gpu(plan: &mut Plan, gpu: u32, inventory: &Inventory) {
    for res in plan.resources.values_mut() {
        if !res.devices.iter().any(|d| d.gpu_index == gpu) {
            continue;
        }
        let kept = res
            .devices
            .iter()
            .filter(|d| d.gpu_index != gpu)
            .cloned()
            .collect();
        *res = Arc::new(rebuilt(res, kept, inventory));
    }
}

/// `res` with `devices` (sorted, each ID once) in place of its own: every other field is kept
/// (strategy, MPS, memory limits, DRA capacity, delivery), the device index and links rebuilt.
fn rebuilt(
    res: &ResourcePlan,
    mut devices: Vec<VirtualDevice>,
    inventory: &Inventory,
) -> ResourcePlan {
    sort(&mut devices);
    devices.dedup_by(|a, b| a.id == b.id);
    let mut out = ResourcePlan::new(
        res.name.clone(),
        res.strategy,
        res.replicas,
        res.fail_requests_greater_than_one,
        res.pass_device_specs,
        devices,
    )
    .with_links_from(inventory)
    .with_shared_allocation(res.shared_allocation)
    .with_delivery(res.delivery.clone());
    out.mps.clone_from(&res.mps);
    out.memory.clone_from(&res.memory);
    out.capacity.clone_from(&res.capacity);
    out.dra = res.dra;
    out
}

#[cfg(test)]
mod tests;
