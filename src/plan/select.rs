//! Device selection: the node's physical units per resource under `flags.migStrategy`
//! ([`node_resources`]), the units a sharing entry's `devices` select ([`select`]), and the
//! claim that keeps one unit in one entry ([`claim_units`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{PlanError, WHOLE_GPU_RESOURCE};
use crate::device_health::Health;
use crate::inventory::{mig, Gpu, Inventory, MigDevice};
use crate::policy::{DeviceRef, DeviceSelector, MigStrategy, ResourceName, SharedResource};

/// One physical unit that can be advertised: a whole GPU or one MIG device of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unit<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) mig: Option<&'a MigDevice>,
}

impl<'a> Unit<'a> {
    pub(super) fn uuid(&self) -> &'a str {
        self.mig.map_or(&self.gpu.uuid, |m| &m.uuid)
    }

    pub(super) fn health(&self) -> Health {
        self.gpu
            .health
            .and(self.mig.map_or(Health::Healthy, |m| m.health))
    }

    pub(super) fn order(&self) -> (u32, Option<u32>) {
        (self.gpu.index, self.mig.map(|m| m.index))
    }

    /// `3` for GPU 3, `0:2` for MIG device 2 of GPU 0.
    pub(super) fn label(&self) -> String {
        match self.mig {
            None => self.gpu.index.to_string(),
            Some(m) => format!("{}:{}", self.gpu.index, m.index),
        }
    }
}

/// The node's resources before sharing, by name; each list in (GPU index, MIG index) order.
pub(super) type Units<'a> = BTreeMap<String, Vec<Unit<'a>>>;

/// The devices of the node resource `entry` names that its `devices` selects, each recorded in
/// `claimed` (one device claimed by two entries is an error naming both); `None`, with a
/// warning, when the entry matches nothing on this node.
///
/// `by_size`: the units claimed by time-slicing entries with `memory.hard`, which other such
/// entries may share (their limits are checked to fit later); `None` for MPS entries (one
/// control daemon per GPU: never shared).
pub(super) fn claim_units<'a>(
    entry: &'a SharedResource,
    mig_strategy: MigStrategy,
    base: &Units<'a>,
    claimed: &mut HashMap<&'a str, &'a str>,
    mut by_size: Option<&mut HashSet<&'a str>>,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<Unit<'a>>>, PlanError> {
    let Some(units) = base.get(entry.source.as_str()) else {
        let have = if base.is_empty() {
            "none".to_string()
        } else {
            base.keys().cloned().collect::<Vec<_>>().join(", ")
        };
        let hint = if entry.source.as_str().starts_with("nvidia.com/mig-")
            && mig_strategy != MigStrategy::Mixed
        {
            format!(
                "; MIG profiles are resources only under migStrategy mixed (this policy: {})",
                mig_strategy.as_str()
            )
        } else {
            String::new()
        };
        warnings.push(format!(
            "{}.name: {} is not a resource of this node (here: {have}){hint}; entry ignored here",
            entry.path, entry.source
        ));
        return Ok(None);
    };
    let picked = select(entry, units, warnings);
    if picked.is_empty() {
        warnings.push(format!(
            "{}: matches no device on this node; nothing advertised as {}",
            entry.path, entry.advertised
        ));
        return Ok(None);
    }
    let sized = entry.memory.is_some();
    for u in &picked {
        let shares = sized && by_size.as_ref().is_some_and(|b| b.contains(u.uuid()));
        if let (true, Some(b)) = (sized, by_size.as_deref_mut()) {
            b.insert(u.uuid());
        }
        if shares {
            continue;
        }
        if let Some(first) = claimed.insert(u.uuid(), &entry.path) {
            return Err(match u.mig {
                None => PlanError::GpuClaimedTwice {
                    gpu: u.gpu.index,
                    uuid: u.gpu.uuid.clone(),
                    first: first.to_string(),
                    second: entry.path.clone(),
                },
                Some(m) => PlanError::MigClaimedTwice {
                    gpu: u.gpu.index,
                    mig: m.index,
                    uuid: m.uuid.clone(),
                    first: first.to_string(),
                    second: entry.path.clone(),
                },
            });
        }
    }
    Ok(Some(picked))
}

fn join_indices<'a>(gpus: impl IntoIterator<Item = &'a Gpu>) -> String {
    gpus.into_iter()
        .map(|g| g.index.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The node's resources under `strategy`, before any sharing.
pub(super) fn node_resources<'a>(
    strategy: MigStrategy,
    inv: &'a Inventory,
    warnings: &mut Vec<String>,
) -> Result<Units<'a>, PlanError> {
    let any_mig = inv.gpus.iter().any(|g| g.mig_enabled);
    let mut out = match strategy {
        MigStrategy::Single if any_mig => single_units(inv)?,
        MigStrategy::Mixed if any_mig => mixed_units(inv, warnings),
        // none, or single/mixed on a node without MIG-enabled GPUs (NVIDIA's fallback).
        _ => whole_gpu_units(inv, warnings),
    };
    for units in out.values_mut() {
        units.sort_by_key(Unit::order);
    }
    Ok(out)
}

/// migStrategy single on a node with MIG: every GPU MIG-enabled, with MIG devices, all of one
/// profile, each MIG device a unit of the whole-GPU resource.
fn single_units<'a>(inv: &'a Inventory) -> Result<Units<'a>, PlanError> {
    let mut out: Units<'a> = BTreeMap::new();
    let mut add = |name: String, u: Unit<'a>| out.entry(name).or_default().push(u);
    let (enabled, disabled): (Vec<&Gpu>, Vec<&Gpu>) = inv.gpus.iter().partition(|g| g.mig_enabled);
    if !disabled.is_empty() {
        return Err(PlanError::MigSingleModesDiffer {
            enabled: join_indices(enabled),
            disabled: join_indices(disabled),
        });
    }
    if let Some(g) = inv.gpus.iter().find(|g| g.mig_devices.is_empty()) {
        return Err(PlanError::MigSingleNoDevices {
            gpu: g.index,
            uuid: g.uuid.clone(),
        });
    }
    let mut profiles: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for g in &inv.gpus {
        for m in &g.mig_devices {
            profiles.entry(&m.profile).or_default().insert(g.index);
        }
    }
    if profiles.len() > 1 {
        let profiles = profiles
            .iter()
            .map(|(p, gpus)| {
                let list = gpus.iter().map(u32::to_string).collect::<Vec<_>>();
                let noun = if list.len() == 1 { "GPU" } else { "GPUs" };
                format!("{p} on {noun} {}", list.join(","))
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(PlanError::MigSingleProfiles { profiles });
    }
    for g in &inv.gpus {
        for m in &g.mig_devices {
            add(
                WHOLE_GPU_RESOURCE.to_string(),
                Unit {
                    gpu: g,
                    mig: Some(m),
                },
            );
        }
    }
    Ok(out)
}

/// The warning about a MIG-enabled GPU without MIG devices under migStrategy mixed (nothing is
/// advertised for it; the plan drops it for a dynamic MIG GPU, whose free space DRA publishes).
pub(super) fn empty_mig_warning(g: &Gpu) -> String {
    format!(
        "flags.migStrategy: GPU {} ({}) has MIG enabled and no MIG devices; nothing is advertised for it",
        g.index, g.uuid
    )
}

/// migStrategy mixed on a node with MIG: whole GPUs where MIG is off, each MIG device under
/// its profile's resource (warning about GPUs without MIG devices and profiles that make no
/// resource name).
fn mixed_units<'a>(inv: &'a Inventory, warnings: &mut Vec<String>) -> Units<'a> {
    let whole = |g: &'a Gpu| Unit { gpu: g, mig: None };
    let mut out: Units<'a> = BTreeMap::new();
    let mut add = |name: String, u: Unit<'a>| out.entry(name).or_default().push(u);
    for g in &inv.gpus {
        if !g.mig_enabled {
            add(WHOLE_GPU_RESOURCE.to_string(), whole(g));
            continue;
        }
        if g.mig_devices.is_empty() {
            warnings.push(empty_mig_warning(g));
        }
        for m in &g.mig_devices {
            let name = mig::resource_name(&m.profile);
            if ResourceName::parse(&name).is_err() {
                warnings.push(format!(
                        "flags.migStrategy: MIG device {}:{} ({}) has profile `{}`, which makes no valid resource name; not advertised",
                        g.index, m.index, m.uuid, m.profile
                    ));
                continue;
            }
            add(
                name,
                Unit {
                    gpu: g,
                    mig: Some(m),
                },
            );
        }
    }
    out
}

/// Every GPU whole (warning about the MIG-enabled ones).
fn whole_gpu_units<'a>(inv: &'a Inventory, warnings: &mut Vec<String>) -> Units<'a> {
    let whole = |g: &'a Gpu| Unit { gpu: g, mig: None };
    let mut out: Units<'a> = BTreeMap::new();
    let mut add = |name: String, u: Unit<'a>| out.entry(name).or_default().push(u);
    for g in &inv.gpus {
        if g.mig_enabled {
            warnings.push(format!(
                    "flags.migStrategy: GPU {} ({}) has MIG enabled, but migStrategy is none: it is advertised as a whole GPU (under {WHOLE_GPU_RESOURCE} or the entry sharing it) and containers get none of its MIG devices; use single or mixed",
                    g.index, g.uuid
                ));
        }
        add(WHOLE_GPU_RESOURCE.to_string(), whole(g));
    }
    out
}

/// The devices of one node resource an entry's `devices` selects, in (GPU index, MIG index)
/// order, warning about names this node lacks.
///
/// On a resource of MIG devices, a GPU index or GPU UUID selects every MIG device of that GPU
/// in the resource; `"<gpu>:<mig>"` and a MIG UUID select one.
fn select<'a>(
    entry: &SharedResource,
    units: &[Unit<'a>],
    warnings: &mut Vec<String>,
) -> Vec<Unit<'a>> {
    let path = format!("{}.devices", entry.path);
    let gpus_only = units.iter().all(|u| u.mig.is_none());
    let noun = if gpus_only { "GPUs" } else { "MIG devices" };
    match &entry.devices {
        DeviceSelector::All => units.to_vec(),
        DeviceSelector::Count(n) => {
            if *n as usize > units.len() {
                warnings.push(format!(
                    "{path}: asks for the first {n} {noun} of {}, this node has {}",
                    entry.source,
                    units.len()
                ));
            }
            units.iter().take(*n as usize).copied().collect()
        }
        DeviceSelector::List(refs) => {
            let mut out: Vec<Unit<'a>> = Vec::new();
            for r in refs {
                let matches: Vec<Unit<'a>> = units
                    .iter()
                    .filter(|u| match r {
                        DeviceRef::Index(i) => u.gpu.index == *i,
                        DeviceRef::Uuid(id) => u.uuid() == id || u.gpu.uuid == *id,
                        DeviceRef::MigIndex(g, m) => {
                            u.gpu.index == *g && u.mig.is_some_and(|d| d.index == *m)
                        }
                        DeviceRef::LegacyMig { gpu, gi, ci } => {
                            u.gpu.uuid == *gpu
                                && u.mig.is_some_and(|d| d.gi_id == *gi && d.ci_id == *ci)
                        }
                        DeviceRef::Unmatchable(_) => false,
                    })
                    .copied()
                    .collect();
                if matches.is_empty() {
                    let msg = if gpus_only
                        && !matches!(r, DeviceRef::MigIndex(..) | DeviceRef::LegacyMig { .. })
                    {
                        format!("{path}: this node has no GPU {r}")
                    } else {
                        format!(
                            "{path}: {r} matches no device of {} on this node",
                            entry.source
                        )
                    };
                    warnings.push(msg);
                    continue;
                }
                let before = out.len();
                for u in matches {
                    if !out.iter().any(|o| o.uuid() == u.uuid()) {
                        out.push(u);
                    }
                }
                if out.len() == before {
                    let what = if gpus_only { "a GPU" } else { "devices" };
                    warnings.push(format!("{path}: {r} names {what} listed already"));
                }
            }
            out.sort_by_key(Unit::order);
            out
        }
    }
}
