//! The command line (the only user of clap). Every flag can also come from an environment
//! variable, so a DaemonSet can configure slicelet through `env:`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::settings::Settings;

/// slicelet: share NVIDIA GPUs in Kubernetes (time-slicing, MPS, MIG) through the kubelet's
/// device-plugin API.
#[derive(Debug, Parser)]
#[command(name = "slicelet", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "SLICELET_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
// Parsed once at start and moved into the daemon: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the device plugin: register with the kubelet and serve every resource.
    Run(RunArgs),
    /// Print what would be advertised on this node, without a kubelet.
    Plan(PlanArgs),
    /// Check a policy file (and, with a node, what it means there). Exit 1 when invalid.
    Validate(ValidateArgs),
    /// Run only the MPS control daemons the policy wants (a DaemonSet of its own, next to
    /// `run --mps-external`).
    Mps(MpsArgs),
    /// Show this node's GPUs, who holds each device and how much each container uses, from a
    /// running daemon's `/status` (refreshes every second; `--once` prints once).
    Top(TopArgs),
    /// OCI runtime hooks the CDI specs slicelet writes name (run by the container runtime,
    /// not by hand).
    #[command(subcommand)]
    Hook(HookCommand),
    /// Copy this binary to the host path the memory-limit hooks run (`run --hook-binary`),
    /// atomically, mode 0755: the DaemonSet's init container runs it (the image has no shell).
    InstallHook(InstallHookArgs),
    /// Create or destroy one MIG device by hand, through the GPU source the daemon uses
    /// (checks on a real GPU; an instance made this way is a static MIG device to slicelet).
    #[command(subcommand)]
    Mig(MigCommand),
}

/// `slicelet mig …`.
#[derive(Debug, Subcommand)]
pub enum MigCommand {
    /// Create a GPU instance of a profile with one compute instance spanning it; prints
    /// `MIG-<uuid> gpu=<i> profile=<p> placement=<start>+<size> gi=<id> ci=<id>`.
    Create(MigCreateArgs),
    /// Destroy a MIG device (its compute instance, then its GPU instance).
    Destroy(MigDestroyArgs),
}

/// `slicelet mig create`.
#[derive(Debug, Clone, Args)]
pub struct MigCreateArgs {
    /// The GPU: its NVML index or `GPU-…` UUID (MIG mode must be on).
    #[arg(long, env = "SLICELET_MIG_GPU")]
    pub gpu: String,
    /// The GPU-instance profile as NVIDIA names it (`1g.10gb`).
    #[arg(long, env = "SLICELET_MIG_PROFILE")]
    pub profile: String,
    /// The first memory slice of the placement (default: the first free one).
    #[arg(long, env = "SLICELET_MIG_PLACEMENT")]
    pub placement: Option<u32>,
    /// Where the GPUs come from.
    #[command(flatten)]
    pub source: GpuSourceArgs,
}

/// `slicelet mig destroy`.
#[derive(Debug, Clone, Args)]
pub struct MigDestroyArgs {
    /// The MIG device's `MIG-…` UUID.
    #[arg(long, env = "SLICELET_MIG_UUID")]
    pub uuid: String,
    /// Where the GPUs come from.
    #[command(flatten)]
    pub source: GpuSourceArgs,
}

/// Where the GPUs come from: NVML or a simulated node (the daemon, `plan`, `validate` and
/// `mig` share these flags).
#[derive(Debug, Clone, Args)]
pub struct GpuSourceArgs {
    /// Use a simulated node described in this YAML file instead of NVML.
    #[arg(long, env = "SLICELET_SIMULATE")]
    pub simulate: Option<PathBuf>,
    /// Load NVML from this file instead of libnvidia-ml.so.1 on the loader's path.
    #[arg(long, env = "SLICELET_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,
    /// Where sysfs is mounted (NUMA node lookup).
    #[arg(long, env = "SLICELET_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Host root under which /proc is found (MIG device specs read
    /// proc/driver/nvidia-caps/mig-minors there).
    #[arg(long, env = "SLICELET_PROC_ROOT", default_value = "/")]
    pub proc_root: PathBuf,
}

impl GpuSourceArgs {
    /// Settings naming this source only (no policy file).
    pub fn settings(&self) -> Settings {
        let mut s = Settings::new(
            std::path::Path::new(""),
            crate::api::DEFAULT_DEVICE_PLUGIN_PATH,
        );
        self.apply(&mut s);
        s
    }

    fn apply(&self, s: &mut Settings) {
        s.simulate = self.simulate.clone();
        s.nvml_library = self.nvml_library.clone();
        s.sysfs_root = self.sysfs_root.clone();
        s.proc_root = self.proc_root.clone();
    }
}

/// `slicelet install-hook`.
#[derive(Debug, Clone, Args)]
pub struct InstallHookArgs {
    /// Where the binary goes: the hook's host path (`run --hook-binary`), with the host's
    /// directory mounted at the same path in the container. The directory must exist.
    #[arg(long, env = "SLICELET_INSTALL_HOOK_TO", default_value = crate::cdi::memory::DEFAULT_HOOK_BINARY)]
    pub to: PathBuf,
}

/// `slicelet hook …`.
#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// createContainer hook: set the container cgroup's GPU memory limits through NVML (the
    /// OCI state on stdin), read them back, and fail container creation under
    /// `--enforce required` when they do not hold.
    SetMemoryLimits(SetMemoryLimitsArgs),
}

/// `slicelet hook set-memory-limits`.
#[derive(Debug, Clone, Args)]
pub struct SetMemoryLimitsArgs {
    /// The GPU's UUID.
    #[arg(long, env = "SLICELET_HOOK_GPU")]
    pub gpu: String,
    /// Hard limit, MiB.
    #[arg(long, env = "SLICELET_HOOK_HARD_MIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub hard_mib: u64,
    /// Soft limit, MiB (default: none).
    #[arg(long, env = "SLICELET_HOOK_SOFT_MIB", default_value_t = 0)]
    pub soft_mib: u64,
    /// `required`: a limit that cannot be set fails container creation; `best-effort`: the
    /// container starts and the miss is printed.
    #[arg(long, env = "SLICELET_HOOK_ENFORCE", default_value = "required", value_parser = parse_enforce)]
    pub enforce: crate::policy::Enforce,
    /// The NVML library (default libnvidia-ml.so.1).
    #[arg(long, env = "SLICELET_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,
    /// Where the cgroup v2 hierarchy is mounted.
    #[arg(long, env = "SLICELET_HOOK_CGROUP_ROOT", default_value = crate::hook::DEFAULT_CGROUP_ROOT)]
    pub cgroup_root: PathBuf,
    /// Seconds the hook may take before it gives up (best-effort: exit 0 without the limit;
    /// required: exit 1), so that a blocked NVML never hangs container creation.
    #[arg(long, env = "SLICELET_HOOK_DEADLINE_SECONDS", default_value = "25", value_parser = parse_deadline)]
    pub deadline_seconds: std::time::Duration,
}

/// A deadline in seconds: a positive number, fractions allowed (`0.5`), at most a day.
fn parse_deadline(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s:?}: give more than 0 and at most 86400 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

fn parse_enforce(s: &str) -> Result<crate::policy::Enforce, String> {
    match s {
        "required" => Ok(crate::policy::Enforce::Required),
        "best-effort" => Ok(crate::policy::Enforce::BestEffort),
        other => Err(format!("{other:?} is not required or best-effort")),
    }
}

/// `slicelet top`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// The daemon's status endpoint (`slicelet run --status-address`), as an http:// URL.
    #[arg(long, env = "SLICELET_TOP_ADDRESS", default_value = crate::top::DEFAULT_ADDRESS)]
    pub address: String,
    /// Print once and exit (scripts, tests) instead of redrawing every second until Ctrl-C.
    #[arg(long, env = "SLICELET_TOP_ONCE")]
    pub once: bool,
    /// Show the daemon on this node, reached through the API server's pod proxy (the
    /// kubeconfig as kubectl reads it) instead of `--address`.
    #[arg(long, env = "SLICELET_TOP_NODE", conflicts_with_all = ["address", "all_nodes"])]
    pub node: Option<String>,
    /// Show every node's GPUs and holders as one table, through the pod proxy.
    #[arg(long, env = "SLICELET_TOP_ALL_NODES", conflicts_with = "address")]
    pub all_nodes: bool,
    /// The namespace slicelet runs in (`--node`, `--all-nodes`).
    #[arg(long, short = 'n', env = "SLICELET_TOP_NAMESPACE", default_value = crate::top::cluster::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The label selector of slicelet's pods (`--node`, `--all-nodes`).
    #[arg(long, short = 'l', env = "SLICELET_TOP_SELECTOR", default_value = crate::top::cluster::DEFAULT_SELECTOR)]
    pub selector: String,
    /// A kubeconfig file. Unset: as kubectl finds one (`KUBECONFIG`, a list of files too,
    /// then `~/.kube/config`, then the in-cluster service account).
    #[arg(long, env = "SLICELET_TOP_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

impl TopArgs {
    /// Whose status to show.
    pub fn source(&self) -> crate::top::Source {
        let cluster = || crate::top::cluster::Cluster {
            kubeconfig: self.kubeconfig.clone(),
            namespace: self.namespace.clone(),
            selector: self.selector.clone(),
        };
        match (&self.node, self.all_nodes) {
            (Some(node), _) => crate::top::Source::Node(cluster(), node.clone()),
            (None, true) => crate::top::Source::AllNodes(cluster()),
            (None, false) => crate::top::Source::Local(self.address.clone()),
        }
    }
}

/// How MPS control daemons are run.
#[derive(Debug, Clone, Args)]
pub struct MpsDaemonArgs {
    /// The MPS control binary (`nvidia-cuda-mps-control`, from PATH by default).
    #[arg(long, env = "SLICELET_MPS_CONTROL_BINARY", default_value = crate::mps::DEFAULT_CONTROL_BINARY)]
    pub mps_control_binary: PathBuf,
    /// Seconds between `get_server_list` health checks of each MPS control daemon.
    #[arg(long, env = "SLICELET_MPS_CHECK_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub mps_check_seconds: u64,
}

impl MpsDaemonArgs {
    fn config(&self) -> crate::mps::Config {
        crate::mps::Config {
            control_binary: self.mps_control_binary.clone(),
            check_interval: Duration::from_secs(self.mps_check_seconds),
            ..crate::mps::Config::default()
        }
    }
}

/// `slicelet mps`.
#[derive(Debug, Clone, Args)]
pub struct MpsArgs {
    /// Policy and GPU source.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Control daemon settings.
    #[command(flatten)]
    pub daemons: MpsDaemonArgs,
    /// Watching this node's config label.
    #[command(flatten)]
    pub label: LabelArgs,
    /// Seconds between policy re-reads without a file event (safety net).
    #[arg(long, env = "SLICELET_POLICY_RESYNC_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub policy_resync_seconds: u64,
    /// Seconds between GPU re-discoveries (MIG layout changes); SIGHUP also does it.
    #[arg(long, env = "SLICELET_INVENTORY_RESYNC_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub inventory_resync_seconds: u64,
}

impl MpsArgs {
    /// The supervisor's settings.
    ///
    /// # Errors
    /// As [`NodeArgs::settings`].
    pub fn settings(&self) -> Result<Settings, crate::policy::select::UnknownFallback> {
        let mut s = self.node.settings()?;
        self.label.apply(&mut s);
        s.mps = self.daemons.config();
        s.policy_resync_interval = Duration::from_secs(self.policy_resync_seconds);
        s.inventory_resync_interval = Duration::from_secs(self.inventory_resync_seconds);
        Ok(s)
    }
}

/// Where the policy and the GPUs come from.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Sharing policy (NVIDIA config v1 format): a file, or a directory of named configs (a
    /// ConfigMap mounted whole; one is chosen per node by label, default and fallbacks).
    #[arg(long, env = "SLICELET_CONFIG")]
    pub config: PathBuf,
    /// How a config is chosen from a directory.
    #[command(flatten)]
    pub select: SelectArgs,
    /// Where the GPUs come from.
    #[command(flatten)]
    pub source: GpuSourceArgs,
    /// NVIDIA's flags over the policy file's `flags`.
    #[command(flatten)]
    pub nvidia: NvidiaFlagArgs,
}

/// NVIDIA's device-plugin flags, with NVIDIA's variable names: one that is set overrides the
/// policy file's `flags` key of the same name (NVIDIA's precedence: flag or variable, then
/// file, then default). NVIDIA's Helm chart sets the variables from its values.
#[derive(Debug, Clone, Default, Args)]
pub struct NvidiaFlagArgs {
    /// Overrides `flags.migStrategy`: none, single or mixed.
    #[arg(long, env = "MIG_STRATEGY", value_parser = parse_nvidia::<crate::policy::MigStrategy>)]
    pub mig_strategy: Option<Unset<crate::policy::MigStrategy>>,
    /// Overrides `flags.failOnInitError` (true or false; Go's spellings 1/0/t/f/TRUE/… too).
    #[arg(long, env = "FAIL_ON_INIT_ERROR", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub fail_on_init_error: Option<Unset<bool>>,
    /// Overrides `flags.plugin.passDeviceSpecs` (true or false).
    #[arg(long, env = "PASS_DEVICE_SPECS", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub pass_device_specs: Option<Unset<bool>>,
    /// Overrides `flags.plugin.deviceListStrategy`: envvar, volume-mounts, cdi-annotations,
    /// cdi-cri, comma-separated.
    #[arg(long, env = "DEVICE_LIST_STRATEGY", value_delimiter = ',', value_parser = parse_nvidia::<crate::policy::DeviceListStrategy>)]
    pub device_list_strategy: Option<Vec<Unset<crate::policy::DeviceListStrategy>>>,
    /// Overrides `flags.plugin.deviceIDStrategy`: uuid or index.
    #[arg(long, env = "DEVICE_ID_STRATEGY", value_parser = parse_nvidia::<crate::policy::DeviceIdStrategy>)]
    pub device_id_strategy: Option<Unset<crate::policy::DeviceIdStrategy>>,
    /// Overrides `flags.mpsRoot`.
    #[arg(long, env = "MPS_ROOT")]
    pub mps_root: Option<String>,
    /// Overrides `flags.plugin.cdiAnnotationPrefix`.
    #[arg(long, env = "CDI_ANNOTATION_PREFIX")]
    pub cdi_annotation_prefix: Option<String>,
    /// Overrides `flags.nvidiaDriverRoot` (recognised, not acted on: slicelet loads NVML from
    /// the loader's path or `--nvml-library`).
    #[arg(long, env = "NVIDIA_DRIVER_ROOT")]
    pub nvidia_driver_root: Option<String>,
    /// Overrides `flags.nvidiaDevRoot` (recognised, not acted on; see `--dev-root`).
    #[arg(long, env = "NVIDIA_DEV_ROOT")]
    pub nvidia_dev_root: Option<String>,
    /// Overrides `flags.gdrcopyEnabled` (recognised, not acted on).
    #[arg(long, env = "GDRCOPY_ENABLED", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub gdrcopy_enabled: Option<Unset<bool>>,
    /// Overrides `flags.gdsEnabled` (recognised, not acted on).
    #[arg(long, env = "GDS_ENABLED", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub gds_enabled: Option<Unset<bool>>,
    /// Overrides `flags.mofedEnabled` (recognised, not acted on).
    #[arg(long, env = "MOFED_ENABLED", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true")]
    pub mofed_enabled: Option<Unset<bool>>,
    /// Overrides `flags.deviceDiscoveryStrategy` (recognised, not acted on: slicelet discovers
    /// through NVML or `--simulate`).
    #[arg(long, env = "DEVICE_DISCOVERY_STRATEGY")]
    pub device_discovery_strategy: Option<String>,
}

/// A flag value where an empty string (an empty variable, as NVIDIA's chart leaves a value it
/// was not given) means "not set".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unset<T>(pub Option<T>);

impl NvidiaFlagArgs {
    /// The overrides these flags set; an empty variable counts as unset.
    pub fn overrides(&self) -> crate::policy::FlagOverrides {
        let text = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let list: Vec<crate::policy::DeviceListStrategy> = self
            .device_list_strategy
            .iter()
            .flatten()
            .filter_map(|u| u.0)
            .collect();
        crate::policy::FlagOverrides {
            mig_strategy: self.mig_strategy.and_then(|u| u.0),
            fail_on_init_error: self.fail_on_init_error.and_then(|u| u.0),
            pass_device_specs: self.pass_device_specs.and_then(|u| u.0),
            device_list_strategy: (!list.is_empty())
                .then(|| crate::policy::DeviceListStrategies::of(&list)),
            device_id_strategy: self.device_id_strategy.and_then(|u| u.0),
            mps_root: text(&self.mps_root),
            cdi_annotation_prefix: text(&self.cdi_annotation_prefix),
            nvidia_driver_root: text(&self.nvidia_driver_root),
            nvidia_dev_root: text(&self.nvidia_dev_root),
            gdrcopy_enabled: self.gdrcopy_enabled.and_then(|u| u.0),
            gds_enabled: self.gds_enabled.and_then(|u| u.0),
            mofed_enabled: self.mofed_enabled.and_then(|u| u.0),
            device_discovery_strategy: text(&self.device_discovery_strategy),
        }
    }
}

/// A value of a policy enum in the policy file's spelling (`mixed`, `cdi-cri`, `index`); empty
/// is unset.
fn parse_nvidia<T: serde::de::DeserializeOwned>(s: &str) -> Result<Unset<T>, String> {
    use serde::de::IntoDeserializer;
    if s.is_empty() {
        return Ok(Unset(None));
    }
    T::deserialize(s.into_deserializer())
        .map(|v| Unset(Some(v)))
        .map_err(|e: serde::de::value::Error| e.to_string())
}

/// A boolean as Go's `strconv.ParseBool` reads it (NVIDIA's flags are Go's); empty is unset.
fn parse_go_bool(s: &str) -> Result<Unset<bool>, String> {
    match s {
        "" => Ok(Unset(None)),
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Unset(Some(true))),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Unset(Some(false))),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

/// slicelet's own CDI spec for devices with memory limits (the policy's `memory`).
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Directory slicelet writes its memory-limit CDI spec to (slicelet-memory.json, kind
    /// gpu.slicelet.io/memory); the container runtime must read it (a CDI spec directory).
    #[arg(long, env = "SLICELET_MEMORY_SPEC_DIR", default_value = "/var/run/cdi")]
    pub memory_spec_dir: PathBuf,
    /// The host path of the slicelet binary the spec's createContainer hooks run (the
    /// DaemonSet's init container copies it there).
    /// Default /var/lib/slicelet/bin/slicelet. Given explicitly (as the chart does when it
    /// installs the hook), it also turns on memory limits for DRA consumable-capacity shares.
    #[arg(long, env = "SLICELET_HOOK_BINARY")]
    pub hook_binary: Option<PathBuf>,
    /// Environment for the hook, KEY=VALUE, comma-separated (e.g. LD_LIBRARY_PATH where the
    /// driver's libraries are outside the loader's path).
    #[arg(long, env = "SLICELET_HOOK_ENV", value_delimiter = ',')]
    pub hook_env: Vec<String>,
}

impl MemoryArgs {
    fn apply(&self, s: &mut crate::settings::Settings) {
        s.memory_spec_dir = Some(self.memory_spec_dir.clone());
        s.hook_installed = self.hook_binary.is_some();
        s.memory_hook = crate::cdi::memory::HookConfig {
            binary: self
                .hook_binary
                .clone()
                .unwrap_or_else(|| PathBuf::from(crate::cdi::memory::DEFAULT_HOOK_BINARY)),
            nvml_library: s.nvml_library.clone(),
            env: self.hook_env.clone(),
        };
    }
}

/// Where CDI device names come from (`deviceListStrategy: cdi-annotations` or `cdi-cri`).
#[derive(Debug, Clone, Args)]
pub struct CdiArgs {
    /// CDI kind (`vendor/class`) that device names are qualified with: the kind of the node's
    /// CDI spec (the NVIDIA Container Toolkit writes nvidia.com/gpu).
    #[arg(long, env = "SLICELET_CDI_KIND", default_value = crate::policy::cdi::DEFAULT_KIND, value_parser = parse_cdi_kind)]
    pub cdi_kind: String,
    /// CDI spec directories, comma-separated, lowest priority first: every name handed out is
    /// checked against the specs there.
    #[arg(
        long,
        env = "SLICELET_CDI_SPEC_DIRS",
        value_delimiter = ',',
        default_value = "/etc/cdi,/var/run/cdi"
    )]
    pub cdi_spec_dirs: Vec<PathBuf>,
}

fn parse_cdi_kind(s: &str) -> Result<String, String> {
    crate::policy::cdi::parse_kind(s).map_err(|e| e.to_string())
}

impl CdiArgs {
    fn apply(&self, s: &mut Settings) {
        s.cdi_kind.clone_from(&self.cdi_kind);
        s.cdi_spec_dirs.clone_from(&self.cdi_spec_dirs);
    }
}

/// `slicelet validate`.
#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    /// Policy and GPU source.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Refuse what slicelet would otherwise serve with a warning by reading it as NVIDIA's
    /// plugin does (a time-slicing entry with devices and no rename that would split a
    /// resource name).
    #[arg(long, env = "SLICELET_VALIDATE_STRICT")]
    pub strict: bool,
    /// CDI names and specs (checked with a cdi-* deviceListStrategy).
    #[command(flatten)]
    pub cdi: CdiArgs,
}

impl ValidateArgs {
    /// Settings for discovering the node and checking its CDI specs.
    ///
    /// # Errors
    /// As [`NodeArgs::settings`].
    pub fn settings(&self) -> Result<Settings, crate::policy::select::UnknownFallback> {
        let mut s = self.node.settings()?;
        self.cdi.apply(&mut s);
        Ok(s)
    }
}

/// `slicelet run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Policy and GPU source.
    #[command(flatten)]
    pub node: NodeArgs,
    /// The kubelet's device-plugin directory (holds kubelet.sock).
    #[arg(long, env = "SLICELET_DEVICE_PLUGIN_PATH", default_value = crate::api::DEFAULT_DEVICE_PLUGIN_PATH)]
    pub device_plugin_path: PathBuf,
    /// Host root under which /dev is found, for device specs.
    #[arg(long, env = "SLICELET_DEV_ROOT", default_value = "/")]
    pub dev_root: String,
    /// NVIDIA's MIG layouts file (mig-parted's `version: v1` `mig-configs:`, as the GPU
    /// Operator's ConfigMap holds it): the layout named by the node label nvidia.com/mig.config
    /// (or --mig-config) is applied to GPUs whose MIG mode is already set. Off by default (or
    /// empty).
    #[arg(long, env = "SLICELET_MIG_CONFIG_FILE")]
    pub mig_config_file: Option<String>,
    /// The layout of --mig-config-file to apply while the node label nvidia.com/mig.config is
    /// not set or not watched (no --node-name); the label wins.
    #[arg(long, env = "SLICELET_MIG_CONFIG")]
    pub mig_config: Option<String>,
    /// Tokio worker threads (a 192-core node must not get 192 workers).
    #[arg(long, env = "SLICELET_WORKER_THREADS", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: u16,
    /// Seconds between NVML retries when it failed at start with failOnInitError: false.
    #[arg(long, env = "SLICELET_NVML_RETRY_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub nvml_retry_seconds: u64,
    /// Seconds between policy re-reads without a file event (safety net).
    #[arg(long, env = "SLICELET_POLICY_RESYNC_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub policy_resync_seconds: u64,
    /// Seconds between GPU re-discoveries (MIG layout changes, lost GPUs); SIGHUP also does it.
    #[arg(long, env = "SLICELET_INVENTORY_RESYNC_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub inventory_resync_seconds: u64,
    /// Address of /healthz, /readyz and /metrics (`:8080` = every interface; empty = off).
    #[arg(long, env = "SLICELET_STATUS_ADDRESS", default_value = ":8080", value_parser = parse_status_address)]
    pub status_address: StatusAddress,
    /// Xids to ignore beyond the defaults (comma list), or `all`/`xids` (NVIDIA's variable).
    #[arg(long, env = "DP_DISABLE_HEALTHCHECKS", hide = true)]
    pub disable_healthchecks: Option<String>,
    /// Xids that are always critical (comma list), or `all` (NVIDIA's variable).
    #[arg(long, env = "DP_ENABLE_HEALTHCHECKS", hide = true)]
    pub enable_healthchecks: Option<String>,
    /// MPS control daemon settings.
    #[command(flatten)]
    pub mps: MpsDaemonArgs,
    /// Watching this node's config label.
    #[command(flatten)]
    pub label: LabelArgs,
    /// MPS control daemons are run by `slicelet mps` (another DaemonSet): only check their
    /// health, never start, configure or stop them.
    #[arg(long, env = "SLICELET_MPS_EXTERNAL")]
    pub mps_external: bool,
    /// Write node labels (GPU Feature Discovery's keys, computed from what is advertised) to
    /// this NFD feature file, e.g.
    /// /etc/kubernetes/node-feature-discovery/features.d/slicelet; off by default.
    #[arg(long, env = "SLICELET_NFD_FEATURES_FILE", value_parser = parse_features_file)]
    pub nfd_features_file: Option<PathBuf>,
    /// CDI names and specs (used with a cdi-* deviceListStrategy).
    #[command(flatten)]
    pub cdi: CdiArgs,
    /// slicelet's CDI spec for memory-limited devices and its hook.
    #[command(flatten)]
    pub memory: MemoryArgs,
    /// What is in use, and GPU use per container.
    #[command(flatten)]
    pub usage: UsageArgs,
    /// Dynamic Resource Allocation beside (or instead of) the device plugin.
    #[command(flatten)]
    pub dra: DraArgs,
}

/// DRA: the policy's DRA resources as ResourceSlices, prepared through the kubelet's DRA
/// plugin API (docs/dra.md).
#[derive(Debug, Clone, Args)]
pub struct DraArgs {
    /// Serve the policy's DRA resources (`dra.resources`, `dra: true`) through DRA: publish
    /// this node's ResourceSlices (needs --node-name and the Kubernetes API) and serve the
    /// kubelet's DRA plugin API.
    #[arg(long = "dra", env = "SLICELET_DRA", requires = "node_name")]
    pub enabled: bool,
    /// The DRA driver name: the slices' `spec.driver`, the DeviceClasses' `device.driver`, and
    /// the vendor of the claim specs' CDI kind (`<name>/claim`).
    #[arg(long, env = "SLICELET_DRA_DRIVER_NAME", default_value = crate::dra::DEFAULT_DRIVER, value_parser = parse_dra_driver)]
    pub dra_driver_name: String,
    /// The kubelet's plugin registry directory (holds `<driver>-reg.sock`).
    #[arg(long, env = "SLICELET_DRA_REGISTRY_DIR", default_value = crate::api::pluginregistration::DEFAULT_REGISTRY_DIR)]
    pub dra_registry_dir: PathBuf,
    /// The kubelet's plugins directory (slicelet uses `<dir>/<driver>/`: `dra.sock` and the
    /// checkpoint of prepared claims).
    #[arg(long, env = "SLICELET_DRA_PLUGINS_DIR", default_value = crate::api::dra::DEFAULT_PLUGINS_DIR)]
    pub dra_plugins_dir: PathBuf,
    /// Where the transient CDI spec of each prepared claim is written.
    #[arg(long, env = "SLICELET_CDI_OUTPUT_DIR", default_value = crate::dra::DEFAULT_CDI_OUTPUT_DIR)]
    pub cdi_output_dir: PathBuf,
}

/// A DRA driver name: a lowercase DNS subdomain of at most 63 characters that is also a CDI
/// vendor (Kubernetes: `spec.driver`; CDI: `<vendor>/claim`).
fn parse_dra_driver(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.contains('.')
        && crate::policy::is_dns_subdomain(s)
        && crate::policy::cdi::parse_kind(&crate::dra::prepare::cdi_kind(s)).is_ok();
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a DRA driver name (a lowercase DNS subdomain with a dot, at most 63 characters, e.g. gpu.slicelet.io)"
        ))
    }
}

impl DraArgs {
    fn apply(&self, label: &LabelArgs, dev_root: &str, s: &mut Settings) {
        let node = label.node_name.clone().filter(|n| !n.is_empty());
        s.dra = match (self.enabled, node) {
            (true, Some(node)) => Some(crate::dra::DraSettings {
                driver: self.dra_driver_name.clone(),
                node,
                registry_dir: self.dra_registry_dir.clone(),
                plugins_dir: self.dra_plugins_dir.clone(),
                cdi_dir: self.cdi_output_dir.clone(),
                kubeconfig: label
                    .kubeconfig
                    .clone()
                    .filter(|p| !p.as_os_str().is_empty()),
                dev_root: dev_root.to_string(),
                memory_hook: s.hook_installed.then(|| s.memory_hook.clone()),
            }),
            _ => None,
        };
        s.dra_checkpoint = Some(
            self.dra_plugins_dir
                .join(&self.dra_driver_name)
                .join(crate::dra::checkpoint::FILE),
        );
    }
}

/// What is in use (the kubelet's pod-resources API) and GPU use sampling.
#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// The kubelet's pod-resources socket: which device IDs running containers hold (so a
    /// reload never pulls a device from under a pod) and who to attribute GPU use to. An empty
    /// value asks nobody.
    #[arg(long, env = "SLICELET_POD_RESOURCES_SOCKET", default_value = crate::api::podresources::DEFAULT_SOCKET)]
    pub pod_resources_socket: String,
    /// Seconds between reads of what is in use without another reason (it is also read after
    /// each Allocate and before a change that would withdraw or re-purpose devices).
    #[arg(long, env = "SLICELET_POD_RESOURCES_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub pod_resources_seconds: u64,
    /// Seconds between GPU use samples (utilisation, memory, per-process SM use); 0 samples
    /// nothing.
    #[arg(long, env = "SLICELET_SAMPLE_SECONDS", default_value_t = 5)]
    pub sample_seconds: u64,
    /// The kubelet's device checkpoint (pod UID → container → device IDs, to attribute a
    /// process to its container); default kubelet_internal_checkpoint in the device-plugin
    /// directory.
    #[arg(long, env = "SLICELET_KUBELET_CHECKPOINT")]
    pub kubelet_checkpoint: Option<PathBuf>,
}

impl UsageArgs {
    fn apply(&self, s: &mut Settings) {
        s.pod_resources_socket =
            Some(PathBuf::from(&self.pod_resources_socket)).filter(|p| !p.as_os_str().is_empty());
        s.pod_resources_interval = Duration::from_secs(self.pod_resources_seconds);
        s.sample_interval = Some(Duration::from_secs(self.sample_seconds)).filter(|d| !d.is_zero());
        s.kubelet_checkpoint = self
            .kubelet_checkpoint
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
    }
}

fn parse_features_file(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    crate::labels::file::check_path(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

/// A parsed `--status-address` (None = disabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusAddress(pub Option<std::net::SocketAddr>);

fn parse_status_address(s: &str) -> Result<StatusAddress, crate::status::AddressError> {
    crate::status::parse_address(s).map(StatusAddress)
}

/// `slicelet plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Policy and GPU source.
    #[command(flatten)]
    pub node: NodeArgs,
    /// Output format.
    #[arg(long, env = "SLICELET_OUTPUT", default_value = "table")]
    pub output: OutputFormat,
}

/// `slicelet plan --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One line per resource, then its devices.
    Table,
    /// `{"resources":[{"name","strategy","replicas","devices":[{"id","gpu","health"}]}],
    /// "warnings":[…]}`.
    Json,
}

/// Choosing one named config when `--config` is a directory (NVIDIA's config-manager rules,
/// [`crate::policy::select`]).
#[derive(Debug, Clone, Args)]
pub struct SelectArgs {
    /// The node label whose value names the config.
    #[arg(long, env = "SLICELET_CONFIG_LABEL", default_value = crate::policy::select::DEFAULT_LABEL)]
    pub config_label: String,
    /// The config used when the node label is unset (NVIDIA's `DEFAULT_CONFIG` is read too).
    #[arg(long, env = "SLICELET_CONFIG_DEFAULT")]
    pub config_default: Option<String>,
    /// Fallbacks, in order, when neither the label nor a default names a config: `named` (a
    /// key called `default`), `single` (the only key), `empty` (no sharing). NVIDIA's
    /// `FALLBACK_STRATEGIES` is read too. Default `named,single`.
    #[arg(long, env = "SLICELET_CONFIG_FALLBACK", value_delimiter = ',')]
    pub config_fallback: Option<Vec<crate::policy::select::Fallback>>,
}

impl SelectArgs {
    /// The selection rules, with NVIDIA's variables where slicelet's are not set.
    ///
    /// # Errors
    /// An unknown strategy in `FALLBACK_STRATEGIES` (slicelet's own flag is checked by clap).
    pub fn selection(
        &self,
    ) -> Result<crate::policy::select::Selection, crate::policy::select::UnknownFallback> {
        let nvidia = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let fallbacks = match &self.config_fallback {
            Some(f) => f.clone(),
            None => match nvidia("FALLBACK_STRATEGIES") {
                Some(v) => v
                    .split(',')
                    .filter(|item| !item.trim().is_empty())
                    .map(str::parse)
                    .collect::<Result<Vec<_>, _>>()?,
                None => crate::policy::select::DEFAULT_FALLBACKS.to_vec(),
            },
        };
        Ok(crate::policy::select::Selection {
            label: self.config_label.clone(),
            default: self
                .config_default
                .clone()
                .filter(|v| !v.is_empty())
                .or_else(|| nvidia("DEFAULT_CONFIG")),
            fallbacks,
        })
    }
}

/// Watching this node's config label through the Kubernetes API.
#[derive(Debug, Clone, Args)]
pub struct LabelArgs {
    /// This node's name (the downward API's `spec.nodeName`): watch its config label through
    /// the Kubernetes API (RBAC: get, list, watch on nodes). Unset: no API access.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// A kubeconfig for the API (default: `~/.kube/config` when it exists, else the pod's
    /// in-cluster service account).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

impl LabelArgs {
    fn apply(&self, s: &mut Settings) {
        s.label_watch = self
            .node_name
            .clone()
            .filter(|n| !n.is_empty())
            .map(|node| crate::k8s::LabelWatch {
                node,
                kubeconfig: self
                    .kubeconfig
                    .clone()
                    .filter(|p| !p.as_os_str().is_empty()),
            });
    }
}

impl NodeArgs {
    /// Settings for discovering this node's GPUs (the device-plugin directory is unused).
    ///
    /// # Errors
    /// An unknown strategy in NVIDIA's `FALLBACK_STRATEGIES`.
    pub fn settings(&self) -> Result<Settings, crate::policy::select::UnknownFallback> {
        let mut s = Settings::new(&self.config, crate::api::DEFAULT_DEVICE_PLUGIN_PATH);
        s.selection = self.select.selection()?;
        self.source.apply(&mut s);
        s.flag_overrides = self.nvidia.overrides();
        Ok(s)
    }
}

impl RunArgs {
    /// The daemon's settings.
    ///
    /// # Errors
    /// As [`NodeArgs::settings`].
    pub fn settings(&self) -> Result<Settings, crate::policy::select::UnknownFallback> {
        let mut s = self.node.settings()?;
        self.label.apply(&mut s);
        s.device_plugin_path = self.device_plugin_path.clone();
        s.dev_root = self.dev_root.clone();
        s.nvml_retry_interval = Duration::from_secs(self.nvml_retry_seconds);
        s.policy_resync_interval = Duration::from_secs(self.policy_resync_seconds);
        s.inventory_resync_interval = Duration::from_secs(self.inventory_resync_seconds);
        s.status_address = self.status_address.0;
        s.disable_healthchecks = self.disable_healthchecks.clone();
        s.enable_healthchecks = self.enable_healthchecks.clone();
        s.mps = crate::mps::Config {
            external: self.mps_external,
            ..self.mps.config()
        };
        s.nfd_features_file = self.nfd_features_file.clone();
        s.mig_config_file = self
            .mig_config_file
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        s.mig_config = self.mig_config.clone().filter(|n| !n.is_empty());
        self.cdi.apply(&mut s);
        self.memory.apply(&mut s);
        self.usage.apply(&mut s);
        self.dra.apply(&self.label, &self.dev_root, &mut s);
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    /// `--pod-resources-socket ""` (the chart's `usage.podResources.enabled: false`) asks
    /// nobody; it was refused by clap's path parser ("a value is required").
    #[test]
    fn an_empty_pod_resources_socket_asks_nobody() {
        let default = std::path::PathBuf::from(crate::api::podresources::DEFAULT_SOCKET);
        for (args, want) in [
            (vec!["--pod-resources-socket", ""], None),
            (vec![], Some(default)),
            (
                vec!["--pod-resources-socket", "/x/s.sock"],
                Some("/x/s.sock".into()),
            ),
        ] {
            let mut argv = vec!["slicelet", "run", "--config", "/etc/slicelet"];
            argv.extend(args.iter().copied());
            let cli = super::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let super::Command::Run(run) = cli.command else {
                panic!("not run")
            };
            assert_eq!(
                run.settings().unwrap().pod_resources_socket,
                want,
                "{argv:?}"
            );
        }
    }

    /// `--mig-config-file` and `--mig-config` reach the settings; empty values (a chart's unset
    /// variable) are off.
    #[test]
    fn the_mig_layout_flags_reach_the_settings_and_empty_is_off() {
        for (args, file, name) in [
            (
                vec![
                    "--mig-config-file",
                    "/etc/mig/config.yaml",
                    "--mig-config",
                    "all-1g.10gb",
                ],
                Some("/etc/mig/config.yaml"),
                Some("all-1g.10gb"),
            ),
            (
                vec!["--mig-config-file", "", "--mig-config", ""],
                None,
                None,
            ),
            (vec![], None, None),
        ] {
            let mut argv = vec!["slicelet", "run", "--config", "/etc/slicelet"];
            argv.extend(args.iter().copied());
            let cli = super::Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let super::Command::Run(run) = cli.command else {
                panic!("not run")
            };
            let s = run.settings().unwrap();
            assert_eq!(
                s.mig_config_file,
                file.map(std::path::PathBuf::from),
                "{argv:?}"
            );
            assert_eq!(s.mig_config.as_deref(), name, "{argv:?}");
        }
    }

    /// (extra arguments, the DRA settings' driver/registry/plugins/CDI dirs, or an error word)
    #[test]
    fn dra_flags_table() {
        type Want =
            Result<Option<(&'static str, &'static str, &'static str, &'static str)>, &'static str>;
        let cases: [(&[&str], Want); 6] = [
            (&[], Ok(None)),
            (&["--node-name", "n1"], Ok(None)),
            (
                &["--dra", "--node-name", "n1"],
                Ok(Some((
                    "gpu.slicelet.io",
                    "/var/lib/kubelet/plugins_registry",
                    "/var/lib/kubelet/plugins",
                    "/var/run/cdi",
                ))),
            ),
            (
                &[
                    "--dra",
                    "--node-name",
                    "n1",
                    "--dra-driver-name",
                    "gpu.example.com",
                    "--dra-registry-dir",
                    "/r",
                    "--dra-plugins-dir",
                    "/p",
                    "--cdi-output-dir",
                    "/c",
                ],
                Ok(Some(("gpu.example.com", "/r", "/p", "/c"))),
            ),
            (&["--dra"], Err("--node-name")),
            (
                &[
                    "--dra",
                    "--node-name",
                    "n1",
                    "--dra-driver-name",
                    "Bad_Name",
                ],
                Err("not a DRA driver name"),
            ),
        ];
        for (args, want) in cases {
            let mut argv = vec!["slicelet", "run", "--config", "/etc/slicelet"];
            argv.extend(args.iter().copied());
            match (super::Cli::try_parse_from(&argv), want) {
                (Ok(cli), Ok(want)) => {
                    let super::Command::Run(run) = cli.command else {
                        panic!("not run")
                    };
                    let got = run.settings().unwrap().dra;
                    let got = got.as_ref().map(|d| {
                        assert_eq!(d.node, "n1");
                        (
                            d.driver.as_str(),
                            d.registry_dir.to_str().unwrap(),
                            d.plugins_dir.to_str().unwrap(),
                            d.cdi_dir.to_str().unwrap(),
                        )
                    });
                    assert_eq!(got, want, "{argv:?}");
                }
                (Err(e), Err(word)) => assert!(e.to_string().contains(word), "{argv:?}: {e}"),
                (got, want) => panic!("{argv:?}: got {:?}, want {want:?}", got.map(|_| ())),
            }
        }
    }

    #[test]
    fn top_arguments() {
        for (args, address, once) in [
            (&["slicelet", "top"][..], crate::top::DEFAULT_ADDRESS, false),
            (
                &[
                    "slicelet",
                    "top",
                    "--once",
                    "--address",
                    "http://10.0.0.1:9",
                ][..],
                "http://10.0.0.1:9",
                true,
            ),
        ] {
            match super::Cli::try_parse_from(args).unwrap().command {
                super::Command::Top(t) => {
                    assert_eq!((t.address.as_str(), t.once), (address, once), "{args:?}");
                }
                other => panic!("{args:?}: {other:?}"),
            }
        }
    }

    /// Every flag of every subcommand can come from the environment (a DaemonSet configures
    /// slicelet through `env:`; the chart sets nothing on the command line but `run`/`mps`).
    #[test]
    fn every_flag_has_an_environment_variable() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_positional() {
                    continue;
                }
                if arg.get_env().is_none() {
                    missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = super::Cli::command();
        let mut missing = Vec::new();
        walk(&cmd, "slicelet", &mut missing);
        assert!(missing.is_empty(), "flags without env: {missing:?}");
        // The walk reaches every subcommand's flags (not only the global ones).
        let plan = cmd.find_subcommand("plan").unwrap();
        let output = plan
            .get_arguments()
            .find(|a| a.get_long() == Some("output"))
            .unwrap();
        assert_eq!(
            output.get_env().and_then(|e| e.to_str()),
            Some("SLICELET_OUTPUT")
        );
    }
}
