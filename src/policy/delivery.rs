//! How a container is given the devices Allocate chose: NVIDIA k8s-device-plugin's
//! `flags.plugin.deviceListStrategy`, `flags.plugin.deviceIDStrategy` and
//! `flags.plugin.cdiAnnotationPrefix`, with NVIDIA's values and defaults.
//!
//! - `deviceListStrategy` (a string or a list; default `envvar`):
//!   - `envvar`: `NVIDIA_VISIBLE_DEVICES=<ids>`, read by the NVIDIA container runtime;
//!   - `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and one
//!     read-only bind mount of `/dev/null` per device at
//!     `/var/run/nvidia-container-devices/<id>` (for a toolkit that refuses the variable from
//!     unprivileged pods, `accept-nvidia-visible-devices-envvar-when-unprivileged = false`);
//!   - `cdi-annotations`: one container annotation `<cdiAnnotationPrefix>slicelet_<id>` whose
//!     value is the comma-joined CDI device names;
//!   - `cdi-cri`: the CDI device names in `ContainerAllocateResponse.cdi_devices` (the kubelet's
//!     `DevicePluginCDIDevices`, GA in Kubernetes 1.31).
//!
//!   Several may be combined. When every one is `cdi-*`, no `NVIDIA_VISIBLE_DEVICES` and no
//!   device specs are returned, as NVIDIA's plugin does.
//! - `deviceIDStrategy` (default `uuid`): `uuid` names a device by its GPU or MIG UUID, `index`
//!   by its index (`3`, and `<gpu>:<mig>` for a MIG device), in `NVIDIA_VISIBLE_DEVICES`, the
//!   mount paths and the CDI device names.
//! - `cdiAnnotationPrefix` (default `cdi.k8s.io/`, the CDI annotation prefix): a DNS subdomain
//!   followed by `/`, so that the annotation is a valid Kubernetes annotation key.

use std::fmt;

use serde::de::{self, Deserializer, IntoDeserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// NVIDIA's default `flags.plugin.cdiAnnotationPrefix` (the CDI annotation prefix).
pub const DEFAULT_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";

/// One value of `flags.plugin.deviceListStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
pub enum DeviceListStrategy {
    /// `envvar`: `NVIDIA_VISIBLE_DEVICES` lists the devices.
    #[serde(rename = "envvar")]
    Envvar,
    /// `volume-mounts`: one `/dev/null` bind mount per device under
    /// `/var/run/nvidia-container-devices`.
    #[serde(rename = "volume-mounts")]
    VolumeMounts,
    /// `cdi-annotations`: a container annotation with the CDI device names.
    #[serde(rename = "cdi-annotations")]
    CdiAnnotations,
    /// `cdi-cri`: the CDI device names in `ContainerAllocateResponse.cdi_devices`.
    #[serde(rename = "cdi-cri")]
    CdiCri,
}

impl DeviceListStrategy {
    /// The spelling in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceListStrategy::Envvar => "envvar",
            DeviceListStrategy::VolumeMounts => "volume-mounts",
            DeviceListStrategy::CdiAnnotations => "cdi-annotations",
            DeviceListStrategy::CdiCri => "cdi-cri",
        }
    }
}

/// The set of `flags.plugin.deviceListStrategy` values in effect (default: `envvar` alone).
/// Never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceListStrategies {
    /// `envvar` is selected.
    pub envvar: bool,
    /// `volume-mounts` is selected.
    pub volume_mounts: bool,
    /// `cdi-annotations` is selected.
    pub cdi_annotations: bool,
    /// `cdi-cri` is selected.
    pub cdi_cri: bool,
}

impl Default for DeviceListStrategies {
    fn default() -> Self {
        DeviceListStrategies::of(&[DeviceListStrategy::Envvar])
    }
}

impl DeviceListStrategies {
    /// The set holding `list` (duplicates are the same value once).
    pub fn of(list: &[DeviceListStrategy]) -> Self {
        let has = |s| list.contains(&s);
        DeviceListStrategies {
            envvar: has(DeviceListStrategy::Envvar),
            volume_mounts: has(DeviceListStrategy::VolumeMounts),
            cdi_annotations: has(DeviceListStrategy::CdiAnnotations),
            cdi_cri: has(DeviceListStrategy::CdiCri),
        }
    }

    /// Whether a `cdi-*` strategy is selected (the CDI spec files are then checked).
    pub fn uses_cdi(&self) -> bool {
        self.cdi_annotations || self.cdi_cri
    }

    /// Whether every selected strategy is `cdi-*`: no `NVIDIA_VISIBLE_DEVICES` and no device
    /// specs are returned then.
    pub fn only_cdi(&self) -> bool {
        self.uses_cdi() && !self.envvar && !self.volume_mounts
    }

    /// The selected values in the policy's spelling, in NVIDIA's order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.envvar, DeviceListStrategy::Envvar),
            (self.volume_mounts, DeviceListStrategy::VolumeMounts),
            (self.cdi_annotations, DeviceListStrategy::CdiAnnotations),
            (self.cdi_cri, DeviceListStrategy::CdiCri),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| s.as_str())
        .collect()
    }
}

impl fmt::Display for DeviceListStrategies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names().join(","))
    }
}

/// Deserializes NVIDIA's string-or-list form; an unknown value is an error naming the allowed
/// values (with its line and column), an empty list is an error (it would deliver no device).
impl<'de> Deserialize<'de> for DeviceListStrategies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DeviceListStrategies;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("envvar, volume-mounts, cdi-annotations or cdi-cri, or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let one = DeviceListStrategy::deserialize(v.into_deserializer())?;
                Ok(DeviceListStrategies::of(&[one]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut list = Vec::new();
                while let Some(s) = seq.next_element::<DeviceListStrategy>()? {
                    list.push(s);
                }
                if list.is_empty() {
                    return Err(de::Error::custom(
                        "an empty list delivers no device; use envvar, volume-mounts, cdi-annotations or cdi-cri",
                    ));
                }
                Ok(DeviceListStrategies::of(&list))
            }
        }
        d.deserialize_any(V)
    }
}

/// `flags.plugin.deviceIDStrategy`: how a device is named to the container runtime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    /// The GPU's `GPU-…` or the MIG device's `MIG-…` UUID (NVIDIA's default).
    #[default]
    Uuid,
    /// The GPU index (`3`), or `<gpu>:<mig>` for a MIG device (`3:1`, NVML's MIG index).
    Index,
}

impl DeviceIdStrategy {
    /// The spelling in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceIdStrategy::Uuid => "uuid",
            DeviceIdStrategy::Index => "index",
        }
    }
}

/// How Allocate hands devices to a container: the validated `flags.plugin` keys, and the CDI
/// kind the device names are qualified with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// `flags.plugin.deviceListStrategy`.
    pub strategies: DeviceListStrategies,
    /// `flags.plugin.deviceIDStrategy`.
    pub id: DeviceIdStrategy,
    /// `flags.plugin.cdiAnnotationPrefix`, ending in `/`.
    pub annotation_prefix: String,
    /// The CDI kind (`vendor/class`) device names are qualified with: `nvidia.com/gpu`, the
    /// kind the NVIDIA Container Toolkit's own spec uses, unless the node's `--cdi-kind`
    /// ([`Delivery::with_cdi_kind`]) says otherwise. Not a policy key: the policy is
    /// node-independent, the spec on the node is not.
    pub cdi_kind: String,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery {
            strategies: DeviceListStrategies::default(),
            id: DeviceIdStrategy::default(),
            annotation_prefix: DEFAULT_ANNOTATION_PREFIX.to_string(),
            cdi_kind: super::cdi::DEFAULT_KIND.to_string(),
        }
    }
}

impl Delivery {
    /// The same delivery with CDI names qualified by `kind` (the node's `--cdi-kind`, already
    /// checked by [`super::cdi::parse_kind`]).
    pub fn with_cdi_kind(mut self, kind: &str) -> Self {
        kind.clone_into(&mut self.cdi_kind);
        self
    }
}

/// A `cdiAnnotationPrefix` that cannot start a Kubernetes annotation key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` must be a DNS subdomain followed by `/` (like cdi.k8s.io/): the prefix of a Kubernetes annotation key")]
pub struct PrefixError(pub String);

/// Checks `flags.plugin.cdiAnnotationPrefix`: a DNS subdomain of at most 253 characters
/// followed by `/` (Kubernetes: an annotation key's optional prefix), so
/// `<prefix>slicelet_<id>` is a valid annotation key.
///
/// # Errors
/// [`PrefixError`] with the text.
pub fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    let ok = prefix.strip_suffix('/').is_some_and(|domain| {
        !domain.is_empty() && domain.len() <= 253 && super::names::is_dns_subdomain(domain)
    });
    if ok {
        Ok(())
    } else {
        Err(PrefixError(prefix.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        for ok in ["cdi.k8s.io/", "example.com/", "a/"] {
            assert!(validate_prefix(ok).is_ok(), "{ok}");
        }
        let long = format!("{}/", "a".repeat(254));
        for bad in [
            "",
            "/",
            "cdi.k8s.io",
            "CDI.io/",
            "cdi.k8s.io//",
            "a b/",
            "-a/",
            &long,
        ] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_cdi_needs_every_strategy_cdi() {
        use DeviceListStrategy::*;
        let of = DeviceListStrategies::of;
        assert!(of(&[CdiCri]).only_cdi());
        assert!(of(&[CdiCri, CdiAnnotations]).only_cdi());
        assert!(!of(&[CdiCri, Envvar]).only_cdi());
        assert!(!of(&[VolumeMounts, CdiAnnotations]).only_cdi());
        assert!(!of(&[Envvar]).uses_cdi());
        assert_eq!(
            of(&[CdiCri, Envvar, CdiCri]).to_string(),
            "envvar,cdi-cri".to_string()
        );
    }
}
