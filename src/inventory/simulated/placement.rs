//! Where the MIG devices a node file lists sit on their GPU: the entry's `placementStart`,
//! checked against NVIDIA's table for the model ([`MigGeometry::from_table`]), else the first
//! free placements of their profiles, in file order and the table's order (a search that
//! backtracks, so a layout a driver could make is never refused because an earlier device
//! took a placement a later one needed).

use std::path::Path;

use super::invalid;
use crate::inventory::{InventoryError, MigDevice, MigGeometry, MigPlacement, MigProfileInfo};

/// One MIG device of the node file, laid out ([`MigDevice::laid_out`]) but not yet placed.
pub(super) struct Listed {
    /// The device; its `placement` is what [`place`] fills in.
    pub(super) device: MigDevice,
    /// Its memory in use, MiB.
    pub(super) used_mib: u64,
    /// Its entry in `mig.devices` (the `j` of `mig.devices[j]`).
    pub(super) entry: usize,
    /// The entry's `placementStart`.
    pub(super) start: Option<u32>,
}

pub(super) use crate::inventory::mig::gpu_instance_profile;

/// Gives every device of one GPU (the `gpus[i]` entry `at`, of `model`) its placement.
///
/// # Errors
/// [`InventoryError::SimulatedInvalid`] naming `{at}.mig.devices[j].profile` for a profile the
/// model's table does not have, `{at}.mig.devices[j].placementStart` for a start that is not
/// one of the profile's placements or overlaps an earlier device's, and `{at}.mig.devices`
/// for more instances of a profile than the driver allows or devices that fit at no
/// placements.
pub(super) fn place(
    path: &Path,
    at: &str,
    model: &str,
    geometry: &MigGeometry,
    devices: &mut [Listed],
) -> Result<(), InventoryError> {
    let rows = profile_rows(path, at, model, geometry, devices)?;
    check_instance_counts(path, at, model, &rows)?;
    let taken = place_given_starts(path, at, model, &rows, devices)?;
    place_free(path, at, model, &rows, devices, taken)
}

/// Each device's profile row in the model's table.
fn profile_rows<'g>(
    path: &Path,
    at: &str,
    model: &str,
    geometry: &'g MigGeometry,
    devices: &[Listed],
) -> Result<Vec<&'g MigProfileInfo>, InventoryError> {
    devices
        .iter()
        .map(|l| {
            geometry
                .profile(gpu_instance_profile(&l.device.profile))
                .ok_or_else(|| {
                    let offered: Vec<&str> = geometry
                        .profiles
                        .iter()
                        .map(|p| p.profile.as_str())
                        .collect();
                    invalid(
                        path,
                        &format!("{at}.mig.devices[{}].profile", l.entry),
                        format!(
                            "`{}` is not a MIG profile of {model} (it has {})",
                            l.device.profile,
                            offered.join(", ")
                        ),
                    )
                })
        })
        .collect()
}

/// Refuses more instances of a profile than the driver creates at once (`instance_count`).
fn check_instance_counts(
    path: &Path,
    at: &str,
    model: &str,
    rows: &[&MigProfileInfo],
) -> Result<(), InventoryError> {
    for row in rows {
        let n = rows.iter().filter(|r| r.profile == row.profile).count();
        if n > row.instance_count as usize {
            return Err(invalid(
                path,
                &format!("{at}.mig.devices"),
                format!(
                    "{n} instances of {}, more than the {} {model} has at once",
                    row.profile, row.instance_count
                ),
            ));
        }
    }
    Ok(())
}

/// The memory slices a placement covers, as bits of a mask.
fn mask(p: &MigPlacement) -> u64 {
    (p.start..p.start.saturating_add(p.size)).fold(0, |m, s| m | 1u64.checked_shl(s).unwrap_or(0))
}

/// Places the devices with a `placementStart`, checked; returns the memory slices they take.
fn place_given_starts(
    path: &Path,
    at: &str,
    model: &str,
    rows: &[&MigProfileInfo],
    devices: &mut [Listed],
) -> Result<u64, InventoryError> {
    let mut taken = 0u64;
    for k in 0..devices.len() {
        let Some(start) = devices[k].start else {
            continue;
        };
        let row = rows[k];
        let field = format!("{at}.mig.devices[{}].placementStart", devices[k].entry);
        let starts: Vec<String> = row.placements.iter().map(|p| p.start.to_string()).collect();
        let Some(p) = row.placements.iter().find(|p| p.start == start) else {
            return Err(invalid(
                path,
                &field,
                format!(
                    "{start} is not a placement of {} on {model} (its placements start at {})",
                    row.profile,
                    starts.join(", ")
                ),
            ));
        };
        let clash = devices[..k]
            .iter()
            .find(|o| o.device.placement.is_some_and(|q| q.overlaps(p)));
        if let Some(o) = clash {
            let q = o.device.placement.expect("found by its placement");
            return Err(invalid(
                path,
                &field,
                format!(
                    "{} at memory slices {}-{} overlaps mig.devices[{}] ({} at {}-{})",
                    row.profile,
                    p.start,
                    p.start + p.size - 1,
                    o.entry,
                    o.device.profile,
                    q.start,
                    q.start + q.size - 1
                ),
            ));
        }
        devices[k].device.placement = Some(*p);
        taken |= mask(p);
    }
    Ok(taken)
}

/// Places the devices without a `placementStart`: the first free placements in file order and
/// the table's order that let every device fit.
fn place_free(
    path: &Path,
    at: &str,
    model: &str,
    rows: &[&MigProfileInfo],
    devices: &mut [Listed],
    taken: u64,
) -> Result<(), InventoryError> {
    let free: Vec<usize> = (0..devices.len())
        .filter(|&k| devices[k].device.placement.is_none())
        .collect();
    let wanted: Vec<&MigProfileInfo> = free.iter().map(|&k| rows[k]).collect();
    let mut chosen = Vec::with_capacity(free.len());
    if !search(&wanted, taken, &mut chosen) {
        return Err(invalid(
            path,
            &format!("{at}.mig.devices"),
            format!("the MIG devices fit at no placements of {model} together"),
        ));
    }
    for (k, p) in free.into_iter().zip(chosen) {
        devices[k].device.placement = Some(p);
    }
    Ok(())
}

/// Depth-first: a placement for each of `rows` in order, none sharing a memory slice with
/// `taken` or another; at most 7 devices of at most 7 placements each.
fn search(rows: &[&MigProfileInfo], taken: u64, chosen: &mut Vec<MigPlacement>) -> bool {
    let Some(row) = rows.get(chosen.len()) else {
        return true;
    };
    for p in &row.placements {
        let m = mask(p);
        if taken & m != 0 {
            continue;
        }
        chosen.push(*p);
        if search(rows, taken | m, chosen) {
            return true;
        }
        chosen.pop();
    }
    false
}
