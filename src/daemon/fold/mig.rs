//! MIG layouts (mig-parted files, docs/mig.md) in the fold: the layout the node asks for, what
//! it asks of the GPUs ([`crate::plan::mig_layout::layout`]), and the one GPU at a time that is
//! withdrawn from what is advertised, waited for until nothing holds it, then changed by the
//! hardware actor. Pure: the fold withdraws the GPU from its plans, tells whether the GPU is
//! free, and carries out the [`Next`] steps.
//!
//! Rules:
//! - A decision is made for one (file bytes, layout name, MIG shape of the GPUs); it is made
//!   again only when one of them changes, so a layout applied once is never re-applied in a
//!   loop, and a failed one is not retried until something changes.
//! - After the last GPU is changed the layout is decided again on the new inventory: a GPU that
//!   still differs is `failed`, never a second round.
//! - A change of the file or the name while a GPU is only withdrawn (waiting for its holders)
//!   starts over; while the hardware changes a GPU it is waited for.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use crate::inventory::Inventory;
use crate::plan::mig_layout::{self, GpuChange};
use crate::policy::MigPartedFile;

/// Why a read of the MIG layouts file (`--mig-config-file`) gave no file; the last good one
/// stays. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum LayoutsFileError {
    /// Not read within the read limits ([`crate::policy::read_bounded`]: a regular file, 1 MiB,
    /// nesting, UTF-8) or an I/O error; the message carries the whole chain.
    #[error("{}", crate::errors::chain(.0))]
    Read(crate::policy::ReadError),
    /// Read, but not a mig-parted file; the message names the field path.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// Why, with the field path.
        #[source]
        source: crate::policy::PolicyError,
    },
    /// The read did not finish: it took longer than the deadline, or its thread panicked.
    #[error(transparent)]
    Unfinished(#[from] super::super::read_queue::BlockingError),
    /// The task running the read was lost (panicked or cancelled).
    #[error("reading the MIG layouts file failed: {0}")]
    Lost(#[source] tokio::task::JoinError),
}

/// The node's `nvidia.com/mig.config.state`, as NVIDIA's mig-manager sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigConfigState {
    /// A GPU is withdrawn and waited for, or being changed.
    Pending,
    /// Every GPU the layout names is as it wants.
    Success,
    /// The layout cannot be (or could not be) applied; the reason.
    Failed(String),
}

impl MigConfigState {
    /// The label's value: `pending`, `success` or `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MigConfigState::Pending => "pending",
            MigConfigState::Success => "success",
            MigConfigState::Failed(_) => "failed",
        }
    }
}

/// The MIG shape of one GPU a decision was made for: UUID, MIG mode, (profile, first slice)
/// of each instance.
type Shape = (String, bool, Vec<(String, Option<u32>)>);

/// What a decision was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decided {
    hash: [u8; 32],
    name: String,
    shapes: Vec<Shape>,
}

/// Where the layout being applied is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Nothing under way.
    Idle,
    /// `now`'s GPU is withdrawn; changed once nothing holds it.
    Withdrawing {
        key: ([u8; 32], String),
        now: GpuChange,
        rest: VecDeque<GpuChange>,
    },
    /// The hardware actor changes `now`'s GPU.
    Applying {
        key: ([u8; 32], String),
        now: GpuChange,
        rest: VecDeque<GpuChange>,
    },
}

/// What the fold does after [`MigLayouts::next`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Next {
    /// The withdrawn GPU changed: build the plan again.
    pub replan: bool,
    /// Tell the hardware actor to change this GPU.
    pub apply: Option<GpuChange>,
    /// [`MigLayouts::state`] changed.
    pub state_changed: bool,
}

/// The layouts' part of the supervisor's state.
#[derive(Debug)]
pub struct MigLayouts {
    /// The last good file and the SHA-256 of its bytes.
    file: Option<(Arc<MigPartedFile>, [u8; 32])>,
    /// Why the last read of the file failed (cleared by a good read).
    pub file_error: Option<String>,
    /// The layout asked for (`nvidia.com/mig.config`, or `--mig-config`).
    pub name: Option<String>,
    phase: Phase,
    decided: Option<Decided>,
    /// The last GPU was changed: the next decision checks, never applies again.
    verifying: bool,
    /// The state to publish; `None`: no layout is asked for (or no file is configured).
    pub state: Option<MigConfigState>,
}

impl Default for MigLayouts {
    fn default() -> Self {
        MigLayouts {
            file: None,
            file_error: None,
            name: None,
            phase: Phase::Idle,
            decided: None,
            verifying: false,
            state: None,
        }
    }
}

fn shapes(inv: &Inventory, skip: &BTreeSet<u32>) -> Vec<Shape> {
    inv.gpus
        .iter()
        .filter(|g| !skip.contains(&g.index))
        .map(|g| {
            let mut m: Vec<(String, Option<u32>)> = g
                .mig_devices
                .iter()
                .map(|d| (d.profile.clone(), d.placement.map(|p| p.start)))
                .collect();
            m.sort();
            (g.uuid.clone(), g.mig_enabled, m)
        })
        .collect()
}

impl MigLayouts {
    /// A file was read: `Ok` (the file and the SHA-256 of its bytes) replaces the last good
    /// one; `Err` (why, naming the file and the field) keeps it.
    pub fn set_file(&mut self, read: Result<(Arc<MigPartedFile>, [u8; 32]), LayoutsFileError>) {
        match read {
            Ok(f) => {
                self.file = Some(f);
                self.file_error = None;
            }
            Err(e) => self.file_error = Some(e.to_string()),
        }
    }

    /// The GPU withdrawn from what is advertised (NVML index), while one is.
    pub fn withdrawn(&self) -> Option<u32> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Withdrawing { now, .. } | Phase::Applying { now, .. } => Some(now.index),
        }
    }

    fn key(&self) -> Option<([u8; 32], String)> {
        Some((self.file.as_ref()?.1, self.name.clone()?))
    }

    /// The next step for the inventory `inv` (the raw one; `skip`: the GPUs DRA partitions on
    /// demand), `free` telling whether nothing holds a GPU any more (its devices gone from the
    /// published plan).
    pub fn next(
        &mut self,
        inv: Option<&Inventory>,
        skip: &BTreeSet<u32>,
        free: impl Fn(u32) -> bool,
    ) -> Next {
        let before = self.state.clone();
        let mut next = Next::default();
        match &self.phase {
            Phase::Applying { .. } => {}
            Phase::Withdrawing { key, .. } if Some(key) != self.key().as_ref() => {
                self.phase = Phase::Idle;
                self.decided = None;
                next.replan = true;
                self.decide(inv, skip, &mut next);
            }
            Phase::Withdrawing { now, .. } => {
                if free(now.index) {
                    let Phase::Withdrawing { key, now, rest } =
                        std::mem::replace(&mut self.phase, Phase::Idle)
                    else {
                        unreachable!("matched above")
                    };
                    next.apply = Some(now.clone());
                    self.phase = Phase::Applying { key, now, rest };
                }
            }
            Phase::Idle => self.decide(inv, skip, &mut next),
        }
        next.state_changed = self.state != before;
        next
    }

    /// Decides what (file, name, inventory) asks for, unless it was decided for them already.
    fn decide(&mut self, inv: Option<&Inventory>, skip: &BTreeSet<u32>, next: &mut Next) {
        let (Some(name), Some(inv)) = (self.name.clone(), inv) else {
            if self.name.is_none() {
                self.state = None;
            }
            return;
        };
        let Some((file, hash)) = self.file.clone() else {
            self.state = self.file_error.clone().map(MigConfigState::Failed);
            return;
        };
        let decided = Decided {
            hash,
            name: name.clone(),
            shapes: shapes(inv, skip),
        };
        if self.decided.as_ref() == Some(&decided) {
            return;
        }
        self.decided = Some(decided);
        let verifying = std::mem::take(&mut self.verifying);
        self.state = Some(match mig_layout::layout(&file, &name, inv, skip) {
            Err(e) => MigConfigState::Failed(e.to_string()),
            Ok(changes) if changes.is_empty() => MigConfigState::Success,
            Ok(changes) if verifying => MigConfigState::Failed(format!(
                "nvidia.com/mig.config `{name}`: after applying it, GPU {} ({}) still differs from it",
                changes[0].index, changes[0].uuid
            )),
            Ok(changes) => {
                let mut rest: VecDeque<GpuChange> = changes.into();
                let now = rest.pop_front().expect("not empty");
                self.phase = Phase::Withdrawing {
                    key: (hash, name),
                    now,
                    rest,
                };
                next.replan = true;
                MigConfigState::Pending
            }
        });
    }

    /// The hardware actor changed the GPU being applied (`Ok`), or failed with the driver's
    /// reason; the discovery that followed has been folded already. A failure ends the layout
    /// `failed` (what exists is served); success moves to the next GPU, or decides again.
    pub fn applied(
        &mut self,
        result: Result<(), String>,
        inv: Option<&Inventory>,
        skip: &BTreeSet<u32>,
    ) -> Next {
        let before = self.state.clone();
        let Phase::Applying { key, now, mut rest } =
            std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return Next::default();
        };
        let mut next = Next {
            replan: true,
            ..Next::default()
        };
        match result {
            Ok(()) => match rest.pop_front() {
                Some(following) => {
                    self.phase = Phase::Withdrawing {
                        key,
                        now: following,
                        rest,
                    };
                }
                None => {
                    self.decided = None;
                    self.verifying = true;
                    self.decide(inv, skip, &mut next);
                }
            },
            Err(reason) => {
                self.state = Some(MigConfigState::Failed(format!(
                    "nvidia.com/mig.config `{}`: changing GPU {} ({}) failed: {reason}",
                    key.1, now.index, now.uuid
                )));
                // Decided for what exists now: nothing is tried again until something changes.
                self.decided = inv.map(|inv| Decided {
                    hash: key.0,
                    name: key.1,
                    shapes: shapes(inv, skip),
                });
            }
        }
        next.state_changed = self.state != before;
        next
    }
}

#[cfg(test)]
mod tests;
