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

use std::collections::BTreeMap;
use std::path::Path;

use super::cgroup::{self, PodCgroup};
use super::{checkpoint, GpuSample, Samples};
use crate::inventory::{GpuSource, InventoryError};

/// Samples `source` and attributes its processes (cgroups under `proc_root`, the checkpoint
/// at `checkpoint_path`), stamped with the current time.
///
/// # Errors
/// The source's [`InventoryError`] when it cannot be sampled at all.
pub fn sample(
    source: &mut dyn GpuSource,
    proc_root: &Path,
    checkpoint_path: &Path,
) -> Result<Samples, InventoryError> {
    let mut gpus = source.sample()?;
    attribute(&mut gpus, proc_root);
    let (checkpoint, checkpoint_error) = match checkpoint::read(checkpoint_path) {
        Ok(entries) => (Some(entries), None),
        Err(e) => (None, Some(crate::errors::chain(&e))),
    };
    Ok(Samples {
        at_unix_ms: now_unix_ms(),
        gpus,
        checkpoint,
        checkpoint_error,
    })
}

/// Fills each process's `pod_uid` and `container_id` from `<proc_root>/proc/<pid>/cgroup`
/// (each PID read once, also when it runs on several GPUs). A PID whose file is unreadable or
/// names no pod keeps `None`.
pub fn attribute(gpus: &mut [GpuSample], proc_root: &Path) {
    let mut seen: BTreeMap<u32, Option<PodCgroup>> = BTreeMap::new();
    for p in gpus.iter_mut().flat_map(|g| g.processes.iter_mut()) {
        let pod = seen.entry(p.pid).or_insert_with(|| {
            match cgroup::read(proc_root, p.pid) {
                Ok(pod) => pod,
                Err(e) => {
                    if !e.is_not_found() {
                        tracing::debug!(error = %crate::errors::chain(&e), "a GPU process's pod is unknown; counted at GPU level only");
                    }
                    None
                }
            }
        });
        p.pod_uid = pod.as_ref().map(|c| c.pod_uid.clone());
        p.container_id = pod.as_ref().and_then(|c| c.container_id.clone());
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
    use crate::usage::{CheckpointEntry, ProcessSample};

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
        let s = sample(&mut Fixed(gpus), dir.path(), &cp).unwrap();
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
        let s = sample(&mut Fixed(vec![GpuSample::default()]), dir.path(), &cp).unwrap();
        assert_eq!(s.gpus.len(), 1);
        assert_eq!(s.checkpoint, None);
        let e = s.checkpoint_error.unwrap();
        assert!(e.contains("Data: expected an object"), "{e}");
        let s = sample(&mut Fixed(vec![]), dir.path(), &dir.path().join("none")).unwrap();
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
        assert!(sample(&mut Broken, dir.path(), &cp).is_err());
    }
}
