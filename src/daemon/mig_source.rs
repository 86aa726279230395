//! The MIG layouts file (`--mig-config-file`, NVIDIA's mig-parted format, docs/mig.md) read and
//! parsed off the loop, one read at a time, each answered as [`Input::MigLayouts`] for the
//! fold. The same bounded read as the policy's ([`crate::policy::read_bounded`]: a regular
//! file, 1 MiB, nesting checked before parsing, UTF-8); a refusal names the file and the field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::fold::Input;
use super::policy_source::blocking_within;
use crate::policy;

/// Reads and parses `path` (blocking; run off the loop).
fn read_layouts(path: &Path) -> Input {
    let read = policy::read_bounded(path, &policy::Limits::default())
        .map_err(|e| crate::errors::chain(&e))
        .and_then(|text| {
            let hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
            policy::parse_mig_parted(&text)
                .map(|f| (Arc::new(f), hash))
                .map_err(|e| format!("{}: {e}", path.display()))
        });
    Input::MigLayouts(read)
}

/// Where the layouts come from and the reads of them: one at a time, off the loop, within
/// [`super::POLICY_READ_DEADLINE`]; a request while one runs is queued.
pub(super) struct MigSource {
    path: Option<PathBuf>,
    running: Option<JoinHandle<Input>>,
    again: bool,
}

impl MigSource {
    /// The layouts file of `--mig-config-file` (`None`: never read).
    pub(super) fn new(path: Option<PathBuf>) -> Self {
        MigSource {
            path,
            running: None,
            again: false,
        }
    }

    /// Whether a layouts file is configured.
    pub(super) fn is_configured(&self) -> bool {
        self.path.is_some()
    }

    /// A read, to await at once (the first) or to spawn; `None` without a file.
    pub(super) fn read(&self) -> Option<impl std::future::Future<Output = Input> + Send + 'static> {
        let path = self.path.clone()?;
        Some(async move {
            let p = path.clone();
            let what = format!("reading {}", path.display());
            blocking_within(&what, super::POLICY_READ_DEADLINE, move || read_layouts(&p))
                .await
                .unwrap_or_else(|e| Input::MigLayouts(Err(e.to_string())))
        })
    }

    /// Asks for a read; it starts at the next [`MigSource::start_queued`].
    pub(super) fn want(&mut self) {
        self.again = self.path.is_some();
    }

    /// Starts the queued read, if any and none runs.
    pub(super) fn start_queued(&mut self) {
        if self.running.is_none() && std::mem::take(&mut self.again) {
            if let Some(read) = self.read() {
                self.running = Some(tokio::spawn(read));
            }
        }
    }

    /// Whether a read runs.
    pub(super) fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The running read's answer (pending while none runs).
    pub(super) async fn done(&mut self) -> Input {
        let Some(running) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let done = running.await;
        self.running = None;
        done.unwrap_or_else(|e| {
            Input::MigLayouts(Err(format!("reading the MIG layouts file failed: {e}")))
        })
    }
}
