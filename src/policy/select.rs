//! Choosing one named config from a directory of them, per node: NVIDIA's config-manager
//! semantics, in-process.
//!
//! NVIDIA's Helm chart and the GPU Operator mount one ConfigMap holding several named configs
//! (`any`, `tesla-t4`, `a100-mig`) as a directory; each key is a file. A node label
//! (`nvidia.com/device-plugin.config=<name>`, [`DEFAULT_LABEL`]) picks one per node. The rules,
//! in order, as NVIDIA's `config-manager` applies them (k8s-device-plugin, `cmd/config-manager`):
//! 1. the label is set (non-empty): that key, and it must exist;
//! 2. otherwise a default name is set (`--config-default`, NVIDIA's `DEFAULT_CONFIG`): that
//!    key, and it must exist;
//! 3. otherwise each fallback strategy in turn ([`Fallback`]; NVIDIA's `FALLBACK_STRATEGIES`,
//!    default `named,single`): `named` takes a key called `default`, `single` the only key,
//!    `empty` no config at all (no sharing: every GPU advertised whole).
//!
//! When no rule yields a config it is an error naming the keys that do exist; the daemon then
//! keeps the last good config serving and `/readyz` shows the error.
//!
//! [`choose`] is pure; [`config_keys`] lists a directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The node label NVIDIA's config-manager reads: `nvidia.com/device-plugin.config`.
pub const DEFAULT_LABEL: &str = "nvidia.com/device-plugin.config";
/// The key the `named` fallback looks for: `default`.
pub const NAMED_FALLBACK: &str = "default";

/// A fallback strategy for when neither the label nor a default names a config (NVIDIA's
/// `FALLBACK_STRATEGIES` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// `named`: the key called [`NAMED_FALLBACK`] (`default`).
    Named,
    /// `single`: the only key, when there is exactly one.
    Single,
    /// `empty`: no config, i.e. no sharing (as NVIDIA's `/dev/null` config).
    Empty,
}

/// The fallbacks NVIDIA's config-manager uses by default: `named`, then `single`.
pub const DEFAULT_FALLBACKS: [Fallback; 2] = [Fallback::Named, Fallback::Single];

impl Fallback {
    /// The name as written in `--config-fallback` / `FALLBACK_STRATEGIES`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Named => "named",
            Fallback::Single => "single",
            Fallback::Empty => "empty",
        }
    }
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fallback strategy that is not `named`, `single` or `empty`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown config fallback strategy {0:?} (allowed: named, single, empty)")]
pub struct UnknownFallback(pub String);

impl FromStr for Fallback {
    type Err = UnknownFallback;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "named" => Ok(Fallback::Named),
            "single" => Ok(Fallback::Single),
            "empty" => Ok(Fallback::Empty),
            other => Err(UnknownFallback(other.to_string())),
        }
    }
}

/// How a config is chosen from a directory: the label's key, the default name and the
/// fallbacks. Resolved once from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The node label whose value names the config (default [`DEFAULT_LABEL`]).
    pub label: String,
    /// The config used when the label is unset or empty (`--config-default`).
    pub default: Option<String>,
    /// Tried in order when neither the label nor the default names a config.
    pub fallbacks: Vec<Fallback>,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            label: DEFAULT_LABEL.to_string(),
            default: None,
            fallbacks: DEFAULT_FALLBACKS.to_vec(),
        }
    }
}

/// Which config was chosen, and by which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// A key of the directory.
    Named {
        /// The key (a file name in the directory).
        name: String,
        /// The rule that chose it (for logs and `/readyz`).
        by: Rule,
    },
    /// No config: no sharing (the `empty` fallback).
    Empty,
}

impl Choice {
    /// The key, or `None` for [`Choice::Empty`].
    pub fn name(&self) -> Option<&str> {
        match self {
            Choice::Named { name, .. } => Some(name),
            Choice::Empty => None,
        }
    }
}

/// The rule that chose a config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The node label named it.
    Label,
    /// `--config-default` named it.
    Default,
    /// A fallback strategy picked it.
    Fallback(Fallback),
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Label => f.write_str("node label"),
            Rule::Default => f.write_str("default"),
            Rule::Fallback(s) => write!(f, "fallback {s}"),
        }
    }
}

/// No config could be chosen; every variant names the keys that exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// The node label names a key the directory does not have.
    #[error("node label {label}={value} names config {value:?}, which {} does not have (keys: {})", dir.display(), list(keys))]
    LabelMissing {
        /// The directory.
        dir: PathBuf,
        /// The label's key.
        label: String,
        /// Its value.
        value: String,
        /// The keys that exist.
        keys: Vec<String>,
    },
    /// `--config-default` names a key the directory does not have.
    #[error("the default config {name:?} (--config-default) is not in {} (keys: {})", dir.display(), list(keys))]
    DefaultMissing {
        /// The directory.
        dir: PathBuf,
        /// The default name.
        name: String,
        /// The keys that exist.
        keys: Vec<String>,
    },
    /// Neither the label nor a default is set and every fallback failed.
    #[error("node label {label} is not set, no --config-default is given, and no fallback ({}) found a config in {} (keys: {})",
        fallbacks.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(","), dir.display(), list(keys))]
    NoFallback {
        /// The directory.
        dir: PathBuf,
        /// The label's key.
        label: String,
        /// The fallbacks tried.
        fallbacks: Vec<Fallback>,
        /// The keys that exist.
        keys: Vec<String>,
    },
}

fn list(keys: &[String]) -> String {
    if keys.is_empty() {
        "none".to_string()
    } else {
        keys.join(", ")
    }
}

/// Chooses a config among `keys` for a node whose label value is `label` (`None` or `""`: not
/// set), by the rules in the module header.
///
/// # Errors
/// [`SelectError`] when the label or default names a missing key, or no fallback applies.
pub fn choose(
    dir: &Path,
    keys: &BTreeSet<String>,
    label: Option<&str>,
    sel: &Selection,
) -> Result<Choice, SelectError> {
    let all = || keys.iter().cloned().collect::<Vec<_>>();
    if let Some(value) = label.filter(|v| !v.is_empty()) {
        return if keys.contains(value) {
            Ok(Choice::Named {
                name: value.to_string(),
                by: Rule::Label,
            })
        } else {
            Err(SelectError::LabelMissing {
                dir: dir.to_path_buf(),
                label: sel.label.clone(),
                value: value.to_string(),
                keys: all(),
            })
        };
    }
    if let Some(name) = sel.default.as_deref().filter(|v| !v.is_empty()) {
        return if keys.contains(name) {
            Ok(Choice::Named {
                name: name.to_string(),
                by: Rule::Default,
            })
        } else {
            Err(SelectError::DefaultMissing {
                dir: dir.to_path_buf(),
                name: name.to_string(),
                keys: all(),
            })
        };
    }
    for &f in &sel.fallbacks {
        match f {
            Fallback::Named if keys.contains(NAMED_FALLBACK) => {
                return Ok(Choice::Named {
                    name: NAMED_FALLBACK.to_string(),
                    by: Rule::Fallback(f),
                })
            }
            Fallback::Single if keys.len() == 1 => {
                return Ok(Choice::Named {
                    name: keys.iter().next().cloned().unwrap_or_default(),
                    by: Rule::Fallback(f),
                })
            }
            Fallback::Empty => return Ok(Choice::Empty),
            Fallback::Named | Fallback::Single => {}
        }
    }
    Err(SelectError::NoFallback {
        dir: dir.to_path_buf(),
        label: sel.label.clone(),
        fallbacks: sel.fallbacks.clone(),
        keys: all(),
    })
}

/// Whether `path` is a directory of named configs (a ConfigMap mounted whole) rather than one
/// policy file: it is a directory, after following symlinks.
pub fn is_config_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

/// The named configs in a directory: every entry that is not a directory (after following
/// symlinks, as a ConfigMap volume's `key -> ..data/key` links need) and whose name does not
/// start with `..` (the volume's own `..data` and `..<timestamp>` entries, which NVIDIA's
/// config-manager skips too). Names that are not UTF-8 are skipped (ConfigMap keys are ASCII).
///
/// # Errors
/// The directory cannot be read.
pub fn config_keys(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut keys = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with("..") {
            continue;
        }
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        keys.insert(name);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests;
