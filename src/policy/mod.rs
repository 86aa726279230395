//! The sharing policy: loading, strict parsing and validation of the policy file.
//!
//! The file format is NVIDIA k8s-device-plugin's config `version: v1`; slicelet accepts their
//! files unchanged. [`load`] and [`parse`] are the only ways a [`Policy`] comes into being.
//! Validation here is node-independent; rules that depend on the GPUs present (a GPU claimed
//! twice, a rename colliding with whole GPUs) are checked by [`crate::plan::build`].

pub mod cdi;
mod delivery;
mod mig_parted;
mod mps;
mod names;
mod overrides;
pub mod quantity;
mod read;
mod schema;
pub mod select;
mod validate;

use std::fmt;
use std::path::{Path, PathBuf};

use validate::{validate, validate_replicated};

pub use delivery::{Delivery, DeviceIdStrategy, DeviceListStrategies, DeviceListStrategy};
pub use mig_parted::{
    parse_mig_parted, parse_pci_id, DeviceFilter, MigConfigEntry, MigPartedDevices, MigPartedFile,
    MIG_PARTED_VERSION,
};
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
    /// `dra.dynamicMig.devices` (slicelet extension): the GPUs whose free MIG space DRA
    /// publishes as one device per placement of each profile (docs/mig.md, "Dynamic MIG");
    /// `None` when the key is absent. Never MIG devices (refused); GPUs only.
    pub dynamic_mig: Option<DeviceSelector>,
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
            dynamic_mig: None,
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

#[cfg(test)]
mod dynamic_mig_tests;
#[cfg(test)]
mod nvidia_forms_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
