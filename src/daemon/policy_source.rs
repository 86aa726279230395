//! The policy source: the policy file (or the config chosen from a directory of named configs)
//! read and parsed off the loop, one read at a time, each answered as an [`Input`] for the fold.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::fold::Input;
use super::read_queue::ReadQueue;
use crate::policy;
use crate::policy::select;
use crate::settings::Settings;

/// Why no config file can be chosen from `--config` ([`chosen_file`]).
#[derive(Debug, thiserror::Error)]
pub enum ChoiceError {
    /// `--config` was a directory of named configs at start and no longer is one.
    #[error("{} was a directory of named configs at start and is no longer a directory", path.display())]
    NoLongerDir {
        /// The directory.
        path: PathBuf,
    },
    /// The directory cannot be read.
    #[error("reading the config directory {}: {source}", path.display())]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The configs in the directory cannot be listed.
    #[error("listing the configs in {}: {source}", path.display())]
    List {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No config can be chosen (the message names the keys that exist).
    #[error(transparent)]
    Choose(#[from] select::SelectError),
}

/// The file to read for `path`: itself, or the config chosen from a directory (`None`: the
/// `empty` fallback, no config).
///
/// # Errors
/// [`ChoiceError`]: the directory cannot be listed, or no config can be chosen (the message
/// names the keys).
///
/// Whether `path` is a directory of named configs is decided once, at start (`config_dir`): a
/// ConfigMap volume never turns into a file, so a directory replaced by a file (or removed) is
/// an error that keeps the last good config, and a file replaced by a directory is refused by
/// the read as any non-regular file is.
pub fn chosen_file(
    path: &Path,
    config_dir: bool,
    sel: &select::Selection,
    label: Option<&str>,
) -> Result<Option<PathBuf>, ChoiceError> {
    if !config_dir {
        return Ok(Some(path.to_path_buf()));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ChoiceError::NoLongerDir {
                path: path.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(ChoiceError::ReadDir {
                path: path.to_path_buf(),
                source,
            })
        }
    }
    let keys = select::config_keys(path).map_err(|source| ChoiceError::List {
        path: path.to_path_buf(),
        source,
    })?;
    match select::choose(path, &keys, label, sel)? {
        select::Choice::Named { name, by } => {
            tracing::debug!(config = %name, by = %by, "config chosen");
            Ok(Some(path.join(name)))
        }
        select::Choice::Empty => Ok(None),
    }
}

/// Reads and parses the policy (blocking; run off the loop) within the read limits
/// ([`policy::read_bounded`]: a regular file, 1 MiB, nesting checked before parsing, UTF-8), the
/// same path `slicelet validate` takes. A directory of named configs is narrowed to one first
/// ([`select`]: the node label's value `label`, the default, the fallbacks); a choice that
/// fails is an unreadable policy naming the keys that exist, so the last good one keeps
/// serving.
fn read_policy(
    path: &Path,
    config_dir: bool,
    force: bool,
    sel: &select::Selection,
    label: Option<&str>,
    overrides: &policy::FlagOverrides,
) -> Input {
    let file = match chosen_file(path, config_dir, sel, label) {
        Ok(Some(file)) => file,
        Ok(None) => {
            return Input::Policy {
                path: path.to_path_buf(),
                hash: Sha256::digest(b"").into(),
                force,
                parsed: policy::parse_with("", overrides).map(Box::new),
            }
        }
        Err(error) => {
            return Input::PolicyUnreadable {
                path: path.to_path_buf(),
                error: error.to_string(),
            }
        }
    };
    match policy::read_bounded(&file, &policy::Limits::default()) {
        Ok(text) => Input::Policy {
            path: file,
            hash: Sha256::digest(text.as_bytes()).into(),
            force,
            parsed: policy::parse_with(&text, overrides).map(Box::new),
        },
        Err(e) => Input::PolicyUnreadable {
            path: file,
            error: crate::errors::chain(&e),
        },
    }
}

/// Where the policy comes from and the reads of it: one at a time, off the loop, within
/// [`super::POLICY_READ_DEADLINE`]; a request while one runs is queued (a forced one wins).
pub(super) struct PolicySource {
    path: PathBuf,
    config_dir: bool,
    selection: select::Selection,
    overrides: policy::FlagOverrides,
    /// The reads; a queued request carries `force`.
    reads: ReadQueue<bool, Input>,
}

impl PolicySource {
    /// The policy of `settings` (`--config`; whether it is a directory of named configs is
    /// decided here, once).
    pub(super) fn new(settings: &Settings) -> Self {
        PolicySource {
            path: settings.config.clone(),
            config_dir: select::is_config_dir(&settings.config),
            selection: settings.selection.clone(),
            overrides: settings.flag_overrides.clone(),
            reads: ReadQueue::new(),
        }
    }

    /// Whether `--config` is a directory of named configs (chosen from by the node label).
    pub(super) fn is_config_dir(&self) -> bool {
        self.config_dir
    }

    /// A read of the policy for the config label `label` (`force`: apply even if the bytes did
    /// not change), to await at once (the first read) or to spawn.
    pub(super) fn read(
        &self,
        force: bool,
        label: Option<String>,
    ) -> impl std::future::Future<Output = Input> + Send + 'static {
        let path = self.path.clone();
        let config_dir = self.config_dir;
        let sel = self.selection.clone();
        let overrides = self.overrides.clone();
        let p = path.clone();
        let what = format!("reading {}", path.display());
        let read = self
            .reads
            .blocking(&what, super::POLICY_READ_DEADLINE, move || {
                read_policy(&p, config_dir, force, &sel, label.as_deref(), &overrides)
            });
        async move {
            read.await.unwrap_or_else(|e| Input::PolicyUnreadable {
                path,
                error: e.to_string(),
            })
        }
    }

    /// Asks for a read (`force`: apply even if the bytes did not change); it starts at the next
    /// [`PolicySource::start_queued`].
    pub(super) fn want(&mut self, force: bool) {
        self.reads.want(|queued| queued.unwrap_or(false) || force);
    }

    /// Starts the queued read, if any and none runs, for the config label `label`.
    pub(super) fn start_queued(&mut self, label: Option<String>) {
        if let Some(force) = self.reads.next() {
            let read = self.read(force, label);
            self.reads.start(read);
        }
    }

    /// Whether a read runs.
    pub(super) fn is_running(&self) -> bool {
        self.reads.is_running()
    }

    /// The running read's answer (pending while none runs).
    pub(super) async fn done(&mut self) -> Input {
        let path = self.path.clone();
        self.reads
            .done(|e| Input::PolicyUnreadable {
                path,
                error: format!("reading the policy failed: {e}"),
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's policy read applies NVIDIA's overrides (`MIG_STRATEGY`, …) to the file it
    /// reads and to the `empty` fallback's no-config alike.
    #[test]
    fn the_policy_read_applies_the_flag_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "version: v1\nflags:\n  migStrategy: none\n").unwrap();
        let overrides = policy::FlagOverrides {
            mig_strategy: Some(policy::MigStrategy::Mixed),
            ..Default::default()
        };
        let sel = select::Selection::default();
        let strategy = |input: Input| match input {
            Input::Policy { parsed: Ok(p), .. } => p.mig_strategy,
            _ => panic!("not a parsed policy"),
        };
        let read = read_policy(&file, false, false, &sel, None, &overrides);
        assert_eq!(strategy(read), policy::MigStrategy::Mixed);
        let plain = read_policy(&file, false, false, &sel, None, &Default::default());
        assert_eq!(strategy(plain), policy::MigStrategy::None);
        // A directory whose fallback is `empty`: no config, the overrides still apply.
        let configs = dir.path().join("configs");
        std::fs::create_dir(&configs).unwrap();
        let empty = select::Selection {
            fallbacks: vec![select::Fallback::Empty],
            ..Default::default()
        };
        let none = read_policy(&configs, true, false, &empty, None, &overrides);
        assert_eq!(strategy(none), policy::MigStrategy::Mixed);
    }
}
