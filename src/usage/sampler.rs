//! One sample of the node, taken on the hardware actor's thread
//! ([`crate::daemon::hardware::Command::Sample`]): the source's figures
//! ([`GpuSource::sample`]), each process's pod from its cgroup ([`super::cgroup`]), and the
//! kubelet's device checkpoint ([`super::checkpoint`]).
//!
//! Everything here blocks (NVML, `/proc`, one file read) and runs only on that thread. What
//! cannot be read degrades, it does not fail the sample: a process whose cgroup is unreadable
//! (it exited, `/proc` is not the host's) has no pod and counts at GPU level only; a checkpoint
//! that is missing or not understood leaves [`Samples::checkpoint`] `None` with the reason in
//! [`Samples::checkpoint_error`]. Only the source failing as a whole is an error.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::cgroup::{self, ProcCgroup};
use super::{checkpoint, Samples};
use crate::inventory::sample::GpuSample;
use crate::inventory::sample::{CgroupLimits, LimitsRead};
use crate::inventory::{GpuSource, InventoryError};

/// Samples `source`, attributes its processes (cgroups under `proc_root`, the checkpoint at
/// `checkpoint_path`) and reads their cgroups' GPU memory limits ([`read_limits`], `watch`
/// kept between samples), stamped with the current time.
///
/// # Errors
/// The source's [`InventoryError`] when it cannot be sampled at all.
pub fn sample(
    source: &mut dyn GpuSource,
    proc_root: &Path,
    checkpoint_path: &Path,
    watch: &mut LimitWatch,
) -> Result<Samples, InventoryError> {
    let mut gpus = source.sample()?;
    attribute(&mut gpus, proc_root);
    let limits_not_cleared = read_limits(source, &mut gpus, watch);
    let (checkpoint, checkpoint_error) = match checkpoint::read(checkpoint_path) {
        Ok(entries) => (Some(entries), None),
        Err(e) => (None, Some(crate::errors::chain(&e))),
    };
    Ok(Samples {
        at_unix_ms: now_unix_ms(),
        gpus,
        checkpoint,
        checkpoint_error,
        claims: None,
        limits_not_cleared,
    })
}

/// The most (GPU, cgroup) pairs [`LimitWatch`] keeps: far above any node's containers, a bound
/// on what a host with runaway cgroups can make it hold.
pub const MAX_WATCHED_LIMITS: usize = 16_384;

/// The (GPU UUID, cgroup path) pairs seen with a memory limit, kept between samples by the
/// hardware actor, so that a removed container's cgroup is asked once more: the driver clears
/// the limits of a removed cgroup, and a limit it still reports is said (a WARN line and
/// [`Samples::limits_not_cleared`]).
#[derive(Debug, Default)]
pub struct LimitWatch {
    limited: BTreeSet<(String, String)>,
}

impl LimitWatch {
    /// How many pairs are watched.
    pub fn len(&self) -> usize {
        self.limited.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.limited.is_empty()
    }
}

/// Asks `source`, per GPU, whether it takes per-cgroup memory limits and, where it does, the
/// limits of each pod process's cgroup ([`GpuSample::cgroup_limits`], limited ones only). Then
/// asks once more for each watched cgroup no process names any more: one whose directory is
/// gone with a limit still reported is counted and logged, and every gone one is forgotten.
/// Returns the count of limits not cleared. Blocking (NVML); the hardware actor's thread.
pub fn read_limits(
    source: &mut dyn GpuSource,
    gpus: &mut [GpuSample],
    watch: &mut LimitWatch,
) -> u32 {
    let mut now = BTreeSet::new();
    for g in gpus.iter_mut() {
        g.memory_limits_supported = source.memory_limits_supported(&g.uuid);
        if g.memory_limits_supported != Some(true) {
            continue;
        }
        let cgroups: BTreeSet<String> = g
            .processes
            .iter()
            .filter_map(|p| p.cgroup.clone())
            .collect();
        for cgroup in cgroups {
            match source.memory_limits(&g.uuid, &cgroup) {
                LimitsRead::Read(reading) if reading.is_limited() => {
                    now.insert((g.uuid.clone(), cgroup.clone()));
                    g.cgroup_limits.push(CgroupLimits { cgroup, reading });
                }
                LimitsRead::Failed(e) => {
                    tracing::debug!(gpu = %g.uuid, %cgroup, error = %e, "a cgroup's GPU memory limit could not be read");
                }
                _ => {}
            }
        }
    }
    let mut not_cleared = 0;
    let before = std::mem::take(&mut watch.limited);
    let gone: Vec<(String, String)> = before.into_iter().filter(|k| !now.contains(k)).collect();
    for (gpu, cgroup) in gone {
        let keep = match source.memory_limits(&gpu, &cgroup) {
            LimitsRead::Gone { still: Some(r) } => {
                tracing::warn!(%gpu, %cgroup, hard_bytes = r.hard, soft_bytes = r.soft,
                    "the GPU memory limit of a removed cgroup was not cleared by the driver; a new cgroup at this path would start limited");
                not_cleared += 1;
                false
            }
            // The container lives on without a GPU process: ask again next time.
            LimitsRead::Read(r) => r.is_limited(),
            LimitsRead::Failed(_) => true,
            LimitsRead::Gone { still: None } | LimitsRead::Unsupported => false,
        };
        if keep {
            now.insert((gpu, cgroup));
        }
    }
    watch.limited = now.into_iter().take(MAX_WATCHED_LIMITS).collect();
    not_cleared
}

/// Fills each process's `pod_uid` and `container_id` from `<proc_root>/proc/<pid>/cgroup`
/// (each PID read once, also when it runs on several GPUs). A PID whose file is unreadable or
/// names no pod keeps `None`.
pub fn attribute(gpus: &mut [GpuSample], proc_root: &Path) {
    let mut seen: BTreeMap<u32, ProcCgroup> = BTreeMap::new();
    for p in gpus.iter_mut().flat_map(|g| g.processes.iter_mut()) {
        let read = seen.entry(p.pid).or_insert_with(|| {
            match cgroup::read(proc_root, p.pid) {
                Ok(read) => read,
                Err(e) => {
                    if !e.is_not_found() {
                        tracing::debug!(error = %crate::errors::chain(&e), "a GPU process's pod is unknown; counted at GPU level only");
                    }
                    ProcCgroup::default()
                }
            }
        });
        let pod = read.pod.as_ref();
        p.pod_uid = pod.map(|c| c.pod_uid.clone());
        p.container_id = pod.and_then(|c| c.container_id.clone());
        // Only a pod's cgroup can carry a limit slicelet set.
        p.cgroup = pod.and(read.unified.clone());
    }
}

/// Now, milliseconds since the Unix epoch (0 for a clock before 1970).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::sample::LimitReading;
    use crate::inventory::sample::ProcessSample;
    use crate::usage::CheckpointEntry;

    const ID: &str = "4f9c2a7e5b1d3c8f0a6e2b9d7c4f1a3e5b8d0c2f6a9e1b4d7c3f5a8e0b2d6c9f";

    /// A fake `/proc`: PID → cgroup file content.
    pub(crate) fn fake_proc(root: &Path, pids: &[(u32, &str)]) {
        for (pid, content) in pids {
            let p = cgroup::path(root, *pid);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }

    struct Fixed(Vec<GpuSample>);
    impl GpuSource for Fixed {
        fn discover(&mut self) -> Result<crate::inventory::Inventory, InventoryError> {
            Ok(crate::inventory::test_node(1))
        }
        fn describe(&self) -> String {
            "fixed".into()
        }
        fn sample(&mut self) -> Result<Vec<GpuSample>, InventoryError> {
            Ok(self.0.clone())
        }
    }

    fn process(pid: u32, sm: u32) -> ProcessSample {
        ProcessSample {
            pid,
            sm_util_percent: Some(sm),
            memory_used_bytes: Some(1 << 30),
            ..Default::default()
        }
    }

    #[test]
    fn processes_get_their_pods_and_the_checkpoint_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let a = "0f5a3b2c-1d4e-4f60-8a7b-9c0d1e2f3a4b";
        let b = "11111111-2222-3333-4444-555555555555";
        let c = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        let d = "99999999-8888-7777-6666-555555555555";
        fake_proc(
            dir.path(),
            &[
                // systemd + containerd, cgroup v2.
                (100, &format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n", a.replace('-', "_"))),
                // cgroupfs + containerd, cgroup v1.
                (200, &format!("5:memory:/kubepods/besteffort/pod{b}/{ID}\n0::/\n")),
                // systemd + CRI-O, Guaranteed.
                (300, &format!("0::/kubepods.slice/kubepods-pod{}.slice/crio-{ID}.scope\n", c.replace('-', "_"))),
                // cgroupfs + CRI-O.
                (400, &format!("0::/kubepods/pod{d}/crio-{ID}\n")),
                // Not a pod.
                (500, "0::/system.slice/ollama.service\n"),
            ],
        );
        let cp = dir.path().join("kubelet_internal_checkpoint");
        std::fs::write(&cp, format!(r#"{{"Data":{{"PodDeviceEntries":[{{"PodUID":"{a}","ContainerName":"cuda","ResourceName":"nvidia.com/gpu","DeviceIDs":{{"0":["GPU-0::1"]}},"AllocResp":""}}]}},"Checksum":1}}"#)).unwrap();
        let gpus = vec![
            GpuSample {
                uuid: "GPU-0".into(),
                processes: vec![process(100, 30), process(200, 10), process(500, 5)],
                ..Default::default()
            },
            GpuSample {
                uuid: "GPU-1".into(),
                // 100 again (a process on two GPUs), 300, 400, and 600 whose /proc is gone.
                processes: vec![
                    process(100, 1),
                    process(300, 2),
                    process(400, 3),
                    process(600, 4),
                ],
                ..Default::default()
            },
        ];
        let before = now_unix_ms();
        let s = sample(
            &mut Fixed(gpus),
            dir.path(),
            &cp,
            &mut LimitWatch::default(),
        )
        .unwrap();
        assert!(s.at_unix_ms >= before);
        type Row<'a> = (u32, Option<&'a str>, Option<&'a str>);
        let pods: Vec<Vec<Row>> = s
            .gpus
            .iter()
            .map(|g| {
                g.processes
                    .iter()
                    .map(|p| (p.pid, p.pod_uid.as_deref(), p.container_id.as_deref()))
                    .collect()
            })
            .collect();
        assert_eq!(
            pods,
            [
                vec![
                    (100, Some(a), Some(ID)),
                    (200, Some(b), Some(ID)),
                    (500, None, None)
                ],
                vec![
                    (100, Some(a), Some(ID)),
                    (300, Some(c), Some(ID)),
                    (400, Some(d), Some(ID)),
                    (600, None, None)
                ],
            ]
        );
        // The figures themselves are the source's.
        assert_eq!(s.gpus[0].processes[1].sm_util_percent, Some(10));
        assert_eq!(
            s.checkpoint,
            Some(vec![CheckpointEntry {
                pod_uid: a.into(),
                container: "cuda".into(),
                resource: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-0::1".into()],
            }])
        );
        assert_eq!(s.checkpoint_error, None);
    }

    #[test]
    fn a_bad_checkpoint_degrades_and_a_failing_source_fails() {
        let dir = tempfile::tempdir().unwrap();
        let cp = dir.path().join("kubelet_internal_checkpoint");
        std::fs::write(&cp, "{\"Data\": 7}").unwrap();
        let s = sample(
            &mut Fixed(vec![GpuSample::default()]),
            dir.path(),
            &cp,
            &mut LimitWatch::default(),
        )
        .unwrap();
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(s.checkpoint, None);
        let e = s.checkpoint_error.unwrap();
        assert!(e.contains("Data: expected an object"), "{e}");
        let s = sample(
            &mut Fixed(vec![]),
            dir.path(),
            &dir.path().join("none"),
            &mut LimitWatch::default(),
        )
        .unwrap();
        assert!(s.checkpoint_error.unwrap().contains("No such file"));

        struct Broken;
        impl GpuSource for Broken {
            fn discover(&mut self) -> Result<crate::inventory::Inventory, InventoryError> {
                Err(InventoryError::NvmlCount("gone".into()))
            }
            fn describe(&self) -> String {
                "broken".into()
            }
            fn sample(&mut self) -> Result<Vec<GpuSample>, InventoryError> {
                Err(InventoryError::NvmlCount("gone".into()))
            }
        }
        assert!(sample(&mut Broken, dir.path(), &cp, &mut LimitWatch::default()).is_err());
    }

    /// A driver's table of limits: (GPU, cgroup) → (limit, whether the cgroup exists), GPUs
    /// that take limits, and every query asked.
    #[derive(Default)]
    struct Driver {
        supported: Vec<&'static str>,
        table: BTreeMap<(String, String), (LimitReading, bool)>,
        asked: Vec<String>,
    }
    impl GpuSource for Driver {
        fn discover(&mut self) -> Result<crate::inventory::Inventory, InventoryError> {
            Ok(crate::inventory::test_node(1))
        }
        fn describe(&self) -> String {
            "driver".into()
        }
        fn memory_limits_supported(&mut self, uuid: &str) -> Option<bool> {
            Some(self.supported.contains(&uuid))
        }
        fn memory_limits(&mut self, uuid: &str, cgroup: &str) -> LimitsRead {
            self.asked.push(format!("{uuid} {cgroup}"));
            let none = LimitReading {
                soft: 0,
                hard: crate::inventory::sample::NO_HARD_LIMIT,
                used: 0,
            };
            match self.table.get(&(uuid.to_string(), cgroup.to_string())) {
                Some((r, true)) => LimitsRead::Read(*r),
                Some((r, false)) => LimitsRead::Gone {
                    still: r.is_limited().then_some(*r),
                },
                None => LimitsRead::Read(none),
            }
        }
    }

    fn in_cgroup(pid: u32, cgroup: &str) -> ProcessSample {
        ProcessSample {
            cgroup: Some(cgroup.into()),
            ..process(pid, 1)
        }
    }

    #[test]
    fn limits_are_read_for_pod_cgroups_and_a_removed_one_is_checked_once() {
        let limit = LimitReading {
            soft: 0,
            hard: 20 << 30,
            used: 1 << 30,
        };
        let mut driver = Driver {
            supported: vec!["GPU-0"],
            ..Driver::default()
        };
        for c in ["/a", "/b"] {
            driver
                .table
                .insert(("GPU-0".into(), c.into()), (limit, true));
        }
        let gpus = || {
            vec![
                GpuSample {
                    uuid: "GPU-0".into(),
                    processes: vec![
                        in_cgroup(1, "/a"),
                        in_cgroup(2, "/a"),
                        in_cgroup(3, "/b"),
                        in_cgroup(4, "/unlimited"),
                        process(5, 1),
                    ],
                    ..Default::default()
                },
                GpuSample {
                    uuid: "GPU-1".into(),
                    processes: vec![in_cgroup(6, "/a")],
                    ..Default::default()
                },
            ]
        };
        let mut watch = LimitWatch::default();
        let mut g = gpus();
        assert_eq!(read_limits(&mut driver, &mut g, &mut watch), 0);
        assert_eq!(g[0].memory_limits_supported, Some(true));
        // One query per cgroup (not per process), none on a GPU without limits.
        assert_eq!(driver.asked, ["GPU-0 /a", "GPU-0 /b", "GPU-0 /unlimited"]);
        let cgroups: Vec<&str> = g[0]
            .cgroup_limits
            .iter()
            .map(|c| c.cgroup.as_str())
            .collect();
        assert_eq!(cgroups, ["/a", "/b"]);
        assert_eq!(g[0].cgroup_limits[0].reading, limit);
        assert_eq!(g[1].memory_limits_supported, Some(false));
        assert!(g[1].cgroup_limits.is_empty());
        assert_eq!(watch.len(), 2);

        // /a's processes are gone but the container lives (its cgroup keeps the limit): kept.
        // /b's cgroup is gone and the driver cleared it: forgotten.
        let cleared = LimitReading {
            hard: crate::inventory::sample::NO_HARD_LIMIT,
            ..limit
        };
        driver
            .table
            .insert(("GPU-0".into(), "/b".into()), (cleared, false));
        let mut g = gpus();
        g[0].processes.retain(|p| p.pid > 3);
        driver.asked.clear();
        assert_eq!(read_limits(&mut driver, &mut g, &mut watch), 0);
        assert_eq!(driver.asked, ["GPU-0 /unlimited", "GPU-0 /a", "GPU-0 /b"]);
        assert_eq!(watch.len(), 1);

        // /a's cgroup removed, its limit still reported: counted once, then forgotten.
        driver
            .table
            .insert(("GPU-0".into(), "/a".into()), (limit, false));
        assert_eq!(read_limits(&mut driver, &mut g, &mut watch), 1);
        assert!(watch.is_empty());
        assert_eq!(read_limits(&mut driver, &mut g, &mut watch), 0);
    }
}
