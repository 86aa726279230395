//! CDI name rules (from the CDI specification and its reference registry), pure: the kind a
//! policy's or the command line's names are qualified with, and device-name checks. The
//! node's spec files and name resolution are [`crate::cdi`]'s, which re-exports these.
//!
//! - A fully qualified name is `vendor/class=name`. Vendor: letters, digits, `-`, `_`, `.`,
//!   starting with a letter and ending with a letter or digit; class: letters, digits, `-`,
//!   `_`, the same ends; device name: letters, digits, `-`, `_`, `.`, `:`, starting and ending
//!   with a letter or digit.

/// The default CDI kind device names are qualified with: the NVIDIA Container Toolkit's.
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";
/// A CDI kind, vendor or device name that breaks the CDI naming rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not `vendor/class`, or the vendor or class has other characters or ends.
    #[error("`{0}` is not a CDI kind `vendor/class` (vendor: letters, digits, `-`, `_`, `.`; class: letters, digits, `-`, `_`; each starting with a letter and ending with a letter or digit)")]
    Kind(String),
    /// A device name with other characters or ends.
    #[error("`{0}` is not a CDI device name (letters, digits, `-`, `_`, `.`, `:`, starting and ending with a letter or digit)")]
    Device(String),
}

fn ends_ok(s: &str, first: impl Fn(char) -> bool) -> bool {
    s.chars().next().is_some_and(first)
        && s.chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// Checks a CDI kind `vendor/class` (such as `nvidia.com/gpu`) and returns it.
///
/// # Errors
/// [`NameError::Kind`] with the text.
pub fn parse_kind(kind: &str) -> Result<String, NameError> {
    let bad = || NameError::Kind(kind.to_string());
    let (vendor, class) = kind.split_once('/').ok_or_else(bad)?;
    let vendor_ok = ends_ok(vendor, |c| c.is_ascii_alphabetic())
        && vendor
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let class_ok = ends_ok(class, |c| c.is_ascii_alphabetic())
        && class
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if vendor_ok && class_ok {
        Ok(kind.to_string())
    } else {
        Err(bad())
    }
}

/// Checks a CDI device name (the part after `=`).
///
/// # Errors
/// [`NameError::Device`] with the text.
pub fn check_device_name(name: &str) -> Result<(), NameError> {
    let ok = ends_ok(name, |c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(NameError::Device(name.to_string()))
    }
}
