//! The names DRA publishes devices under (ResourceSlice `devices[].name`), from device-plugin
//! IDs: pure, so the drain rules can match a DRA claim's devices to the plan's IDs and
//! [`crate::dra::slices`] publishes the same names.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::{physical_uuid, Plan, ResourcePlan};
use crate::in_use::InUse;
use crate::inventory::{Inventory, MigPlacement};

/// The longest DNS label (a device name), characters.
pub const MAX_DNS_LABEL: usize = 63;

/// The DNS label a device ID is published under: `gpu-<uuid>` for a `GPU-<uuid>` unit,
/// `mig-<uuid>` for a `MIG-<uuid>` one, the UUID part lowercased, and `-r<n>` appended for
/// replica `n` (`<uuid>::<n>`). An ID that does not give a DNS label that way (other
/// characters, over 63 characters) is named `dev-<32 hex digits of SHA-256 of the ID>`.
/// Deterministic: the same ID always gives the same name.
pub fn device_name(id: &str) -> String {
    let uuid = physical_uuid(id);
    let replica = id.split_once("::").map(|(_, n)| n);
    let lower = uuid.to_ascii_lowercase();
    let base = if let Some(rest) = lower.strip_prefix("gpu-") {
        format!("gpu-{rest}")
    } else if let Some(rest) = lower.strip_prefix("mig-") {
        format!("mig-{rest}")
    } else {
        lower
    };
    let name = match replica {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{base}-r{n}")
        }
        Some(_) => String::new(),
        None => base,
    };
    if is_dns_label(&name) {
        name
    } else {
        format!("dev-{}", hex_digest(id, 16))
    }
}

/// The name of a dynamic MIG GPU's counter set: `gpu-<index>-mig`. No static name has this
/// form (a UUID's second part is hex, never `mig`).
pub fn dynamic_mig_counter_set(gpu_index: u32) -> String {
    format!("gpu-{gpu_index}-mig")
}

/// A MIG profile name as a DNS label part: lowercase, `.` and `+` turned into `-`
/// (`1g.10gb+me` → `1g-10gb-me`). NVIDIA's profile names have no `-`, so no two profiles of
/// one GPU give the same part.
pub fn profile_label(profile: &str) -> String {
    profile.to_ascii_lowercase().replace(['.', '+'], "-")
}

/// The name of the dynamic MIG device for `profile` at memory slice `start` of GPU
/// `gpu_index`: `gpu-<index>-mig-<profile label>-<start>` (`gpu-0-mig-3g-40gb-4`,
/// `gpu-1-mig-1g-10gb-me-6`); `None` when that is no DNS label (a profile with other
/// characters, over 63 characters). Deterministic; [`parse_dynamic_mig`] reads it back.
pub fn dynamic_mig_name(gpu_index: u32, profile: &str, start: u32) -> Option<String> {
    let name = format!("gpu-{gpu_index}-mig-{}-{start}", profile_label(profile));
    is_dns_label(&name).then_some(name)
}

/// What a dynamic MIG device name stands for: the GPU, the profile as NVIDIA names it and
/// the placement to create it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicMigDevice {
    /// The GPU's NVML index.
    pub gpu_index: u32,
    /// The GPU's `GPU-…` UUID.
    pub gpu_uuid: String,
    /// The profile, as the GPU's geometry names it (`3g.40gb`).
    pub profile: String,
    /// Where to create it (memory slices).
    pub placement: MigPlacement,
}

/// The dynamic MIG device `name` ([`dynamic_mig_name`]) stands for on `inventory`: the GPU
/// at its index, the profile of that GPU's geometry whose label it carries, and that
/// profile's placement starting at its start. `None` when `name` has another form, or the
/// GPU, its geometry, the profile or the placement is not there.
pub fn parse_dynamic_mig(name: &str, inventory: &Inventory) -> Option<DynamicMigDevice> {
    let rest = name.strip_prefix("gpu-")?;
    let (index, rest) = rest.split_once("-mig-")?;
    let (label, start) = rest.rsplit_once('-')?;
    // A number `parse` takes but the name would not carry (`+1`, `01`) fails the round trip
    // at the end.
    let (gpu_index, start): (u32, u32) = (index.parse().ok()?, start.parse().ok()?);
    let gpu = inventory.by_index(gpu_index)?;
    let profile = gpu
        .mig_geometry
        .as_ref()?
        .profiles
        .iter()
        .find(|p| profile_label(&p.profile) == label)?;
    let placement = *profile.placements.iter().find(|p| p.start == start)?;
    (dynamic_mig_name(gpu_index, &profile.profile, start).as_deref() == Some(name)).then(|| {
        DynamicMigDevice {
            gpu_index,
            gpu_uuid: gpu.uuid.clone(),
            profile: profile.profile.clone(),
            placement,
        }
    })
}

/// Whether `s` is a DNS label: 1–63 characters of `[a-z0-9-]`, alphanumeric at both ends
/// (RFC 1123, what Kubernetes checks device names against).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_DNS_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The first `bytes` bytes of SHA-256 of `text`, as lowercase hex.
pub fn hex_digest(text: &str, bytes: usize) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(bytes * 2);
    for b in &digest[..bytes] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// `in_use` with every DRA claim (pod-resources' `dynamic_resources`, by published device
/// name) also recorded under the device ID it names in `plan`'s DRA resources, so a device a
/// claim holds counts as held wherever holders are counted (metrics, `/status`, `slicelet
/// top`), exactly as a device-plugin holder does. Borrowed when no claim is reported.
pub fn with_claims<'a>(plan: &Plan, in_use: &'a InUse) -> Cow<'a, InUse> {
    if in_use.claimed.is_empty() {
        return Cow::Borrowed(in_use);
    }
    let mut out = in_use.clone();
    let dra = plan.resources.values().filter(|r| r.dra).map(|r| &**r);
    record_claims(dra, in_use, &BTreeSet::new(), &mut out);
    Cow::Owned(out)
}

/// Records in `out`, for every device of `resources` whose published name a claim of `in_use`
/// holds (a name `skip` lists excepted), those holders under the device's resource and ID;
/// returns the names found.
pub(crate) fn record_claims<'a>(
    resources: impl Iterator<Item = &'a ResourcePlan>,
    in_use: &InUse,
    skip: &BTreeSet<String>,
    out: &mut InUse,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for res in resources {
        for d in &res.devices {
            let name = device_name(&d.id);
            if skip.contains(&name) {
                continue;
            }
            if let Some(holders) = in_use.claimed.get(&name) {
                for h in holders {
                    out.insert(res.name.as_str(), &d.id, h.clone());
                }
                found.insert(name);
            }
        }
    }
    found
}
