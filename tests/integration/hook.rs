//! `slicelet hook set-memory-limits` run the way a container runtime runs a createContainer
//! hook: the OCI state on stdin, the bundle's `config.json` beside it, the fake NVML library
//! recording the limits per cgroup path in its state directory (shared between processes, as
//! the driver's are).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::binary::{bin, fake_nvml};
use crate::common::WAIT;

const GPU: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
const MIG: &str = "MIG-bbbbbbbb-0000-0000-0000-000000000000";
const MIB: u64 = 1024 * 1024;

struct Setup {
    dir: tempfile::TempDir,
    cgroup: PathBuf,
    state: String,
}

/// A bundle whose container's cgroup is `/kubepods/pod-a/ctr-1` under a cgroup root of the
/// test's own, an NVML inventory with driver `driver` (one H100, one with a MIG device).
fn setup(driver: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path().join("cgroup/kubepods/pod-a/ctr-1");
    std::fs::create_dir_all(&cgroup).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("config.json"),
        r#"{"ociVersion": "1.0.2", "process": {"args": ["sh"]}, "linux": {"cgroupsPath": "/kubepods/pod-a/ctr-1"}}"#,
    )
    .unwrap();
    let inventory = serde_json::json!({"driverVersion": driver, "gpus": [
        {"uuid": GPU, "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "minor": 0,
         "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0"},
        {"uuid": "GPU-bbbbbbbb-1111-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
         "memoryMiB": 81559, "minor": 1, "computeCapability": [9, 0], "pciBusId": "00000000:2A:00.0",
         "migMode": 1, "migPendingMode": 1, "maxMigDevices": 7,
         "migDevices": [{"uuid": MIG, "profile": "3g.40gb", "memoryMiB": 40320, "giId": 1, "ciId": 0}]}
    ]});
    std::fs::write(dir.path().join("nvml.json"), inventory.to_string()).unwrap();
    let state = serde_json::json!({"ociVersion": "1.0.2", "id": "ctr-1", "status": "creating",
        "pid": 4242, "bundle": bundle, "annotations": {}})
    .to_string();
    Setup { dir, cgroup, state }
}

async fn hook(s: &Setup, gpu: &str, enforce: &str) -> std::process::Output {
    hook_with(s, gpu, enforce, &[]).await
}

/// [`hook`] with more arguments.
async fn hook_with(s: &Setup, gpu: &str, enforce: &str, more: &[&str]) -> std::process::Output {
    hook_sized(s, gpu, enforce, (20480, 16384), more).await
}

/// [`hook`] setting `(hard, soft)` MiB, with more arguments.
async fn hook_sized(
    s: &Setup,
    gpu: &str,
    enforce: &str,
    (hard, soft): (u64, u64),
    more: &[&str],
) -> std::process::Output {
    let mut child = Command::new(bin())
        .args(["hook", "set-memory-limits", "--gpu", gpu])
        .args(more)
        .args(["--hard-mib", &hard.to_string()])
        .args(["--soft-mib", &soft.to_string()])
        .args(["--enforce", enforce])
        .arg("--nvml-library")
        .arg(fake_nvml())
        .arg("--cgroup-root")
        .arg(s.dir.path().join("cgroup"))
        .env("FAKE_NVML_INVENTORY", s.dir.path().join("nvml.json"))
        .env("FAKE_NVML_STATE_DIR", s.dir.path().join("nvml-state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(s.state.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.unwrap()
}

/// The fake driver's records in `<dir>/nvml-state` (`FAKE_NVML_STATE_DIR`): (GPU UUID, cgroup
/// path, soft, hard).
pub(crate) fn records(dir: &Path) -> Vec<(String, String, u64, u64)> {
    let Ok(entries) = std::fs::read_dir(dir.join("nvml-state")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let p = e.ok()?.path();
            if p.extension()? != "json" {
                return None;
            }
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
            Some((
                v["uuid"].as_str()?.to_string(),
                v["nameSpace"].as_str()?.to_string(),
                v["softLimit"].as_u64()?,
                v["hardLimit"].as_u64()?,
            ))
        })
        .collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn the_hook_sets_the_containers_cgroup_limit_and_reads_it_back() {
    let s = setup("615.20");
    let out = hook(&s, GPU, "required").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("20480 MiB hard, 16384 MiB soft"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        records(s.dir.path()),
        [(
            GPU.to_string(),
            s.cgroup.display().to_string(),
            16384 * MIB,
            20480 * MIB
        )]
    );
}

#[tokio::test]
async fn required_fails_container_creation_where_the_driver_cannot_and_best_effort_does_not() {
    // A MIG device: NVML takes no memory limits on MIG handles.
    let s = setup("615.20");
    let out = hook(&s, MIG, "required").await;
    assert!(
        !out.status.success(),
        "the hook let a container start unlimited"
    );
    assert!(stderr(&out).contains("NOT_SUPPORTED"), "{}", stderr(&out));
    let out = hook(&s, MIG, "best-effort").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("not enforced"), "{}", stderr(&out));
    assert!(records(s.dir.path()).is_empty());
    // A driver before R615.
    let s = setup("550.54.15");
    let out = hook(&s, GPU, "required").await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NOT_SUPPORTED"), "{}", stderr(&out));
    // A cgroup that does not exist (the runtime has not made it, or the path is wrong).
    let s = setup("615.20");
    std::fs::remove_dir(&s.cgroup).unwrap();
    let out = hook(&s, GPU, "required").await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NOT_FOUND"), "{}", stderr(&out));
}

/// NVML keeps one limit per GPU and cgroup. A container given two memory-limited devices of
/// one GPU (a 10 GiB resource and a 20 GiB one, through two Allocate calls; or two DRA claims'
/// shares) gets two hooks, run one after the other on its new cgroup: the second adds its
/// limits to the first's, so the container has 30 GiB, not the last hook's 20 GiB.
#[tokio::test]
async fn two_hooks_of_one_container_on_one_gpu_add_up() {
    let s = setup("615.20");
    let first = hook_sized(&s, GPU, "required", (10240, 0), &[]).await;
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(
        records(s.dir.path()),
        [(
            GPU.to_string(),
            s.cgroup.display().to_string(),
            0,
            10240 * MIB
        )]
    );
    let second = hook_sized(&s, GPU, "required", (20480, 8192), &[]).await;
    let err = stderr(&second);
    assert!(second.status.success(), "{err}");
    assert!(
        err.contains("30720 MiB hard, 8192 MiB soft")
            && err.contains("20480 MiB added to the 10240 MiB"),
        "{err}"
    );
    assert_eq!(
        records(s.dir.path()),
        [(
            GPU.to_string(),
            s.cgroup.display().to_string(),
            8192 * MIB,
            30720 * MIB
        )]
    );
}

/// A hook that blocks (here a FIFO in place of the bundle's `config.json`, as NVML's init on a
/// GPU that fell off the bus would) never hangs container creation: past its deadline the
/// watchdog ends it, exit 0 under `best-effort` with a line saying the limit was not set, exit
/// 1 under `required` with the reason. The test's own bound is [`WAIT`]; nothing sleeps.
#[tokio::test]
async fn a_blocked_hook_gives_up_at_its_deadline() {
    use std::time::{Duration, Instant};
    let s = setup("615.20");
    let config = s.dir.path().join("bundle/config.json");
    std::fs::remove_file(&config).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(&config)
        .status()
        .unwrap()
        .success());
    for (enforce, code, says) in [
        ("best-effort", 0, "not enforced (best-effort)"),
        ("required", 1, "not set under enforce: required"),
    ] {
        let started = Instant::now();
        let out = tokio::time::timeout(
            WAIT,
            hook_with(&s, GPU, enforce, &["--deadline-seconds", "0.5"]),
        )
        .await
        .unwrap_or_else(|_| panic!("{enforce}: the hook hung past {WAIT:?}"));
        let took = started.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{enforce}: {err}");
        for part in [says, GPU, "no answer within 0.5 s", "the limit was not set"] {
            assert!(err.contains(part), "{enforce}: {part} not in {err}");
        }
        assert!(took >= Duration::from_millis(500), "{enforce}: {took:?}");
    }
    assert!(records(s.dir.path()).is_empty());
}

async fn install_hook(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = Command::new(bin());
    c.arg("install-hook").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().await.unwrap()
}

/// `slicelet install-hook` (the DaemonSet's init container, the image having no shell) puts
/// this very binary at the hook's host path, mode 0755, runnable; a second run writes nothing;
/// a different file or a planted link there is replaced, never written through.
#[tokio::test]
async fn install_hook_puts_the_binary_at_the_hooks_path() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("slicelet");
    let out = install_hook(&["--to", to.to_str().unwrap()], &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("written"), "{}", stderr(&out));
    let same_as_bin = |p: &Path| std::fs::read(p).unwrap() == std::fs::read(bin()).unwrap();
    assert!(same_as_bin(&to), "the installed file is not the binary");
    let meta = std::fs::symlink_metadata(&to).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1, "a temporary file was left behind");
    let version = Command::new(&to).arg("--version").output().await.unwrap();
    assert!(version.status.success(), "{}", stderr(&version));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("slicelet "));

    // Again, the path from the environment: the same file, not rewritten.
    let out = install_hook(&[], &[("SLICELET_INSTALL_HOOK_TO", &to)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("already"), "{}", stderr(&out));
    assert_eq!(std::fs::metadata(&to).unwrap().ino(), meta.ino());

    // An older file (another mode) is replaced.
    std::fs::remove_file(&to).unwrap();
    std::fs::write(&to, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = install_hook(&["--to", to.to_str().unwrap()], &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(same_as_bin(&to));
    assert_eq!(
        std::fs::metadata(&to).unwrap().permissions().mode() & 0o7777,
        0o755
    );

    // A link planted at the path is replaced by the file; its target is left alone.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::fs::remove_file(&to).unwrap();
    std::os::unix::fs::symlink(&victim, &to).unwrap();
    let out = install_hook(&["--to", to.to_str().unwrap()], &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&to).unwrap().is_file());
    assert!(same_as_bin(&to));

    // A directory that is not there: an error naming the path, exit 1.
    let missing = dir.path().join("missing/slicelet");
    let out = install_hook(&["--to", missing.to_str().unwrap()], &[]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "installing the hook binary at {}",
            missing.display()
        )),
        "{}",
        stderr(&out)
    );
}
