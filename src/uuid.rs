//! The one validated form of a GPU or MIG device UUID.
//!
//! NVML (`nvmlDeviceGetUUID`) names a GPU `GPU-` and, since driver R470, a MIG device `MIG-`,
//! each followed by 32 hex digits in dash-separated groups of 8-4-4-4-12:
//! `GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416`. Only that form is accepted (hex in either case).
//! The older MIG form of drivers R450/R460, `MIG-GPU-<uuid>/<gi>/<ci>`, is refused here: it
//! contains `/`, and a UUID becomes a path component (`<mpsRoot>/<uuid>/pipe`), a mount path
//! and `NVIDIA_VISIBLE_DEVICES`, so nothing that could traverse a path may pass. A policy's
//! `devices` list still accepts that form, as NVIDIA's plugin does: it is read into its parts
//! (`policy::DeviceRef::LegacyMig`, the parent's UUID checked here) and only ever matched.
//!
//! Every UUID from outside is checked here: simulated node files, a policy's `devices`, and
//! NVML's answers ([`Uuid::parse`]).

use std::fmt;

/// Which kind of device a [`Uuid`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UuidKind {
    /// `GPU-…`: a whole GPU.
    Gpu,
    /// `MIG-…`: a MIG device.
    Mig,
}

/// A GPU or MIG device UUID in NVML's form (see the module documentation). Holds only ASCII
/// hex digits, dashes and the prefix, so it is safe as a path component.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid(String);

/// A string is not a UUID in NVML's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{}` is not a GPU or MIG UUID like GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416 ({reason})",
    truncate_id(text)
)]
pub struct UuidError {
    /// The refused text.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Lengths of the dash-separated hex groups after the prefix.
const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];

impl Uuid {
    /// Checks `s` is `GPU-`/`MIG-` followed by hex groups 8-4-4-4-12.
    ///
    /// # Errors
    /// [`UuidError`] with the text and the reason.
    pub fn parse(s: &str) -> Result<Uuid, UuidError> {
        let fail = |reason| UuidError {
            text: s.to_string(),
            reason,
        };
        let rest = s
            .strip_prefix("GPU-")
            .or_else(|| s.strip_prefix("MIG-"))
            .ok_or_else(|| fail("it does not start with GPU- or MIG-"))?;
        if rest.starts_with("GPU-") {
            return Err(fail(
                "the MIG-GPU-<uuid>/<gi>/<ci> form of drivers before R470 is not supported",
            ));
        }
        let groups: Vec<&str> = rest.split('-').collect();
        let ok = groups.len() == GROUPS.len()
            && groups
                .iter()
                .zip(GROUPS)
                .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        if !ok {
            return Err(fail("it must be hex digits grouped 8-4-4-4-12"));
        }
        Ok(Uuid(s.to_string()))
    }

    /// `GPU-` or `MIG-`.
    pub fn kind(&self) -> UuidKind {
        if self.0.starts_with("GPU-") {
            UuidKind::Gpu
        } else {
            UuidKind::Mig
        }
    }

    /// The UUID text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The UUID text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Uuid {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Uuid {
    type Err = UuidError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse(s)
    }
}

/// Longest device ID, in bytes, that errors and logs print whole.
pub const MAX_ID_IN_MESSAGES: usize = 256;

/// `id` for an error message or log line: whole up to [`MAX_ID_IN_MESSAGES`] bytes, otherwise
/// its first 256 bytes (cut at a character boundary) followed by `… (N bytes)`, so an ID the
/// kubelet (or anyone on the socket) sends cannot blow up a gRPC status or a log line.
pub fn truncate_id(id: &str) -> std::borrow::Cow<'_, str> {
    if id.len() <= MAX_ID_IN_MESSAGES {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut end = MAX_ID_IN_MESSAGES;
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}… ({} bytes)", &id[..end], id.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_nvml_forms_only() {
        for ok in [
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416",
            "GPU-00000000-0000-0000-0000-000000000000",
            "MIG-11111111-2222-3333-4444-000000000002",
            "GPU-DF942CA2-B7C5-E6FA-29B0-3E2134FEF416",
        ] {
            let u = Uuid::parse(ok).unwrap();
            assert_eq!(u.as_str(), ok);
        }
        assert_eq!(
            Uuid::parse("MIG-11111111-2222-3333-4444-000000000002")
                .unwrap()
                .kind(),
            UuidKind::Mig
        );
        for bad in [
            "GPU-/../../victim3",
            "GPU-",
            "GPU-abc",
            "gpu-df942ca2-b7c5-e6fa-29b0-3e2134fef416",
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef41",
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416-",
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416/x",
            "GPU-df942ca2b7c5-e6fa-29b0-3e2134fef4160",
            "GPU-dg942ca2-b7c5-e6fa-29b0-3e2134fef416",
            "MIG-GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416/1/0",
            "GPU-df942ca2-b7c5-e6fa-29b0-3e2134fef416\0",
            "DEV-df942ca2-b7c5-e6fa-29b0-3e2134fef416",
        ] {
            assert!(Uuid::parse(bad).is_err(), "{bad:?}");
        }
        let e = Uuid::parse("GPU-/../../victim3").unwrap_err().to_string();
        assert!(
            e.contains("`GPU-/../../victim3`") && e.contains("8-4-4-4-12"),
            "{e}"
        );
    }

    #[test]
    fn long_ids_are_truncated_with_their_length() {
        assert_eq!(truncate_id("GPU-a::0"), "GPU-a::0");
        let exact = "x".repeat(256);
        assert_eq!(truncate_id(&exact), exact.as_str());
        let long = "y".repeat(65_536);
        let t = truncate_id(&long);
        assert_eq!(t, format!("{}… (65536 bytes)", "y".repeat(256)));
        // A multi-byte character across the cut is not split.
        let wide = format!("{}é{}", "z".repeat(255), "z".repeat(10));
        assert_eq!(
            truncate_id(&wide),
            format!("{}… (267 bytes)", "z".repeat(255))
        );
    }

    #[test]
    fn the_uuids_the_repo_derives_are_valid() {
        let inv = crate::inventory::simulated::parse(
            std::path::Path::new("n.yaml"),
            "gpus:\n  - model: NVIDIA A100-SXM4-40GB\n    memoryMiB: 40960\n    count: 2\n    mig:\n      devices:\n        - profile: 1g.5gb\n          count: 7\n",
        )
        .unwrap();
        for g in &inv.gpus {
            Uuid::parse(&g.uuid).unwrap();
            for m in &g.mig_devices {
                Uuid::parse(&m.uuid).unwrap();
            }
        }
    }
}
