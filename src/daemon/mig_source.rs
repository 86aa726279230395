//! The MIG layouts file (`--mig-config-file`, NVIDIA's mig-parted format, docs/mig.md) read and
//! parsed off the loop, one read at a time, each answered as [`Input::MigLayouts`] for the
//! fold. The same bounded read as the policy's ([`crate::policy::read_bounded`]: a regular
//! file, 1 MiB, nesting checked before parsing, UTF-8); a refusal names the file and the field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::fold::mig::LayoutsFileError;
use super::fold::Input;
use super::read_queue::ReadQueue;
use crate::policy;

/// Reads and parses `path` (blocking; run off the loop).
fn read_layouts(path: &Path) -> Input {
    let read = policy::read_bounded(path, &policy::Limits::default())
        .map_err(LayoutsFileError::Read)
        .and_then(|text| {
            let hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
            policy::parse_mig_parted(&text)
                .map(|f| (Arc::new(f), hash))
                .map_err(|source| LayoutsFileError::Parse {
                    path: path.to_path_buf(),
                    source,
                })
        });
    Input::MigLayouts(read)
}

/// Where the layouts come from and the reads of them: one at a time, off the loop, within
/// [`super::POLICY_READ_DEADLINE`]; a request while one runs is queued.
pub(super) struct MigSource {
    path: Option<PathBuf>,
    reads: ReadQueue<(), Input>,
}

impl MigSource {
    /// The layouts file of `--mig-config-file` (`None`: never read).
    pub(super) fn new(path: Option<PathBuf>) -> Self {
        MigSource {
            path,
            reads: ReadQueue::new(),
        }
    }

    /// Whether a layouts file is configured.
    pub(super) fn is_configured(&self) -> bool {
        self.path.is_some()
    }

    /// A read, to await at once (the first) or to spawn; `None` without a file.
    pub(super) fn read(&self) -> Option<impl std::future::Future<Output = Input> + Send + 'static> {
        let path = self.path.clone()?;
        let p = path.clone();
        let what = format!("reading {}", path.display());
        let read = self
            .reads
            .blocking(&what, super::POLICY_READ_DEADLINE, move || read_layouts(&p));
        Some(async move {
            read.await
                .unwrap_or_else(|e| Input::MigLayouts(Err(e.into())))
        })
    }

    /// Asks for a read; it starts at the next [`MigSource::start_queued`].
    pub(super) fn want(&mut self) {
        if self.path.is_some() {
            self.reads.want(|_| ());
        }
    }

    /// Starts the queued read, if any and none runs.
    pub(super) fn start_queued(&mut self) {
        if self.reads.next().is_some() {
            if let Some(read) = self.read() {
                self.reads.start(read);
            }
        }
    }

    /// Whether a read runs.
    pub(super) fn is_running(&self) -> bool {
        self.reads.is_running()
    }

    /// The running read's answer (pending while none runs).
    pub(super) async fn done(&mut self) -> Input {
        self.reads
            .done(|e| Input::MigLayouts(Err(LayoutsFileError::Lost(e))))
            .await
    }
}
