//! What is in use: which device IDs running containers hold, from the kubelet's pod-resources
//! API v1 (`List`; the kubelet is the book of record, slicelet keeps no allocation table of its
//! own).
//!
//! [`InUse`] is the pure snapshot the supervisor folds in: per resource, per device ID, the
//! containers holding it. The plan keeps a held device advertised until it is released and
//! holds a re-purposed GPU's new devices Unhealthy while the old ones are held
//! ([`crate::plan`]'s drain rules); the metrics attribute GPU use through it.

use std::collections::BTreeMap;

/// One container holding a device, as pod-resources names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name (init containers included).
    pub container: String,
}

impl std::fmt::Display for Holder {
    /// `namespace/pod` (the container is left out: log lines and drain reasons name pods).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.pod)
    }
}

/// Which device IDs are held, per resource name (`nvidia.com/gpu`) and device ID
/// (`GPU-…::0`), by which containers (sorted, no duplicates). Resources slicelet does not
/// serve are kept out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InUse {
    /// resource → device ID → holders.
    pub devices: BTreeMap<String, BTreeMap<String, Vec<Holder>>>,
}

impl InUse {
    /// The containers holding `id` of `resource` (empty: free).
    pub fn holders(&self, resource: &str, id: &str) -> &[Holder] {
        self.devices
            .get(resource)
            .and_then(|d| d.get(id))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether a container holds `id` of `resource`.
    pub fn is_held(&self, resource: &str, id: &str) -> bool {
        !self.holders(resource, id).is_empty()
    }

    /// Records that `holder` holds `id` of `resource`.
    pub fn insert(&mut self, resource: &str, id: &str, holder: Holder) {
        let list = self
            .devices
            .entry(resource.to_string())
            .or_default()
            .entry(id.to_string())
            .or_default();
        if let Err(at) = list.binary_search(&holder) {
            list.insert(at, holder);
        }
    }

    /// Every (resource, device ID, holders), in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &[Holder])> {
        self.devices.iter().flat_map(|(r, ids)| {
            ids.iter()
                .map(move |(id, h)| (r.as_str(), id.as_str(), h.as_slice()))
        })
    }

    /// Number of held device IDs over all resources.
    pub fn len(&self) -> usize {
        self.devices.values().map(BTreeMap::len).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
