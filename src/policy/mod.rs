//! The sharing policy: loading, strict parsing and validation of the policy file.
//!
//! The file format is NVIDIA k8s-device-plugin's config `version: v1`; slicelet accepts their
//! files unchanged. [`load`] and [`parse`] are the only ways a [`Policy`] comes into being.
//! Validation here is node-independent; rules that depend on the GPUs present (a GPU claimed
//! twice, a rename colliding with whole GPUs) are checked by [`crate::plan::build`].

pub mod cdi;
mod delivery;
mod mps;
mod names;
mod overrides;
pub mod quantity;
mod read;
mod schema;
pub mod select;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use delivery::{Delivery, DeviceIdStrategy, DeviceListStrategies, DeviceListStrategy};
pub use mps::{Mps, MpsEntry, MAX_CLIENTS, MAX_CLIENTS_PRE_VOLTA};
pub(crate) use names::is_dns_subdomain;
pub use names::{ResourceName, ResourceNameError};
pub use overrides::FlagOverrides;
pub use read::{check_nesting, read_bounded, Limits, NestingError, ReadError, DEFAULT_MAX_BYTES};
pub use schema::{DeviceRef, DeviceSelector, Enforce, MigStrategy, SharedAllocation, TaintEffect};

/// Where a policy error is in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
}

/// A policy the user must fix: the field path (`sharing.timeSlicing.resources[0].replicas`),
/// the line and column where known, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// Dotted field path; `.` for the whole file.
    pub path: String,
    /// Position in the file, when the YAML parser knows it.
    pub location: Option<Location>,
    /// What is wrong.
    pub message: String,
}

/// The most of a message [`PolicyError`] prints: serde quotes a wrong-typed scalar whole, and
/// a 1 MB scalar must not become a 1 MB log line and `/readyz` body.
pub const MAX_MESSAGE_CHARS: usize = 300;

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.path,
            crate::errors::shorten(&self.message, MAX_MESSAGE_CHARS)
        )?;
        if let Some(l) = &self.location {
            write!(f, " (line {}, column {})", l.line, l.column)?;
        }
        Ok(())
    }
}

/// Reading the policy file failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file was refused before parsing (not a regular file, too large, not UTF-8, nested
    /// too deep) or could not be read; the error names the file.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The file is not a valid policy.
    #[error("invalid policy {}: {error}", path.display())]
    Invalid {
        /// The policy file.
        path: PathBuf,
        /// What is wrong, with its field path. Printed in the message (the user needs it on
        /// one line), so not also exposed as the error's source.
        error: PolicyError,
    },
}

/// One sharing entry after validation (`sharing.timeSlicing.resources[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedResource {
    /// Field path of the entry, e.g. `sharing.timeSlicing.resources[1]`, for messages.
    pub path: String,
    /// The resource whose devices are shared (`nvidia.com/gpu`).
    pub source: ResourceName,
    /// The name the replicas are advertised under.
    pub advertised: ResourceName,
    /// Which devices of `source` this entry claims.
    pub devices: DeviceSelector,
    /// Replicas per device (≥ 1).
    pub replicas: u32,
    /// `dra: true` or `dra: capacity`: the replicas are served through DRA only (slicelet
    /// extension).
    pub dra: bool,
    /// `dra: capacity`: the default number of shares per GPU (the entry's `replicas`), each
    /// GPU published once as a device claims consume `memory` and `cores` of; `replicas` is 1
    /// then (one device per GPU). `None` for every other entry.
    pub capacity_shares: Option<u32>,
    /// `memory`: each replica's GPU memory limits (slicelet extension); `None`: unlimited.
    pub memory: Option<MemoryLimits>,
}

/// A sharing entry's `memory` after validation: per replica, MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Hard limit, MiB (allocations beyond it fail).
    pub hard_mib: u64,
    /// Soft limit (guaranteed share), MiB, at most `hard_mib`; `None`: not set.
    pub soft_mib: Option<u64>,
    /// Whether a limit that cannot be set stops the replica.
    pub enforce: Enforce,
}

/// `sharing.timeSlicing` after validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeSlicing {
    /// Refuse container requests for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// The entries, in file order.
    pub resources: Vec<SharedResource>,
}

/// Xids NVIDIA's plugin ignores by default (application errors, not hardware faults).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// `health` after validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthPolicy {
    /// slicelet's `ignoredXids`: Xids to ignore beyond NVIDIA's defaults.
    pub ignored_xids: Vec<u64>,
    /// slicelet's `criticalXids`: Xids that are always critical.
    pub critical_xids: Vec<u64>,
    /// NVIDIA's keys, when the file uses them (then slicelet's two lists are empty).
    pub nvidia: Option<NvidiaXids>,
    /// Quiet period before recovery; `None` = the default (5 min); zero = never.
    pub recovery: Option<std::time::Duration>,
}

/// NVIDIA's `health` keys as NVIDIA's plugin reads them: a file that sets any of them replaces
/// NVIDIA's default Xid classification with its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaXids {
    /// No Xid marks a GPU Unhealthy (`disabled: true`, or `eventTypes` without
    /// `EventTypeXidCriticalError`).
    pub off: bool,
    /// `ignoredXIDs`: the Xids ignored (NVIDIA's defaults only when listed).
    pub ignored: Vec<u64>,
    /// `criticalXIDs`: `None` = `all` (the default), else only these.
    pub critical: Option<Vec<u64>>,
}

/// A validated sharing policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `flags.migStrategy` (default `none`).
    pub mig_strategy: MigStrategy,
    /// `flags.failOnInitError` (default true, as NVIDIA's plugin).
    pub fail_on_init_error: bool,
    /// `flags.plugin.passDeviceSpecs` (default false).
    pub pass_device_specs: bool,
    /// `flags.plugin.sharedDevicesAllocationPolicy` (default `distributed`).
    pub shared_allocation: SharedAllocation,
    /// `flags.plugin.deviceListStrategy`, `deviceIDStrategy` and `cdiAnnotationPrefix`: how
    /// Allocate hands the devices to the container runtime.
    pub delivery: Delivery,
    /// `sharing.timeSlicing`.
    pub time_slicing: TimeSlicing,
    /// `health` (slicelet extension).
    pub health: HealthPolicy,
    /// `sharing.mps`.
    pub mps: Mps,
    /// The resources (as advertised) served through DRA only, never by the device plugin:
    /// `dra.resources` and the advertised name of every sharing entry with `dra: true`
    /// (slicelet extension). Empty: DRA serves nothing, the device plugin everything.
    pub dra: std::collections::BTreeSet<ResourceName>,
    /// `dra.xidTaintEffect` (slicelet extension, default `NoSchedule`): the effect of the DRA
    /// device taint on a device a critical Xid made Unhealthy.
    pub dra_xid_taint_effect: TaintEffect,
    /// `flags.mpsRoot` (default `/run/nvidia/mps`): each GPU under MPS gets
    /// `<mpsRoot>/<uuid>/{pipe,log}` and the shared `<mpsRoot>/shm`.
    pub mps_root: PathBuf,
    /// Keys of NVIDIA's schema that are set but that slicelet does not act on yet; one warning
    /// each, by field path.
    pub ignored_keys: Vec<String>,
    /// Where slicelet reads an NVIDIA file differently from NVIDIA's plugin.
    pub notices: Vec<String>,
    /// What NVIDIA's plugin accepts and slicelet therefore serves, but that is probably a
    /// mistake (a device listed twice, a UUID in a form NVML never reports, one replica per
    /// GPU): warnings, and errors under `slicelet validate --strict`. Each names its field path.
    pub lenient: Vec<String>,
    /// slicelet extensions in use that change what a pod gets (per-replica `memory`,
    /// `dra.xidTaintEffect`), which
    /// NVIDIA's plugin would ignore: refused by `slicelet validate --strict`. Each names its
    /// field path.
    pub extensions: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mig_strategy: MigStrategy::None,
            fail_on_init_error: true,
            pass_device_specs: false,
            shared_allocation: SharedAllocation::Distributed,
            delivery: Delivery::default(),
            time_slicing: TimeSlicing::default(),
            health: HealthPolicy::default(),
            mps: Mps::default(),
            dra: std::collections::BTreeSet::new(),
            dra_xid_taint_effect: TaintEffect::NoSchedule,
            mps_root: PathBuf::from(mps::DEFAULT_MPS_ROOT),
            ignored_keys: Vec::new(),
            notices: Vec::new(),
            lenient: Vec::new(),
            extensions: Vec::new(),
        }
    }
}

/// Reads and validates the policy file at `path` within the default [`Limits`] (1 MiB, 64
/// levels of nesting): [`load_with`] with [`Limits::default`].
///
/// # Errors
/// As [`load_with`].
pub fn load(path: &Path) -> Result<Policy, LoadError> {
    load_with(path, &Limits::default())
}

/// Reads the policy file at `path` through [`read_bounded`] and validates it. This is the one
/// path by which `slicelet validate`, `slicelet plan` and the daemon read a policy, so they
/// accept and refuse the same files: invalid UTF-8 is refused with its byte offset (never
/// decoded lossily), a UTF-8 byte-order mark is accepted.
///
/// # Errors
/// [`LoadError::Read`] when the file is refused before parsing or cannot be read,
/// [`LoadError::Invalid`] with the field path when it is not a valid policy.
pub fn load_with(path: &Path, limits: &Limits) -> Result<Policy, LoadError> {
    load_overridden(path, limits, &FlagOverrides::default())
}

/// [`load_with`], then NVIDIA's flag overrides (`MIG_STRATEGY`, …) over the file's `flags`
/// ([`parse_with`]).
///
/// # Errors
/// As [`load_with`]; an override that is not a valid value of its key is
/// [`LoadError::Invalid`] naming the key.
pub fn load_overridden(
    path: &Path,
    limits: &Limits,
    overrides: &FlagOverrides,
) -> Result<Policy, LoadError> {
    let text = read_bounded(path, limits)?;
    parse_with(&text, overrides).map_err(|error| LoadError::Invalid {
        path: path.to_path_buf(),
        error,
    })
}

/// Parses and validates policy text (YAML; JSON is YAML too). A leading UTF-8 byte-order mark
/// is ignored. The text is not checked against [`Limits`]: text from outside comes through
/// [`read_bounded`] (or is checked with [`check_nesting`]) first.
///
/// # Errors
/// [`PolicyError`] naming the field path, with line and column when the parser knows them.
pub fn parse(text: &str) -> Result<Policy, PolicyError> {
    parse_with(text, &FlagOverrides::default())
}

/// [`parse`] with NVIDIA's flag overrides applied to the file's `flags` before validation
/// ([`FlagOverrides`]: a flag or variable that is set wins over the file, as in NVIDIA's plugin);
/// every override that replaced a different value of the file is a [`Policy::notices`] entry.
///
/// # Errors
/// As [`parse`]; an override is validated as the file's value would be (`flags.mpsRoot`, …).
pub fn parse_with(text: &str, overrides: &FlagOverrides) -> Result<Policy, PolicyError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let de = yaml_serde::Deserializer::from_str(text);
    let mut file: schema::ConfigFile = match serde_path_to_error::deserialize(de) {
        Ok(f) => f,
        // YAML merge keys (`<<: *anchor`), which NVIDIA's parser resolves: resolve them and try
        // again; if that fails too, report the first error (it has line and column).
        Err(e) if text.contains("<<") => merged(text).ok_or_else(|| from_serde(e))?,
        Err(e) => return Err(from_serde(e)),
    };
    let notices = overrides.apply(&mut file);
    let mut policy = validate(file)?;
    policy.notices.splice(0..0, notices);
    Ok(policy)
}

fn merged(text: &str) -> Option<schema::ConfigFile> {
    let mut value: yaml_serde::Value = yaml_serde::from_str(text).ok()?;
    value.apply_merge().ok()?;
    serde_path_to_error::deserialize(value).ok()
}

fn from_serde(err: serde_path_to_error::Error<yaml_serde::Error>) -> PolicyError {
    let inner = err.inner();
    let location = inner.location().map(|l| Location {
        line: l.line(),
        column: l.column(),
    });
    let mut path = err.path().to_string();
    // An empty key (`'': 1`) is an empty last segment: name it `""` so the path is never empty.
    if matches!(err.path().iter().next_back(), Some(serde_path_to_error::Segment::Map { key }) if key.is_empty())
    {
        path.push_str("\"\"");
    }
    // The YAML error repeats its own path and location; keep only the sentence.
    let mut message = inner.to_string();
    if let Some(l) = &location {
        let suffix = format!(" at line {} column {}", l.line, l.column);
        if let Some(stripped) = message.strip_suffix(&suffix) {
            message = stripped.to_string();
        }
    }
    message = strip_yaml_path(&message, &path).to_string();
    // "missing field `replicas`" is reported at the parent; name the field itself.
    if let Some(field) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        path = if path == "." {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        message = "is required".to_string();
    }
    PolicyError {
        path,
        location,
        message,
    }
}

/// The YAML error repeats its own path (`a.b[0]: …`, the parent of an unknown field);
/// drop it when it is a prefix of `path`.
pub(crate) fn strip_yaml_path<'a>(message: &'a str, path: &str) -> &'a str {
    match message.split_once(": ") {
        Some((head, rest)) if path.starts_with(head) => rest,
        _ => message,
    }
}

fn err(path: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        path: path.into(),
        location: None,
        message: message.into(),
    }
}

/// NVIDIA's `health` keys, checked as NVIDIA's plugin checks them (an Xid in both lists is an
/// error), with a notice that they replace the default Xid classification. `None` when the
/// file sets none of them.
fn nvidia_xids(
    h: &schema::Health,
    notices: &mut Vec<String>,
) -> Result<Option<NvidiaXids>, PolicyError> {
    let nvidia_set = [
        ("disabled", h.disabled.is_some()),
        ("eventTypes", h.event_types.is_some()),
        ("ignoredXIDs", h.nvidia_ignored_xids.is_some()),
        ("criticalXIDs", h.nvidia_critical_xids.is_some()),
    ];
    let Some((first, _)) = nvidia_set.iter().find(|(_, set)| *set) else {
        return Ok(None);
    };
    if let Some(own) = [
        ("ignoredXids", h.ignored_xids.is_some()),
        ("criticalXids", h.critical_xids.is_some()),
    ]
    .iter()
    .find(|(_, set)| *set)
    {
        return Err(err(
            format!("health.{}", own.0),
            format!(
                "slicelet's health.{} and NVIDIA's health.{first} read Xids differently (NVIDIA's \
                 lists replace the default ignored Xids, slicelet's add to them): use one form",
                own.0
            ),
        ));
    }
    let ignored = h.nvidia_ignored_xids.clone().unwrap_or_default();
    let critical = match &h.nvidia_critical_xids {
        None | Some(schema::CriticalXids::All) => None,
        Some(schema::CriticalXids::Only(list)) => Some(list.clone()),
    };
    if let Some(x) = critical.iter().flatten().find(|x| ignored.contains(x)) {
        return Err(err(
            "health.criticalXIDs",
            format!("Xid {x} is in both health.ignoredXIDs and health.criticalXIDs"),
        ));
    }
    let xid_events = h
        .event_types
        .as_ref()
        .is_none_or(|t| t.contains(&schema::EventType::EventTypeXidCriticalError));
    let off = h.disabled == Some(true) || !xid_events;
    notices.push(nvidia_xids_notice(h, off, &ignored, critical.as_deref()));
    Ok(Some(NvidiaXids {
        off,
        ignored,
        critical,
    }))
}

/// The notice that NVIDIA's `health` keys replace the default Xid classification: no Xid
/// counts when `off`, else which Xids are ignored (`ignored`) and which are critical
/// (`critical`; `None`: every other one).
fn nvidia_xids_notice(
    h: &schema::Health,
    off: bool,
    ignored: &[u64],
    critical: Option<&[u64]>,
) -> String {
    let defaults = DEFAULT_IGNORED_XIDS.map(|x| x.to_string()).join(", ");
    if off {
        format!(
            "health: read as NVIDIA's plugin reads it, no Xid marks a GPU Unhealthy ({}); a GPU \
             that stops answering NVML still does",
            if h.disabled == Some(true) {
                "disabled: true"
            } else {
                "eventTypes without EventTypeXidCriticalError"
            }
        )
    } else {
        format!(
            "health: read as NVIDIA's plugin reads it, the Xids ignored are ignoredXIDs' ({}) in \
             place of NVIDIA's defaults ({defaults}), and {}",
            if ignored.is_empty() {
                "none".to_string()
            } else {
                ignored
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            match critical {
                None => "every other Xid is critical".to_string(),
                Some(c) => format!(
                    "only criticalXIDs' are critical ({})",
                    c.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                ),
            }
        )
    }
}

fn validate(file: schema::ConfigFile) -> Result<Policy, PolicyError> {
    let mut policy = Policy::default();
    let mut ignored = Vec::new();

    if let Some(flags) = &file.flags {
        read_flags(flags, &mut policy, &mut ignored)?;
    }
    if file.resources.is_some() {
        ignored.push("resources".to_string());
    }
    if file.imex.is_some() {
        ignored.push("imex".to_string());
    }
    if let Some(h) = &file.health {
        policy.health = read_health(h, &mut policy.notices)?;
    }

    // Entries that say `dra: false` in so many words: a `dra.resources` item naming what one
    // advertises contradicts it (checked below, once the advertised names are known).
    let says_not_dra = not_dra_paths(file.sharing.as_ref());
    if let Some(sharing) = file.sharing {
        if let Some(ts) = sharing.time_slicing {
            policy.time_slicing = validate_replicated(
                ts,
                "sharing.timeSlicing",
                &mut policy.notices,
                &mut policy.lenient,
                &mut policy.extensions,
            )?;
        }
        if let Some(m) = sharing.mps {
            policy.mps = mps::validate_mps(
                m,
                &policy.time_slicing,
                &mut policy.notices,
                &mut policy.lenient,
                &mut policy.extensions,
            )?;
        }
    }
    let mut listed = std::collections::BTreeSet::new();
    if let Some(d) = &file.dra {
        listed = read_dra(d, &mut policy, &says_not_dra)?;
    }
    let from_entries: Vec<ResourceName> = shared_entries(&policy)
        .filter(|e| e.dra)
        .map(|e| e.advertised.clone())
        .collect();
    policy.dra = listed;
    policy.dra.extend(from_entries);
    policy.ignored_keys = ignored;
    Ok(policy)
}

/// The time-slicing and MPS entries of `policy`, in that order.
fn shared_entries(policy: &Policy) -> impl Iterator<Item = &SharedResource> {
    policy
        .time_slicing
        .resources
        .iter()
        .chain(policy.mps.resources.iter().map(|m| &m.shared))
}

/// The `dra` section: the names `dra.resources` lists (each once, none that an entry saying
/// `dra: false` advertises: `says_not_dra` holds those entries' paths), and the Xid taint
/// effect into `policy`.
fn read_dra(
    d: &schema::Dra,
    policy: &mut Policy,
    says_not_dra: &std::collections::BTreeSet<String>,
) -> Result<std::collections::BTreeSet<ResourceName>, PolicyError> {
    let mut listed = std::collections::BTreeSet::new();
    for (i, name) in d.resources.iter().flatten().enumerate() {
        if !listed.insert(name.clone()) {
            return Err(err(
                format!("dra.resources[{i}]"),
                format!("{name} is listed twice"),
            ));
        }
        // One name, one path: an entry that asks for the device plugin by name cannot be
        // DRA's because of this list.
        if let Some(e) =
            shared_entries(policy).find(|e| &e.advertised == name && says_not_dra.contains(&e.path))
        {
            return Err(err(
                format!("{}.dra", e.path),
                format!(
                    "false, but dra.resources[{i}] lists {name}, which this entry advertises; a node serves a name through the device plugin or through DRA, not both: remove one of the two"
                ),
            ));
        }
    }
    if let Some(effect) = d.xid_taint_effect {
        policy.dra_xid_taint_effect = effect;
        policy.extensions.push(format!(
            "dra.xidTaintEffect: {}: the effect of the DRA device taint on a device with a critical Xid is a slicelet extension; NVIDIA's plugin has no such key",
            effect.as_str()
        ));
    }
    Ok(listed)
}

/// The `flags` section: the flags slicelet acts on into `policy`, the ones it does not into
/// `ignored` (as `flags.<key>`).
fn read_flags(
    flags: &schema::Flags,
    policy: &mut Policy,
    ignored: &mut Vec<String>,
) -> Result<(), PolicyError> {
    policy.mig_strategy = flags.mig_strategy.unwrap_or_default();
    policy.fail_on_init_error = flags.fail_on_init_error.unwrap_or(true);
    policy.mps_root = mps::validate_root(flags.mps_root.as_deref())?;
    let not_acted: [(&str, bool); 9] = [
        (
            "restartOnDeviceUnhealthy",
            flags.restart_on_device_unhealthy.is_some(),
        ),
        ("nvidiaDriverRoot", flags.nvidia_driver_root.is_some()),
        ("nvidiaDevRoot", flags.nvidia_dev_root.is_some()),
        ("gdrcopyEnabled", flags.gdrcopy_enabled.is_some()),
        ("gdsEnabled", flags.gds_enabled.is_some()),
        ("mofedEnabled", flags.mofed_enabled.is_some()),
        ("useNodeFeatureAPI", flags.use_node_feature_api.is_some()),
        (
            "deviceDiscoveryStrategy",
            flags.device_discovery_strategy.is_some(),
        ),
        ("gfd", flags.gfd.is_some()),
    ];
    ignored.extend(
        not_acted
            .iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| format!("flags.{k}")),
    );
    if let Some(plugin) = &flags.plugin {
        read_plugin_flags(plugin, policy, ignored)?;
    }
    Ok(())
}

/// `flags.plugin`: the keys slicelet acts on into `policy`, the ones it does not into `ignored`
/// (as `flags.plugin.<key>`).
fn read_plugin_flags(
    plugin: &schema::PluginFlags,
    policy: &mut Policy,
    ignored: &mut Vec<String>,
) -> Result<(), PolicyError> {
    policy.pass_device_specs = plugin.pass_device_specs.unwrap_or(false);
    policy.shared_allocation = plugin.shared_devices_allocation_policy.unwrap_or_default();
    if let Some(list) = plugin.device_list_strategy {
        policy.delivery.strategies = list;
    }
    policy.delivery.id = plugin.device_id_strategy.unwrap_or_default();
    if let Some(prefix) = &plugin.cdi_annotation_prefix {
        delivery::validate_prefix(prefix)
            .map_err(|e| err("flags.plugin.cdiAnnotationPrefix", e.to_string()))?;
        policy.delivery.annotation_prefix.clone_from(prefix);
    }
    let not_acted: [(&str, bool); 4] = [
        ("nvidiaCTKPath", plugin.nvidia_ctk_path.is_some()),
        (
            "containerDriverRoot",
            plugin.container_driver_root.is_some(),
        ),
        ("kubeletSocket", plugin.kubelet_socket.is_some()),
        ("cdiFeatureFlags", plugin.cdi_feature_flags.is_some()),
    ];
    ignored.extend(
        not_acted
            .iter()
            .filter(|(_, set)| *set)
            .map(|(k, _)| format!("flags.plugin.{k}")),
    );
    Ok(())
}

/// The `health` section: slicelet's Xid lists (an Xid in both is an error) and NVIDIA's keys
/// ([`nvidia_xids`], whose notice goes to `notices`).
fn read_health(h: &schema::Health, notices: &mut Vec<String>) -> Result<HealthPolicy, PolicyError> {
    let ignored_xids = h.ignored_xids.clone().unwrap_or_default();
    let critical_xids = h.critical_xids.clone().unwrap_or_default();
    if let Some(x) = ignored_xids.iter().find(|x| critical_xids.contains(x)) {
        return Err(err(
            "health.criticalXids",
            format!("Xid {x} is also in health.ignoredXids; list it in one of them"),
        ));
    }
    Ok(HealthPolicy {
        ignored_xids,
        critical_xids,
        nvidia: nvidia_xids(h, notices)?,
        recovery: h
            .recovery_seconds
            .map(|s| std::time::Duration::from_secs_f64(s.0.min(1e9))),
    })
}

/// The field paths of the sharing entries with `dra: false` written out
/// (`sharing.timeSlicing.resources[2]`), in the paths [`validate_replicated`] gives them.
fn not_dra_paths(sharing: Option<&schema::Sharing>) -> std::collections::BTreeSet<String> {
    let Some(sharing) = sharing else {
        return std::collections::BTreeSet::new();
    };
    let ts = sharing
        .time_slicing
        .iter()
        .flat_map(|t| t.resources.iter().flatten())
        .map(|e| e.dra);
    let mps = sharing
        .mps
        .iter()
        .flat_map(|m| m.resources.iter().flatten())
        .map(|e| e.dra);
    ts.enumerate()
        .filter(|(_, dra)| *dra == Some(schema::DraMode::Off))
        .map(|(i, _)| format!("sharing.timeSlicing.resources[{i}]"))
        .chain(
            mps.enumerate()
                .filter(|(_, dra)| *dra == Some(schema::DraMode::Off))
                .map(|(i, _)| format!("sharing.mps.resources[{i}]")),
        )
        .collect()
}

fn validate_replicated(
    ts: schema::ReplicatedResources,
    base: &str,
    notices: &mut Vec<String>,
    lenient: &mut Vec<String>,
    extensions: &mut Vec<String>,
) -> Result<TimeSlicing, PolicyError> {
    let rename_by_default = ts.rename_by_default.unwrap_or(false);
    let mut out = TimeSlicing {
        fail_requests_greater_than_one: ts.fail_requests_greater_than_one.unwrap_or(false),
        resources: Vec::new(),
    };
    let mut by_name: BTreeMap<ResourceName, String> = BTreeMap::new();
    for (i, entry) in ts.resources.unwrap_or_default().into_iter().enumerate() {
        let path = format!("{base}.resources[{i}]");
        let advertised = match (&entry.rename, rename_by_default) {
            (Some(r), _) => r.clone(),
            (None, true) => entry
                .name
                .shared()
                .map_err(|m| err(format!("{path}.name"), format!("with renameByDefault: {m}")))?,
            (None, false) => entry.name.clone(),
        };
        if let Some(other) = by_name.insert(advertised.clone(), path.clone()) {
            return Err(err(
                path.clone(),
                format!("advertises {advertised}, which {other} already advertises; give one of them another rename"),
            ));
        }
        out.resources.push(replicated_entry(
            entry,
            path,
            advertised,
            &mut Notes {
                notices: &mut *notices,
                lenient: &mut *lenient,
                extensions: &mut *extensions,
            },
        )?);
    }
    Ok(out)
}

/// Where [`validate_replicated`]'s readings go: notices, lenient readings and extensions.
struct Notes<'a> {
    notices: &'a mut Vec<String>,
    lenient: &'a mut Vec<String>,
    extensions: &'a mut Vec<String>,
}

/// One `resources[i]` entry of a replicated-resources section (at `path`, advertised as
/// `advertised`): its devices, memory limits and DRA mode checked, with their notes.
fn replicated_entry(
    entry: schema::ReplicatedResource,
    path: String,
    advertised: ResourceName,
    notes: &mut Notes,
) -> Result<SharedResource, PolicyError> {
    if let Some(rename) = &entry.rename {
        notes.notices.push(format!(
            "{path}.rename: slicelet honours rename (NVIDIA's plugin ignores it): pods must request {rename}"
        ));
    }
    let devices = lenient_devices(
        entry.devices.clone().unwrap_or_default(),
        &format!("{path}.devices"),
        notes.lenient,
    );
    if devices != DeviceSelector::All {
        notes.notices.push(if advertised == entry.name {
            format!(
                "{path}.devices: NVIDIA's plugin ignores devices and shares all; slicelet shares only the listed devices unless other devices of {advertised} would then stay whole under the same name (it shares all then, with a warning)"
            )
        } else {
            format!(
                "{path}.devices: slicelet shares only the listed devices (NVIDIA's plugin ignores devices and shares all)"
            )
        });
    }
    let memory = match entry.memory {
        Some(m) => {
            let limits = memory_limits(&m, &path)?;
            notes.extensions.push(format!(
                "{path}.memory: per-replica GPU memory limits are a slicelet extension; NVIDIA's plugin ignores them and enforces nothing"
            ));
            Some(limits)
        }
        None => None,
    };
    let mode = entry.dra.unwrap_or(schema::DraMode::Off);
    let capacity_shares = (mode == schema::DraMode::Capacity).then_some(entry.replicas.0);
    if capacity_shares.is_some() && memory.is_some() {
        return Err(err(
            format!("{path}.memory"),
            "dra: capacity shares take their memory from each claim's capacity request (exactly.capacity.requests.memory); drop memory or use dra: true".to_string(),
        ));
    }
    if capacity_shares.is_some() {
        notes.extensions.push(format!(
            "{path}.dra: capacity publishes each GPU once as a consumable-capacity DRA device (Kubernetes 1.36 or later); a slicelet extension"
        ));
    }
    Ok(SharedResource {
        path,
        source: entry.name,
        advertised,
        devices,
        replicas: if capacity_shares.is_some() {
            1
        } else {
            entry.replicas.0
        },
        dra: mode != schema::DraMode::Off,
        capacity_shares,
        memory,
    })
}

/// `memory` checked: `soft` at most `hard`.
fn memory_limits(m: &schema::MemorySpec, path: &str) -> Result<MemoryLimits, PolicyError> {
    if let Some(soft) = &m.soft {
        if soft.mib > m.hard.mib {
            return Err(err(
                format!("{path}.memory.soft"),
                format!(
                    "{} ({} MiB) is more than memory.hard {} ({} MiB); the guaranteed share cannot exceed the limit",
                    soft.text, soft.mib, m.hard.text, m.hard.mib
                ),
            ));
        }
    }
    Ok(MemoryLimits {
        hard_mib: m.hard.mib,
        soft_mib: m.soft.as_ref().map(|s| s.mib),
        enforce: m.enforce.unwrap_or_default(),
    })
}

/// `devices` with each device once; a warning in `lenient` for each device listed twice and
/// each UUID in a form NVML never reports (NVIDIA's plugin accepts both).
fn lenient_devices(
    devices: DeviceSelector,
    path: &str,
    lenient: &mut Vec<String>,
) -> DeviceSelector {
    let DeviceSelector::List(list) = devices else {
        return devices;
    };
    let mut once: Vec<DeviceRef> = Vec::with_capacity(list.len());
    for (i, d) in list.into_iter().enumerate() {
        if once.contains(&d) {
            lenient.push(format!("{path}[{i}]: {d} is listed twice; it counts once"));
            continue;
        }
        if let DeviceRef::Unmatchable(u) = &d {
            lenient.push(format!(
                "{path}[{i}]: {} is a UUID form NVML never reports (it names devices GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); it matches no device, as in NVIDIA's plugin",
                crate::uuid::truncate_id(u)
            ));
        }
        once.push(d);
    }
    DeviceSelector::List(once)
}

#[cfg(test)]
mod nvidia_forms_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
