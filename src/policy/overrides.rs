//! NVIDIA's command-line flags and environment variables that override the policy file's
//! `flags` (NVIDIA's precedence: a flag or variable that is set wins over the file, the file
//! wins over the default; `api/config/v1/config.go` `NewConfig`, then
//! `Flags.UpdateFromCLIFlags`).
//!
//! NVIDIA's Helm chart sets these variables from its values (`migStrategy` → `MIG_STRATEGY`,
//! `failOnInitError` → `FAIL_ON_INIT_ERROR`, …) only when a value is given, so a chart value and
//! a config file that disagree resolve the same way on slicelet as on NVIDIA's plugin: the
//! value wins. Each override that changes what the file says is reported as a policy notice
//! naming both.

use super::delivery::{DeviceIdStrategy, DeviceListStrategies};
use super::schema::{self, MigStrategy};

/// The overrides in effect; `None` = not set (the file's value, else the default, applies).
/// Built by the command line (`--mig-strategy`/`MIG_STRATEGY`, …, see `slicelet run --help`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagOverrides {
    /// `--mig-strategy` / `MIG_STRATEGY` → `flags.migStrategy`.
    pub mig_strategy: Option<MigStrategy>,
    /// `--fail-on-init-error` / `FAIL_ON_INIT_ERROR` → `flags.failOnInitError`.
    pub fail_on_init_error: Option<bool>,
    /// `--pass-device-specs` / `PASS_DEVICE_SPECS` → `flags.plugin.passDeviceSpecs`.
    pub pass_device_specs: Option<bool>,
    /// `--device-list-strategy` / `DEVICE_LIST_STRATEGY` (comma-separated) →
    /// `flags.plugin.deviceListStrategy`.
    pub device_list_strategy: Option<DeviceListStrategies>,
    /// `--device-id-strategy` / `DEVICE_ID_STRATEGY` → `flags.plugin.deviceIDStrategy`.
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// `--mps-root` / `MPS_ROOT` → `flags.mpsRoot` (validated as the file's value is).
    pub mps_root: Option<String>,
    /// `--cdi-annotation-prefix` / `CDI_ANNOTATION_PREFIX` →
    /// `flags.plugin.cdiAnnotationPrefix` (validated as the file's value is).
    pub cdi_annotation_prefix: Option<String>,
    /// `--nvidia-driver-root` / `NVIDIA_DRIVER_ROOT` → `flags.nvidiaDriverRoot` (recognised,
    /// not acted on, as the file's key).
    pub nvidia_driver_root: Option<String>,
    /// `NVIDIA_DEV_ROOT` → `flags.nvidiaDevRoot` (recognised, not acted on).
    pub nvidia_dev_root: Option<String>,
    /// `GDRCOPY_ENABLED`, `GDS_ENABLED`, `MOFED_ENABLED` → `flags.gdrcopyEnabled`,
    /// `flags.gdsEnabled`, `flags.mofedEnabled` (recognised, not acted on).
    pub gdrcopy_enabled: Option<bool>,
    /// See [`FlagOverrides::gdrcopy_enabled`].
    pub gds_enabled: Option<bool>,
    /// See [`FlagOverrides::gdrcopy_enabled`].
    pub mofed_enabled: Option<bool>,
    /// `DEVICE_DISCOVERY_STRATEGY` → `flags.deviceDiscoveryStrategy` (recognised, not acted
    /// on: slicelet discovers through NVML or `--simulate`).
    pub device_discovery_strategy: Option<String>,
}

impl FlagOverrides {
    /// Whether no override is set.
    pub fn is_empty(&self) -> bool {
        *self == FlagOverrides::default()
    }

    /// Writes every set override into `file`'s `flags` (creating `flags` and `flags.plugin`
    /// where absent) and returns one notice per override that replaced a different value of
    /// the file, e.g. `flags.migStrategy: the file says mixed; MIG_STRATEGY=single takes
    /// precedence (as in NVIDIA's plugin)`.
    pub(super) fn apply(&self, file: &mut schema::ConfigFile) -> Vec<String> {
        let mut notices = Vec::new();
        if self.is_empty() {
            return notices;
        }
        let flags = file.flags.get_or_insert_with(Default::default);
        self.apply_flags(flags, &mut notices);
        let plugin_set = self.pass_device_specs.is_some()
            || self.device_list_strategy.is_some()
            || self.device_id_strategy.is_some()
            || self.cdi_annotation_prefix.is_some();
        if plugin_set {
            let plugin = flags.plugin.get_or_insert_with(Default::default);
            self.apply_plugin(plugin, &mut notices);
        }
        notices
    }

    /// Writes the set overrides of `flags`' own keys, with their notices.
    fn apply_flags(&self, flags: &mut schema::Flags, notices: &mut Vec<String>) {
        set(
            &mut flags.mig_strategy,
            self.mig_strategy,
            ("flags.migStrategy", "MIG_STRATEGY"),
            |m| m.as_str().to_string(),
            notices,
        );
        set(
            &mut flags.fail_on_init_error,
            self.fail_on_init_error,
            ("flags.failOnInitError", "FAIL_ON_INIT_ERROR"),
            bool::to_string,
            notices,
        );
        set(
            &mut flags.mps_root,
            self.mps_root.clone(),
            ("flags.mpsRoot", "MPS_ROOT"),
            String::clone,
            notices,
        );
        set(
            &mut flags.nvidia_driver_root,
            self.nvidia_driver_root.clone(),
            ("flags.nvidiaDriverRoot", "NVIDIA_DRIVER_ROOT"),
            String::clone,
            notices,
        );
        // Recognised, not acted on: set so that validation lists them as ignored keys.
        set(
            &mut flags.nvidia_dev_root,
            self.nvidia_dev_root.clone(),
            ("flags.nvidiaDevRoot", "NVIDIA_DEV_ROOT"),
            String::clone,
            notices,
        );
        set(
            &mut flags.gdrcopy_enabled,
            self.gdrcopy_enabled,
            ("flags.gdrcopyEnabled", "GDRCOPY_ENABLED"),
            bool::to_string,
            notices,
        );
        set(
            &mut flags.gds_enabled,
            self.gds_enabled,
            ("flags.gdsEnabled", "GDS_ENABLED"),
            bool::to_string,
            notices,
        );
        set(
            &mut flags.mofed_enabled,
            self.mofed_enabled,
            ("flags.mofedEnabled", "MOFED_ENABLED"),
            bool::to_string,
            notices,
        );
        set(
            &mut flags.device_discovery_strategy,
            self.device_discovery_strategy.clone(),
            ("flags.deviceDiscoveryStrategy", "DEVICE_DISCOVERY_STRATEGY"),
            String::clone,
            notices,
        );
    }

    /// Writes the set overrides of `flags.plugin`'s keys, with their notices.
    fn apply_plugin(&self, plugin: &mut schema::PluginFlags, notices: &mut Vec<String>) {
        set(
            &mut plugin.pass_device_specs,
            self.pass_device_specs,
            ("flags.plugin.passDeviceSpecs", "PASS_DEVICE_SPECS"),
            bool::to_string,
            notices,
        );
        set(
            &mut plugin.device_list_strategy,
            self.device_list_strategy,
            ("flags.plugin.deviceListStrategy", "DEVICE_LIST_STRATEGY"),
            DeviceListStrategies::to_string,
            notices,
        );
        set(
            &mut plugin.device_id_strategy,
            self.device_id_strategy,
            ("flags.plugin.deviceIDStrategy", "DEVICE_ID_STRATEGY"),
            |d| d.as_str().to_string(),
            notices,
        );
        set(
            &mut plugin.cdi_annotation_prefix,
            self.cdi_annotation_prefix.clone(),
            ("flags.plugin.cdiAnnotationPrefix", "CDI_ANNOTATION_PREFIX"),
            String::clone,
            notices,
        );
    }
}

/// Replaces `slot` with `value` when set; a notice when the file held a different value.
fn set<T: PartialEq>(
    slot: &mut Option<T>,
    value: Option<T>,
    (key, variable): (&str, &str),
    show: impl Fn(&T) -> String,
    notices: &mut Vec<String>,
) {
    let Some(value) = value else { return };
    if let Some(old) = slot.as_ref().filter(|old| **old != value) {
        notices.push(format!(
            "{key}: the file says {}; {variable}={} takes precedence (as in NVIDIA's plugin, a flag or environment variable that is set wins over the file)",
            show(old),
            show(&value)
        ));
    }
    *slot = Some(value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{parse_with, DeviceListStrategy};

    #[test]
    fn a_set_override_wins_over_the_file_and_says_so() {
        let o = FlagOverrides {
            mig_strategy: Some(MigStrategy::Single),
            ..Default::default()
        };
        let p = parse_with("version: v1\nflags:\n  migStrategy: mixed\n", &o).unwrap();
        assert_eq!(p.mig_strategy, MigStrategy::Single);
        assert_eq!(p.notices.len(), 1, "{:?}", p.notices);
        assert!(
            p.notices[0].starts_with("flags.migStrategy: the file says mixed; MIG_STRATEGY=single"),
            "{:?}",
            p.notices
        );
    }

    #[test]
    fn an_override_fills_what_the_file_leaves_unset_without_a_notice() {
        let o = FlagOverrides {
            fail_on_init_error: Some(false),
            pass_device_specs: Some(true),
            device_list_strategy: Some(DeviceListStrategies::of(&[
                DeviceListStrategy::Envvar,
                DeviceListStrategy::CdiCri,
            ])),
            device_id_strategy: Some(DeviceIdStrategy::Index),
            cdi_annotation_prefix: Some("cdi.example.com/".into()),
            ..Default::default()
        };
        let p = parse_with("version: v1\n", &o).unwrap();
        assert!(!p.fail_on_init_error);
        assert!(p.pass_device_specs);
        assert!(p.delivery.strategies.envvar && p.delivery.strategies.cdi_cri);
        assert!(!p.delivery.strategies.cdi_annotations);
        assert_eq!(p.delivery.id, DeviceIdStrategy::Index);
        assert_eq!(p.delivery.annotation_prefix, "cdi.example.com/");
        assert!(p.notices.is_empty(), "{:?}", p.notices);
        // The same value as the file's: no notice either.
        let same = FlagOverrides {
            mig_strategy: Some(MigStrategy::Mixed),
            ..Default::default()
        };
        let p = parse_with("flags:\n  migStrategy: mixed\n", &same).unwrap();
        assert!(p.notices.is_empty(), "{:?}", p.notices);
    }

    #[test]
    fn an_override_is_validated_as_the_file_value_is() {
        let o = FlagOverrides {
            mps_root: Some("/proc/mps".into()),
            ..Default::default()
        };
        let e = parse_with("version: v1\n", &o).unwrap_err();
        assert_eq!(e.path, "flags.mpsRoot", "{e}");
        let o = FlagOverrides {
            mps_root: Some("/run/other-mps".into()),
            ..Default::default()
        };
        let p = parse_with("version: v1\n", &o).unwrap();
        assert_eq!(p.mps_root, std::path::PathBuf::from("/run/other-mps"));
    }

    #[test]
    fn keys_slicelet_does_not_act_on_are_listed_as_ignored() {
        let o = FlagOverrides {
            gds_enabled: Some(true),
            device_discovery_strategy: Some("nvml".into()),
            ..Default::default()
        };
        let p = parse_with("version: v1\n", &o).unwrap();
        assert_eq!(
            p.ignored_keys,
            vec!["flags.gdsEnabled", "flags.deviceDiscoveryStrategy"]
        );
    }

    #[test]
    fn the_empty_config_takes_the_overrides_too() {
        let o = FlagOverrides {
            mig_strategy: Some(MigStrategy::Mixed),
            ..Default::default()
        };
        assert_eq!(parse_with("", &o).unwrap().mig_strategy, MigStrategy::Mixed);
        assert_eq!(
            parse_with("", &FlagOverrides::default())
                .unwrap()
                .mig_strategy,
            MigStrategy::None
        );
    }
}
