//! `slicelet plan` and `slicelet validate`: what a policy means, without a kubelet; and
//! `slicelet install-hook`, which puts the binary where the memory-limit hooks run it; and
//! `slicelet mig` ([`mig`]), MIG devices made or removed by hand.

use std::fmt::Write as _;

use crate::daemon;
use crate::plan;
use crate::policy;
use crate::settings::Settings;

pub mod mig;

/// A command failed; the message (with its sources, as `main` prints them) is what the user
/// sees.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The policy file was refused or is invalid (the error names the file and field path).
    #[error(transparent)]
    Policy(#[from] policy::LoadError),
    /// The node (NVML or the simulated node file) could not be discovered.
    #[error(transparent)]
    Node(#[from] crate::inventory::InventoryError),
    /// The policy is valid but cannot be applied to this node.
    #[error("invalid policy {path} for {node}: {error}")]
    Plan {
        /// The policy file.
        path: String,
        /// The node, e.g. `simulated node config/nodes/l4-x1.yaml`.
        node: String,
        /// What is wrong, naming the entries at fault (printed above, not also a source).
        error: Box<plan::PlanError>,
    },
    /// No config could be chosen from a directory of named configs.
    #[error("{0}")]
    Select(String),
    /// Some configs of a directory are invalid (each named, with its error).
    #[error("{} of {total} configs in {dir} are invalid:\n{}", failed.len(), failed.iter().map(|(k, e)| format!("  {k}: {e}")).collect::<Vec<_>>().join("\n"))]
    Configs {
        /// The directory.
        dir: String,
        /// How many configs it holds.
        total: usize,
        /// (key, error with its sources) for each invalid one.
        failed: Vec<(String, String)>,
    },
    /// `validate --strict`: the policy serves only because slicelet reads it as NVIDIA's
    /// plugin does (a plan fallback, or a [`crate::policy::Policy::lenient`] entry; `node` is
    /// `any node` for those).
    #[error("invalid policy {path} for {node} under --strict: {fallback}")]
    Strict {
        /// The policy file.
        path: String,
        /// The node.
        node: String,
        /// The first fallback or lenient reading, with its fix.
        fallback: String,
    },
    /// The plan could not be encoded as JSON.
    #[error("encoding the plan as JSON")]
    Json(#[source] serde_json::Error),
}

/// `slicelet validate`: Ok(report) for a valid policy (first line a one-line summary, then
/// notices and node-dependent warnings), Err with the field path otherwise.
///
/// Without `--simulate`, NVML is tried; when it is unavailable only the node-independent checks
/// run and the report says so.
///
/// # Errors
/// [`CommandError`] naming the field path (and line/column) of an invalid policy, or the
/// entries at fault for this node.
pub fn validate(settings: &Settings) -> Result<String, CommandError> {
    validate_with(settings, false)
}

/// [`validate`]; with `strict`, a policy that serves only because slicelet reads it as
/// NVIDIA's plugin does (the fallbacks [`plan::Built::fallbacks`] lists, otherwise warnings)
/// is an error. With a `cdi-*` `deviceListStrategy`, the CDI names of every device are checked
/// against the specs in [`Settings::cdi_spec_dirs`]: each one that does not resolve is a
/// warning (the daemon would advertise its devices Unhealthy).
///
/// # Errors
/// As [`validate`], and [`CommandError::Strict`].
pub fn validate_with(settings: &Settings, strict: bool) -> Result<String, CommandError> {
    let path = settings.config.display().to_string();
    let mut policy = policy::load_overridden(
        &settings.config,
        &policy::Limits::default(),
        &settings.flag_overrides,
    )?;
    policy.delivery = policy.delivery.with_cdi_kind(&settings.cdi_kind);
    let sections = entry_summary(&policy);
    if let (true, Some(l)) = (strict, policy.lenient.first().or(policy.extensions.first())) {
        return Err(CommandError::Strict {
            path,
            node: "any node".to_string(),
            fallback: l.clone(),
        });
    }
    let mut out = String::new();
    let node = daemon::discover(settings);
    // A node file the user named must be usable; only a missing NVML is "no node here".
    if settings.simulate.is_some() {
        if let Err(e) = node {
            return Err(e.into());
        }
    }
    match &node {
        Ok((inv, source)) => {
            let built = plan::build(&policy, inv).map_err(|error| CommandError::Plan {
                path: path.clone(),
                node: source.clone(),
                error: Box::new(error),
            })?;
            let _ = writeln!(
                out,
                "valid: {path} ({}, migStrategy {}); on {source} ({}): {}",
                sections,
                policy.mig_strategy.as_str(),
                plural(inv.gpus.len(), "GPU", "GPUs"),
                advertised_summary(&built.plan)
            );
            if let (true, Some(f)) = (strict, built.fallbacks.first()) {
                return Err(CommandError::Strict {
                    path,
                    node: source.clone(),
                    fallback: f.clone(),
                });
            }
            for w in plan_warnings(&built) {
                let _ = writeln!(out, "warning: {w}");
            }
            if policy.delivery.strategies.uses_cdi() {
                out.push_str(&cdi_report(&built.plan, &settings.cdi_spec_dirs));
            }
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "valid: {path} ({}, migStrategy {}); node checks skipped (no NVML here; --simulate NODE.yaml checks against a node file): {e}",
                sections,
                policy.mig_strategy.as_str()
            );
        }
    }
    for w in policy_warnings(&policy) {
        let _ = writeln!(out, "warning: {w}");
    }
    for n in &policy.notices {
        let _ = writeln!(out, "notice: {n}");
    }
    Ok(out)
}

/// How many entries the policy has: `3 time-slicing entries[, 1 MPS entry]`.
fn entry_summary(policy: &policy::Policy) -> String {
    let entries = policy.time_slicing.resources.len();
    let mut sections = plural(entries, "time-slicing entry", "time-slicing entries");
    if !policy.mps.resources.is_empty() {
        sections.push_str(&format!(
            ", {}",
            plural(policy.mps.resources.len(), "MPS entry", "MPS entries")
        ));
    }
    sections
}

/// What a plan advertises: `name ×devices, …`, or `nothing advertised`.
fn advertised_summary(plan: &plan::Plan) -> String {
    let resources: Vec<String> = plan
        .resources
        .values()
        .map(|r| format!("{} ×{}", r.name, r.devices.len()))
        .collect();
    if resources.is_empty() {
        "nothing advertised".to_string()
    } else {
        resources.join(", ")
    }
}

/// The warnings of a plan on a node: where the policy was read as NVIDIA's plugin reads it
/// (the fallbacks), then what does not apply here (entries that match nothing, …).
fn plan_warnings(built: &plan::Built) -> impl Iterator<Item = &String> {
    built.fallbacks.iter().chain(&built.warnings)
}

/// The warnings of a policy on any node: the keys of NVIDIA's schema it sets and slicelet does
/// not act on, and what NVIDIA's plugin accepts but is probably a mistake.
fn policy_warnings(policy: &policy::Policy) -> Vec<String> {
    policy
        .ignored_keys
        .iter()
        .map(|k| {
            format!("{k} is recognised (NVIDIA config v1) but slicelet does not act on it yet")
        })
        .chain(policy.lenient.iter().cloned())
        .collect()
}

/// The settings with `--config` narrowed to one file: a directory of named configs is chosen
/// from as the daemon does without a node label (`--config-default`, then the fallbacks).
///
/// # Errors
/// [`CommandError::Select`] when no config can be chosen, or the `empty` fallback chose none.
pub fn resolve(settings: &Settings) -> Result<Settings, CommandError> {
    match daemon::chosen_file(
        &settings.config,
        policy::select::is_config_dir(&settings.config),
        &settings.selection,
        None,
    ) {
        Ok(Some(file)) => Ok(Settings {
            config: file,
            ..settings.clone()
        }),
        Ok(None) => Err(CommandError::Select(format!(
            "no config chosen from {} (the `empty` fallback): every GPU is advertised whole",
            settings.config.display()
        ))),
        Err(e) => Err(CommandError::Select(e.to_string())),
    }
}

/// `slicelet validate` for a file or a directory of named configs: a directory's configs are
/// validated one by one, each report under a `== <key>` heading.
///
/// # Errors
/// As [`validate_with`] for a file; [`CommandError::Configs`] naming every invalid key of a
/// directory.
pub fn validate_config(settings: &Settings, strict: bool) -> Result<String, CommandError> {
    if !policy::select::is_config_dir(&settings.config) {
        return validate_with(settings, strict);
    }
    let dir = settings.config.display().to_string();
    let keys = policy::select::config_keys(&settings.config)
        .map_err(|e| CommandError::Select(format!("listing the configs in {dir}: {e}")))?;
    let mut out = String::new();
    let mut failed = Vec::new();
    for key in &keys {
        let one = Settings {
            config: settings.config.join(key),
            ..settings.clone()
        };
        match validate_with(&one, strict) {
            Ok(report) => {
                let _ = write!(out, "== {key}\n{report}");
            }
            Err(e) => failed.push((key.clone(), crate::errors::chain(&e))),
        }
    }
    match daemon::chosen_file(
        &settings.config,
        policy::select::is_config_dir(&settings.config),
        &settings.selection,
        None,
    ) {
        Ok(Some(file)) => {
            let _ = writeln!(
                out,
                "without a node label this node uses: {}",
                file.file_name().unwrap_or_default().to_string_lossy()
            );
        }
        Ok(None) => {
            let _ = writeln!(
                out,
                "without a node label this node uses no config (the `empty` fallback)"
            );
        }
        Err(e) => {
            let _ = writeln!(out, "warning: without a node label: {e}");
        }
    }
    if failed.is_empty() {
        Ok(out)
    } else {
        Err(CommandError::Configs {
            dir,
            total: keys.len(),
            failed,
        })
    }
}

/// The CDI check of `slicelet validate`: one warning per spec that could not be used and per
/// device whose CDI name does not resolve, or, where the directories hold no spec at all (a
/// machine without the NVIDIA Container Toolkit's spec), one line for every name.
fn cdi_report(plan: &plan::Plan, dirs: &[std::path::PathBuf]) -> String {
    let index = crate::cdi::read_specs(dirs);
    let mut out = String::new();
    for e in &index.errors {
        let _ = writeln!(out, "warning: CDI spec skipped: {e}");
    }
    let unresolved = crate::cdi::unresolved(plan, &index);
    if index.files == 0 && index.errors.is_empty() && !unresolved.is_empty() {
        let devices = plan
            .resources
            .values()
            .flat_map(|r| &r.devices)
            .filter(|d| unresolved.contains_key(&d.gpu_uuid))
            .count();
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let _ = writeln!(
            out,
            "warning: no CDI spec in {}: none of the CDI names of {} resolves; the daemon \
             advertises their {} Unhealthy (on a GPU node the NVIDIA Container Toolkit writes \
             the spec: nvidia-ctk cdi generate)",
            dirs.join(", "),
            plural(
                unresolved.len(),
                "GPU or MIG device",
                "GPUs and MIG devices"
            ),
            plural(devices, "device", "devices"),
        );
        return out;
    }
    for res in plan.resources.values() {
        let mut seen = std::collections::BTreeSet::new();
        for d in &res.devices {
            let Some(reason) = unresolved.get(&d.gpu_uuid) else {
                continue;
            };
            if !seen.insert(&d.gpu_uuid) {
                continue;
            }
            let n = res
                .devices
                .iter()
                .filter(|x| x.gpu_uuid == d.gpu_uuid)
                .count();
            let unit = match &d.mig {
                Some(m) => format!("MIG device {}:{} ({})", d.gpu_index, m.index, d.gpu_uuid),
                None => format!("GPU {} ({})", d.gpu_index, d.gpu_uuid),
            };
            let _ = writeln!(
                out,
                "warning: {unit}: {reason}; the daemon advertises its {} of {} Unhealthy",
                plural(n, "device", "devices"),
                res.name
            );
        }
    }
    out
}

/// `slicelet plan`: the plan for this node as a table or JSON. Both carry the warnings
/// `slicelet validate` prints for the policy on this node (but for its CDI check, which needs
/// `--cdi-spec-dirs`): the table as `# warning:` lines, the JSON in `"warnings"`.
///
/// # Errors
/// [`CommandError`] for an invalid policy, a node that cannot be discovered, or a plan that
/// cannot be built.
pub fn plan(settings: &Settings, json: bool) -> Result<String, CommandError> {
    let path = settings.config.display().to_string();
    let policy = policy::load_overridden(
        &settings.config,
        &policy::Limits::default(),
        &settings.flag_overrides,
    )?;
    let (inv, source) = daemon::discover(settings)?;
    let built = plan::build(&policy, &inv).map_err(|error| CommandError::Plan {
        path: path.clone(),
        node: source.clone(),
        error: Box::new(error),
    })?;
    let mut view = built.plan.view();
    view.links = inv.link_views();
    view.warnings = plan_warnings(&built)
        .cloned()
        .chain(policy_warnings(&policy))
        .collect();
    if json {
        return serde_json::to_string_pretty(&view)
            .map(|s| s + "\n")
            .map_err(CommandError::Json);
    }
    let mut out = String::new();
    let _ = writeln!(out, "# {source}: {}", plural(inv.gpus.len(), "GPU", "GPUs"));
    for w in &view.warnings {
        let _ = writeln!(out, "# warning: {w}");
    }
    let _ = writeln!(
        out,
        "{:<32} {:<13} {:>8} {:>8}",
        "RESOURCE", "STRATEGY", "REPLICAS", "DEVICES"
    );
    for r in &view.resources {
        write_resource(&mut out, r);
    }
    if inv.gpus.len() > 1 {
        out.push_str(&link_matrix(&inv));
    }
    Ok(out)
}

/// One resource of `slicelet plan`'s table: its row, its capacity and MPS daemons, then one
/// line per device.
fn write_resource(out: &mut String, r: &plan::ResourceView) {
    let strategy = serde_json::to_value(r.strategy).ok();
    let strategy = strategy.as_ref().and_then(|v| v.as_str()).unwrap_or("?");
    let _ = writeln!(
        out,
        "{:<32} {:<13} {:>8} {:>8}",
        r.name,
        strategy,
        r.replicas,
        r.devices.len()
    );
    if let Some(c) = r.capacity {
        let _ = writeln!(
            out,
            "  DRA consumable capacity: each device shared by claims of memory and cores (default share 1/{} of each)",
            c.shares
        );
    }
    for d in r.mps.iter().flatten() {
        if r.capacity.is_some() {
            let _ = writeln!(
                out,
                "  MPS daemon {}: each claim's client limited to its claim's cores and memory",
                d.uuid
            );
            continue;
        }
        let _ = writeln!(
            out,
            "  MPS daemon {}: {} clients, each {} % of the threads and {} MiB pinned memory",
            d.uuid, d.replicas, d.limits.active_thread_percentage, d.limits.pinned_memory_mib
        );
    }
    if !r.devices.is_empty() {
        let _ = writeln!(out, "  {:<56} {:<42} HEALTH", "DEVICE ID", "GPU");
    }
    for d in &r.devices {
        let _ = write!(out, "  {:<56} {:<42} {}", d.id, d.gpu, d.health);
        if let (Some(parent), Some(profile)) = (&d.parent, &d.profile) {
            let _ = write!(out, "  MIG {profile} of {parent}");
        }
        if let Some(hard) = d.memory_hard_mib {
            let _ = write!(out, "  memory {hard} MiB hard");
            if let Some(soft) = d.memory_soft_mib {
                let _ = write!(out, ", {soft} MiB soft");
            }
            if d.memory_enforced == Some(false) {
                out.push_str(" (not enforced)");
            }
        }
        out.push('\n');
    }
}

/// The GPU link matrix as `nvidia-smi topo -m` draws it: `NV<n>` NVLinks, `NVS` NVSwitch,
/// `PIX`/`PXB`/`PHB`/`NODE`/`SYS` PCIe levels, `?` unknown.
fn link_matrix(inv: &crate::inventory::Inventory) -> String {
    let mut out = String::from("LINKS ");
    for g in &inv.gpus {
        let _ = write!(out, "{:>6}", format!("GPU{}", g.index));
    }
    out.push_str("  NUMA\n");
    for a in &inv.gpus {
        let _ = write!(out, "{:<6}", format!("GPU{}", a.index));
        for b in &inv.gpus {
            let cell = if a.index == b.index {
                "X".to_string()
            } else {
                inv.link(a.index, b.index).abbreviation()
            };
            let _ = write!(out, "{cell:>6}");
        }
        let numa = a.numa_node.map_or("-".to_string(), |n| n.to_string());
        let _ = writeln!(out, "  {numa}");
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The mode of the installed hook binary: run by the container runtime (root), readable and
/// executable by all, writable by its owner only.
pub const HOOK_MODE: u32 = 0o755;

/// What [`install_hook`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The binary was written (there was none, another file, or a link): this many bytes.
    Written(u64),
    /// The path already held this very binary, a regular file of mode [`HOOK_MODE`]: nothing
    /// was written.
    Unchanged,
}

/// `slicelet install-hook`: copies the running binary (`/proc/self/exe`) to `to`, the host
/// path the memory-limit CDI spec's `createContainer` hooks run
/// ([`crate::cdi::memory::DEFAULT_HOOK_BINARY`], `run --hook-binary`). The image has no shell
/// (`cp`): the DaemonSet's init container runs this with the host directory mounted at the same
/// path. The file is written atomically ([`crate::files::write_atomic_from`]: a runtime
/// starting the hook meanwhile runs the old binary or the new one, never half of one), mode
/// [`HOOK_MODE`]; when `to` is already a regular file with the same bytes and mode, nothing is
/// written. The directory must exist (a `DirectoryOrCreate` hostPath makes it).
///
/// # Errors
/// The I/O error of reading the running binary, or of writing `to`.
pub fn install_hook(to: &std::path::Path) -> std::io::Result<Installed> {
    use std::io::Seek as _;
    use std::os::unix::fs::PermissionsExt as _;
    let mut source = std::fs::File::open("/proc/self/exe")?;
    let len = source.metadata()?.len();
    let same = match std::fs::symlink_metadata(to) {
        Ok(m) if m.is_file() && m.len() == len && m.permissions().mode() & 0o7777 == HOOK_MODE => {
            let same = same_bytes(&mut source, &mut std::fs::File::open(to)?)?;
            source.rewind()?;
            same
        }
        _ => false,
    };
    if same {
        return Ok(Installed::Unchanged);
    }
    crate::files::write_atomic_from(to, &mut source, HOOK_MODE).map(Installed::Written)
}

/// Whether `a` and `b` read the same bytes to their ends (compared in 64 KiB blocks).
fn same_bytes(a: &mut impl std::io::Read, b: &mut impl std::io::Read) -> std::io::Result<bool> {
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(a, &mut x)?;
        let m = read_full(b, &mut y)?;
        if x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the reader ends; the count read.
fn read_full(r: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
