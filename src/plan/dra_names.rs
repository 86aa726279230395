//! The names DRA publishes devices under (ResourceSlice `devices[].name`), from device-plugin
//! IDs: pure, so the drain rules can match a DRA claim's devices to the plan's IDs and
//! [`crate::dra::slices`] publishes the same names.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::{physical_uuid, Plan, ResourcePlan};
use crate::in_use::InUse;

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
