//! What is in use: which device IDs running containers hold, as the kubelet's pod-resources
//! API v1 answers `List` (the kubelet is the book of record, slicelet keeps no allocation table
//! of its own); [`crate::podres`] asks it.
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
    /// DRA devices held through ResourceClaims (`dynamic_resources`), by device name
    /// (the ResourceSlice's, e.g. `gpu-<uuid>-r0`) → holders. The drain rules map them back to
    /// device IDs through the plan that published them.
    pub claimed: BTreeMap<String, Vec<Holder>>,
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
        insert_holder(list, holder);
    }

    /// Records that `holder` holds the DRA device published as `device_name`.
    pub fn insert_claimed(&mut self, device_name: &str, holder: Holder) {
        let list = self.claimed.entry(device_name.to_string()).or_default();
        insert_holder(list, holder);
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

impl InUse {
    /// What a pod-resources `List` answer says is held, keeping only device IDs that name an
    /// NVIDIA GPU or MIG device (`GPU-…`, `MIG-…`, with or without `::<n>`: every ID slicelet
    /// advertises has that form), so other device plugins' resources stay out.
    pub fn from_list(answer: &crate::api::podresources::ListPodResourcesResponse) -> Self {
        let mut out = InUse::default();
        for pod in &answer.pod_resources {
            for c in &pod.containers {
                let holder = Holder {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: c.name.clone(),
                };
                for r in c.dynamic_resources.iter().flat_map(|d| &d.claim_resources) {
                    let list = out.claimed.entry(r.device_name.clone()).or_default();
                    insert_holder(list, holder.clone());
                }
                for d in &c.devices {
                    for id in d.device_ids.iter().filter(|id| is_gpu_id(id)) {
                        out.insert(&d.resource_name, id, holder.clone());
                    }
                }
            }
        }
        out
    }
}

/// Adds `holder` to `list` (sorted, each holder once).
fn insert_holder(list: &mut Vec<Holder>, holder: Holder) {
    if let Err(at) = list.binary_search(&holder) {
        list.insert(at, holder);
    }
}

/// Whether `id` has the form of an ID slicelet advertises: a GPU or MIG UUID, optionally
/// followed by `::<replica>`.
pub fn is_gpu_id(id: &str) -> bool {
    let unit = id.split_once("::").map_or(id, |(u, _)| u);
    unit.starts_with("GPU-") || unit.starts_with("MIG-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, r, ids)| ContainerResources {
                    name: (*c).into(),
                    devices: vec![ContainerDevices {
                        resource_name: (*r).into(),
                        device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                        topology: None,
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn a_list_answer_becomes_holders_per_device() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "ml",
                    "a",
                    &[
                        ("init", "nvidia.com/gpu", &["GPU-1::0"]),
                        ("main", "nvidia.com/gpu", &["GPU-1::0", "GPU-1::1"]),
                    ],
                ),
                pod("ml", "b", &[("main", "intel.com/sriov", &["0000:3b:00.1"])]),
                pod(
                    "web",
                    "c",
                    &[("main", "nvidia.com/mig-1g.10gb", &["MIG-9"])],
                ),
            ],
        };
        let u = InUse::from_list(&answer);
        assert_eq!(u.len(), 3);
        let names: Vec<String> = u
            .holders("nvidia.com/gpu", "GPU-1::0")
            .iter()
            .map(|h| format!("{h}/{}", h.container))
            .collect();
        assert_eq!(names, ["ml/a/init", "ml/a/main"]);
        assert!(u.is_held("nvidia.com/mig-1g.10gb", "MIG-9"));
        assert!(!u.is_held("intel.com/sriov", "0000:3b:00.1"));
        assert!(!u.is_held("nvidia.com/gpu", "GPU-1::2"));
    }

    #[test]
    fn gpu_ids() {
        for (id, want) in [
            ("GPU-abc", true),
            ("GPU-abc::3", true),
            ("MIG-abc", true),
            ("0", false),
            ("0000:3b:00.1", false),
            ("", false),
        ] {
            assert_eq!(is_gpu_id(id), want, "{id}");
        }
    }
}
