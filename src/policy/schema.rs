//! Serde types that mirror the policy file exactly: NVIDIA k8s-device-plugin's config
//! `version: v1` (as of their v0.20.0 release) plus slicelet's documented extensions.
//!
//! Every struct denies unknown fields, and no struct uses `#[serde(flatten)]` (which would
//! silently defeat `deny_unknown_fields`), so a misspelt or misplaced key is an error with its
//! path and line. Values slicelet can check locally (version, strategies, resource names,
//! replica counts, device lists) are checked while deserializing, so those errors carry the
//! line and column too.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

use super::names::ResourceName;

/// The whole file. Every top-level key of NVIDIA's v1 schema is recognised.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    /// `v1`, or absent (NVIDIA defaults it to `v1`).
    #[expect(dead_code, reason = "checked by parsing: `v1` is its only value")]
    pub version: Option<Version>,
    /// Daemon settings (NVIDIA: command-line flags that may also come from the file).
    pub flags: Option<Flags>,
    /// NVIDIA's resource renaming by product pattern. Recognised, not acted on.
    pub resources: Option<Resources>,
    /// Time-slicing and MPS sharing.
    pub sharing: Option<Sharing>,
    /// IMEX channels. Recognised, not acted on.
    pub imex: Option<Imex>,
    /// Xid classification (NVIDIA's keys and slicelet's) and recovery (slicelet's).
    pub health: Option<Health>,
    /// slicelet extension: resources served through Dynamic Resource Allocation instead of
    /// the device plugin.
    pub dra: Option<Dra>,
}

/// `dra` (slicelet extension): which resources DRA serves. A resource named here (or by a
/// sharing entry's `dra: true`) is published as ResourceSlices only; the device plugin does
/// not serve it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Dra {
    /// Resource names as advertised (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, a sharing
    /// entry's rename), each once.
    pub resources: Option<Vec<ResourceName>>,
    /// The effect of the device taint on a device a critical Xid made Unhealthy: `NoSchedule`
    /// (the default: no new claim gets it) or `NoExecute` (also evicts the pods whose claims
    /// hold it and do not tolerate the taint). Other causes are always `NoSchedule`.
    pub xid_taint_effect: Option<TaintEffect>,
    /// `dynamicMig`: GPUs whose free MIG space DRA publishes as one device per placement of
    /// every profile, created when a claim is prepared (Kubernetes partitionable devices).
    pub dynamic_mig: Option<DynamicMig>,
}

/// `dra.dynamicMig` (slicelet extension): which GPUs are partitioned on demand.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DynamicMig {
    /// The GPUs, in any form a sharing entry's `devices` takes (`all`, a count, GPU indices,
    /// GPU UUIDs); MIG devices are refused.
    pub devices: Option<DeviceSelector>,
}

/// The effect of a DRA device taint (`resource.k8s.io/v1` DeviceTaint `effect`, KEP-5055).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
pub enum TaintEffect {
    /// The scheduler allocates the device to no claim that does not tolerate the taint;
    /// claims already allocated keep it.
    #[default]
    NoSchedule,
    /// As `NoSchedule`, and the pods of claims already allocated the device that do not
    /// tolerate the taint are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The API's spelling: `NoSchedule` or `NoExecute`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// `health`: which Xids mark a GPU Unhealthy and when it recovers. NVIDIA's keys
/// (`disabled`, `eventTypes`, `ignoredXIDs`, `criticalXIDs`, as NVIDIA's plugin reads them)
/// and slicelet's (`ignoredXids`, `criticalXids`, `recoverySeconds`); the two forms of the Xid
/// lists are not mixed in one file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Health {
    /// slicelet's: Xids to ignore in addition to NVIDIA's defaults (13, 31, 43, 45, 68, 109);
    /// wins over `DP_ENABLE_HEALTHCHECKS`.
    pub ignored_xids: Option<Vec<u64>>,
    /// slicelet's: Xids that are critical even when ignored by default or by the environment.
    pub critical_xids: Option<Vec<u64>>,
    /// slicelet's: seconds without a critical event before an Unhealthy GPU may return to
    /// Healthy (default 300; 0 = never).
    pub recovery_seconds: Option<NonNegativeSeconds>,
    /// NVIDIA's: no Xid marks a GPU Unhealthy.
    pub disabled: Option<bool>,
    /// NVIDIA's: the NVML event types watched. As in NVIDIA's plugin only Xid events
    /// (`EventTypeXidCriticalError`) mark a GPU Unhealthy: without it none does.
    pub event_types: Option<Vec<EventType>>,
    /// NVIDIA's: the Xids ignored, in place of NVIDIA's defaults.
    #[serde(rename = "ignoredXIDs")]
    pub nvidia_ignored_xids: Option<Vec<u64>>,
    /// NVIDIA's: the Xids that are critical, `all` (the default: every Xid not ignored) or a
    /// list (only those).
    #[serde(rename = "criticalXIDs")]
    pub nvidia_critical_xids: Option<CriticalXids>,
}

/// An NVML event type of NVIDIA's `health.eventTypes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[expect(
    clippy::enum_variant_names,
    reason = "the variants are the file's words"
)]
pub enum EventType {
    /// Xid errors: the only events that mark a GPU Unhealthy.
    EventTypeXidCriticalError,
    /// Double-bit ECC errors (watched by NVIDIA's plugin, acted on by neither).
    EventTypeDoubleBitEccError,
    /// Single-bit ECC errors (likewise).
    EventTypeSingleBitEccError,
}

/// NVIDIA's `health.criticalXIDs`: `all` (any case, as NVIDIA's plugin reads it) or a list of
/// Xids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriticalXids {
    /// Every Xid not ignored.
    All,
    /// Only these.
    Only(Vec<u64>),
}

impl<'de> Deserialize<'de> for CriticalXids {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CriticalXids;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`all` or a list of Xids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v.eq_ignore_ascii_case("all") {
                    Ok(CriticalXids::All)
                } else {
                    Err(E::invalid_value(Unexpected::Str(v), &self))
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut xids = Vec::new();
                while let Some(x) = seq.next_element::<u64>()? {
                    xids.push(x);
                }
                Ok(CriticalXids::Only(xids))
            }
        }
        d.deserialize_any(V)
    }
}

/// A number of seconds ≥ 0 (fractions allowed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonNegativeSeconds(pub f64);

impl<'de> Deserialize<'de> for NonNegativeSeconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NonNegativeSeconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of seconds of at least 0")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(NonNegativeSeconds(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                if v < 0 {
                    return Err(E::invalid_value(Unexpected::Signed(v), &self));
                }
                Ok(NonNegativeSeconds(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(E::invalid_value(Unexpected::Float(v), &self));
                }
                Ok(NonNegativeSeconds(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// The only file version: `v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Version {
    /// NVIDIA config v1.
    #[serde(rename = "v1")]
    V1,
}

/// How MIG devices are advertised (NVIDIA's `--mig-strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// Every GPU is advertised whole as `nvidia.com/gpu`, MIG or not.
    #[default]
    None,
    /// Every MIG device is advertised as `nvidia.com/gpu` (uniform layouts only).
    Single,
    /// One resource per MIG profile (`nvidia.com/mig-1g.10gb`), whole GPUs as `nvidia.com/gpu`.
    Mixed,
}

impl MigStrategy {
    /// The spelling in the policy file: `none`, `single` or `mixed`.
    pub fn as_str(self) -> &'static str {
        match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
    }
}

/// `flags`: NVIDIA's common flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Flags {
    /// `none` (default), `single` or `mixed`.
    pub mig_strategy: Option<MigStrategy>,
    /// Exit with code 1 when NVML cannot be initialised (default true).
    pub fail_on_init_error: Option<bool>,
    /// Recognised, not acted on.
    pub restart_on_device_unhealthy: Option<bool>,
    /// Recognised, not acted on.
    pub nvidia_driver_root: Option<String>,
    /// Recognised, not acted on.
    pub nvidia_dev_root: Option<String>,
    /// Root of the MPS pipe, log and shm directories (default `/run/nvidia/mps`): one
    /// `<mpsRoot>/<uuid>/` directory per GPU (or MIG device) under MPS.
    pub mps_root: Option<String>,
    /// Recognised, not acted on.
    pub gdrcopy_enabled: Option<bool>,
    /// Recognised, not acted on.
    pub gds_enabled: Option<bool>,
    /// Recognised, not acted on.
    pub mofed_enabled: Option<bool>,
    /// Recognised, not acted on.
    #[serde(rename = "useNodeFeatureAPI")]
    pub use_node_feature_api: Option<bool>,
    /// Recognised, not acted on (slicelet discovers through NVML or `--simulate`).
    pub device_discovery_strategy: Option<String>,
    /// Device-plugin specific flags.
    pub plugin: Option<PluginFlags>,
    /// GPU feature discovery flags. Recognised, not acted on.
    pub gfd: Option<GfdFlags>,
}

/// `flags.plugin`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginFlags {
    /// Return `/dev/nvidia*` device specs from Allocate.
    pub pass_device_specs: Option<bool>,
    /// `envvar` (default), `volume-mounts`, `cdi-annotations`, `cdi-cri`; one string or a list
    /// (see [`super::delivery`]). Any other value is an error naming the allowed ones.
    pub device_list_strategy: Option<super::delivery::DeviceListStrategies>,
    /// `uuid` (default) or `index`.
    #[serde(rename = "deviceIDStrategy")]
    pub device_id_strategy: Option<super::delivery::DeviceIdStrategy>,
    /// The prefix of the `cdi-annotations` annotation key (default `cdi.k8s.io/`).
    pub cdi_annotation_prefix: Option<String>,
    /// Recognised, not acted on.
    #[serde(rename = "nvidiaCTKPath")]
    pub nvidia_ctk_path: Option<String>,
    /// Recognised, not acted on.
    pub container_driver_root: Option<String>,
    /// Recognised, not acted on (slicelet registers at `kubelet.sock` in
    /// `--device-plugin-path`).
    pub kubelet_socket: Option<String>,
    /// Recognised, not acted on (NVIDIA's CDI spec generation; slicelet names the NVIDIA
    /// Container Toolkit's devices).
    pub cdi_feature_flags: Option<String>,
    /// How GetPreferredAllocation places replicas (NVIDIA's plugin v0.20): `distributed`
    /// (default) or `packed`; any other value is an error listing both.
    pub shared_devices_allocation_policy: Option<SharedAllocation>,
}

/// `flags.plugin.sharedDevicesAllocationPolicy`: how GetPreferredAllocation chooses replicas
/// of shared GPUs (time-slicing; MPS always packs one request onto one GPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedAllocation {
    /// Distinct GPUs first, then the least-loaded GPU (NVIDIA's default, and slicelet's
    /// behaviour before the key was honoured).
    #[default]
    Distributed,
    /// The GPU that already has the most replicas in use first, so whole GPUs stay free.
    Packed,
}

/// `flags.gfd`. Recognised, not acted on.
#[derive(Debug, Default, Deserialize)]
#[expect(dead_code, reason = "read from the file, not acted on")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GfdFlags {
    /// GFD runs once and exits.
    pub oneshot: Option<bool>,
    /// GFD omits its timestamp label.
    pub no_timestamp: Option<bool>,
    /// Go duration string such as `60s`.
    pub sleep_interval: Option<String>,
    /// GFD output file.
    pub output_file: Option<String>,
    /// GFD machine type file.
    pub machine_type_file: Option<String>,
}

/// `resources`: NVIDIA's renaming by product pattern. Recognised, not acted on.
#[derive(Debug, Default, Deserialize)]
#[expect(dead_code, reason = "read from the file, not acted on")]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Patterns for whole GPUs.
    pub gpus: Option<Vec<PatternResource>>,
    /// Patterns for MIG devices.
    pub mig: Option<Vec<PatternResource>>,
}

/// One `resources.gpus[]` / `resources.mig[]` entry.
#[derive(Debug, Deserialize)]
#[expect(dead_code, reason = "read from the file, not acted on")]
#[serde(deny_unknown_fields)]
pub struct PatternResource {
    /// Product-name glob.
    pub pattern: String,
    /// Resource name.
    pub name: String,
}

/// `sharing`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sharing {
    /// Time-slicing: replicas with no isolation.
    pub time_slicing: Option<ReplicatedResources>,
    /// CUDA MPS: one supervised control daemon per GPU, limits enforced by the daemon.
    pub mps: Option<MpsSharing>,
}

/// `sharing.mps`: the keys of `sharing.timeSlicing` plus slicelet's extensions.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsSharing {
    /// Advertise shared resources as `<name>.shared` unless an entry has `rename`.
    pub rename_by_default: Option<bool>,
    /// Refuse container requests for more than one replica (default **true** for MPS, as
    /// NVIDIA's plugin: extra replicas cannot raise a limit the daemon enforces).
    pub fail_requests_greater_than_one: Option<bool>,
    /// slicelet extension: set the GPUs under MPS to compute mode EXCLUSIVE_PROCESS through
    /// NVML while their daemons run (default false), restored on stop.
    pub exclusive_process: Option<bool>,
    /// slicelet extension: allow MPS on GPUs older than compute capability 7.0 (default
    /// false), where MPS enforces neither per-client limits nor isolated address spaces.
    pub allow_pre_volta: Option<bool>,
    /// The entries.
    pub resources: Option<Vec<MpsResource>>,
}

/// One `sharing.mps.resources[]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsResource {
    /// The resource whose devices are shared, e.g. `nvidia.com/gpu`.
    pub name: ResourceName,
    /// The name the shared devices are advertised under.
    pub rename: Option<ResourceName>,
    /// Which GPUs: `all` (default), a count N, or a list of GPU indices / UUIDs.
    pub devices: Option<DeviceSelector>,
    /// Clients per GPU (one per replica), an integer of at least 1.
    pub replicas: Replicas,
    /// slicelet extension: each client's share of the GPU's threads, 1–100 (default
    /// `100 / replicas`, rounded down).
    pub active_thread_percentage: Option<Percentage>,
    /// slicelet extension: each client's pinned device memory, a Kubernetes quantity such as
    /// `10Gi` (default: the GPU's memory / replicas, rounded down to MiB).
    pub pinned_device_memory_limit: Option<MemoryQuantity>,
    /// slicelet extension: serve this entry's replicas through DRA only (default false):
    /// `true` one device per replica, `capacity` one shared device per GPU (see [`DraMode`]).
    pub dra: Option<DraMode>,
    /// slicelet extension: each client's GPU memory, enforced per container cgroup by the
    /// driver (see [`MemorySpec`]).
    pub memory: Option<MemorySpec>,
}

/// An integer percentage from 1 to 100, checked while parsing (so errors carry the line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentage(pub u32);

impl<'de> Deserialize<'de> for Percentage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Percentage;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole percentage from 1 to 100")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Percentage, E> {
                match u32::try_from(v) {
                    Ok(n) if (1..=100).contains(&n) => Ok(Percentage(n)),
                    _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Percentage, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
        }
        d.deserialize_u32(V)
    }
}

/// A memory size written as a Kubernetes quantity (`10Gi`, `20000Mi`, `8G`) or a plain number
/// of bytes; at least 1 MiB. Checked while parsing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryQuantity {
    /// As written.
    pub text: String,
    /// The size in MiB, rounded down.
    pub mib: u64,
}

impl MemoryQuantity {
    fn from_bytes<E: de::Error>(text: String, bytes: u128) -> Result<Self, E> {
        let mib = bytes / super::quantity::MIB;
        if mib == 0 {
            return Err(E::custom(format!("`{text}` is less than 1 MiB")));
        }
        let mib = u64::try_from(mib).map_err(|_| E::custom(format!("`{text}` is too large")))?;
        Ok(MemoryQuantity { text, mib })
    }
}

impl<'de> Deserialize<'de> for MemoryQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = MemoryQuantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes quantity such as 10Gi or 20000Mi")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<MemoryQuantity, E> {
                MemoryQuantity::from_bytes(v.to_string(), u128::from(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<MemoryQuantity, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<MemoryQuantity, E> {
                let bytes = super::quantity::parse_bytes(v).map_err(E::custom)?;
                MemoryQuantity::from_bytes(v.to_string(), bytes)
            }
            // YAML reads an unquoted `1e10` as a float; Kubernetes accepts it as a quantity.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<MemoryQuantity, E> {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(E::invalid_value(Unexpected::Float(v), &self));
                }
                self.visit_str(&format!("{v:e}"))
            }
        }
        d.deserialize_any(V)
    }
}

/// `sharing.timeSlicing`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicatedResources {
    /// Advertise shared resources as `<name>.shared` unless an entry has `rename`.
    pub rename_by_default: Option<bool>,
    /// Refuse container requests for more than one replica (Allocate → `INVALID_ARGUMENT`).
    pub fail_requests_greater_than_one: Option<bool>,
    /// The entries.
    pub resources: Option<Vec<ReplicatedResource>>,
}

/// One `sharing.*.resources[]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReplicatedResource {
    /// The resource whose devices are shared, e.g. `nvidia.com/gpu`.
    pub name: ResourceName,
    /// The name the shared devices are advertised under.
    pub rename: Option<ResourceName>,
    /// Which GPUs: `all` (default), a count N (the first N by index), or a list of GPU
    /// indices / UUIDs.
    pub devices: Option<DeviceSelector>,
    /// Replicas per device, an integer of at least 1.
    pub replicas: Replicas,
    /// slicelet extension: serve this entry's replicas through DRA only, not the device
    /// plugin (default false): `true` one device per replica, `capacity` one shared device per
    /// GPU (see [`DraMode`]).
    pub dra: Option<DraMode>,
    /// slicelet extension: each replica's GPU memory, enforced per container cgroup by the
    /// driver (see [`MemorySpec`]).
    pub memory: Option<MemorySpec>,
}

/// `memory` of a sharing entry (slicelet extension): the GPU memory each replica may use,
/// set per container cgroup through NVML's memory partitioning (driver R615 and later,
/// cgroup v2; `nvmlDeviceSetMemoryLimits_v1`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    /// The most a replica's container may allocate (allocations beyond fail with out of
    /// memory), a Kubernetes quantity such as `20Gi`.
    pub hard: MemoryQuantity,
    /// The share guaranteed under memory pressure (above it a process may be evicted); at
    /// most `hard`. Default: none (0).
    pub soft: Option<MemoryQuantity>,
    /// What happens where the limit cannot be set: `required` (default) refuses the plan or
    /// fails container creation, `best-effort` serves and shows the replica unenforced.
    pub enforce: Option<Enforce>,
}

/// `memory.enforce`: whether a memory limit that cannot be set stops the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforce {
    /// Fail closed: a plan that cannot enforce the limit is refused; the runtime hook fails
    /// container creation when NVML refuses the limit.
    #[default]
    Required,
    /// Serve anyway; the replica is shown unenforced in the plan, `/status` and `/metrics`.
    BestEffort,
}

impl Enforce {
    /// The policy's spelling: `required` or `best-effort`.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforce::Required => "required",
            Enforce::BestEffort => "best-effort",
        }
    }
}

/// `imex`. Recognised, not acted on.
#[derive(Debug, Default, Deserialize)]
#[expect(dead_code, reason = "read from the file, not acted on")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Imex {
    /// IMEX channel IDs.
    #[serde(rename = "channelIDs")]
    pub channel_ids: Option<Vec<u32>>,
    /// Fail when the channels are missing.
    pub required: Option<bool>,
}

/// A sharing entry's `dra` (slicelet extension): `false` (the device plugin serves it),
/// `true` (DRA, one device per replica: every Kubernetes version with DRA), or `capacity`
/// (DRA, one device per GPU with `allowMultipleAllocations` and `memory`/`cores` capacities
/// that claims consume: KEP-5075 `DRAConsumableCapacity`, beta and on by default since
/// Kubernetes 1.36). Anything else is refused while parsing, with its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraMode {
    /// `false`.
    Off,
    /// `true`.
    Replicas,
    /// `capacity`.
    Capacity,
}

impl<'de> Deserialize<'de> for DraMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DraMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or capacity")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<DraMode, E> {
                Ok(if v { DraMode::Replicas } else { DraMode::Off })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DraMode, E> {
                match v {
                    "capacity" => Ok(DraMode::Capacity),
                    _ => Err(E::invalid_value(Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A replica count: an integer ≥ 1. Strings (`"4"`), fractions, zero and negatives are
/// rejected while parsing, so the error carries line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas(pub u32);

impl<'de> Deserialize<'de> for Replicas {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside the visitor, so the parser reports the value's own line and column.
        struct V;
        impl Visitor<'_> for V {
            type Value = Replicas;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of replicas of at least 1")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Replicas, E> {
                match u32::try_from(v) {
                    Ok(n) if n >= 1 => Ok(Replicas(n)),
                    _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Replicas, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
        }
        d.deserialize_u32(V)
    }
}

/// `devices` of a sharing entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelector {
    /// Every device of the named resource (`all`, the default).
    #[default]
    All,
    /// The first N GPUs by index (N ≥ 1).
    Count(u32),
    /// Named devices.
    List(Vec<DeviceRef>),
}

/// One item of a `devices` list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceRef {
    /// A GPU index (`0`, or `"0"`).
    Index(u32),
    /// A MIG device by `"<gpu index>:<mig index>"`.
    MigIndex(u32, u32),
    /// A GPU (`GPU-…`) or MIG (`MIG-…`) UUID.
    Uuid(String),
    /// `MIG-GPU-<gpu uuid>/<gi>/<ci>`: a MIG device named by its parent GPU's UUID, its
    /// GPU-instance id and its compute-instance id, the form NVML used before driver R470
    /// (NVIDIA's `IsMigUUID` accepts it). slicelet matches it to the MIG device with that
    /// parent and those ids on any driver; the `/` never reaches a path, only this match.
    LegacyMig {
        /// The parent GPU's `GPU-…` UUID, in NVML's form.
        gpu: String,
        /// GPU-instance id.
        gi: u32,
        /// Compute-instance id.
        ci: u32,
    },
    /// A UUID in a form Go's `uuid.Parse` accepts but NVML never reports (in braces, with
    /// `urn:uuid:`, or 32 hex digits without dashes): NVIDIA's plugin accepts it and matches it
    /// to no device, and so does slicelet, with a warning (an error under `validate --strict`).
    Unmatchable(String),
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRef::Index(i) => write!(f, "{i}"),
            DeviceRef::MigIndex(g, m) => write!(f, "{g}:{m}"),
            DeviceRef::Uuid(u) | DeviceRef::Unmatchable(u) => f.write_str(u),
            DeviceRef::LegacyMig { gpu, gi, ci } => write!(f, "MIG-{gpu}/{gi}/{ci}"),
        }
    }
}

/// A decimal as Go's `strconv.ParseUint` reads it: digits only (no sign, no space).
fn go_uint(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Whether `s` is a UUID Go's `uuid.Parse` accepts in one of the forms NVML never reports:
/// `{8-4-4-4-12}`, `urn:uuid:8-4-4-4-12` (prefix in any case), or 32 hex digits.
fn go_only_uuid_form(s: &str) -> bool {
    let dashed = |t: &str| crate::uuid::Uuid::parse(&format!("GPU-{t}")).is_ok();
    if let Some(inner) = s.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        return dashed(inner);
    }
    if s.len() > 9 && s.is_char_boundary(9) && s[..9].eq_ignore_ascii_case("urn:uuid:") {
        return dashed(&s[9..]);
    }
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl DeviceRef {
    /// Reads one `devices` string with NVIDIA's rules (`api/config/v1/replicas.go`,
    /// `ReplicaDeviceRef`): a GPU index, `<gpu>:<mig>`, a `GPU-`/`MIG-` UUID, or the legacy
    /// `MIG-GPU-<uuid>/<gi>/<ci>`.
    fn parse(s: &str) -> Result<Self, DeviceRefError> {
        if let Some(i) = go_uint(s) {
            return Ok(DeviceRef::Index(i));
        }
        if let Some((g, m)) = s.split_once(':') {
            if let (Some(g), Some(m)) = (go_uint(g), go_uint(m)) {
                return Ok(DeviceRef::MigIndex(g, m));
            }
        }
        if let Some(rest) = s.strip_prefix("MIG-GPU-") {
            let parts: Vec<&str> = rest.splitn(3, '/').collect();
            if let [gpu, gi, ci] = parts[..] {
                let gpu = crate::uuid::Uuid::parse(&format!("GPU-{gpu}"))
                    .map_err(DeviceRefError::Uuid)?;
                if let (Some(gi), Some(ci)) = (go_uint(gi), go_uint(ci)) {
                    return Ok(DeviceRef::LegacyMig {
                        gpu: gpu.into_string(),
                        gi,
                        ci,
                    });
                }
            }
            return Err(DeviceRefError::NotADevice(s.to_string()));
        }
        if let Some(rest) = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-")) {
            if go_only_uuid_form(rest) {
                return Ok(DeviceRef::Unmatchable(s.to_string()));
            }
            // The one UUID check (crate::uuid): a UUID in `devices` must never carry `/`.
            return crate::uuid::Uuid::parse(s)
                .map(|u| DeviceRef::Uuid(u.into_string()))
                .map_err(DeviceRefError::Uuid);
        }
        Err(DeviceRefError::NotADevice(s.to_string()))
    }
}

/// A `devices` item that names no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceRefError {
    /// It starts with `GPU-`/`MIG-` but is not a UUID in NVML's form.
    #[error(transparent)]
    Uuid(crate::uuid::UuidError),
    /// Neither an index, a `<gpu>:<mig>` pair nor a UUID.
    #[error("`{}` is not a GPU index, a \"<gpu>:<mig>\" MIG index, a GPU-/MIG- UUID or MIG-GPU-<uuid>/<gi>/<ci>", crate::uuid::truncate_id(.0))]
    NotADevice(String),
}

struct DeviceSelectorVisitor;

impl<'de> Visitor<'de> for DeviceSelectorVisitor {
    type Value = DeviceSelector;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`all`, a positive count, or a list of GPU indices or UUIDs")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == "all" {
            Ok(DeviceSelector::All)
        } else {
            Err(E::invalid_value(Unexpected::Str(v), &self))
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        match u32::try_from(v) {
            Ok(n) if n >= 1 => Ok(DeviceSelector::Count(n)),
            _ => Err(E::invalid_value(Unexpected::Unsigned(v), &self)),
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        // A device listed twice is kept twice here (NVIDIA's plugin accepts it); validation
        // counts it once and warns.
        while let Some(item) = seq.next_element::<DeviceRefItem>()? {
            out.push(item.0);
        }
        // An empty list is valid (NVIDIA's plugin accepts it): the entry claims nothing, which
        // the plan reports as a warning.
        Ok(DeviceSelector::List(out))
    }
}

impl<'de> Deserialize<'de> for DeviceSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DeviceSelectorVisitor)
    }
}

struct DeviceRefItem(DeviceRef);

impl<'de> Deserialize<'de> for DeviceRefItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DeviceRefItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a GPU index, \"<gpu>:<mig>\", or a GPU-/MIG- UUID")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DeviceRefItem, E> {
                u32::try_from(v)
                    .map(|i| DeviceRefItem(DeviceRef::Index(i)))
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DeviceRefItem, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(Unexpected::Signed(v), &self)),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DeviceRefItem, E> {
                DeviceRef::parse(v).map(DeviceRefItem).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}
