//! Kubernetes extended resource names.
//!
//! Rules from Kubernetes (`IsExtendedResourceName`, `IsQualifiedName`): `<prefix>/<name>`,
//! the prefix a DNS subdomain (lowercase alphanumerics, `-`, `.`; ≤ 253 chars) outside the
//! `kubernetes.io` domain, the name part ≤ 63 chars of alphanumerics, `-`, `_`, `.`, beginning
//! and ending alphanumeric. As in NVIDIA's plugin, a name without `/` gets `nvidia.com/`.

use std::fmt;

use serde::de::{self, Deserializer, Unexpected};
use serde::Deserialize;

/// Prefix added to a resource name that has no `/`.
pub const DEFAULT_PREFIX: &str = "nvidia.com";

/// A resource name that is not a valid Kubernetes extended resource name; each variant
/// carries the text as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    /// The part before `/` is not a DNS subdomain.
    #[error(
        "`{raw}`: prefix `{prefix}` is not a DNS subdomain (lowercase letters, digits, `-`, `.`)"
    )]
    Prefix {
        /// The name as written.
        raw: String,
        /// Its prefix.
        prefix: String,
    },
    /// The prefix is in `kubernetes.io`.
    #[error("`{raw}`: the kubernetes.io domain is reserved for native resources")]
    Reserved {
        /// The name as written.
        raw: String,
    },
    /// The part after `/` is empty or longer than 63 characters.
    #[error("`{raw}`: the name after `/` must be 1 to 63 characters")]
    Length {
        /// The name as written.
        raw: String,
    },
    /// The part after `/` has other characters or ends.
    #[error("`{raw}`: the name after `/` must be letters, digits, `-`, `_`, `.`, beginning and ending with a letter or digit")]
    Characters {
        /// The name as written.
        raw: String,
    },
}

/// A validated, fully qualified extended resource name such as `nvidia.com/gpu-shared`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(String);

impl ResourceName {
    /// Qualifies (adds `nvidia.com/` when there is no `/`) and validates `raw`.
    ///
    /// # Errors
    /// [`ResourceNameError`] naming the text and what is wrong, for the caller to prefix with the
    /// field path (rules: Kubernetes extended resource names).
    pub fn parse(raw: &str) -> Result<Self, ResourceNameError> {
        let full = if raw.contains('/') {
            raw.to_string()
        } else {
            format!("{DEFAULT_PREFIX}/{raw}")
        };
        let (prefix, name) = full.split_once('/').expect("qualified above");
        if prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix) {
            return Err(ResourceNameError::Prefix {
                raw: raw.to_string(),
                prefix: prefix.to_string(),
            });
        }
        if prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io") {
            return Err(ResourceNameError::Reserved {
                raw: raw.to_string(),
            });
        }
        if name.is_empty() || name.len() > 63 {
            return Err(ResourceNameError::Length {
                raw: raw.to_string(),
            });
        }
        let ok_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        let ok_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok_chars || !ok_ends {
            return Err(ResourceNameError::Characters {
                raw: raw.to_string(),
            });
        }
        Ok(ResourceName(full))
    }

    /// The full name, e.g. `nvidia.com/gpu`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `<name>.shared`, the name `renameByDefault` gives (NVIDIA's rule).
    ///
    /// # Errors
    /// [`ResourceNameError`] when `<name>.shared` is too long.
    pub fn shared(&self) -> Result<Self, ResourceNameError> {
        Self::parse(&format!("{}.shared", self.0))
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ResourceName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ResourceName::parse(&raw).map_err(|msg| {
            de::Error::invalid_value(Unexpected::Str(&raw), &msg.to_string().as_str())
        })
    }
}

/// Whether `s` is a DNS subdomain: dot-separated labels of lowercase letters, digits and `-`, each
/// 1 to 63 characters, neither starting nor ending with `-` (Kubernetes `IsDNS1123Subdomain`,
/// without its 253-character bound, which callers check).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualifies_and_validates() {
        let cases: &[(&str, Option<&str>)] = &[
            ("gpu", Some("nvidia.com/gpu")),
            ("nvidia.com/gpu-shared", Some("nvidia.com/gpu-shared")),
            ("example.org/a_b.c", Some("example.org/a_b.c")),
            ("kubernetes.io/gpu", None),
            ("x.kubernetes.io/gpu", None),
            ("Nvidia.com/gpu", None),
            ("nvidia.com/", None),
            ("nvidia.com/-gpu", None),
            ("nvidia.com/gpu/x", None),
            ("nvidia.com/gpu shared", None),
        ];
        for (raw, want) in cases {
            let got = ResourceName::parse(raw).ok().map(|n| n.0);
            assert_eq!(got.as_deref(), *want, "{raw}");
        }
        let long = format!("nvidia.com/{}", "a".repeat(64));
        assert!(ResourceName::parse(&long).is_err());
        let ok = format!("nvidia.com/{}", "a".repeat(63));
        assert!(ResourceName::parse(&ok).is_ok());
    }
}
