//! NVIDIA's MIG layout files, read unchanged: the `version: v1` `mig-configs:` format of
//! `nvidia-mig-parted`, which the GPU Operator's mig-manager reads from a ConfigMap and picks
//! one named layout from by the node label `nvidia.com/mig.config`.
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-1g.10gb:
//!     - devices: all                 # `all` or a list of GPU indices
//!       device-filter: "0x233010DE"  # optional: a PCI device ID or a list of them
//!       mig-enabled: true
//!       mig-devices:                 # profile -> how many; absent or {} for none
//!         "1g.10gb": 7
//! ```
//!
//! The file is parsed strictly (an unknown key is an error naming its path, as the policy's
//! are); what a layout means on a node is decided by [`crate::plan::mig_layout`].

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::PolicyError;

/// The only `version` mig-parted files have.
pub const MIG_PARTED_VERSION: &str = "v1";

/// A mig-parted file: named layouts, each a list of entries applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPartedFile {
    /// `v1` ([`MIG_PARTED_VERSION`]).
    pub version: String,
    /// Layout name (the `nvidia.com/mig.config` label's value) → its entries.
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<MigConfigEntry>>,
}

/// One entry of a layout: the GPUs it covers and what they become.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigConfigEntry {
    /// PCI device IDs (`0x233010DE`: device `0x2330`, vendor `0x10DE`) the entry is limited
    /// to; `None`: every model.
    #[serde(rename = "device-filter", default)]
    pub device_filter: Option<DeviceFilter>,
    /// The GPUs, by NVML index.
    pub devices: MigPartedDevices,
    /// Whether MIG mode is on for them.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// MIG profile (`1g.10gb`, `1g.10gb+me`) → how many instances of it; empty with
    /// `mig-enabled: true` means MIG mode on and no instances.
    #[serde(rename = "mig-devices", default)]
    pub mig_devices: BTreeMap<String, u32>,
}

/// `device-filter`: one PCI device ID or a list of them, as mig-parted accepts both; an ID
/// YAML reads as a number (`0x233010DE` unquoted) is kept in hex.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFilter(pub Vec<String>);

impl<'de> Deserialize<'de> for DeviceFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Scalar {
            Text(String),
            Number(u64),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(Scalar),
            Many(Vec<Scalar>),
        }
        let text = |s: Scalar| match s {
            Scalar::Text(t) => t,
            Scalar::Number(n) => format!("{n:#X}").replacen("0X", "0x", 1),
        };
        Ok(DeviceFilter(match Raw::deserialize(d)? {
            Raw::One(s) => vec![text(s)],
            Raw::Many(v) => v.into_iter().map(text).collect(),
        }))
    }
}

impl DeviceFilter {
    /// The IDs, as written.
    pub fn ids(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }

    /// Whether `pci_device_id` (`nvmlPciInfo_t.pciDeviceId`: device ID in the high 16 bits,
    /// vendor ID in the low ones) is one of the IDs; an ID is hex with or without `0x`, any
    /// case.
    pub fn matches(&self, pci_device_id: u32) -> bool {
        self.ids()
            .iter()
            .any(|id| parse_pci_id(id) == Some(pci_device_id))
    }
}

/// A PCI device ID written as hex (`0x233010DE`, `233010de`).
pub fn parse_pci_id(s: &str) -> Option<u32> {
    let hex = s
        .trim()
        .strip_prefix("0x")
        .or_else(|| s.trim().strip_prefix("0X"))
        .unwrap_or(s.trim());
    u32::from_str_radix(hex, 16).ok()
}

/// `devices`: `all`, or a list of GPU indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigPartedDevices {
    /// Every GPU.
    All,
    /// These NVML indices.
    List(Vec<u32>),
}

impl MigPartedDevices {
    /// Whether GPU `index` is one of them.
    pub fn contains(&self, index: u32) -> bool {
        match self {
            MigPartedDevices::All => true,
            MigPartedDevices::List(v) => v.contains(&index),
        }
    }
}

impl fmt::Display for MigPartedDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigPartedDevices::All => f.write_str("all"),
            MigPartedDevices::List(v) => write!(f, "{v:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for MigPartedDevices {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            List(Vec<u32>),
        }
        match Raw::deserialize(d)? {
            Raw::Word(w) if w == "all" => Ok(MigPartedDevices::All),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "`{w}` is neither `all` nor a list of GPU indices"
            ))),
            Raw::List(v) => Ok(MigPartedDevices::List(v)),
        }
    }
}

/// Parses a mig-parted file's text (YAML; a leading byte-order mark ignored) and checks what
/// mig-parted itself refuses: another `version`, a `device-filter` that is not hex,
/// `mig-devices` on an entry with `mig-enabled: false`, a count of 0.
///
/// # Errors
/// [`PolicyError`] naming the field path (`mig-configs.<name>[<i>].<field>`), with line and
/// column when the parser knows them.
pub fn parse_mig_parted(text: &str) -> Result<MigPartedFile, PolicyError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let de = yaml_serde::Deserializer::from_str(text);
    let file: MigPartedFile = serde_path_to_error::deserialize(de).map_err(super::from_serde)?;
    if file.version != MIG_PARTED_VERSION {
        return Err(super::err(
            "version",
            format!(
                "`{}`: mig-parted files are version {MIG_PARTED_VERSION}",
                file.version
            ),
        ));
    }
    for (name, entries) in &file.mig_configs {
        for (i, e) in entries.iter().enumerate() {
            check_entry(&format!("mig-configs.{name}[{i}]"), e)?;
        }
    }
    Ok(file)
}

/// The checks of one entry at `path`.
fn check_entry(path: &str, e: &MigConfigEntry) -> Result<(), PolicyError> {
    if let Some(f) = &e.device_filter {
        if let Some(bad) = f.ids().into_iter().find(|id| parse_pci_id(id).is_none()) {
            return Err(super::err(
                format!("{path}.device-filter"),
                format!("`{bad}` is not a PCI device ID like 0x233010DE"),
            ));
        }
    }
    if !e.mig_enabled && !e.mig_devices.is_empty() {
        return Err(super::err(
            format!("{path}.mig-devices"),
            "MIG devices need mig-enabled: true",
        ));
    }
    if let Some((profile, _)) = e.mig_devices.iter().find(|(_, n)| **n == 0) {
        return Err(super::err(
            format!("{path}.mig-devices.{profile}"),
            "a count must be at least 1 (leave the profile out for none)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_mig_parted(text).unwrap_err().to_string()
    }

    #[test]
    fn nvidia_shapes_parse() {
        let f = parse_mig_parted(
            "version: v1\nmig-configs:\n  a:\n    - device-filter: 0x233010DE\n      devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n    - device-filter: [\"0x20B010DE\", \"20b110de\"]\n      devices: [0, 2]\n      mig-enabled: false\n",
        )
        .unwrap();
        let a = &f.mig_configs["a"];
        assert_eq!(a[0].devices, MigPartedDevices::All);
        assert!(a[0].device_filter.as_ref().unwrap().matches(0x2330_10DE));
        assert_eq!(a[0].mig_devices["1g.10gb"], 7);
        assert_eq!(a[1].devices, MigPartedDevices::List(vec![0, 2]));
        let f1 = a[1].device_filter.as_ref().unwrap();
        assert!(f1.matches(0x20B1_10DE) && f1.matches(0x20B0_10DE) && !f1.matches(0x2330_10DE));
        assert!(a[1].mig_devices.is_empty());
    }

    #[test]
    fn what_mig_parted_refuses_is_refused_by_field_path() {
        assert_eq!(
            err("version: v2\nmig-configs: {}\n"),
            "version: `v2`: mig-parted files are version v1"
        );
        assert_eq!(
            err("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}\n"),
            "mig-configs.a[0].mig-devices: MIG devices need mig-enabled: true"
        );
        assert_eq!(
            err("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 0}\n"),
            "mig-configs.a[0].mig-devices.1g.10gb: a count must be at least 1 (leave the profile out for none)"
        );
        assert_eq!(
            err("version: v1\nmig-configs:\n  a:\n    - device-filter: H100\n      devices: all\n      mig-enabled: true\n"),
            "mig-configs.a[0].device-filter: `H100` is not a PCI device ID like 0x233010DE"
        );
        assert!(err(
            "version: v1\nmig-configs:\n  a:\n    - devices: some\n      mig-enabled: true\n"
        )
        .contains("`some` is neither `all` nor a list of GPU indices"));
        assert!(err("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-device: {}\n")
            .starts_with("mig-configs.a[0]"));
    }
}
