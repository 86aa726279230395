//! `slicelet hook set-memory-limits` run by a real OCI runtime (Debian's `runc`): slicelet's CDI
//! spec for a memory-limited device, generated from a plan, resolved and injected into the
//! bundle's `config.json` by the CDI project's own Rust library (`container-device-interface`),
//! the container created by runc, whose `createContainer` hook sets the limit through the fake
//! NVML library for the cgroup runc made.
//!
//! A crate of its own, outside the main workspace (the CDI library would otherwise be compiled
//! for every test and example build of slicelet). The hook is the slicelet binary named by
//! `SLICELET_BIN` (a `cargo build` of the main crate: `target/debug/slicelet`).
//!
//! Needs root, `runc` and a static busybox (`busybox-static`) for the root filesystem, so these
//! tests are `#[ignore]`d in a plain `cargo test`; `.ci/run` installs what is missing and runs
//! them with `SLICELET_BIN=target/debug/slicelet cargo test --manifest-path
//! tests/hook-runc/Cargo.toml -- --ignored`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};

use container_device_interface::cache::{new_cache, with_auto_refresh};
use container_device_interface::spec_dirs::with_spec_dirs;
use slicelet::cdi::memory::{qualified_name, spec, HookConfig, SPEC_FILE};
use slicelet::inventory::simulated;
use slicelet::plan;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// How long runc and the container's process may take.
const WAIT: Duration = Duration::from_secs(20);

/// The slicelet binary whose `hook set-memory-limits` runc runs (`SLICELET_BIN`).
fn bin() -> PathBuf {
    let bin = std::env::var_os("SLICELET_BIN").map(PathBuf::from).expect(
        "SLICELET_BIN: the slicelet binary to run as the hook (cargo build; target/debug/slicelet)",
    );
    assert!(
        bin.is_file(),
        "SLICELET_BIN={}: no such file",
        bin.display()
    );
    std::fs::canonicalize(&bin).unwrap()
}

/// The fake libnvidia-ml built as a dev-dependency: it sits in this test binary's `deps/`.
fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libfake_nvml.so");
    assert!(
        lib.exists(),
        "{} missing: fake-nvml is a dev-dependency",
        lib.display()
    );
    lib
}

/// The main repository (this crate is `tests/hook-runc` in it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn node_file(name: &str) -> PathBuf {
    repo().join("config/nodes").join(name)
}

/// Reads a test input, failing with its path named (not a bare `NotFound`).
fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading test input {}: {e}", path.display()))
}

/// The fake driver's records in `<dir>/nvml-state` (`FAKE_NVML_STATE_DIR`): (GPU UUID, cgroup
/// path, soft, hard).
fn records(dir: &Path) -> Vec<(String, String, u64, u64)> {
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

/// The replica `config/policy-memory.yaml` limits to 20 GiB.
const RESOURCE: &str = "nvidia.com/gpu-20gb";
const GIB: u64 = 1024 * 1024 * 1024;
/// A statically linked busybox (Debian's `busybox-static`): the container's only file.
const BUSYBOX: &str = "/bin/busybox";

/// Where the cgroup2 (unified) hierarchy is mounted, from `/proc/self/mountinfo`.
///
/// With the cgroupfs driver runc makes `linux.cgroupsPath` in every hierarchy: on the hybrid
/// layout of these machines (v1 controllers at `/sys/fs/cgroup/<controller>`, cgroup2 at
/// `/sys/fs/cgroup/unified`) a container with `/<id>/ctr` gets `/sys/fs/cgroup/memory/<id>/ctr`,
/// `/sys/fs/cgroup/cpu/<id>/ctr`, … and `/sys/fs/cgroup/unified/<id>/ctr` (its
/// `/proc/<pid>/cgroup`: `0::/<id>/ctr`, and the same path on each v1 hierarchy's line).
/// NVML limits the memory of a cgroup v2 directory, so the hook's cgroup root is the cgroup2
/// mount: `/sys/fs/cgroup/unified` here, `/sys/fs/cgroup` (the hook's default) on a host with
/// cgroup v2 alone.
fn cgroup2_root() -> PathBuf {
    cgroup_mounts()
        .into_iter()
        .find(|(fstype, _)| fstype == "cgroup2")
        .map(|(_, dir)| dir)
        .expect("no cgroup2 hierarchy mounted: NVML's memory limits need cgroup v2")
}

/// Every cgroup hierarchy's mount point, with its type (`cgroup` or `cgroup2`). Each is
/// mounted at the hierarchy's root on these machines (mountinfo's root field `/`).
fn cgroup_mounts() -> Vec<(String, PathBuf)> {
    read(Path::new("/proc/self/mountinfo"))
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let fstype = fs.split_whitespace().next()?;
            let mut fields = mount.split_whitespace();
            let root = fields.nth(3)?;
            let point = fields.next()?;
            (fstype.starts_with("cgroup") && root == "/")
                .then(|| (fstype.to_string(), PathBuf::from(point)))
        })
        .collect()
}

/// A container of this test process: its bundle, its id and its cgroup. Dropping it deletes the
/// container (`runc delete --force`, which kills its process and removes its cgroups) and the
/// parent cgroup runc made for it in every hierarchy, whatever the test got to.
struct Container {
    dir: tempfile::TempDir,
    id: String,
    /// The pod-like parent in `linux.cgroupsPath` (`<parent>/ctr`): one per container, so that
    /// removing it races no other test's container.
    parent: String,
}

impl Container {
    fn new() -> Container {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let id = format!("slicelet-hook-{}-{n}", std::process::id());
        Container {
            dir: tempfile::tempdir().unwrap(),
            parent: format!("/{id}"),
            id,
        }
    }

    fn bundle(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }

    fn cgroups_path(&self) -> String {
        format!("{}/ctr", self.parent)
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("nvml-state")
    }

    fn runc(&self) -> Command {
        let mut c = Command::new("runc");
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = std::process::Command::new("runc")
            .args(["delete", "--force", &self.id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // runc removes the container's cgroups, not the parent it made for them.
        for (_, mount) in cgroup_mounts() {
            let parent = mount.join(self.parent.trim_start_matches('/'));
            let _ = std::fs::remove_dir(parent.join("ctr"));
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// The plan of `config/policy-memory.yaml` (20 GiB replicas of GPU 0) on the 8× H100 node with
/// a driver that takes per-cgroup limits, and the CDI device name Allocate returns for one
/// replica, with its GPU's UUID.
fn planned() -> (plan::Plan, String, String) {
    let policy = slicelet::policy::parse(&read(&repo().join("config/policy-memory.yaml"))).unwrap();
    let node = node_file("h100-80gb-x8-r615.yaml");
    let inventory = simulated::parse(&node, &read(&node)).unwrap();
    let plan = plan::build(&policy, &inventory).unwrap().plan;
    let res = &plan.resources[RESOURCE];
    let device = &res.devices[0];
    let name = qualified_name(res, device, 1).expect("the policy's limit is enforced on R615");
    let uuid = device.gpu_uuid.clone();
    (plan, name, uuid)
}

/// Lays out `c`'s bundle: runc's default spec (its namespaces, the devices cgroup denying every
/// device, `RLIMIT_NOFILE`: runc applies them all as root here, as `.ci/image` runs it) with
/// busybox as the root filesystem, the process printing the limit the CDI edits put in its
/// environment, and `linux.cgroupsPath`; then slicelet's CDI spec for the plan, written to a CDI
/// directory, resolved and injected by the CDI library as a runtime does for the name Allocate
/// returns. The fake NVML driver knows GPU `uuid` as `gpu` says (merged into an H100's fields).
fn prepare(c: &Container, gpu: serde_json::Value) {
    let (_, name, _) = planned();
    prepare_with(c, gpu, vec![name]);
}

/// [`prepare`] injecting the CDI devices `names` (each a resource's, as its Allocate returns).
fn prepare_with(c: &Container, gpu: serde_json::Value, names: Vec<String>) {
    let (plan, _, uuid) = planned();
    let mut fake_gpu = serde_json::json!({"uuid": uuid, "name": "NVIDIA H100 80GB HBM3",
        "memoryMiB": 81559, "minor": 0, "computeCapability": [9, 0], "pciBusId": "00000000:17:00.0"});
    for (k, v) in gpu.as_object().unwrap() {
        fake_gpu[k] = v.clone();
    }
    let inventory = c.dir.path().join("nvml.json");
    std::fs::write(
        &inventory,
        serde_json::json!({"driverVersion": "615.20", "gpus": [fake_gpu]}).to_string(),
    )
    .unwrap();

    // The spec the daemon writes, its hook the built binary with the fake library (no
    // LD_LIBRARY_PATH: --nvml-library names it), told where the fake's inventory and records
    // are and where the cgroup2 hierarchy is.
    let hook = HookConfig {
        binary: bin(),
        nvml_library: Some(fake_nvml()),
        env: vec![
            format!("FAKE_NVML_INVENTORY={}", inventory.display()),
            format!("FAKE_NVML_STATE_DIR={}", c.state_dir().display()),
            format!("SLICELET_HOOK_CGROUP_ROOT={}", cgroup2_root().display()),
        ],
    };
    let cdi = c.dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    std::fs::write(cdi.join(SPEC_FILE), spec(&plan, &hook).unwrap()).unwrap();

    let bundle = c.bundle();
    std::fs::create_dir_all(bundle.join("rootfs/bin")).unwrap();
    std::fs::copy(BUSYBOX, bundle.join("rootfs/bin/busybox"))
        .unwrap_or_else(|e| panic!("copying {BUSYBOX} (apt-get install busybox-static): {e}"));
    let out = std::process::Command::new("runc")
        .arg("spec")
        .arg("--bundle")
        .arg(&bundle)
        .output()
        .expect("runc (apt-get install runc)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = bundle.join("config.json");
    let mut base: serde_json::Value = serde_json::from_str(&read(&config)).unwrap();
    base["process"]["terminal"] = false.into();
    base["process"]["args"] = serde_json::json!([
        "/bin/busybox",
        "sh",
        "-c",
        "echo \"$SLICELET_GPU_MEMORY_LIMIT_MIB\""
    ]);
    base["linux"]["cgroupsPath"] = c.cgroups_path().into();
    // The library's own type, `oci_spec::runtime::Spec`, inferred from inject_devices.
    let mut oci = serde_json::from_value(base).unwrap();

    let cache = new_cache(vec![
        with_spec_dirs(&[cdi.to_str().unwrap()]),
        with_auto_refresh(false),
    ]);
    let mut cache = cache.lock().unwrap();
    cache
        .refresh()
        .unwrap_or_else(|e| panic!("the CDI library refuses slicelet's spec: {e}"));
    for name in &names {
        assert!(
            cache.list_devices().contains(name),
            "{name} not among {:?}",
            cache.list_devices()
        );
    }
    // Allocate returns this name beside the toolkit's `nvidia.com/gpu=<uuid>`, whose spec
    // (device nodes, driver libraries) a machine without a GPU lacks: slicelet's alone here.
    cache
        .inject_devices(Some(&mut oci), names)
        .unwrap_or_else(|e| panic!("injecting: {e}"));
    std::fs::write(&config, serde_json::to_vec_pretty(&oci).unwrap()).unwrap();
}

/// `runc create`: its exit status and stderr. The container's stdout (runc passes its own to the
/// container's process) is returned unread: it reaches end of file when the process exits.
async fn create(c: &Container) -> (bool, String, tokio::process::ChildStdout) {
    let stderr = c.dir.path().join("runc-create.stderr");
    let mut child = c
        .runc()
        .arg("create")
        .arg("--bundle")
        .arg(c.bundle())
        .arg(&c.id)
        .stdout(Stdio::piped())
        .stderr(File::create(&stderr).unwrap())
        .spawn()
        .expect("runc (apt-get install runc)");
    let stdout = child.stdout.take().unwrap();
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("runc create hangs")
        .unwrap();
    (status.success(), read(&stderr), stdout)
}

#[tokio::test]
#[ignore = "needs root and runc: run by .ci/run"]
async fn runc_runs_the_cdi_hook_which_limits_the_containers_cgroup() {
    let c = Container::new();
    prepare(&c, serde_json::json!({}));
    let (ok, stderr, mut stdout) = create(&c).await;
    assert!(ok, "runc create failed: {stderr}");

    // The container exists and has not started: its cgroup as the kernel has it, from its
    // process (in the created state, runc's init waiting to exec).
    let out = c.runc().arg("state").arg(&c.id).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["status"], "created", "{state}");
    let pid = state["pid"].as_u64().unwrap();
    let cgroups = read(Path::new(&format!("/proc/{pid}/cgroup")));
    let unified = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup2 line in {cgroups}"));
    assert_eq!(unified, c.cgroups_path(), "{cgroups}");
    let cgroup = cgroup2_root().join(unified.trim_start_matches('/'));
    assert!(cgroup.is_dir(), "{}", cgroup.display());

    // The hook ran before the container's first instruction: the driver holds 20 GiB for the
    // container's real cgroup directory (nothing soft).
    let (_, _, uuid) = planned();
    assert_eq!(
        records(c.dir.path()),
        [(uuid, cgroup.display().to_string(), 0, 20 * GIB)]
    );

    // It runs, with the CDI edit's environment.
    let out = c.runc().arg("start").arg(&c.id).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut printed = String::new();
    tokio::time::timeout(WAIT, stdout.read_to_string(&mut printed))
        .await
        .expect("the container's process does not exit")
        .unwrap();
    assert_eq!(printed, "20480\n");
}

/// A container given a replica of each of `config/policy-memory.yaml`'s two resources of GPU 0
/// (20 GiB and 38 GiB, two Allocate calls): runc runs both devices' hooks on its cgroup, and
/// the driver holds their sum, 58 GiB.
#[tokio::test]
#[ignore = "needs root and runc: run by .ci/run"]
async fn runc_runs_two_hooks_of_one_container_which_add_up() {
    let c = Container::new();
    let (plan, twenty, uuid) = planned();
    let res = &plan.resources["nvidia.com/gpu-38gb"];
    let thirty_eight = qualified_name(res, &res.devices[0], 1).unwrap();
    prepare_with(&c, serde_json::json!({}), vec![twenty, thirty_eight]);
    let (ok, stderr, _stdout) = create(&c).await;
    assert!(ok, "runc create failed: {stderr}");
    let cgroup = cgroup2_root().join(c.cgroups_path().trim_start_matches('/'));
    assert_eq!(
        records(c.dir.path()),
        [(uuid, cgroup.display().to_string(), 0, 58 * GIB)]
    );
}

#[tokio::test]
#[ignore = "needs root and runc: run by .ci/run"]
async fn runc_fails_container_creation_when_a_required_limit_cannot_be_set() {
    let c = Container::new();
    // The driver has the feature off (as on a host on cgroup v1): NOT_SUPPORTED for this GPU.
    prepare(&c, serde_json::json!({"memoryLimits": false}));
    let (ok, stderr, _stdout) = create(&c).await;
    assert!(
        !ok,
        "runc created a container whose required limit was not set"
    );
    // runc reports the hook's failure in its own words.
    assert!(stderr.contains("error running hook"), "{stderr}");
    assert!(
        stderr.contains("GPU memory limit not set under enforce: required"),
        "{stderr}"
    );
    assert!(stderr.contains("NOT_SUPPORTED"), "{stderr}");
    assert!(records(c.dir.path()).is_empty());
    // No container is left, and runc removed the cgroup it had made.
    let out = c.runc().arg("state").arg(&c.id).output().await.unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let cgroup = cgroup2_root().join(c.cgroups_path().trim_start_matches('/'));
    assert!(!cgroup.exists(), "{}", cgroup.display());
}
