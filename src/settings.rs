//! [`Settings`]: everything the daemon and `slicelet mps` need, resolved from the command line
//! ([`crate::cli`]) once and immutable afterwards.

use std::path::PathBuf;
use std::time::Duration;

use crate::mps;

/// Everything the daemon needs, resolved from the command line once.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The policy: a file (a ConfigMap key), or a directory of named configs (a ConfigMap
    /// mounted whole), one chosen per node by [`Settings::selection`].
    pub config: PathBuf,
    /// How a directory's config is chosen: the node label's key, the default, the fallbacks.
    pub selection: crate::policy::select::Selection,
    /// NVIDIA's flags and variables (`MIG_STRATEGY`, …) that override the policy file's
    /// `flags`, NVIDIA's precedence ([`crate::policy::FlagOverrides`]); default: none.
    pub flag_overrides: crate::policy::FlagOverrides,
    /// Watch this node's config label through the Kubernetes API (`--node-name`); `None`: no
    /// API access, a directory's config is chosen by the default and the fallbacks.
    pub label_watch: Option<crate::k8s::LabelWatch>,
    /// How long the first policy read waits for the node's label before choosing without it
    /// (default 5 s; it stops waiting at the first API error).
    pub label_start_wait: Duration,
    /// The kubelet's device-plugin directory.
    pub device_plugin_path: PathBuf,
    /// A simulated node file instead of NVML.
    pub simulate: Option<PathBuf>,
    /// Where to load libnvidia-ml.so.1 from (default: the dynamic loader's search path).
    pub nvml_library: Option<PathBuf>,
    /// Where sysfs is mounted (NUMA node lookup), default `/sys`.
    pub sysfs_root: PathBuf,
    /// The host root holding `/dev`, for device specs, default `/`.
    pub dev_root: String,
    /// The host root holding `/proc` (MIG nvidia-caps minors in
    /// `proc/driver/nvidia-caps/mig-minors`), default `/`.
    pub proc_root: PathBuf,
    /// How often to retry NVML when it failed at start with `failOnInitError: false`.
    pub nvml_retry_interval: Duration,
    /// How often to re-read the policy even without a file event (safety net).
    pub policy_resync_interval: Duration,
    /// How often to re-discover GPUs (MIG layout changes, GPUs that fell off the bus).
    pub inventory_resync_interval: Duration,
    /// Where `/healthz`, `/readyz` and `/metrics` listen; `None` disables them.
    pub status_address: Option<std::net::SocketAddr>,
    /// `DP_DISABLE_HEALTHCHECKS`, as NVIDIA's plugin reads it.
    pub disable_healthchecks: Option<String>,
    /// `DP_ENABLE_HEALTHCHECKS`, as NVIDIA's plugin reads it.
    pub enable_healthchecks: Option<String>,
    /// MPS control daemons: the binary, in-process or external, check interval, backoff.
    pub mps: mps::Config,
    /// How long the kubelet may take to open a ListAndWatch stream after a successful
    /// registration before `/readyz` reports the resource (default 10 s).
    pub stream_grace: Duration,
    /// Where to write the node labels as an NFD local feature file (`--nfd-features-file`);
    /// `None` (the default) writes none.
    pub nfd_features_file: Option<PathBuf>,
    /// The CDI kind device names are qualified with under a `cdi-*` `deviceListStrategy`
    /// (`--cdi-kind`, default `nvidia.com/gpu`, the NVIDIA Container Toolkit's).
    pub cdi_kind: String,
    /// The CDI spec directories, lowest priority first (`--cdi-spec-dirs`, default `/etc/cdi`,
    /// `/var/run/cdi`; in a pod, the host's directories mounted read-only).
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where slicelet writes its own CDI spec for memory-limited devices
    /// ([`crate::cdi::memory::SPEC_FILE`]; `--memory-spec-dir`, default `/var/run/cdi`);
    /// `None`: never written.
    pub memory_spec_dir: Option<PathBuf>,
    /// How that spec's hooks call `slicelet hook set-memory-limits`.
    pub memory_hook: crate::cdi::memory::HookConfig,
    /// `--hook-binary` was given: the hook is installed on the host (the chart's
    /// `memoryLimits`), so DRA shares get memory limits too.
    pub hook_installed: bool,
    /// The kubelet's pod-resources socket (`--pod-resources-socket`, default
    /// [`crate::api::podresources::DEFAULT_SOCKET`]); `None` asks nobody what is in use.
    pub pod_resources_socket: Option<PathBuf>,
    /// How often what is in use is read again without a reason to (default 10 s); it is also
    /// read after each Allocate and before a change that would withdraw or re-purpose devices.
    pub pod_resources_interval: Duration,
    /// How often GPU use is sampled (`--sample-seconds`, default 5 s); `None` samples nothing.
    pub sample_interval: Option<Duration>,
    /// The kubelet's device checkpoint (`--kubelet-checkpoint`); `None`:
    /// `kubelet_internal_checkpoint` in [`Settings::device_plugin_path`].
    pub kubelet_checkpoint: Option<PathBuf>,
    /// DRA (`--dra` and the `--dra-*` flags): where [`crate::dra::spawn`] runs; `None`: off.
    pub dra: Option<crate::dra::DraSettings>,
    /// slicelet's DRA checkpoint (`<--dra-plugins-dir>/<--dra-driver-name>/checkpoint.json`),
    /// read for its holders even when DRA is off this run (never written then): a claim
    /// prepared before keeps its devices off the device plugin. `None`: not read (without
    /// `--dra`; the command line always sets it).
    pub dra_checkpoint: Option<PathBuf>,
    /// NVIDIA's MIG layouts file (`--mig-config-file`, mig-parted's `version: v1` format,
    /// docs/mig.md "MIG layouts"); `None`: no layout is ever applied.
    pub mig_config_file: Option<PathBuf>,
    /// The layout to apply when the node label `nvidia.com/mig.config` is not set or not
    /// watched (`--mig-config`); the label wins.
    pub mig_config: Option<String>,
}

impl Settings {
    /// The kubelet's device checkpoint this node reads ([`Settings::kubelet_checkpoint`], else
    /// `kubelet_internal_checkpoint` in the device-plugin directory).
    pub fn checkpoint_path(&self) -> PathBuf {
        self.kubelet_checkpoint
            .clone()
            .unwrap_or_else(|| self.device_plugin_path.join("kubelet_internal_checkpoint"))
    }

    /// The DRA checkpoint this node reads: DRA's own when it runs, else
    /// [`Settings::dra_checkpoint`].
    pub fn dra_checkpoint_path(&self) -> Option<PathBuf> {
        match &self.dra {
            Some(dra) => {
                Some(crate::dra::plugin::driver_dir(dra).join(crate::dra::checkpoint::FILE))
            }
            None => self.dra_checkpoint.clone(),
        }
    }

    /// Settings with the defaults for everything but the policy file and directory.
    pub fn new(config: impl Into<PathBuf>, device_plugin_path: impl Into<PathBuf>) -> Self {
        Settings {
            config: config.into(),
            selection: crate::policy::select::Selection::default(),
            flag_overrides: crate::policy::FlagOverrides::default(),
            label_watch: None,
            label_start_wait: Duration::from_secs(5),
            device_plugin_path: device_plugin_path.into(),
            simulate: None,
            nvml_library: None,
            sysfs_root: PathBuf::from("/sys"),
            dev_root: "/".to_string(),
            proc_root: PathBuf::from("/"),
            nvml_retry_interval: Duration::from_secs(30),
            policy_resync_interval: Duration::from_secs(60),
            inventory_resync_interval: Duration::from_secs(60),
            status_address: None,
            disable_healthchecks: None,
            enable_healthchecks: None,
            mps: mps::Config::default(),
            stream_grace: Duration::from_secs(10),
            nfd_features_file: None,
            cdi_kind: crate::policy::cdi::DEFAULT_KIND.to_string(),
            cdi_spec_dirs: crate::cdi::DEFAULT_SPEC_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            memory_spec_dir: None,
            memory_hook: crate::cdi::memory::HookConfig::default(),
            hook_installed: false,
            pod_resources_socket: Some(PathBuf::from(crate::api::podresources::DEFAULT_SOCKET)),
            pod_resources_interval: Duration::from_secs(10),
            sample_interval: Some(Duration::from_secs(5)),
            kubelet_checkpoint: None,
            dra: None,
            dra_checkpoint: None,
            mig_config_file: None,
            mig_config: None,
        }
    }
}
