//! slicelet's own CDI spec: one device per (memory-limited resource, unit, replica count),
//! whose only edit is the `createContainer` hook that sets the container's GPU memory limits
//! (`slicelet hook set-memory-limits`, [`crate::hook`]).
//!
//! The GPU itself (device nodes, driver libraries) still comes from the NVIDIA Container
//! Toolkit's spec: Allocate returns both names, the toolkit's `nvidia.com/gpu=<uuid>` and this
//! spec's [`KIND`]`=<name>`. A container given k replicas of one GPU gets the device for k
//! replicas (k × the entry's hard limit), so one hook sets one limit per cgroup and GPU.
//!
//! Pure: the spec is built as JSON text; the daemon writes it ([`SPEC_FILE`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plan::memory::PlannedMemory;
use crate::plan::{Plan, ResourcePlan, VirtualDevice};

/// The CDI kind of slicelet's memory-limit devices.
pub const KIND: &str = "gpu.slicelet.io/memory";
/// The spec file's name in the CDI output directory.
pub const SPEC_FILE: &str = "slicelet-memory.json";
/// Where the DaemonSet puts the hook binary on the host (an init container copies it there),
/// the path the spec's hooks name.
pub const DEFAULT_HOOK_BINARY: &str = "/var/lib/slicelet/bin/slicelet";

/// The environment variable that tells a container its GPU memory hard limit, MiB (on each
/// GPU it is limited on).
pub const LIMIT_ENV: &str = "SLICELET_GPU_MEMORY_LIMIT_MIB";

/// The `timeout` of the spec's hook entries, seconds (CDI's hook `timeout`, which the runtime
/// enforces by killing the hook): past the hook's own deadline
/// ([`crate::hook::DEFAULT_DEADLINE`], 25 s), so that under `best-effort` the hook's watchdog
/// exits 0 first; this only ends a hook that cannot run its watchdog at all.
pub const HOOK_TIMEOUT_SECONDS: u32 = 30;

/// How the spec's hooks call the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    /// The hook binary's host path.
    pub binary: PathBuf,
    /// The NVML library it loads, when not the default `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// Environment for the hook (`KEY=VALUE`), e.g. `LD_LIBRARY_PATH` where the driver's
    /// libraries are outside the loader's path.
    pub env: Vec<String>,
}

impl Default for HookConfig {
    fn default() -> Self {
        HookConfig {
            binary: PathBuf::from(DEFAULT_HOOK_BINARY),
            nvml_library: None,
            env: Vec::new(),
        }
    }
}

/// The device name for `count` replicas of a resource with limits `m` on `d`'s unit:
/// `<unit uuid>-<hard MiB>mib-x<count>`, and `-<tag>` where the resource has a
/// [`PlannedMemory::name_tag`] (another memory-limited resource of a unit has the same size);
/// CDI device names allow letters, digits, `-`, `_`, `.`, `:`.
pub fn device_name(d: &VirtualDevice, m: &PlannedMemory, count: u32) -> String {
    let hard_mib = m.limits.hard_mib;
    match &m.name_tag {
        None => format!("{}-{hard_mib}mib-x{count}", d.gpu_uuid),
        Some(tag) => format!("{}-{hard_mib}mib-x{count}-{tag}", d.gpu_uuid),
    }
}

/// The fully qualified name Allocate returns for `count` replicas of `res` on `d`'s unit, or
/// `None` when `res` has no memory limits or they are not enforced on that unit.
pub fn qualified_name(res: &ResourcePlan, d: &VirtualDevice, count: u32) -> Option<String> {
    let m = res.memory.as_ref()?;
    m.enforced(d)
        .then(|| format!("{KIND}={}", device_name(d, m, count)))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    cdi_version: &'static str,
    kind: &'static str,
    devices: Vec<Device>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    container_edits: Edits,
}

#[derive(Serialize)]
struct Edits {
    env: Vec<String>,
    hooks: Vec<Hook>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Hook {
    hook_name: &'static str,
    path: String,
    args: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    /// Seconds the runtime lets the hook run ([`HOOK_TIMEOUT_SECONDS`]).
    timeout: u32,
}

/// The CDI `createContainer` hook entry that sets `hard_mib`/`soft_mib` (0: none) on GPU
/// `gpu` for the container: `<binary> hook set-memory-limits --gpu … --hard-mib … --soft-mib
/// … --enforce …` (and `--nvml-library` when configured), with the configured environment.
fn hook_entry(
    hook: &HookConfig,
    gpu: &str,
    hard_mib: u64,
    soft_mib: u64,
    enforce: crate::policy::Enforce,
) -> Hook {
    let mut args = vec![
        path_string(&hook.binary),
        "hook".into(),
        "set-memory-limits".into(),
        "--gpu".into(),
        gpu.to_string(),
        "--hard-mib".into(),
        hard_mib.to_string(),
        "--soft-mib".into(),
        soft_mib.to_string(),
        "--enforce".into(),
        enforce.as_str().into(),
    ];
    if let Some(lib) = &hook.nvml_library {
        args.extend(["--nvml-library".into(), path_string(lib)]);
    }
    Hook {
        hook_name: "createContainer",
        path: path_string(&hook.binary),
        args,
        env: hook.env.clone(),
        timeout: HOOK_TIMEOUT_SECONDS,
    }
}

/// [`hook_entry`] as a CDI spec's JSON (`{"hookName", "path", "args", "env", "timeout"}`), for specs
/// written elsewhere (a DRA claim's share: [`crate::dra::prepare`]).
pub fn hook(
    hook: &HookConfig,
    gpu: &str,
    hard_mib: u64,
    soft_mib: u64,
    enforce: crate::policy::Enforce,
) -> serde_json::Value {
    serde_json::to_value(hook_entry(hook, gpu, hard_mib, soft_mib, enforce))
        .expect("plain data serializes")
}

/// The spec for every enforced memory-limited device of `plan` (JSON), or `None` when the plan
/// has none (the daemon removes a spec it wrote before).
pub fn spec(plan: &Plan, hook: &HookConfig) -> Option<String> {
    let mut devices = Vec::new();
    for res in plan.resources.values() {
        let Some(m) = &res.memory else { continue };
        // Replicas per unit: a container may hold 1..=n of them.
        let mut per_unit: Vec<(&VirtualDevice, u32)> = Vec::new();
        for d in &res.devices {
            match per_unit.last_mut() {
                Some((u, n)) if u.gpu_uuid == d.gpu_uuid => *n += 1,
                _ => per_unit.push((d, 1)),
            }
        }
        for (d, n) in per_unit {
            if !m.enforced(d) {
                continue;
            }
            for k in 1..=n {
                let hard = m.limits.hard_mib * u64::from(k);
                let soft = m.limits.soft_mib.unwrap_or(0) * u64::from(k);
                devices.push(Device {
                    name: device_name(d, m, k),
                    container_edits: Edits {
                        env: vec![format!("{LIMIT_ENV}={hard}")],
                        hooks: vec![hook_entry(hook, &d.gpu_uuid, hard, soft, m.limits.enforce)],
                    },
                });
            }
        }
    }
    if devices.is_empty() {
        return None;
    }
    let spec = Spec {
        cdi_version: "0.6.0",
        kind: KIND,
        devices,
    };
    Some(serde_json::to_string_pretty(&spec).expect("plain data serializes") + "\n")
}

fn path_string(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests;
