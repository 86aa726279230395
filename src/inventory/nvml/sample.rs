//! Sampling the GPUs through NVML: utilisation, memory and processes per GPU, memory per MIG
//! device (the rules are the parent module's "Sampling" section).

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

use super::NvmlSource;
use crate::inventory::sample::{GpuSample, MigSample, ProcessSample};

/// One process-utilisation sample: (PID, timestamp µs, SM percent).
pub(super) type UtilSample = (u32, u64, u32);

/// Joins the process lists (PID, memory bytes; `None`: NVML does not say) with the
/// utilisation samples since the last query (`None`: the query failed, utilisation unknown),
/// each PID once, sorted by PID (see the module documentation): memory from the first list
/// entry that gives it, SM % from the PID's newest sample, `Some(0)` for a listed PID without
/// one; a PID only in the samples has no memory figure. Percentages are capped at 100.
pub(super) fn join_processes(
    listed: &[(u32, Option<u64>)],
    samples: Option<&[UtilSample]>,
) -> Vec<ProcessSample> {
    use std::collections::BTreeMap;
    let mut by_pid: BTreeMap<u32, ProcessSample> = BTreeMap::new();
    for &(pid, memory) in listed {
        let p = by_pid.entry(pid).or_insert_with(|| ProcessSample {
            pid,
            sm_util_percent: samples.map(|_| 0),
            ..Default::default()
        });
        p.memory_used_bytes = p.memory_used_bytes.or(memory);
    }
    let mut newest: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    for &(pid, at, sm) in samples.unwrap_or_default() {
        let e = newest.entry(pid).or_insert((at, sm));
        if at > e.0 {
            *e = (at, sm);
        }
    }
    for (pid, (_, sm)) in newest {
        by_pid
            .entry(pid)
            .or_insert_with(|| ProcessSample {
                pid,
                ..Default::default()
            })
            .sm_util_percent = Some(sm.min(100));
    }
    by_pid.into_values().collect()
}

impl NvmlSource {
    /// One GPU's figures, `None` when it is lost (see the module documentation).
    pub(super) fn sample_one(&mut self, dev: &Device<'_>, index: u32) -> Option<GpuSample> {
        let uuid = dev.uuid().ok()?;
        let uuid = crate::uuid::Uuid::parse(&uuid).ok()?.to_string();
        let memory = match dev.memory_info() {
            Ok(m) => Some(m),
            Err(NvmlError::GpuLost) => return None,
            Err(_) => None,
        };
        let model = dev
            .name()
            .ok()
            .or_else(|| self.last.get(&index).map(|g| g.model.clone()))
            .unwrap_or_default();
        let utilization_percent = dev.utilization_rates().ok().map(|u| u.gpu.min(100));
        let mig_on = matches!(dev.mig_mode(), Ok(m) if m.current == 1);
        let (processes, mig) = if mig_on {
            (Vec::new(), mig_samples(dev))
        } else {
            (self.processes(dev, &uuid), Vec::new())
        };
        Some(GpuSample {
            uuid,
            index,
            model,
            utilization_percent,
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            processes,
            mig,
            ..GpuSample::default()
        })
    }

    /// The processes of a GPU without MIG, and its last-seen sample time moved on.
    fn processes(&mut self, dev: &Device<'_>, uuid: &str) -> Vec<ProcessSample> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let mut listed = Vec::new();
        for list in [
            dev.running_compute_processes(),
            dev.mps_running_compute_processes(),
        ] {
            // A list NVML refuses contributes no PIDs (those with samples still appear).
            for p in list.unwrap_or_default() {
                let memory = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                listed.push((p.pid, memory));
            }
        }
        let samples: Option<Vec<UtilSample>> =
            match dev.process_utilization_stats(self.last_seen.get(uuid).copied()) {
                Ok(s) => Some(
                    s.into_iter()
                        .map(|s| (s.pid, s.timestamp, s.sm_util))
                        .collect(),
                ),
                Err(NvmlError::NotFound) => Some(Vec::new()),
                Err(_) => None,
            };
        if let Some(newest) = samples.iter().flatten().map(|s| s.1).max() {
            let seen = self.last_seen.entry(uuid.to_string()).or_insert(0);
            *seen = (*seen).max(newest);
        }
        join_processes(&listed, samples.as_deref())
    }
}

/// The MIG devices of a MIG-enabled GPU, memory only (empty and failing slots left out).
fn mig_samples(dev: &Device<'_>) -> Vec<MigSample> {
    let mut out = Vec::new();
    for slot in 0..dev.mig_device_count().unwrap_or(0) {
        let Ok(m) = dev.mig_device_by_index(slot) else {
            continue;
        };
        let Some(uuid) = m
            .uuid()
            .ok()
            .and_then(|u| crate::uuid::Uuid::parse(&u).ok())
        else {
            continue;
        };
        let memory = m.memory_info().ok();
        out.push(MigSample {
            uuid: uuid.to_string(),
            utilization_percent: None,
            memory_used_bytes: memory.as_ref().map(|x| x.used),
            memory_total_bytes: memory.as_ref().map(|x| x.total),
        });
    }
    out
}
