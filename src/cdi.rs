//! CDI (Container Device Interface) device names and the node's spec files.
//!
//! With a `cdi-*` `deviceListStrategy`, Allocate names devices the way the container runtime
//! finds them in the node's CDI specs: `<kind>=<name>`, the kind `nvidia.com/gpu` by default
//! (what the NVIDIA Container Toolkit ≥ 1.18 writes to `/var/run/cdi/nvidia.yaml`, naming each
//! GPU by index and by UUID, MIG devices as `<gpu>:<mig>` and by UUID, plus `all`). slicelet
//! never writes a spec: it references the node's, and checks that every name it is about to hand
//! out resolves ([`unresolved`]); a device whose name does not is held Unhealthy by the
//! [`crate::health_tracker::Tracker`] instead of starting a pod without its GPU.
//!
//! Rules followed, from the CDI specification and its reference registry:
//! - A fully qualified name is `vendor/class=name`. Vendor: letters, digits, `-`, `_`, `.`,
//!   starting with a letter and ending with a letter or digit; class: letters, digits, `-`,
//!   `_`, the same ends; device name: letters, digits, `-`, `_`, `.`, `:`, starting and ending
//!   with a letter or digit.
//! - The spec directories are read in order (default `/etc/cdi`, then `/var/run/cdi`); files
//!   directly inside them (not in subdirectories) ending in `.json` (JSON) or `.yaml` (YAML)
//!   are specs. A name defined in a later directory overrides an earlier one; a name defined by
//!   two spec files of one directory is a conflict, and runtimes drop the device.
//! - A spec file is refused as a whole when it cannot be read or parsed, its `kind` is not
//!   `vendor/class`, or a device name is invalid or listed twice.
//!
//! Only `kind` and `devices[].name` are read (a few serde structs); every other field is left
//! to the runtime. [`read_specs`] is blocking file I/O and runs off the async runtime; it is
//! bounded: each file through [`crate::policy::read_bounded`] (a regular file, at most
//! [`MAX_SPEC_BYTES`]; a larger one is refused naming its path), at most [`MAX_DIR_BYTES`] of
//! specs and [`MAX_DIR_NAMES`] device names per directory (DRA claim specs skipped). A file's
//! text lives only while it is parsed; what is kept of it is its device names, each with the
//! number of the file that defines it (not a copy of the file's path per name).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plan::{Plan, VirtualDevice};
use crate::policy::{self, DeviceIdStrategy};

use crate::policy::cdi::{check_device_name, parse_kind};

/// The default spec directories, lowest priority first (the CDI defaults).
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// The largest spec file read, bytes (1 MiB: the toolkit's spec for 8 GPUs is tens of KiB, one
/// for 64 GPUs with seven MIG devices each a few hundred KiB).
pub const MAX_SPEC_BYTES: u64 = 1024 * 1024;
/// The most of a spec's parse error quoted, characters (the parsers quote a bad scalar whole;
/// see [`crate::errors::shorten`]).
pub const MAX_ERROR_CHARS: usize = 200;
/// The most spec bytes read per directory, in all (8 MiB: eight specs at the largest); the
/// rest are reported and skipped. A budget of bytes, not of files: slicelet's own claim specs
/// (one per prepared DRA claim, skipped, [`is_claim_spec`]) and anything else small can never
/// crowd the node's NVIDIA spec out.
pub const MAX_DIR_BYTES: u64 = 8 * 1024 * 1024;
/// The most device names kept per directory (16,384: the toolkit names 64 GPUs with seven MIG
/// devices each with about 1,000); a spec that would pass it and the rest of the directory are
/// reported and skipped. With [`MAX_DIR_BYTES`] it bounds what an index holds.
pub const MAX_DIR_NAMES: usize = 16_384;
/// The most directory entries looked at per directory (bounds the listing's memory).
pub const MAX_DIR_ENTRIES: usize = 100_000;
/// What a claim spec's file name holds between the driver and the claim's UID.
const CLAIM_SPEC_MARK: &str = "-claim_";

/// The file name of DRA claim `uid`'s CDI spec: `<driver>-claim_<uid>.json`.
pub fn claim_spec_file(driver: &str, uid: &str) -> String {
    format!("{driver}{CLAIM_SPEC_MARK}{uid}.json")
}

/// Whether `name` is a DRA claim spec's file name ([`claim_spec_file`] with a 36-character
/// UID): its kind is the driver's claim kind, never a name Allocate hands out, so the check
/// skips it.
pub fn is_claim_spec(name: &str) -> bool {
    name.strip_suffix(".json")
        .and_then(|n| n.rsplit_once(CLAIM_SPEC_MARK))
        .is_some_and(|(driver, uid)| {
            !driver.is_empty()
                && uid.len() == 36
                && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        })
}

/// How a device is named to the container runtime under `strategy`: its GPU or MIG UUID, or
/// its index (`3`; `3:1` for MIG device 1 of GPU 3). A replica is named by its GPU (or MIG
/// device): the runtime knows no replicas.
pub fn device_id(dev: &VirtualDevice, strategy: DeviceIdStrategy) -> String {
    match (strategy, &dev.mig) {
        (DeviceIdStrategy::Uuid, _) => dev.gpu_uuid.clone(),
        (DeviceIdStrategy::Index, None) => dev.gpu_index.to_string(),
        (DeviceIdStrategy::Index, Some(m)) => format!("{}:{}", dev.gpu_index, m.index),
    }
}

/// The fully qualified CDI name `<kind>=<id>` of a device.
pub fn qualified_name(kind: &str, dev: &VirtualDevice, strategy: DeviceIdStrategy) -> String {
    format!("{kind}={}", device_id(dev, strategy))
}

/// A spec file or directory that could not be used; the spec is skipped, as runtimes skip it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The file was refused before parsing or could not be read (not a regular file, too
    /// large, not UTF-8, nested too deep, an I/O error); the message names the file.
    #[error("{0}")]
    Read(String),
    /// The directory exists but could not be listed.
    #[error("listing {}: {error}", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        error: String,
    },
    /// More spec bytes than [`MAX_DIR_BYTES`], more entries than [`MAX_DIR_ENTRIES`] or more
    /// device names than [`MAX_DIR_NAMES`] in one directory.
    #[error("{} holds more than {MAX_DIR_BYTES} bytes of spec files, {MAX_DIR_ENTRIES} entries or {MAX_DIR_NAMES} device names; the rest are not read", dir.display())]
    TooMany {
        /// The directory.
        dir: PathBuf,
    },
    /// Not a CDI spec slicelet can read.
    #[error("{}: {error}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// What is wrong (parser message or naming rule).
        error: String,
    },
}

/// The part of a CDI spec file slicelet reads.
#[derive(Debug, Deserialize)]
struct SpecFile {
    kind: String,
    #[serde(default)]
    devices: Vec<SpecDevice>,
}

/// One `devices[]` entry: only its name.
#[derive(Debug, Deserialize)]
struct SpecDevice {
    name: String,
}

/// One parsed spec: its kind and device names (unqualified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `vendor/class`.
    pub kind: String,
    /// The device names, in file order.
    pub devices: Vec<String>,
}

/// Parses the text of spec file `file`: JSON when its name ends in `.json`, YAML otherwise.
///
/// # Errors
/// [`SpecError::Invalid`] naming the file: a parse error, an invalid kind or device name, or a
/// device name listed twice.
pub fn parse_spec(file: &Path, text: &str) -> Result<Spec, SpecError> {
    let invalid = |error: String| SpecError::Invalid {
        file: file.to_path_buf(),
        error: crate::errors::shorten(&error, MAX_ERROR_CHARS).into_owned(),
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let parsed: SpecFile = if file.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
    } else {
        yaml_serde::from_str(text).map_err(|e| invalid(e.to_string()))?
    };
    let kind = parse_kind(&parsed.kind).map_err(|e| invalid(format!("kind: {e}")))?;
    let mut seen = BTreeSet::new();
    let mut devices = Vec::with_capacity(parsed.devices.len());
    for (i, d) in parsed.devices.into_iter().enumerate() {
        check_device_name(&d.name).map_err(|e| invalid(format!("devices[{i}].name: {e}")))?;
        if !seen.insert(d.name.clone()) {
            return Err(invalid(format!(
                "devices[{i}].name: `{}` is defined twice in this spec",
                d.name
            )));
        }
        devices.push(d.name);
    }
    Ok(Spec { kind, devices })
}

/// Where one name is defined: the directory's position in the list and the file's in
/// [`SpecIndex::paths`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Definition {
    dir: usize,
    file: usize,
}

/// A CDI name the runtime would not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresolved {
    /// No readable spec defines it.
    #[error("CDI device {name} is not defined by any spec in {dirs}{notes}")]
    Missing {
        /// The qualified name.
        name: String,
        /// The spec directories, comma-separated.
        dirs: String,
        /// `` or `` (N spec files could not be read: first error)``.
        notes: String,
    },
    /// Two spec files of the directory that decides it define it.
    #[error("CDI device {name} is defined by both {first} and {second}; runtimes drop a device that two specs of one directory define")]
    Conflict {
        /// The qualified name.
        name: String,
        /// One file.
        first: String,
        /// Another file of the same directory.
        second: String,
    },
}

/// Every device name the node's CDI specs define, and the specs that could not be used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecIndex {
    /// The spec directories, lowest priority first.
    pub dirs: Vec<PathBuf>,
    /// Qualified name → its definitions.
    names: BTreeMap<String, Vec<Definition>>,
    /// The spec files read, in reading order (what [`Definition::file`] numbers).
    paths: Vec<PathBuf>,
    /// Specs skipped, and why.
    pub errors: Vec<SpecError>,
    /// How many spec files were read.
    pub files: usize,
}

impl SpecIndex {
    /// An empty index over `dirs` (lowest priority first).
    pub fn new(dirs: &[PathBuf]) -> Self {
        SpecIndex {
            dirs: dirs.to_vec(),
            ..SpecIndex::default()
        }
    }

    /// Records `spec`, read from `file` in the directory at position `dir` of [`Self::dirs`].
    pub fn add(&mut self, dir: usize, file: &Path, spec: &Spec) {
        self.files += 1;
        let def = Definition {
            dir,
            file: self.paths.len(),
        };
        self.paths.push(file.to_path_buf());
        for d in &spec.devices {
            self.names
                .entry(format!("{}={d}", spec.kind))
                .or_default()
                .push(def);
        }
    }

    /// How many device names the index holds (each once, however many specs define it).
    pub fn names(&self) -> usize {
        self.names.len()
    }

    /// The spec file that defines `name` (a fully qualified `kind=name`), as the runtime
    /// resolves it: the definition of the last directory that has one, unless two files of
    /// that directory define it.
    ///
    /// # Errors
    /// [`Unresolved`] naming the device: undefined, or defined twice in one directory.
    pub fn resolve(&self, name: &str) -> Result<&Path, Unresolved> {
        let defs = self.names.get(name).map(Vec::as_slice).unwrap_or_default();
        let Some(top) = defs.iter().map(|d| d.dir).max() else {
            let notes = match self.errors.first() {
                Some(e) => format!(
                    " ({} spec {} could not be used: {e})",
                    self.errors.len(),
                    if self.errors.len() == 1 {
                        "file or directory"
                    } else {
                        "files or directories"
                    }
                ),
                None if self.files == 0 => " (no spec files there)".to_string(),
                None => String::new(),
            };
            return Err(Unresolved::Missing {
                name: name.to_string(),
                dirs: self
                    .dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                notes,
            });
        };
        let mut winners = defs.iter().filter(|d| d.dir == top);
        let first = winners.next().expect("top is some definition's directory");
        match winners.next() {
            None => Ok(&self.paths[first.file]),
            Some(second) => Err(Unresolved::Conflict {
                name: name.to_string(),
                first: self.paths[first.file].display().to_string(),
                second: self.paths[second.file].display().to_string(),
            }),
        }
    }
}

/// Reads every spec in `dirs` (lowest priority first). Blocking: run it off the async runtime.
/// A directory that does not exist holds no specs (as for runtimes); everything else that
/// cannot be used is in [`SpecIndex::errors`].
pub fn read_specs(dirs: &[PathBuf]) -> SpecIndex {
    read_specs_within(dirs, MAX_DIR_BYTES, MAX_DIR_NAMES)
}

/// [`read_specs`] with a per-directory budget of `max_dir_bytes` and `max_dir_names`.
fn read_specs_within(dirs: &[PathBuf], max_dir_bytes: u64, max_dir_names: usize) -> SpecIndex {
    let mut index = SpecIndex::new(dirs);
    let limits = policy::Limits {
        max_bytes: MAX_SPEC_BYTES,
        ..policy::Limits::default()
    };
    for (pos, dir) in dirs.iter().enumerate() {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                index.errors.push(SpecError::Dir {
                    dir: dir.clone(),
                    error: e.to_string(),
                });
                continue;
            }
        };
        let mut listed = 0usize;
        let mut files: Vec<PathBuf> = Vec::new();
        for e in entries.filter_map(Result::ok) {
            listed += 1;
            if listed > MAX_DIR_ENTRIES {
                index.errors.push(SpecError::TooMany { dir: dir.clone() });
                break;
            }
            let name = e.file_name();
            let name = name.to_string_lossy();
            if (name.ends_with(".json") || name.ends_with(".yaml")) && !is_claim_spec(&name) {
                files.push(e.path());
            }
        }
        files.sort();
        let mut spent = 0u64;
        let mut names = 0usize;
        for file in files {
            // A subdirectory named `x.yaml` is not a spec (runtimes skip subdirectories).
            let Ok(meta) = std::fs::metadata(&file) else {
                index.errors.push(SpecError::Read(format!(
                    "{}: gone or unreadable",
                    file.display()
                )));
                continue;
            };
            if meta.is_dir() {
                continue;
            }
            spent = spent.saturating_add(meta.len().min(MAX_SPEC_BYTES));
            if spent > max_dir_bytes {
                index.errors.push(SpecError::TooMany { dir: dir.clone() });
                break;
            }
            let spec = policy::read_bounded(&file, &limits)
                .map_err(|e| SpecError::Read(crate::errors::chain(&e)))
                .and_then(|text| parse_spec(&file, &text));
            match spec {
                Ok(spec) => {
                    names = names.saturating_add(spec.devices.len());
                    if names > max_dir_names {
                        index.errors.push(SpecError::TooMany { dir: dir.clone() });
                        break;
                    }
                    index.add(pos, &file, &spec);
                }
                Err(e) => index.errors.push(e),
            }
        }
    }
    index
}

/// An index whose specs could not be read at all (the read failed or took too long): every
/// name is missing, with `error` as the note.
pub fn unreadable(dirs: &[PathBuf], error: String) -> SpecIndex {
    let mut index = SpecIndex::new(dirs);
    index.errors.push(SpecError::Read(error));
    index
}

/// The physical devices (GPU or MIG UUID) of `plan`'s CDI-delivered resources whose CDI name
/// does not resolve in `index`, each with the reason (the [`Unresolved`] message). Resources
/// whose `deviceListStrategy` has no `cdi-*` value are not checked.
pub fn unresolved(plan: &Plan, index: &SpecIndex) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for res in plan.resources.values() {
        let d = &res.delivery;
        if !d.strategies.uses_cdi() {
            continue;
        }
        let mut last: Option<&str> = None;
        for dev in &res.devices {
            // Devices come grouped by physical unit; check each unit once.
            if last == Some(dev.gpu_uuid.as_str()) || out.contains_key(&dev.gpu_uuid) {
                continue;
            }
            last = Some(&dev.gpu_uuid);
            let name = qualified_name(&d.cdi_kind, dev, d.id);
            if let Err(e) = index.resolve(&name) {
                out.insert(dev.gpu_uuid.clone(), e.to_string());
            }
        }
    }
    out
}

pub mod memory;

#[cfg(test)]
mod tests;
