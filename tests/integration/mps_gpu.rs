//! MPS on a real GPU (ignored by default; needs an NVIDIA GPU, its driver and
//! `nvidia-cuda-mps-control` on `PATH`):
//!
//! ```text
//! cargo test --test integration mps_gpu -- --ignored --nocapture
//! ```
//!
//! It starts the real control daemon through slicelet's supervisor on the first GPU that is not
//! in MIG mode (compute mode left unchanged, MIG mode never touched), with limits of 20 % of the
//! threads and 1024 MiB of pinned memory per client, then runs a tiny CUDA client (this test
//! binary again, calling the CUDA driver API through `libcuda.so.1`) with the pipe directory
//! Allocate injects and **no** client-side limits: an allocation under 1024 MiB must succeed and
//! one of 2048 MiB must fail, so the daemon's limit binds. The client's SM count is printed with
//! and without MPS for the thread limit (reported, not asserted: drivers differ in whether the
//! attribute reflects it). Without the control binary or libcuda it prints why and passes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use slicelet::inventory::nvml::NvmlSource;
use slicelet::inventory::GpuSource;
use slicelet::mps::{Config, Supervisor};
use slicelet::plan::{mps_dirs, MpsDaemon, MpsLimits, MpsWanted};

const CLIENT_ENV: &str = "SLICELET_TEST_MPS_CLIENT";
const LIMIT_MIB: u64 = 1024;

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// Runs this binary's client test with `pipe` (or without MPS) and returns its report line.
fn run_client(pipe: Option<&Path>) -> BTreeMap<String, i64> {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "--exact",
        "mps_gpu::cuda_client_process",
        "--ignored",
        "--nocapture",
    ])
    .env(CLIENT_ENV, "1")
    .env_remove("CUDA_VISIBLE_DEVICES")
    .env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    .env_remove("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
    match pipe {
        Some(p) => cmd.env("CUDA_MPS_PIPE_DIRECTORY", p),
        None => cmd.env("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/slicelet-no-mps"),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("MPS-CLIENT "))
        .unwrap_or_else(|| {
            panic!(
                "client printed no report:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an NVIDIA GPU and nvidia-cuda-mps-control"]
async fn real_control_daemon_enforces_its_limits() {
    let Some(control) = on_path("nvidia-cuda-mps-control") else {
        eprintln!("skipped: nvidia-cuda-mps-control is not on PATH");
        return;
    };
    let mut nvml = match NvmlSource::new(None, None) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let inventory = nvml.discover().unwrap();
    let Some(gpu) = inventory.gpus.iter().find(|g| !g.mig_enabled) else {
        eprintln!("skipped: no GPU outside MIG mode (MIG mode is never changed by this test)");
        return;
    };
    eprintln!("GPU {} {} ({} MiB)", gpu.index, gpu.uuid, gpu.memory_mib);
    let without_mps = run_client(None);
    eprintln!("without MPS: {without_mps:?}");

    let root = tempfile::tempdir().unwrap();
    let (tx, mut events) = tokio::sync::mpsc::channel(64);
    let sup = Supervisor::spawn(
        Config {
            control_binary: control,
            check_interval: Duration::from_secs(1),
            ..Config::default()
        },
        tx,
    );
    let limits = MpsLimits {
        active_thread_percentage: 20,
        pinned_memory_mib: LIMIT_MIB,
    };
    sup.want(MpsWanted {
        root: root.path().to_path_buf(),
        exclusive_process: false,
        daemons: [(
            gpu.uuid.clone(),
            MpsDaemon {
                uuid: gpu.uuid.clone(),
                gpu_index: gpu.index,
                gpu_uuid: gpu.uuid.clone(),
                mig: false,
                replicas: 5,
                limits,
                entry: "test".into(),
            },
        )]
        .into(),
    });
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(ev) = events.recv().await {
            if ev.ready {
                return ev;
            }
        }
        panic!("supervisor gone");
    })
    .await
    .expect("the real control daemon did not become ready within 60 s");
    assert_eq!(ready.applied, Some(limits));

    let pipe = mps_dirs(root.path(), &gpu.uuid).pipe;
    let client = tokio::task::spawn_blocking(move || run_client(Some(&pipe)))
        .await
        .unwrap();
    eprintln!("with MPS (20 %, {LIMIT_MIB} MiB): {client:?}");
    sup.shutdown(Duration::from_secs(10)).await;
    assert!(!mps_dirs(root.path(), &gpu.uuid).base.exists());

    assert_eq!(client["init"], 0, "cuInit under MPS");
    assert_eq!(
        client["small"], 0,
        "256 MiB must fit a {LIMIT_MIB} MiB limit"
    );
    assert_ne!(
        client["big"], 0,
        "2048 MiB must not fit a {LIMIT_MIB} MiB limit: the daemon's limit does not bind"
    );
    if let (Some(with), Some(without)) = (client.get("sm"), without_mps.get("sm")) {
        eprintln!("SMs visible: {with} with MPS at 20 %, {without} without");
    }
}

type CuResult = i32;

/// The CUDA client, run by [`real_control_daemon_enforces_its_limits`] as a child process
/// (does nothing unless `SLICELET_TEST_MPS_CLIENT` is set). Prints one report line.
#[test]
#[ignore = "a child process of real_control_daemon_enforces_its_limits"]
#[allow(unsafe_code)] // FFI to libcuda.so.1; SAFETY at the block.
fn cuda_client_process() {
    if std::env::var_os(CLIENT_ENV).is_none() {
        return;
    }
    // SAFETY: libcuda.so.1's driver API with the documented C signatures.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").expect("loading libcuda.so.1");
        let cu_init: libloading::Symbol<unsafe extern "C" fn(u32) -> CuResult> =
            lib.get(b"cuInit").unwrap();
        let device_get: libloading::Symbol<unsafe extern "C" fn(*mut i32, i32) -> CuResult> =
            lib.get(b"cuDeviceGet").unwrap();
        let attribute: libloading::Symbol<unsafe extern "C" fn(*mut i32, i32, i32) -> CuResult> =
            lib.get(b"cuDeviceGetAttribute").unwrap();
        let retain: libloading::Symbol<
            unsafe extern "C" fn(*mut *mut std::ffi::c_void, i32) -> CuResult,
        > = lib.get(b"cuDevicePrimaryCtxRetain").unwrap();
        let set_current: libloading::Symbol<
            unsafe extern "C" fn(*mut std::ffi::c_void) -> CuResult,
        > = lib.get(b"cuCtxSetCurrent").unwrap();
        let alloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> CuResult> =
            lib.get(b"cuMemAlloc_v2").unwrap();
        let free: libloading::Symbol<unsafe extern "C" fn(u64) -> CuResult> =
            lib.get(b"cuMemFree_v2").unwrap();

        let init = cu_init(0);
        let mut dev = 0i32;
        let mut sm = -1i32;
        let (mut small, mut big) = (-1, -1);
        if init == 0 && device_get(&mut dev, 0) == 0 {
            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
            let _ = attribute(&mut sm, 16, dev);
            let mut ctx = std::ptr::null_mut();
            if retain(&mut ctx, dev) == 0 && set_current(ctx) == 0 {
                let mut p = 0u64;
                small = alloc(&mut p, 256 << 20);
                if small == 0 {
                    free(p);
                }
                big = alloc(&mut p, 2048 << 20);
                if big == 0 {
                    free(p);
                }
            }
        }
        println!("MPS-CLIENT init={init} sm={sm} small={small} big={big}");
    }
}
