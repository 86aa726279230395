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
//!   ([`super::pool::published`]: a DRA resource's device, by its DNS-label name) that is
//!   Healthy, and that no other prepared claim holds: a whole GPU, a MIG device and one
//!   replica are each one device, held by one claim at a time.
//! - A consumable-capacity device is shared instead: each allocation result naming it is one
//!   share (its `shareID` and `consumedCapacity`), recorded and answered on its own, and all
//!   of the claim's shares of the device together must fit what the other prepared claims'
//!   shares leave of it (a claim may hold two: two requests, or `count: 2`).
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

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::allocate::{self, AllocateError, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES};
use crate::device_health::Health;
use crate::inventory::{Inventory, MigPlacement};
use crate::plan::{CapacityPlan, Plan, ResourcePlan, Strategy, VirtualDevice};

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
    /// On a consumable-capacity device: the allocation's share and what it consumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<Share>,
}

/// One claim's share of a consumable-capacity device (KEP-5075): the scheduler's
/// `shareID` and `consumedCapacity` (the request, or the capacity's default share).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    /// `status.allocation.devices.results[].shareID` (empty when the API gave none).
    pub id: String,
    /// Memory, MiB (the consumed quantity rounded up to whole MiB).
    pub memory_mib: u64,
    /// Percent of the unit's SMs (a whole number from 1 to 100).
    pub cores: u32,
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
    /// The CDI spec (JSON); `null` in a record rebuilt from the API.
    pub spec: Value,
    /// Rebuilt from the API's allocation ([`super::checkpoint::rebuild`]) because the
    /// checkpoint could not be used: the claim holds its devices, but its answer and spec are
    /// not known, so a `NodePrepareResources` for it prepares it afresh. Left out of the file
    /// when false (so an older slicelet reads the checkpoint as before).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilt: bool,
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
    /// The claim's shares of a device do not fit what it has left (the other prepared shares
    /// and the claim's, together, ask for more memory or cores than the unit has).
    #[error("claim {claim}: device {device}: the claim asks {want}, but the unit has {total} and other prepared claims hold {used} (the policy may have changed since scheduling)")]
    ShareDoesNotFit {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// What the claim's shares of the device ask together, e.g. `20480 MiB of memory` or
        /// `46080 MiB of memory in 2 shares`.
        want: String,
        /// The unit's capacity, e.g. `81559 MiB`.
        total: String,
        /// What other shares hold, e.g. `61440 MiB`.
        used: String,
    },
    /// A consumed capacity that is not a quantity this driver reads.
    #[error("claim {claim}: device {device}: consumedCapacity {name}: {value:?} is not a quantity of {unit}")]
    BadCapacity {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// The capacity's name.
        name: String,
        /// The value, cut to 64 characters.
        value: String,
        /// What it should be.
        unit: &'static str,
    },
    /// A consumed capacity outside the `validRange` the slice publishes for it (memory at
    /// least 1Mi; cores a whole percent from 1 to 100): the scheduler allocates no such share,
    /// so it is refused rather than rounded into one (a 0 MiB or 0 % share).
    #[error("claim {claim}: device {device}: consumedCapacity {name} {value:?} is outside the slice's validRange ({range})")]
    CapacityOutOfRange {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// The capacity's name.
        name: String,
        /// The value, cut to 64 characters.
        value: String,
        /// The range published, e.g. `1 to 100 in steps of 1`.
        range: String,
    },
    /// A dynamic MIG device whose placement overlaps a MIG device that exists and no claim
    /// created (a static one): the driver would refuse the create.
    #[error("claim {claim}: device {device}: its placement overlaps the MIG device at memory slices {start}..{} on its GPU (a static MIG device; the scheduler's view is behind)", start + size)]
    PlacementTaken {
        /// The claim (`namespace/name (uid)`).
        claim: String,
        /// The device.
        device: String,
        /// The static device's first memory slice.
        start: u32,
        /// Its size, memory slices.
        size: u32,
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
    let namespace_ok = crate::plan::dra_names::is_dns_label(&c.namespace);
    let name_ok = !c.name.is_empty()
        && c.name.len() <= super::slices::MAX_OBJECT_NAME
        && crate::policy::is_dns_subdomain(&c.name);
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

/// What other prepared claims hold, by published device name: whole devices and replicas
/// (exclusive) and shares of consumable-capacity devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Device name → the claim (`namespace/name`) holding it exclusively.
    pub exclusive: BTreeMap<String, String>,
    /// Device name → each other claim's share of it: (`namespace/name`, the share).
    pub shares: BTreeMap<String, Vec<(String, Share)>>,
    /// The dynamic MIG devices other claims hold or are being created for (their placements
    /// may overlap a device of another name).
    pub dynamic_mig: Vec<HeldMig>,
}

/// A dynamic MIG device another claim holds ([`super::checkpoint::MigRecord`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldMig {
    /// The parent GPU's UUID.
    pub gpu_uuid: String,
    /// Its placement.
    pub placement: MigPlacement,
    /// The claim (`namespace/name`).
    pub holder: String,
}

/// What a claim is prepared against: the node's plan and inventory and how it serves DRA.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The plan (its DRA resources).
    pub plan: &'a Plan,
    /// The inventory the plan was built from (units' memory, the driver, cgroups).
    pub inventory: &'a Inventory,
    /// This node: the pool's name.
    pub node: &'a str,
    /// This driver's name.
    pub driver: &'a str,
    /// The host's `/dev` root for device nodes (as for Allocate).
    pub dev_root: &'a str,
    /// The hook that sets a container's GPU memory limit ([`crate::cdi::memory`]), for shares
    /// on nodes whose driver partitions memory per cgroup (R615 and later, cgroup v2); `None`:
    /// shares are not given a hook.
    pub memory_hook: Option<&'a crate::cdi::memory::HookConfig>,
}

/// Prepares `want` from the API's `claim` against `ctx`; `held`: what every other prepared
/// claim holds. A claim with dynamic MIG devices needs them created first: [`stage`], create,
/// then [`Staged::finish`] (here they are left without a MIG device).
///
/// # Errors
/// [`PrepareError`] naming the claim and the device at fault.
pub fn prepare(
    claim: &ResourceClaim,
    want: &ClaimRef,
    ctx: &Context<'_>,
    held: &Held,
) -> Result<PreparedClaim, PrepareError> {
    Ok(stage(claim, want, ctx, held)?.finish(&BTreeMap::new()))
}

/// A dynamic MIG device a claim's allocation names ([`crate::plan::dra_names::parse_dynamic_mig`]),
/// checked: the plugin creates it, then [`Staged::finish`] gives the claim its UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicPick {
    /// The published device name (`gpu-<i>-mig-<profile>-<start>`).
    pub device: String,
    /// The parent GPU's `GPU-…` UUID.
    pub gpu_uuid: String,
    /// The profile as NVIDIA names it.
    pub profile: String,
    /// Where to create it (memory slices).
    pub placement: MigPlacement,
}

/// A claim checked and its container edits made, but for its dynamic MIG devices, which are
/// not there yet ([`stage`]).
#[derive(Debug)]
pub struct Staged {
    /// The claim (its devices in allocation order; a dynamic one's `id` is empty until
    /// [`Staged::finish`]).
    claim: PreparedClaim,
    edits: Edits,
    /// The claim specs' CDI kind ([`cdi_kind`]).
    kind: String,
    /// The dynamic MIG devices to create first, in allocation order, each once.
    pub dynamic: Vec<DynamicPick>,
}

/// Checks `want` from the API's `claim` against `ctx` (`held`: what every other prepared claim
/// holds) and makes the container edits of its static devices; its dynamic MIG devices are
/// checked ([`dynamic_device`]) and listed for the plugin to create.
///
/// # Errors
/// [`PrepareError`] naming the claim and the device at fault.
pub fn stage(
    claim: &ResourceClaim,
    want: &ClaimRef,
    ctx: &Context<'_>,
    held: &Held,
) -> Result<Staged, PrepareError> {
    let driver = ctx.driver;
    check_claim_ref(want)?;
    let results = allocated_results(claim, want, driver)?;
    let by_name = dra_devices_by_name(ctx.plan);
    let mut picked = Picked::default();
    for r in results {
        if let Some(m) = dynamic_device(want, r, ctx, held)? {
            picked.add_dynamic(r, m);
            continue;
        }
        let (res, d) = checked_device(want, r, ctx.node, &by_name, held)?;
        picked.add(want, r, res, d, ctx)?;
    }
    let Picked {
        devices,
        capacity_mib,
        per_resource,
        dynamic,
    } = picked;
    for (&device, &total_mib) in &capacity_mib {
        check_fit(want, device, total_mib, &devices, held)?;
    }
    let mut edits = Edits::default();
    for (res, ids) in per_resource.values() {
        let a = allocate::allocate(res, ids, ctx.dev_root).map_err(|source| {
            PrepareError::Allocate {
                claim: want.to_string(),
                source,
            }
        })?;
        edits.merge(a);
    }
    edits.apply_shares(&devices, ctx);
    Ok(Staged {
        claim: PreparedClaim {
            claim: want.clone(),
            pods: reserved_pods(claim),
            devices,
            spec_file: spec_file(driver, &want.uid),
            rebuilt: false,
            spec: Value::Null,
        },
        edits,
        kind: cdi_kind(driver),
        dynamic,
    })
}

impl Staged {
    /// The prepared claim once its dynamic MIG devices exist: `created` maps each one's device
    /// name to its `MIG-…` UUID, which becomes the device's ID and is added to
    /// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` (a static MIG device's edits); the
    /// CDI IDs assigned and the spec written out.
    pub fn finish(self, created: &BTreeMap<String, String>) -> PreparedClaim {
        let Staged {
            mut claim,
            mut edits,
            kind,
            dynamic: _,
        } = self;
        for d in &mut claim.devices {
            let Some(uuid) = created.get(&d.device).filter(|_| d.id.is_empty()) else {
                continue;
            };
            d.id.clone_from(uuid);
            edits.merge(allocate::ContainerAllocation {
                envs: BTreeMap::from([
                    (NVIDIA_VISIBLE_DEVICES.to_string(), uuid.clone()),
                    (CUDA_VISIBLE_DEVICES.to_string(), uuid.clone()),
                ]),
                ..allocate::ContainerAllocation::default()
            });
        }
        assign_cdi_ids(
            &mut claim.devices,
            &format!("{kind}={}", claim.claim.uid),
            &edits.cdi_devices,
        );
        claim.spec = edits.spec(&kind, &claim.claim.uid);
        claim
    }
}

/// The dynamic MIG device allocation result `r` names, checked; `None` when `r` is of another
/// pool or names no dynamic MIG device of `ctx.inventory` (the static checks answer then).
/// Rules: its GPU is one the plan partitions on demand ([`Plan::dynamic_mig`]) and Healthy in
/// the plan (an Xid the daemon folded in) and the inventory (what the slices leave untainted), its placement overlaps no static MIG device (the
/// plan's `occupied`), and no other claim holds it or a device overlapping it on that GPU
/// (exclusive, like a MIG device).
///
/// # Errors
/// [`PrepareError::UnknownDevice`], [`PrepareError::Unhealthy`],
/// [`PrepareError::PlacementTaken`] or [`PrepareError::Held`].
fn dynamic_device(
    want: &ClaimRef,
    r: &DeviceRequestAllocationResult,
    ctx: &Context<'_>,
    held: &Held,
) -> Result<Option<DynamicPick>, PrepareError> {
    if r.pool != ctx.node {
        return Ok(None);
    }
    let Some(m) = crate::plan::dra_names::parse_dynamic_mig(&r.device, ctx.inventory) else {
        return Ok(None);
    };
    let Some(g) = ctx.plan.dynamic_mig.iter().find(|g| g.uuid == m.gpu_uuid) else {
        return Err(PrepareError::UnknownDevice {
            claim: want.to_string(),
            device: r.device.clone(),
        });
    };
    let healthy = g.health == Health::Healthy
        && ctx
            .inventory
            .by_uuid(&m.gpu_uuid)
            .is_some_and(|gpu| gpu.health == Health::Healthy);
    if !healthy {
        return Err(PrepareError::Unhealthy {
            claim: want.to_string(),
            device: r.device.clone(),
            id: m.gpu_uuid,
        });
    }
    if let Some(o) = g.occupied.iter().find(|o| o.overlaps(&m.placement)) {
        return Err(PrepareError::PlacementTaken {
            claim: want.to_string(),
            device: r.device.clone(),
            start: o.start,
            size: o.size,
        });
    }
    let overlapping = held
        .dynamic_mig
        .iter()
        .find(|h| h.gpu_uuid == m.gpu_uuid && h.placement.overlaps(&m.placement))
        .map(|h| &h.holder);
    if let Some(holder) = holder_of(&held.exclusive, &r.device).or(overlapping) {
        return Err(PrepareError::Held {
            claim: want.to_string(),
            device: r.device.clone(),
            holder: holder.clone(),
        });
    }
    Ok(Some(DynamicPick {
        device: r.device.clone(),
        gpu_uuid: m.gpu_uuid,
        profile: m.profile,
        placement: m.placement,
    }))
}

/// The claim's allocation results for `driver`, once its UID is `want`'s.
///
/// # Errors
/// [`PrepareError::UidMismatch`], or [`PrepareError::NotAllocated`] when no result is this
/// driver's.
fn allocated_results<'c>(
    claim: &'c ResourceClaim,
    want: &ClaimRef,
    driver: &str,
) -> Result<Vec<&'c DeviceRequestAllocationResult>, PrepareError> {
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
    Ok(results)
}

/// Every DRA device of the plan by name, Healthy or not (to tell unknown from Unhealthy).
fn dra_devices_by_name(plan: &Plan) -> BTreeMap<String, (&ResourcePlan, &VirtualDevice)> {
    let mut by_name: BTreeMap<String, (&ResourcePlan, &VirtualDevice)> = BTreeMap::new();
    for res in super::slices::dra_resources(plan) {
        for d in &res.devices {
            by_name
                .entry(crate::plan::dra_names::device_name(&d.id))
                .or_insert((res, d));
        }
    }
    by_name
}

/// The plan's resource and device for allocation result `r`, once it is in this node's pool,
/// known, Healthy and held by no other claim.
///
/// # Errors
/// [`PrepareError::OtherPool`], [`PrepareError::UnknownDevice`], [`PrepareError::Unhealthy`]
/// or [`PrepareError::Held`].
fn checked_device<'p>(
    want: &ClaimRef,
    r: &DeviceRequestAllocationResult,
    node: &str,
    by_name: &BTreeMap<String, (&'p ResourcePlan, &'p VirtualDevice)>,
    held: &Held,
) -> Result<(&'p ResourcePlan, &'p VirtualDevice), PrepareError> {
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
    if let Some(holder) = holder_of(&held.exclusive, &r.device)
        .or_else(|| shared_holder_of(held, &r.device, res.capacity.is_some()))
    {
        return Err(PrepareError::Held {
            claim: want.to_string(),
            device: r.device.clone(),
            holder: holder.clone(),
        });
    }
    Ok((res, d))
}

/// The devices a claim's results pick, as they are added.
#[derive(Default)]
struct Picked<'a> {
    /// One per device, or per share of a consumable-capacity device.
    devices: Vec<PreparedDevice>,
    /// Each consumable-capacity device of the claim → its unit's memory, MiB.
    capacity_mib: BTreeMap<&'a str, u64>,
    /// Resource name → its plan and the device IDs picked of it.
    per_resource: BTreeMap<&'a str, (&'a ResourcePlan, Vec<String>)>,
    /// The dynamic MIG devices picked, each once.
    dynamic: Vec<DynamicPick>,
}

impl<'a> Picked<'a> {
    /// Adds result `r` on dynamic MIG device `m`: one device (a second request for it adds
    /// its name), its ID empty until it is created.
    fn add_dynamic(&mut self, r: &DeviceRequestAllocationResult, m: DynamicPick) {
        if let Some(p) = self.devices.iter_mut().find(|p| p.device == r.device) {
            if !p.requests.contains(&r.request) {
                p.requests.push(r.request.clone());
            }
            return;
        }
        self.devices.push(PreparedDevice {
            requests: vec![r.request.clone()],
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_ids: Vec::new(),
            resource: String::new(),
            id: String::new(),
            share: None,
        });
        self.dynamic.push(m);
    }

    /// Adds result `r` on the plan's `res`/`d`. One device allocated for two requests
    /// (subrequests) is one device with two names; each result on a consumable-capacity device
    /// is a share of its own, with its own ID.
    ///
    /// # Errors
    /// What [`share_of`] finds wrong with the capacity `r` consumes.
    fn add(
        &mut self,
        want: &ClaimRef,
        r: &'a DeviceRequestAllocationResult,
        res: &'a ResourcePlan,
        d: &VirtualDevice,
        ctx: &Context<'_>,
    ) -> Result<(), PrepareError> {
        let share = match res.capacity {
            Some(c) => {
                let total_mib = super::slices::unit_memory_mib(d, ctx.inventory).unwrap_or(0);
                self.capacity_mib.insert(r.device.as_str(), total_mib);
                Some(share_of(want, r, c, total_mib)?)
            }
            None => None,
        };
        if share.is_none() {
            if let Some(p) = self.devices.iter_mut().find(|p| p.device == r.device) {
                if !p.requests.contains(&r.request) {
                    p.requests.push(r.request.clone());
                }
                return Ok(());
            }
        }
        let ids = &mut self
            .per_resource
            .entry(res.name.as_str())
            .or_insert_with(|| (res, Vec::new()))
            .1;
        if !ids.contains(&d.id) {
            ids.push(d.id.clone());
        }
        self.devices.push(PreparedDevice {
            requests: vec![r.request.clone()],
            pool: r.pool.clone(),
            device: r.device.clone(),
            cdi_ids: Vec::new(),
            resource: res.name.to_string(),
            id: d.id.clone(),
            share,
        });
        Ok(())
    }
}

/// Gives the claim's CDI device (`claim_id`) and the allocation's `extra` CDI devices to the
/// first device of each request.
fn assign_cdi_ids(devices: &mut [PreparedDevice], claim_id: &str, extra: &[String]) {
    let mut seen_requests: Vec<String> = Vec::new();
    for p in devices {
        if p.requests.iter().any(|r| !seen_requests.contains(r)) {
            p.cdi_ids.push(claim_id.to_string());
            p.cdi_ids.extend(extra.iter().cloned());
        }
        for r in &p.requests {
            if !seen_requests.contains(r) {
                seen_requests.push(r.clone());
            }
        }
    }
}

/// Why a consumed capacity is not taken.
enum BadQuantity {
    /// Not a Kubernetes quantity.
    NotAQuantity,
    /// A quantity outside the published `validRange`.
    OutOfRange,
}

/// A consumed `memory` quantity as whole MiB, rounded up (`20Gi` → 20480, `1.5Mi` → 2), when
/// it lies in the slice's `validRange` (at least [`super::slices::MEMORY_MIN_MIB`] MiB,
/// compared exactly before rounding: `0.5`, `1e-3` and `1048575` bytes are below it).
fn quantity_mib(q: &str) -> Result<u64, BadQuantity> {
    use crate::policy::quantity::{parse_fraction, QuantityError, MIB};
    let f = match parse_fraction(q) {
        Ok(f) => f,
        Err(QuantityError::NotAQuantity(_)) => return Err(BadQuantity::NotAQuantity),
        Err(_) => return Err(BadQuantity::OutOfRange),
    };
    if f.floor() < u128::from(super::slices::MEMORY_MIN_MIB) * MIB {
        return Err(BadQuantity::OutOfRange);
    }
    u64::try_from(f.ceil().div_ceil(MIB)).map_err(|_| BadQuantity::OutOfRange)
}

/// A consumed `cores` quantity as a percent, when it lies in the slice's `validRange`: a whole
/// number from [`super::slices::CORES_MIN`] to [`super::slices::CORES_MAX`] (step 1; `1000m`
/// is 1, `250m` and `0.9` are refused, never rounded).
fn quantity_cores(q: &str) -> Result<u32, BadQuantity> {
    use super::slices::{CORES_MAX, CORES_MIN, CORES_STEP};
    use crate::policy::quantity::{parse_fraction, QuantityError};
    let f = match parse_fraction(q) {
        Ok(f) => f,
        Err(QuantityError::NotAQuantity(_)) => return Err(BadQuantity::NotAQuantity),
        Err(_) => return Err(BadQuantity::OutOfRange),
    };
    let v = f.floor();
    if !f.is_whole()
        || v < u128::from(CORES_MIN)
        || v > u128::from(CORES_MAX)
        || !(v - u128::from(CORES_MIN)).is_multiple_of(u128::from(CORES_STEP))
    {
        return Err(BadQuantity::OutOfRange);
    }
    u32::try_from(v).map_err(|_| BadQuantity::OutOfRange)
}

/// The share allocation `r` holds of a capacity device (of a resource with `c`, on a unit of
/// `total_mib` MiB): the consumed capacity the scheduler recorded (the capacity's default
/// share where it recorded none). Whether it fits is [`check_fit`]'s, over all of the claim's
/// shares of the device.
fn share_of(
    want: &ClaimRef,
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
    c: CapacityPlan,
    total_mib: u64,
) -> Result<Share, PrepareError> {
    let shares = u64::from(c.shares.max(1));
    let consumed = r.consumed_capacity.as_ref();
    let get = |name: &str| consumed.and_then(|m| m.get(name)).map(|q| q.0.as_str());
    let bad = |name: &str, value: &str, why: BadQuantity, unit, range: String| match why {
        BadQuantity::NotAQuantity => PrepareError::BadCapacity {
            claim: want.to_string(),
            device: r.device.clone(),
            name: name.to_string(),
            value: value.chars().take(64).collect(),
            unit,
        },
        BadQuantity::OutOfRange => PrepareError::CapacityOutOfRange {
            claim: want.to_string(),
            device: r.device.clone(),
            name: name.to_string(),
            value: value.chars().take(64).collect(),
            range,
        },
    };
    let memory_mib = match get(super::slices::MEMORY) {
        Some(v) => quantity_mib(v).map_err(|why| {
            let range = format!("at least {}Mi", super::slices::MEMORY_MIN_MIB);
            bad(super::slices::MEMORY, v, why, "bytes", range)
        })?,
        None => (total_mib / shares).max(super::slices::MEMORY_MIN_MIB),
    };
    let cores = match get(super::slices::CORES) {
        Some(v) => quantity_cores(v).map_err(|why| {
            use super::slices::{CORES_MAX, CORES_MIN, CORES_STEP};
            let range = format!("{CORES_MIN} to {CORES_MAX} in steps of {CORES_STEP}");
            bad(super::slices::CORES, v, why, "percent", range)
        })?,
        None => (super::slices::CORES_MAX / c.shares.max(1)).max(super::slices::CORES_MIN),
    };
    Ok(Share {
        id: r.share_id.clone().unwrap_or_default(),
        memory_mib,
        cores,
    })
}

/// The share allocation `r` records (its `shareID` and `consumedCapacity`), for a record
/// rebuilt from the API: a consumed capacity missing or not read counts as 0 (the claim holds
/// a share of the device all the same).
pub(crate) fn recorded_share(
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> Option<Share> {
    if r.share_id.is_none() && r.consumed_capacity.is_none() {
        return None;
    }
    let consumed = r.consumed_capacity.as_ref();
    let get = |name: &str| consumed.and_then(|m| m.get(name)).map(|q| q.0.as_str());
    Some(Share {
        id: r.share_id.clone().unwrap_or_default(),
        memory_mib: get(super::slices::MEMORY)
            .and_then(|v| quantity_mib(v).ok())
            .unwrap_or(0),
        cores: get(super::slices::CORES)
            .and_then(|v| quantity_cores(v).ok())
            .unwrap_or(0),
    })
}

/// Whether the claim's shares of capacity device `device` (a unit of `total_mib` MiB and 100 %
/// of the cores), all of them together, fit what the other prepared claims' shares leave.
fn check_fit(
    want: &ClaimRef,
    device: &str,
    total_mib: u64,
    devices: &[PreparedDevice],
    held: &Held,
) -> Result<(), PrepareError> {
    let mine: Vec<&Share> = devices
        .iter()
        .filter(|p| p.device == device)
        .filter_map(|p| p.share.as_ref())
        .collect();
    let memory_mib: u64 = mine.iter().map(|s| s.memory_mib).sum();
    let cores: u32 = mine.iter().map(|s| s.cores).sum();
    let others = held
        .shares
        .get(device)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let used_mib: u64 = others.iter().map(|(_, s)| s.memory_mib).sum();
    let used_cores: u32 = others.iter().map(|(_, s)| s.cores).sum();
    let in_shares = match mine.len() {
        1 => String::new(),
        n => format!(" in {n} shares"),
    };
    if used_mib.saturating_add(memory_mib) > total_mib {
        return Err(PrepareError::ShareDoesNotFit {
            claim: want.to_string(),
            device: device.to_string(),
            want: format!("{memory_mib} MiB of memory{in_shares}"),
            total: format!("{total_mib} MiB"),
            used: format!("{used_mib} MiB"),
        });
    }
    if used_cores.saturating_add(cores) > 100 {
        return Err(PrepareError::ShareDoesNotFit {
            claim: want.to_string(),
            device: device.to_string(),
            want: format!("{cores} % of the cores{in_shares}"),
            total: "100 %".to_string(),
            used: format!("{used_cores} %"),
        });
    }
    Ok(())
}

/// A claim holding shares of `device`'s unit, when `device` is not itself a capacity device
/// (`capacity` false): shares and whole or replica holders of one unit never mix, whatever the
/// policy became since. (Shares of a capacity device are checked for fit instead, and its
/// whole or replica holders by [`holder_of`] over the exclusive ones.)
fn shared_holder_of<'a>(held: &'a Held, device: &str, capacity: bool) -> Option<&'a String> {
    if capacity {
        return None;
    }
    let (unit, _) = unit_of(device);
    held.shares
        .iter()
        .find(|(name, list)| unit_of(name).0 == unit && !list.is_empty())
        .and_then(|(_, list)| list.first().map(|(h, _)| h))
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

/// A claim's shares of one GPU, summed ([`Edits::apply_shares`]).
#[derive(Debug, Default)]
struct GpuShares<'a> {
    /// The GPU's (or MIG device's) UUID.
    gpu: &'a str,
    /// The shares' memory, MiB.
    memory_mib: u64,
    /// The shares' cores, percent of the unit's SMs.
    cores: u32,
    /// Whether the shares are of an MPS device (the client's limits are theirs).
    mps: bool,
    /// Whether the driver takes a memory limit for the GPU and the hook is installed.
    limited: bool,
}

/// The merged container edits of a claim.
#[derive(Debug, Default)]
struct Edits {
    env: BTreeMap<String, String>,
    mounts: Vec<allocate::MountSpec>,
    nodes: Vec<allocate::DeviceNode>,
    cdi_devices: Vec<String>,
    /// `createContainer` hooks (a share's memory limit), as CDI `hooks` entries.
    hooks: Vec<Value>,
}

impl Edits {
    /// A claim's shares of consumable-capacity devices, summed per GPU (a claim may hold
    /// several shares of one GPU: two requests, or `count: 2`): on an MPS device the sum of
    /// its shares' cores and memory become its client's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
    /// and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (the daemon's defaults are the whole unit, so the
    /// client's own values are what hold); on a node whose driver partitions memory per cgroup
    /// the sum of a GPU's shares' memory is also the container's hard limit there, set by one
    /// hook per GPU (NVML keeps one limit per GPU and cgroup), and
    /// `SLICELET_GPU_MEMORY_LIMIT_MIB` says it (MiB; set where every limited GPU of
    /// the claim has the same limit). `SLICELET_GPU_SHARE_MEMORY_MIB` (MiB) /
    /// `SLICELET_GPU_SHARE_CORES` (percent) tell the workload all its shares whatever the mode
    /// (time-slicing only accounts for them).
    fn apply_shares(&mut self, devices: &[PreparedDevice], ctx: &Context<'_>) {
        let mut memory = 0u64;
        let mut cores = 0u32;
        let mut per_gpu: Vec<GpuShares<'_>> = Vec::new();
        for p in devices {
            let Some(s) = &p.share else { continue };
            memory = memory.saturating_add(s.memory_mib);
            cores = cores.saturating_add(s.cores);
            let Some(res) = ctx.plan.resources.get(&p.resource) else {
                continue;
            };
            let Some(d) = res.device(&p.id) else { continue };
            let g = match per_gpu.iter().position(|g| g.gpu == d.gpu_uuid) {
                Some(i) => &mut per_gpu[i],
                None => {
                    per_gpu.push(GpuShares {
                        gpu: &d.gpu_uuid,
                        ..GpuShares::default()
                    });
                    per_gpu.last_mut().expect("just pushed")
                }
            };
            g.memory_mib = g.memory_mib.saturating_add(s.memory_mib);
            g.cores = g.cores.saturating_add(s.cores);
            g.mps |= res.strategy == Strategy::Mps;
            g.limited |= ctx.memory_hook.is_some()
                && crate::plan::memory::unenforceable(ctx.inventory, d, true, true).is_none();
        }
        let mut hooks = Vec::new();
        let mut limits: Vec<u64> = Vec::new();
        for g in &per_gpu {
            if g.mps {
                self.env.insert(
                    allocate::CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.to_string(),
                    g.cores.to_string(),
                );
                self.env.insert(
                    allocate::CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.to_string(),
                    format!("0={}M", g.memory_mib),
                );
            }
            if let (true, Some(config)) = (g.limited, ctx.memory_hook) {
                hooks.push(crate::cdi::memory::hook(
                    config,
                    g.gpu,
                    g.memory_mib,
                    0,
                    crate::policy::Enforce::Required,
                ));
                limits.push(g.memory_mib);
            }
        }
        if memory > 0 {
            self.env.insert(
                "SLICELET_GPU_SHARE_MEMORY_MIB".to_string(),
                memory.to_string(),
            );
            self.env
                .insert("SLICELET_GPU_SHARE_CORES".to_string(), cores.to_string());
        }
        if let Some(&first) = limits.first() {
            if limits.iter().all(|&l| l == first) {
                self.env
                    .insert(crate::cdi::memory::LIMIT_ENV.to_string(), first.to_string());
            }
        }
        self.hooks = hooks;
    }

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
        if !self.hooks.is_empty() {
            edits["hooks"] = Value::Array(self.hooks.clone());
        }
        json!({
            "cdiVersion": CDI_VERSION,
            "kind": kind,
            "devices": [{ "name": uid, "containerEdits": edits }],
        })
    }
}

/// The physical unit a device name stands for and whether it is a replica: `gpu-<uuid>-r<n>`
/// is replica `n` of `gpu-<uuid>` ([`crate::plan::dra_names::device_name`]'s forms; a UUID's hex
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
