//! MIG facts both GPU sources share: profile names, and the nvidia-caps device nodes that grant
//! access to a GPU instance and a compute instance.
//!
//! # Profile names
//!
//! A profile is spelled as NVIDIA spells it: `[<c>c.]<g>g.<m>gb[+<attr>]`, e.g. `1g.10gb`,
//! `3g.40gb`, `1g.24gb+me` (with media engines) or `1c.3g.40gb` (a compute instance smaller than
//! its GPU instance). On a real node the profile comes from NVML (see
//! [`super::nvml`]): the name NVML reports for a MIG device is `<product> MIG <profile>`
//! (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`) and the profile is taken from there; when a driver
//! reports a name without it, the profile is rebuilt from the device's attributes — slice counts
//! and memory, rounded to GB as NVIDIA's tooling rounds it ([`memory_gb`]).
//!
//! # Capability nodes
//!
//! With `flags.plugin.passDeviceSpecs`, a container given a MIG device needs
//! `/dev/nvidia-caps/nvidia-cap<N>` for its GPU instance and for its compute instance. The
//! driver lists the minors `N` in `/proc/driver/nvidia-caps/mig-minors`, one per line:
//!
//! ```text
//! config 1
//! monitor 2
//! gpu0/gi1/access 12
//! gpu0/gi1/ci0/access 13
//! ```
//!
//! where `gpu<N>` is the parent GPU's minor number. [`MigMinors`] reads that file (under a
//! configurable root, so tests use a temp directory) and [`resolve_caps`] attaches the minors to
//! every MIG device of an inventory.

pub mod table;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{Inventory, MigCaps};

/// Where the driver lists the nvidia-caps minors, relative to the host root (default `/`).
pub const MIG_MINORS_PATH: &str = "proc/driver/nvidia-caps/mig-minors";

/// A MIG profile name taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Compute slices of the compute instance (the `c` of `1c.3g.40gb`; equal to
    /// `gpu_slices` when the profile has no `c` part).
    pub compute_slices: u32,
    /// GPU slices of the GPU instance (the `g`).
    pub gpu_slices: u32,
    /// Memory in GB as the name says it (`10` for `1g.10gb`).
    pub memory_gb: u64,
    /// What follows `+`, e.g. `me` for `1g.10gb+me`; empty when none.
    pub attributes: String,
}

impl Profile {
    /// Parses `[<c>c.]<g>g.<m>gb[+<attr>]`. Attributes are lowercase letters, digits, `.` and
    /// `-` (`me`, `me.all`, `gfx`).
    pub fn parse(s: &str) -> Option<Profile> {
        let (base, attributes) = match s.split_once('+') {
            Some((b, a)) => {
                let ok = !a.is_empty()
                    && a.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && a.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'
                    });
                if !ok {
                    return None;
                }
                (b, a.to_string())
            }
            None => (s, String::new()),
        };
        let parts: Vec<&str> = base.split('.').collect();
        let (c, g, m) = match parts.as_slice() {
            [g, m] => (None, *g, *m),
            [c, g, m] => (Some(*c), *g, *m),
            _ => return None,
        };
        let number = |s: &str, suffix: &str| -> Option<u64> {
            let digits = s.strip_suffix(suffix)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            digits.parse().ok()
        };
        let gpu_slices = u32::try_from(number(g, "g")?).ok()?;
        let compute_slices = match c {
            Some(c) => u32::try_from(number(c, "c")?).ok()?,
            None => gpu_slices,
        };
        let memory_gb = number(m, "gb")?;
        if gpu_slices == 0 || compute_slices == 0 || compute_slices > gpu_slices || memory_gb == 0 {
            return None;
        }
        Some(Profile {
            compute_slices,
            gpu_slices,
            memory_gb,
            attributes,
        })
    }

    /// The name for these slice counts and memory, without attributes: `3g.40gb`, or
    /// `1c.3g.40gb` when the compute instance is smaller than its GPU instance.
    pub fn name_for(gpu_slices: u32, compute_slices: u32, memory_gb: u64) -> String {
        if compute_slices == gpu_slices {
            format!("{gpu_slices}g.{memory_gb}gb")
        } else {
            format!("{compute_slices}c.{gpu_slices}g.{memory_gb}gb")
        }
    }
}

/// The profile inside a MIG device's NVML name: the word after ` MIG ` when it parses as a
/// profile (`NVIDIA H100 80GB HBM3 MIG 1g.10gb` → `1g.10gb`).
pub fn profile_from_device_name(name: &str) -> Option<String> {
    let (_, rest) = name.rsplit_once(" MIG ")?;
    let word = rest.split_whitespace().next()?;
    Profile::parse(word).map(|_| word.to_string())
}

/// The GPU-instance profile of a MIG device's profile: a compute instance smaller than its GPU
/// instance (`1c.3g.40gb`) sits in that GPU instance (`3g.40gb`); other names as they are.
pub fn gpu_instance_profile(profile: &str) -> &str {
    match profile.split_once('.') {
        Some((c, rest)) if c.ends_with('c') => rest,
        _ => profile,
    }
}

/// A MIG device's memory in whole GB as profile names state it, from the parent's total memory
/// and the device's memory (both MiB). NVIDIA's rule (go-nvlib): the device's share of the GPU,
/// rounded up to eighths, times the GPU's memory in GB rounded up, rounded to nearest. So
/// 9856 MiB of an 81559 MiB H100 is `10` (1g.10gb) and 4864 MiB of a 40960 MiB A100 is `5`.
pub fn memory_gb(parent_total_mib: u64, mig_mib: u64) -> u64 {
    if parent_total_mib == 0 {
        return mig_mib.div_ceil(1024);
    }
    let eighths = (mig_mib * 8).div_ceil(parent_total_mib);
    let total_gb = parent_total_mib.div_ceil(1024);
    // round(eighths * total_gb / 8)
    (eighths * total_gb * 2 + 8) / 16
}

/// The resource a MIG profile is advertised as under `migStrategy: mixed`:
/// `nvidia.com/mig-<profile>` with `+` turned into `.` (`1g.24gb+me` → `mig-1g.24gb.me`).
pub fn resource_name(profile: &str) -> String {
    format!("nvidia.com/mig-{}", profile.replace('+', "."))
}

/// The nvidia-caps minors the driver published (`mig-minors`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors {
    minors: HashMap<String, u32>,
}

impl MigMinors {
    /// Parses the file's text; lines that are not `<name> <minor>` are skipped.
    pub fn parse(text: &str) -> MigMinors {
        let minors = text
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (name, minor, None) = (w.next()?, w.next()?, w.next()) else {
                    return None;
                };
                Some((name.to_string(), minor.parse().ok()?))
            })
            .collect();
        MigMinors { minors }
    }

    /// The file under `root` (the host root, default `/`).
    pub fn path(root: &Path) -> PathBuf {
        root.join(MIG_MINORS_PATH)
    }

    /// Reads `<root>/proc/driver/nvidia-caps/mig-minors`.
    ///
    /// # Errors
    /// The I/O error when the file cannot be read (no MIG-capable driver, not mounted).
    pub fn read(root: &Path) -> std::io::Result<MigMinors> {
        std::fs::read_to_string(Self::path(root)).map(|t| Self::parse(&t))
    }

    /// The access minors of GPU instance `gi` and its compute instance `ci` on the GPU with
    /// minor number `gpu_minor`.
    pub fn caps(&self, gpu_minor: u32, gi: u32, ci: u32) -> Option<MigCaps> {
        let gi_access = *self.minors.get(&format!("gpu{gpu_minor}/gi{gi}/access"))?;
        let ci_access = *self
            .minors
            .get(&format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"))?;
        Some(MigCaps {
            gi_access,
            ci_access,
        })
    }
}

/// Attaches the nvidia-caps minors from `<root>/proc/driver/nvidia-caps/mig-minors` to every
/// MIG device of `inv` (best effort: a missing file or entry leaves [`super::MigDevice::caps`]
/// `None`, and the plan warns when device specs need them).
pub fn resolve_caps(inv: &mut Inventory, root: &Path) {
    if !inv.gpus.iter().any(|g| !g.mig_devices.is_empty()) {
        return;
    }
    let minors = match MigMinors::read(root) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(path = %MigMinors::path(root).display(), error = %crate::errors::chain(&e), "no nvidia-caps MIG minors");
            MigMinors::default()
        }
    };
    for g in &mut inv.gpus {
        for m in &mut g.mig_devices {
            m.caps = g
                .minor
                .and_then(|minor| minors.caps(minor, m.gi_id, m.ci_id));
        }
    }
}

/// The `mig-minors` file the NVIDIA driver writes for `gpus` GPUs (minors 0..gpus): `config 1`,
/// `monitor 2`, then per GPU 15 GPU instances of 1 + 8 entries each. For tests and simulated
/// hosts.
pub fn standard_mig_minors(gpus: u32) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    let mut n = 3;
    for g in 0..gpus {
        for gi in 0..15 {
            out.push_str(&format!("gpu{g}/gi{gi}/access {n}\n"));
            n += 1;
            for ci in 0..8 {
                out.push_str(&format!("gpu{g}/gi{gi}/ci{ci}/access {n}\n"));
                n += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row of the profile tables: its name parses with its slice count, its memory
    /// rounds back to its name's GB on its product, and its placements fit the GPU without
    /// two starts closer than a placement's size (the driver's placements never overlap
    /// their own profile's) while at most `instance_count` fit.
    #[test]
    fn the_profile_tables_agree_with_their_names_and_geometry() {
        assert_eq!(table::TABLES.len(), 5);
        for (t, total_mib) in table::TABLES {
            for row in t.profiles {
                let p = Profile::parse(row.name).expect(row.name);
                assert_eq!(p.gpu_slices, row.gpu_slices, "{} {}", t.product, row.name);
                assert!(row.gpu_slices <= t.compute_slices, "{}", row.name);
                assert_eq!(
                    memory_gb(*total_mib, row.memory_mib),
                    p.memory_gb,
                    "{} {}",
                    t.product,
                    row.name
                );
                assert!(!row.starts.is_empty(), "{}", row.name);
                for &s in row.starts {
                    assert_eq!(
                        s % row.size.min(4),
                        0,
                        "{} {} start {s}",
                        t.product,
                        row.name
                    );
                    assert!(
                        s + row.size <= t.memory_slices,
                        "{} {}",
                        t.product,
                        row.name
                    );
                }
                assert!(table::full_compute_profile(row.gpu_slices).is_some());
            }
            assert!(t
                .profiles
                .windows(2)
                .all(|w| w[0].nvml_profile < w[1].nvml_profile));
            assert_eq!(
                table::for_product(t.product, *total_mib).map(|f| f.product),
                Some(t.product)
            );
        }
        assert_eq!(
            table::for_product("NVIDIA A100 80GB PCIe", 81920).map(|t| t.product),
            Some("NVIDIA A100-SXM4-80GB")
        );
        assert_eq!(table::for_product("NVIDIA L4", 23034), None);
    }

    /// The tables' profiles and instance counts are the simulated models' (the file the
    /// simulated nodes are checked against).
    #[test]
    fn the_profile_tables_match_the_simulated_models() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/models/gpu-models.yaml"),
        )
        .unwrap();
        for (t, total_mib) in table::TABLES {
            let at = text
                .find(&format!("name: {}\n", t.product))
                .expect(t.product);
            let block = &text[at..];
            let mig_line = block
                .lines()
                .find(|l| l.trim_start().starts_with("mig:"))
                .unwrap();
            assert!(
                block.contains(&format!("memoryMiB: {total_mib}\n")),
                "{}",
                t.product
            );
            for row in t.profiles {
                assert!(
                    mig_line.contains(&format!("{}: {}", row.name, row.instance_count)),
                    "{} {}: {mig_line}",
                    t.product,
                    row.name
                );
            }
            assert_eq!(
                mig_line.matches(':').count() - 1,
                t.profiles.len(),
                "{}",
                t.product
            );
        }
    }

    #[test]
    fn profiles_parse_as_nvidia_spells_them() {
        let p = |s| {
            Profile::parse(s).map(|p| (p.compute_slices, p.gpu_slices, p.memory_gb, p.attributes))
        };
        type Parts<'a> = Option<(u32, u32, u64, &'a str)>;
        let cases: &[(&str, Parts)] = &[
            ("1g.10gb", Some((1, 1, 10, ""))),
            ("3g.40gb", Some((3, 3, 40, ""))),
            ("7g.141gb", Some((7, 7, 141, ""))),
            ("1g.24gb+me", Some((1, 1, 24, "me"))),
            ("1g.10gb+me.all", Some((1, 1, 10, "me.all"))),
            ("1c.3g.40gb", Some((1, 3, 40, ""))),
            ("4c.3g.40gb", None),
            ("0g.10gb", None),
            ("1g.0gb", None),
            ("1g.10", None),
            ("g.10gb", None),
            ("1g.10gb+", None),
            ("1g.10gb+ME", None),
            ("big", None),
            ("1g.10gb.me", None),
            ("", None),
        ];
        for (s, want) in cases {
            let want = want.map(|(c, g, m, a)| (c, g, m, a.to_string()));
            assert_eq!(p(s), want, "{s}");
        }
        assert_eq!(Profile::name_for(3, 3, 40), "3g.40gb");
        assert_eq!(Profile::name_for(3, 1, 40), "1c.3g.40gb");
    }

    #[test]
    fn profile_from_nvml_names() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", Some("1g.5gb")),
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", Some("1g.10gb+me")),
            ("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", Some("1c.3g.40gb")),
            ("NVIDIA H100 80GB HBM3", None),
            ("NVIDIA H100 80GB HBM3 MIG", None),
            ("NVIDIA H100 80GB HBM3 MIG device", None),
        ];
        for (name, want) in cases {
            assert_eq!(profile_from_device_name(name).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn memory_rounds_as_nvidia_tooling_does() {
        let cases = [
            (81559, 9856, 10),   // H100 1g.10gb
            (81559, 20096, 20),  // H100 2g.20gb
            (81559, 40320, 40),  // H100 3g.40gb
            (81559, 80896, 80),  // H100 7g.80gb
            (40960, 4864, 5),    // A100 40GB 1g.5gb
            (40960, 9856, 10),   // A100 40GB 2g.10gb
            (40960, 19968, 20),  // A100 40GB 3g.20gb
            (143771, 16384, 18), // H200 1g.18gb
            (143771, 71424, 71), // H200 3g.71gb
            (0, 5000, 5),
        ];
        for (total, mig, want) in cases {
            assert_eq!(memory_gb(total, mig), want, "{mig} of {total}");
        }
    }

    #[test]
    fn resource_names_turn_plus_into_dot() {
        assert_eq!(resource_name("1g.10gb"), "nvidia.com/mig-1g.10gb");
        assert_eq!(resource_name("1g.24gb+me"), "nvidia.com/mig-1g.24gb.me");
    }

    #[test]
    fn mig_minors_resolve_gi_and_ci_access() {
        let m = MigMinors::parse("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbroken line here\ngpu3/gi2/access x\n");
        assert_eq!(
            m.caps(0, 1, 0),
            Some(MigCaps {
                gi_access: 12,
                ci_access: 13
            })
        );
        assert_eq!(m.caps(0, 1, 1), None);
        assert_eq!(m.caps(3, 2, 0), None);
        let std = MigMinors::parse(&standard_mig_minors(2));
        assert_eq!(
            std.caps(0, 1, 0),
            Some(MigCaps {
                gi_access: 12,
                ci_access: 13
            })
        );
        assert_eq!(
            std.caps(1, 0, 0),
            Some(MigCaps {
                gi_access: 138,
                ci_access: 139
            })
        );
    }
}
