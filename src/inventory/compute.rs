//! Compute mode EXCLUSIVE_PROCESS on GPUs under MPS (`sharing.mps.exclusiveProcess`), set
//! through the [`GpuSource`] (NVML) before their daemons start and restored when they leave
//! MPS or slicelet stops.
//!
//! Why production users turn it on: in EXCLUSIVE_PROCESS mode only one process may hold a CUDA
//! context on the GPU, and with MPS that process is the MPS server. Every client must then go
//! through the daemon, and so under its enforced limits: a process that reaches the GPU
//! without the pipe directory (a pod run with a different runtime, a debugging shell on the
//! node, a pod of another UID) fails to create a context instead of sharing the GPU unlimited
//! next to the MPS clients. NVIDIA's MPS documentation recommends it for the same reason.
//! MIG devices are left alone: compute mode belongs to the whole GPU.

use std::collections::{BTreeMap, BTreeSet};

use super::{ComputeMode, GpuSource};

/// GPUs whose compute mode slicelet changed, with the mode each had before.
#[derive(Debug, Default)]
pub struct ComputeModes {
    saved: BTreeMap<String, Option<ComputeMode>>,
}

impl ComputeModes {
    /// Sets EXCLUSIVE_PROCESS on every GPU of `wanted` not set yet, and restores the GPUs that
    /// are no longer wanted. Failures are logged; the daemon still runs (MPS works in DEFAULT
    /// mode, only without the guarantee).
    pub fn sync(&mut self, source: &mut dyn GpuSource, wanted: &BTreeSet<String>) {
        let leaving: Vec<String> = self
            .saved
            .keys()
            .filter(|u| !wanted.contains(*u))
            .cloned()
            .collect();
        for uuid in leaving {
            self.restore(source, &uuid);
        }
        for uuid in wanted {
            if self.saved.contains_key(uuid) {
                continue;
            }
            match source.set_compute_mode(uuid, ComputeMode::ExclusiveProcess) {
                // A source without compute modes (a simulated node): nothing to restore.
                Ok(None) => {}
                Ok(Some(previous)) => {
                    tracing::info!(gpu = %uuid, previous = ?previous, "compute mode set to EXCLUSIVE_PROCESS for MPS");
                    self.saved.insert(uuid.clone(), Some(previous));
                }
                Err(e) => {
                    tracing::error!(gpu = %uuid, error = %crate::errors::chain(&e), "cannot set compute mode EXCLUSIVE_PROCESS; MPS runs without it")
                }
            }
        }
    }

    /// Restores every GPU changed (on stop).
    pub fn restore_all(&mut self, source: &mut dyn GpuSource) {
        let all: Vec<String> = self.saved.keys().cloned().collect();
        for uuid in all {
            self.restore(source, &uuid);
        }
    }

    fn restore(&mut self, source: &mut dyn GpuSource, uuid: &str) {
        let Some(previous) = self.saved.remove(uuid) else {
            return;
        };
        let mode = previous.unwrap_or(ComputeMode::Default);
        match source.set_compute_mode(uuid, mode) {
            Ok(_) => tracing::info!(gpu = %uuid, mode = ?mode, "compute mode restored"),
            Err(e) => {
                tracing::error!(gpu = %uuid, error = %crate::errors::chain(&e), "cannot restore the compute mode")
            }
        }
    }

    /// GPUs currently set by slicelet.
    pub fn changed(&self) -> impl Iterator<Item = &str> {
        self.saved.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Inventory, InventoryError};

    #[derive(Default)]
    struct Recorder {
        modes: BTreeMap<String, ComputeMode>,
        calls: Vec<(String, ComputeMode)>,
    }

    impl GpuSource for Recorder {
        fn discover(&mut self) -> Result<Inventory, InventoryError> {
            Ok(Inventory::default())
        }
        fn set_compute_mode(
            &mut self,
            uuid: &str,
            mode: ComputeMode,
        ) -> Result<Option<ComputeMode>, InventoryError> {
            self.calls.push((uuid.to_string(), mode));
            Ok(Some(
                self.modes
                    .insert(uuid.to_string(), mode)
                    .unwrap_or(ComputeMode::Default),
            ))
        }
        fn describe(&self) -> String {
            "recorder".into()
        }
    }

    #[test]
    fn set_once_and_restored_to_the_previous_mode() {
        let mut src = Recorder::default();
        src.modes.insert("GPU-b".into(), ComputeMode::Prohibited);
        let mut cm = ComputeModes::default();
        let wanted: BTreeSet<String> = ["GPU-a".to_string(), "GPU-b".to_string()].into();
        cm.sync(&mut src, &wanted);
        cm.sync(&mut src, &wanted);
        assert_eq!(src.calls.len(), 2, "set once per GPU: {:?}", src.calls);
        assert_eq!(src.modes["GPU-a"], ComputeMode::ExclusiveProcess);
        // GPU-a leaves MPS: restored at once.
        cm.sync(&mut src, &["GPU-b".to_string()].into());
        assert_eq!(src.modes["GPU-a"], ComputeMode::Default);
        assert_eq!(cm.changed().collect::<Vec<_>>(), ["GPU-b"]);
        cm.restore_all(&mut src);
        assert_eq!(src.modes["GPU-b"], ComputeMode::Prohibited);
        assert_eq!(cm.changed().count(), 0);
    }

    #[test]
    fn sources_without_compute_modes_are_a_no_op() {
        struct Plain;
        impl GpuSource for Plain {
            fn discover(&mut self) -> Result<Inventory, InventoryError> {
                Ok(Inventory::default())
            }
            fn describe(&self) -> String {
                "plain".into()
            }
        }
        let mut cm = ComputeModes::default();
        cm.sync(&mut Plain, &["GPU-a".to_string()].into());
        cm.restore_all(&mut Plain);
        assert_eq!(cm.changed().count(), 0);
    }
}
