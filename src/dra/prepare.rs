//! The pure core of `NodePrepareResources`: a ResourceClaim as the API returned it, the plan
//! and what other prepared claims hold → the claim's devices, their CDI device IDs and the
//! transient CDI spec that carries the container edits. No I/O, no async.
//!
//! Rules (the kubelet's DRA manager and `resource.k8s.io/v1`):
//! - The claim fetched must have the UID the kubelet named (a claim deleted and re-created
//!   under the same name is another claim).
//! - Of its `status.allocation.devices.results`, the ones naming this driver are ours (a
//!   claim may also hold other drivers' devices; they prepare them). None at all is an error.
//! - Each must name this node's pool and a device the current plan publishes
//!   ([`super::slices::published`]: a DRA resource's device, by its DNS-label name) that is
//!   Healthy, and that no other prepared claim holds: a whole GPU, a MIG device and one
//!   replica are each one device, held by one claim at a time.
//! - The container edits are what the device plugin's Allocate gives a container for the same
//!   devices ([`crate::allocate::allocate`], per resource, merged): `NVIDIA_VISIBLE_DEVICES`
//!   and `CUDA_VISIBLE_DEVICES` with each GPU or MIG UUID once however many replicas of it the
//!   claim holds; for MPS the pipe directory mount, `/dev/shm` and the limits env; device
//!   nodes with `passDeviceSpecs`. Annotations have no place in DRA and are dropped; the
//!   `cdi-cri` strategy's CDI names (the node's `nvidia.com/gpu` spec) are returned as extra
//!   CDI device IDs.
//! - They go into one CDI spec per claim (kind `<driver>/claim`, by default
//!   `gpu.slicelet.io/claim`; file `<driver>-claim_<uid>.json`) with one CDI device named
//!   after the claim UID, so a name is never reused by another claim. Its ID
//!   (`gpu.slicelet.io/claim=<uid>`) is returned on the first device of each request, so a
//!   container that references any of the claim's requests gets the claim's edits exactly
//!   once (two CDI devices each setting `NVIDIA_VISIBLE_DEVICES` would overwrite each other).
//!   A container that references only some requests of a multi-request claim therefore sees
//!   every GPU of the claim; all of them are reserved for its pod.
//! - The pods the claim is reserved for (`status.reservedFor` entries of resource `pods` in the
//!   core API group: name and UID) are recorded with it ([`PreparedClaim::pods`]): GPU use
//!   attribution maps a process's pod UID (from its cgroup) to the claim through them
//!   ([`crate::usage::attribute`]). The kubelet prepares a claim only once it is reserved for
//!   the pod being started, so that pod is always among them.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::allocate::{self, AllocateError, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES};
use crate::health::Health;
use crate::plan::{Plan, ResourcePlan, VirtualDevice};

/// The CDI spec version written (the oldest with everything used here).
pub const CDI_VERSION: &str = "0.6.0";
/// The longest claim UID accepted, characters (Kubernetes UIDs are 36).
pub const MAX_UID: usize = 64;

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One prepared device, as `NodePrepareResourceResponse.devices[]` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests it was allocated for.
    pub requests: Vec<String>,
    /// The pool (this node).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// CDI device IDs the container runtime injects for it (empty on all but a request's
    /// first device; see the module docs).
    pub cdi_ids: Vec<String>,
    /// The device-plugin resource the device belongs to.
    pub resource: String,
    /// Its device ID in that resource (`<uuid>` or `<uuid>::<n>`).
    pub id: String,
}

/// A pod a claim is reserved for: one `status.reservedFor` entry of resource `pods`
/// (`resource.k8s.io/v1` `ResourceClaimConsumerReference`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReservedPod {
    /// The pod's name (in the claim's namespace: a pod references claims of its own namespace
    /// only).
    pub name: String,
    /// The pod's UID (`metadata.uid`, with dashes), as the pod's cgroup names it.
    pub uid: String,
}

/// The most reserving pods recorded per claim: the API's own limit on `status.reservedFor`
/// (`ResourceClaimReservedForMaxSize`, 256).
pub const MAX_RESERVED_FOR: usize = 256;

/// A prepared claim: what the checkpoint keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// The pods the claim was reserved for when it was prepared, in `reservedFor` order.
    /// Empty in a checkpoint a slicelet without this field wrote (missing reads as empty).
    #[serde(default)]
    pub pods: Vec<ReservedPod>,
    /// Its devices of this driver, in allocation order.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec file name (inside `--cdi-output-dir`).
    pub spec_file: String,
    /// The CDI spec (JSON).
    pub spec: Value,
}

/// Why a claim cannot be prepared: reported in the response's `error` for that claim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The claim UID is not a Kubernetes UID (it names files: refused before any use).
    #[error("claim {claim}: UID {uid:?} is not a UID (1-64 characters of a-z, 0-9, -)")]
    BadUid {
        /// `namespace/name`.
        claim: String,
        /// The UID, cut to 64 characters.
        uid: String,
    },
    /// The namespace is not a DNS label or the name not a DNS subdomain (they go into the
    /// API request's path: refused before any request).
    #[error("claim {namespace:?}/{name:?}: not a Kubernetes namespace (DNS label) and name (DNS subdomain, at most 253 characters)")]
    BadName {
        /// The namespace, cut to 64 characters.
        namespace: String,
        /// The name, cut to 64 characters.
        name: String,
    },
    /// The API has a claim of that name with another UID.
    #[error("claim {claim}: the API's claim of that name has UID {found}, not {want}")]
    UidMismatch {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The UID found.
        found: String,
        /// The UID the kubelet named.
        want: String,
    },
    /// The claim has no devices of this driver allocated.
    #[error("claim {claim}: its allocation names no device of driver {driver}")]
    NotAllocated {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// This driver.
        driver: String,
    },
    /// A device of another pool (another node's).
    #[error("claim {claim}: device {device} is in pool {pool}, not this node's pool {node}")]
    OtherPool {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// A device the plan does not publish.
    #[error("claim {claim}: device {device} is not a device of this node's DRA resources")]
    UnknownDevice {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
    },
    /// An Unhealthy device.
    #[error("claim {claim}: device {device} ({id}) is Unhealthy")]
    Unhealthy {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// Its device ID.
        id: String,
    },
    /// A device another prepared claim holds.
    #[error("claim {claim}: device {device} is held by prepared claim {holder}")]
    Held {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// The claim holding it.
        holder: String,
    },
    /// Allocate refused the devices (MPS replicas of two GPUs, say).
    #[error("claim {claim}: {source}")]
    Allocate {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// Allocate's error.
        source: AllocateError,
    },
}

/// Whether `uid` is safe in a file and CDI device name: 1–64 characters of `[a-z0-9-]`, not
/// starting with `-`.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= MAX_UID
        && !uid.starts_with('-')
        && uid
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Checks what the kubelet named before it is used in a path or an API request: the UID
/// ([`valid_uid`]), the namespace (a DNS label) and the name (a DNS subdomain of at most 253
/// characters).
///
/// # Errors
/// [`PrepareError::BadUid`] or [`PrepareError::BadName`].
pub fn check_claim_ref(c: &ClaimRef) -> Result<(), PrepareError> {
    let cut = |s: &str| s.chars().take(MAX_UID).collect::<String>();
    let namespace_ok = super::slices::is_dns_label(&c.namespace);
    let name_ok = !c.name.is_empty()
        && c.name.len() <= super::slices::MAX_OBJECT_NAME
        && crate::policy::names::is_dns_subdomain(&c.name);
    if !namespace_ok || !name_ok {
        return Err(PrepareError::BadName {
            namespace: cut(&c.namespace),
            name: cut(&c.name),
        });
    }
    if !valid_uid(&c.uid) {
        return Err(PrepareError::BadUid {
            claim: format!("{}/{}", c.namespace, c.name),
            uid: cut(&c.uid),
        });
    }
    Ok(())
}

/// The CDI kind of the claim specs: `<driver>/claim`.
pub fn cdi_kind(driver: &str) -> String {
    format!("{driver}/claim")
}

/// The claim spec's file name: `<driver>-claim_<uid>.json` ([`crate::cdi::claim_spec_file`],
/// which the CDI check skips).
pub fn spec_file(driver: &str, uid: &str) -> String {
    crate::cdi::claim_spec_file(driver, uid)
}

/// Prepares `want` from the API's `claim`.
///
/// `held`: device name → the claim (`namespace/name`) holding it, for every other prepared
/// claim. `dev_root`: the host's `/dev` root for device nodes (as for Allocate).
///
/// # Errors
/// [`PrepareError`] naming the claim and the device at fault.
pub fn prepare(
    claim: &ResourceClaim,
    want: &ClaimRef,
    plan: &Plan,
    node: &str,
    driver: &str,
    held: &BTreeMap<String, String>,
    dev_root: &str,
) -> Result<PreparedClaim, PrepareError> {
    check_claim_ref(want)?;
    let found = claim.metadata.uid.clone().unwrap_or_default();
    if found != want.uid {
        return Err(PrepareError::UidMismatch {
            claim: want.to_string(),
            found,
            want: want.uid.clone(),
        });
    }
    let results: Vec<_> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == driver)
        .collect();
    if results.is_empty() {
        return Err(PrepareError::NotAllocated {
            claim: want.to_string(),
            driver: driver.to_string(),
        });
    }
    // Every DRA device of the plan by name, Healthy or not (to tell unknown from Unhealthy).
    let mut by_name: BTreeMap<String, (&ResourcePlan, &VirtualDevice)> = BTreeMap::new();
    for res in super::slices::dra_resources(plan) {
        for d in &res.devices {
            by_name
                .entry(super::slices::device_name(&d.id))
                .or_insert((res, d));
        }
    }
    let mut devices: Vec<PreparedDevice> = Vec::new();
    let mut per_resource: BTreeMap<&str, (&ResourcePlan, Vec<String>)> = BTreeMap::new();
    for r in results {
        if r.pool != node {
            return Err(PrepareError::OtherPool {
                claim: want.to_string(),
                device: r.device.clone(),
                pool: r.pool.clone(),
                node: node.to_string(),
            });
        }
        let Some(&(res, d)) = by_name.get(&r.device) else {
            return Err(PrepareError::UnknownDevice {
                claim: want.to_string(),
                device: r.device.clone(),
            });
        };
        if d.health != Health::Healthy {
            return Err(PrepareError::Unhealthy {
                claim: want.to_string(),
                device: r.device.clone(),
                id: d.id.clone(),
            });
        }
        if let Some(holder) = holder_of(held, &r.device) {
            return Err(PrepareError::Held {
                claim: want.to_string(),
                device: r.device.clone(),
                holder: holder.clone(),
            });
        }
        // One device allocated for two requests (subrequests) is one device with two names.
        if let Some(p) = devices.iter_mut().find(|p| p.device == r.device) {
            if !p.requests.contains(&r.request) {
                p.requests.push(r.request.clone());
            }
            continue;
        }
        per_resource
            .entry(res.name.as_str())
            .or_insert_with(|| (res, Vec::new()))
            .1
            .push(d.id.clone());
        devices.push(PreparedDevice {
            requests: vec![r.request.clone()],
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_ids: Vec::new(),
            resource: res.name.to_string(),
            id: d.id.clone(),
        });
    }
    let mut edits = Edits::default();
    for (res, ids) in per_resource.values() {
        let a =
            allocate::allocate(res, ids, dev_root).map_err(|source| PrepareError::Allocate {
                claim: want.to_string(),
                source,
            })?;
        edits.merge(a);
    }
    let kind = cdi_kind(driver);
    let claim_id = format!("{kind}={}", want.uid);
    let mut seen_requests: Vec<String> = Vec::new();
    let extra = edits.cdi_devices.clone();
    for p in &mut devices {
        if p.requests.iter().any(|r| !seen_requests.contains(r)) {
            p.cdi_ids.push(claim_id.clone());
            p.cdi_ids.extend(extra.iter().cloned());
        }
        for r in &p.requests {
            if !seen_requests.contains(r) {
                seen_requests.push(r.clone());
            }
        }
    }
    Ok(PreparedClaim {
        claim: want.clone(),
        pods: reserved_pods(claim),
        devices,
        spec_file: spec_file(driver, &want.uid),
        spec: edits.spec(&kind, &want.uid),
    })
}

/// The pods `claim` is reserved for: its `status.reservedFor` entries of resource `pods` in
/// the core API group (empty or no `apiGroup`), each UID once, at most [`MAX_RESERVED_FOR`].
/// Other consumers (a `reservedFor` entry may name any resource) are left out.
pub fn reserved_pods(claim: &ResourceClaim) -> Vec<ReservedPod> {
    let mut out: Vec<ReservedPod> = Vec::new();
    let consumers = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten();
    for r in consumers {
        let core = r.api_group.as_deref().is_none_or(str::is_empty);
        if core && r.resource == "pods" && !out.iter().any(|p| p.uid == r.uid) {
            out.push(ReservedPod {
                name: r.name.clone(),
                uid: r.uid.clone(),
            });
        }
        if out.len() == MAX_RESERVED_FOR {
            break;
        }
    }
    out
}

/// The merged container edits of a claim.
#[derive(Debug, Default)]
struct Edits {
    env: BTreeMap<String, String>,
    mounts: Vec<allocate::MountSpec>,
    nodes: Vec<allocate::DeviceNode>,
    cdi_devices: Vec<String>,
}

impl Edits {
    fn merge(&mut self, a: allocate::ContainerAllocation) {
        for (k, v) in a.envs {
            match self.env.get_mut(&k) {
                Some(have) if k == NVIDIA_VISIBLE_DEVICES || k == CUDA_VISIBLE_DEVICES => {
                    for item in v.split(',') {
                        if !have.split(',').any(|h| h == item) {
                            have.push(',');
                            have.push_str(item);
                        }
                    }
                }
                _ => {
                    self.env.insert(k, v);
                }
            }
        }
        for m in a.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m);
            }
        }
        for n in a.device_nodes {
            if !self
                .nodes
                .iter()
                .any(|x| x.container_path == n.container_path)
            {
                self.nodes.push(n);
            }
        }
        for c in a.cdi_devices {
            if !self.cdi_devices.contains(&c) {
                self.cdi_devices.push(c);
            }
        }
    }

    fn spec(&self, kind: &str, uid: &str) -> Value {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mounts: Vec<Value> = self
            .mounts
            .iter()
            .map(|m| {
                json!({
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "type": "bind",
                    "options": ["rbind", if m.read_only { "ro" } else { "rw" }],
                })
            })
            .collect();
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "path": n.container_path,
                    "hostPath": n.host_path,
                    "permissions": n.permissions,
                })
            })
            .collect();
        let mut edits = json!({ "env": env });
        if !mounts.is_empty() {
            edits["mounts"] = Value::Array(mounts);
        }
        if !nodes.is_empty() {
            edits["deviceNodes"] = Value::Array(nodes);
        }
        json!({
            "cdiVersion": CDI_VERSION,
            "kind": kind,
            "devices": [{ "name": uid, "containerEdits": edits }],
        })
    }
}

/// The physical unit a device name stands for and whether it is a replica: `gpu-<uuid>-r<n>`
/// is replica `n` of `gpu-<uuid>` ([`crate::dra::slices::device_name`]'s forms; a UUID's hex
/// digits never contain `-r`); any other name is its own unit.
fn unit_of(name: &str) -> (&str, bool) {
    match name.rsplit_once("-r") {
        Some((unit, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => (unit, true),
        _ => (name, false),
    }
}

/// The prepared claim holding `device`, or one that conflicts with it: the same device, or the
/// same physical unit where either side has it whole (a whole GPU is exclusive; replicas of one
/// GPU are shared by design). The policy may have reshaped the GPU since that claim was
/// prepared, so names alone do not tell.
fn holder_of<'a>(held: &'a BTreeMap<String, String>, device: &str) -> Option<&'a String> {
    let (unit, replica) = unit_of(device);
    held.iter()
        .find(|(name, _)| {
            let (u, r) = unit_of(name);
            name.as_str() == device || (u == unit && !(r && replica))
        })
        .map(|(_, holder)| holder)
}
#[cfg(test)]
mod tests;
