//! A device's health and the events that change it, as plain types: the hardware sources
//! ([`crate::inventory`]) report them, [`crate::health_tracker`] folds them. A leaf: it uses no
//! other module of the crate.

/// A device's health as the kubelet sees it (the v1beta1 `Device.health` strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Health {
    /// Usable: advertised `Healthy`.
    #[default]
    Healthy,
    /// Not usable: advertised `Unhealthy` (the kubelet allocates it to nobody new).
    Unhealthy,
}

impl Health {
    /// `Healthy` or `Unhealthy`, as the kubelet's device-plugin API spells it
    /// (`pluginapi.Healthy` / `pluginapi.Unhealthy`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Unhealthy => "Unhealthy",
        }
    }

    /// `Healthy` when `healthy`.
    pub const fn from_bool(healthy: bool) -> Self {
        if healthy {
            Health::Healthy
        } else {
            Health::Unhealthy
        }
    }

    /// Healthy only when both are.
    pub const fn and(self, other: Health) -> Health {
        Health::from_bool(self.is_healthy() && other.is_healthy())
    }

    /// True for [`Health::Healthy`].
    pub const fn is_healthy(self) -> bool {
        matches!(self, Health::Healthy)
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a device is Unhealthy, as a kind: the short, stable word DRA publishes it under (the
/// value of a device taint, so a Kubernetes label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric) and the kind of the condition, from
/// which a policy may derive how hard the taint is (only Xids can be `NoExecute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// A critical Xid (its number): `xid-79`.
    Xid(u64),
    /// Discovery reports the device unusable (NVML lost it, or a simulated node says
    /// Unhealthy): `lost`.
    Lost,
    /// The device's Xid events cannot be watched (fail closed): `unwatched`.
    Unwatched,
    /// Its CDI name does not resolve in the node's CDI specs: `cdi-unresolved`.
    CdiUnresolved,
    /// Its MPS control daemon is not ready: `mps-not-ready`.
    MpsNotReady,
    /// The drain rules hold it: the unit changes shape and old holders are still there:
    /// `draining`.
    Draining,
    /// Held Unhealthy for another reason: `unhealthy`.
    Other,
}

impl Cause {
    /// The short word (see [`Cause`]): `xid-79`, `lost`, `unwatched`, `cdi-unresolved`,
    /// `mps-not-ready`, `draining`, `unhealthy`.
    pub fn label(self) -> String {
        match self {
            Cause::Xid(x) => format!("xid-{x}"),
            Cause::Lost => "lost".to_string(),
            Cause::Unwatched => "unwatched".to_string(),
            Cause::CdiUnresolved => "cdi-unresolved".to_string(),
            Cause::MpsNotReady => "mps-not-ready".to_string(),
            Cause::Draining => "draining".to_string(),
            Cause::Other => "unhealthy".to_string(),
        }
    }
}

/// What one source of device health observed about one device (a GPU or a MIG device, by
/// UUID). Every source of health arrives as one of these into [`crate::health_tracker::Tracker`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// An Xid on the device (NVML event, or a simulated node's `xid:`). Critical ones (see
    /// [`crate::health_tracker::XidPolicy`]) make it Unhealthy until the quiet period passed and a probe answers.
    Xid {
        /// The device's UUID.
        uuid: String,
        /// The Xid number.
        xid: u64,
    },
    /// Whether the device is watched for Xid events (NVML event registration). Not watched
    /// means fail closed: Unhealthy until a later registration succeeds.
    Watched {
        /// The device's UUID.
        uuid: String,
        /// Registration failure, or `None` when it is watched (or cannot report Xids at all).
        failure: Option<String>,
    },
    /// Whether the device's CDI name resolves in the node's CDI specs (checked with a `cdi-*`
    /// `deviceListStrategy`, see [`crate::cdi::unresolved`]). Not resolving means Unhealthy:
    /// a container given it would start without its GPU.
    Cdi {
        /// The device's UUID.
        uuid: String,
        /// Why its name does not resolve, or `None` when it does (or is no longer checked).
        failure: Option<String>,
    },
    /// Whether the device's MPS control daemon is ready (running, answering, limits set).
    /// Only counts for devices the plan runs a daemon for ([`crate::health_tracker::Tracker::set_mps_wanted`]).
    MpsReady {
        /// The GPU or MIG UUID the daemon serves.
        uuid: String,
        /// Ready or not.
        ready: bool,
    },
}
