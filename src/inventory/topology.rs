//! How the GPUs of a node are connected: for every GPU pair, NVML's common-ancestor level
//! ([`PathLevel`], from `nvmlDeviceGetTopologyCommonAncestor`) and the number of NVLinks
//! between them (counted over `nvmlDeviceGetNvLinkState` and
//! `nvmlDeviceGetNvLinkRemotePciInfo_v2`), or "all-to-all over NVSwitch".
//!
//! Read once per discovery (NVML on the hardware actor's thread, or a simulated node's `links:`
//! and `nvswitch:`) and carried in the [`super::Inventory`]; GetPreferredAllocation uses the
//! scores precomputed from it with the plan and never asks NVML.
//!
//! A pair nothing was recorded for is derived from the GPUs' NUMA nodes: [`PathLevel::Node`]
//! on the same node, [`PathLevel::System`] otherwise. A pair whose NVML calls failed is
//! [`PathLevel::Unknown`], scored like `System`.

use std::collections::BTreeMap;

use serde::Serialize;

/// Most NVLinks one GPU has (`NVML_NVLINK_MAX_LINKS` in NVML 12: 18 on H100). A pair that is
/// all-to-all over NVSwitch is scored as this many links.
pub const MAX_NVLINKS: u32 = 18;

/// Score of one NVLink between two GPUs. Larger than the sum of the PCIe scores of every pair
/// of a 16-GPU set (120 pairs × at most 5), so NVLink counts always decide first.
pub const NVLINK_WEIGHT: u32 = 1024;

/// Score of two MIG devices (or replicas) on one GPU: they share the GPU's memory system,
/// closer than any link.
pub const SAME_GPU_SCORE: u32 = 2 * MAX_NVLINKS * NVLINK_WEIGHT;

/// NVML's `nvmlGpuTopologyLevel_t`: the closest common ancestor of two GPUs on the PCIe tree,
/// nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PathLevel {
    /// `NVML_TOPOLOGY_INTERNAL`: two GPUs on one board (e.g. a Tesla K80).
    Internal,
    /// `NVML_TOPOLOGY_SINGLE`: one PCIe switch (`nvidia-smi topo -m`: PIX).
    Single,
    /// `NVML_TOPOLOGY_MULTIPLE`: several PCIe switches, no host bridge (PXB).
    Multiple,
    /// `NVML_TOPOLOGY_HOSTBRIDGE`: the same host bridge (PHB).
    #[serde(rename = "hostbridge")]
    HostBridge,
    /// `NVML_TOPOLOGY_NODE`: the same NUMA node, across host bridges (NODE).
    Node,
    /// `NVML_TOPOLOGY_SYSTEM`: across NUMA nodes (SYS).
    System,
    /// The NVML call failed for this pair: scored like [`PathLevel::System`].
    Unknown,
}

impl PathLevel {
    /// The PCIe part of a pair's score: 5 (internal) … 1 (NUMA node), 0 for system and
    /// unknown.
    pub fn score(self) -> u32 {
        match self {
            PathLevel::Internal => 5,
            PathLevel::Single => 4,
            PathLevel::Multiple => 3,
            PathLevel::HostBridge => 2,
            PathLevel::Node => 1,
            PathLevel::System | PathLevel::Unknown => 0,
        }
    }

    /// `nvidia-smi topo -m`'s abbreviation: `PIX`, `PXB`, `PHB`, `NODE`, `SYS` (`INT` for
    /// internal, `?` for unknown).
    pub fn abbreviation(self) -> &'static str {
        match self {
            PathLevel::Internal => "INT",
            PathLevel::Single => "PIX",
            PathLevel::Multiple => "PXB",
            PathLevel::HostBridge => "PHB",
            PathLevel::Node => "NODE",
            PathLevel::System => "SYS",
            PathLevel::Unknown => "?",
        }
    }

    /// The level a pair without any record gets: `Node` when both GPUs are on one known NUMA
    /// node, `System` otherwise.
    pub fn from_numa(a: Option<i64>, b: Option<i64>) -> Self {
        match (a, b) {
            (Some(x), Some(y)) if x == y => PathLevel::Node,
            _ => PathLevel::System,
        }
    }
}

/// How two GPUs are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Link {
    /// NVLinks between the two GPUs (0: none).
    pub nvlinks: u32,
    /// Both GPUs reach every other GPU through NVSwitch (all-to-all): scored as
    /// [`MAX_NVLINKS`] links whatever `nvlinks` says.
    pub nvswitch: bool,
    /// Their common ancestor on the PCIe tree.
    pub pcie: PathLevel,
}

impl Link {
    /// A pair with no NVLink, only the PCIe level `pcie`.
    pub fn pcie(pcie: PathLevel) -> Self {
        Link {
            nvlinks: 0,
            nvswitch: false,
            pcie,
        }
    }

    /// The pair's score: NVLinks × [`NVLINK_WEIGHT`] (NVSwitch counts as [`MAX_NVLINKS`]
    /// links), plus [`PathLevel::score`].
    pub fn score(&self) -> u32 {
        let links = if self.nvswitch {
            MAX_NVLINKS
        } else {
            self.nvlinks.min(MAX_NVLINKS)
        };
        links * NVLINK_WEIGHT + self.pcie.score()
    }

    /// `nvidia-smi topo -m` style: `NVS` (NVSwitch), `NV4` (4 NVLinks), else the PCIe level.
    pub fn abbreviation(&self) -> String {
        if self.nvswitch {
            "NVS".to_string()
        } else if self.nvlinks > 0 {
            format!("NV{}", self.nvlinks)
        } else {
            self.pcie.abbreviation().to_string()
        }
    }
}

/// The links the discovery recorded, keyed by GPU index pair `(lower, higher)`. Pairs not
/// recorded are derived from the NUMA nodes (see [`super::Inventory::link`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pairs: BTreeMap<(u32, u32), Link>,
}

impl Topology {
    /// Records the link between GPUs `a` and `b` (in either order; `a == b` is ignored).
    pub fn set(&mut self, a: u32, b: u32, link: Link) {
        if a != b {
            self.pairs.insert((a.min(b), a.max(b)), link);
        }
    }

    /// The recorded link between GPUs `a` and `b`, if any.
    pub fn get(&self, a: u32, b: u32) -> Option<&Link> {
        self.pairs.get(&(a.min(b), a.max(b)))
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// One GPU pair in `slicelet plan --output json`'s `"links"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinkView {
    /// The two GPU indices, lower first.
    pub gpus: [u32; 2],
    /// NVLinks between them.
    pub nvlinks: u32,
    /// All-to-all over NVSwitch.
    pub nvswitch: bool,
    /// Common PCIe ancestor: `internal`, `single`, `multiple`, `hostbridge`, `node`, `system`
    /// or `unknown`.
    pub pcie: PathLevel,
    /// The pair's score ([`Link::score`]).
    pub score: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlinks_decide_before_pcie() {
        let one = Link {
            nvlinks: 1,
            nvswitch: false,
            pcie: PathLevel::System,
        };
        assert!(one.score() > Link::pcie(PathLevel::Internal).score() * 120);
        let switch = Link {
            nvlinks: 0,
            nvswitch: true,
            pcie: PathLevel::System,
        };
        assert_eq!(switch.score(), MAX_NVLINKS * NVLINK_WEIGHT);
        assert!(SAME_GPU_SCORE > switch.score());
        assert_eq!(Link::pcie(PathLevel::Unknown).score(), 0);
        assert!(Link::pcie(PathLevel::Single).score() > Link::pcie(PathLevel::Multiple).score());
        assert_eq!(switch.abbreviation(), "NVS");
        assert_eq!(one.abbreviation(), "NV1");
        assert_eq!(Link::pcie(PathLevel::HostBridge).abbreviation(), "PHB");
    }

    #[test]
    fn pairs_are_unordered() {
        let mut t = Topology::default();
        t.set(3, 1, Link::pcie(PathLevel::Single));
        t.set(2, 2, Link::pcie(PathLevel::Single));
        assert_eq!(t.get(1, 3), Some(&Link::pcie(PathLevel::Single)));
        assert_eq!(t.get(2, 2), None);
        assert_eq!(PathLevel::from_numa(Some(0), Some(0)), PathLevel::Node);
        assert_eq!(PathLevel::from_numa(None, None), PathLevel::System);
        assert_eq!(PathLevel::from_numa(Some(0), Some(1)), PathLevel::System);
    }
}
